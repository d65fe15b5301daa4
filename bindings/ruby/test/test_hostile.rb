# frozen_string_literal: true

# A hostile review of the gem, kept as regression cases: the C binding under misuse (random
# splits, random verdicts and arguments, odd Strings, GC.stress with compaction, objects never
# initialized, Ruby code run from inside a call), the server host under hostile clients
# (smuggling, STARTTLS injection, a reset in the middle of DATA, resets before accept, fd
# exhaustion, clients that never read), and Smtpe::SMTP against hostile servers.
#
# "Fixed" cases were defects of the code found this way and now guard their fixes.
require "minitest/autorun"
require "smtpe"
require "socket"
require "timeout"
require "tmpdir"
require "openssl"
require "rbconfig"

module HostileHelpers
  EXT_DIR = $LOAD_PATH.find { |d| File.exist?(File.join(d, "smtpe", "smtpe.so")) }
  LIB_DIR = $LOAD_PATH.find { |d| File.exist?(File.join(d, "smtpe", "server.rb")) } || File.expand_path("../lib", __dir__)

  # Runs a server script in a child process (its own rlimits, its own crashes); yields the
  # port once it prints "listening on ...", then kills it. Returns [alive_at_end, stderr].
  def with_child_server(script, nofile: nil)
    Dir.mktmpdir do |dir|
      path = File.join(dir, "server.rb")
      File.write(path, script)
      err = File.join(dir, "err")
      opts = { err: err, out: File::NULL, pgroup: true } # its own group: prefork's workers die with it
      opts[:rlimit_nofile] = nofile if nofile
      pid = spawn(RbConfig.ruby, "-I", EXT_DIR, "-I", LIB_DIR, path, **opts)
      port = nil
      Timeout.timeout(15) do
        sleep 0.05 until (port = File.read(err)[/listening on [^\s]*:(\d+)/, 1]) || Process.waitpid(pid, Process::WNOHANG)
      end
      raise "server did not start: #{File.read(err)}" unless port

      yield Integer(port), pid
      alive = Process.waitpid(pid, Process::WNOHANG).nil?
      [alive, File.read(err)]
    ensure
      if pid
        Process.kill(:KILL, -pid) rescue nil # rubocop:disable Style/RescueModifier
        Process.wait(pid) rescue nil # rubocop:disable Style/RescueModifier
      end
    end
  end

  SERVER_SCRIPT = <<~RUBY
    require "smtpe"
    Warning[:experimental] = false
    class H < Smtpe::Handler
      def on_rcpt(ev)
        raise NotImplementedError, "a handler bug that is no StandardError" if ev.forward_path.local_part == "notimpl"
        nil
      end
    end
    model = ARGV.fetch(0, "%<model>s").to_sym
    cfg = Smtpe::ServerConfig.new(command_timeout_ms: %<timeout>d, data_timeout_ms: %<timeout>d)
    server = Smtpe::Server.new(listen: "127.0.0.1:0", handler: H.new.freeze, config: cfg, model: model,
                               workers: 1, on_listening: ->(a) { warn "listening on \#{a}" })
    %%w[INT TERM].each { |s| trap(s) { exit!(0) } }
    server.run
  RUBY

  def server_script(model, timeout_ms: 300_000)
    format(SERVER_SCRIPT, model: model, timeout: timeout_ms)
  end

  def greeted?(port)
    s = Socket.tcp("127.0.0.1", port, connect_timeout: 3)
    Timeout.timeout(5) { s.gets.to_s.start_with?("220") }
  rescue StandardError
    false
  ensure
    s&.close
  end

  # A connection the peer resets before the server accepts it (getpeername then fails).
  def reset_connection(port)
    s = Socket.new(:INET, :STREAM)
    s.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii"))
    s.connect(Socket.sockaddr_in(port, "127.0.0.1"))
    s.close
  end

  # A tiny scripted SMTP server on a thread; yields its port.
  def scripted_server(script)
    srv = TCPServer.new("127.0.0.1", 0)
    th = Thread.new do
      c = srv.accept
      begin
        script.call(c)
      rescue StandardError
        nil
      ensure
        c.close rescue nil # rubocop:disable Style/RescueModifier
      end
    end
    yield srv.addr[1]
  ensure
    th&.kill
    srv&.close
  end

  def rl(c) = c.gets("\r\n") || raise(EOFError)

  def prelude(c, exts = [])
    c.write("220 mx ESMTP\r\n")
    rl(c)
    c.write((["mx"] + exts).each_with_index.map { |e, i| "250#{i == exts.size ? " " : "-"}#{e}\r\n" }.join)
  end

  SHORT = { greeting_timeout_ms: 1500, command_timeout_ms: 1500, data_timeout_ms: 1500,
            data_end_timeout_ms: 1500 }.freeze
end

class TestHostileBinding < Minitest::Test
  include HostileHelpers

  TOKENS = ["EHLO x\r\n", "HELO y\r\n", "MAIL FROM:<a@b>\r\n", "MAIL FROM:<> SIZE=100 BODY=8BITMIME\r\n",
            "RCPT TO:<c@d>\r\n", "RCPT TO:<x@[1.2.3.4]> NOTIFY=SUCCESS,DELAY ORCPT=rfc822;x+40y\r\n",
            "DATA\r\n", "hello\r\n", ".\r\n", "..dot\r\n", "\r\n.\r\n", "\n.\n", "\r\n.\n", "\n.\r\n",
            "BDAT 5\r\nabcde", "BDAT 0 LAST\r\n", "BDAT 3 LAST\r\nxyz", "RSET\r\n", "NOOP\r\n", "QUIT\r\n",
            "VRFY bob\r\n", "FOO bar\r\n", "STARTTLS\r\n", "AUTH PLAIN AGFsaWNlAHNlY3JldA==\r\n",
            "AUTH XOAUTH2\r\n", "*\r\n", "XCLIENT NAME=x ADDR=1.2.3.4\r\n", "PROXY TCP4 1.2.3.4 5.6.7.8 111 222\r\n",
            "x" * 600 + "\r\n", "\xff\xfe\r\n", "\r", "\n", "\x00"].map(&:b).freeze

  def configs
    @configs ||= [
      Smtpe::ServerConfig.new(extensions: %i[default starttls chunking binarymime dsn xclient xforward smtputf8],
                              auth_mechanisms: %w[PLAIN LOGIN XOAUTH2], auth_without_tls: true,
                              max_pending_verdicts: 8, max_errors: 0),
      Smtpe::ServerConfig.new(lmtp: true, line_ending: :normalise, max_message_size: 50, proxy_protocol: true,
                              max_recipients: 3, max_errors: 0),
      Smtpe::ServerConfig.new(line_ending: :keep, extensions: %i[default chunking], max_errors: 0),
    ]
  end

  # A well-behaved host over random token streams in random splits, verdicts in random order:
  # every octet fed is either consumed by the engine or still in inbuf, nothing spins.
  def test_random_splits_keep_the_octet_accounting
    rng = Random.new(20_261_202)
    300.times do
      s = Smtpe::ServerSession.new(configs.sample(random: rng), 0)
      s.trusted = true
      stream = Array.new(rng.rand(60)) { rng.rand(12).zero? ? rng.bytes(rng.rand(30)) : TOKENS.sample(random: rng) }.join.b
      fed = 0
      inbuf = String.new(encoding: Encoding::BINARY)
      sink = String.new
      out = +""
      pending = []
      10_000.times do |step|
        ev = s.feed(inbuf, step, sink)
        if ev
          pending << ev if s.want_verdict?
          sink = String.new if ev.is_a?(Smtpe::Event::DataEnd)
        else
          until pending.empty?
            e = pending.delete_at(rng.rand(pending.size))
            begin
              rng.rand(4).zero? ? s.reply_id(e.id, [550, 451, 250].sample(random: rng)) : s.accept_id(e.id)
            rescue Smtpe::InvalidArgument
              s.accept_id(e.id)
            rescue Smtpe::StateError
              nil
            end
          end
          out.clear
          s.take_output(out)
          break if s.want_close?
          next if s.want_read? && !inbuf.empty?
          break if stream.empty? && !s.want_verdict?

          k = [rng.rand(1..200), stream.bytesize].min
          inbuf << stream.byteslice(0, k)
          fed += k
          stream = stream.byteslice(k..)
        end
        assert_equal fed, s.stats.octets_in + inbuf.bytesize, "octets consumed + octets left == octets fed"
      end
    end
  end

  # Random calls with random (mostly wrong) arguments raise only the documented errors.
  def test_random_misuse_raises_only_documented_errors
    rng = Random.new(7)
    texts = [nil, "ok", "a\nb", "x" * 3000, "nul\0", "ctl\x01\r", Array.new(40, "l").join("\n"), 5, :sym]
    codes = [250, 354, 421, 221, 550, 220, 235, 334, 199, 600, -1, 2**70, "250", nil, 1.5]
    allowed = [Smtpe::Error, ArgumentError, TypeError, RangeError, FrozenError]
    200.times do
      s = Smtpe::ServerSession.new(configs.sample(random: rng), 0)
      inbuf = +"".b
      sink = [nil, +"", String.new(encoding: Encoding::UTF_16LE)].sample(random: rng)
      ids = []
      150.times do |now|
        case rng.rand(12)
        when 0..3
          inbuf << TOKENS.sample(random: rng)
          ev = s.feed(inbuf, now, sink)
          ids << ev.id if ev
        when 4, 5 then s.accept
        when 6 then s.reply(codes.sample(random: rng), ["5.1.1", nil, "x", 5].sample(random: rng), texts.sample(random: rng))
        when 7 then s.reply_id(ids.sample(random: rng) || 0, codes.sample(random: rng))
        when 8 then s.take_output(+"")
        when 9 then s.close(codes.sample(random: rng)) if rng.rand(5).zero?
        when 10 then s.auth_challenge([rng.bytes(9), "x" * 2000, 5].sample(random: rng))
        when 11 then s.handle_expiry(now + 500_000)
        end
      rescue *allowed
        nil
      end
    end
  end

  # String subclasses, a shared substring as inbuf, an UTF-16 sink, under GC.stress with
  # compaction at every major GC: the content is exact.
  def test_odd_strings_under_gc_stress_and_compaction
    sub = Class.new(String)
    cfg = Smtpe::ServerConfig.new(extensions: %i[default chunking binarymime])
    input = "EHLO x\r\nMAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nDATA\r\nline 1\r\n..dotted\r\n.\r\n" \
            "MAIL FROM:<> BODY=BINARYMIME\r\nRCPT TO:<x@y>\r\nBDAT 4\r\nab\r\nBDAT 3 LAST\r\nxyzQUIT\r\n"
    compact = GC.auto_compact
    contents = []
    [5, 61].each do |split|
      s = Smtpe::ServerSession.new(cfg, 0)
      big = sub.new(("#" * 64 + input).b)
      inbuf = big[64, input.bytesize] # a shared substring of a String subclass
      held = +""
      sink = String.new(encoding: Encoding::UTF_16LE)
      out = sub.new
      GC.auto_compact = true
      GC.stress = true
      inbuf.scan(/.{1,#{split}}/mo).each do |piece|
        held << piece
        while (ev = s.feed(held, 1, sink))
          s.accept if s.want_verdict?
          if ev.is_a?(Smtpe::Event::DataEnd)
            contents << sink.b
            sink = sub.new
          end
        end
        s.take_output(out)
      end
    ensure
      GC.stress = false
      GC.auto_compact = compact
    end
    assert_equal [["line 1\r\n.dotted\r\n", "ab\r\nxyz"]] * 2, contents.each_slice(2).to_a
  end

  def test_objects_never_initialized_and_copies_raise
    assert_raises(RuntimeError) { Smtpe::ServerSession.allocate.feed(+"EHLO x\r\n", 0) }
    assert_raises(RuntimeError) { Smtpe::ServerSession.allocate.take_output(+"") }
    assert_raises(RuntimeError) { Smtpe::ClientSession.allocate.feed(+"220 x\r\n", 0) }
    assert_raises(RuntimeError) { Smtpe::ServerConfig.allocate.memory_size }
    assert_raises(RuntimeError) { Smtpe::ServerSession.new(Smtpe::ServerConfig.allocate, 0) }
    assert_raises(TypeError) { Smtpe::ServerSession.new(Smtpe::ClientConfig.new, 0) }
    s = Smtpe::ServerSession.new(Smtpe::ServerConfig.new, 0)
    assert_raises(TypeError) { s.dup }
    assert_raises(TypeError) { Marshal.dump(s) }
    assert_raises(Ractor::Error) { Ractor.make_shareable(s) }
    assert_raises(TypeError) { Smtpe::ClientSession.new(Smtpe::ClientConfig.new, 0).dup }
    b = +"EHLO x\r\n"
    assert_raises(ArgumentError) { s.feed(b, 0, b) }
    assert_raises(FrozenError) { s.feed("EHLO x\r\n".freeze, 0) }
    assert_raises(FrozenError) { s.feed(+"EHLO x\r\n", 0, "".freeze) }
  end

  # Fixed (a regression case now): ServerConfig has no initialize_copy: clone gives a frozen, Ractor-shareable
  # config that is not initialized, and initialize then writes into that frozen object.
  def test_server_config_cannot_be_copied
    cfg = Smtpe::ServerConfig.new
    assert_raises(TypeError) { cfg.clone }
    assert_raises(TypeError) { cfg.dup }
  end

  # Fixed (a regression case now): session_reply takes enhanced's C pointer, then calls text's to_str, which may
  # free that pointer's buffer (heap-use-after-free under ASan, smtpe__enhanced_valid).
  def test_reply_text_to_str_cannot_free_enhanced
    s = Smtpe::ServerSession.new(Smtpe::ServerConfig.new, 0)
    s.take_output(+"")
    s.feed(+"EHLO x\r\n", 0)
    enhanced = "5.1.1" + ("x" * 100)
    text = Object.new
    text.define_singleton_method(:to_str) do
      enhanced.replace("2.0.0")
      GC.start
      "hello"
    end
    begin
      s.reply(250, enhanced, text)
    rescue Smtpe::InvalidArgument
      s.accept # a copy of enhanced taken before to_str ran ("5.1.1xxx...") is refused: fine too
    end
    out = +""
    s.take_output(out)
    assert_match(/\A250[ -]/, out)
  end

  # Fixed (a regression case now): ServerConfig.new reads ehlo_extra with the length it had before an element's
  # to_str ran: an element that empties the Array makes it read past its end (segfault).
  def test_ehlo_extra_shrunk_by_to_str
    list = nil
    evil = Object.new
    evil.define_singleton_method(:to_str) do
      list.clear
      GC.start
      "X-ONE"
    end
    list = [evil] + Array.new(200) { |i| "X-#{i}" }
    cfg = Smtpe::ServerConfig.new(ehlo_extra: list)
    assert_kind_of Smtpe::ServerConfig, cfg
  rescue ArgumentError, TypeError, Smtpe::Error
    pass
  end

  # Fixed (a regression case now): attr_pairs (rb_client.c) uses the result of Hash#to_a as an Array unchecked.
  def test_xclient_hash_whose_to_a_is_no_array
    h = { "NAME" => "x" }
    h.define_singleton_method(:to_a) { 12_345 }
    Smtpe::ClientConfig.new(xclient: h)
  rescue TypeError, ArgumentError, Smtpe::Error
    pass
  end

  # Fixed (a regression case now): #feed builds event Structs with rb_struct_new, which calls #initialize as a
  # Ruby method: Ruby code (and interrupts: Thread#raise, Timeout, signal traps, a Thread
  # switch) can run after the engine consumed octets and before they leave inbuf. An exception
  # there loses the event and leaves the consumed octets in inbuf (fed twice next time).
  def test_feed_runs_no_ruby_code_between_consuming_and_dropping
    boom = Class.new(StandardError)
    armed = [false]
    hook = Module.new do
      define_method(:initialize) do |*a|
        if armed[0]
          armed[0] = false
          raise boom
        end
        super(*a)
      end
    end
    Smtpe::Event::Rset.prepend(hook)
    s = Smtpe::ServerSession.new(Smtpe::ServerConfig.new, 0)
    s.take_output(+"")
    inbuf = "RSET\r\nNOOP\r\n".b
    armed[0] = true
    events = []
    begin
      events << s.feed(inbuf, 0)
    rescue boom
      nil
    ensure
      armed[0] = false
    end
    assert_equal 12, s.stats.octets_in + inbuf.bytesize, "no octet both consumed and left in inbuf"
    events << s.feed(inbuf, 0) while events.compact.empty? && !inbuf.empty?
    assert(events.compact.any? { |e| e.is_a?(Smtpe::Event::Rset) }, "the Rset event is not lost")
  end

  # Fixed (a regression case now): the same for the client: an Outcome taken from the engine is lost when its
  # Struct's #initialize raises (take_event, rb_client.c).
  def test_client_feed_loses_no_event
    boom = Class.new(StandardError)
    armed = [false]
    hook = Module.new do
      define_method(:initialize) do |*a|
        if armed[0]
          armed[0] = false
          raise boom
        end
        super(*a)
      end
    end
    Smtpe::ClientEvent::Outcome.prepend(hook)
    c = Smtpe::ClientSession.new(Smtpe::ClientConfig.new(pipelining: false, chunking: false), 0)
    out = +""
    feed = ->(s) { b = s.b; evs = []; while (e = c.feed(b, 1)); evs << e; end; out.clear; c.take_output(out); evs }
    feed.("220 mx\r\n")
    feed.("250 mx\r\n")
    c.submit(reverse_path: "a@b", recipients: ["r@x"])
    feed.("")
    feed.("250 ok\r\n")
    armed[0] = true
    evs = begin
      feed.("550 5.1.1 no\r\n")
    rescue boom
      []
    end
    armed[0] = false
    evs += feed.("")
    assert(evs.any? { |e| e.is_a?(Smtpe::ClientEvent::Outcome) }, "the Outcome is not lost")
  end

  # Fixed (a regression case now): #feed calls rb_str_modify(inbuf) before each recv, and rb_str_drop_bytes made
  # inbuf shared: every event copies what is left, so a big inbuf costs O(n^2).
  def test_feed_cost_per_event_does_not_grow_with_inbuf
    cfg = Smtpe::ServerConfig.new(max_errors: 0)
    per_event = [16_384, 524_288].map do |size|
      s = Smtpe::ServerSession.new(cfg, 0)
      out = +""
      s.take_output(out)
      inbuf = ("RSET\r\n" * (size / 6)).b
      n = 0
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      loop do
        if s.feed(inbuf, 0) then n += 1
        else
          out.clear
          break if s.take_output(out).zero? && inbuf.empty?
        end
      end
      (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0) / n
    end
    assert_operator per_event[1], :<, per_event[0] * 3, "per-event cost at 512 KiB held vs 16 KiB held"
  end

  # The client engine through the binding: a 250 that comes with the 354, before the content
  # was written, is unsolicited; nobody is reported delivered.
  def test_client_premature_reply_to_content_end
    c = Smtpe::ClientSession.new(Smtpe::ClientConfig.new(pipelining: false, chunking: false), 0)
    out = +""
    evs = []
    feed = ->(s) { b = s.b; while (e = c.feed(b, 1)); evs << e; end; out.clear; c.take_output(out) }
    feed.("220 mx\r\n")
    feed.("250 mx\r\n")
    c.submit(reverse_path: "a@b", recipients: ["r@x"])
    feed.("")
    feed.("250 ok\r\n")
    feed.("250 ok\r\n")
    feed.("354 go\r\n250 2.0.0 queued before the content\r\n")
    refute(evs.any? { |e| e.is_a?(Smtpe::ClientEvent::Outcome) && e.outcome == :delivered })
    assert(evs.any? { |e| e.is_a?(Smtpe::ClientEvent::Closed) && e.reason == :protocol_error })
  end

  # Fixed (a regression case now): the client engine judged a reply by its last octet: a 250
  # whose first octets came before the end of the content was written, and only its CRLF
  # after, was taken as the answer to the content's end (client.c now judges it by its first).
  def test_client_reply_begun_before_content_end_is_unsolicited
    c = Smtpe::ClientSession.new(Smtpe::ClientConfig.new(pipelining: false, chunking: false), 0)
    out = +""
    evs = []
    feed = ->(s) { b = s.b; while (e = c.feed(b, 1)); evs << e; end; out.clear; c.take_output(out) }
    feed.("220 mx\r\n")
    feed.("250 mx\r\n")
    c.submit(reverse_path: "a@b", recipients: ["r@x"])
    feed.("")
    feed.("250 ok\r\n")
    feed.("250 ok\r\n")
    feed.("354 go\r\n250 2.0.0 queued")
    c.content("hello\r\n", last: true)
    c.take_output(out)
    feed.("\r\n")
    refute(evs.any? { |e| e.is_a?(Smtpe::ClientEvent::Outcome) && e.outcome == :delivered })
  end
end

class TestHostileHost < Minitest::Test
  include HostileHelpers

  def drive(driver, input, split: 7)
    out = +"".b
    out << driver.start(0)
    input.b.scan(/.{1,#{split}}/mo).each { |piece| out << driver.receive(piece, 0) }
    out
  end

  # Bare LF and bare CR never end DATA: the content with them is refused (550 5.6.0) and
  # nothing after it runs as a command.
  def test_smuggling_attempts_are_content_and_refused
    Dir.mktmpdir do |dir|
      md = Smtpe::Maildir.new(dir)
      ["\n.\n", "\r\n.\n", "\n.\r\n", "\r.\r", "\r\n.\r"].each do |seq|
        d = Smtpe::ServerDriver.new(config: Smtpe::ServerConfig.new, handler: md)
        out = drive(d, "EHLO x\r\nMAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nDATA\r\nhi#{seq}MAIL FROM:<evil@x>\r\n" \
                       "RCPT TO:<victim@y>\r\nDATA\r\nsmuggled\r\n.\r\nNOOP\r\n")
        codes = out.lines.grep(/\A\d{3} /).map { _1[0, 3] }
        assert_equal %w[220 250 250 250 354 550 250], codes, seq.inspect
      end
      assert_empty Dir.children(File.join(dir, "new"))
      assert_empty Dir.children(File.join(dir, "tmp"))
    end
  end

  # Commands pipelined after STARTTLS arrived in clear: discarded, never run after TLS.
  def test_starttls_injection_is_discarded
    cfg = Smtpe::ServerConfig.new(extensions: %i[default starttls])
    d = Smtpe::ServerDriver.new(config: cfg, handler: Smtpe::Handler.new, tls: true)
    d.start(0)
    d.receive("EHLO x\r\n", 0)
    injected = "MAIL FROM:<injected@x>\r\nRCPT TO:<v@y>\r\n"
    out = d.receive("STARTTLS\r\n#{injected}".b, 0)
    assert_equal "220 2.0.0 Ready to start TLS\r\n", out
    assert d.tls?
    d.tls_started(0)
    out = d.receive("RCPT TO:<z@y>\r\n".b, 0)
    assert_match(/\A503 /, out)
    assert_equal injected.bytesize, d.session.stats.discarded_octets
  end

  # A connection lost in the middle of DATA leaves nothing in the Maildir (new/ or tmp/).
  def test_reset_mid_data_leaves_no_message
    Dir.mktmpdir do |dir|
      md = Smtpe::Maildir.new(dir)
      ["", "\r\n", "\r\n.", "x" * 70_000].each do |tail|
        d = Smtpe::ServerDriver.new(config: Smtpe::ServerConfig.new, handler: md)
        drive(d, "EHLO x\r\nMAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nDATA\r\nSubject: partial\r\n\r\nbody#{tail}", split: 1000)
        d.eof(0)
      end
      assert_empty Dir.children(File.join(dir, "new"))
      assert_empty Dir.children(File.join(dir, "tmp"))
    end
  end

  def test_threads_fibers_prefork_survive_resets_before_accept
    %w[threads fibers prefork].each do |model|
      alive, err = with_child_server(server_script(model)) do |port|
        20.times { reset_connection(port) }
        sleep 0.3
        assert greeted?(port), "#{model}: a fresh client is greeted after 20 resets before accept"
      end
      assert alive, "#{model} server still running: #{err[-300..]}"
    end
  end

  # Fixed (a regression case now): under :ractors a connection reset before accept makes remote_address raise
  # ENOTCONN in RactorLoop#accept_all (ractor_loop.rb:83); the Ractor dies and Ractor.select
  # in Server#run_ractors raises: the whole server exits.
  def test_ractors_survive_a_reset_before_accept
    alive, err = with_child_server(server_script("ractors")) do |port|
      5.times { reset_connection(port) }
      sleep 0.5
      assert greeted?(port), "a fresh client is greeted"
    end
    assert alive, err[-300..]
  end

  # Fixed (a regression case now): accept(2) failing with EMFILE (fds exhausted, e.g. by clients that never
  # read: see below) ends the :threads and :ractors servers and the accept loop of :fibers
  # and :prefork (the process stays, accepting nothing).
  def test_servers_survive_fd_exhaustion
    %w[threads fibers prefork ractors].each do |model|
      alive, err = with_child_server(server_script(model), nofile: 64) do |port|
        socks = Array.new(100) { Socket.tcp("127.0.0.1", port, connect_timeout: 3) }
        sleep 0.5
        socks.each(&:close)
        sleep 0.5
        assert greeted?(port), "#{model}: a fresh client is greeted once the fds are free again"
      end
      assert alive, "#{model}: #{err[-300..]}"
    end
  end

  # Fixed (a regression case now): a handler raising an Exception that is no StandardError (NotImplementedError,
  # LoadError from a lazy require, ...) ends the :fibers, :prefork (each worker) and :ractors
  # servers (call_handler and serve rescue StandardError only).
  def test_handler_non_standard_error_ends_only_its_session
    %w[threads fibers prefork ractors].each do |model|
      alive, err = with_child_server(server_script(model)) do |port|
        s = Socket.tcp("127.0.0.1", port)
        s.write("EHLO x\r\nMAIL FROM:<a@b>\r\nRCPT TO:<notimpl@x>\r\n")
        Timeout.timeout(5) { s.read } rescue nil # rubocop:disable Style/RescueModifier
        s.close
        sleep 0.3
        assert greeted?(port), "#{model}: a fresh client is greeted"
      end
      assert alive, "#{model}: #{err[-300..]}"
    end
  end

  # Fixed (a regression case now): under :prefork, a parent that ends without calling #stop
  # (SIGKILL here; SIGTERM untrapped was the same) left its workers serving, re-parented to
  # init. They watch a pipe only the parent holds now and end with it.
  def test_prefork_workers_end_with_their_parent
    script = <<~RUBY
      require "smtpe"
      server = Smtpe::Server.new(listen: "127.0.0.1:0", handler: Smtpe::Handler.new, model: :prefork,
                                 workers: 2, on_listening: ->(a) { warn "listening on \#{a}" })
      server.run
    RUBY
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "s.rb"), script)
      err = File.join(dir, "err")
      pid = spawn(RbConfig.ruby, "-I", EXT_DIR, "-I", LIB_DIR, File.join(dir, "s.rb"), err: err, out: File::NULL)
      port = nil
      Timeout.timeout(15) { sleep 0.05 until (port = File.read(err)[/listening on [^\s]*:(\d+)/, 1]) }
      kids = []
      Timeout.timeout(5) { sleep 0.05 while (kids = `ps -o pid= --ppid #{pid}`.split.map(&:to_i)).size < 2 }
      Process.kill(:KILL, pid)
      Process.wait(pid)
      alive = kids
      Timeout.timeout(5) do
        sleep 0.05 until (alive = kids.select { |k| Process.kill(0, k) rescue false }).empty? # rubocop:disable Style/RescueModifier
      end
      assert_empty alive
      assert_raises(Errno::ECONNREFUSED) { Socket.tcp("127.0.0.1", Integer(port)).close }
    ensure
      kids&.each { |k| Process.kill(:KILL, k) rescue nil } # rubocop:disable Style/RescueModifier
    end
  end

  # Fixed (a regression case now): a second :ractors server on a port another one listens on
  # joined it through SO_REUSEPORT and took half its mail; it fails with EADDRINUSE now.
  def test_ractors_server_refuses_a_port_in_use
    taken = Socket.new(:INET, :STREAM)
    taken.setsockopt(:SOCKET, :REUSEPORT, true)
    taken.bind(Addrinfo.tcp("127.0.0.1", 0))
    taken.listen(8)
    port = taken.local_address.ip_port
    server = Smtpe::Server.new(listen: "127.0.0.1:#{port}", handler: Smtpe::Handler.new.freeze,
                               model: :ractors, workers: 1)
    assert_raises(Errno::EADDRINUSE) { server.run }
  ensure
    taken&.close
  end

  # Ctrl-C (Interrupt) makes #run stop the server and return nil instead of a backtrace.
  def test_interrupt_ends_run_quietly
    %w[threads fibers prefork].each do |model|
      script = <<~RUBY
        require "smtpe"
        server = Smtpe::Server.new(listen: "127.0.0.1:0", handler: Smtpe::Handler.new, model: :#{model},
                                   workers: 1, on_listening: ->(a) { warn "listening on \#{a}" })
        p server.run
        warn "returned"
      RUBY
      Dir.mktmpdir do |dir|
        File.write(File.join(dir, "s.rb"), script)
        err = File.join(dir, "err")
        pid = spawn(RbConfig.ruby, "-I", EXT_DIR, "-I", LIB_DIR, File.join(dir, "s.rb"), err: err,
                    out: File.join(dir, "out"), pgroup: true)
        Timeout.timeout(15) { sleep 0.05 until File.read(err).include?("listening on") }
        Process.kill(:INT, pid)
        _, status = Timeout.timeout(10) { Process.wait2(pid) }
        assert status.success?, "#{model}: #{File.read(err)}"
        assert_includes File.read(err), "returned", model
        assert_equal "nil\n", File.read(File.join(dir, "out")), model
      ensure
        Process.kill(:KILL, -pid) rescue nil # rubocop:disable Style/RescueModifier
      end
    end
  end

  # Fixed (a regression case now): under the Fiber models the first write that met a full
  # socket buffer ended the session (its wait registered the socket with the reactor a second
  # time). A client that pipelines 100 000 NOOPs and reads only after a second gets them all.
  def test_pipelined_flood_read_late_gets_every_reply
    %w[fibers prefork threads].each do |model|
      with_child_server(server_script(model, timeout_ms: 20_000)) do |port|
        s = Socket.tcp("127.0.0.1", port)
        s.gets
        n = 100_000
        writer = Thread.new { s.write("NOOP\r\n" * n) }
        sleep 1
        got = 0
        buf = +""
        Timeout.timeout(60) do
          while got < n
            buf << s.readpartial(65_536)
            got += buf.count("\n")
            buf = buf[(buf.rindex("\n") + 1)..] || +"" if buf.include?("\n")
          end
        end
        writer.join
        assert_equal n, got, model
        s.close
      end
    end
  end

  # Fixed (a regression case now): Smtpe::SMTP took the whole output from the engine, then
  # waited to write it without reading, so a 250 the server sent before it had read the content
  # (8 MB: more than the socket buffers hold) was fed only after the end of the content counted
  # as handed out, and taken as its reply: "delivered". It reads while its writes wait now.
  def test_client_early_250_while_content_blocked_is_not_delivered
    srv = TCPServer.new("127.0.0.1", 0)
    t = Thread.new do
      c = srv.accept
      rl = -> { c.gets("\r\n") }
      c.write("220 mx\r\n")
      rl.()
      c.write("250 mx\r\n")
      2.times { rl.() && c.write("250 ok\r\n") }
      rl.()
      c.write("354 go\r\n")
      sleep 0.3
      c.write("250 2.0.0 queued before any content was read\r\n")
      nil until rl.().nil?
    rescue IOError, SystemCallError
      nil
    ensure
      c&.close
    end
    r = Smtpe::SMTP.start("127.0.0.1", srv.addr[1], helo: "c", command_timeout_ms: 3000,
                                                    data_timeout_ms: 3000) do |smtp|
      smtp.send_message("#{"y" * 78}\r\n" * 100_000, "a@b", "r1@x")
    end
    refute r.delivered?, r.outcomes.inspect
  ensure
    t&.join(10)
    srv&.close
  end

  # An idle client gets the engine's 421 4.4.2 at its command timeout under every model (the
  # Fiber models' reads have no timer of their own: the DeadlineSweeper ends them, up to its
  # 1 s interval late), and the connection is closed.
  def test_idle_client_gets_421_at_the_deadline
    %w[threads fibers prefork ractors].each do |model|
      with_child_server(server_script(model, timeout_ms: 1000)) do |port|
        s = Socket.tcp("127.0.0.1", port)
        assert_match(/\A220 /, s.gets)
        s.write("EHLO c\r\n")
        nil until s.gets.start_with?("250 ")
        t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        line = Timeout.timeout(10) { s.gets }
        waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
        assert_match(/\A421 4\.4\.2 /, line, model)
        assert_operator waited, :>=, 0.9, model
        assert_operator waited, :<, 4, "#{model}: the 1 s timeout ended the session after #{waited} s"
        assert_nil Timeout.timeout(5) { s.gets }, "#{model}: closed after the 421"
        s.close
      end
    end
  end

  # Fixed (a regression case now): a client that never reads blocks the server's write (Connection#write, or the
  # Ractor loop's pending output) with no deadline: the engine's timeouts never fire, and the
  # connection (an fd, a Thread) is held for as long as the client likes.
  def test_client_that_never_reads_is_dropped
    skip "needs ss(8)" unless system("ss -V > /dev/null 2>&1")
    %w[threads fibers ractors].each do |model|
      with_child_server(server_script(model, timeout_ms: 1000)) do |port|
        s = Socket.tcp("127.0.0.1", port)
        s.setsockopt(:SOCKET, :RCVBUF, 4096)
        chunk = "NOOP\r\n" * 10_000
        t0 = Time.now
        begin
          while Time.now - t0 < 10
            n = s.write_nonblock(chunk, exception: false)
            break if n == :wait_writable && !s.wait_writable(2)
          end
        rescue Errno::ECONNRESET, Errno::EPIPE
          nil # the server dropped it already: what the test wants
        end
        sleep 4
        held = `ss -tnH state established '( sport = :#{port} )'`.lines.size
        s.close
        assert_equal 0, held, "#{model}: server-side connections left 4 s after the 1 s timeout"
      end
    end
  end
end

class TestHostileSMTPClient < Minitest::Test
  include HostileHelpers

  def send_one(port, content: "Subject: x\r\n\r\nhello\r\n", watchdog: 10, **kw)
    Timeout.timeout(watchdog) do
      Smtpe::SMTP.start("127.0.0.1", port, helo: "c.example", **SHORT, **kw) do |smtp|
        smtp.send_message(content, "a@b", "r1@x", "r2@x")
      end
    end
  end

  def test_bare_lf_reply_is_an_smtp_error
    scripted_server(->(c) { c.write("220 mx\n"); sleep 1 }) do |port|
      assert_raises(Smtpe::SMTP::Error) { send_one(port) }
    end
  end

  def test_huge_multiline_reply_is_an_smtp_error
    script = lambda do |c|
      c.write("220 mx\r\n")
      rl(c)
      50.times { c.write("250-#{"X" * 60}\r\n" * 10_000) }
      c.write("250 end\r\n")
    end
    scripted_server(script) { |port| assert_raises(Smtpe::SMTP::Error) { send_one(port) } }
  end

  def test_premature_250_with_the_354_delivers_nothing
    script = lambda do |c|
      prelude(c)
      3.times { rl(c); c.write("250 ok\r\n") }
      rl(c)
      c.write("354 go\r\n250 2.0.0 queued before the content\r\n")
      sleep 2
    end
    scripted_server(script) do |port|
      r = send_one(port)
      assert_equal %i[temporary temporary], r.outcomes.map(&:outcome)
      assert_equal :protocol_error, r.closed.reason
    end
  end

  def test_disconnect_after_content_end_is_unknown
    script = lambda do |c|
      prelude(c)
      3.times { rl(c); c.write("250 ok\r\n") }
      rl(c)
      c.write("354 go\r\n")
      loop { break if rl(c) == ".\r\n" }
    end
    scripted_server(script) do |port|
      r = send_one(port)
      assert_equal %i[unknown unknown], r.outcomes.map(&:outcome)
    end
  end

  def test_no_reply_to_content_end_times_out
    script = lambda do |c|
      prelude(c)
      3.times { rl(c); c.write("250 ok\r\n") }
      rl(c)
      c.write("354 go\r\n")
      sleep 5
    end
    scripted_server(script) do |port|
      r = send_one(port)
      assert_equal %i[unknown unknown], r.outcomes.map(&:outcome)
      assert_equal :timeout, r.closed.reason
    end
  end

  # Fixed (a regression case now): SMTP#initialize raises without closing its socket.
  def test_failed_start_closes_its_socket
    srv = TCPServer.new("127.0.0.1", 0)
    th = Thread.new { loop { c = srv.accept; c.write("554 go away\r\n"); c.close } }
    GC.disable
    before = Dir.children("/proc/self/fd").size
    5.times { assert_raises(Smtpe::SMTP::Error) { Smtpe::SMTP.start("127.0.0.1", srv.addr[1]) } }
    # not more than before (a descriptor of an earlier test may close meanwhile)
    assert_operator Dir.children("/proc/self/fd").size, :<=, before
  ensure
    GC.enable
    th&.kill
    srv&.close
  end

  # Fixed (a regression case now): SMTP#flush is a blocking IO#write with no deadline: a server that stops
  # reading hangs send_message forever (and data_block_timeout_ms is no accepted keyword).
  def test_server_that_stops_reading_does_not_hang_the_client
    script = lambda do |c|
      prelude(c)
      3.times { rl(c); c.write("250 ok\r\n") }
      rl(c)
      c.write("354 go\r\n")
      sleep 15
    end
    scripted_server(script) do |port|
      r = send_one(port, content: "#{"y" * 78}\r\n" * 250_000, watchdog: 12, data_block_timeout_ms: 1500)
      assert_equal %i[temporary temporary], r.outcomes.map(&:outcome)
    end
  end

  # Fixed (a regression case now): the STARTTLS handshake (SMTP#handshake, ssl.connect) has no deadline.
  def test_starttls_stall_is_an_smtp_error
    script = lambda do |c|
      prelude(c, ["STARTTLS"])
      rl(c)
      c.write("220 go ahead\r\n")
      sleep 15
    end
    scripted_server(script) do |port|
      assert_raises(Smtpe::SMTP::Error) { send_one(port, watchdog: 12, tls: :required) }
    end
  end

  # Fixed (a regression case now): a failed handshake raises OpenSSL::SSL::SSLError out of SMTP.start instead of
  # Smtpe::SMTP::Error (the engine is never told: ClientSession#lost).
  def test_failed_tls_handshake_is_an_smtp_error
    script = lambda do |c|
      prelude(c, ["STARTTLS"])
      rl(c)
      c.write("220 go ahead\r\n")
      sleep 0.2
      c.write("this is no ServerHello\r\n" * 20)
      sleep 2
    end
    scripted_server(script) do |port|
      assert_raises(Smtpe::SMTP::Error) { send_one(port, tls: :required) }
    end
  end
end
