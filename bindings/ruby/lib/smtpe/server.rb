# frozen_string_literal: true

require "socket"
require_relative "connection"
require_relative "server_driver"

module Smtpe
  # A complete SMTP/LMTP server on the engine, under one of the Ruby study's concurrency models:
  #
  # :threads:: a Thread per connection
  # :fibers:: one process, a Fiber per connection on the async gem's Fiber scheduler
  # :prefork:: +workers+ forked processes sharing the listener, each with its own scheduler
  # :ractors:: +workers+ Ractors in one process, each with its own SO_REUSEPORT listener and its
  #            own event loop (IO.select over sans-I/O sessions; no Fibers: Ruby 3.1 cannot run
  #            Fibers in several Ractors, and the engine keeps each session's state anyway)
  #
  #   server = Smtpe::Server.new(listen: "127.0.0.1:2525", handler: MyHandler.new,
  #                              config: Smtpe::ServerConfig.new(hostname: "mx.example"))
  #   server.run   # blocks; Server#stop (or a signal) ends it
  #
  # The driver factory (a Proc taking the peer address and returning a driver: see
  # ServerDriver for the methods) defaults to the engine; the benchmark passes the pure-Ruby
  # baseline's instead. Under :ractors the handler and the factory must be shareable
  # (Ractor.make_shareable: a handler whose state is frozen), since every Ractor uses them.
  class Server
    # The concurrency models #new takes.
    MODELS = %i[threads fibers prefork ractors].freeze

    # "host:port" the server listens on, once #run has its listeners up (port 0 resolved).
    attr_reader :address

    # listen:: "host:port" ("[::1]:25"; port 0 picks one: see #address)
    # handler:: a Smtpe::Handler; config:: a Smtpe::ServerConfig
    # model:: one of MODELS; workers:: processes (prefork) or Ractors (ractors)
    # reply_delay_ms:: wait before each write (the study's simulated work)
    # tls_context:: an OpenSSL::SSL::SSLContext for STARTTLS (config needs :starttls)
    # driver:: a Proc(peer) -> driver, instead of a ServerDriver on handler and config
    # on_listening:: called with the address once every listener is up
    def initialize(listen:, handler: Handler.new, config: ServerConfig.new, model: :threads,
                   workers: 2, reply_delay_ms: 0, tls_context: nil, driver: nil,
                   on_listening: nil)
      raise ArgumentError, "model: one of #{MODELS.join(", ")}" unless MODELS.include?(model)
      raise ArgumentError, "tls_context: no STARTTLS under :ractors" if tls_context && model == :ractors

      @host, @port = Server.parse_address(listen)
      @model = model
      @workers = workers
      @delay = reply_delay_ms / 1000.0
      @tls_context = tls_context
      @on_listening = on_listening
      Ractor.make_shareable(handler) if model == :ractors
      @factory = driver || Server.driver_factory(ServerDriver, config: config, handler: handler,
                                                                tls: !tls_context.nil? && model != :ractors)
      @stopping = false
      @children = []
    end

    # A driver factory for #new's driver: a Proc(peer) -> klass.new(peer: peer, **kwargs). Made
    # here, where self is a class, so that under :ractors it can be shared (kwargs must be
    # shareable then: frozen config, frozen handler).
    def self.driver_factory(klass, **kwargs)
      kwargs.freeze
      ->(peer) { klass.new(peer: peer, **kwargs) }
    end

    # A TCP socket bound to host:port (SO_REUSEADDR; SO_REUSEPORT when reuseport), listening
    # when listen. A class method, so that every Ractor's loop makes its listener with it.
    def self.bind_tcp(host, port, reuseport: false, listen: true)
      addr = Addrinfo.tcp(host, port)
      sock = Socket.new(addr.afamily, :STREAM, 0)
      sock.setsockopt(:SOCKET, :REUSEADDR, true)
      sock.setsockopt(:SOCKET, :REUSEPORT, true) if reuseport
      sock.bind(addr)
      sock.listen(4096) if listen
      sock
    end

    # "host:port" -> [host, port]; raises ArgumentError.
    def self.parse_address(text)
      m = /\A(?:\[([^\]]+)\]|([^:\[\]]+)):(\d+)\z/.match(text) or
        raise ArgumentError, "listen: HOST:PORT expected, got #{text.inspect}"
      [m[1] || m[2], Integer(m[3], 10)]
    end

    # Runs until #stop, or until SIGINT (Ctrl-C: #run stops the server and returns nil). A
    # caller that wants SIGTERM to end it cleanly traps it to call #stop; under :prefork the
    # workers end with this process however it ends (they watch a pipe it holds).
    def run
      send(:"run_#{@model}")
    rescue Interrupt
      stop
      @children.each { |pid| Process.wait(pid) rescue nil } # rubocop:disable Style/RescueModifier
      nil
    end

    # Ends #run: the listeners close; sessions under way are cut.
    def stop
      @stopping = true
      @children.each { |pid| Process.kill(:TERM, pid) rescue nil } # rubocop:disable Style/RescueModifier
      @stop_w&.close rescue nil # rubocop:disable Style/RescueModifier
      # from another Thread: called in a trap, which runs on the Thread blocked in accept, close
      # raises "stream closed in another thread" into the trap and the accept never returns
      Thread.new(@listener) { |l| l&.close rescue nil } # rubocop:disable Style/RescueModifier
    end

    private

    def listen_tcp
      Server.bind_tcp(@host, @port, listen: true)
    end

    def listening(sock)
      listening_port(sock.local_address.ip_port)
    end

    def listening_port(port)
      @address = "#{@host.include?(":") ? "[#{@host}]" : @host}:#{port}"
      @on_listening&.call(@address)
    end

    # accept(2) errors that are the moment's, not the listener's: out of descriptors or memory
    # (clients holding connections), or a connection reset before it was accepted.
    # (Frozen Classes: shareable, so the Ractor loops use it too.)
    TRANSIENT_ACCEPT = [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM,
                        Errno::ECONNABORTED, Errno::EPROTO, Errno::EPERM, Errno::EINTR].freeze

    def accept(listener)
      loop do
        sock, = listener.accept_nonblock(exception: false)
        return sock unless sock == :wait_readable

        listener.wait_readable
      rescue *TRANSIENT_ACCEPT => e
        warn "smtpe: accept: #{e.message}; retrying in 100 ms"
        sleep(0.1)
      end
    end

    def serve(sock)
      peer = sock.remote_address.inspect_sockaddr
      sock.setsockopt(:TCP, :NODELAY, true)
      Connection.new(sock, @factory.call(peer), tls_context: @tls_context, reply_delay: @delay,
                                                 sweeper: @sweeper).run
    rescue SystemCallError, IOError
      sock.close rescue nil # rubocop:disable Style/RescueModifier: reset before it started
    rescue StandardError, ScriptError => e
      warn "smtpe: session #{peer}: #{e.class}: #{e.message}"
      sock.close rescue nil # rubocop:disable Style/RescueModifier
    end

    def run_threads
      @listener = listen_tcp
      listening(@listener)
      until @stopping
        sock = accept(@listener)
        Thread.new(sock) { |s| serve(s) }
      end
    rescue IOError, Errno::EBADF
      raise unless @stopping
    end

    # The Fiber models need the async gem (Debian: ruby-async); said before anything listens.
    def require_async
      require "async"
    rescue LoadError => e
      raise LoadError, "smtpe: model :#{@model} needs the async gem (~> 1.30; Debian: apt-get install " \
                       "ruby-async; else gem install async -v '~> 1.30'): #{e.message}"
    end

    # parent:: under :prefork, the read end of a pipe whose write end only the parent holds:
    # its EOF (the parent gone, whatever killed it) stops the worker.
    def fiber_loop(listener, parent: nil)
      Async do |task|
        # #stop from another Thread or a trap cannot wake the reactor: look every 100 ms
        task.async do
          sleep(0.1) until @stopping
          task.stop
        end
        task.async { parent.wait_readable && (@stopping = true) } if parent
        if Async::VERSION.start_with?("1.") # its waits are Fiber.yield: see DeadlineSweeper
          @sweeper = DeadlineSweeper.new
          task.async { @sweeper.run }
        end
        until @stopping
          sock = accept(listener)
          task.async { serve(sock) }
        end
      rescue IOError, Errno::EBADF
        raise unless @stopping
      end
    end

    def run_fibers
      require_async
      @listener = listen_tcp
      listening(@listener)
      fiber_loop(@listener)
    end

    def run_prefork
      require_async
      @listener = listen_tcp
      parent_r, @parent_w = IO.pipe
      @children = Array.new(@workers) do
        fork do
          %i[INT TERM].each { |sig| trap(sig) { exit!(0) } }
          @parent_w.close
          fiber_loop(@listener, parent: parent_r)
          exit!(0)
        end
      end
      parent_r.close
      listening(@listener)
      @children.each { |pid| Process.wait(pid) rescue nil } # rubocop:disable Style/RescueModifier
    end

    def run_ractors
      String.new(capacity: 1) # Ruby 3.1 sets String.new's keyword IDs at first use: racy in Ractors
      factory = Ractor.make_shareable(@factory)
      # the port first (a bound socket that never listens takes no connections), then one
      # listener per Ractor on it; a port given must be free first (without SO_REUSEPORT, the
      # bind fails if anything listens there): else a second server would share it
      Server.bind_tcp(@host, @port, listen: false).close unless @port.zero?
      probe = Server.bind_tcp(@host, @port, reuseport: true, listen: false)
      port = probe.local_address.ip_port
      host = @host
      delay = @delay
      stop_r, @stop_w = IO.pipe # #stop closes @stop_w: every loop sees stop_r readable and ends
      stop_fd = stop_r.fileno
      Warning[:experimental] = false # the model was asked for: no "Ractor is experimental" line
      ractors = Array.new(@workers) { start_ractor(host, port, factory, delay, stop_fd) }
      ractors.each(&:take) # each says :ready once it listens
      probe.close
      listening_port(port)
      supervise(ractors, host, port, factory, delay, stop_fd)
      stop_r.close
    end

    def start_ractor(host, port, factory, delay, stop_fd)
      Ractor.new(host, port, factory, delay, stop_fd) do |h, p, f, d, s|
        Smtpe::Server::RactorLoop.new(h, p, f, d, s).run
      end
    end

    # A Ractor whose loop died (a bug: each connection's errors are caught inside) is replaced,
    # so the server keeps its workers.
    def supervise(ractors, host, port, factory, delay, stop_fd)
      until ractors.empty?
        begin
          r, = Ractor.select(*ractors)
        rescue Ractor::RemoteError => e
          r = e.ractor
          warn "smtpe: worker Ractor died: #{e.cause&.class}: #{e.cause&.message}" unless @stopping
        end
        ractors.delete(r)
        next if @stopping

        fresh = start_ractor(host, port, factory, delay, stop_fd)
        fresh.take
        ractors << fresh
      end
    end

  end
end

require_relative "ractor_loop"
