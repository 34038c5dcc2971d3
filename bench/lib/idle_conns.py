#!/usr/bin/env python3
"""Memory per idle keep-alive client connection.

Reads the proxy's VmRSS (/proc/PID/status), opens N connections to HOST:PORT in batches, sends
one keep-alive GET on each and reads its response, leaves every connection open and idle, waits
for the proxy to settle, reads VmRSS again and prints (RSS_N - RSS_0) / N as JSON. Also checks
that the connections are still open (a sample must not have been closed by the proxy).
"""
import json
import socket
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


def main():
    ap = memtest.arg_parser("/v1/models")
    args = ap.parse_args()
    req = b"GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (args.path.encode(), args.host.encode(), args.port)
    time.sleep(args.settle)
    rss0 = memtest.rss_kib(args.pid)
    socks, failed, non200 = [], 0, 0
    t0 = time.monotonic()
    for start in range(0, args.n, args.batch):
        batch = []
        for _ in range(min(args.batch, args.n - start)):
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
    open_s = time.monotonic() - t0
    time.sleep(args.settle)
    rss_n = memtest.rss_kib(args.pid)
    # liveness sample: an idle, still-open socket has nothing to read (EAGAIN); EOF means closed
    closed = 0
    step = max(1, len(socks) // 200)
    for s in socks[::step]:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_DONTWAIT) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    held = len(socks)
    for s in socks:
        s.close()
    out = {
        "n": args.n, "held": held, "failed": failed, "non200": non200,
        "closed_in_sample": closed, "sampled": len(socks[::step]),
        "open_seconds": round(open_s, 2), "rss0_kib": rss0, "rssN_kib": rss_n,
        "bytes_per_conn": round((rss_n - rss0) * 1024.0 / held, 1) if held else None,
    }
    print(json.dumps(out))
    sys.exit(0 if held == args.n and not failed else 3)


if __name__ == "__main__":
    main()
