#!/usr/bin/env python3
"""Memory per concurrent SSE stream held open through a proxy.

Reads the proxy's VmRSS, opens N streaming POSTs (the router path) in batches, each to
`PATH?hold_ms=...` so that the SSE replica keeps every stream open after its first event, waits
until every stream has received its response head and first event, lets the proxy settle, reads
VmRSS again and prints (RSS_N - RSS_0) / N as JSON, then closes everything. Standard library only.
"""
import asyncio
import json
import time

import memtest




async def open_stream(host, port, req):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(req)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        writer.close()
        raise ConnectionError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
    await reader.readuntil(b"\n\n")  # the first event (inside its chunk)
    return writer


async def main():
    ap = memtest.arg_parser("/stream/v1/chat/completions")
    ap.add_argument("--hold-ms", type=int, default=60000)
    args = ap.parse_args()
    body = b'{"model":"llm","stream":true}'
    req = (b"POST %s?hold_ms=%d HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (args.path.encode(), args.hold_ms, args.host.encode(),
                                              args.port, len(body), body))
    await asyncio.sleep(args.settle)
    rss0 = memtest.rss_kib(args.pid)
    writers, failed, first_error = [], 0, ""
    t0 = time.monotonic()
    for start in range(0, args.n, args.batch):
        results = await asyncio.gather(*[open_stream(args.host, args.port, req)
                                         for _ in range(min(args.batch, args.n - start))],
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                failed += 1
                first_error = first_error or repr(r)
            else:
                writers.append(r)
    opened = time.monotonic() - t0
    await asyncio.sleep(args.settle)
    rssn = memtest.rss_kib(args.pid)
    held = len(writers)
    for w in writers:
        w.close()
    print(json.dumps({"n": args.n, "held": held, "failed": failed, "first_error": first_error,
                      "open_seconds": round(opened, 2), "rss0_kib": rss0, "rssN_kib": rssn,
                      "bytes_per_stream": round((rssn - rss0) * 1024.0 / max(held, 1), 1)}))


if __name__ == "__main__":
    asyncio.run(main())
