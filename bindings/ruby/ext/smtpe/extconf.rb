# frozen_string_literal: true

# Builds smtpe's Ruby extension. The engine is compiled into the extension itself from the
# amalgamation in vendor/ (bindings/ruby/vendor.sh writes it from the project's sources; a
# built gem carries it), with every engine symbol hidden: the shared object exports Init_smtpe
# only, so it can sit in one process beside another copy of smtpe (a libsmtpe.so, another
# extension) without either binding to the other's functions. Needs ruby-dev and a C11
# compiler, nothing else.
require "mkmf"

# CC=clang (or any compiler) from the environment, as the tests' clang and sanitizer builds use
if ENV["CC"] && !ENV["CC"].empty?
  RbConfig::MAKEFILE_CONFIG["CC"] = ENV["CC"] # the Makefile
  RbConfig::CONFIG["CC"] = ENV["CC"]          # mkmf's own test compiles
end

vendor = File.join(__dir__, "vendor")
unless File.exist?(File.join(vendor, "smtpe.c"))
  abort "smtpe: #{vendor}/smtpe.c is missing; run bindings/ruby/vendor.sh first"
end

$INCFLAGS << " -I$(srcdir)/vendor"
$CFLAGS << " -std=gnu11 -fvisibility=hidden -Wall -Wextra -Wno-unused-parameter"
$CFLAGS << " -Werror" if ENV["SMTPE_WERROR"] == "1"
$CFLAGS << " #{ENV["SMTPE_EXTRA_CFLAGS"]}" if ENV["SMTPE_EXTRA_CFLAGS"]
$LDFLAGS << " #{ENV["SMTPE_EXTRA_LDFLAGS"]}" if ENV["SMTPE_EXTRA_LDFLAGS"]
# Every rb_*.c of this directory; SMTPE_EXT_SKIP="rb_x.c ..." leaves some out (development).
skip = ENV.fetch("SMTPE_EXT_SKIP", "").split
$srcs = Dir[File.join(__dir__, "rb_*.c")].map { |f| File.basename(f) }.sort - skip
have_header("arpa/inet.h")
create_makefile("smtpe/smtpe")
