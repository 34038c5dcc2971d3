#!/usr/bin/env python3
"""Fake streaming (SSE) data-plane replica for the TTFT benchmark. Standard library only.

Every request except GET /-/healthz gets a chunked `text/event-stream` response:
the status line and headers are written and flushed first, the first event follows at once
(a replica that has its first token ready), then `--events - 1` more events `--interval-ms`
apart. Each event is written in its own chunk and flushed on its own, and carries the server's
CLOCK_MONOTONIC send time in nanoseconds, so the client can measure the delay each hop adds to
every event and tell whether a proxy batched events together.

`?hold_ms=N` on the target keeps the stream open N ms after the first event (many-streams test).

HTTP/1.1 keep-alive is supported (proxies pool upstream connections); HTTP/1.0 or
`Connection: close` closes after the response. Request bodies with Content-Length or chunked
framing are read and discarded.
"""
import argparse
import asyncio
import socket
import time


async def read_body(reader, headers):
    te = headers.get(b"transfer-encoding", b"").lower()
    if b"chunked" in te:
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # trailers until an empty line
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return
            await reader.readexactly(size + 2)
    cl = headers.get(b"content-length")
    if cl:
        await reader.readexactly(int(cl))


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def handle(reader, writer, args):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            if len(parts) != 3:
                return
            method, target, version = parts
            headers = {}
            for line in lines[1:]:
                if b":" in line:
                    k, v = line.split(b":", 1)
                    headers[k.strip().lower()] = v.strip()
            await read_body(reader, headers)
            close = version == b"HTTP/1.0" or headers.get(b"connection", b"").lower() == b"close"
            conn_hdr = b"Connection: close\r\n" if close else b""
            if target.startswith(b"/-/healthz"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: 7\r\n" + conn_hdr + b"\r\nsuccess")
                await writer.drain()
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                             + conn_hdr + b"\r\n")
                await writer.drain()
                # `?hold_ms=N` (the many-streams test): the stream stays open N ms after its
                # first event, as a long generation would.
                hold_ms = None
                if b"?hold_ms=" in target:
                    hold_ms = float(target.split(b"?hold_ms=", 1)[1].split(b"&", 1)[0])
                for i in range(args.events):
                    if i and hold_ms is not None:
                        # hold, but end at once when the peer closes (no descriptor left behind)
                        try:
                            if await asyncio.wait_for(reader.read(1), hold_ms / 1000.0) == b"":
                                return
                        except asyncio.TimeoutError:
                            pass
                    elif i:
                        await asyncio.sleep(args.interval_ms / 1000.0)
                    ev = b'data: {"i":%d,"t":%d,"text":"tok"}\n\n' % (i, time.monotonic_ns())
                    writer.write(chunk(ev))
                    await writer.drain()
                writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                await writer.drain()
            if close:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, default=3)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    args = ap.parse_args()
    server = await asyncio.start_server(lambda r, w: handle(r, w, args), args.host, args.port,
                                        backlog=1024, reuse_address=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
