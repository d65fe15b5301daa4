# frozen_string_literal: true

# The README's Ruby section works as printed: its server block runs (on a free port instead of
# 2525, in a temporary directory) and its send block, run against it, prints the outcomes the
# README says; the message lands in the Maildir.
require "minitest/autorun"
require "open3"
require "rbconfig"
require "socket"
require "timeout"
require "tmpdir"

class TestReadme < Minitest::Test
  README = File.expand_path("../../../README.md", __dir__)

  def blocks
    text = File.read(README)
    section = text[/^## Ruby\n(.*?)^## /m, 1] or flunk "README has no ## Ruby section"
    section.scan(/^```ruby\n(.*?)^```/m).flatten
  end

  def load_path_args
    $LOAD_PATH.select { |d| File.exist?(File.join(d, "smtpe/smtpe.so")) || File.exist?(File.join(d, "smtpe.rb")) }
              .flat_map { |d| ["-I", d] }
  end

  def test_server_and_send_as_printed
    server_code, send_code = blocks
    refute_nil send_code
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "server.rb"), server_code.sub("127.0.0.1:2525", "127.0.0.1:#{port}"))
      File.write(File.join(dir, "send.rb"), send_code.sub("2525", port.to_s))
      stdin, err, server = Open3.popen2e(RbConfig.ruby, *load_path_args, "server.rb", chdir: dir)
      stdin.close
      begin
        Timeout.timeout(20) { err.each_line { |l| break if l.include?("listening on") } }
        out, status = Timeout.timeout(20) { Open3.capture2e(RbConfig.ruby, *load_path_args, "send.rb", chdir: dir) }
        assert status.success?, out
        assert_equal ["you@example.com: delivered 250 2.0.0 Ok",
                      "who@example.net: permanent 550 5.1.1 No such user"], out.lines.map(&:chomp)
        files = Dir[File.join(dir, "var/ruby-maildir/new/*")]
        assert_equal 1, files.size
        assert_equal "Return-Path: <me@example.org>\r\nSubject: hi\r\n\r\nHello\r\n", File.binread(files[0])
      ensure
        Process.kill(:TERM, server.pid)
        server.join
      end
    end
  end
end
