"""Real SMTP and LMTP servers on loopback, each in a private instance, for the interop tests of
smtpe's client: every check delivers a message through one of them and compares what arrived in
the server's OWN store, octet for octet.

    import peers
    with peers.Postfix() as p:                    # starts it; stops it, nothing left running
        ep = p.endpoint("smtps")                  # ep.server == "127.0.0.1:PORT"
        run smtpe-send --server ep.server --tls implicit --tls-ca p.ca_file
                       --auth-user p.auth_user (SMTPE_PASSWORD=p.auth_password)
                       --from sender@client.test --to p.address("alice") < content
        p.assert_delivered(content, "sender@client.test", [p.address("alice")],
                           tls=True, auth=p.auth_user)

The peers (class, name; endpoints; store):
  Postfix()     "postfix"      smtp smtp-unix smtps      Maildir (virtual(8)), a file per recipient
  Dovecot()     "dovecot"      lmtp lmtp-unix lmtps      Maildir (its LMTP), a file per recipient
  Aiosmtpd()    "aiosmtpd"     smtp smtp-unix smtps      envelope + content, one entry per message
  GoSmtp()      "go-smtp"      smtp smtp-unix smtps      envelope + content, one entry per message
                               lmtp lmtp-unix              (LMTP: for the recipients it took)
  SmtpServer()  "smtp-server"  smtp smtp-unix smtps      the same
                               lmtp lmtp-unix
ALL = (Postfix, Dovecot, Aiosmtpd, GoSmtp, SmtpServer). Aiosmtpd(tls=False, auth=False,
require_starttls=False), GoSmtp(tls=True, auth=True) and SmtpServer(tls=True, auth=True) take
variants: tls=False, no STARTTLS and no smtps endpoint; auth=False, no AUTH. Each instance has its
own directory under /tmp (removed at stop unless $SMTPE_PEERS_KEEP is set), its own self-signed
certificate and ports on 127.0.0.1 chosen free at start: nothing of the system's mail setup is
read or touched, nothing leaves the machine (no DNS either), and any number of instances may run
at once. Postfix and Dovecot need root (a private master; delivery as the user nobody).
tests/deps.sh installs every server; one that cannot start raises PeerError (an
AssertionError): its test fails, it is never skipped. A starting instance takes 0.1 to 0.5 s; a
stop about 1 s with a Dovecot in it (Postfix has one for SASL), less otherwise.

An Endpoint (peer.endpoint(NAME), peer.endpoints) says how to reach one listener:
  name        "smtp", "smtp-unix", "smtps", "lmtp", "lmtp-unix", "lmtps"
  protocol    "smtp" or "lmtp" (smtpe-send --lmtp)
  transport   "tcp" or "unix"
  tls         "starttls" (offered on the plain connection: --tls opportunistic or required),
              "implicit" (TLS from the connect, RFC 8314: --tls implicit) or None (none offered)
  host, port  "127.0.0.1" and the TCP port (None for unix); path: the socket (None for tcp)
  server      the form of smtpe-send --server: "127.0.0.1:PORT" or "unix:PATH"
The peer's attributes:
  name; host ("127.0.0.1"); port, unix, tls_port: of its main protocol (None when absent);
  lmtp_port, lmtp_unix: its LMTP listeners (go-smtp, smtp-server; Dovecot's equal port, unix)
  ca_file     the PEM certificate of the instance: the one trust anchor a client needs
              (smtpe-send --tls-ca); its names: tls_name ("localhost"), the IP address 127.0.0.1,
              peer.test and *.peer.test. Over TCP to 127.0.0.1 the address matches; over a unix
              socket a client names tls_name (--tls-servername).
  auth_user, auth_password   the AUTH credentials (None: no AUTH; Dovecot's LMTP has none).
              AUTH is offered with and without TLS, and is optional (mail goes without it).
  auth_mechanisms            the SASL mechanisms offered (tuple)
  domain      "peer.test"; address(LOCAL) -> "LOCAL@peer.test"
  mailboxes   Postfix: alice, bob, carol, jörg at peer.test; Dovecot: alice, bob, carol,
              datafail. None for the envelope peers, which take any address but the rules below.
  extensions  the EHLO/LHLO keywords its main endpoint advertises (frozenset; the tests check
              each is there, and that PIPELINING and CHUNKING are absent when not listed)
  line_limit  the longest content line it takes: octets with the CRLF, before dot-stuffing
              (also for a line starting with "."); None: no limit below 10 000 (what is tested)
  stores_crlf False when the store holds LF line ends (Postfix, go-smtp)
  asynchronous True when messages reach the store after the final reply (Postfix: queue, then
              virtual(8), some 20 ms later): wait_messages() polls for them
  records_auth whether Message.auth tells who authenticated (not Dovecot's LMTP)
  dir         the instance's directory: *.log (log_text()), the store, the configuration
and methods:
  assert_delivered(content, mail_from, rcpt_tos, tls=None, auth=None, timeout=SAFETY)
              waits for and checks exactly one delivery and nothing else in the store: one entry
              per recipient (Maildir peers) or one entry for rcpt_tos in that order (envelope
              peers); Message.content == content octet for octet (the first difference is
              reported), mail_from; tls (bool) and auth (user, or False: none) when given and
              recorded. Returns the entries (Maildir peers: in the order of rcpt_tos).
  messages()  [Message] in the store now, oldest first
  wait_messages(n, timeout=SAFETY, exact=True)
              waits until n are stored; with exact, also that no more are (an asynchronous peer
              gets SETTLE seconds for a further one); returns them
  clear()     removes every stored message (between tests that share one instance)
  log_text(last=80)   the tail of each of its logs, for a failure message
  start(), stop(); the class is a context manager doing both. stop() raises PeerError when a
              process did not exit cleanly or left a process behind (killed, and reported). A
              reaper process per server ends it should the test process die without stopping it.

A Message (one store entry):
  mail_from   the reverse-path as the server recorded it ("" for <>), UTF-8 text
  rcpt_tos    [str]: the recipients this entry is for (Maildir peers: the one mailbox's address)
  raw         the octets exactly as stored (the Maildir file, or the envelope peer's N.msg)
  content     raw without exactly the trace fields the server adds and, for a store with LF
              line ends, each LF read as CRLF: what the client sent as content after
              dot-unstuffing, without the terminating ".CRLF" (or the BDAT chunks joined).
              Nothing else is undone, so any change made by the client (or by a server beyond
              what is listed here) shows in a comparison with the submitted octets.
  added       [bytes]: the trace fields removed, each as stored (with its folded lines)
  tls, auth   over TLS (bool), and the AUTH user or None; auth is None also where the store
              does not record it (records_auth)
  meta        the envelope peers' JSON record (mail_args, rcpt_args: the MAIL and RCPT
              parameters as the server parsed them; helo, protocol, listener, smtputf8); {} for
              Maildir peers
  path        the stored file
What each server adds or changes (all of it checked by test_peers_smtplib.py):
  Postfix   virtual(8) Maildir with LF line ends. It prepends exactly "Return-Path: <S>",
            "Delivered-To: R" and one "Received:" field (smtpd's, with "(using TLS...)" and
            "(Authenticated sender: U)" when so); cleanup adds and rewrites no header
            (local_header_rewrite_clients empty, always_add_missing_headers no). It also: turns
            a bare CR into a space, drops a CR before CRLF, takes a bare LF as a line end, and
            puts an empty line before content whose first line is not a header field. A test of
            such content uses another peer.
  Dovecot   Maildir, CRLF kept (mail_save_crlf = yes), bare CR kept. It prepends exactly
            "Return-Path: <S>" and one "Received:" field (lmtp_hdr_delivery_address = none).
  aiosmtpd, smtp-server   nothing: N.msg is the content exactly as the server handed it over
            (bare CR and bare LF kept).
  go-smtp   nothing added, but its reader (net/textproto) turns each CRLF into LF; a line longer
            than line_limit gets no reply at all (the session stalls: do not send one); aiosmtpd
            answers one with "500 Line too long".

Recipient rules (by the local part):
  envelope peers (aiosmtpd, go-smtp, smtp-server):
    reject*    550 5.1.1 at RCPT          defer*     450 4.2.1 at RCPT
    datafail*  554 after the content      datadefer* 451 after the content
    (LMTP: for that recipient alone, the message is stored for the others; SMTP: the whole
    message is refused and nothing stored)
  Postfix: reject* 550 5.1.1 and defer* 450 4.2.1 at RCPT (check_recipient_access);
    datafail@ and datadefer@peer.test are taken at RCPT and refused at the end of the content
    with 554 5.6.0 / 451 4.3.0, which Postfix applies to a transaction with one recipient only
    (with more, it delivers to all); another address of peer.test: 550 5.1.1 (unknown user);
    another domain: 554 5.7.1 (relay access denied).
  Dovecot: datafail@peer.test has a 10-octet quota: 552 5.2.2 for it after the content, 250 for
    the others; an unknown user: 550 5.1.1 at RCPT.
  aiosmtpd advertises no ENHANCEDSTATUSCODES, yet these replies of its (and "250 2.0.0 Ok:
  stored as N") start their text with one: a client must report them as text, not as codes.
  A sender outside peer.test (sender@client.test) keeps the DSNs Postfix may make (NOTIFY=
  SUCCESS) out of the mailboxes: its outbound transports are error:.
AUTH with a wrong password: Postfix's (Dovecot's SASL) answers 535 after about 1 s, with no
penalty for the next attempt (anvil-auth-penalty closed); the others at once.

Only the Python 3 standard library. The aiosmtpd peer (peers/aiosmtpd_peer.py) runs under
/usr/bin/python3 (Debian's python3-aiosmtpd); the go-smtp peer (peers/gosmtp/main.go) is built
offline from Debian's golang-github-emersion-go-smtp-dev into cache_dir() once per version of
its sources and compiler; the smtp-server peer (peers/node/server.js) runs under node with the
smtp-server that tests/deps.sh put in peers/node/node_modules (npm ci).
"""

import fcntl
import glob
import hashlib
import json
import os
import pwd
import grp
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_DIR = os.path.join(HERE, "peers")
SYSTEM_PYTHON = "/usr/bin/python3"      # Debian's, which has python3-aiosmtpd
POSTFIX_MASTER = "/usr/lib/postfix/sbin/master"
GOPATH = "/usr/share/gocode"            # Debian's packaged Go sources
SAFETY = 20.0       # seconds: the longest a start, a stop or an expected delivery may take
SETTLE = 0.3        # seconds of quiet that show no further message is coming (exact=True)
DOMAIN = "peer.test"
TLS_NAME = "localhost"
AUTH_USER = "tester"
AUTH_PASSWORD = "pass-W0rd"
MAILBOXES = ("alice", "bob", "carol")   # the ASCII mailboxes of Postfix and Dovecot
UTF8_MAILBOX = "jörg"                   # Postfix only (SMTPUTF8); Dovecot's LMTP has no SMTPUTF8
CRLF = b"\r\n"

_cache_dir = None


class PeerError(AssertionError):
    """A peer could not be started, or did not stop cleanly. An AssertionError: the test that
    needed it fails (the suite's servers are installed by tests/deps.sh, never skipped)."""


def set_cache_dir(path):
    """Where the go-smtp peer binary (and Go's build cache) is kept between runs."""
    global _cache_dir
    _cache_dir = os.path.abspath(path)


def cache_dir():
    """set_cache_dir()'s, else $SMTPE_PEERS_CACHE, else /tmp/smtpe-peers-cache-UID."""
    d = _cache_dir or os.environ.get("SMTPE_PEERS_CACHE") or os.path.join(
        tempfile.gettempdir(), "smtpe-peers-cache-%d" % os.getuid())
    os.makedirs(d, exist_ok=True)
    return d


# ------------------------------------------------------------------------------------------------
# Helpers: ports, certificates, processes
# ------------------------------------------------------------------------------------------------
def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that cannot bind port 0
    and report it: Postfix, Dovecot; their start is retried when a port was taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certificate(directory):
    """A self-signed P-256 certificate for localhost, 127.0.0.1, peer.test and *.peer.test,
    valid for two days: (cert.pem, key.pem) in directory, both world-readable (the servers
    read them as their own unprivileged users)."""
    cert = os.path.join(directory, "cert.pem")
    key = os.path.join(directory, "key.pem")
    p = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=" + TLS_NAME,
         "-addext", "subjectAltName=DNS:%s,IP:127.0.0.1,DNS:%s,DNS:*.%s"
         % (TLS_NAME, DOMAIN, DOMAIN)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise PeerError("openssl req failed (tests/deps.sh installs openssl):\n%s"
                        % p.stdout.decode(errors="replace"))
    os.chmod(key, 0o644)
    return cert, key


def _tail(path, last):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-last:])


def _group_members(pgid):
    """The live (not zombie) processes in process group pgid, as [(pid, name)]."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append((int(stat.split("/")[2]), name))
    return out


# The reaper of one server's process group (run as a separate python, see Process): once the
# test process (its parent) is gone, SIGTERM to the group, SIGKILL to what is left 3 s later,
# then it removes DIR; it exits by itself as soon as the group is empty. argv: PGID [DIR].
_REAPER = r"""
import os, shutil, signal, sys, time
pgid, parent = int(sys.argv[1]), os.getppid()
def members():
    out = 0
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % pid) as f:
                t = f.read()
        except (OSError, ValueError):
            continue
        fields = t[t.rindex(")") + 2:].split()
        out += int(fields[2]) == pgid and fields[0] != "Z"
    return out
while os.getppid() == parent and members():
    time.sleep(0.5)
if os.getppid() != parent and members():
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0)):
        try:
            os.killpg(pgid, sig)
        except OSError:
            break
        end = time.monotonic() + wait
        while members() and time.monotonic() < end:
            time.sleep(0.1)
if os.getppid() != parent and len(sys.argv) > 2:
    shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


class Process:
    """One server process started in its own session (so its process group holds it and every
    child it forks), its stdout and stderr in log_path. A reaper (_REAPER) ends the group
    should the test process die without stopping it (a timeout's SIGKILL): nothing of a peer
    outlives the test."""

    def __init__(self, name, argv, log_path, env=None, cwd=None, cleanup_dir=None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         env=env, cwd=cwd)
        self.pgid = self.proc.pid
        self.terminated = False
        self.reaper = subprocess.Popen([sys.executable, "-c", _REAPER, str(self.pgid)]
                                       + ([cleanup_dir] if cleanup_dir else []),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)

    def alive(self):
        return self.proc.poll() is None

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def terminate(self):
        """Sends SIGTERM once (stop() then waits): a second one could hit a server that is
        already shutting down with its handler gone, and kill it."""
        if not self.terminated and self.proc.poll() is None:
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout=SAFETY, ok_status=(0,)):
        """SIGTERM, then waits for the process and its whole group. Returns a list of problems
        ([] when it exited with a status in ok_status and left nothing behind); anything still
        running after timeout is killed (and reported)."""
        problems = []
        self.terminate()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            problems.append("%s did not exit within %.0f s of SIGTERM: killed" % (self.name,
                                                                                 timeout))
            self._kill_group()
            rc = self.proc.wait()
        if rc not in ok_status and not problems:
            problems.append("%s exited with status %d" % (self.name, rc))
        deadline = time.monotonic() + timeout
        while _group_members(self.pgid):
            if time.monotonic() > deadline:
                problems.append("%s left processes running after its exit: %r (killed)"
                                % (self.name, _group_members(self.pgid)))
                self._kill_group()
                break
            time.sleep(0.02)
        self.reaper.kill()  # the group is gone: nothing left for it to do
        self.reaper.wait()
        return problems

    def _kill_group(self):
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait(pred, timeout, what, proc=None, log=None):
    """Polls pred() every 20 ms until it returns a true value (returned). Raises PeerError with
    what and the log when the time is up or proc died first."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if proc is not None and not proc.alive():
            raise PeerError("%s exited (status %s) before %s:\n%s"
                            % (proc.name, proc.proc.returncode, what, log() if log else ""))
        if time.monotonic() > deadline:
            raise PeerError("no %s within %.0f s:\n%s" % (what, timeout, log() if log else ""))
        time.sleep(0.02)


def _greets(family, address):
    """True when a server at address answers a connection with a 220 greeting (then QUIT)."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(address)
            buf = b""
            while b"\n" not in buf:
                chunk = s.recv(512)
                if not chunk:
                    return False
                buf += chunk
            ok = buf.startswith(b"220")
            s.sendall(b"QUIT\r\n")
            return ok
    except OSError:
        return False


def _accepts(address):
    try:
        with socket.create_connection(address, timeout=2.0):
            return True
    except OSError:
        return False


def _user(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise PeerError("no system user %r (tests/deps.sh installs the package that adds it)"
                        % name)


# ------------------------------------------------------------------------------------------------
# What a peer offers, and what its store holds
# ------------------------------------------------------------------------------------------------
class Endpoint:
    """One listener of a peer (see the module's documentation)."""

    def __init__(self, name, protocol, tls, port=None, path=None, host="127.0.0.1"):
        self.name = name
        self.protocol = protocol
        self.tls = tls
        self.transport = "unix" if path else "tcp"
        self.host = None if path else host
        self.port = port
        self.path = path

    @property
    def server(self):
        return "unix:" + self.path if self.path else "%s:%d" % (self.host, self.port)

    def connect(self, timeout=SAFETY):
        """A connected plain socket (the caller wraps it for implicit TLS)."""
        if self.path:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(self.path)
            return s
        return socket.create_connection((self.host, self.port), timeout=timeout)

    def __repr__(self):
        return "Endpoint(%s %s %s tls=%s)" % (self.name, self.protocol, self.server, self.tls)


class Message:
    """One store entry (see the module's documentation)."""

    def __init__(self, path, raw, content, mail_from, rcpt_tos, added=(), tls=None, auth=None,
                 meta=None):
        self.path = path
        self.raw = raw
        self.content = content
        self.mail_from = mail_from
        self.rcpt_tos = list(rcpt_tos)
        self.added = list(added)
        self.tls = tls
        self.auth = auth
        self.meta = meta or {}

    def __repr__(self):
        return "Message(%s from=%r to=%r %d octets)" % (os.path.basename(self.path),
                                                       self.mail_from, self.rcpt_tos,
                                                       len(self.raw))


def split_trace_fields(raw, names, eol):
    """Removes the leading header fields of raw whose names are names, in that order, one each
    (a field = its first line plus the folded lines after it, each ending in eol). Returns
    (fields, rest); raises AssertionError when raw does not start with exactly those."""
    fields = []
    pos = 0
    for name in names:
        prefix = name.encode() + b": "
        if not raw.startswith(prefix, pos):
            raise AssertionError("stored message lacks the %r trace field at octet %d "
                                 "(expected %s first): %r" % (name, pos, names,
                                                              raw[pos:pos + 120]))
        end = pos
        while True:
            j = raw.find(eol, end)
            if j < 0:
                raise AssertionError("unterminated %s field: %r" % (name, raw[pos:pos + 200]))
            end = j + len(eol)
            if raw[end:end + 1] not in (b" ", b"\t"):
                break
        fields.append(raw[pos:end])
        pos = end
    return fields, raw[pos:]


def assert_same_octets(got, want, where="content"):
    """Raises AssertionError unless got == want (bytes), naming the first differing offset
    with the octets around it and both lengths."""
    if got == want:
        return
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
             min(len(got), len(want)))
    raise AssertionError("%s differs from the submitted content at octet %d (stored %d octets, "
                         "submitted %d):\n  stored:    %r\n  submitted: %r"
                         % (where, i, len(got), len(want), got[max(0, i - 40):i + 40],
                            want[max(0, i - 40):i + 40]))


def _angle(value):
    """b"<a@b>" -> "a@b" (UTF-8 text)."""
    v = value.strip()
    if v.startswith(b"<") and v.endswith(b">"):
        v = v[1:-1]
    return v.decode("utf-8", "replace")


def _field_value(field):
    """The value of one stored header field, its folding undone, as bytes."""
    v = field.split(b":", 1)[1]
    return re.sub(rb"\r?\n[ \t]", b" ", v).strip()


class Peer:
    """The base of every peer: a temporary directory, a certificate, processes, a store."""

    name = "peer"
    needs_root = False
    auth_user = None
    auth_password = None
    auth_mechanisms = ()
    mailboxes = None
    extensions = frozenset()
    line_limit = None
    stores_crlf = True
    asynchronous = False   # whether it stores after its final reply (Postfix: queue, then deliver)
    records_auth = False   # whether Message.auth says who authenticated

    def __init__(self):
        self.host = "127.0.0.1"
        self.domain = DOMAIN
        self.tls_name = TLS_NAME
        self.endpoints = []
        self.port = self.unix = self.tls_port = None
        self.lmtp_port = self.lmtp_unix = None
        self.dir = None
        self.procs = []
        self.started = False

    # lifecycle -----------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop(raise_problems=exc_type is None)
        return False

    def start(self):
        if self.started:
            raise PeerError("%s: already started" % self.name)
        if self.needs_root and os.geteuid() != 0:
            raise PeerError("%s: a private instance needs root (its master runs as root and "
                            "delivers as another user)" % self.name)
        self.dir = tempfile.mkdtemp(prefix="smtpe-%s-" % self.name, dir="/tmp")
        os.chmod(self.dir, 0o755)  # the servers' own users traverse it
        self.started = True
        try:
            self.ca_file, self.key_file = make_certificate(self.dir)
            self._start()
        except BaseException:
            self.stop(raise_problems=False)
            raise
        return self

    def stop(self, raise_problems=True):
        """Stops every process (SIGTERM to all, newest first, then waits for each), removes the
        directory unless $SMTPE_PEERS_KEEP is set; raises PeerError for what did not stop
        cleanly."""
        if not self.started:
            return
        self.started = False
        problems = []
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            problems += proc.stop(ok_status=self._ok_status(proc))
        self.procs = []
        report = ""
        if problems:
            report = "%s: %s\n%s" % (self.name, "; ".join(problems), self.log_text())
        if self.dir and not os.environ.get("SMTPE_PEERS_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
        if report and raise_problems:
            raise PeerError(report)

    def _ok_status(self, proc):
        return (0,)

    def _spawn(self, name, argv, **kw):
        proc = Process(name, argv, os.path.join(self.dir, name + ".log"),
                       cleanup_dir=None if os.environ.get("SMTPE_PEERS_KEEP") else self.dir, **kw)
        self.procs.append(proc)
        return proc

    # what it offers ------------------------------------------------------------------------------
    def endpoint(self, name):
        for e in self.endpoints:
            if e.name == name:
                return e
        raise KeyError("%s has no endpoint %r (it has %s)"
                       % (self.name, name, [e.name for e in self.endpoints]))

    def address(self, local):
        return "%s@%s" % (local, self.domain)

    def log_text(self, last=80):
        out = []
        d = self.dir or "/nonexistent"
        logs = glob.glob(os.path.join(d, "*.log")) + glob.glob(os.path.join(d, "*", "*.log"))
        for path in sorted(logs):
            out.append("---- %s ----\n%s" % (path, _tail(path, last)))
        return "\n".join(out)

    # the store -----------------------------------------------------------------------------------
    def messages(self):
        raise NotImplementedError

    def clear(self):
        raise NotImplementedError

    def wait_messages(self, n, timeout=SAFETY, exact=True):
        """Waits until at least n messages are stored; with exact, also that there are no more
        (for a peer that delivers after its reply, Postfix, none within SETTLE seconds).
        Returns messages(). Raises AssertionError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.messages()
            if len(got) >= n:
                break
            if time.monotonic() > deadline:
                raise AssertionError("%s: %d message(s) stored within %.0f s, expected %d: %r"
                                     "\n%s" % (self.name, len(got), timeout, n, got,
                                               self.log_text(30)))
            time.sleep(0.02)
        if exact:
            if self.asynchronous:
                time.sleep(SETTLE)
                got = self.messages()
            if len(got) != n:
                raise AssertionError("%s: %d messages stored, expected %d: %r"
                                     % (self.name, len(got), n, got))
        return got

    def assert_delivered(self, content, mail_from, rcpt_tos, tls=None, auth=None,
                         timeout=SAFETY):
        """Checks that the store holds exactly one delivery of content from mail_from to the
        recipients rcpt_tos (a list, in RCPT order) and nothing else: for a Maildir peer one
        entry per recipient, for an envelope peer one entry with those recipients in that
        order. content is compared octet for octet with Message.content (the first difference
        is reported); tls (bool) and auth (user or False for none) are checked where the store
        records them. Returns the entries (Maildir peers: in the order of rcpt_tos)."""
        per_rcpt = isinstance(self, MaildirPeer)
        got = self.wait_messages(len(rcpt_tos) if per_rcpt else 1, timeout)
        if per_rcpt:
            by_rcpt = {}
            for m in got:
                by_rcpt.setdefault(m.rcpt_tos[0], []).append(m)
            want = sorted(rcpt_tos)
            if sorted(r for r in by_rcpt for _ in by_rcpt[r]) != want:
                raise AssertionError("%s: stored for %r, expected one each for %r"
                                     % (self.name, sorted(by_rcpt), want))
            got = [by_rcpt[r][0] for r in rcpt_tos]
        elif got[0].rcpt_tos != list(rcpt_tos):
            raise AssertionError("%s: stored for recipients %r, expected %r"
                                 % (self.name, got[0].rcpt_tos, list(rcpt_tos)))
        for m in got:
            where = "%s: %s" % (self.name, m.path)
            if m.mail_from != mail_from:
                raise AssertionError("%s: reverse-path %r, expected %r" % (where, m.mail_from,
                                                                            mail_from))
            assert_same_octets(m.content, content, where)
            if tls is not None and m.tls is not None and m.tls != tls:
                raise AssertionError("%s: tls=%r, expected %r" % (where, m.tls, tls))
            if auth is not None and self.records_auth and (m.auth or False) != auth:
                raise AssertionError("%s: AUTH user %r, expected %r" % (where, m.auth, auth))
        return got


# ------------------------------------------------------------------------------------------------
# Maildir stores (Postfix, Dovecot)
# ------------------------------------------------------------------------------------------------
class MaildirPeer(Peer):
    """A peer delivering into one Maildir per mailbox: self._maildirs = {address: directory}."""

    eol = b"\n"
    trace_fields = ()

    def _maildir_files(self):
        """[(address, path)] of every delivered file, oldest first (by mtime, then name)."""
        files = []
        for addr, d in self._maildirs.items():
            for sub in ("new", "cur"):
                for name in os.listdir(os.path.join(d, sub)) if os.path.isdir(
                        os.path.join(d, sub)) else ():
                    path = os.path.join(d, sub, name)
                    try:
                        files.append((os.stat(path).st_mtime_ns, name, addr, path))
                    except FileNotFoundError:
                        pass
        files.sort()
        return [(addr, path) for _, _, addr, path in files]

    def messages(self):
        out = []
        for addr, path in self._maildir_files():
            with open(path, "rb") as f:
                raw = f.read()
            out.append(self._parse(path, raw, addr))
        return out

    def clear(self):
        for _, path in self._maildir_files():
            os.unlink(path)

    def _parse(self, path, raw, addr):
        added, rest = split_trace_fields(raw, self.trace_fields, self.eol)
        byname = {}
        for f in added:
            byname.setdefault(f.split(b":", 1)[0].decode(), _field_value(f))
        received = byname.get("Received", b"")
        content = rest if self.eol == CRLF else rest.replace(b"\n", CRLF)
        return Message(path, raw, content, _angle(byname.get("Return-Path", b"")), [addr],
                       added=added, tls=b"(using TLS" in received,
                       auth=self._auth_from(received), meta={})

    def _auth_from(self, received):
        return None


def _dovecot_conf(d, instance, protocols, users_file, extra):
    """A Dovecot configuration of its own (no /etc/dovecot): base_dir d/run, log d/dovecot.log,
    passwd-file users, extra appended."""
    return """\
# Written by tests/integration/peers.py: a private Dovecot for smtpe's interop tests.
instance_name = {instance}
base_dir = {d}/run
state_dir = {d}/state
log_path = {d}/dovecot.log
protocols = {protocols}
listen = 127.0.0.1
hostname = dovecot.{domain}
postmaster_address = postmaster@{domain}
default_internal_user = dovecot
default_login_user = dovenull
disable_plaintext_auth = no
auth_mechanisms = plain login
# a wrong password is answered at once (a test sends one on purpose), and no penalty follows
auth_failure_delay = 0
passdb {{
  driver = passwd-file
  args = scheme=PLAIN {users}
}}
userdb {{
  driver = passwd-file
  args = {users}
}}
{extra}
""".format(d=d, instance=instance, protocols=protocols, domain=DOMAIN, users=users_file,
           extra=extra)


def _start_dovecot(peer, d, conf_text, ready_paths):
    """Writes d/dovecot.conf and starts `dovecot -F` on it; waits for the unix sockets in
    ready_paths. Returns the Process."""
    for sub in ("run", "state"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    conf = os.path.join(d, "dovecot.conf")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(conf_text)
    dovecot = shutil.which("dovecot") or "/usr/sbin/dovecot"
    if not os.access(dovecot, os.X_OK):
        raise PeerError("no dovecot (packages dovecot-core, dovecot-lmtpd: tests/deps.sh)")
    _user("dovecot")
    _user("dovenull")
    proc = peer._spawn("dovecot-master" if d == peer.dir else "dovecot-" + os.path.basename(d),
                       [dovecot, "-F", "-c", conf])
    log = lambda: proc.log() + "\n" + _tail(os.path.join(d, "dovecot.log"), 40)
    for path in ready_paths:
        _wait(lambda: os.path.exists(path), SAFETY, "dovecot socket %s" % path, proc, log)
    return proc


class Dovecot(MaildirPeer):
    """Dovecot's LMTP server (dovecot-lmtpd), a private instance run as root: LMTP on TCP, on a
    unix socket (STARTTLS offered on both) and over implicit TLS; passwd-file users
    alice, bob, carol and datafail (quota: 10 octets) at peer.test, each a Maildir at
    DIR/mail/LOCAL/Maildir delivered as the user nobody. Per-recipient replies after the
    content; CHUNKING, PIPELINING, 8BITMIME, ENHANCEDSTATUSCODES."""

    name = "dovecot"
    needs_root = True
    eol = CRLF
    trace_fields = ("Return-Path", "Received")
    extensions = frozenset({"PIPELINING", "CHUNKING", "8BITMIME", "ENHANCEDSTATUSCODES",
                            "STARTTLS"})
    line_limit = None

    def __init__(self):
        super().__init__()
        self.mailboxes = [self.address(u) for u in MAILBOXES + ("datafail",)]

    def _start(self):
        d = self.dir
        nobody = _user("nobody")
        mail = os.path.join(d, "mail")
        os.mkdir(mail)
        os.chown(mail, nobody.pw_uid, nobody.pw_gid)
        users = os.path.join(d, "users")
        self._maildirs = {}
        with open(users, "w", encoding="utf-8") as f:
            for addr in self.mailboxes:
                local = addr.split("@")[0]
                extra = "userdb_quota_rule=*:storage=10B" if local == "datafail" else ""
                f.write("%s:{PLAIN}%s:%d:%d::%s/%s::%s\n" % (addr, AUTH_PASSWORD, nobody.pw_uid,
                                                            nobody.pw_gid, mail, local, extra))
                self._maildirs[addr] = os.path.join(mail, local, "Maildir")
        os.chmod(users, 0o644)
        for attempt in range(3):
            port, tls_port = free_port(), free_port()
            extra = """\
ssl = yes
ssl_cert = <{cert}
ssl_key = <{key}
mail_location = maildir:~/Maildir
mail_save_crlf = yes
mail_fsync = never
lmtp_hdr_delivery_address = none
mail_plugins = quota
plugin {{
  quota = maildir:User quota
}}
service lmtp {{
  unix_listener lmtp {{
    mode = 0666
  }}
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener lmtps {{
    address = 127.0.0.1
    port = {tls_port}
    ssl = yes
  }}
}}
""".format(cert=self.ca_file, key=self.key_file, port=port, tls_port=tls_port)
            conf = _dovecot_conf(d, "smtpe-%s" % os.path.basename(d), "lmtp", users, extra)
            unix = os.path.join(d, "run", "lmtp")
            proc = _start_dovecot(self, d, conf, [unix])
            log = lambda: self.log_text(40)
            try:
                _wait(lambda: _greets(socket.AF_INET, ("127.0.0.1", port)), SAFETY,
                      "LMTP greeting on port %d" % port, proc, log)
                _wait(lambda: _accepts(("127.0.0.1", tls_port)), SAFETY,
                      "listener on port %d" % tls_port, proc, log)
                break
            except PeerError:
                if attempt < 2 and "in use" in log():
                    self.procs.remove(proc)
                    proc.stop()
                    continue
                raise
        self.port = self.lmtp_port = port
        self.unix = self.lmtp_unix = unix
        self.tls_port = tls_port
        self.endpoints = [Endpoint("lmtp", "lmtp", "starttls", port=port),
                          Endpoint("lmtp-unix", "lmtp", "starttls", path=unix),
                          Endpoint("lmtps", "lmtp", "implicit", port=tls_port)]


# ------------------------------------------------------------------------------------------------
# Postfix
# ------------------------------------------------------------------------------------------------
_POSTFIX_MASTER_CF = """\
# Written by tests/integration/peers.py: a private Postfix for smtpe's interop tests.
# service type  private unpriv chroot wakeup maxproc command
127.0.0.1:{port} inet n - n - - smtpd
127.0.0.1:{tls_port} inet n - n - - smtpd
  -o smtpd_tls_wrappermode=yes
  -o smtpd_tls_security_level=encrypt
smtp-unix unix n - n - - smtpd
cleanup   unix n - n - 0 cleanup
qmgr      unix n - n 300 1 qmgr
rewrite   unix - - n - - trivial-rewrite
bounce    unix - - n - 0 bounce
defer     unix - - n - 0 bounce
trace     unix - - n - 0 bounce
verify    unix - - n - 1 verify
flush     unix n - n 1000? 0 flush
proxymap  unix - - n - - proxymap
error     unix - - n - - error
retry     unix - - n - - error
discard   unix - - n - - discard
virtual   unix - n n - - virtual
anvil     unix - - n - 1 anvil
scache    unix - - n - 1 scache
tlsmgr    unix - - n 1000? 1 tlsmgr
postlog   unix-dgram n - n - 1 postlogd
"""

_POSTFIX_MAIN_CF = """\
# Written by tests/integration/peers.py: a private Postfix for smtpe's interop tests. Nothing
# leaves it: every outbound transport is error:, no DNS is looked up.
compatibility_level = 3.6
config_directory = {d}/etc
queue_directory = {d}/queue
data_directory = {d}/data
mail_owner = postfix
setgid_group = postdrop
maillog_file = {d}/maillog.log
maillog_file_prefixes = {d}
myhostname = postfix.{domain}
mydomain = {domain}
myorigin = $myhostname
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
relayhost =
default_transport = error:5.3.0 this test instance sends no mail out
relay_transport = $default_transport
local_transport = error:5.1.1 no local delivery in this test instance
smtp_dns_support_level = disabled
smtpd_peername_lookup = no
biff = no
append_dot_mydomain = no
smtputf8_enable = yes
alias_maps =
alias_database =
local_recipient_maps =
smtpd_banner = $myhostname ESMTP
local_header_rewrite_clients =
remote_header_rewrite_domain =
always_add_missing_headers = no
enable_original_recipient = no
message_size_limit = 33554432
virtual_mailbox_limit = 0
virtual_mailbox_domains = {domain}
virtual_mailbox_base = {d}/mail
virtual_mailbox_maps = texthash:{d}/etc/vmailbox
virtual_uid_maps = static:{uid}
virtual_gid_maps = static:{gid}
smtpd_relay_restrictions = reject_unauth_destination
smtpd_recipient_restrictions = check_recipient_access regexp:{d}/etc/rcpt_access
smtpd_end_of_data_restrictions = check_recipient_access regexp:{d}/etc/data_access
smtpd_tls_security_level = may
smtpd_tls_cert_file = {cert}
smtpd_tls_key_file = {key}
smtpd_tls_received_header = yes
smtpd_tls_loglevel = 1
smtpd_sasl_auth_enable = yes
smtpd_sasl_type = dovecot
smtpd_sasl_path = {auth_socket}
smtpd_sasl_authenticated_header = yes
smtpd_sasl_security_options = noanonymous
smtpd_tls_auth_only = no
"""

_POSTFIX_RCPT_ACCESS = """\
/^reject[^@]*@/     550 5.1.1 rejected by the test's rule (reject*)
/^defer[^@]*@/      450 4.2.1 deferred by the test's rule (defer*)
"""

_POSTFIX_DATA_ACCESS = """\
/^datafail[^@]*@/   554 5.6.0 content refused by the test's rule (datafail*)
/^datadefer[^@]*@/  451 4.3.0 content deferred by the test's rule (datadefer*)
"""


POSTFIX_FILES = "/etc/postfix/postfix-files"   # the package's list of its files and modes


def _postfix_queue(d, etc, owner, setgid_gid):
    """The queue and data directories of the instance at d, with the owners and modes that
    Postfix's own postfix-files lists for $queue_directory and $data_directory (what `postfix
    check` would create, in a fraction of its two seconds); `postfix -c etc check` when that
    list is missing."""
    if not os.path.isfile(POSTFIX_FILES):
        p = subprocess.run(["postfix", "-c", etc, "check"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            raise PeerError("postfix -c %s check failed (status %d):\n%s"
                            % (etc, p.returncode, p.stdout.decode(errors="replace")))
        return
    roots = {"$queue_directory": os.path.join(d, "queue"),
             "$data_directory": os.path.join(d, "data")}
    with open(POSTFIX_FILES) as f:
        for line in f:
            fields = line.strip().split(":")
            if len(fields) < 5 or fields[1] != "d":
                continue
            root, _, rest = fields[0].partition("/")
            if root not in roots:
                continue
            path = os.path.join(roots[root], rest) if rest else roots[root]
            os.makedirs(path, exist_ok=True)
            uid = owner.pw_uid if fields[2] == "$mail_owner" else 0
            gid = setgid_gid if fields[3] == "$setgid_group" else 0
            os.chown(path, uid, gid)
            os.chmod(path, int(fields[4], 8))


class Postfix(MaildirPeer):
    """Postfix's smtpd in a private instance run as root (own config_directory,
    queue_directory, data_directory under DIR; `master -c DIR/etc` in the foreground): SMTP on
    TCP and on a unix socket (master.cf unix service; STARTTLS offered on both), SMTP over
    implicit TLS (smtpd_tls_wrappermode) on a second port; PIPELINING, CHUNKING, 8BITMIME,
    SMTPUTF8, DSN, ENHANCEDSTATUSCODES, SIZE, STARTTLS, AUTH PLAIN and LOGIN through a private
    Dovecot's SASL socket (passwd-file with tester). Delivery: virtual(8) into DIR/mail/LOCAL/
    for alice, bob, carol and jörg at peer.test, as the user nobody."""

    name = "postfix"
    needs_root = True
    eol = b"\n"
    trace_fields = ("Return-Path", "Delivered-To", "Received")
    auth_user = AUTH_USER
    auth_password = AUTH_PASSWORD
    auth_mechanisms = ("PLAIN", "LOGIN")
    extensions = frozenset({"PIPELINING", "CHUNKING", "8BITMIME", "SMTPUTF8", "DSN",
                            "ENHANCEDSTATUSCODES", "SIZE", "STARTTLS", "AUTH"})
    line_limit = None
    stores_crlf = False
    asynchronous = True
    records_auth = True

    # Appended to main.cf and master.cf (later main.cf lines win): a test's own routing, e.g.
    # a transport that relays a domain to a server under test on 127.0.0.1.
    extra_main_cf = ""
    extra_master_cf = ""

    def __init__(self):
        super().__init__()
        self.mailboxes = [self.address(u) for u in MAILBOXES + (UTF8_MAILBOX,)]

    def _ok_status(self, proc):
        # master passes SIGTERM on to its children and exits with it ("postfix abort")
        return (0, -signal.SIGTERM, 1) if proc.name == "postfix" else (0,)

    def _auth_from(self, received):
        m = re.search(rb"\(Authenticated sender: ([^)]*)\)", received)
        return m.group(1).decode("utf-8", "replace") if m else None

    def _start(self):
        d = self.dir
        if not os.access(POSTFIX_MASTER, os.X_OK) or not shutil.which("postfix"):
            raise PeerError("no Postfix (package postfix: tests/deps.sh)")
        postfix_user = _user("postfix")
        nobody = _user("nobody")
        try:
            grp.getgrnam("postdrop")
        except KeyError:
            raise PeerError("no group postdrop (package postfix: tests/deps.sh)")
        self._start_sasl()
        for sub in ("etc", "mail"):
            os.mkdir(os.path.join(d, sub))
        os.chown(os.path.join(d, "mail"), nobody.pw_uid, nobody.pw_gid)
        self._maildirs = {}
        with open(os.path.join(d, "etc", "vmailbox"), "w", encoding="utf-8") as f:
            # datafail and datadefer: accepted at RCPT, refused at the end of the content
            boxes = self.mailboxes + [self.address("datafail"), self.address("datadefer")]
            for i, addr in enumerate(boxes):
                sub = "box%d" % i   # ASCII directory names whatever the local part
                f.write("%s %s/\n" % (addr, sub))
                self._maildirs[addr] = os.path.join(d, "mail", sub)
        with open(os.path.join(d, "etc", "rcpt_access"), "w") as f:
            f.write(_POSTFIX_RCPT_ACCESS)
        with open(os.path.join(d, "etc", "data_access"), "w") as f:
            f.write(_POSTFIX_DATA_ACCESS)
        with open(os.path.join(d, "etc", "main.cf"), "w") as f:
            f.write(_POSTFIX_MAIN_CF.format(d=d, domain=DOMAIN, uid=nobody.pw_uid,
                                            gid=nobody.pw_gid, cert=self.ca_file,
                                            key=self.key_file, auth_socket=self._auth_socket)
                    + self.extra_main_cf.format(d=d))
        etc = os.path.join(d, "etc")
        ports = free_port(), free_port()
        with open(os.path.join(etc, "master.cf"), "w") as f:
            f.write(_POSTFIX_MASTER_CF.format(port=ports[0], tls_port=ports[1])
                    + self.extra_master_cf)
        _postfix_queue(d, etc, postfix_user, grp.getgrnam("postdrop").gr_gid)
        self.unix = os.path.join(d, "queue", "public", "smtp-unix")
        for attempt in range(3):
            port, tls_port = ports if attempt == 0 else (free_port(), free_port())
            with open(os.path.join(etc, "master.cf"), "w") as f:
                f.write(_POSTFIX_MASTER_CF.format(port=port, tls_port=tls_port)
                        + self.extra_master_cf)
            # Postfix's configuration reader waits (in steps of 0.3 s) until main.cf is a few
            # seconds old; written just now, it is dated back instead
            past = time.time() - 60
            for name in os.listdir(etc):
                os.utime(os.path.join(etc, name), (past, past))
            proc = self._spawn("postfix", [POSTFIX_MASTER, "-c", etc, "-d"])
            log = lambda: self.log_text(40)
            try:
                _wait(lambda: _greets(socket.AF_INET, ("127.0.0.1", port)), SAFETY,
                      "SMTP greeting on port %d" % port, proc, log)
                _wait(lambda: _accepts(("127.0.0.1", tls_port)), SAFETY,
                      "listener on port %d" % tls_port, proc, log)
                _wait(lambda: _greets(socket.AF_UNIX, self.unix), SAFETY,
                      "SMTP greeting on %s" % self.unix, proc, log)
                break
            except PeerError:
                if attempt < 2 and "in use" in log():
                    self.procs.remove(proc)
                    proc.stop(ok_status=self._ok_status(proc))
                    continue
                raise
        self.port, self.tls_port = port, tls_port
        self.endpoints = [Endpoint("smtp", "smtp", "starttls", port=port),
                          Endpoint("smtp-unix", "smtp", "starttls", path=self.unix),
                          Endpoint("smtps", "smtp", "implicit", port=tls_port)]

    def _start_sasl(self):
        """The private Dovecot whose auth socket is Postfix's SASL (smtpd_sasl_type dovecot)."""
        d = os.path.join(self.dir, "sasl")
        os.mkdir(d)
        os.chmod(d, 0o755)
        users = os.path.join(d, "users")
        with open(users, "w") as f:
            f.write("%s:{PLAIN}%s::::::\n" % (AUTH_USER, AUTH_PASSWORD))
        os.chmod(users, 0o644)
        # anvil-auth-penalty closed to the auth process (user dovecot): no penalty tracking, so
        # a failed AUTH (a test makes one on purpose) does not delay the AUTHs after it
        extra = """\
ssl = no
service auth {
  unix_listener auth-postfix {
    mode = 0666
  }
}
service anvil {
  unix_listener anvil-auth-penalty {
    mode = 0
  }
}
"""
        self._auth_socket = os.path.join(d, "run", "auth-postfix")
        conf = _dovecot_conf(d, "smtpe-%s-sasl" % os.path.basename(self.dir), "none", users,
                             extra)
        _start_dovecot(self, d, conf, [self._auth_socket])


# ------------------------------------------------------------------------------------------------
# Envelope-storing peers (aiosmtpd, go-smtp, smtp-server)
# ------------------------------------------------------------------------------------------------
class EnvelopePeer(Peer):
    """A peer program of tests/integration/peers/ taking --listen/--tls-listen/--lmtp-listen
    NAME=ADDRESS, printing "listening NAME ADDRESS" per listener and "ready", and storing
    DIR/store/N.msg + N.json."""

    lmtp = False           # whether the program has LMTP listeners
    option_style = "--"    # "-" for Go's flag package
    records_auth = True

    def __init__(self, tls=True, auth=True):
        super().__init__()
        self.offer_tls = tls
        self.offer_auth = auth
        if auth:
            self.auth_user, self.auth_password = AUTH_USER, AUTH_PASSWORD
        self.extensions = frozenset(self.base_extensions | ({"STARTTLS"} if tls else set())
                                    | ({"AUTH"} if auth else set()))

    def _argv(self, args):
        raise NotImplementedError

    def _start(self):
        o = self.option_style
        self.store = os.path.join(self.dir, "store")
        os.mkdir(self.store)
        unix = os.path.join(self.dir, "smtp.sock")
        args = [o + "store", self.store, o + "listen", "smtp=127.0.0.1:0",
                o + "listen", "smtp-unix=unix:" + unix]
        if self.offer_tls:
            args += [o + "cert", self.ca_file, o + "key", self.key_file,
                     o + "tls-listen", "smtps=127.0.0.1:0"]
        if self.offer_auth:
            args += [o + "auth", "%s:%s" % (AUTH_USER, AUTH_PASSWORD)]
        if self.lmtp:
            args += [o + "lmtp-listen", "lmtp=127.0.0.1:0",
                     o + "lmtp-listen", "lmtp-unix=unix:" + os.path.join(self.dir, "lmtp.sock")]
        argv, env = self._argv(args)
        proc = self._spawn(self.name, argv, env=env, cwd=self.dir)
        text = _wait(lambda: "\nready\n" in "\n" + proc.log() and proc.log(), SAFETY,
                     "'ready' line from %s" % self.name, proc, proc.log)
        tls = "starttls" if self.offer_tls else None
        for m in re.finditer(r"^listening (\S+) (\S+)$", text, re.M):
            name, addr = m.group(1), m.group(2)
            protocol = "lmtp" if name.startswith("lmtp") else "smtp"
            if addr.startswith("unix:"):
                ep = Endpoint(name, protocol, tls, path=addr[5:])
            else:
                ep = Endpoint(name, protocol, "implicit" if name == "smtps" else tls,
                              port=int(addr.rpartition(":")[2]))
            self.endpoints.append(ep)
        get = lambda n: next((e for e in self.endpoints if e.name == n), None)
        self.port = get("smtp").port
        self.unix = get("smtp-unix").path
        self.tls_port = get("smtps").port if get("smtps") else None
        if self.lmtp:
            self.lmtp_port = get("lmtp").port
            self.lmtp_unix = get("lmtp-unix").path

    def messages(self):
        out = []
        names = [n for n in os.listdir(self.store) if n.endswith(".json")]
        for n in sorted(names, key=lambda n: int(n.split(".")[0])):
            base = os.path.join(self.store, n[:-5])
            with open(base + ".json", encoding="utf-8") as f:
                meta = json.load(f)
            with open(base + ".msg", "rb") as f:
                raw = f.read()
            content = raw if self.stores_crlf else raw.replace(b"\n", CRLF)
            out.append(Message(base + ".msg", raw, content, meta["mail_from"], meta["rcpt_tos"],
                               tls=meta.get("tls"), auth=meta.get("auth"), meta=meta))
        return out

    def clear(self):
        for n in os.listdir(self.store):
            os.unlink(os.path.join(self.store, n))


class Aiosmtpd(EnvelopePeer):
    """aiosmtpd (Debian's python3-aiosmtpd under /usr/bin/python3), peers/aiosmtpd_peer.py:
    SMTP on TCP and a unix socket, SMTP over implicit TLS; no PIPELINING, no CHUNKING, no
    ENHANCEDSTATUSCODES, no DSN. tls=False: no STARTTLS, no smtps endpoint; auth=False: no
    AUTH; require_starttls=True: MAIL refused before STARTTLS."""

    name = "aiosmtpd"
    base_extensions = frozenset({"8BITMIME", "SMTPUTF8", "SIZE"})
    auth_mechanisms = ("PLAIN", "LOGIN")
    line_limit = 1000

    def __init__(self, tls=True, auth=True, require_starttls=False):
        super().__init__(tls=tls, auth=auth)
        self.require_starttls = require_starttls

    def _argv(self, args):
        if not os.access(SYSTEM_PYTHON, os.X_OK):
            raise PeerError("no %s (Debian's python3)" % SYSTEM_PYTHON)
        p = subprocess.run([SYSTEM_PYTHON, "-c", "import aiosmtpd"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            raise PeerError("no aiosmtpd for %s (package python3-aiosmtpd: tests/deps.sh):\n%s"
                            % (SYSTEM_PYTHON, p.stdout.decode(errors="replace")))
        extra = ["--smtputf8"] + (["--require-starttls"] if self.require_starttls else [])
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        return [SYSTEM_PYTHON, os.path.join(PEERS_DIR, "aiosmtpd_peer.py")] + args + extra, env


def go_peer_binary():
    """The go-smtp peer program, built from peers/gosmtp/main.go against Debian's packaged
    go-smtp (GOPATH mode, no network) into cache_dir() once per version of the source, the
    library and the compiler; concurrent callers wait for one build (a lock file)."""
    go = shutil.which("go") or "/usr/bin/go"
    src = os.path.join(PEERS_DIR, "gosmtp", "main.go")
    libs = [os.path.join(GOPATH, "src", "github.com", "emersion", n) for n in ("go-smtp",
                                                                              "go-sasl")]
    if not os.access(go, os.X_OK):
        raise PeerError("no go (package golang-go: tests/deps.sh)")
    for lib in libs:
        if not os.path.isdir(lib):
            raise PeerError("no %s (packages golang-github-emersion-go-smtp-dev and "
                            "golang-github-emersion-go-sasl-dev: tests/deps.sh)" % lib)
    h = hashlib.sha256()
    h.update(subprocess.run([go, "version"], stdout=subprocess.PIPE).stdout)
    for path in [src] + sorted(p for lib in libs
                               for p in glob.glob(os.path.join(lib, "**", "*.go"),
                                                  recursive=True)):
        h.update(path.encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    cache = cache_dir()
    binary = os.path.join(cache, "go-smtp-peer-" + h.hexdigest()[:16])
    if os.access(binary, os.X_OK):
        return binary
    with open(os.path.join(cache, "go-smtp-peer.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):
            return binary
        env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH, GOPROXY="off", GOFLAGS="",
                   GOTOOLCHAIN="local", GOCACHE=os.path.join(cache, "go-build"))
        tmp = "%s.tmp.%d" % (binary, os.getpid())
        p = subprocess.run([go, "build", "-o", tmp, src], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        if p.returncode != 0:
            raise PeerError("go build of %s failed:\n%s" % (src, p.stdout.decode(errors="replace")))
        os.rename(tmp, binary)
    return binary


class GoSmtp(EnvelopePeer):
    """go-smtp 0.12 (Debian's golang-github-emersion-go-smtp-dev), peers/gosmtp/main.go: SMTP
    on TCP and a unix socket, SMTP over implicit TLS, LMTP on TCP and a unix socket;
    PIPELINING, 8BITMIME, ENHANCEDSTATUSCODES, SMTPUTF8, SIZE; no CHUNKING, no DSN. Its store
    has LF line ends (net/textproto's reader)."""

    name = "go-smtp"
    lmtp = True
    option_style = "-"
    base_extensions = frozenset({"PIPELINING", "8BITMIME", "ENHANCEDSTATUSCODES", "SMTPUTF8",
                                 "SIZE"})
    auth_mechanisms = ("PLAIN",)
    line_limit = 1999
    stores_crlf = False

    def _argv(self, args):
        return [go_peer_binary(), "-smtputf8"] + args, None


NODE_DIR = os.path.join(PEERS_DIR, "node")


class SmtpServer(EnvelopePeer):
    """nodemailer's smtp-server (npm, pinned in peers/node/package.json), peers/node/server.js
    under node: SMTP on TCP and a unix socket, SMTP over implicit TLS, LMTP on TCP and a unix
    socket; PIPELINING, 8BITMIME, SMTPUTF8, ENHANCEDSTATUSCODES, DSN, SIZE; no CHUNKING."""

    name = "smtp-server"
    lmtp = True
    base_extensions = frozenset({"PIPELINING", "8BITMIME", "SMTPUTF8", "ENHANCEDSTATUSCODES",
                                 "DSN", "SIZE"})
    auth_mechanisms = ("PLAIN", "LOGIN")

    def _argv(self, args):
        node = shutil.which("node") or shutil.which("nodejs")
        if not node:
            raise PeerError("no node (tests/deps.sh installs nodejs and npm)")
        if not os.path.isfile(os.path.join(NODE_DIR, "node_modules", "smtp-server",
                                           "package.json")):
            raise PeerError("smtp-server is not installed in %s/node_modules (tests/deps.sh "
                            "runs npm ci there)" % NODE_DIR)
        return [node, os.path.join(NODE_DIR, "server.js")] + args, None


ALL = (Postfix, Dovecot, Aiosmtpd, GoSmtp, SmtpServer)
