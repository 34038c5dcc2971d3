#!/usr/bin/env python3
"""Memory per idle TLS client connection (the TLS variant of idle_conns.py).

Reads the proxy's VmRSS, opens N TCP connections to HOST:PORT in batches and completes a TLS
handshake on each (the handshakes of a batch run concurrently, non-blocking), sends nothing (or,
with --request, one keep-alive GET whose response is read, as idle_conns.py does), leaves every
connection open and idle, waits for the proxy to settle, reads VmRSS again and prints
(RSS_N - RSS_0) / N as JSON. A sample of the connections is then checked to be still open.
Raises its own RLIMIT_NOFILE to the hard limit.
"""
import json
import resource
import selectors
import socket
import ssl
import sys
import time

import memtest


def read_response(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise ConnectionError("closed")
        buf += d
    head, body = buf.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    cl = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            cl = int(v)
    while len(body) < cl:
        d = s.recv(4096)
        if not d:
            raise ConnectionError("closed in body")
        body += d
    return status


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
    req = b"GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (args.path.encode(), args.host.encode(), args.port)
    time.sleep(args.settle)
    rss0 = memtest.rss_kib(args.pid)
    socks, failed, non200 = [], 0, 0
    t0 = time.monotonic()
    for start in range(0, args.n, args.batch):
        batch = []
        for _ in range(min(args.batch, args.n - start)):
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
    open_s = time.monotonic() - t0
    time.sleep(args.settle)
    rss_n = memtest.rss_kib(args.pid)
    # liveness sample: an open idle TLS connection has no application data (at most the session
    # tickets, which the TLS layer consumes): want-read; EOF or an error means it was closed
    closed = 0
    sample = socks[::max(1, len(socks) // 200)]
    for s in sample:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        except OSError:
            closed += 1
    held = len(socks)
    for s in socks:
        s.close()
    out = {
        "n": args.n, "held": held, "failed": failed, "non200": non200, "request": args.request,
        "closed_in_sample": closed, "sampled": len(sample),
        "open_seconds": round(open_s, 2), "rss0_kib": rss0, "rssN_kib": rss_n,
        "bytes_per_conn": round((rss_n - rss0) * 1024.0 / held, 1) if held else None,
    }
    print(json.dumps(out))
    sys.exit(0 if held == args.n and not failed else 3)


if __name__ == "__main__":
    main()
