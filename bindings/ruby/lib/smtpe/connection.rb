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

    # io:: a connected socket; driver:: the session; tls_context:: an
    # OpenSSL::SSL::SSLContext for STARTTLS (nil: none); reply_delay:: seconds to wait before
    # each write (the study's 10 ms "work" before each reply; 0 for none).
    def initialize(io, driver, tls_context: nil, reply_delay: 0)
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
      @io.write(out)
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
