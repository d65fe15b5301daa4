# frozen_string_literal: true

# table.rb: the tables of bindings/ruby/bench/run.sh's results.md, from its results.csv.
#   usage: ruby table.rb results.csv [--plot-data FILE]
# Prints Markdown on stdout: the rows (with the smtpe/ruby CPU ratio and sessions/s per busy
# core), the study's prefork + Fibers figure beside the prefork rows, and the goals with their
# verdicts. --plot-data writes the data of plot.gp: one line per server configuration, its
# label, then sessions/s, server CPU us/session and peak RSS MiB, each without a reply delay and
# with one (NaN where there is no such row or it is n/a).
require "csv"

STUDY_PER_CORE = 3108 # the Ruby study: prefork + Fibers, 12 430 sessions/s on 4 vCPU
CPU_RATIO_GOAL = 0.5

csv_path = ARGV.shift or abort("usage: ruby table.rb results.csv [--plot-data FILE]")
plot_path = nil
while (a = ARGV.shift)
  case a
  when "--plot-data" then plot_path = ARGV.shift or abort("table.rb: --plot-data wants a file")
  else abort("table.rb: unknown argument #{a}")
  end
end

Row = Struct.new(:server, :model, :workers, :protocol, :conc, :delay, :sessions, :failed, :sps,
                 :p50, :p95, :p99, :cpu_us, :cpu_s, :wall_s, :rss, :peak, :client_cpu, :note) do
  def ran? = sps != "n/a"
  def ruby? = server == "ruby"
  def f(name) = (v = self[name]).nil? || v == "n/a" || v.empty? ? nil : Float(v)
  def busy = (c = f(:cpu_s)) && (w = f(:wall_s)) && w.positive? ? c / w : nil
  def per_core = (b = busy) && b.positive? ? f(:sps) / b : nil
  def load = [conc, delay]
  def load_text = delay.to_s.empty? ? "#{conc}" : "#{conc} + #{delay} ms"
  def label = ruby? ? "#{model} #{protocol}" : "C #{model}"
  def who = ruby? ? "server.rb #{model} --protocol #{protocol}" : "smtpe-server #{model}"
end

# The CSV's column names, in Row's order.
COLUMNS = %w[server model workers protocol concurrency reply_delay_ms sessions failed sessions_per_s
             p50_ms p95_ms p99_ms server_cpu_us_per_session server_cpu_s wall_s server_peak_rss_mib
             peak_concurrency client_cpu_s note].freeze
table = CSV.read(csv_path, headers: true)
missing = COLUMNS - table.headers
abort("table.rb: #{csv_path} lacks the columns #{missing.join(', ')}") unless missing.empty?
rows = table.map { |r| Row.new(*COLUMNS.map { |c| r[c].to_s }) }

def fmt(v, digits = 1) = v.nil? ? "n/a" : format("%.#{digits}f", v)
def cell(s) = s.to_s.empty? ? "-" : s.to_s.gsub("|", "\\|")

# smtpe/ruby CPU ratio per Ruby model and load.
baseline = rows.select { |r| r.ruby? && r.protocol == "ruby" }.to_h { |r| [[r.model, r.load], r] }
ratio = lambda do |r|
  b = baseline[[r.model, r.load]]
  a = r.f(:cpu_us)
  bb = b&.f(:cpu_us)
  a && bb && bb.positive? ? a / bb : nil
end

puts "| server | model | protocol | workers | concurrency | reply delay ms | sessions | failed | " \
     "sessions/s | p50 ms | p99 ms | server CPU µs/session | smtpe/ruby CPU | sessions/s per busy core | " \
     "server peak RSS MiB | most open at once | note |"
puts "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
rows.each do |r|
  rat = r.ruby? && r.protocol == "smtpe" ? fmt(ratio.(r), 2) : "-"
  rat = "**#{rat}**" if r.ruby? && r.protocol == "smtpe" && ratio.(r)
  puts "| #{r.ruby? ? 'server.rb' : 'smtpe-server'} | #{r.model} | #{r.ruby? ? r.protocol : 'C'} | " \
       "#{cell(r.workers)} | #{r.conc} | #{cell(r.delay)} | #{r.sessions} | #{r.failed} | " \
       "#{fmt(r.f(:sps), 0)} | #{fmt(r.f(:p50))} | #{fmt(r.f(:p99))} | #{fmt(r.f(:cpu_us))} | #{rat} | " \
       "#{fmt(r.per_core, 0)} | #{fmt(r.f(:rss))} | #{r.ran? ? cell(r.peak) : 'n/a'} | #{cell(r.note)} |"
end

# ---- against the study ------------------------------------------------------------------------
prefork = rows.select { |r| %w[prefork reuseport].include?(r.model) }
puts
puts "## Against the Ruby study"
puts
puts "The study's best figure was prefork + Fibers at 10 000 concurrent clients with a 10 ms " \
     "delay before each reply: 12 430 sessions/s on 4 vCPU, i.e. #{STUDY_PER_CORE} per core " \
     "assuming all four busy (it gives no CPU time, so that is a lower bound for it). Here: " \
     "sessions/s divided by the cores the server kept busy on average (server CPU seconds / " \
     "wall seconds of the measured run, both given); server and load generator share this machine."
puts
puts "| server | load | most open at once | sessions/s | p99 | peak RSS | server CPU s / wall s | " \
     "avg server cores busy | sessions/s per busy core |"
puts "|---|---|---:|---:|---:|---:|---:|---:|---:|"
puts "| Ruby study: prefork + Fibers | 10000 + 10 ms, 4 vCPU | 10000 | 12430 | 0.44 s | 317 MB | n/a | " \
     "4 (assumed) | #{STUDY_PER_CORE} |"
prefork.each do |r|
  if r.ran?
    puts "| #{r.who} | #{r.load_text} | #{cell(r.peak)} | #{fmt(r.f(:sps), 0)} | " \
         "#{fmt(r.f(:p99) / 1000, 3)} s | #{fmt(r.f(:rss))} MiB | #{fmt(r.f(:cpu_s), 2)} / #{fmt(r.f(:wall_s), 2)} | " \
         "#{fmt(r.busy, 2)} | #{fmt(r.per_core, 0)} |"
  else
    puts "| #{r.who} | #{r.load_text} | n/a | n/a | n/a | n/a | n/a | n/a | n/a |"
  end
end

# ---- goals ------------------------------------------------------------------------------------
def verdict(ok, incomplete) = ok ? (incomplete ? "**met where measured** (incomplete)" : "**met**") : "**not met**"

puts
puts "## Goals"
puts
loads = rows.map(&:load).uniq
models = rows.select(&:ruby?).map(&:model).uniq
smtpe_rows = rows.select { |r| r.ruby? && r.protocol == "smtpe" }

puts "1. Server CPU per session with smtpe <= #{CPU_RATIO_GOAL} x the pure-Ruby baseline, on every model."
puts
load_name = ->(ld) { ld[1].empty? ? "c#{ld[0]}" : "c#{ld[0]} + #{ld[1]} ms" }
puts "   | model | #{loads.map(&load_name).join(' | ')} |"
puts "   |---|#{loads.map { '---:' }.join('|')}|"
bad1 = []
gaps1 = []
models.each do |m|
  cells = loads.map do |ld|
    r = smtpe_rows.find { |x| x.model == m && x.load == ld }
    v = r && ratio.(r)
    gaps1 << "#{m} #{load_name.(ld)}" if v.nil?
    bad1 << "#{m} #{load_name.(ld)} (#{fmt(v, 2)})" if v && v > CPU_RATIO_GOAL
    v.nil? ? "n/a" : fmt(v, 2)
  end
  puts "   | #{m} | #{cells.join(' | ')} |"
end
puts
puts "   Verdict: #{verdict(bad1.empty? && !models.empty?, !gaps1.empty?)}" \
     "#{bad1.empty? ? '' : "; above #{CPU_RATIO_GOAL}: #{bad1.join(', ')}"}" \
     "#{gaps1.empty? ? '' : "; no ratio (a row n/a or missing): #{gaps1.join(', ')}"}."
puts

study_load = ["10000", "10"]
pf = smtpe_rows.select { |r| r.model == "prefork" }
judged = pf.select { |r| r.load == study_load }
judged = pf if judged.empty?
puts "2. Prefork with smtpe, sessions/s per busy server core >= the study's #{STUDY_PER_CORE}" \
     "#{judged.equal?(pf) ? ' (no row at the study\'s setting, 10000 + 10 ms: judged on what there is)' : ', at the study\'s setting (10000 + 10 ms)'}."
puts
pf.each { |r| puts "   - #{r.load_text}: #{r.ran? ? "#{fmt(r.per_core, 0)} sessions/s per busy core (#{fmt(r.f(:sps), 0)} sessions/s on #{fmt(r.busy, 2)} cores)" : r.note}" }
vals = judged.map(&:per_core)
puts
puts "   Verdict: #{judged.empty? || vals.all?(&:nil?) ? '**not measured**' : verdict(vals.compact.all? { |v| v >= STUDY_PER_CORE }, vals.include?(nil))}."
puts

engine = rows.select { |r| !r.ruby? || r.protocol == "smtpe" }
failed = engine.select { |r| r.ran? && r.failed != "0" }
na = engine.reject(&:ran?)
puts "3. Zero failed sessions (the rows that run the engine: server.rb --protocol smtpe and smtpe-server)."
puts
failed.each { |r| puts "   - #{r.who} #{r.load_text}: #{r.failed} of #{r.sessions} failed" }
na.each { |r| puts "   - #{r.who} #{r.load_text}: did not run (#{r.note})" }
puts if failed.any? || na.any?
puts "   Verdict: #{engine.empty? ? '**not measured**' : verdict(failed.empty?, na.any?)}."
base_failed = rows.select { |r| r.ruby? && r.protocol == "ruby" && r.ran? && r.failed != "0" }
unless base_failed.empty?
  puts
  puts "   The baseline failed sessions too (no goal): " +
       base_failed.map { |r| "#{r.model} #{r.load_text} #{r.failed}/#{r.sessions}" }.join(", ") + "."
end

# ---- plot data --------------------------------------------------------------------------------
if plot_path
  configs = rows.map(&:label).uniq
  File.open(plot_path, "w") do |out|
    configs.each do |label|
      pick = ->(delayed) { rows.find { |r| r.label == label && r.delay.empty? != delayed && r.ran? } }
      plain = pick.(false)
      slow = pick.(true)
      vals = %i[sps cpu_us rss].flat_map { |k| [plain, slow].map { |r| r&.f(k) || "NaN" } }
      out.puts(["\"#{label}\"", *vals].join(" "))
    end
  end
end
