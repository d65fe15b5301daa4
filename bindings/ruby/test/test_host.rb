# frozen_string_literal: true

# The Ruby host layer: ServerDriver's verdict forms and handler errors, Smtpe::Server with
# STARTTLS (Ruby's openssl, Net::SMTP on the other end), Maildir delivery, the async model.
require "minitest/autorun"
require "net/smtp"
require "openssl"
require "timeout"
require "tmpdir"
require "smtpe"

class TestHost < Minitest::Test
  # Records what it sees; answers with the verdicts given by method name.
  class Recorder < Smtpe::Handler
    attr_reader :seen

    def initialize(verdicts = {})
      super()
      @verdicts = verdicts
      @seen = []
    end

    %i[on_connect on_helo on_mail on_rcpt on_data on_vrfy on_unknown on_close on_auth].each do |m|
      define_method(m) do |arg|
        @seen << [m, arg]
        v = @verdicts[m]
        v.respond_to?(:call) ? v.call(arg) : v
      end
    end
  end

  def run_driver(handler, input, config: Smtpe::ServerConfig.new(hostname: "host.test"))
    d = Smtpe::ServerDriver.new(config: config, handler: handler, peer: "192.0.2.7:4000", now: 0)
    out = d.start(0).dup
    out << d.receive(input.b, 0) unless d.closed?
    [out, d]
  end

  SESSION = "EHLO c\r\nMAIL FROM:<a@b>\r\nRCPT TO:<x@d>\r\nRCPT TO:<y@d>\r\nDATA\r\nSubject: t\r\n\r\n..hi\r\n.\r\nQUIT\r\n"

  def test_message_reaches_on_data
    h = Recorder.new(on_rcpt: ->(ev) { ev.forward_path.local_part == "y" ? [550, "5.1.1", "No such user"] : nil })
    out, d = run_driver(h, SESSION)
    assert d.closed?
    assert_includes out, "550 5.1.1 No such user\r\n"
    msg = h.seen.assoc(:on_data)[1]
    assert_equal "a@b", msg.reverse_path.mailbox
    assert_equal ["x@d"], msg.recipients.map(&:mailbox)
    assert_equal "Subject: t\r\n\r\n.hi\r\n", msg.content
    assert_equal ["192.0.2.7:4000", "c", nil, false], [msg.peer, msg.helo, msg.auth, msg.tls]
    assert_equal [:on_close, :quit], h.seen.last
  end

  def test_verdict_forms
    [[451, "451 4.0.0"], [[452, "4.3.1", "Full"], "452 4.3.1 Full"], [Smtpe::Reply[554, "5.7.1", "No"], "554 5.7.1 No"],
     [:accept, "250 2.1.0"], [true, "250 2.1.0"], [Object.new, "451 4.3.0 Local error in processing"]].each do |v, want|
      out = nil
      capture_io { out, = run_driver(Recorder.new(on_mail: v), "HELO c\r\nMAIL FROM:<a@b>\r\n") }
      assert_includes out, "#{want}", "verdict #{v.inspect}"
    end
  end

  def test_handler_exception_is_a_local_error
    h = Recorder.new(on_data: ->(_) { raise IOError, "disk on fire" })
    out = nil
    _, err = capture_io { out, = run_driver(h, SESSION) }
    assert_includes out, "451 4.3.0 Local error in processing\r\n221"
    assert_match(/on_data raised IOError: disk on fire/, err)
  end

  def test_bad_reply_text_is_a_local_error
    out = nil
    capture_io { out, = run_driver(Recorder.new(on_mail: [550, nil, "bell\a"]), "HELO c\r\nMAIL FROM:<a@b>\r\n") }
    assert_includes out, "451 4.3.0"
  end

  def test_on_connect_refusal
    h = Recorder.new(on_connect: [554, "5.7.1", "Go away"])
    out, d = run_driver(h, "")
    assert_equal "554 5.7.1 Go away\r\n", out
    assert d.closed?
    assert_equal [:on_close, :closed], h.seen.last
  end

  def test_lmtp_verdict_per_recipient
    cfg = Smtpe::ServerConfig.new(lmtp: true)
    h = Recorder.new(on_data: [250, 452])
    out, = run_driver(h, SESSION.sub("EHLO", "LHLO"), config: cfg)
    assert_match(/250 2.0.0 .*\r\n452 4.0.0 .*\r\n221/, out)
    h = Recorder.new(on_data: [nil, [452, "4.2.2", "Over quota"]])
    out, = run_driver(h, SESSION.sub("EHLO", "LHLO"), config: cfg)
    assert_match(/250 2.0.0 .*\r\n452 4.2.2 Over quota\r\n221/, out)
    h = Recorder.new(on_data: [451, "4.3.0", "Later"])
    out, = run_driver(h, SESSION.sub("EHLO", "LHLO"), config: cfg)
    assert_equal 2, out.scan("451 4.3.0 Later").size
  end

  def test_abandoned_transaction_never_delivered
    h = Recorder.new
    _, d = run_driver(h, "EHLO c\r\nMAIL FROM:<a@b>\r\nRCPT TO:<x@d>\r\nDATA\r\npartial\r\n")
    d.eof(1)
    assert_nil h.seen.assoc(:on_data)
    assert_equal [:on_close, :eof], h.seen.last
  end

  def test_timeout_from_deadline
    cfg = Smtpe::ServerConfig.new(command_timeout_ms: 50)
    h = Recorder.new
    d = Smtpe::ServerDriver.new(config: cfg, handler: h, now: 0)
    d.start(0)
    assert_equal 50, d.deadline
    assert_includes d.expire(60), "421 4.4.2"
    assert d.closed?
    assert_equal [:on_close, :timeout], h.seen.last
  end

  def self_signed
    key = OpenSSL::PKey::EC.generate("prime256v1")
    cert = OpenSSL::X509::Certificate.new
    cert.version = 2
    cert.serial = 1
    cert.subject = cert.issuer = OpenSSL::X509::Name.parse("/CN=localhost")
    cert.public_key = key
    cert.not_before = Time.now - 60
    cert.not_after = Time.now + 3600
    cert.sign(key, "SHA256")
    ctx = OpenSSL::SSL::SSLContext.new
    ctx.cert = cert
    ctx.key = key
    ctx
  end

  def with_server(model:, handler:, config:, tls_context: nil)
    ready = Queue.new
    server = Smtpe::Server.new(listen: "127.0.0.1:0", handler: handler, config: config, model: model,
                               tls_context: tls_context, on_listening: ->(a) { ready << a })
    thread = Thread.new { server.run }
    addr = Timeout.timeout(10) { ready.pop }
    yield Integer(addr.split(":").last)
  ensure
    server&.stop
    thread&.join(5)
  end

  # Under threads and under fibers (whose every wait goes through the connection's one
  # reactor registration: a second one for the handshake's waits ended every STARTTLS).
  def test_starttls_with_net_smtp_into_maildir
    %i[threads fibers].each { |model| starttls_into_maildir(model) }
  end

  # The whole STARTTLS handshake is bounded by the engine's deadline (here 1.5 s), however the
  # client spreads it: before, each of its reads waited 30 s afresh.
  def test_starttls_handshake_dripped_is_dropped
    cfg = Smtpe::ServerConfig.new(extensions: %i[default starttls], command_timeout_ms: 1500)
    with_server(model: :threads, handler: Smtpe::Handler.new, config: cfg, tls_context: self_signed) do |port|
      s = Socket.tcp("127.0.0.1", port)
      s.gets
      s.write("EHLO c\r\n")
      nil until s.gets.start_with?("250 ")
      s.write("STARTTLS\r\n")
      assert_match(/\A220 /, s.gets)
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      hello = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".b # a ClientHello's start
      closed = false
      hello.each_char do |ch|
        s.write(ch)
        sleep 0.4
      rescue Errno::EPIPE, Errno::ECONNRESET
        closed = true
        break
      end
      closed ||= s.wait_readable(5) && (s.read_nonblock(100, exception: false).nil? rescue true) # rubocop:disable Style/RescueModifier
      waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
      assert closed, "the dripped handshake still open after #{waited} s"
      assert_operator waited, :<, 8
    ensure
      s&.close
    end
  end

  def starttls_into_maildir(model)
    Dir.mktmpdir do |dir|
      cfg = Smtpe::ServerConfig.new(hostname: "tls.test", extensions: %i[default starttls], require_tls: true)
      with_server(model: model, handler: Smtpe::Maildir.new(dir), config: cfg, tls_context: self_signed) do |port|
        Timeout.timeout(20) do
          smtp = Net::SMTP.new("127.0.0.1", port)
          ctx = OpenSSL::SSL::SSLContext.new
          ctx.verify_mode = OpenSSL::SSL::VERIFY_NONE
          smtp.enable_starttls(ctx)
          smtp.start("client.test") do |s|
            s.send_message("Subject: over TLS\r\n\r\n.dotted\r\n", "a@b.example", "c@d.example")
          end
        end
      end
      files = Dir[File.join(dir, "new", "*")]
      assert_equal 1, files.size
      assert_equal "Return-Path: <a@b.example>\r\nSubject: over TLS\r\n\r\n.dotted\r\n", File.binread(files[0])
      assert_empty Dir[File.join(dir, "tmp", "*")]
    end
  end

  def test_plaintext_mail_refused_when_tls_required
    cfg = Smtpe::ServerConfig.new(extensions: %i[default starttls], require_tls: true)
    out, = run_driver(Recorder.new, "EHLO c\r\nMAIL FROM:<a@b>\r\n", config: cfg)
    assert_includes out, "530 5.7.0"
  end

  def test_fibers_model_serves_concurrently
    slow = Class.new(Smtpe::Handler) { def on_mail(_) = sleep(0.2) && nil }
    with_server(model: :fibers, handler: slow.new, config: Smtpe::ServerConfig.new) do |port|
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      Array.new(5) do
        Thread.new do
          Net::SMTP.start("127.0.0.1", port, "c") { |s| s.send_message("x\r\n", "a@b", "c@d") }
        end
      end.each { |t| t.join(20) }
      elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
      assert_operator elapsed, :<, 0.9, "5 sessions each waiting 0.2 s in one Fiber scheduler"
    end
  end

  # The sweeper's read: the octets win over a later deadline, a passed deadline ends the wait
  # (false) within a sweep, and no Fiber is left registered either way.
  def test_deadline_sweeper_ends_reads_at_the_deadline
    require "async"
    r, w = IO.pipe
    sweeper = Smtpe::DeadlineSweeper.new(interval: 0.05)
    results = []
    Async do |task|
      sweep = task.async { sweeper.run }
      task.async { sleep(0.02) && w.write("x") }
      results << task.async { sweeper.wait_readable(r, Smtpe.now_ms + 10_000) }.wait
      r.read(1)
      t0 = Smtpe.now_ms
      results << task.async { sweeper.wait_readable(r, t0 + 100) }.wait
      results << (Smtpe.now_ms - t0)
      results << sweeper.sweep(Smtpe.now_ms + 1_000_000)
      sweep.stop
    ensure
      w.close
    end
    assert results[0], "readable octets end the wait"
    assert_equal false, results[1], "a passed deadline ends the wait with false"
    assert_operator results[2], :>=, 100
    assert_operator results[2], :<, 1000
    assert_equal 0, results[3], "no Fiber left waiting"
  ensure
    r&.close
  end
end
