# frozen_string_literal: true

# The gem as a user gets it: `gem build` in a copy of bindings/ruby, `gem install --local` into
# a temporary GEM_HOME (compiling the extension from the vendored amalgamation), then a clean
# Ruby process that finds it only through that GEM_HOME requires it and runs a session.
require "minitest/autorun"
require "open3"
require "rbconfig"
require "tmpdir"
require "fileutils"

class TestGem < Minitest::Test
  ROOT = File.expand_path("..", __dir__)

  def run_cmd(env, *cmd, chdir:)
    out, status = Open3.capture2e(env, *cmd, chdir: chdir)
    assert status.success?, "#{cmd.join(" ")} failed:\n#{out}"
    out
  end

  def test_build_install_require
    Dir.mktmpdir("smtpe-gem") do |tmp|
      system(File.join(ROOT, "vendor.sh"), out: File::NULL) or flunk "vendor.sh failed"
      src = File.join(tmp, "src")
      FileUtils.mkdir_p(src)
      %w[smtpe.gemspec README.md lib ext examples baseline].each { |f| FileUtils.cp_r(File.join(ROOT, f), src) }
      FileUtils.rm_rf(Dir[File.join(src, "ext/smtpe/*.{o,so}")])
      env = { "GEM_HOME" => File.join(tmp, "gems"), "GEM_PATH" => File.join(tmp, "gems"),
              "RUBYLIB" => nil, "RUBYOPT" => nil }
      run_cmd(env, "gem", "build", "smtpe.gemspec", chdir: src)
      gem = Dir[File.join(src, "smtpe-*.gem")].first
      refute_nil gem
      run_cmd(env, "gem", "install", "--local", "--no-document", gem, chdir: tmp)
      script = <<~RUBY
        require "smtpe"
        cfg = Smtpe::ServerConfig.new(hostname: "gem.test")
        s = Smtpe::ServerSession.new(cfg, 0)
        out = +""
        s.take_output(out)
        inbuf = +"HELO x\\r\\nQUIT\\r\\n"
        while (ev = s.feed(inbuf, 0)); s.accept if s.want_verdict?; end
        s.take_output(out)
        print Smtpe.engine_version, " ", $LOADED_FEATURES.grep(/smtpe\\.so/).first, " ", out.inspect
      RUBY
      out = run_cmd(env, RbConfig.ruby, "--disable-gems", "-e", "require 'rubygems'; #{script}", chdir: tmp)
      assert_includes out, "220 gem.test ESMTP smtpe\\r\\n250 gem.test\\r\\n221 2.0.0 Bye\\r\\n"
      assert_includes out, File.join(tmp, "gems")
      so = Dir[File.join(tmp, "gems", "**", "smtpe.so")].first
      exported = `nm -D --defined-only #{so}`.lines.map { |l| l.split.last }.reject { |n| n.start_with?("_") }
      assert_equal ["Init_smtpe"], exported, "the engine's symbols stay hidden"
    end
  end
end
