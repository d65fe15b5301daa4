# frozen_string_literal: true

module Smtpe
  class Server
    # The event loop of one Ractor under the :ractors model: its own SO_REUSEPORT listener and
    # IO.select over its connections, each a sans-I/O driver. No Fiber keeps a session's state
    # (the engine does), so nothing here needs Fibers, which Ruby 3.1 cannot run in several
    # Ractors. Replies wait reply_delay before they go (a timer, not a sleep); a connection
    # whose replies wait is not read meanwhile, as a client waits for its replies.
    class RactorLoop # :nodoc:
      Conn = Struct.new(:io, :driver, :out, :write_at, :stuck_since)
      READ_SIZE = 16_384
      # ms a connection's output may wait for the peer to read, and for a closing session's
      # last reply: Connection's bounds
      WRITE_TIMEOUT_MS = Connection::WRITE_TIMEOUT * 1000
      LAST_REPLY_TIMEOUT_MS = Connection::LAST_REPLY_TIMEOUT * 1000

      def initialize(host, port, factory, delay, stop_fd = nil)
        @stop = stop_fd && IO.for_fd(stop_fd, autoclose: false)
        @host = host
        @port = port
        @factory = factory
        @delay_ms = (delay * 1000).round
        @conns = {}
        @accept_after = 0
        @rbuf = String.new(capacity: READ_SIZE, encoding: Encoding::BINARY)
      end

      # Listens, says :ready (Ractor.yield), then serves until the process ends.
      def run
        @listener = Server.bind_tcp(@host, @port, reuseport: true)
        Ractor.yield(:ready)
        turn until @stopped
        @conns.each_value { |c| c.io.close rescue nil } # rubocop:disable Style/RescueModifier
        @listener.close
        nil
      end

      private

      def turn
        readers, writers, next_at = interest(Smtpe.now_ms)
        timeout = next_at && [(next_at - Smtpe.now_ms) / 1000.0, 0].max
        r, w = IO.select(readers, writers, nil, timeout)
        now = Smtpe.now_ms
        return @stopped = true if r&.include?(@stop)

        r&.each { |io| io.equal?(@listener) ? accept_all(now) : (c = @conns[io]) && read(c, now) }
        w&.each { |io| (c = @conns[io]) && flush(c) }
        timers(now)
      end

      # What to wait for: readable connections with no reply waiting, writable ones with
      # replies due, and the earliest timer (a reply's delay, a session's deadline).
      def interest(now)
        readers = now >= @accept_after ? [@listener] : []
        readers << @stop if @stop
        writers = []
        next_at = now >= @accept_after ? nil : @accept_after
        @conns.each_value do |c|
          if c.out.empty?
            readers << c.io
          elsif c.write_at && c.write_at > now
            next_at = c.write_at if next_at.nil? || c.write_at < next_at
          else
            writers << c.io
          end
          dl = c.driver.deadline
          if c.stuck_since && dl.nil?
            dl = c.stuck_since + stuck_limit(c) # as stuck_too_long?
          end
          next_at = dl if dl && (next_at.nil? || dl < next_at)
        end
        [readers, writers, next_at]
      end

      def timers(now)
        @conns.values.each do |c|
          next drop(c) if c.stuck_since && stuck_too_long?(c, now)

          flush(c) if c.write_at && c.write_at <= now && !c.out.empty?
          next unless @conns.key?(c.io)

          dl = c.driver.deadline
          guarded(c) { queue(c, c.driver.expire(now), now) } if dl && dl <= now
        end
      end

      # Output waiting for a peer that reads nothing: dropped at the engine's deadline (or after
      # WRITE_TIMEOUT_MS, LAST_REPLY_TIMEOUT_MS for a closing session), as Connection#write_wait.
      def stuck_too_long?(c, now)
        dl = c.driver.deadline
        return dl <= now if dl

        now - c.stuck_since > stuck_limit(c)
      end

      def stuck_limit(c)
        c.driver.closed? ? LAST_REPLY_TIMEOUT_MS : WRITE_TIMEOUT_MS
      end

      # Runs one connection's step; whatever it raises ends that connection only.
      def guarded(c)
        yield
      rescue IOError, SystemCallError
        c.driver.eof(Smtpe.now_ms) rescue nil # rubocop:disable Style/RescueModifier
        drop(c)
      rescue StandardError, ScriptError => e
        warn "smtpe: session ended by #{e.class}: #{e.message}"
        drop(c)
      end

      def accept_all(now)
        loop do
          sock, = @listener.accept_nonblock(exception: false)
          return if sock == :wait_readable

          open_conn(sock, now)
        end
      rescue *Server::TRANSIENT_ACCEPT => e
        warn "smtpe: accept: #{e.message}; pausing 100 ms"
        @accept_after = now + 100
      end

      def open_conn(sock, now)
        peer = sock.remote_address.inspect_sockaddr
        sock.setsockopt(:TCP, :NODELAY, true)
        c = Conn.new(sock, @factory.call(peer), String.new(encoding: Encoding::BINARY), nil, nil)
        @conns[sock] = c
        guarded(c) { queue(c, c.driver.start(now), now) }
      rescue SystemCallError, IOError
        sock.close rescue nil # rubocop:disable Style/RescueModifier: reset before it started
      end

      def read(c, now)
        data = c.io.read_nonblock(READ_SIZE, @rbuf, exception: false)
        return if data == :wait_readable

        if data.nil?
          c.driver.eof(now)
          return drop(c)
        end
        guarded(c) { queue(c, c.driver.receive(data, now), now) }
      rescue IOError, SystemCallError
        c.driver.eof(now)
        drop(c)
      end

      # out is the driver's reused String: copied behind what waits.
      def queue(c, out, now)
        unless out.empty?
          c.write_at = now + @delay_ms if c.out.empty? && @delay_ms.positive?
          c.out << out
        end
        if c.out.empty?
          drop(c) if c.driver.closed?
        elsif c.write_at.nil?
          flush(c)
        end
      end

      def flush(c)
        n = c.io.write_nonblock(c.out, exception: false)
        return c.stuck_since ||= Smtpe.now_ms if n == :wait_writable

        c.out.slice!(0, n)
        return c.stuck_since ||= Smtpe.now_ms unless c.out.empty?

        c.write_at = nil
        c.stuck_since = nil
        drop(c) if c.driver.closed?
      rescue IOError, SystemCallError
        c.driver.eof(Smtpe.now_ms)
        drop(c)
      end

      def drop(c)
        @conns.delete(c.io)
        c.io.close
      rescue IOError, SystemCallError
        nil
      end
    end
  end
end
