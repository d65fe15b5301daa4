# frozen_string_literal: true

# The pure-Ruby protocol baseline: an SMTP server session written the way the study's proof of
# concept and today's Ruby servers (midi-smtp-server, Postal, Mailcatcher) parse, line by line in
# Ruby: a String buffer, `while (i = buf.index("\n"))`, chomp, a case of regexps per command,
# DATA collected line by line until a line that is exactly ".". It plugs into the same sans-I/O
# driver interface as the smtpe driver (start/receive/expire/eof/closed?/deadline/tls?) so the
# host runners (threads, fibers, prefork, ractors) can run either, and the benchmark measures
# what the engine changes.
#
# It is deliberately NOT hardened. Like the servers it models it splits on LF alone, so it takes
# bare-LF line ends, and a bare "\n.\n" ends DATA: the SMTP smuggling the engine refuses. Line
# and buffer lengths are unbounded, there is no error limit, no STARTTLS, AUTH, CHUNKING or DSN.
# The reply texts follow the engine's, so both send the same octets for the benchmark session.
require_relative "../lib/smtpe/events"
require_relative "../lib/smtpe/handler"

module Smtpe
  module Baseline
    class LineProtocol
      COMMAND_TIMEOUT_MS = 300_000 # RFC 5321 §4.5.3.2.7
      DATA_TIMEOUT_MS = 180_000    # §4.5.3.2.5/6, as the engine
      MAX_RECIPIENTS = 100
      NULL_PATH = Path.new("", "", "", Path::NULL).freeze
      NO_PARAMS = [].freeze

      def initialize(handler:, hostname: "localhost", peer: "unknown", max_message_size: 10 * 1024 * 1024)
        @handler = handler
        @hostname = hostname.dup.freeze
        @peer = peer.dup.freeze
        @max_size = max_message_size
        @buf = String.new(encoding: Encoding::BINARY)
        @closed = false
        @closing = false
        @deadline = nil
        @id = 0
        @helo = nil
        @data = nil # the content's lines while in DATA, else nil
        reset_transaction
      end

      def closed? = @closed
      def tls? = false
      def deadline = @closed ? nil : @deadline

      # The greeting (or the refusal of on_connect, which closes).
      def start(now_ms)
        @deadline = now_ms + COMMAND_TIMEOUT_MS
        verdict = @handler.on_connect(@peer)
        return "220 #{@hostname} ESMTP smtpe\r\n".b if positive?(verdict)

        out = verdict_reply(verdict, [554, "5.3.2", "Service not available"]).b
        finish(:closed)
        out
      end

      def receive(data, now_ms)
        return binary if @closed

        @buf << (data.encoding == Encoding::BINARY ? data : data.b)
        out = binary
        while !@closed && (i = @buf.index("\n"))
          line = @buf.slice!(0, i + 1).chomp
          if @data
            data_line(line, out)
          else
            command(line, out)
          end
        end
        @deadline = now_ms + (@data ? DATA_TIMEOUT_MS : COMMAND_TIMEOUT_MS)
        out
      end

      def expire(_now_ms)
        return binary if @closed

        finish(:timeout)
        "421 4.4.2 #{@hostname} Timeout exceeded\r\n".b
      end

      def eof(_now_ms)
        finish(:eof) unless @closed
        nil
      end

      private

      def command(line, out)
        case line
        when /\A(HELO|EHLO)[ \t]+(\S+)[ \t]*\z/i then helo($1.upcase == "EHLO", $2, out)
        when /\A(HELO|EHLO)\b/i then out << "501 5.5.4 Syntax: #{$1.upcase} hostname\r\n"
        when /\AMAIL FROM:\s*<([^>]*)>\s*(.*)\z/i then mail($1, $2, out)
        when /\AMAIL\b/i then out << "501 5.5.4 Syntax: MAIL FROM:<address>\r\n"
        when /\ARCPT TO:\s*<([^>]*)>\s*(.*)\z/i then rcpt($1, $2, out)
        when /\ARCPT\b/i then out << "501 5.5.4 Syntax: RCPT TO:<address>\r\n"
        when /\A(DATA|RSET|QUIT)\s*\z/i then plain($1.upcase, out)
        when /\A(DATA|RSET|QUIT)\b/i then out << "501 5.5.4 No parameters allowed\r\n"
        when /\ANOOP\b/i then out << "250 2.0.0 Ok\r\n"
        when /\AHELP\b/i then out << "214 2.0.0 Commands: EHLO HELO MAIL RCPT DATA RSET NOOP QUIT VRFY EXPN HELP\r\n"
        when /\AVRFY\s+(.+)\z/i
          event = Event::Vrfy.new(next_id, $1.freeze).freeze
          out << verdict_reply(@handler.on_vrfy(event),
                               [252, "2.5.0", "Cannot VRFY user, but will accept message and attempt delivery"])
        when /\AEXPN\s+(.+)\z/i
          event = Event::Expn.new(next_id, $1.freeze).freeze
          out << verdict_reply(@handler.on_expn(event), [252, "2.5.0", "Cannot EXPN list"])
        when /\A(VRFY|EXPN)\b/i then out << "501 5.5.4 Syntax: #{$1.upcase} argument\r\n"
        else
          verb, arg = line.split(" ", 2)
          event = Event::Unknown.new(next_id, verb.to_s.freeze, arg&.freeze).freeze
          out << verdict_reply(@handler.on_unknown(event), [500, "5.5.1", "Command unrecognized"])
        end
        close_on_421
      end

      def helo(esmtp, domain, out)
        abandoned = @mail_accepted
        reset_transaction
        event = Event::Helo.new(next_id, domain.freeze, esmtp, false, abandoned).freeze
        verdict = @handler.on_helo(event)
        unless positive?(verdict)
          code, _enhanced, text = reply_parts(verdict, [250, nil, nil])
          return out << format_reply(code, nil, text || default_text(code)) # no enhanced code for HELO/EHLO (RFC 2034 §3)
        end

        @helo = event.domain
        first = reply_parts(verdict, [250, nil, @hostname])
        first[2] ||= @hostname
        return out << format_reply(first[0], nil, first[2]) unless esmtp

        out << "#{first[0]}-#{first[2]}\r\n#{first[0]}-PIPELINING\r\n#{first[0]}-SIZE #{@max_size}\r\n" \
               "#{first[0]}-8BITMIME\r\n#{first[0]} ENHANCEDSTATUSCODES\r\n"
      end

      def mail(address, rest, out)
        return out << "503 5.5.1 Send HELO or EHLO first\r\n" unless @helo
        return out << "503 5.5.1 Nested MAIL command\r\n" if @mail_accepted

        path = parse_path(address, true) or return out << "501 5.1.7 Bad sender address syntax\r\n"
        size = nil
        body = :unspecified
        params = []
        rest.split.each do |param|
          keyword, value = param.split("=", 2)
          case keyword.upcase
          when "SIZE"
            return out << "501 5.5.4 Malformed parameter\r\n" unless value&.match?(/\A\d{1,20}\z/)

            size = value.to_i
          when "BODY"
            body = { "7BIT" => :"7bit", "8BITMIME" => :"8bitmime" }[value.to_s.upcase] or
              return out << "501 5.5.4 Malformed parameter\r\n"
          else
            return out << "555 5.5.4 Unsupported parameter\r\n"
          end
          params << [keyword.freeze, value&.freeze].freeze
        end
        if size && size > @max_size
          return out << "552 5.3.4 Message size exceeds fixed limit\r\n"
        end

        event = Event::Mail.new(next_id, path, size, body, false, nil, nil, nil, false, nil, nil, nil,
                                false, params.freeze).freeze
        reply = verdict_reply(@handler.on_mail(event), [250, "2.1.0", "Ok"])
        if reply.start_with?("2")
          @mail_accepted = true
          @reverse_path = path
        end
        out << reply
      end

      def rcpt(address, rest, out)
        return out << "503 5.5.1 Need MAIL command\r\n" unless @mail_accepted

        path = parse_path(address, false) or return out << "501 5.1.3 Bad recipient address syntax\r\n"
        return out << "555 5.5.4 Unsupported parameter\r\n" unless rest.empty?
        return out << "452 4.5.3 Too many recipients\r\n" if @recipients.size >= MAX_RECIPIENTS

        event = Event::Rcpt.new(next_id, path, NO_PARAMS, nil, nil, NO_PARAMS).freeze
        reply = verdict_reply(@handler.on_rcpt(event), [250, "2.1.5", "Ok"])
        @recipients << path if reply.start_with?("2")
        out << reply
      end

      def plain(verb, out)
        case verb
        when "DATA"
          return out << "503 5.5.1 Need MAIL command\r\n" unless @mail_accepted
          return out << "554 5.5.1 No valid recipients\r\n" if @recipients.empty?

          @data = []
          @size = 0
          out << "354 End data with <CR><LF>.<CR><LF>\r\n"
        when "RSET"
          reset_transaction
          out << "250 2.0.0 Ok\r\n"
        when "QUIT"
          out << "221 2.0.0 Bye\r\n"
          finish(:quit)
        end
      end

      # One line of content (line end removed). "." alone ends it; a leading dot is unstuffed.
      def data_line(line, out)
        if line == "."
          lines = @data
          @data = nil
          if @size > @max_size
            out << "552 5.3.4 Message size exceeds fixed limit\r\n"
          else
            content = lines.empty? ? binary : (lines.join("\r\n") << "\r\n")
            message = Message.new(@reverse_path, @recipients.dup.freeze, content.freeze, @peer, @helo, false).freeze
            out << verdict_reply(@handler.on_data(message), [250, "2.0.0", "Ok"])
          end
          reset_transaction
          return close_on_421
        end
        line = line[1..] if line.start_with?(".")
        @size += line.bytesize + 2
        @data << line if @size <= @max_size # past the limit, read on to "." and refuse
      end

      # The reply line(s) for a handler's verdict; default [code, enhanced, text] for acceptance.
      def verdict_reply(verdict, default)
        code, enhanced, text = reply_parts(verdict, default)
        enhanced ||= "#{code / 100}.0.0" unless code / 100 == 3
        format_reply(code, enhanced, text || default_text(code))
      end

      def reply_parts(verdict, default)
        case verdict
        when nil, true, :accept then default.dup
        when Integer then [verdict, nil, nil]
        when Array then [verdict[0], verdict[1], verdict[2]]
        when Reply then [verdict.code, verdict.enhanced, verdict.text]
        else raise ArgumentError, "not a verdict: #{verdict.inspect}"
        end
      end

      def positive?(verdict)
        verdict.nil? || verdict == true || verdict == :accept || reply_parts(verdict, nil)[0] / 100 == 2
      end

      def default_text(code)
        if code < 300 then "Ok"
        elsif code < 400 then "Continue"
        elsif code < 500 then "Try again later"
        else "Rejected"
        end
      end

      # "code enhanced text\r\n"; a text with "\n" gives a multi-line reply.
      def format_reply(code, enhanced, text)
        @closing = true if code == 421
        lines = text.to_s.split("\n")
        lines = [""] if lines.empty?
        last = lines.size - 1
        lines.each_with_index.map { |l, n| "#{code}#{n == last ? " " : "-"}#{enhanced && "#{enhanced} "}#{l}\r\n" }
             .join.force_encoding(Encoding::BINARY)
      end

      # A path between the brackets; nil when it does not parse.
      def parse_path(address, reverse)
        return reverse ? NULL_PATH : nil if address.empty?

        flags = 0
        if address.start_with?("@") # a source route, "@a,@b:user@domain": ignored (§C)
          colon = address.index(":") or return nil
          address = address[(colon + 1)..]
          flags |= Path::SOURCE_ROUTE
        end
        if !reverse && address.casecmp?("postmaster")
          return Path.new(address.freeze, address.freeze, "", flags | Path::POSTMASTER).freeze
        end

        at = address.rindex("@") or return nil
        local = address[0, at]
        domain = address[(at + 1)..]
        quoted = local.start_with?('"')
        return nil if local.empty? || domain.empty? || domain.match?(/[\s<>]/) || (!quoted && local.match?(/[\s<>]/))

        flags |= Path::QUOTED if quoted
        flags |= Path::ADDR_LITERAL if domain.start_with?("[")
        flags |= Path::UTF8 unless address.ascii_only?
        Path.new(address.freeze, local.freeze, domain.freeze, flags).freeze
      end

      # A 421 verdict closes the session (RFC 5321 §3.8).
      def close_on_421
        finish(:closed) if @closing && !@closed
      end

      def reset_transaction
        @mail_accepted = false
        @reverse_path = nil
        @recipients = []
      end

      def next_id = (@id += 1)
      def binary = String.new(encoding: Encoding::BINARY)

      def finish(reason)
        @closed = true
        @buf.clear
        @data = nil
        @handler.on_close(reason)
      end
    end
  end
end
