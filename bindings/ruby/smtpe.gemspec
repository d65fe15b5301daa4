# frozen_string_literal: true

require_relative "lib/smtpe/version"

Gem::Specification.new do |s|
  s.name = "smtpe"
  s.version = Smtpe::VERSION
  s.summary = "The smtpe SMTP/LMTP engine (C, sans-I/O) for Ruby mail servers and clients"
  s.description = <<~TEXT
    smtpe's server and client SMTP engines as a native extension: the protocol in C (RFC 5321
    with PIPELINING, CHUNKING, SMTPUTF8, STARTTLS, AUTH, DSN, LMTP, PROXY), the I/O and the
    concurrency in Ruby. Ractor-safe and Fiber-friendly; a host layer runs a server under
    threads, Fibers (async), prefork or Ractors, and sends mail with per-recipient outcomes.
  TEXT
  s.authors = ["smtpe developers"]
  s.required_ruby_version = ">= 3.1"
  s.extensions = ["ext/smtpe/extconf.rb"]
  # the engine travels as its amalgamation (vendor.sh writes it before `gem build`)
  vendor = %w[ext/smtpe/vendor/smtpe.c ext/smtpe/vendor/smtpe.h]
  missing = vendor.reject { |f| File.exist?(File.join(__dir__, f)) }
  raise "smtpe.gemspec: run ./vendor.sh first (missing #{missing.join(", ")})" unless missing.empty?

  s.files = Dir.chdir(__dir__) do
    Dir["lib/**/*.rb", "ext/smtpe/*.{c,h,rb}", "examples/*.rb", "baseline/*.rb"] + vendor + %w[README.md]
  end
  s.require_paths = ["lib"]
end
