#!/usr/bin/python3
"""A fake Ray Serve replica that speaks WebSocket (Debian's python3-websockets), for the tunnel
tests (tests/websocket/websocket_test.py).

    /usr/bin/python3 tests/fakes/ws_replica.py --host 127.0.0.2 --name r1

Prints ``PORT <n>`` once serving; then one line per event: ``OPEN <id>`` when a WebSocket opens
(id from the query, ``?id=``), ``CLOSED <id> <code>`` when it ends (1006: no close frame),
``STALLED <id> <bytes>`` when /ws/flood could not send for half a second. Exits at SIGTERM or
when stdin reaches end of file.

Plain HTTP (answered before any handshake):
  /-/healthz          200 "ok"
  /plain              200 "plain <name> <path>"
  /refuse/200         200 "not a websocket" (a handshake the replica refuses with a 200)
  /refuse/426         426 "upgrade required"
WebSocket:
  /ws/echo            every message back, as it came
  /ws/info            first a JSON text message {"replica", "path", "headers"}, then echo
  /ws/push?n=N        N text messages "push <i>" at once, then echo
  /ws/close?code=C&reason=R   closes at once with that code and reason
  /ws/flood           64 KiB binary messages as fast as the socket takes them, forever
"""

import argparse
import asyncio
import http
import json
import os
import signal
import sys
import urllib.parse

import websockets

NAME = "replica"


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def process_request(path, headers):
    url = urllib.parse.urlparse(path)
    if url.path == "/-/healthz":
        return http.HTTPStatus.OK, [("Content-Type", "text/plain")], b"ok"
    if url.path == "/plain":
        return http.HTTPStatus.OK, [("Content-Type", "text/plain")], ("plain %s %s" % (NAME, path)).encode()
    if url.path == "/refuse/200":
        return http.HTTPStatus.OK, [("Content-Type", "text/plain")], b"not a websocket"
    if url.path == "/refuse/426":
        return http.HTTPStatus.UPGRADE_REQUIRED, [("Upgrade", "websocket"), ("Content-Type", "text/plain")], b"upgrade required"
    return None


async def echo(ws):
    async for message in ws:
        await ws.send(message)


async def handler(ws, path):
    url = urllib.parse.urlparse(path)
    query = dict(urllib.parse.parse_qsl(url.query))
    call_id = query.get("id", "-")
    say("OPEN %s" % call_id)
    try:
        if url.path == "/ws/echo":
            await echo(ws)
        elif url.path == "/ws/info":
            await ws.send(json.dumps({"replica": NAME, "path": path,
                                      "headers": {k.lower(): v for k, v in ws.request_headers.raw_items()}}))
            await echo(ws)
        elif url.path == "/ws/push":
            for i in range(int(query.get("n", "1"))):
                await ws.send("push %d" % i)
            await echo(ws)
        elif url.path == "/ws/close":
            await ws.close(int(query.get("code", "1000")), query.get("reason", ""))
        elif url.path == "/ws/flood":
            chunk = os.urandom(64 * 1024)
            sent = 0
            stalled = False
            while True:
                try:
                    await asyncio.wait_for(ws.send(chunk), 0.5)
                    sent += len(chunk)
                except asyncio.TimeoutError:
                    if not stalled:
                        stalled = True
                        say("STALLED %s %d" % (call_id, sent))
                    # The timed-out send was cancelled mid-frame: this connection can carry no
                    # more frames; wait for its end.
                    await ws.wait_closed()
                    break
    except websockets.ConnectionClosed:
        pass
    finally:
        say("CLOSED %s %s" % (call_id, ws.close_code))


async def main():
    global NAME
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.2")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="replica")
    args = parser.parse_args()
    NAME = args.name
    stop = asyncio.get_running_loop().create_future()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    loop.add_reader(0, lambda: (os.read(0, 4096) or (stop.done() or stop.set_result(None))))
    async with websockets.serve(handler, args.host, args.port, process_request=process_request,
                                max_size=4 * 1024 * 1024, ping_interval=None,
                                compression=None) as server:
        say("PORT %d" % server.sockets[0].getsockname()[1])
        await stop


if __name__ == "__main__":
    asyncio.run(main())
