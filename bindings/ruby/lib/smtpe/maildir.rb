# frozen_string_literal: true

require "fileutils"
require "socket"

module Smtpe
  # A Handler that delivers each message into a Maildir (tmp/, fsync, rename into new/, fsync
  # of new/), so the 250 goes out only once the message is durable. The content is stored as
  # received (CRLF line ends), after a Return-Path: line. Its only state is frozen, so one
  # handler serves every Thread, Fiber and Ractor (Ractor.make_shareable works on it).
  class Maildir < Handler
    # The Maildir's absolute path.
    attr_reader :dir

    # dir:: the Maildir (tmp/, new/ and cur/ are made when missing)
    def initialize(dir)
      super()
      @dir = File.expand_path(dir).freeze
      %w[tmp new cur].each { |d| FileUtils.mkdir_p(File.join(@dir, d), mode: 0o700) }
      @host = Socket.gethostname.tr("/:", "__").freeze
    end

    # Stores the message; a failure to store is a 451 (the client retries), never a lost one.
    def on_data(message)
      name = unique_name
      tmp = File.join(@dir, "tmp", name)
      File.open(tmp, File::WRONLY | File::CREAT | File::EXCL | File::BINARY, 0o600) do |f|
        f.write("Return-Path: <#{message.reverse_path&.mailbox}>\r\n", message.content)
        f.fsync
      end
      File.rename(tmp, File.join(@dir, "new", name))
      File.open(File.join(@dir, "new"), File::RDONLY, &:fsync)
      nil
    rescue SystemCallError, IOError => e
      warn "smtpe: maildir #{@dir}: #{e.message}"
      File.unlink(tmp) rescue nil # rubocop:disable Style/RescueModifier
      Reply[451, "4.3.0", "Could not store the message"]
    end

    private

    def unique_name
      t = Process.clock_gettime(Process::CLOCK_REALTIME, :microsecond)
      "#{t / 1_000_000}.M#{t % 1_000_000}P#{Process.pid}R#{Random.bytes(8).unpack1("H*")}.#{@host}"
    end
  end
end
