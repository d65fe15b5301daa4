# frozen_string_literal: true

module Smtpe
  class Server
    # The event loop of one Ractor under the :ractors model: its own SO_REUSEPORT listener and
    # IO.select over its connections, each a sans-I/O driver. No Fiber keeps a session's state
    # (the engine does), so nothing here needs Fibers, which Ruby 3.1 cannot run in several
    # Ractors. Replies wait reply_delay before they go (a timer, not a sleep); a connection
    # whose replies wait is not read meanwhile, as a client waits for its replies. A turn costs
    # what it handles, not what is open: the IO.select Arrays are kept, not rebuilt, and the
    # sessions' deadlines are looked at once every SWEEP_MS.
    class RactorLoop # :nodoc:
      # idx: the connection's place in @readers (nil while it is not read)
      Conn = Struct.new(:io, :driver, :out, :write_at, :stuck_since, :idx)
      READ_SIZE = 16_384
      # ms a connection's output may wait for the peer to read, and for a closing session's
      # last reply: Connection's bounds
      WRITE_TIMEOUT_MS = Connection::WRITE_TIMEOUT * 1000
      LAST_REPLY_TIMEOUT_MS = Connection::LAST_REPLY_TIMEOUT * 1000
      # ms between looks at every session's deadline (as DeadlineSweeper::INTERVAL): a
      # deadline ends a session up to this late
      SWEEP_MS = (DeadlineSweeper::INTERVAL * 1000).to_i

      def initialize(host, port, factory, delay, stop_fd = nil)
        @stop = stop_fd && IO.for_fd(stop_fd, autoclose: false)
        @host = host
        @port = port
        @factory = factory
        @delay_ms = (delay * 1000).round
        @conns = {}
        @accept_after = 0
        @rbuf = String.new(capacity: READ_SIZE, encoding: Encoding::BINARY)
        @readers = [] # the IOs to read: the listener (while it accepts), the stop pipe, and
        @reader_conns = [] # the connections with no output waiting (their Conns, same order)
        @delayed = [] # [write_at, Conn], write_at nondecreasing (one delay for all)
        @stuck = {}.compare_by_identity # Conn => true: output the peer has not taken yet
        @sweep_at = 0
      end

      # Listens, says :ready (Ractor.yield), then serves until the process ends.
      def run
        @listener = Server.bind_tcp(@host, @port, reuseport: true)
        add_reader(@stop, nil) if @stop
        accepting(0)
        Ractor.yield(:ready)
        turn until @stopped
        @conns.each_value { |c| c.io.close rescue nil } # rubocop:disable Style/RescueModifier
        @listener.close
        nil
      end

      private

      def turn
        now = Smtpe.now_ms
        accepting(now)
        next_at = @sweep_at
        d = @delayed.first
        next_at = d[0] if d && d[0] < next_at
        next_at = @accept_after if @accept_after > now && @accept_after < next_at
        writers = @stuck.empty? ? nil : @stuck.keys.map!(&:io)
        r, w = IO.select(@readers, writers, nil, [(next_at - now) / 1000.0, 0].max)
        now = Smtpe.now_ms
        return @stopped = true if r&.include?(@stop)

        r&.each { |io| io.equal?(@listener) ? accept_all(now) : (c = @conns[io]) && read(c, now) }
        w&.each { |io| (c = @conns[io]) && flush(c) }
        timers(now)
      end

      # @readers: an Array for IO.select, kept up to date as connections come, go, and start
      # or stop waiting for their replies to go (swap-remove: O(1) each).
      def add_reader(io, c)
        return if c&.idx

        c.idx = @readers.size if c
        @readers << io
        @reader_conns << c
      end

      def remove_reader(c)
        i = c.idx or return

        remove_at(i)
        c.idx = nil
      end

      def remove_at(i)
        last_io = @readers.pop
        last_c = @reader_conns.pop
        return if i == @readers.size

        @readers[i] = last_io
        @reader_conns[i] = last_c
        last_c.idx = i if last_c
      end

      # The listener is read again once a pause of accept (out of descriptors) is over.
      def accepting(now)
        return if @listening || now < @accept_after

        add_reader(@listener, nil)
        @listening = true
      end

      # Replies whose delay is over go; once every SWEEP_MS, every session's deadline (and
      # output stuck too long) is looked at.
      def timers(now)
        while (d = @delayed.first) && d[0] <= now
          @delayed.shift
          c = d[1]
          flush(c) if c.write_at == d[0] && @conns.key?(c.io) && !c.out.empty?
        end
        return if now < @sweep_at

        @sweep_at = now + SWEEP_MS
        @conns.values.each do |c|
          next drop(c) if c.stuck_since && stuck_too_long?(c, now)

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
        remove_at(@readers.index(@listener))
        @listening = false
      end

      def open_conn(sock, now)
        peer = sock.remote_address.inspect_sockaddr
        sock.setsockopt(:TCP, :NODELAY, true)
        c = Conn.new(sock, @factory.call(peer), String.new(encoding: Encoding::BINARY), nil, nil, nil)
        @conns[sock] = c
        add_reader(sock, c)
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

      # out is the driver's reused String: copied behind what waits. A connection whose
      # replies wait is not read meanwhile, as a client waits for its replies.
      def queue(c, out, now)
        unless out.empty?
          if c.out.empty?
            remove_reader(c)
            if @delay_ms.positive?
              c.write_at = now + @delay_ms
              @delayed << [c.write_at, c]
            end
          end
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
        return stuck(c) if n == :wait_writable

        c.out.slice!(0, n)
        return stuck(c) unless c.out.empty?

        c.write_at = nil
        c.stuck_since = nil
        @stuck.delete(c)
        return drop(c) if c.driver.closed?

        add_reader(c.io, c)
      rescue IOError, SystemCallError
        c.driver.eof(Smtpe.now_ms)
        drop(c)
      end

      def stuck(c)
        @stuck[c] = true
        c.stuck_since ||= Smtpe.now_ms
      end

      def drop(c)
        return unless @conns.delete(c.io)

        remove_reader(c)
        @stuck.delete(c)
        c.io.close
      rescue IOError, SystemCallError
        nil
      end
    end
  end
end
