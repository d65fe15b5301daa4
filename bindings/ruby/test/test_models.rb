# frozen_string_literal: true

# Integration tests of the gem's servers: examples/server.rb run as a real process under each of
# the four models (threads, fibers, prefork and ractors with 2 workers), on 127.0.0.1, port 0,
# delivering into a temporary Maildir, and real clients talking to it: Ruby's Net::SMTP,
# Python's smtplib, the project's C client smtpe-send (built here with cmake, or taken from
# $SMTPE_BUILD_DIR), the gem's own client Smtpe::SMTP; the pure-Ruby baseline
# (--protocol ruby) under each model; the SMTP smuggling probe (the engine refuses, the baseline
# is smuggled); --reply-delay-ms under fibers (sessions overlap); --sink; Smtpe::SMTP against
# the C server smtpe-server and against an in-process Smtpe::Server whose handler refuses one
# recipient (per-recipient outcomes).
#
#   ruby -w -I<ext dir> -Ibindings/ruby/lib bindings/ruby/test/test_models.rb
# where <ext dir> holds smtpe/smtpe.so (test/build_ext.sh prints it). The servers are spawned
# with the same -I directories (those of this process's load path that hold smtpe/smtpe.so or
# smtpe.rb). Environment: SMTPE_BUILD_DIR, a CMake build tree of the project to take (and bring
# up to date) smtpe-send and smtpe-server from; else one is configured in a temporary directory.
require "minitest/autorun"
require "fileutils"
require "json"
require "net/smtp"
require "open3"
require "rbconfig"
require "socket"
require "timeout"
require "tmpdir"
require "smtpe"

module ModelTestSupport
  RUBY_DIR = File.expand_path("..", __dir__)
  ROOT = File.expand_path("../../..", __dir__)
  SERVER_RB = File.join(RUBY_DIR, "examples", "server.rb")
  # the load path a server process needs: the directories of ours holding the extension or lib
  LOAD_DIRS = $LOAD_PATH.select do |d|
    File.exist?(File.join(d, "smtpe/smtpe.so")) || File.exist?(File.join(d, "smtpe.rb"))
  end.map { |d| File.expand_path(d) }.uniq.freeze
  STEP = 20 # seconds: the most any one client action or wait may take

  def self.now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # A server process (examples/server.rb or smtpe-server) in its own process group, its stderr
  # collected; the port from its "listening on ADDR:PORT" line.
  class ServerProcess
    attr_reader :port, :pid

    def initialize(argv, chdir: nil)
      @argv = argv
      @log = +""
      @lock = Mutex.new
      err_r, err_w = IO.pipe
      opts = { in: File::NULL, out: err_w, err: err_w, pgroup: true }
      opts[:chdir] = chdir if chdir
      @pid = Process.spawn(*argv, **opts)
      err_w.close
      @err = err_r
      @port = wait_listening
      @drain = Thread.new do
        loop { append(@err.readpartial(4096)) }
      rescue EOFError, IOError
        nil
      end
    rescue StandardError
      stop
      raise
    end

    def log = @lock.synchronize { @log.dup }

    # TERM to the group (prefork's workers too), KILL after 3 s, then KILL to whatever is left
    # in the group; reaps the process. Idempotent.
    def stop
      return if @stopped

      @stopped = true
      signal(:TERM)
      deadline = ModelTestSupport.now + 3
      reaped = nil
      loop do
        reaped = Process.wait(@pid, Process::WNOHANG)
        break if reaped || ModelTestSupport.now > deadline

        sleep 0.02
      end
      unless reaped
        signal(:KILL)
        Process.wait(@pid)
      end
      signal(:KILL)
      @drain&.join(3)
      @err.close unless @err.closed?
    rescue Errno::ECHILD
      nil
    end

    private

    def append(text) = @lock.synchronize { @log << text }

    def signal(sig)
      Process.kill(sig, -@pid)
    rescue Errno::ESRCH, Errno::EPERM
      nil
    end

    def wait_listening
      deadline = ModelTestSupport.now + STEP
      buf = +""
      loop do
        if (m = /listening on (?:\[[^\]]*\]|[^\s:]+):(\d+)/.match(buf))
          append(buf)
          return Integer(m[1], 10)
        end
        left = deadline - ModelTestSupport.now
        raise "no 'listening on' line within #{STEP} s from #{@argv.join(" ")}:\n#{buf}" if left <= 0

        next unless @err.wait_readable(left)

        begin
          buf << @err.readpartial(4096)
        rescue EOFError
          raise "#{@argv.join(" ")} ended before listening:\n#{buf}"
        end
      end
    end
  end

  # A client that writes what it is given and reads whole replies (for the smuggling probe).
  class RawClient
    def initialize(port)
      @sock = Socket.tcp("127.0.0.1", port, connect_timeout: 5)
      @buf = +"".b
    end

    def write(octets) = @sock.write(octets)

    # The next complete reply (all its lines), or nil at EOF.
    def reply
      lines = +""
      loop do
        while (i = @buf.index("\r\n"))
          line = @buf.slice!(0, i + 2)
          lines << line
          return lines if line.match?(/\A\d{3} /)
        end
        raise Timeout::Error, "no reply within #{STEP} s (have #{lines.inspect})" unless @sock.wait_readable(STEP)

        data = @sock.read_nonblock(4096, exception: false)
        return nil if data.nil?

        @buf << data unless data == :wait_readable
      end
    end

    # Every reply until the server closes.
    def replies_until_close
      list = []
      while (r = reply)
        list << r
      end
      list
    end

    def close = @sock.close
  end

  # The C programs smtpe-send and smtpe-server, built once a run: [dir, nil], [nil, why not]
  # (no cmake: the tests skip) or [false, the failed build's output] (they fail).
  module CBuild
    @lock = Mutex.new
    @result = nil

    def self.dir
      @lock.synchronize do
        @result ||= begin
          build
        rescue StandardError => e
          [false, e.message]
        end
      end
    end

    def self.build
      return [nil, "cmake is not installed"] unless system("cmake --version", out: File::NULL, err: File::NULL)

      dir = ENV.fetch("SMTPE_BUILD_DIR", nil)
      steps = []
      if dir.nil? || dir.empty?
        dir = Dir.mktmpdir("smtpe-models-build")
        Minitest.after_run { FileUtils.rm_rf(dir) }
        steps << ["cmake", "-S", ROOT, "-B", dir, "-DCMAKE_BUILD_TYPE=Release"]
      end
      steps << ["cmake", "--build", dir, "-j2", "--target", "smtpe-send", "smtpe-server"]
      steps.each do |argv|
        out, status = Open3.capture2e(*argv)
        raise "#{argv.join(" ")} failed:\n#{out}" unless status.success?
      end
      [dir, nil]
    end
  end

  # Runs argv to its end (at most STEP s; killed then, and the test fails):
  # [stdout, stderr, Process::Status].
  def run_command(*argv, stdin_data: "")
    Open3.popen3(*argv, pgroup: true) do |stdin, stdout, stderr, thread|
      out = Thread.new { stdout.read }
      err = Thread.new { stderr.read }
      begin
        stdin.write(stdin_data)
      rescue Errno::EPIPE
        nil
      end
      stdin.close
      unless thread.join(STEP)
        begin
          Process.kill(:KILL, -thread.pid)
        rescue Errno::ESRCH
          nil
        end
        thread.join
        flunk "#{argv.first} did not end within #{STEP} s: #{out.value}#{err.value}"
      end
      [out.value, err.value, thread.value]
    end
  end

  def step(&block) = Timeout.timeout(STEP, &block)

  # examples/server.rb under model; yields the ServerProcess and always ends it. A failure in
  # the block carries the server's log.
  def with_ruby_server(model, dir: nil, protocol: "smtpe", delay: nil, chdir: nil, &block)
    argv = [RbConfig.ruby, *LOAD_DIRS.map { |d| "-I#{d}" }, SERVER_RB, "--model", model.to_s,
            "--workers", "2", "--listen", "127.0.0.1:0", "--protocol", protocol,
            "--hostname", "mx.test"]
    argv.concat(dir ? ["--dir", dir] : ["--sink"])
    argv.concat(["--reply-delay-ms", delay.to_s]) if delay
    server = nil
    with_server(argv, chdir: chdir) do |s|
      server = s
      block.call(s)
    end
    # stopped now: no session may have raised (Connection's and the handler's warnings)
    refute_match(/Error|exception|raised|smtpe: /, server.log, "the server's log")
  end

  def with_server(argv, chdir: nil)
    server = ServerProcess.new(argv, chdir: chdir)
    begin
      yield server
    rescue Minitest::Skip
      raise
    rescue Minitest::Assertion, StandardError => e
      server.stop
      raise e.exception("#{e.message}\n--- server log (#{argv.grep_v(/\A-I/).join(" ")}):\n#{server.log}")
    end
  ensure
    server&.stop
  end

  # A Maildir's new/ files as {name => content}, and tmp/'s names.
  def delivered(dir)
    new_dir = File.join(dir, "new")
    return {} unless Dir.exist?(new_dir)

    Dir.children(new_dir).sort.to_h { |n| [n, File.binread(File.join(new_dir, n))] }
  end

  def leftovers(dir)
    tmp = File.join(dir, "tmp")
    Dir.exist?(tmp) ? Dir.children(tmp) : []
  end

  def maildir_file(from, content) = "Return-Path: <#{from}>\r\n#{content}".b

  # One Net::SMTP session sending content; returns the Net::SMTP::Response of the message.
  def net_smtp_send(port, content, from, to)
    step do
      smtp = Net::SMTP.new("127.0.0.1", port, starttls: false)
      smtp.open_timeout = 10
      smtp.read_timeout = 15
      smtp.start(helo: "client.example") { |s| s.send_message(content, from, *to) }
    end
  end
end

class TestModels < Minitest::Test
  include ModelTestSupport

  MODELS = %w[threads fibers prefork ractors].freeze

  # CRLF line ends; lines with leading dots (one a lone ".", which must not end the content).
  MESSAGE = ("From: Alice <alice@example.org>\r\nTo: bob@example.net, carol@example.net\r\n" \
             "Subject: models\r\n\r\nfirst line\r\n.a line with a leading dot\r\n..two dots\r\n" \
             ".\r\nstill the content after a lone dot\r\nlast line\r\n").b.freeze
  FROM = "alice@example.org"
  TO = %w[bob@example.net carol@example.net].freeze

  def setup
    @dir = Dir.mktmpdir("smtpe-models")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def maildir = File.join(@dir, "Maildir")

  def c_build
    dir, why = CBuild.dir
    flunk why if dir == false
    skip "smtpe-send/smtpe-server not built: #{why}" unless dir
    dir
  end

  # Test 1 (engine) and 4 (baseline): Net::SMTP, 2 recipients, one file, byte-exact.
  def check_net_smtp(model, protocol)
    with_ruby_server(model, dir: maildir, protocol: protocol) do |server|
      response = net_smtp_send(server.port, MESSAGE, FROM, TO)
      assert_equal "250", response.status, response.string
      files = delivered(maildir)
      assert_equal 1, files.size, "one file for the message with 2 recipients: #{files.keys}"
      assert_equal maildir_file(FROM, MESSAGE), files.values.first
      assert_empty leftovers(maildir), "nothing left in tmp/"
    end
  end

  PYTHON_SCRIPT = <<~PY
    import json, smtplib, sys
    port, first, second = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3].encode()
    out = {}
    s = smtplib.SMTP("127.0.0.1", port, local_hostname="py.example", timeout=15)
    out["ehlo"] = s.ehlo()[0]
    out["pipelining"] = s.has_extn("pipelining")
    out["chunking"] = s.has_extn("chunking")
    # smtplib's own sendmail (SIZE= since offered), two recipients
    out["refused"] = s.sendmail("alice@example.org", ["bob@example.net", "carol@example.net"], first)
    out["rset"] = s.rset()[0]
    # the second message pipelined (RFC 2920): MAIL, RCPT and DATA in one write, then the replies
    s.send(b"MAIL FROM:<dave@example.org>\\r\\nRCPT TO:<erin@example.net>\\r\\nDATA\\r\\n")
    out["pipelined"] = [s.getreply()[0] for _ in range(3)]
    s.send(smtplib.quotedata(second.decode()).encode() + b".\\r\\n")
    out["second"] = s.getreply()[0]
    out["quit"] = s.quit()[0]
    print(json.dumps(out))
  PY

  # Test 2: Python's smtplib, sendmail then a pipelined transaction after RSET.
  def check_python(model)
    skip "python3 is not installed" unless system("python3 -c pass", out: File::NULL, err: File::NULL)
    first = "Subject: python one\r\n\r\n.leading dot\r\nbody one\r\n"
    second = "Subject: python two\r\n\r\nbody two\r\n..two dots\r\n"
    with_ruby_server(model, dir: maildir) do |server|
      out, err, status = run_command("python3", "-c", PYTHON_SCRIPT, server.port.to_s, first, second)
      assert status.success?, "python3 failed: #{err}"
      result = JSON.parse(out)
      assert_equal({ "ehlo" => 250, "pipelining" => true, "chunking" => true, "refused" => {},
                     "rset" => 250, "pipelined" => [250, 250, 354], "second" => 250, "quit" => 221 },
                   result)
      assert_equal [maildir_file("alice@example.org", first), maildir_file("dave@example.org", second)].sort,
                   delivered(maildir).values.sort
      assert_empty leftovers(maildir)
    end
  end

  # Test 3: smtpe-send, by BDAT (server.rb offers CHUNKING) and by DATA (--chunking never).
  def check_smtpe_send(model)
    send = File.join(c_build, "smtpe-send")
    help, = run_command(send, "--help")
    %w[--server --from --to --chunking --tls --timeout-ms].each { |flag| assert_includes help, flag }
    file = File.join(@dir, "message.eml")
    File.binwrite(file, MESSAGE)
    with_ruby_server(model, dir: maildir) do |server|
      [%w[auto bdat@example.net], %w[never data@example.net]].each do |chunking, rcpt|
        out, err, status = run_command(send, "--server", "127.0.0.1:#{server.port}", "--helo", "client.example",
                                       "--tls", "none", "--timeout-ms", "15000", "--chunking", chunking,
                                       "--from", FROM, "--to", rcpt, file)
        assert_equal 0, status.exitstatus, "smtpe-send --chunking #{chunking}: #{out}#{err}"
        assert_match(/\A1 #{Regexp.escape(rcpt)} delivered 250 /, out)
      end
      files = delivered(maildir).values
      assert_equal 2, files.size
      assert_equal [maildir_file(FROM, MESSAGE)] * 2, files
      assert_empty leftovers(maildir)
    end
  end

  # Test 7: --sink accepts and writes nothing (the server runs in an empty directory).
  def check_sink(model)
    cwd = File.join(@dir, "cwd")
    Dir.mkdir(cwd)
    with_ruby_server(model, chdir: cwd) do |server|
      2.times do
        response = net_smtp_send(server.port, MESSAGE, FROM, TO)
        assert_equal "250", response.status
      end
    end
    assert_empty Dir.children(cwd), "--sink wrote nothing"
    assert_equal [File.basename(cwd)], Dir.children(@dir)
  end

  # The smuggling session: a first message whose content holds sep (a line end that is not
  # CRLF before or after the dot), then a second MAIL transaction inside that content.
  def smuggle(port, sep)
    client = RawClient.new(port)
    step do
      replies = [client.reply]
      ["EHLO probe.example\r\n", "MAIL FROM:<alice@example.org>\r\n", "RCPT TO:<bob@example.net>\r\n",
       "DATA\r\n"].each do |command|
        client.write(command)
        replies << client.reply
      end
      assert_match(/\A354 /, replies.last, replies.join)
      client.write("Subject: first\r\n\r\nfirst message#{sep}MAIL FROM:<mallory@example.org>\r\n" \
                   "RCPT TO:<victim@example.net>\r\nDATA\r\nSubject: smuggled\r\n\r\nsmuggled message\r\n" \
                   ".\r\nQUIT\r\n")
      replies + client.replies_until_close
    end
  ensure
    client&.close
  end

  def smuggled?(content) = content.start_with?("Return-Path: <mallory@example.org>")

  MODELS.each do |model|
    define_method(:"test_#{model}_net_smtp") { check_net_smtp(model, "smtpe") }
    define_method(:"test_#{model}_python_smtplib") { check_python(model) }
    define_method(:"test_#{model}_smtpe_send") { check_smtpe_send(model) }
    define_method(:"test_#{model}_baseline_net_smtp") { check_net_smtp(model, "ruby") }
    define_method(:"test_#{model}_sink") { check_sink(model) }
    define_method(:"test_#{model}_smtp_client_binding") { check_client_binding(model) }

    # Test 5: the engine refuses the content with a bare LF (550 5.6.0, the default policy):
    # neither the first message nor the smuggled one lands.
    define_method(:"test_#{model}_engine_refuses_smuggling") do
      with_ruby_server(model, dir: maildir) do |server|
        ["\n.\r\n", "\r\n.\n"].each do |sep|
          replies = smuggle(server.port, sep)
          codes = replies.map { |r| r[0, 3] }
          assert(replies.any? { |r| r.start_with?("550 5.6.0 ") }, "#{sep.inspect}: 550 5.6.0 expected: #{replies.join}")
          assert_equal 1, codes.count("354"), "#{sep.inspect}: no second DATA inside the content: #{replies.join}"
          assert_equal "221", codes.last, replies.join
          files = delivered(maildir).values
          assert_operator files.size, :<=, 1
          refute(files.any? { |f| smuggled?(f) }, "#{sep.inspect}: a smuggled message landed")
        end
        assert_empty delivered(maildir), "the content with a bare line end is refused whole"
      end
    end
  end

  # Test 5, the other side (the difference the issue is about): the pure-Ruby baseline splits on
  # LF, so "\n.\r\n" and "\r\n.\n" end its DATA and the MAIL FROM inside the content is a second
  # transaction: the smuggled message from mallory lands beside the first.
  def test_baseline_is_smuggled
    with_ruby_server(:threads, dir: maildir, protocol: "ruby") do |server|
      ["\n.\r\n", "\r\n.\n"].each_with_index do |sep, i|
        replies = smuggle(server.port, sep)
        assert_equal %w[220 250 250 250 354 250 250 250 354 250 221], replies.map { |r| r[0, 3] },
                     "#{sep.inspect}: #{replies.join}"
        files = delivered(maildir).values
        assert_equal 2 * (i + 1), files.size
        assert_equal i + 1, files.count { |f| smuggled?(f) }, "#{sep.inspect}: the smuggled message landed"
      end
    end
  end

  # Test 6: --reply-delay-ms 10 under fibers: 20 sessions at once take far less than 20 one
  # after the other (each session waits for 8 delayed replies: greeting, EHLO, MAIL, 2 RCPT,
  # DATA, the end of the content, QUIT).
  def test_fibers_reply_delay_sessions_overlap
    with_ruby_server(:fibers, delay: 10) do |server|
      one = Array.new(3) do
        t = ModelTestSupport.now
        assert_equal "250", net_smtp_send(server.port, MESSAGE, FROM, TO).status
        ModelTestSupport.now - t
      end.sort[1]
      assert_operator one, :>=, 0.08, "8 replies delayed 10 ms each"
      t = ModelTestSupport.now
      threads = Array.new(20) { Thread.new { net_smtp_send(server.port, MESSAGE, FROM, TO).status } }
      statuses = threads.map(&:value)
      total = ModelTestSupport.now - t
      assert_equal ["250"] * 20, statuses
      assert_operator total, :<, 0.5 * 20 * one,
                      format("20 concurrent sessions took %.3f s, one alone %.3f s", total, one)
    end
  end

  # Test 8, per model: Smtpe::SMTP (the client engine) against examples/server.rb: both
  # recipients delivered, the message byte-exact (BDAT, since server.rb offers CHUNKING).
  def check_client_binding(model)
    with_ruby_server(model, dir: maildir) do |server|
      result = step do
        Smtpe::SMTP.start("127.0.0.1", server.port, helo: "client.example") do |smtp|
          assert_includes smtp.ready.extensions, :chunking
          smtp.send_message(MESSAGE, FROM, *TO)
        end
      end
      assert_equal TO, result.outcomes.map(&:recipient)
      assert_equal %i[delivered delivered], result.outcomes.map(&:outcome)
      assert_equal [250, 250], result.outcomes.map(&:code)
      assert result.delivered?
      assert_equal [maildir_file(FROM, MESSAGE)], delivered(maildir).values
    end
  end

  # Test 8: Smtpe::SMTP against the C server smtpe-server: two messages on one session.
  def test_smtp_client_binding_against_smtpe_server
    server_bin = File.join(c_build, "smtpe-server")
    help, = run_command(server_bin, "--help")
    %w[--listen --maildir --maildir-crlf --hostname --drain-seconds].each { |flag| assert_includes help, flag }
    assert_includes help, "listening on ADDR:PORT"
    # --maildir-crlf: the file keeps the wire's line ends, so the content compares as sent
    with_server([server_bin, "--listen", "127.0.0.1:0", "--maildir", maildir, "--maildir-crlf",
                 "--hostname", "mx.test", "--drain-seconds", "1"]) do |server|
      results = step do
        Smtpe::SMTP.start("127.0.0.1", server.port, helo: "client.example") do |smtp|
          [smtp.send_message(MESSAGE, FROM, *TO), smtp.send_message(MESSAGE, "", "dave@example.net")]
        end
      end
      assert_equal [%i[delivered delivered], %i[delivered]], results.map { |r| r.outcomes.map(&:outcome) }
      assert_equal [TO, ["dave@example.net"]], results.map { |r| r.outcomes.map(&:recipient) }
      files = delivered(maildir).values
      assert_equal 2, files.size
      files.each { |f| assert f.end_with?(MESSAGE), "the content as sent: #{f.inspect}" }
    end
  end

  # A handler refusing one recipient (550 5.1.1), keeping the messages it is given.
  class RefusingHandler < Smtpe::Handler
    attr_reader :messages

    def initialize
      super
      @messages = Queue.new
    end

    def on_rcpt(event)
      return nil unless event.forward_path.local_part == "nobody"

      Smtpe::Reply[550, "5.1.1", "No such user here"]
    end

    def on_data(message)
      @messages << message
      nil
    end
  end

  # Test 8: per-recipient outcomes from an in-process Smtpe::Server (:threads, port 0) whose
  # handler refuses one of the recipients.
  def test_smtp_client_binding_per_recipient_outcomes
    handler = RefusingHandler.new
    ready = Queue.new
    server = Smtpe::Server.new(listen: "127.0.0.1:0", handler: handler, model: :threads,
                               config: Smtpe::ServerConfig.new(hostname: "mx.test"),
                               on_listening: ->(addr) { ready << addr })
    runner = Thread.new { server.run }
    begin
      addr = step { ready.pop }
      port = Integer(addr[/:(\d+)\z/, 1], 10)
      result = step do
        Smtpe::SMTP.start("127.0.0.1", port, helo: "client.example") do |smtp|
          smtp.send_message(MESSAGE, FROM, "bob@example.net", "nobody@example.net", "carol@example.net")
        end
      end
      outcomes = result.outcomes
      assert_equal %w[bob@example.net nobody@example.net carol@example.net], outcomes.map(&:recipient)
      assert_equal [0, 1, 2], outcomes.map(&:index), "in recipient order (the refusal came first)"
      assert_equal %i[delivered permanent delivered], outcomes.map(&:outcome)
      assert_equal [250, 550, 250], outcomes.map(&:code)
      assert_equal "5.1.1", outcomes[1].enhanced
      assert_match(/No such user here/, outcomes[1].text)
      refute result.delivered?
      message = step { handler.messages.pop }
      assert_equal %w[bob@example.net carol@example.net], message.recipients.map(&:mailbox)
      assert_equal FROM, message.reverse_path.mailbox
      assert_equal MESSAGE, message.content
      assert handler.messages.empty?
    ensure
      server.stop
      runner.join(5) or runner.kill
    end
  end
end
