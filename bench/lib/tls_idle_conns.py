#!/usr/bin/env python3
"""Memory per idle TLS client connection (the TLS variant of idle_conns.py).

Reads the proxy's VmRSS, opens N TCP connections to HOST:PORT in batches and completes a TLS
handshake on each (the handshakes of a batch run concurrently, non-blocking), sends nothing (or,
with --request, one keep-alive GET whose response is read, as idle_conns.py does), leaves every
connection open and idle, waits for the proxy to settle, reads VmRSS again and prints
(RSS_N - RSS_0) / N as JSON. A sample of the connections is then checked to be still open.
Raises its own RLIMIT_NOFILE to the hard limit.
"""
import resource
import selectors
import socket
import ssl
import time

import memtest
from idle_conns import batches, begin, finish, read_response


def handshake_all(socks, timeout):
    """Drives the handshakes of non-blocking TLS sockets together; returns (done, failed)."""
    sel = selectors.DefaultSelector()
    pending = {s.fileno(): s for s in socks}
    done, failed = [], 0

    def step(s):
        nonlocal failed
        try:
            s.do_handshake()
        except ssl.SSLWantReadError:
            return selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            return selectors.EVENT_WRITE
        except OSError:
            failed += 1
            s.close()
            return None
        done.append(s)
        return None

    for fd, s in list(pending.items()):
        ev = step(s)
        if ev is None:
            del pending[fd]
        else:
            sel.register(fd, ev)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            s = pending[key.fd]
            sel.unregister(key.fd)
            ev = step(s)
            if ev is None:
                del pending[key.fd]
            else:
                sel.register(key.fd, ev)
    for s in pending.values():
        failed += 1
        s.close()
    sel.close()
    return done, failed


def main():
    ap = memtest.arg_parser("/v1/models")
    ap.add_argument("--request", action="store_true",
                    help="send one keep-alive GET on each connection after the handshake")
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req, rss0, t0 = begin(args)
    socks, failed, non200 = [], 0, 0
    for size in batches(args):
        batch = []
        for _ in range(size):
            try:
                raw = socket.create_connection((args.host, args.port), timeout=10)
                raw.setblocking(False)
                batch.append(ctx.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False))
            except OSError:
                failed += 1
        done, f = handshake_all(batch, timeout=30)
        failed += f
        for s in done:
            if not args.request:
                socks.append(s)
                continue
            try:
                s.setblocking(True)
                s.settimeout(10)
                s.sendall(req)
                if read_response(s) != 200:
                    non200 += 1
                socks.append(s)
            except OSError:
                failed += 1
                s.close()
    finish(args, socks, failed, non200, t0, rss0, {"request": args.request})


if __name__ == "__main__":
    main()
