#!/usr/bin/python3
"""bench/websocket.sh's correctness check of one endpoint, with a real WebSocket client (Debian's
python3-websockets): text and binary echoes, a message sent in fragments, a 1 MiB message, ping
and pong, and the close handshake (1000 back from the replica, bench/ws_load.cpp serve). Run
against direct and each proxy before anything is measured; exit 1 and the reason on a failure.

    /usr/bin/python3 bench/lib/ws_check.py --name ingressd --url ws://127.0.0.3:19300/ws/echo
"""

import argparse
import asyncio
import os
import sys

import websockets


async def check(url):
    done = []
    async with websockets.connect(url, compression=None, max_size=4 * 1024 * 1024, ping_interval=None) as ws:
        for m in ["hello", b"\x00\x01binary", "é ünïcode", "x" * 64]:
            await ws.send(m)
            got = await asyncio.wait_for(ws.recv(), 10)
            if got != m:
                raise AssertionError("echo of %r came back as %r" % (m[:20], got[:20]))
        done.append("4 echoes")
        await ws.send(["frag", "mented", " message"])  # one text message in three frames
        got = await asyncio.wait_for(ws.recv(), 10)
        if got != "fragmented message":
            raise AssertionError("fragmented message came back as %r" % got)
        done.append("fragments")
        blob = os.urandom(1024 * 1024)
        await ws.send(blob)
        got = await asyncio.wait_for(ws.recv(), 20)
        if got != blob:
            raise AssertionError("1 MiB message came back different (%d bytes)" % len(got))
        done.append("1 MiB")
        pong = await ws.ping(b"bench")
        await asyncio.wait_for(pong, 10)
        done.append("ping/pong")
        for i in range(20):
            await ws.send("round %d" % i)
            if await asyncio.wait_for(ws.recv(), 10) != "round %d" % i:
                raise AssertionError("round %d" % i)
        done.append("20 rounds")
        await ws.close(1000, "bench done")
        if ws.close_code != 1000:
            raise AssertionError("close code %s, want 1000" % ws.close_code)
        done.append("close 1000")
        return ws.response_headers, done


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--url", required=True)
    a = ap.parse_args()
    try:
        headers, done = asyncio.run(asyncio.wait_for(check(a.url), 60))
    except Exception as e:  # noqa: BLE001 - any failure is the check's answer
        print("%s: WebSocket check FAILED: %r" % (a.name, e))
        sys.exit(1)
    print("%s: WebSocket check ok (%s); 101 headers: %s" % (
        a.name, ", ".join(done), "; ".join("%s: %s" % (k, v) for k, v in headers.raw_items())))


if __name__ == "__main__":
    main()
