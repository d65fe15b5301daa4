# frozen_string_literal: true

module Smtpe
  # The monotonic clock the engines take, in milliseconds.
  def self.now_ms
    Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond)
  end

  # One server connection, sans-I/O: the smtpe engine (ServerSession) asking a Handler for its
  # verdicts. It is what the runners (Smtpe::Server, Smtpe::Connection) drive, and what any host
  # with its own I/O drives the same way:
  #
  #   driver = Smtpe::ServerDriver.new(config: cfg, handler: h, peer: "192.0.2.1:4000")
  #   write(driver.start(now))                  # the greeting
  #   loop: write(driver.receive(read_octets, now))   # every reply of the batch, one String
  #         if driver.tls?: write nothing more, run the handshake, write(driver.tls_started(now))
  #         at driver.deadline: write(driver.expire(now));  on EOF: driver.eof(now)
  #   until driver.closed? (then write the last output and close)
  #
  # The Handler is called synchronously from #start and #receive (a Fiber that blocks in it lets
  # the others run). Content is collected into one String per message and given to
  # Handler#on_data as a Smtpe::Message once the engine has seen its end (CRLF.CRLF or BDAT
  # LAST): a message with bare line ends, too big, or abandoned never reaches the handler.
  class ServerDriver
    # The Smtpe::ServerSession (the engine) and the peer address given to #new.
    attr_reader :session, :peer

    # config:: a Smtpe::ServerConfig; handler:: a Smtpe::Handler (or any object with its
    # methods); peer:: the client's address for the handler and the log; tls:: true when the
    # runner can run a STARTTLS handshake (else STARTTLS is refused 454 4.7.0); implicit_tls::
    # the connection is TLS from its start (port 465).
    def initialize(config:, handler:, peer: nil, tls: false, implicit_tls: false, now: Smtpe.now_ms)
      @handler = handler
      @peer = peer
      @tls = tls
      @session = ServerSession.new(config, now)
      @session.tls_started(now) if implicit_tls
      @tls_up = implicit_tls
      @auth = nil
      @lmtp = config.lmtp?
      @inbuf = String.new(encoding: Encoding::BINARY)
      @sink = String.new(encoding: Encoding::BINARY)
      @out = String.new(encoding: Encoding::BINARY)
      @now = now
      @helo = nil
      @closed_reason = nil
      reset_transaction
    end

    # The first octets to send (the greeting, or the refusal of Handler#on_connect).
    def start(now)
      @now = now
      verdict = call_handler(:on_connect, @peer)
      code = verdict_code(verdict)
      if code && code >= 400
        v = reply_parts(verdict)
        @session.close(v[0], v[1], v[2])
        finish(:closed)
      end
      output
    end

    # Gives the engine the octets read (a binary String, any split; copied before any handler
    # runs, so +data+ may be a read buffer that others reuse) and returns the octets to send:
    # every reply owed so far, in order, in one String (empty when none). The String is reused
    # by the next call: write it before calling again.
    def receive(data, now)
      @now = now
      @inbuf << data
      pump
    end

    # True once the session is over: write the last output, then close the connection.
    def closed?
      @session.want_close?
    end

    # True when STARTTLS was accepted: write the output, run the handshake, call #tls_started.
    def tls?
      @session.want_tls?
    end

    # TLS is up; returns the octets to send (none, usually).
    def tls_started(now)
      @now = now
      @session.tls_started(now)
      @tls_up = true
      @auth = nil
      pump
    end

    # The monotonic ms at which to call #expire, or nil.
    def deadline
      @session.expiry(@now)
    end

    # Tells the engine the time; returns the octets to send (421 4.4.2 when it expired).
    def expire(now)
      @now = now
      @session.handle_expiry(now)
      pump
    end

    # The client closed its side (or the connection broke).
    def eof(now)
      @now = now
      finish(:eof)
      nil
    end

    private

    def reset_transaction
      @reverse_path = nil
      @recipients = []
      @sink.clear
    end

    def output
      @out.clear
      @session.take_output(@out)
      @out
    end

    # Runs the engine over what is held, events to the handler, until it needs the client;
    # returns the replies to send.
    def pump
      @out.clear
      loop do
        while (ev = @session.feed(@inbuf, @now, @sink))
          dispatch(ev)
        end
        break if @session.take_output(@out).zero? || @inbuf.empty? || !@session.want_read?
      end
      finish(:closed) if @session.want_close?
      @out
    end

    def dispatch(ev)
      case ev
      when Event::Rcpt then on_rcpt(ev)
      when Event::Mail then on_mail(ev)
      when Event::Data, Event::ChunkEnd, Event::Proxy, Event::Xclient, Event::Xforward
        @session.accept
      when Event::DataEnd then on_data_end(ev)
      when Event::Helo then on_helo(ev)
      when Event::Rset then reset_transaction
      when Event::Quit then finish(:quit)
      when Event::Timeout then finish(:timeout)
      when Event::ErrorLimit then finish(:error_limit)
      when Event::Starttls then @tls ? @session.accept : @session.reply(454, "4.7.0", "TLS not available")
      when Event::Auth then on_auth(ev)
      when Event::Vrfy then verdict(call_handler(:on_vrfy, ev))
      when Event::Expn then verdict(call_handler(:on_expn, ev))
      when Event::Unknown then verdict(call_handler(:on_unknown, ev))
      end
    end

    def on_auth(ev)
      v = call_handler(:on_auth, ev)
      @auth = ev.authcid || ev.mechanism if accepted?(v)
      verdict(v)
    end

    def on_helo(ev)
      reset_transaction
      @helo = ev.domain
      verdict(call_handler(:on_helo, ev))
    end

    def on_mail(ev)
      v = call_handler(:on_mail, ev)
      reset_transaction
      @reverse_path = ev.reverse_path if accepted?(v)
      verdict(v)
    end

    def on_rcpt(ev)
      v = call_handler(:on_rcpt, ev)
      @recipients << ev.forward_path if accepted?(v)
      verdict(v)
    end

    def on_data_end(ev)
      content = @sink
      @sink = String.new(encoding: Encoding::BINARY)
      if ev.status == :ok
        message = Message.new(@reverse_path, @recipients.freeze, content, @peer, @helo, ev.chunked,
                              @auth, @tls_up)
        v = call_handler(:on_data, message)
        if @lmtp
          # a list of verdicts holds no String; [451, "4.3.0", "Later"] is one verdict
          list = v.is_a?(Array) && v.none?(String) ? v : [v] * ev.replies
          ev.replies.times { |i| verdict(list.fetch(i, list.last)) }
        else
          verdict(v)
        end
      end
      reset_transaction
    end

    def finish(reason)
      return if @closed_reason

      @closed_reason = reason
      reset_transaction
      call_handler(:on_close, reason)
    end

    # A handler's exception is a local error for that command (451 4.3.0), never a lost reply.
    def call_handler(name, arg)
      @handler.public_send(name, arg)
    rescue StandardError, ScriptError => e # NotImplementedError, a LoadError of a lazy require
      warn "smtpe: #{@handler.class}##{name} raised #{e.class}: #{e.message}"
      Reply[451, "4.3.0", "Local error in processing"]
    end

    LOCAL_ERROR = [451, "4.3.0", "Local error in processing"].freeze
    private_constant :LOCAL_ERROR

    # nil for the engine's positive reply, else [code, enhanced, text].
    def normalize(v)
      case v
      when nil, true, :accept then nil
      when Integer then [v, nil, nil]
      when Array then [v[0], v[1], v[2]]
      when Reply then [v.code, v.enhanced, v.text]
      else
        warn "smtpe: not a verdict: #{v.inspect}"
        LOCAL_ERROR
      end
    end

    def verdict_code(v)

      normalize(v)&.first

    end

    def reply_parts(v)

      normalize(v)

    end

    def accepted?(v)

      (code = verdict_code(v)).nil? || (200..299).cover?(code)

    end

    def verdict(v)
      parts = normalize(v)
      return @session.accept if parts.nil?

      @session.reply(parts[0], parts[1], parts[2])
    rescue Smtpe::InvalidArgument, Smtpe::ReplyTooLong, ::ArgumentError, ::TypeError => e
      warn "smtpe: bad verdict #{v.inspect}: #{e.message}"
      @session.reply(*LOCAL_ERROR)
    end
  end
end
