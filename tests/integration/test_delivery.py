#!/usr/bin/env python3
"""Delivery tests (issue 14): one copy per mailbox, LF line ends.

smtpe-server with a --maildir template (DIR/mail/{domain}/{local}) driven by smtplib, a raw
socket (BDAT, LMTP), a private Postfix relaying into it (peers.py) and s-nail reading what it
stored. What is checked, octet for octet:
  - each distinct mailbox gets one file in its own new/, starting with its own
    "Delivered-To: local@domain" line; after that line every copy is the same; recipients that
    map to one mailbox share its copy; copies are separate files (distinct inodes), and with
    --no-delivered-to hard links of one file (one inode, no Delivered-To); a mailbox on
    another file system (/dev/shm) still gets a whole copy (link(2) and copy_file_range(2)
    refused with EXDEV: the fallback copy);
  - line ends: LF by default (the content as sent with every CRLF made LF, no CR left; the
    trace headers and Delivered-To in LF too); --maildir-crlf keeps the wire form; BODY=
    BINARYMIME content is stored as it came, with CRLF trace headers;
  - mailbox names: lower-cased; '/', '%', ':' and a leading '.' as %XX, so an unsafe local-part
    stays inside its domain's directory; <postmaster> in the --hostname domain; address
    literals as the domain directory; a path too long for a directory gets 553 5.1.3 at RCPT;
  - failures: under LMTP the recipient whose mailbox cannot be made gets 451 and the others 250
    (whichever recipient comes first); under SMTP one such mailbox gives 451 and no copy is left
    in any mailbox;
  - Postfix relays a message for two users into smtpe-server and logs status=sent for both;
  - s-nail (batch mode) reads a stored message: its Subject and body, no header complaint.

Usage: test_delivery.py [SERVER] [test_server.py's options]. Needs root for Postfix (peers.py)
and s-nail (tests/deps.sh installs both); without them their tests fail.
"""

import glob
import os
import shutil
import smtplib
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402
import peers  # noqa: E402

HOST = ts.HOST  # "mx.example", the --hostname of every server here
TEMPLATE = "{dir}/mail/{domain}/{local}"
MSG = (b"From: Alice <a@example.org>\r\nTo: several\r\nSubject: one copy each\r\n"
       b"Message-ID: <d1@example.org>\r\n\r\nHello,\r\n.dotted line\r\n\r\nbye\r\n")


def lf(data):
    """The documented conversion of the default store: every CRLF becomes LF."""
    return data.replace(b"\r\n", b"\n")


class Base(ts.Base):
    def start_tmpl(self, *args, crlf=False):
        srv = self.start(*args, maildir=TEMPLATE, crlf=crlf)
        srv.mail = os.path.join(srv.dir, "mail")
        return srv

    def box(self, srv, domain, local):
        return os.path.join(srv.mail, domain, local)

    def box_files(self, srv, domain, local, sub="new"):
        d = os.path.join(self.box(srv, domain, local), sub)
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def all_files(self, srv):
        """Every regular file under the mail root (relative paths)."""
        out = []
        for root, _, files in os.walk(srv.mail):
            out += [os.path.relpath(os.path.join(root, f), srv.mail) for f in files]
        return sorted(out)

    def read_copy(self, srv, domain, local, qid):
        names = self.box_files(srv, domain, local)
        self.assertEqual(len(names), 1, "%s/%s: expected one file in new/, found %r"
                         % (domain, local, names))
        self.assertEqual(self.box_files(srv, domain, local, "tmp"), [], "files left in tmp/")
        self.assertEqual(names[0].split(".")[1], qid)
        path = os.path.join(self.box(srv, domain, local), "new", names[0])
        with open(path, "rb") as f:
            return path, f.read()

    def split_delivered_to(self, data, eol):
        first, sep, rest = data.partition(eol)
        self.assertTrue(first.startswith(b"Delivered-To: "), "no Delivered-To first: %r"
                        % data[:80])
        return first[len(b"Delivered-To: "):], rest

    def check_trace(self, rest, eol, sender):
        """rest: Return-Path, Received (folded with eol + TAB), content. Returns the content."""
        rp = b"Return-Path: <%s>%s" % (sender, eol)
        self.assertTrue(rest.startswith(rp), "no %r: %r" % (rp, rest[:80]))
        rest = rest[len(rp):]
        self.assertTrue(rest.startswith(b"Received: from "), rest[:80])
        pos = 0
        while True:
            j = rest.index(eol, pos)
            pos = j + len(eol)
            if rest[pos:pos + 1] != b"\t":
                return rest[pos:]

    def sendmail(self, srv, sender, rcpts, msg):
        with smtplib.SMTP("127.0.0.1", srv.port, timeout=ts.SAFETY) as s:
            s.ehlo("client.example")
            s.mail(sender)
            for r in rcpts:
                code, text = s.rcpt(r)
                self.assertEqual(code, 250, (r, text))
            code, text = s.data(msg)
            self.assertEqual(code, 250, text)
            return ts.queue_id("%d %s" % (code, text.decode()))


class TestTemplate(Base):
    def test_three_users_two_domains_one_duplicate(self):
        srv = self.start_tmpl()
        qid = self.sendmail(srv, "a@example.org",
                            ["alice@one.test", "Bob@One.TEST", "carol@two.test",
                             "ALICE@one.test"], MSG)
        want = lf(ts.smtplib_expected(MSG))
        bodies, inodes = {}, set()
        for dom, loc in (("one.test", "alice"), ("one.test", "bob"), ("two.test", "carol")):
            path, data = self.read_copy(srv, dom, loc, qid)
            self.assertNotIn(b"\r", data, "a CR in the default (LF) store")
            addr, rest = self.split_delivered_to(data, b"\n")
            self.assertEqual(addr, ("%s@%s" % (loc, dom)).encode())
            self.assertNotIn(b"Delivered-To", rest)
            self.assert_content(self.check_trace(rest, b"\n", b"a@example.org"), want)
            bodies[loc] = rest
            inodes.add(os.stat(path).st_ino)
            for sub in ("tmp", "new", "cur"):
                st = os.stat(os.path.join(self.box(srv, dom, loc), sub))
                self.assertEqual(st.st_mode & 0o777, 0o700, sub)
        self.assertEqual(len(set(bodies.values())), 1, "copies differ after Delivered-To")
        self.assertEqual(len(inodes), 3, "copies must be separate files")
        self.assertEqual(len(self.all_files(srv)), 3, self.all_files(srv))
        self.assertIn("nrcpt=4", srv.wait_log(lambda l: ts.is_message(l, qid)))

    def test_no_delivered_to_hard_links(self):
        srv = self.start_tmpl("--no-delivered-to")
        qid = self.sendmail(srv, "a@example.org", ["alice@one.test", "bob@one.test",
                                                    "carol@two.test"], MSG)
        paths = []
        for dom, loc in (("one.test", "alice"), ("one.test", "bob"), ("two.test", "carol")):
            path, data = self.read_copy(srv, dom, loc, qid)
            self.assertFalse(data.startswith(b"Delivered-To"), data[:60])
            self.assert_content(self.check_trace(data, b"\n", b"a@example.org"),
                                lf(ts.smtplib_expected(MSG)))
            paths.append(path)
        st = [os.stat(p) for p in paths]
        self.assertEqual(len({s.st_ino for s in st}), 1, "not hard links of one file")
        self.assertEqual(st[0].st_nlink, 3)

    def test_copies_across_file_systems(self):
        # two.test on another file system (/dev/shm, tmpfs): link(2) fails with EXDEV and
        # copy_file_range(2) may too; either way each copy must be whole
        other = self.other_fs_dir()
        for extra in ((), ("--no-delivered-to",)):
            srv = self.start_tmpl(*extra)
            os.makedirs(srv.mail)
            target = os.path.join(other, "two.test-%d" % len(extra))
            os.mkdir(target)
            os.symlink(target, os.path.join(srv.mail, "two.test"))
            rcpts = ["alice@one.test", "carol@two.test"]
            qid = self.sendmail(srv, "a@example.org", rcpts, MSG)
            want = lf(ts.smtplib_expected(MSG))
            for dom, loc in (("one.test", "alice"), ("two.test", "carol")):
                _, data = self.read_copy(srv, dom, loc, qid)
                if extra:
                    self.assertFalse(data.startswith(b"Delivered-To"))
                    rest = data
                else:
                    addr, rest = self.split_delivered_to(data, b"\n")
                    self.assertEqual(addr, ("%s@%s" % (loc, dom)).encode())
                self.assert_content(self.check_trace(rest, b"\n", b"a@example.org"), want)

    def other_fs_dir(self):
        shm = "/dev/shm"
        self.assertTrue(os.path.isdir(shm), "no /dev/shm")
        self.assertNotEqual(os.stat(shm).st_dev, os.stat(os.path.dirname(
            ts.tempfile.gettempdir() + "/")).st_dev, "/dev/shm on the same file system")
        d = ts.tempfile.mkdtemp(prefix="smtpe-dlv-", dir=shm)
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_maildir_crlf_keeps_the_wire_form(self):
        srv = self.start_tmpl("--maildir-crlf")
        qid = self.sendmail(srv, "a@example.org", ["alice@one.test", "bob@two.test"], MSG)
        for dom, loc in (("one.test", "alice"), ("two.test", "bob")):
            _, data = self.read_copy(srv, dom, loc, qid)
            addr, rest = self.split_delivered_to(data, b"\r\n")
            self.assertEqual(addr, ("%s@%s" % (loc, dom)).encode())
            self.assert_content(self.check_trace(rest, b"\r\n", b"a@example.org"),
                                ts.smtplib_expected(MSG))
            self.assertNotIn(b"\n", data.replace(b"\r\n", b""), "a bare LF in the CRLF store")

    def test_single_maildir_lf_without_delivered_to(self):
        # without {domain}/{local}: today's one Maildir, one file for all, LF line ends
        srv = self.start(crlf=False)
        with smtplib.SMTP("127.0.0.1", srv.port, timeout=ts.SAFETY) as s:
            s.sendmail("a@example.org", ["x@one.test", "y@two.test"], MSG)
        (name, data), = srv.messages()
        self.assertTrue(data.startswith(b"Return-Path: <a@example.org>\n"), data[:60])
        self.assertNotIn(b"\r", data)
        self.assert_content(self.check_trace(data, b"\n", b"a@example.org"),
                            lf(ts.smtplib_expected(MSG)))

    def test_binarymime_stored_as_received(self):
        srv = self.start_tmpl()
        binary = (b"Subject: bin\r\nMIME-Version: 1.0\r\nContent-Type: application/octet-stream"
                  b"\r\n\r\n\x00\x01\r\n\nbare LF\rbare CR\r\n\xff\r\n")
        text = b"Subject: chunked text\r\n\r\nline\r\nCR at a chunk end\r"
        c = self.client(srv)
        ehlo = c.ehlo()
        self.assertIn("250-BINARYMIME", ehlo.lines)
        c.cmd("MAIL FROM:<b@example.org> BODY=BINARYMIME", 250)
        c.cmd("RCPT TO:<alice@one.test>", 250)
        c.cmd("RCPT TO:<bob@one.test>", 250)
        c.send(b"BDAT %d\r\n" % 20 + binary[:20])
        c.expect(250)
        rest = binary[20:]
        c.send(b"BDAT %d LAST\r\n" % len(rest) + rest)
        qid1 = ts.queue_id(c.expect(250).text)
        # the same server, BDAT without BINARYMIME: converted, a CRLF split across chunks too
        c.cmd("MAIL FROM:<b@example.org>", 250)
        c.cmd("RCPT TO:<alice@one.test>", 250)
        c.send(b"BDAT %d\r\n" % len(text) + text)
        c.expect(250)
        last = b"\ntwo\r\nthree\r\n"
        c.send(b"BDAT %d LAST\r\n" % len(last) + last)
        qid2 = ts.queue_id(c.expect(250).text)
        c.cmd("QUIT", 221)
        for loc in ("alice", "bob"):
            path = os.path.join(self.box(srv, "one.test", loc), "new")
            name, = [n for n in os.listdir(path) if n.split(".")[1] == qid1]
            with open(os.path.join(path, name), "rb") as f:
                data = f.read()
            addr, rest = self.split_delivered_to(data, b"\r\n")
            self.assertEqual(addr, ("%s@one.test" % loc).encode())
            self.assert_content(self.check_trace(rest, b"\r\n", b"b@example.org"), binary)
        path = os.path.join(self.box(srv, "one.test", "alice"), "new")
        name, = [n for n in os.listdir(path) if n.split(".")[1] == qid2]
        with open(os.path.join(path, name), "rb") as f:
            data = f.read()
        _, rest = self.split_delivered_to(data, b"\n")
        self.assert_content(self.check_trace(rest, b"\n", b"b@example.org"),
                            b"Subject: chunked text\n\nline\nCR at a chunk end\ntwo\nthree\n")


class TestMailboxNames(Base):
    def test_postmaster_and_address_literals(self):
        srv = self.start_tmpl()
        qid = self.sendmail(srv, "a@example.org",
                            ["postmaster", "u@[192.0.2.1]", "V@[IPv6:2001:db8::1]"], MSG)
        for dom, loc, addr in ((HOST, "postmaster", "postmaster@" + HOST),
                               ("[192.0.2.1]", "u", "u@[192.0.2.1]"),
                               ("[ipv6%3A2001%3Adb8%3A%3A1]", "v", "v@[ipv6:2001:db8::1]")):
            _, data = self.read_copy(srv, dom, loc, qid)
            self.assertEqual(self.split_delivered_to(data, b"\n")[0], addr.encode())

    def test_unsafe_local_parts_stay_in_their_domain(self):
        srv = self.start_tmpl()
        rcpts = ['"../x"@two.test', "a/b@two.test", '".hidden"@two.test', "100%@two.test",
                 '"joe"@two.test', "JOE@two.test"]
        qid = self.sendmail(srv, "a@example.org", rcpts, MSG)
        names = {"%2E.%2Fx": b'"../x"@two.test', "a%2Fb": b"a/b@two.test",
                 "%2Ehidden": b'".hidden"@two.test', "100%25": b"100%@two.test",
                 "joe": b'"joe"@two.test'}  # "joe" and JOE: one mailbox, the first's address
        self.assertEqual(sorted(os.listdir(os.path.join(srv.mail, "two.test"))), sorted(names))
        self.assertEqual(os.listdir(srv.mail), ["two.test"])
        for loc, addr in names.items():
            _, data = self.read_copy(srv, "two.test", loc, qid)
            self.assertEqual(self.split_delivered_to(data, b"\n")[0], addr)
        self.assertEqual(len(self.all_files(srv)), len(names), self.all_files(srv))

    def test_path_too_long_refused_at_rcpt(self):
        # a local-part is at most 64 octets (the engine refuses longer), 192 as %XX: a
        # component too long for NAME_MAX (255) needs template text around it
        srv = self.start("--maildir-crlf", maildir="{dir}/mail/{local}.{domain}", crlf=False)
        srv.mail = os.path.join(srv.dir, "mail")
        dom = "a" * 63 + "." + "b" * 20 + ".example"  # 92 octets
        c = self.client(srv)
        c.ehlo()
        c.cmd("MAIL FROM:<a@example.org>", 250)
        c.cmd('RCPT TO:<"%s"@%s>' % ("/" * 20, dom), 250)  # 60 + 1 + 92 octets
        r = c.cmd('RCPT TO:<"%s"@%s>' % ("/" * 62, dom), 553)  # 186 + 1 + 92: over
        self.assertEqual(r.text, "553 5.1.3 Mailbox name not allowed")
        c.cmd("RCPT TO:<alice@%s>" % dom, 250)
        c.cmd("DATA", 354)
        qid = self.finish_data(c, b"Subject: t\r\n\r\nx\r\n")
        c.cmd("QUIT", 221)
        self.assertEqual(sorted(os.listdir(srv.mail)),
                         sorted(["%s.%s" % ("%2F" * 20, dom), "alice." + dom]))
        self.assertEqual(len(self.all_files(srv)), 2, self.all_files(srv))
        self.assertTrue(srv.wait_log(lambda l: ts.is_message(l, qid) and "nrcpt=2" in l))


class TestFailures(Base):
    def break_box(self, srv, domain, local):
        """Makes the mailbox impossible to create: a regular file where its directory goes
        (works as root too, where modes do not stop anyone)."""
        os.makedirs(os.path.join(srv.mail, domain), exist_ok=True)
        with open(self.box(srv, domain, local), "w") as f:
            f.write("not a directory\n")

    def test_lmtp_each_recipient_its_own_result(self):
        srv = self.start_tmpl("--lmtp")
        self.break_box(srv, "one.test", "bob")
        c = self.client(srv)
        c.cmd("LHLO client.example", 250)
        for order in (("alice", "bob", "carol"), ("bob", "alice", "carol")):
            c.cmd("MAIL FROM:<a@example.org>", 250)
            for loc in order:
                c.cmd("RCPT TO:<%s@one.test>" % loc, 250)
            c.cmd("DATA", 354)
            c.send(b"Subject: lmtp\r\n\r\nbody\r\n.\r\n")
            qid = None
            for loc in order:
                r = c.reply()
                self.assertIn("<%s@one.test>" % loc, r.text)
                if loc == "bob":
                    self.assertEqual(r.code, 451, r.text)
                else:
                    self.assertEqual(r.code, 250, r.text)
                    qid = ts.queue_id(r.text.replace("<%s@one.test> " % loc, ""))
            for loc in ("alice", "carol"):
                names = [n for n in self.box_files(srv, "one.test", loc)
                         if n.split(".")[1] == qid]
                self.assertEqual(len(names), 1, (loc, self.box_files(srv, "one.test", loc)))
        c.cmd("QUIT", 221)
        self.assertEqual(len(self.all_files(srv)), 5, self.all_files(srv))  # 4 copies + the file
        self.assertTrue(srv.wait_log(lambda l: "status=partly-queued" in l))

    def test_smtp_one_failure_leaves_no_copy(self):
        srv = self.start_tmpl()
        self.break_box(srv, "one.test", "bob")
        for rcpts in (["alice@one.test", "bob@one.test", "carol@two.test"],
                      ["bob@one.test", "alice@one.test", "carol@two.test"]):
            with smtplib.SMTP("127.0.0.1", srv.port, timeout=ts.SAFETY) as s:
                with self.assertRaises(smtplib.SMTPDataError) as cm:
                    s.sendmail("a@example.org", rcpts, MSG)
                self.assertEqual(cm.exception.smtp_code, 451)
        self.assertEqual(self.all_files(srv), ["one.test/bob"], "a copy was left behind")
        for dom, loc in (("one.test", "alice"), ("two.test", "carol")):
            self.assertEqual(self.box_files(srv, dom, loc, "tmp"), [])
        srv.wait_log_count(lambda l: "status=io-error" in l, 2)


class TestDocumented(Base):
    def test_new_switches_in_help_and_readme(self):
        p = ts.run_server(["--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(p.returncode, 0)
        help_text = p.stdout.decode("utf-8", "replace")
        readme_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                   "README.md")
        with open(readme_path, encoding="utf-8") as f:
            readme = f.read()
        section = readme[readme.index("## smtpe-server"):]
        for word in ("--maildir-crlf", "--no-delivered-to", "{domain}", "{local}"):
            self.assertIn(word, help_text)
            self.assertIn(word, section)


class PostfixRelay(peers.Postfix):
    """peers.py's Postfix with relay.test relayed to smtpe-server on 127.0.0.1:PORT."""

    def __init__(self, port):
        self.extra_main_cf = ("relay_domains = relay.test\n"
                              "transport_maps = inline:{{ relay.test=smtp:[127.0.0.1]:%d }}\n"
                              "smtp_tls_security_level = none\n" % port)
        self.extra_master_cf = "smtp      unix - - n - - smtp\n"
        super().__init__()


class TestPeers(Base):
    def test_postfix_relays_into_per_mailbox_delivery(self):
        srv = self.start_tmpl()
        with PostfixRelay(srv.port) as pf:
            with smtplib.SMTP("127.0.0.1", pf.port, timeout=ts.SAFETY) as s:
                s.sendmail("sender@client.test", ["alice@relay.test", "bob@relay.test"], MSG)
            deadline = time.monotonic() + peers.SAFETY
            while time.monotonic() < deadline:
                if all(self.box_files(srv, "relay.test", u) for u in ("alice", "bob")):
                    break
                time.sleep(0.1)
            log_path = os.path.join(pf.dir, "maillog.log")
            sent = []
            while time.monotonic() < deadline:
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    sent = [l for l in f if "status=sent" in l]
                if len(sent) >= 2:
                    break
                time.sleep(0.1)
            logged = "".join(sent)
            for u in ("alice", "bob"):
                self.assertIn("to=<%s@relay.test>" % u, logged, pf.log_text())
            self.assertIn("relay=127.0.0.1[127.0.0.1]:%d" % srv.port, logged)
        copies = []
        for u in ("alice", "bob"):
            names = self.box_files(srv, "relay.test", u)
            self.assertEqual(len(names), 1, names)
            with open(os.path.join(self.box(srv, "relay.test", u), "new", names[0]), "rb") as f:
                data = f.read()
            self.assertNotIn(b"\r", data)
            addr, rest = self.split_delivered_to(data, b"\n")
            self.assertEqual(addr, ("%s@relay.test" % u).encode())
            content = self.check_trace(rest, b"\n", b"sender@client.test")
            self.assertIn(b"Subject: one copy each\n", content)
            self.assertTrue(content.endswith(b"\n\nHello,\n.dotted line\n\nbye\n"), content)
            copies.append(rest)
        self.assertEqual(copies[0], copies[1])

    def test_snail_reads_a_stored_message(self):
        snail = shutil.which("s-nail")
        self.assertIsNotNone(snail, "s-nail not installed (tests/deps.sh)")
        srv = self.start_tmpl()
        msg = (b"From: Alice <a@example.org>\r\nTo: u@one.test\r\n"
               b"Subject: Read me with s-nail\r\nDate: Wed, 2 Dec 2026 10:00:00 +0000\r\n"
               b"\r\nfirst body line\r\nsecond body line\r\n")
        self.sendmail(srv, "a@example.org", ["u@one.test"], msg)
        env = dict(os.environ, HOME=srv.dir, MAILRC="/dev/null", LC_ALL="C.UTF-8")
        p = subprocess.run([snail, "-#", "-n", "-Rf", self.box(srv, "one.test", "u")],
                           input=b"headers\ntype 1\nquit\n", stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, timeout=ts.SAFETY)
        out = p.stdout.decode("utf-8", "replace")
        err = p.stderr.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, err)
        self.assertNotIn("Malformed", out + err)
        self.assertNotIn("Not a header line", out + err)
        self.assertIn("Read me with s-nail", out.splitlines()[0] if out else "", out)
        self.assertIn("\nSubject: Read me with s-nail\n", out)
        self.assertIn("\nfirst body line\nsecond body line\n", out)
        self.assertNotIn("\r", out)


if __name__ == "__main__":
    sys.exit(ts.main(sys.modules[__name__]))
