# frozen_string_literal: true

require "io/wait"
require "openssl"
require "socket"

module Smtpe
  # Runs one sans-I/O driver (a ServerDriver, or anything with its methods) over one IO until
  # the session ends: reads what the peer sent, writes every reply of a batch in one write,
  # waits no longer than the driver's deadline, and runs STARTTLS through Ruby's openssl. All
  # its waits are IO#wait_readable and IO#write, so under a Fiber scheduler (the async gem) only
  # this connection's Fiber waits; under threads, only its Thread.
  class Connection
    # Octets asked for by each read.
    READ_SIZE = 16_384
    # Seconds a write may wait for the peer to read (RFC 5321 §4.5.3.2.7: the server waits 5
    # minutes for a command; a client that reads nothing as long is dropped, never held).
    WRITE_TIMEOUT = 300
    # Seconds at most for a closing session's last reply to a peer that reads nothing.
    LAST_REPLY_TIMEOUT = 10

    # io:: a connected socket; driver:: the session; tls_context:: an
    # OpenSSL::SSL::SSLContext for STARTTLS (nil: none); reply_delay:: seconds to wait before
    # each write (the study's 10 ms "work" before each reply; 0 for none); write_timeout::
    # seconds a write may wait for the peer to read before the connection is dropped, when the
    # engine has no deadline of its own (its command and data timeouts bound writes too).
    def initialize(io, driver, tls_context: nil, reply_delay: 0, write_timeout: WRITE_TIMEOUT)
      @write_timeout = write_timeout
      @io = io
      @driver = driver
      @tls_context = tls_context
      @reply_delay = reply_delay
      @buf = String.new(capacity: READ_SIZE, encoding: Encoding::BINARY)
    end

    # Runs the session to its end and closes the IO. Returns nil.
    def run
      write(@driver.start(Smtpe.now_ms))
      until @driver.closed?
        out = step
        break if out.nil?

        write(out)
        start_tls if @driver.tls?
      end
    rescue IOError, SystemCallError, OpenSSL::SSL::SSLError => e
      @driver.eof(Smtpe.now_ms) unless e.is_a?(EOFError) && @driver.closed?
    rescue SignalException, SystemExit
      raise
    rescue Exception => e # rubocop:disable Lint/RescueException: one session's bug ends only it
      warn "smtpe: session ended by #{e.class}: #{e.message}"
      @driver.eof(Smtpe.now_ms)
    ensure
      close
    end

    private

    # One read (or the deadline): the driver's output, or nil at EOF. It waits before it reads:
    # in a request-reply protocol the peer's next octets are rarely there yet when our reply
    # has just gone, so a read first would mostly cost a failed read(2) (TLS may hold octets
    # already decrypted: then it reads first).
    def step
      raw = @io.to_io
      loop do
        unless @io.is_a?(OpenSSL::SSL::SSLSocket) && @io.pending.positive?
          deadline = @driver.deadline
          wait = deadline && [(deadline - Smtpe.now_ms) / 1000.0, 0].max
          return @driver.expire(Smtpe.now_ms) unless raw.wait_readable(wait)
        end
        data = @io.read_nonblock(READ_SIZE, @buf, exception: false)
        case data
        when nil
          @driver.eof(Smtpe.now_ms)
          return nil
        when :wait_readable then next
        when :wait_writable then raw.wait_writable(30) or raise IOError, "TLS write timed out"
        else return @driver.receive(data, Smtpe.now_ms)
        end
      end
    end

    def write(out)
      return if out.nil? || out.empty?

      sleep(@reply_delay) if @reply_delay.positive?
      rest = out
      until rest.empty?
        n = @io.write_nonblock(rest, exception: false)
        case n
        when :wait_writable
          @io.to_io.wait_writable(write_wait) or raise IOError, "peer reads nothing: write timed out"
        when :wait_readable # TLS renegotiation wants to read
          @io.to_io.wait_readable(write_wait) or raise IOError, "TLS write timed out"
        else
          rest = rest.byteslice(n, rest.bytesize - n)
        end
      end
    end

    # Seconds a blocked write may wait: until the engine's own deadline (the peer that reads
    # nothing is as late as one that sends nothing), LAST_REPLY_TIMEOUT for a closing session,
    # else write_timeout.
    def write_wait
      deadline = @driver.deadline
      return [(deadline - Smtpe.now_ms) / 1000.0, 0].max if deadline

      @driver.closed? ? [@write_timeout, LAST_REPLY_TIMEOUT].min : @write_timeout
    end

    # STARTTLS accepted and its 220 written: the handshake, then the session starts afresh.
    def start_tls
      ssl = OpenSSL::SSL::SSLSocket.new(@io, @tls_context)
      ssl.sync_close = true
      loop do
        case ssl.accept_nonblock(exception: false)
        when :wait_readable then @io.wait_readable(30) or raise IOError, "TLS handshake timed out"
        when :wait_writable then @io.wait_writable(30) or raise IOError, "TLS handshake timed out"
        else break
        end
      end
      @io = ssl
      write(@driver.tls_started(Smtpe.now_ms))
    end

    def close
      @io.close unless @io.closed?
    rescue IOError, SystemCallError
      nil
    end
  end
end
