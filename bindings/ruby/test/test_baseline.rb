# frozen_string_literal: true

# The pure-Ruby baseline driver (bindings/ruby/baseline/line_protocol.rb), driven directly, and
# once over a real socket with Net::SMTP. Run: ruby -Ibindings/ruby/lib bindings/ruby/test/test_baseline.rb
require "minitest/autorun"
require "socket"
require "net/smtp"
require_relative "../baseline/line_protocol"

class TestBaseline < Minitest::Test
  # Records every call; verdicts[:rcpt] etc. (a value or a Proc of the event) gives the verdicts.
  class Recorder < Smtpe::Handler
    attr_reader :calls, :messages

    def initialize(**verdicts)
      super()
      @verdicts = verdicts
      @calls = []
      @messages = []
    end

    def verdict(kind, arg)
      @calls << [kind, arg]
      v = @verdicts[kind]
      v.respond_to?(:call) ? v.call(arg) : v
    end

    def on_connect(peer) = verdict(:connect, peer)
    def on_helo(event) = verdict(:helo, event)
    def on_mail(event) = verdict(:mail, event)
    def on_rcpt(event) = verdict(:rcpt, event)
    def on_vrfy(event) = verdict(:vrfy, event)
    def on_unknown(event) = verdict(:unknown, event)
    def on_close(reason) = verdict(:close, reason)

    def on_data(message)
      @messages << message
      verdict(:data, message)
    end
  end

  GREETING = "220 mx.test ESMTP smtpe\r\n"
  EHLO_REPLY = "250-mx.test\r\n250-PIPELINING\r\n250-SIZE 10485760\r\n250-8BITMIME\r\n250 ENHANCEDSTATUSCODES\r\n"

  # The study's message: headers and 4 KB of body, with one line that needs dot-stuffing.
  def content
    body = ["From: a@example.org", "To: b@example.net", "Subject: study", "", ".leading dot"]
    body << ("x" * 70) while body.sum { |l| l.bytesize + 2 } < 4096
    body.map { |l| "#{l}\r\n" }.join
  end

  def session_input
    stuffed = content.gsub(/^\./, "..")
    "EHLO client.example\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n" \
      "#{stuffed}.\r\nQUIT\r\n".b
  end

  SESSION_OUTPUT = "#{GREETING}#{EHLO_REPLY}250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n" \
                   "354 End data with <CR><LF>.<CR><LF>\r\n250 2.0.0 Ok\r\n221 2.0.0 Bye\r\n"

  def driver(handler = Recorder.new, **opts)
    Smtpe::Baseline::LineProtocol.new(handler: handler, hostname: "mx.test", peer: "192.0.2.1:40000", **opts)
  end

  # A new driver past its greeting; returns [driver, handler].
  def session(handler = Recorder.new, **opts)
    d = driver(handler, **opts)
    assert_equal GREETING, d.start(0)
    [d, handler]
  end

  def test_study_session_whole_and_octet_by_octet
    results = [:whole, :octets].map do |how|
      h = Recorder.new
      d = driver(h)
      out = d.start(0)
      if how == :whole
        out << d.receive(session_input, 1)
      else
        session_input.each_char.with_index { |c, i| out << d.receive(c, i) }
      end
      assert d.closed?
      assert_nil d.deadline
      assert_equal Encoding::BINARY, out.encoding
      [out, h.messages, h.calls.map(&:first)]
    end
    assert_equal SESSION_OUTPUT, results[0][0]
    assert_equal results[0], results[1]
    msg = results[0][1].fetch(0)
    assert_equal content, msg.content
    assert_equal Encoding::BINARY, msg.content.encoding
    assert_equal "a@example.org", msg.reverse_path.mailbox
    assert_equal ["b@example.net"], msg.recipients.map(&:mailbox)
    assert_equal ["b", "example.net"], [msg.recipients[0].local_part, msg.recipients[0].domain]
    assert_equal ["192.0.2.1:40000", "client.example", false], [msg.peer, msg.helo, msg.chunked]
    assert msg.frozen? && msg.content.frozen?
    assert_equal %i[connect helo mail rcpt data close], results[0][2]
  end

  def test_events
    d, h = session
    d.receive("EHLO c.test\r\nMAIL FROM:<> SIZE=100 BODY=8BITMIME\r\nRCPT TO:<Postmaster>\r\n" \
              "RCPT TO:<\"a b\"@[192.0.2.1]>\r\n", 1)
    helo, mail, rcpt1, rcpt2 = h.calls[1..].map(&:last)
    assert_equal [1, "c.test", true, false, false], helo.to_a
    # (Path#null? and friends look up NULL etc. lexically in Smtpe, not Path: test the flags)
    assert mail.reverse_path.flags.anybits?(Smtpe::Path::NULL)
    assert_equal [100, :"8bitmime", [%w[SIZE 100], %w[BODY 8BITMIME]]], [mail.size, mail.body, mail.params]
    assert_equal Smtpe::Path::POSTMASTER, rcpt1.forward_path.flags
    assert_equal Smtpe::Path::QUOTED | Smtpe::Path::ADDR_LITERAL, rcpt2.forward_path.flags
    assert_equal [2, 3, 4], [mail.id, rcpt1.id, rcpt2.id]
    assert Ractor.shareable?(rcpt2)
  end

  def test_pipelined_commands_answered_in_order
    d, = session
    out = d.receive("EHLO c.test\r\nMAIL FROM:<a@x.test>\r\nRCPT TO:<b@y.test>\r\nRCPT TO:<c@y.test>\r\n" \
                    "NOOP\r\nRSET\r\nVRFY bob\r\nDATA\r\n", 1)
    assert_equal "#{EHLO_REPLY}250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n" \
                 "250 2.0.0 Ok\r\n250 2.0.0 Ok\r\n" \
                 "252 2.5.0 Cannot VRFY user, but will accept message and attempt delivery\r\n" \
                 "503 5.5.1 Need MAIL command\r\n", out
  end

  def test_handler_refusals_reach_the_output
    h = Recorder.new(rcpt: ->(ev) { [550, "5.1.1", "No such user"] if ev.forward_path.local_part == "nobody" },
                     data: Smtpe::Reply[451, "4.3.0", "Try again later"])
    d, = session(h)
    out = d.receive("EHLO c\r\nMAIL FROM:<a@x.test>\r\nRCPT TO:<nobody@y.test>\r\nRCPT TO:<b@y.test>\r\n" \
                    "DATA\r\nhello\r\n.\r\n", 1)
    assert_equal "#{EHLO_REPLY}250 2.1.0 Ok\r\n550 5.1.1 No such user\r\n250 2.1.5 Ok\r\n" \
                 "354 End data with <CR><LF>.<CR><LF>\r\n451 4.3.0 Try again later\r\n", out
    assert_equal ["b@y.test"], h.messages[0].recipients.map(&:mailbox)
    assert_equal "hello\r\n", h.messages[0].content
    # plain codes get the class's enhanced code and text; a 421 closes
    h2 = Recorder.new(mail: 550)
    d2, = session(h2)
    assert_equal "#{EHLO_REPLY}550 5.0.0 Rejected\r\n", d2.receive("EHLO c\r\nMAIL FROM:<a@x.test>\r\n", 1)
    h2 = Recorder.new(mail: [452, nil, "Later\nmuch later"])
    d2, = session(h2)
    assert_equal "452-4.0.0 Later\r\n452 4.0.0 much later\r\n", d2.receive("HELO c\r\nMAIL FROM:<a@x.test>\r\n", 1)[13..]
    h3 = Recorder.new(mail: true, rcpt: Smtpe::Reply[421, "4.3.2", "Shutting down"])
    d3, = session(h3)
    out = d3.receive("HELO c\r\nMAIL FROM:<a@x.test>\r\nRCPT TO:<b@y.test>\r\nNOOP\r\n", 1)
    assert_equal "250 mx.test\r\n250 2.1.0 Ok\r\n421 4.3.2 Shutting down\r\n", out
    assert d3.closed?
    assert_equal [:close, :closed], h3.calls.last
  end

  def test_connect_refusal_closes
    h = Recorder.new(connect: [554, "5.7.1", "Go away"])
    d = driver(h)
    assert_equal "554 5.7.1 Go away\r\n", d.start(0)
    assert d.closed?
    assert_equal "", d.receive("EHLO c\r\n", 1)
  end

  def test_bad_sequence_503
    d, = session
    assert_equal "503 5.5.1 Send HELO or EHLO first\r\n", d.receive("MAIL FROM:<a@x.test>\r\n", 1)
    d.receive("HELO c\r\n", 1)
    assert_equal "503 5.5.1 Need MAIL command\r\n503 5.5.1 Need MAIL command\r\n",
                 d.receive("RCPT TO:<b@y.test>\r\nDATA\r\n", 1)
    assert_equal "250 2.1.0 Ok\r\n503 5.5.1 Nested MAIL command\r\n554 5.5.1 No valid recipients\r\n",
                 d.receive("MAIL FROM:<a@x.test>\r\nMAIL FROM:<a@x.test>\r\nDATA\r\n", 1)
    assert_equal "250 2.0.0 Ok\r\n503 5.5.1 Need MAIL command\r\n", d.receive("RSET\r\nRCPT TO:<b@y.test>\r\n", 1)
  end

  def test_syntax_501_and_unknown_500
    h = Recorder.new
    d, = session(h)
    out = d.receive("EHLO\r\nHELO   \r\nEHLO c\r\nMAIL FROM:bob@x.test\r\nMAIL FROM:<bob>\r\n" \
                    "MAIL FROM:<a@x.test> SIZE=big\r\nMAIL FROM:<a@x.test> FOO=1\r\n" \
                    "MAIL FROM:<a@x.test>\r\nRCPT TO:b@y.test\r\nRCPT TO:<>\r\nDATA now\r\nXYZZY 1\r\n", 1)
    assert_equal "501 5.5.4 Syntax: EHLO hostname\r\n501 5.5.4 Syntax: HELO hostname\r\n#{EHLO_REPLY}" \
                 "501 5.5.4 Syntax: MAIL FROM:<address>\r\n501 5.1.7 Bad sender address syntax\r\n" \
                 "501 5.5.4 Malformed parameter\r\n555 5.5.4 Unsupported parameter\r\n250 2.1.0 Ok\r\n" \
                 "501 5.5.4 Syntax: RCPT TO:<address>\r\n501 5.1.3 Bad recipient address syntax\r\n" \
                 "501 5.5.4 No parameters allowed\r\n500 5.5.1 Command unrecognized\r\n", out
    assert_equal ["XYZZY", "1"], h.calls.last.last.to_a[1..]
  end

  def test_max_message_size_552
    h = Recorder.new
    d, = session(h, max_message_size: 100)
    out = d.receive("EHLO c\r\nMAIL FROM:<a@x.test> SIZE=101\r\nMAIL FROM:<a@x.test> SIZE=100\r\n" \
                    "RCPT TO:<b@y.test>\r\nDATA\r\n#{"y" * 98}\r\n#{"z" * 10}\r\n.\r\nMAIL FROM:<a@x.test>\r\n", 1)
    assert_equal "#{EHLO_REPLY.sub('10485760', '100')}552 5.3.4 Message size exceeds fixed limit\r\n" \
                 "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 End data with <CR><LF>.<CR><LF>\r\n" \
                 "552 5.3.4 Message size exceeds fixed limit\r\n250 2.1.0 Ok\r\n", out
    assert_empty h.messages
  end

  def test_timeout_deadline_expire
    h = Recorder.new
    d, = session(h)
    assert_equal 300_000, d.deadline
    d.receive("EHLO c\r\n", 5_000)
    assert_equal 305_000, d.deadline
    d.receive("MAIL FROM:<a@x.test>\r\nRCPT TO:<b@y.test>\r\nDATA\r\n", 6_000)
    assert_equal 186_000, d.deadline # the DATA timeout while content is read
    assert_equal "421 4.4.2 mx.test Timeout exceeded\r\n", d.expire(186_000)
    assert d.closed?
    assert_nil d.deadline
    assert_equal [:close, :timeout], h.calls.last
    assert_empty h.messages
  end

  def test_eof_and_tls
    h = Recorder.new
    d, = session(h)
    refute d.tls?
    assert_nil d.eof(1)
    assert d.closed?
    assert_equal [:close, :eof], h.calls.last
  end

  # Not hardened, like the servers it models: bare LF ends lines and "\n.\n" ends the content.
  def test_bare_lf_is_taken
    h = Recorder.new
    d, = session(h)
    out = d.receive("HELO c\nMAIL FROM:<a@x.test>\nRCPT TO:<b@y.test>\nDATA\none\n.\nMAIL FROM:<s@x.test>\n", 1)
    assert_equal "one\r\n", h.messages[0].content
    assert out.end_with?("250 2.0.0 Ok\r\n250 2.1.0 Ok\r\n")
  end

  def test_net_smtp_over_tcp
    server = TCPServer.new("127.0.0.1", 0)
    handler = Recorder.new
    thread = Thread.new do
      sock = server.accept
      now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond) }
      d = driver(handler, peer: sock.remote_address.inspect_sockaddr)
      sock.write(d.start(now.call))
      until d.closed?
        data = begin
          sock.readpartial(16_384)
        rescue EOFError
          d.eof(now.call)
          break
        end
        sock.write(d.receive(data, now.call))
      end
      sock.close
    end
    text = "Subject: hi\r\n\r\n.dot line\r\nbody\r\n"
    Net::SMTP.start("127.0.0.1", server.addr[1], helo: "client.test") do |smtp|
      smtp.send_message(text, "from@example.org", "to1@example.net", "to2@example.net")
    end
    assert thread.join(10)
    msg = handler.messages.fetch(0)
    assert_equal text, msg.content
    assert_equal ["to1@example.net", "to2@example.net"], msg.recipients.map(&:mailbox)
    assert_equal ["from@example.org", "client.test"], [msg.reverse_path.mailbox, msg.helo]
    assert_equal [:close, :quit], handler.calls.last
  ensure
    server&.close
  end
end
