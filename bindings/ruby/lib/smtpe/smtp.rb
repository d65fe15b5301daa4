# frozen_string_literal: true

require "io/wait"
require "openssl"
require "socket"

module Smtpe
  # A client in the spirit of Net::SMTP on the client engine, with one outcome per recipient:
  #
  #   Smtpe::SMTP.start("mx.example", 25, helo: "me.example") do |smtp|
  #     result = smtp.send_message(content, "me@example.org", "you@example.com", "them@example.net")
  #     result.outcomes.each { |o| puts "#{o.recipient}: #{o.outcome} #{o.code} #{o.text}" }
  #   end
  #
  # Pipelining, BDAT, SIZE, 8BITMIME, SMTPUTF8 and dot-stuffing are the engine's; STARTTLS and
  # implicit TLS (tls: :opportunistic, :required, :implicit) run through Ruby's openssl. Every
  # wait is an IO wait (Fiber-scheduler friendly); timeouts come from the engine (RFC 5321
  # §4.5.3.2).
  class SMTP
    # What send_message returns: outcomes (frozen Smtpe::ClientEvent::Outcome, one per
    # recipient in order) and, when the session ended with it, closed (ClientEvent::Closed).
    Result = Struct.new(:outcomes, :closed) do
      # Every recipient was accepted by the server.
      def delivered?
        outcomes.all? { |o| o.outcome == :delivered }
      end
    end

    CONFIG_KEYS = %i[lmtp tls auth_mechanism auth_authzid auth_user auth_password auth_token
                     auth_plaintext_ok chunking chunk_size pipelining line_ending max_recipients
                     output_buffer_size max_unanswered command_timeout_ms greeting_timeout_ms
                     data_timeout_ms data_block_timeout_ms data_end_timeout_ms].freeze
    private_constant :CONFIG_KEYS

    # Connects, reads the greeting, says EHLO (and STARTTLS, AUTH as asked), yields the session
    # and QUITs after the block (or returns the session when no block is given: call #finish).
    # host, port:: the server; helo:: the EHLO argument; ssl_context:: an
    # OpenSSL::SSL::SSLContext for TLS (default: verify against the system store, hostname host);
    # open_timeout:: seconds for the TCP connect; other keywords go to Smtpe::ClientConfig
    # (tls:, auth_user:, auth_password:, lmtp:, ...). Raises Smtpe::SMTP::Error when the session
    # cannot start (refused greeting, TLS required and not offered, AUTH refused, lost).
    def self.start(host, port = 25, helo: "localhost", ssl_context: nil, open_timeout: 30, **opts)
      smtp = new(host, port, helo: helo, ssl_context: ssl_context, open_timeout: open_timeout, **opts)
      return smtp unless block_given?

      begin
        yield smtp
      ensure
        smtp.finish
      end
    end

    # The session could not start or went away: closed is the ClientEvent::Closed.
    class Error < Smtpe::Error
      # The ClientEvent::Closed that ended the session.
      attr_reader :closed

      # closed:: the ClientEvent::Closed
      def initialize(closed)
        @closed = closed
        super(["SMTP session ended:", closed.reason, closed.code, closed.text].compact.join(" "))
      end
    end

    # The server's capabilities once ready (ClientEvent::Ready).
    attr_reader :ready

    # Use SMTP.start, which takes the same arguments. Connects and waits until the session is
    # ready for mail (raises Error if it cannot be).
    def initialize(host, port, helo:, ssl_context:, open_timeout:, **opts)
      unknown = opts.keys - CONFIG_KEYS
      raise ArgumentError, "unknown keyword: #{unknown.first}" unless unknown.empty?

      @config = ClientConfig.new(helo_name: helo, **opts)
      @host = host
      @ssl_context = ssl_context
      # the TLS handshake's own bound (the engine keeps no timer while it runs)
      @handshake_ms = opts.fetch(:command_timeout_ms, 300_000)
      @handshake_ms = 300_000 if @handshake_ms.nil? || @handshake_ms.zero?
      @io = Socket.tcp(host, port, connect_timeout: open_timeout)
      begin
        @io.setsockopt(:TCP, :NODELAY, true)
        @session = ClientSession.new(@config, Smtpe.now_ms)
        @inbuf = String.new(capacity: 16_384, encoding: Encoding::BINARY)
        @rbuf = String.new(capacity: 16_384, encoding: Encoding::BINARY)
        @out = String.new(encoding: Encoding::BINARY) # taken from the engine, not yet written
        @closed = nil
        @session.tls_started(Smtpe.now_ms) if opts[:tls] == :implicit && handshake
        run { @ready || @closed }
        raise Error, @closed if @closed
      rescue Exception # rubocop:disable Lint/RescueException: close the socket, whatever it was
        @io.close unless @io.closed?
        raise
      end
    end

    # Sends one message: content (a String, RFC 5322 text; line ends are made CRLF), the
    # reverse-path from ("" for <>) and the forward-paths to (Strings, or Hashes with address:,
    # notify:, orcpt:). Keywords go to the transaction (body:, smtputf8:, ret:, envid:,
    # requiretls:, ...). Returns a Result: the outcome of each recipient (RFC 5321 §3.3). A
    # session that ends meanwhile gives temporary (or unknown) outcomes, never an exception.
    def send_message(content, from, *to, **txn)
      raise Error, @closed if @closed

      content = content.b
      @outcomes = []
      @done = false
      @content = content
      @pos = nil
      @session.submit(reverse_path: from, recipients: to.flatten, content: content, **txn)
      run { @done || @closed }
      Result.new(@outcomes.sort_by(&:index).freeze, @closed).freeze
    end
    alias sendmail send_message

    # QUIT and close (idempotent).
    def finish
      unless @closed
        @session.quit
        run { @closed }
      end
    rescue Smtpe::Error, IOError, SystemCallError
      nil
    ensure
      @io.close unless @io.closed?
    end

    private

    # Pumps until the block says done: every event handled, output written in one write per
    # round, content streamed, then a read (or the engine's deadline).
    def run
      loop do
        while (ev = @session.feed(@inbuf, Smtpe.now_ms))
          handle(ev)
        end
        stream_content if @pos && @session.want_content?
        next read if flush == :readable # the server spoke while our write waited: hear it first
        return if yield
        next if @session.want.anybits?(WANT_EVENT) # flush's timeout queued the Closed event

        if @session.want_tls?
          @session.tls_started(Smtpe.now_ms) if handshake
        elsif !@session.want_content?
          read
        end
      end
    end

    def handle(ev)
      case ev
      when ClientEvent::Ready then @ready = ev
      when ClientEvent::Content then @pos = 0
      when ClientEvent::Outcome then @outcomes << ev
      when ClientEvent::TransactionDone
        @done = true
        @pos = nil
        @content = nil
      when ClientEvent::Closed then @closed = ev
      when ClientEvent::AuthStep then @session.auth_response(nil)
      end
    end

    def stream_content
      while @session.want_content?
        piece = @content.byteslice(@pos, 65_536)
        last = @pos + piece.bytesize >= @content.bytesize
        n = @session.content(piece, last: last)
        @pos += n
        break if n.zero? || (last && n == piece.bytesize)
      end
      @pos = nil if @pos && @pos >= @content.bytesize && !@session.want_content?
    end

    # Writes the queued output, taking more from the engine only once what it took is written;
    # a server that stops reading is as late as one that stops answering: the engine's deadline
    # (the data block timeout while content goes) ends it. Returns :readable when the server
    # sent octets while a write waited: the caller reads and feeds them before more output is
    # taken, so that a reply begun before the end of the content was handed out is judged as
    # such (smtpe.h: a host feeds everything it has read before it sends output queued since).
    def flush
      @session.take_output(@out) if @out.empty? # more only once the rest was written
      until @out.empty?
        n = @io.write_nonblock(@out, exception: false)
        if n.is_a?(Integer)
          @out = @out.byteslice(n, @out.bytesize - n)
          next
        end
        deadline = @session.expiry(Smtpe.now_ms)
        wait = deadline ? [(deadline - Smtpe.now_ms) / 1000.0, 0].max : 300
        raw = @io.to_io
        if n == :wait_writable
          r, w = IO.select([raw], [raw], nil, wait)
          # octets from the server while ours wait: read before the engine hands out more
          # (the end of the content among it), so that a reply begun before it is judged so
          return :readable if r && !r.empty?
          next if w
        elsif raw.wait_readable(wait) # TLS wants to read first
          next
        end
        next unless deadline.nil? || @session.handle_expiry(Smtpe.now_ms)

        @session.lost unless @session.want_close?
        return
      end
    rescue IOError, SystemCallError, OpenSSL::SSL::SSLError
      @session.lost unless @closed
    end

    def read
      data = @io.read_nonblock(16_384, @rbuf, exception: false)
      case data
      when nil then @session.lost
      when :wait_readable, :wait_writable
        deadline = @session.expiry(Smtpe.now_ms)
        wait = deadline && [(deadline - Smtpe.now_ms) / 1000.0, 0].max
        @session.handle_expiry(Smtpe.now_ms) unless @io.to_io.wait_readable(wait)
      else @inbuf << data
      end
    rescue IOError, SystemCallError, OpenSSL::SSL::SSLError
      @session.lost unless @closed
    end

    # The TLS handshake (RFC 3207, RFC 8314), bounded by the command timeout. true when TLS is
    # up; false when it failed or timed out: the session is told the connection is lost (its
    # recipients temporary) and ends with Closed :lost, which SMTP.start raises as Error.
    def handshake
      ctx = @ssl_context || OpenSSL::SSL::SSLContext.new.tap(&:set_params)
      ssl = OpenSSL::SSL::SSLSocket.new(@io, ctx)
      ssl.hostname = @host
      ssl.sync_close = true
      limit = Smtpe.now_ms + @handshake_ms
      loop do
        r = ssl.connect_nonblock(exception: false)
        break unless r.is_a?(Symbol)

        wait = [(limit - Smtpe.now_ms) / 1000.0, 0].max
        ok = r == :wait_readable ? @io.wait_readable(wait) : @io.wait_writable(wait)
        raise IOError, "TLS handshake timed out" unless ok
      end
      ssl.post_connection_check(@host) if ctx.verify_mode != OpenSSL::SSL::VERIFY_NONE
      @io = ssl
      true
    rescue OpenSSL::SSL::SSLError, IOError, SystemCallError => e
      warn "smtpe: TLS with #{@host}: #{e.message}" if $VERBOSE
      @session.lost
      false
    end
  end
end
