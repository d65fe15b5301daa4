#!/usr/bin/python3
"""aiosmtpd-peer: an aiosmtpd server (Debian's python3-aiosmtpd, run by /usr/bin/python3) that
stores every message it accepts, envelope and content exactly as aiosmtpd hands them over, for
the interop tests of smtpe's client (tests/integration/peers.py starts it).

aiosmtpd as shipped: no PIPELINING, no CHUNKING, no DSN, no ENHANCEDSTATUSCODES; 8BITMIME, SIZE,
SMTPUTF8 (--smtputf8), STARTTLS (--cert/--key) and AUTH PLAIN/LOGIN (--auth) as aiosmtpd offers
them. A content line longer than 1000 octets with its CRLF gets aiosmtpd's "500 Line too long".

Listeners (any number, each printed once bound as "listening NAME ADDRESS" on stderr, then one
"ready" line):
  --listen NAME=HOST:PORT | NAME=unix:PATH   plain SMTP (STARTTLS offered when --cert is given)
  --tls-listen NAME=HOST:PORT                 implicit TLS from the connect (RFC 8314)
Port 0 picks a free port; the printed address has the real one.

Store (--store DIR): for each accepted message N (1, 2, ... in the order of their final replies)
DIR/N.msg holds the content octets as aiosmtpd received them (dot-unstuffed, up to and without
the terminating ".CRLF"; nothing added), then DIR/N.json is renamed into place:
  {"mail_from": str, "rcpt_tos": [str], "mail_args": {KEYWORD: value or true},
   "rcpt_args": [{KEYWORD: value or true}], "helo": str, "protocol": "smtp",
   "listener": NAME, "tls": bool, "auth": USER or null, "smtputf8": bool}
Addresses are the UTF-8 text between < and > (aiosmtpd's form); mail_from is "" for <>.

Recipients by local part (the same rules as the other envelope-storing peers):
  reject*     550 5.1.1 at RCPT
  defer*      450 4.2.1 at RCPT
  datafail*   the message is refused after its content: 554 5.6.0, nothing stored
  datadefer*  the same with 451 4.3.0
These replies (and "250 2.0.0 Ok: stored as N") carry an enhanced status code in their text
although aiosmtpd does not advertise ENHANCEDSTATUSCODES: on purpose, a client must take it as
text. Exits 0 on SIGTERM or SIGINT.
"""
import argparse
import asyncio
import json
import os
import signal
import ssl
import sys

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


def local_part(address):
    return address.rpartition("@")[0] if "@" in address else address


def parse_args_list(words):
    """["BODY=8BITMIME", "SMTPUTF8"] -> {"BODY": "8BITMIME", "SMTPUTF8": True}"""
    out = {}
    for w in words or []:
        k, eq, v = w.partition("=")
        out[k.upper()] = v if eq else True
    return out


class Store:
    def __init__(self, directory):
        self.dir = directory
        self.n = 0

    def put(self, content, meta):
        self.n += 1
        base = os.path.join(self.dir, str(self.n))
        with open(base + ".msg", "wb") as f:
            f.write(content)
        with open(base + ".json.tmp", "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)
        os.rename(base + ".json.tmp", base + ".json")


class Handler:
    def __init__(self, store, listener):
        self.store = store
        self.listener = listener

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        lp = local_part(address)
        if lp.startswith("reject"):
            return "550 5.1.1 <%s>: no such user here" % address
        if lp.startswith("defer"):
            return "450 4.2.1 <%s>: try again later" % address
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.append(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        parts = [local_part(r) for r in envelope.rcpt_tos]
        if any(p.startswith("datafail") for p in parts):
            return "554 5.6.0 content refused (datafail recipient)"
        if any(p.startswith("datadefer") for p in parts):
            return "451 4.3.0 content deferred (datadefer recipient)"
        tls = (session.ssl is not None
               or server.transport.get_extra_info("ssl_object") is not None)
        auth = None
        if session.authenticated and isinstance(session.auth_data, LoginPassword):
            auth = session.auth_data.login.decode("utf-8", "replace")
        meta = {
            "mail_from": "" if envelope.mail_from == "<>" else envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "mail_args": parse_args_list(envelope.mail_options),
            "rcpt_args": [parse_args_list(o) for o in envelope.rcpt_options],
            "helo": session.host_name,
            "protocol": "smtp",
            "listener": self.listener,
            "tls": tls,
            "auth": auth,
            "smtputf8": bool(envelope.smtp_utf8),
        }
        self.store.put(bytes(envelope.original_content), meta)
        return "250 2.0.0 Ok: stored as %d" % self.store.n


def make_authenticator(user, password):
    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = (isinstance(auth_data, LoginPassword)
              and auth_data.login == user.encode() and auth_data.password == password.encode())
        return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)
    return authenticator


def split_listen(spec):
    name, eq, addr = spec.partition("=")
    if not eq or not name:
        raise SystemExit("aiosmtpd-peer: listener must be NAME=ADDRESS, not %r" % spec)
    return name, addr


async def serve(a):
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before "ready": a stop may follow at once
        loop.add_signal_handler(sig, stop.set)
    store = Store(a.store)
    tls_ctx = None
    if a.cert:
        tls_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls_ctx.load_cert_chain(a.cert, a.key)
    kw = dict(hostname=a.hostname, enable_SMTPUTF8=a.smtputf8, data_size_limit=a.size_limit)
    if a.auth:
        user, _, password = a.auth.partition(":")
        kw.update(authenticator=make_authenticator(user, password), auth_require_tls=False)

    def factory(name, implicit):
        def make():
            args = dict(kw)
            if tls_ctx is not None and not implicit:
                args.update(tls_context=tls_ctx, require_starttls=a.require_starttls)
            return SMTP(Handler(store, name), loop=loop, **args)
        return make

    servers = []
    for spec, implicit in ([(s, False) for s in a.listen] + [(s, True) for s in a.tls_listen]):
        name, addr = split_listen(spec)
        if implicit and tls_ctx is None:
            raise SystemExit("aiosmtpd-peer: --tls-listen needs --cert and --key")
        if addr.startswith("unix:"):
            path = addr[5:]
            srv = await loop.create_unix_server(factory(name, implicit), path,
                                                ssl=tls_ctx if implicit else None)
            shown = "unix:" + path
        else:
            host, _, port = addr.rpartition(":")
            srv = await loop.create_server(factory(name, implicit), host.strip("[]"), int(port),
                                           ssl=tls_ctx if implicit else None)
            h, p = srv.sockets[0].getsockname()[:2]
            shown = "%s:%d" % (h, p)
        servers.append(srv)
        print("listening %s %s" % (name, shown), file=sys.stderr, flush=True)
    print("ready", file=sys.stderr, flush=True)
    await stop.wait()
    for srv in servers:
        srv.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", action="append", default=[], metavar="NAME=ADDRESS")
    ap.add_argument("--tls-listen", action="append", default=[], metavar="NAME=HOST:PORT")
    ap.add_argument("--store", required=True, help="directory the messages go to")
    ap.add_argument("--cert", help="PEM certificate: STARTTLS offered, --tls-listen possible")
    ap.add_argument("--key", help="PEM private key of --cert")
    ap.add_argument("--require-starttls", action="store_true",
                    help="refuse MAIL before STARTTLS (aiosmtpd's require_starttls)")
    ap.add_argument("--auth", metavar="USER:PASSWORD", help="offer AUTH PLAIN and LOGIN")
    ap.add_argument("--smtputf8", action="store_true", help="offer SMTPUTF8")
    ap.add_argument("--hostname", default="aiosmtpd.peer.test")
    ap.add_argument("--size-limit", type=int, default=32 << 20, help="octets (aiosmtpd's SIZE)")
    a = ap.parse_args()
    if not a.listen and not a.tls_listen:
        ap.error("no listener")
    asyncio.run(serve(a))


if __name__ == "__main__":
    main()
