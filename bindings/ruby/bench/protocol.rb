# frozen_string_literal: true

# The protocol alone, without I/O: server CPU and objects per session of the study's session
# (EHLO, MAIL, one RCPT, DATA with 4 KB in 76-octet lines, QUIT; fed as a client sends it, one
# piece per command) through Smtpe::ServerDriver (the engine) and through the pure-Ruby
# baseline (baseline/line_protocol.rb), in one run, rounds alternating, with the ratio. What the
# engine changes, apart from the host's own cost (sockets, Threads, Fibers) that both share.
#   ruby -I EXT -I bindings/ruby/lib bindings/ruby/bench/protocol.rb [SESSIONS [ROUNDS]]
require "smtpe"
require_relative "../baseline/line_protocol"

sessions = Integer(ARGV[0] || 20_000)
rounds = Integer(ARGV[1] || 5)
body = ("#{"x" * 74}\r\n" * 53).b
pieces = ["EHLO loadgen\r\n", "MAIL FROM:<a@b.example>\r\n", "RCPT TO:<c@d.example>\r\n", "DATA\r\n",
          "#{body}.\r\n", "QUIT\r\n"].map(&:b)
config = Smtpe::ServerConfig.new
handler = Smtpe::Handler.new
drivers = {
  "smtpe" => -> { Smtpe::ServerDriver.new(config: config, handler: handler, peer: "192.0.2.1:1") },
  "ruby" => -> { Smtpe::Baseline::LineProtocol.new(handler: handler, peer: "192.0.2.1:1") }
}

def run(make, pieces, sessions)
  GC.start
  objects = GC.stat(:total_allocated_objects)
  t0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  sessions.times do
    d = make.call
    d.start(0)
    pieces.each { |p| d.receive(p, 0) }
  end
  cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - t0
  [cpu * 1e6 / sessions, (GC.stat(:total_allocated_objects) - objects).to_f / sessions]
end

drivers.each_value { |m| run(m, pieces, 1000) } # warm-up
results = Hash.new { |h, k| h[k] = [] }
rounds.times { drivers.each { |name, make| results[name] << run(make, pieces, sessions) } }
median = ->(a) { a.sort[a.size / 2] }
us = results.transform_values { |r| median.(r.map(&:first)) }
objs = results.transform_values { |r| r.first.last }
printf("%-6s %10s %12s\n", "", "us/session", "objects")
us.each_key { |k| printf("%-6s %10.1f %12.1f\n", k, us[k], objs[k]) }
ratios = results["smtpe"].zip(results["ruby"]).map { |a, b| a.first / b.first }
printf("smtpe/ruby CPU per session: %.2f (median of %d rounds; rounds %.2f-%.2f)\n",
       median.(ratios), rounds, ratios.min, ratios.max)
