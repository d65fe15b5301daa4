# frozen_string_literal: true

# The value objects the engines hand out. Every one is a frozen Struct whose Strings are frozen
# copies of the engine's octets (nothing points into engine memory), so events may be kept,
# passed between Fibers and, being deeply frozen, shared between Ractors.
#
# This file is plain Ruby (no extension needed), so that code that only looks at events (the
# pure-Ruby baseline, tests) can load it alone.
module Smtpe
  Path = Struct.new(:mailbox, :local_part, :domain, :flags)
  # A reverse-path or forward-path (RFC 5321 §4.1.2).
  #
  # mailbox:: local-part "@" domain as sent (quotes kept), "" for the null path <>
  # local_part:: as sent; "postmaster" for <postmaster>
  # domain:: the domain or address-literal with its brackets; "" for <> and <postmaster>
  # flags:: Integer, Path::NULL | POSTMASTER | QUOTED | ADDR_LITERAL | SOURCE_ROUTE | UTF8
  class Path
    # flags: the null reverse-path <>
    NULL = 1
    # flags: <postmaster> without a domain (RFC 5321 §4.5.1)
    POSTMASTER = 2
    # flags: the local-part is a quoted-string
    QUOTED = 4
    # flags: the domain is an address-literal
    ADDR_LITERAL = 8
    # flags: an obsolete source route was given and dropped (RFC 5321 §4.1.2)
    SOURCE_ROUTE = 16
    # flags: non-ASCII UTF-8 in the mailbox (RFC 6531)
    UTF8 = 32

    # the null reverse-path <>
    def null?
      flags.anybits?(NULL)
    end
    # <postmaster> without a domain
    def postmaster?
      flags.anybits?(POSTMASTER)
    end
    # the local-part is a quoted-string
    def quoted?
      flags.anybits?(QUOTED)
    end
    # the domain is an address-literal ([192.0.2.1])
    def address_literal?
      flags.anybits?(ADDR_LITERAL)
    end
    # the mailbox holds non-ASCII UTF-8 (RFC 6531)
    def utf8?
      flags.anybits?(UTF8)
    end
    # the mailbox, "" for <>
    def to_s
      mailbox
    end
  end

  # Server engine events (Smtpe::ServerSession#feed). Each class has #type, a Symbol. id is the
  # event's number in the session (for ServerSession#reply_id); abandoned is true when the event
  # ended a transaction the host had accepted before its content ended (drop what you kept).
  module Event
    def self.define(type, *members)
      Struct.new(:id, *members) do
        define_method(:type) { type }
      end
    end
    private_class_method :define

    # HELO, EHLO or LHLO. Needs a verdict.
    Helo = define(:helo, :domain, :esmtp, :lmtp, :abandoned)
    # MAIL FROM:. Needs a verdict. size, envid, auth, mt_priority, by_time are nil when not
    # given; body :unspecified, :"7bit", :"8bitmime", :binarymime; ret nil, :full, :hdrs;
    # by_mode nil, "R" or "N"; params a frozen Array of frozen [keyword, value] pairs as sent.
    Mail = define(:mail, :reverse_path, :size, :body, :smtputf8, :ret, :envid, :auth,
                  :requiretls, :mt_priority, :by_time, :by_mode, :by_trace, :params)
    # RCPT TO:. Needs a verdict. notify a frozen Array of :never, :success, :failure, :delay
    # (empty when not given); orcpt_type and orcpt nil when not given.
    Rcpt = define(:rcpt, :forward_path, :notify, :orcpt_type, :orcpt, :params)
    # DATA with at least one recipient. Needs a verdict (accept: 354).
    Data = define(:data)
    # The end of the content. status :ok (needs a verdict: one, or under LMTP +replies+, one
    # per accepted recipient), :too_big, :bad_line_ending (the engine replied already).
    DataEnd = define(:data_end, :size, :status, :normalised, :has_8bit, :chunked, :replies)
    # RSET (the engine answered 250).
    Rset = define(:rset, :abandoned)
    # VRFY and EXPN (argument as sent). Need a verdict (accept: 252).
    Vrfy = define(:vrfy, :argument)
    # EXPN (argument as sent). Needs a verdict (accept: 252).
    Expn = define(:expn, :argument)
    # A verb the engine does not know. Needs a verdict (accept: 500 5.5.1).
    Unknown = define(:unknown, :verb, :argument)
    # QUIT (the engine answered 221 and wants to close).
    Quit = define(:quit, :abandoned)
    # A timeout expired (421 4.4.2 queued) / max_errors passed (421 4.7.0 queued).
    Timeout = define(:timeout, :abandoned)
    # max_errors passed: 421 4.7.0 queued, the session closes.
    ErrorLimit = define(:error_limit, :abandoned)
    # STARTTLS. Needs a verdict: accept, then the host runs the handshake.
    Starttls = define(:starttls)
    # One step of AUTH. mechanism as sent; mechanism_id :plain, :login or :other. PLAIN and
    # LOGIN give authzid (nil for LOGIN or none), authcid and password; others response (nil for
    # none) and step (0 for the AUTH command). Needs a verdict, or ServerSession#auth_challenge.
    Auth = define(:auth, :mechanism, :mechanism_id, :authzid, :authcid, :password,
                  :response, :step)
    # A BDAT chunk begins (size as the command gave it).
    Bdat = define(:bdat, :size, :last, :first)
    # A BDAT chunk without LAST was read. Needs a verdict.
    ChunkEnd = define(:chunk_end, :size, :last, :first)
    # A valid PROXY header. family :unspec, :inet, :inet6, :unix; addresses as Strings
    # ("192.0.2.1", "2001:db8::1"), nil when not decoded; tlvs frozen [type, value] pairs.
    # Needs a verdict.
    Proxy = define(:proxy, :version, :local, :family, :transport, :src_addr, :src_port,
                   :dst_addr, :dst_port, :tlvs)
    # A malformed PROXY header: the session closes without a reply.
    ProxyInvalid = define(:proxy_invalid)
    # XCLIENT / XFORWARD from a trusted peer: attrs a frozen Array of [name, value]. Verdict.
    Xclient = define(:xclient, :attrs)
    # XFORWARD from a trusted peer: attrs as for Xclient. Needs a verdict.
    Xforward = define(:xforward, :attrs)
  end

  # The server engine's session counters (ServerSession#stats).
  ServerStats = Struct.new(:octets_in, :octets_out, :commands, :errors, :transactions,
                           :recipients, :discarded_octets, :tls, :authenticated)

  # Client engine events (Smtpe::ClientSession#feed), each with #type.
  module ClientEvent
    def self.define(type, *members)
      Struct.new(*members) do
        define_method(:type) { type }
      end
    end
    private_class_method :define

    # Ready for mail. extensions a frozen Array of Symbols (:pipelining, :size, :chunking,
    # ...); size_limit nil when none; auth the mechanisms offered (frozen Strings).
    Ready = define(:ready, :extensions, :esmtp, :size_limit, :auth, :tls, :authenticated)
    # STARTTLS was answered (code 220): send nothing, run the handshake, call #tls_started.
    Starttls = define(:starttls, :code)
    # A step of a SASL mechanism the host runs: answer with ClientSession#auth_response.
    AuthStep = define(:auth_step, :step, :challenge)
    # The transaction's content may be given now (ClientSession#content); bdat is true when it
    # goes by BDAT (RFC 3030), false for DATA.
    Content = define(:content, :bdat)
    # One recipient's final outcome: :delivered, :permanent, :temporary, :unknown.
    Outcome = define(:outcome, :index, :recipient, :outcome, :code, :enhanced, :text, :local,
                     :before_mail)
    # The transaction is over: counts of its outcomes; reusable false once the session ends.
    TransactionDone = define(:transaction_done, :delivered, :permanent, :temporary, :unknown,
                             :reusable)
    # The session is over. reason :quit, :server_421, :protocol_error, :lost, :timeout,
    # :tls_required, :auth_failed, :aborted, :refused.
    Closed = define(:closed, :reason, :code, :text)
  end
end
