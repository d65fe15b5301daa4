#!/usr/bin/env ruby
# frozen_string_literal: true

# A small complete mail server on the smtpe gem, under any of the Ruby study's models:
#
#   ruby examples/server.rb --model threads|fibers|prefork|ractors [--workers N]
#        --listen ADDR:PORT (--dir DIR | --sink) [--reply-delay-ms N] [--protocol smtpe|ruby]
#        [--lmtp] [--hostname NAME] [--tls-cert PEM --tls-key PEM]
#
# --dir delivers each message into a Maildir (fsync before the 250); --sink accepts and drops.
# --protocol ruby runs the pure-Ruby line parser (baseline/line_protocol.rb) instead of the
# engine, under the same model: the benchmark's comparison. Prints "listening on ADDR:PORT" on
# stderr once it accepts connections. SIGINT/SIGTERM end it.
require "optparse"

lib = File.expand_path("../lib", __dir__)
$LOAD_PATH.unshift(lib) unless $LOAD_PATH.include?(lib)
require "smtpe"

# Accepts every message and keeps nothing (benchmarks).
class SinkHandler < Smtpe::Handler
end

opts = { model: :threads, workers: 2, listen: "127.0.0.1:2525", reply_delay_ms: 0,
         protocol: "smtpe", hostname: "localhost" }
parser = OptionParser.new do |o|
  o.banner = "usage: server.rb --model MODEL --listen ADDR:PORT (--dir DIR | --sink) [options]"
  o.on("--model MODEL", "threads, fibers, prefork or ractors") do |v|
    # spelled out: OptionParser would take "thread" for threads
    Smtpe::Server::MODELS.include?(v.to_sym) or raise OptionParser::InvalidArgument, v
    opts[:model] = v.to_sym
  end
  o.on("--workers N", Integer, "processes (prefork) or Ractors (ractors); default 2") { |v| opts[:workers] = v }
  o.on("--listen ADDR:PORT", "default 127.0.0.1:2525 (port 0: any)") { |v| opts[:listen] = v }
  o.on("--dir DIR", "deliver into the Maildir DIR") { |v| opts[:dir] = v }
  o.on("--sink", "accept and drop every message") { opts[:sink] = true }
  o.on("--reply-delay-ms N", Integer, "wait N ms before each reply (the study's work)") { |v| opts[:reply_delay_ms] = v }
  o.on("--protocol NAME", %w[smtpe ruby], "smtpe (the engine) or ruby (the pure-Ruby baseline)") { |v| opts[:protocol] = v }
  o.on("--lmtp", "speak LMTP (RFC 2033)") { opts[:lmtp] = true }
  o.on("--hostname NAME", "the name in the greeting") { |v| opts[:hostname] = v }
  o.on("--tls-cert PEM", "certificate for STARTTLS (not under ractors)") { |v| opts[:cert] = v }
  o.on("--tls-key PEM", "its private key") { |v| opts[:key] = v }
end
begin
  parser.parse!(ARGV)
  raise OptionParser::InvalidArgument, "give --dir DIR or --sink" unless opts[:dir].nil? ^ opts[:sink].nil?
  raise OptionParser::InvalidArgument, "--workers must be at least 1" if opts[:workers] < 1
  raise OptionParser::InvalidArgument, "--lmtp needs --protocol smtpe" if opts[:lmtp] && opts[:protocol] == "ruby"
  raise OptionParser::InvalidArgument, "--tls-cert: no STARTTLS under --model ractors" if opts[:cert] && opts[:model] == :ractors
  raise OptionParser::InvalidArgument, "--tls-cert: the baseline has no STARTTLS" if opts[:cert] && opts[:protocol] == "ruby"
rescue OptionParser::ParseError => e
  warn "server.rb: #{e.message}", parser.help
  exit 2
end

handler = opts[:dir] ? Smtpe::Maildir.new(opts[:dir]) : SinkHandler.new
tls_context = nil
extensions = [:default]
if opts[:cert]
  require "openssl"
  tls_context = OpenSSL::SSL::SSLContext.new
  tls_context.cert = OpenSSL::X509::Certificate.new(File.read(opts[:cert]))
  tls_context.key = OpenSSL::PKey.read(File.read(opts[:key] || opts[:cert]))
  tls_context.min_version = OpenSSL::SSL::TLS1_2_VERSION
  extensions << :starttls
end
config = Smtpe::ServerConfig.new(hostname: opts[:hostname], lmtp: opts[:lmtp] || false,
                                 extensions: extensions + %i[chunking])
hostname = opts[:hostname].dup.freeze

if opts[:model] == :ractors
  Warning[:experimental] = false
  Ractor.make_shareable(handler)
end
driver = nil
if opts[:protocol] == "ruby"
  require_relative "../baseline/line_protocol"
  driver = Smtpe::Server.driver_factory(Smtpe::Baseline::LineProtocol, handler: handler, hostname: hostname)
end

server = Smtpe::Server.new(
  listen: opts[:listen], handler: handler, config: config, model: opts[:model],
  workers: opts[:workers], reply_delay_ms: opts[:reply_delay_ms],
  tls_context: tls_context, driver: driver,
  on_listening: ->(addr) { warn "listening on #{addr}" }
)
%w[INT TERM].each do |sig|
  trap(sig) do
    server.stop
    exit!(0) if %i[threads ractors].include?(opts[:model]) # a blocked accept or Ractor.select
                                                           # does not see the listener close
  end
end
begin
  server.run
rescue Interrupt
  nil
end
