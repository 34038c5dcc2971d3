#!/usr/bin/env python3
"""Time to first token (TTFT) through a proxy, and per-event delay / batching, for SSE streams.

Sends N sequential POST requests (keep-alive; reconnects if the peer closes) to HOST:PORT PATH,
each answered by bench/lib/sse_server.py (directly or through a proxy). For every request:

  ttft      = arrival of the first byte of the first event  -  just before the request was sent
  event lag = arrival of event i  -  the server's send timestamp carried in event i (i >= 1)
              (both CLOCK_MONOTONIC, same machine)
  batched   = events that completed in the same recv() as the previous event, although the
              server wrote them --interval-ms apart: the proxy held one event back.

Prints one JSON object: medians and p90/p99 in milliseconds, counts, errors.
"""
import argparse
import json
import socket
import statistics
import sys
import time

BODY = (b'{"model":"llm","stream":true,"max_tokens":16,'
        b'"messages":[{"role":"user","content":"Say hello."}]}')


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


class Conn:
    def __init__(self, host, port):
        self.host, self.port = host, port
        self.sock = None

    def ensure(self):
        if self.sock is None:
            s = socket.create_connection((self.host, self.port), timeout=5)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = s
        return self.sock

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def one_request(conn, req):
    """Returns (ttft_ns, [event lags ns], batched_count, close_after)."""
    s = conn.ensure()
    t0 = time.monotonic_ns()
    s.sendall(req)
    buf = b""
    # --- response head
    while b"\r\n\r\n" not in buf:
        data = s.recv(65536)
        t = time.monotonic_ns()
        if not data:
            raise ConnectionError("closed before response head")
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    hdrs = {}
    for line in lines[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            hdrs[k.strip().lower()] = v.strip().lower()
    if status != 200:
        raise RuntimeError("status %d" % status)
    if b"text/event-stream" not in hdrs.get(b"content-type", b""):
        raise RuntimeError("not an event stream (wrong app?)")
    chunked = b"chunked" in hdrs.get(b"transfer-encoding", b"")
    close_after = hdrs.get(b"connection") == b"close" or lines[0].startswith(b"HTTP/1.0")
    # --- body: de-chunk into an SSE byte stream, split events on a blank line
    raw = rest          # undecoded bytes
    recv_time = t        # arrival time of the recv() that delivered `raw`'s newest bytes
    sse = b""
    ttft = None
    events = []          # (arrival_ns, recv_index, payload)
    recv_index = 0
    done = False
    while True:
        if chunked:
            while True:
                if b"\r\n" not in raw:
                    break
                size_line, after = raw.split(b"\r\n", 1)
                size = int(size_line.split(b";", 1)[0], 16)
                if size == 0:
                    if after.startswith(b"\r\n"):
                        done = True
                    break
                if len(after) < size + 2:
                    if after and ttft is None:
                        ttft = recv_time
                    break
                sse += after[:size]
                raw = after[size + 2:]
        else:
            sse += raw
            raw = b""
        if sse and ttft is None:
            ttft = recv_time
        while b"\n\n" in sse:
            ev, sse = sse.split(b"\n\n", 1)
            events.append((recv_time, recv_index, ev))
        if done:
            break
        data = s.recv(65536)
        recv_time = time.monotonic_ns()
        recv_index += 1
        if not data:
            if chunked:
                raise ConnectionError("closed mid-stream")
            break
        raw += data
    lags, batched = [], 0
    prev_idx = None
    for arrival, idx, ev in events:
        if not ev.startswith(b"data: {"):
            continue
        obj = json.loads(ev[6:])
        if obj["i"] >= 1:
            lags.append(arrival - obj["t"])
            if prev_idx is not None and idx == prev_idx:
                batched += 1
        prev_idx = idx
    if close_after:
        conn.close()
    return ttft - t0, lags, batched


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/stream/v1/chat/completions")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    req = (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
           b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
           % (args.path.encode(), args.host.encode(), args.port, len(BODY), BODY))
    conn = Conn(args.host, args.port)
    ttfts, lags, batched, errors, events = [], [], 0, 0, 0
    for i in range(args.warmup + args.n):
        try:
            t, l, b = one_request(conn, req)
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors += 1
            conn.close()
            if errors >= 5:
                print("too many errors, last: %r" % e, file=sys.stderr)
                break
            continue
        if i >= args.warmup:
            ttfts.append(t)
            lags.extend(l)
            batched += b
            events += len(l)
    ms = lambda v: None if v is None else round(v / 1e6, 4)  # noqa: E731
    print(json.dumps({
        "n": len(ttfts), "errors": errors,
        "ttft_p50_ms": ms(statistics.median(ttfts)) if ttfts else None,
        "ttft_p90_ms": ms(pct(ttfts, 90)), "ttft_p99_ms": ms(pct(ttfts, 99)),
        "lag_p50_ms": ms(statistics.median(lags)) if lags else None,
        "lag_p99_ms": ms(pct(lags, 99)),
        "events": events, "batched": batched,
    }))


if __name__ == "__main__":
    main()
