# frozen_string_literal: true

module Smtpe
  Reply = Struct.new(:code, :enhanced, :text)
  # A reply a handler gives as its verdict: code 200..599, enhanced status code ("5.1.1", nil:
  # derived from the code's class), text (nil: the engine's default; a newline separates lines).
  class Reply
    singleton_class.send(:remove_method, :[])
    # A frozen Reply: Smtpe::Reply[550, "5.1.1", "No such user"].
    def self.[](code, enhanced = nil, text = nil)
      new(code, enhanced, text).freeze
    end
  end

  # A message whose content has ended: what Handler#on_data decides on.
  # reverse_path:: the Smtpe::Path of MAIL
  # recipients:: frozen Array of the accepted forward-paths (Smtpe::Path), in order
  # content:: the content as received (a binary String, CRLF line ends, dot-unstuffed)
  # peer:: the client's address ("192.0.2.1:40000"), helo: its HELO/EHLO argument
  # chunked:: the content came by BDAT (RFC 3030)
  # auth:: the authentication identity AUTH succeeded with (authcid; nil if none), tls: TLS is up
  Message = Struct.new(:reverse_path, :recipients, :content, :peer, :helo, :chunked, :auth, :tls)

  # The object a server asks for verdicts. Subclass it and override what you need; every method
  # returns a verdict:
  # - nil, true or :accept: the engine's positive reply (250, 354, ...);
  # - an Integer code (550), [code, enhanced, text], or a Smtpe::Reply;
  # - for on_data under LMTP, an Array of verdicts, one per recipient ([250, [452, "4.2.2",
  #   "Over quota"]]: an Array holding no String), or one verdict for all.
  # Reply texts may have several lines (a newline between them), but for HELO/EHLO, whose
  # reply lines the engine writes.
  # A method may block (a lookup, a sleep): under a Fiber scheduler only its Fiber waits.
  # Methods are called for one session at a time from that session's Thread, Fiber or Ractor:
  # a handler shared by sessions on several threads keeps its own state thread-safe. Under the
  # ractors model every Ractor uses the same handler, so Smtpe::Server makes it shareable
  # (Ractor.make_shareable: it is frozen, with everything it refers to; keep state elsewhere),
  # and a method that blocks holds up every session of its Ractor (its loop has no Fibers).
  class Handler
    # A new connection from peer ("addr:port"). A refusal (421, 554) closes it at once.
    def on_connect(peer)
      nil
    end
    # HELO/EHLO/LHLO (Event::Helo).
    def on_helo(event)
      nil
    end
    # MAIL FROM: (Event::Mail).
    def on_mail(event)
      nil
    end
    # RCPT TO: (Event::Rcpt).
    def on_rcpt(event)
      nil
    end
    # AUTH (Event::Auth): refused unless overridden.
    def on_auth(event)
      Reply[535, "5.7.8", "Authentication credentials invalid"]
    end
    # The message is complete (Smtpe::Message): accept only once it is stored durably.
    def on_data(message)
      nil
    end
    # VRFY/EXPN/unknown verbs: the engine's default answers.
    def on_vrfy(event)
      nil
    end
    # EXPN (Event::Expn): 252 by default.
    def on_expn(event)
      nil
    end
    # A verb the engine does not know (Event::Unknown): 500 5.5.1 by default.
    def on_unknown(event)
      nil
    end
    # The session ended (reason a Symbol: :quit, :timeout, :error_limit, :eof, :closed).
    def on_close(reason)
      nil
    end
  end
end
