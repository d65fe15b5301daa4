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
    # Seconds at most for the whole STARTTLS handshake (less if the engine's deadline is nearer).
    HANDSHAKE_TIMEOUT = 30

    # io:: a connected socket; driver:: the session; tls_context:: an
    # OpenSSL::SSL::SSLContext for STARTTLS (nil: none); reply_delay:: seconds to wait before
    # each write (the study's 10 ms "work" before each reply; 0 for none); write_timeout::
    # seconds a write may wait for the peer to read before the connection is dropped, when the
    # engine has no deadline of its own (its command and data timeouts bound writes too);
    # sweeper:: a DeadlineSweeper that wakes this connection's reads at the engine's deadline,
    # and whose read buffer it reads into (nil: each read waits with a timeout of its own, into
    # a buffer of the connection's own).
    def initialize(io, driver, tls_context: nil, reply_delay: 0, write_timeout: WRITE_TIMEOUT,
                   sweeper: nil)
      @write_timeout = write_timeout
      @sweeper = sweeper
      @buf = sweeper ? sweeper.read_buffer : String.new(capacity: READ_SIZE, encoding: Encoding::BINARY)
      # every wait on the socket goes through it: the reactor takes one registration per IO
      @waiter = sweeper&.waiter(io)
      @io = io
      @driver = driver
      @tls_context = tls_context
      @reply_delay = reply_delay
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
    rescue Exception => e # rubocop:disable Lint/RescueException
      # the scheduler stopping this Fiber (async's Stop, at the server's stop) is no bug of
      # the session's: the session ends as at EOF, without a warning, and the Fiber stops
      if Connection.stop?(e)
        @driver.eof(Smtpe.now_ms)
        raise
      end

      session_bug(e)
    ensure
      close
    end

    # Whether e is a Fiber scheduler's order to stop (Async::Stop), not a failure.
    def self.stop?(e) = defined?(Async::Stop) && e.is_a?(Async::Stop)

    private

    def session_bug(e) # one session's bug ends only it
      warn "smtpe: session ended by #{e.class}: #{e.message}"
      @driver.eof(Smtpe.now_ms)
    end

    # One read (or the deadline): the driver's output, or nil at EOF. It waits before it reads:
    # in a request-reply protocol the peer's next octets are rarely there yet when our reply
    # has just gone, so a read first would mostly cost a failed read(2) (TLS may hold octets
    # already decrypted: then it reads first).
    def step
      raw = @io.to_io
      loop do
        unless @io.is_a?(OpenSSL::SSL::SSLSocket) && @io.pending.positive?
          return @driver.expire(Smtpe.now_ms) unless wait_readable(raw)
        end
        data = @io.read_nonblock(READ_SIZE, @buf, exception: false)
        case data
        when nil
          @driver.eof(Smtpe.now_ms)
          return nil
        when :wait_readable then next
        when :wait_writable then wait_io(:writable, 30) or raise IOError, "TLS write timed out"
        else return @driver.receive(data, Smtpe.now_ms)
        end
      end
    end

    # Waits until the peer's octets are there (truthy) or the engine's deadline passed (false).
    def wait_readable(raw)
      deadline = @driver.deadline
      @wait_ms = deadline - Smtpe.now_ms if deadline # what the engine gave the peer for its turn
      return @sweeper.wait_readable(@waiter, deadline) if @sweeper

      raw.wait_readable(deadline && [(deadline - Smtpe.now_ms) / 1000.0, 0].max)
    end

    def write(out)
      return if out.nil? || out.empty?

      sleep(@reply_delay) if @reply_delay.positive?
      rest = out
      until rest.empty?
        n = @io.write_nonblock(rest, exception: false)
        case n
        when :wait_writable
          wait_io(:writable, write_wait) or raise IOError, "peer reads nothing: write timed out"
        when :wait_readable # TLS renegotiation wants to read
          wait_io(:readable, write_wait) or raise IOError, "TLS write timed out"
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

    # Waits up to +seconds+ for the socket to be :readable or :writable: truthy, or false at
    # the limit. Through the connection's waiter when it has one (see DeadlineSweeper).
    def wait_io(event, seconds)
      return @sweeper.wait_for(@waiter, event, seconds) if @waiter

      raw = @io.to_io
      event == :readable ? raw.wait_readable(seconds) : raw.wait_writable(seconds)
    end

    # STARTTLS accepted and its 220 written: the handshake, then the session starts afresh. The
    # whole handshake has HANDSHAKE_TIMEOUT, or less when the engine gave the peer less for
    # its last turn (its command timeout: the engine has no deadline while TLS starts),
    # however the client spreads its octets.
    def start_tls
      ssl = OpenSSL::SSL::SSLSocket.new(@io, @tls_context)
      ssl.sync_close = true
      limit = Smtpe.now_ms + [HANDSHAKE_TIMEOUT * 1000, @wait_ms || Float::INFINITY].min
      loop do
        r = ssl.accept_nonblock(exception: false)
        break unless r.is_a?(Symbol)

        left = [(limit - Smtpe.now_ms) / 1000.0, 0].max
        wait_io(r == :wait_readable ? :readable : :writable, left) or raise IOError, "TLS handshake timed out"
      end
      @io = ssl
      write(@driver.tls_started(Smtpe.now_ms))
    end

    def close
      @sweeper&.release(@waiter) if @waiter
      @io.close unless @io.closed?
    rescue IOError, SystemCallError
      nil
    end
  end

  # The reads of one async 1.x scheduler's connections, at less cost than IO#wait_readable
  # with a timeout, which starts and cancels a timer and registers and removes the descriptor
  # with the reactor at every wait (a wait per command of every session, though in a healthy
  # session no deadline ever passes):
  # - each connection gets a #waiter, registered with the reactor once for its life;
  # - each read waits without a timeout; once every +interval+ seconds the sweeper raises
  #   Expired into the Fibers whose engine deadline has passed, so a deadline ends a read up
  #   to +interval+ late (RFC 5321 §4.5.3.2's timeouts are minutes).
  # - the connections read into one #read_buffer: a read's octets go to the driver's #receive
  #   at once, which takes a copy before it can wait (a buffer each: 16 KiB a session).
  # Needs async 1.x, whose waits are Fiber.yield: Fiber#raise then resumes the waiting Fiber
  # from the sweeper's, as async's own timers resume it from the reactor's. One per scheduler,
  # #run in a Fiber of its own; every call from that scheduler's Fibers.
  class DeadlineSweeper
    # Raised into a waiting Fiber whose deadline has passed; rescued by #wait_readable.
    class Expired < StandardError; end

    # Seconds between sweeps.
    INTERVAL = 1.0

    # The String the connections read into; its octets are valid until the reading Fiber waits.
    attr_reader :read_buffer

    # interval:: seconds between sweeps (how late a deadline may end a read).
    def initialize(interval: INTERVAL)
      @interval = interval
      @read_buffer = String.new(capacity: Connection::READ_SIZE, encoding: Encoding::BINARY)
      @waiting = {} # Fiber => deadline (Smtpe.now_ms milliseconds)
    end

    # A waiter for +io+ kept for the connection's life, registered with the reactor once
    # (a plain IO#wait_readable registers and removes the descriptor at every wait).
    def waiter(io) = Async::Wrapper.new(io)

    # Removes +waiter+ from the reactor; before its IO is closed.
    def release(waiter) = waiter.reactor = nil

    # Waits up to +seconds+ (nil: no limit) for +waiter+'s IO to be :readable or :writable:
    # truthy, or false at the limit.
    def wait_for(waiter, event, seconds)
      event == :readable ? waiter.wait_readable(seconds) : waiter.wait_writable(seconds)
    rescue Async::TimeoutError
      false
    end

    # Waits until +io+ (a #waiter, or an IO) is readable (returns truthy) or +deadline+
    # (Smtpe.now_ms milliseconds; nil: none) has passed (returns false, up to the interval
    # late).
    def wait_readable(io, deadline)
      return io.wait_readable unless deadline

      fiber = Fiber.current
      @waiting[fiber] = deadline
      io.wait_readable
    rescue Expired
      false
    ensure
      @waiting.delete(fiber) if fiber
    end

    # Sweeps every interval until its Fiber is stopped. Returns never.
    def run
      loop do
        sleep(@interval)
        sweep(Smtpe.now_ms)
      end
    end

    # Wakes the Fibers waiting past their deadline at +now+ (milliseconds). Returns how many.
    def sweep(now)
      due = []
      @waiting.each { |fiber, deadline| due << fiber if deadline <= now }
      due.each { |fiber| fiber.raise(Expired) if @waiting.key?(fiber) }
      due.size
    end
  end
end
