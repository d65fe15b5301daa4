#!/usr/bin/python3
"""aiosmtpd-sink: a peer of the smtpe benchmark (tests/bench/run.sh), an aiosmtpd server (Debian's
python3-aiosmtpd, run by /usr/bin/python3) whose handler accepts every MAIL and RCPT and discards
each message once aiosmtpd has read it to its end. aiosmtpd as shipped: it does not advertise
PIPELINING (smtpe-loadgen --pipelining then goes command by command). Its asyncio server is made
here with loop.create_server so that the listen backlog is large (the kernel caps it at
net.core.somaxconn). Prints "listening on 127.0.0.1:PORT" on stderr once bound; exits 0 on
SIGTERM or SIGINT.

    /usr/bin/python3 aiosmtpd_sink.py --listen 127.0.0.1:2525
"""
import argparse
import asyncio
import resource
import signal
import sys

from aiosmtpd.smtp import SMTP


class Discard:
    async def handle_DATA(self, server, session, envelope):
        envelope.content = envelope.original_content = None
        return "250 OK"


async def serve(host, port):
    loop = asyncio.get_running_loop()
    handler = Discard()
    # hostname given: aiosmtpd would otherwise call socket.getfqdn() for every connection.
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="aiosmtpd", loop=loop), host, port, backlog=65535)
    bound = server.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:2525", help="IPV4:PORT to listen on")
    args = ap.parse_args()
    host, _, port = args.listen.rpartition(":")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(serve(host, int(port)))


if __name__ == "__main__":
    main()
