#!/usr/bin/env python3
"""Memory per idle keep-alive client connection.

Reads the proxy's VmRSS (/proc/PID/status), opens N connections to HOST:PORT in batches, sends
one keep-alive GET on each and reads its response, leaves every connection open and idle, waits
for the proxy to settle, reads VmRSS again and prints (RSS_N - RSS_0) / N as JSON. Also checks
that the connections are still open (a sample must not have been closed by the proxy).
"""
import json
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


def begin(args):
    """The request (one keep-alive GET of args.path), then, after the proxy settled, its VmRSS
    before the connections; returns (request, rss0_kib, t0). Shared with tls_idle_conns.py."""
    req = b"GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (args.path.encode(), args.host.encode(), args.port)
    time.sleep(args.settle)
    rss0 = memtest.rss_kib(args.pid)
    return req, rss0, time.monotonic()


def batches(args):
    """The sizes of the batches the N connections are opened in."""
    for start in range(0, args.n, args.batch):
        yield min(args.batch, args.n - start)


def finish(args, socks, failed, non200, t0, rss0, extra=None):
    """After the connections are open (since t0): waits for the proxy to settle, reads VmRSS, checks
    a sample of the connections, closes them all, prints the result as JSON (extra after non200)
    and exits (3 when not all were held). Shared with tls_idle_conns.py."""
    open_s = time.monotonic() - t0
    time.sleep(args.settle)
    rss_n = memtest.rss_kib(args.pid)
    # liveness sample: an idle, still-open socket has nothing to read (EAGAIN; a TLS one at most the
    # session tickets, which the TLS layer consumes: want-read); EOF or an error means closed
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
    out = {"n": args.n, "held": held, "failed": failed, "non200": non200}
    out.update(extra or {})
    out.update({
        "closed_in_sample": closed, "sampled": len(sample),
        "open_seconds": round(open_s, 2), "rss0_kib": rss0, "rssN_kib": rss_n,
        "bytes_per_conn": round((rss_n - rss0) * 1024.0 / held, 1) if held else None,
    })
    print(json.dumps(out))
    sys.exit(0 if held == args.n and not failed else 3)


def main():
    ap = memtest.arg_parser("/v1/models")
    args = ap.parse_args()
    req, rss0, t0 = begin(args)
    socks, failed, non200 = [], 0, 0
    for size in batches(args):
        batch = []
        for _ in range(size):
            try:
                s = socket.create_connection((args.host, args.port), timeout=10)
                s.sendall(req)
                batch.append(s)
            except OSError:
                failed += 1
        for s in batch:
            try:
                if read_response(s) != 200:
                    non200 += 1
                socks.append(s)
            except OSError:
                failed += 1
                s.close()
    finish(args, socks, failed, non200, t0, rss0)


if __name__ == "__main__":
    main()
