#!/usr/bin/env python3
"""The man pages man/smtpe-server.8 and man/smtpe-send.1 against the programs' --help.

The switch lists are taken from `smtpe-server --help` and `smtpe-send --help` at run time, never
from a list written here: switches are added on other branches all the time, and a new switch
without its entry in the man page must fail this test (as must an entry for a switch that is
gone). For each program:
  - the switches of --help (its option lines: two spaces, then --NAME) are exactly the .TP
    entries of the page's OPTIONS section, in the same order (the page groups them under .SS
    headings in --help's order); every --NAME the help text mentions is one of them;
  - every --NAME the page mentions anywhere (OPTIONS, EXAMPLES, ...) exists in --help;
  - the page renders with `groff -man -Tutf8 -ww -z` with no warning at all (and exit 0), and
    `man -l` renders its NAME section; its .TH names the project's version (--version);
  - with --build-dir, `cmake --install BUILD --prefix TMP` puts it, byte for byte, at
    TMP/share/man/man8/smtpe-server.8 and TMP/share/man/man1/smtpe-send.1 (CMAKE_INSTALL_MANDIR
    is share/man under a plain prefix). tests/integration/CMakeLists.txt passes --build-dir
    only when SMTPE_INSTALL is on: without it nothing is installed, man pages included.
Needs groff and man-db (groff-base and man-db are in tests/deps.sh). About 1 s; the install
copies the whole build's install set into a temporary directory.

Usage: test_manpages.py SERVER SEND --man-dir DIR [--build-dir BUILD] [--version X.Y.Z] [-q]
Only the Python 3 standard library is used.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ARGS = None

HELP_OPTION_LINE = re.compile(r"^  (--[a-z0-9][a-z0-9-]*)", re.M)
SWITCH = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
FONT = re.compile(r"\\f(?:[BIRP]|\[[A-Z]*\])")


def help_text(program):
    """PROGRAM --help's standard output (it must exit 0 and write nothing on stderr)."""
    r = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0 or r.stderr:
        raise AssertionError("%s --help: exit %d, stderr %r" % (program, r.returncode, r.stderr))
    return r.stdout


def plain(roff):
    """roff source with \\- as -, font escapes and \\& removed: what the switches look like."""
    return FONT.sub("", roff.replace("\\-", "-").replace("\\&", ""))


def sections(roff):
    """{.SH name: [lines]} of a page (the lines after each .SH up to the next)."""
    out, name = {}, None
    for line in roff.splitlines():
        if line.startswith(".SH "):
            name = line[4:].strip().strip('"')
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def tagged_switches(lines):
    """The switch each .TP entry of lines is tagged with (the first --NAME of the tag line), in
    order; a .TP whose tag names no switch is an error."""
    found = []
    for i, line in enumerate(lines):
        if line.strip() != ".TP":
            continue
        tag = plain(lines[i + 1]) if i + 1 < len(lines) else ""
        m = SWITCH.search(tag)
        if not m:
            raise AssertionError("OPTIONS: a .TP entry without a switch: %r" % tag)
        found.append(m.group(1))
    return found


def mentioned_switches(roff, program):
    """Every --NAME the page names as its program's switch: all of it but the command lines of
    EXAMPLES that run another program (smtpe-server(8) shows an smtpe-send). A command starts
    on a line that does not continue the one before (ending in \\e or |); its first word,
    after VAR=value assignments, is the program it runs."""
    found, in_examples, owner, cont = [], False, None, False
    for line in roff.splitlines():
        if line.startswith(".SH "):
            in_examples = line[4:].strip().strip('"') == "EXAMPLES"
            owner, cont = None, False
        text = plain(line).replace("\\e", "\\")
        if in_examples and not line.startswith("."):
            if not cont:
                words = [w for w in text.split() if not re.match(r"[A-Z_]+=", w)]
                owner = words[0] if words else None
            stripped = text.rstrip()
            cont = stripped.endswith("\\")  # after a final |, the next command starts
            if owner is not None and owner.startswith("smtpe") and owner != program:
                continue
        elif in_examples:
            owner, cont = None, False
        found += SWITCH.findall(text)
    return found


class PageCase:
    program_arg = None  # "server" or "send"
    page = None          # file name under --man-dir
    section = None       # "8" or "1"

    @classmethod
    def setUpClass(cls):
        cls.program = getattr(ARGS, cls.program_arg)
        cls.help = help_text(cls.program)
        cls.path = os.path.join(ARGS.man_dir, cls.page)
        with open(cls.path, encoding="utf-8") as f:
            cls.roff = f.read()

    def help_switches(self):
        switches = HELP_OPTION_LINE.findall(self.help)
        self.assertTrue(switches, "no option lines in --help")
        self.assertIn("--help", switches)
        return switches

    def test_help_mentions_only_its_switches(self):
        # The extraction's own check: a switch --help names but does not define on an option
        # line of its own (another indentation, say) would escape the comparison below.
        defined = set(self.help_switches())
        mentioned = set(SWITCH.findall(self.help))
        self.assertEqual(mentioned - defined, set(),
                         "--help mentions switches it has no option line for")

    def test_options_section_matches_help(self):
        secs = sections(self.roff)
        self.assertIn("OPTIONS", secs)
        in_page = tagged_switches(secs["OPTIONS"])
        in_help = self.help_switches()
        missing = [s for s in in_help if s not in in_page]
        stale = [s for s in in_page if s not in in_help]
        self.assertEqual(missing, [], "switches of --help with no .TP entry in %s's OPTIONS"
                         % self.page)
        self.assertEqual(stale, [], ".TP entries in %s's OPTIONS for switches --help lacks"
                         % self.page)
        self.assertEqual(len(in_page), len(set(in_page)), "a switch with two .TP entries")
        self.assertEqual(in_page, in_help, "OPTIONS is not in --help's order")

    def test_page_mentions_no_stale_switch(self):
        stale = set(mentioned_switches(self.roff, self.page.split(".")[0]))
        stale -= set(self.help_switches())
        self.assertEqual(stale, set(), "%s names switches --help lacks" % self.page)

    def test_sections(self):
        secs = sections(self.roff)
        for name in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES",
                     "STANDARDS", "SEE ALSO"):
            self.assertIn(name, secs)
        th = [l for l in self.roff.splitlines() if l.startswith(".TH ")]
        self.assertEqual(len(th), 1)
        self.assertTrue(th[0].startswith(".TH %s %s " % (self.page.split(".")[0].upper(),
                                                         self.section)), th[0])
        if ARGS.version:
            self.assertIn('"smtpe %s"' % ARGS.version, th[0])

    def test_groff_has_no_warning(self):
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", self.path],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))

    def test_man_renders(self):
        env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0", LC_ALL="C.UTF-8")
        r = subprocess.run(["man", "-l", "-Tutf8", self.path], capture_output=True, text=True,
                           timeout=30, env=env)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        name = self.page.split(".")[0]
        out = re.sub(".\b", "", r.stdout)  # overstrike bold and underline, as col -b would
        self.assertRegex(out, r"(?m)^NAME\n\s+%s\s+-\s+\S" % re.escape(name))

    def test_installed(self):
        if not ARGS.build_dir:
            self.skipTest("no --build-dir: SMTPE_INSTALL is off, nothing is installed")
        with tempfile.TemporaryDirectory(prefix="smtpe-man-") as prefix:
            r = subprocess.run(["cmake", "--install", ARGS.build_dir, "--prefix", prefix],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            dest = os.path.join(prefix, "share", "man", "man" + self.section, self.page)
            self.assertTrue(os.path.isfile(dest), "%s not installed" % dest)
            with open(dest, "rb") as a, open(self.path, "rb") as b:
                self.assertEqual(a.read(), b.read())


class ServerPage(PageCase, unittest.TestCase):
    program_arg, page, section = "server", "smtpe-server.8", "8"


class SendPage(PageCase, unittest.TestCase):
    program_arg, page, section = "send", "smtpe-send.1", "1"


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server")
    p.add_argument("send")
    p.add_argument("--man-dir", required=True)
    p.add_argument("--build-dir")
    p.add_argument("--version")
    p.add_argument("-q", action="store_true")
    ARGS, rest = p.parse_known_args()
    for tool in ("groff", "man"):
        if shutil.which(tool) is None:
            sys.exit("test_manpages.py: %s not found (tests/deps.sh installs groff-base, man-db)"
                     % tool)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=1 if ARGS.q else 2)


if __name__ == "__main__":
    main()
