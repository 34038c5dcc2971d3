#!/usr/bin/env python3
"""Functional checks of a proxy under test, before anything is measured (bench/run.sh).

  check_routing.py --port P --name NAME [--mode routing|failover|unreachable]

The fake replicas answer `/bench/echo` with who they are and the headers the proxy set
(`replica=r2 xff=127.0.0.1 proto=http rid=...`); the fake routers pick the replica the
`x-session-id` header names (r1..r4), else one at random.

  routing      POSTs (the router path) with x-session-id r1..r4, both spellings (x-session-id and
               x_session_id, Ray's two variants), must reach exactly the replica the router chose,
               with X-Forwarded-For, X-Forwarded-Proto and the client's X-Request-Id; without an
               id the proxy must generate one; 40 POSTs without a session must reach >= 3 of the 4
               replicas (the router's random pick); a GET (the plain path, no router) must carry
               the same headers.
  failover     the llm app's pool holds a dead router too (no listener): 60 POSTs, every one must
               reach the replica the router chose, none may fail (the dead router is tried first
               by every third request: the cursor advances once per request).
  unreachable  every router of the app is dead: a POST must get 503, X-Serve-Reason
               router_unreachable and body "Ingress request router failed: router_unreachable";
               a GET must still be served (no router on the plain path).
Prints one line; exit 1 with the problems listed when a check fails.
"""
import argparse
import http.client
import sys


def call(port, method, path, headers):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    c.request(method, path, body=b'{"model":"llm"}' if method == "POST" else None,
              headers=dict(headers, **{"Content-Type": "application/json"}))
    r = c.getresponse()
    body = r.read().decode(errors="replace")
    c.close()
    fields = dict(kv.split("=", 1) for kv in body.split() if "=" in kv)
    return r.status, fields, r, body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--mode", default="routing", choices=("routing", "failover", "unreachable"))
    a = ap.parse_args()
    problems, n = [], 0

    def expect(cond, what):
        if not cond:
            problems.append(what)

    if a.mode == "routing":
        for k in ("r1", "r2", "r3", "r4"):
            for hname in ("x-session-id", "x_session_id"):
                rid = "check-%s-%s" % (k, hname)
                st, f, _, body = call(a.port, "POST", "/bench/echo", {hname: k, "X-Request-Id": rid})
                n += 1
                expect(st == 200, "POST %s: %s -> %d %r" % (hname, k, st, body[:80]))
                if st != 200:
                    continue
                expect(f.get("replica") == k, "POST %s: %s reached %s" % (hname, k, f.get("replica")))
                expect(f.get("rid") == rid, "POST: X-Request-Id %r reached the replica as %r" % (rid, f.get("rid")))
                expect(f.get("proto") == "http", "POST: X-Forwarded-Proto %r" % f.get("proto"))
                expect(f.get("xff", "").split(",")[-1].strip() == "127.0.0.1", "POST: X-Forwarded-For %r" % f.get("xff"))
        st, f, _, _ = call(a.port, "POST", "/bench/echo", {"x-session-id": "r3"})
        n += 1
        expect(st == 200 and f.get("rid"), "POST without X-Request-Id: none generated (%d %r)" % (st, f))
        seen = set()
        for _ in range(40):
            st, f, _, _ = call(a.port, "POST", "/bench/echo", {})
            n += 1
            expect(st == 200, "POST (random pick) -> %d" % st)
            seen.add(f.get("replica"))
        expect(len(seen) >= 3, "40 random router picks reached only %s" % sorted(seen, key=str))
        st, f, _, _ = call(a.port, "GET", "/bench/echo", {})
        n += 1
        expect(st == 200 and f.get("rid") and f.get("proto") == "http" and f.get("xff"),
               "GET (plain path): %d %r" % (st, f))
        summary = "%d requests: pins r1-r4 honoured (both session header spellings), headers set, %d replicas by random pick" % (n, len(seen))
    elif a.mode == "failover":
        for i in range(60):
            k = "r%d" % (i % 4 + 1)
            st, f, _, body = call(a.port, "POST", "/bench/echo", {"x-session-id": k})
            n += 1
            expect(st == 200 and f.get("replica") == k, "POST %s with a dead router in the pool: %d %r" % (k, st, body[:80]))
        summary = "%d POSTs with a dead router in the pool, all reached the replica the live router chose" % n
    else:
        st, _, r, body = call(a.port, "POST", "/v1/chat/completions", {})
        expect(st == 503 and r.getheader("X-Serve-Reason") == "router_unreachable"
               and body == "Ingress request router failed: router_unreachable",
               "POST with every router dead: %d %s %r" % (st, r.getheader("X-Serve-Reason"), body[:80]))
        st, _, _, _ = call(a.port, "GET", "/v1/models", {})
        expect(st == 200, "GET with every router dead: %d" % st)
        summary = "every router dead: 503 router_unreachable; GET still served"

    if problems:
        print("%s check (%s) FAILED: %s" % (a.name, a.mode, "; ".join(problems[:8])))
        sys.exit(1)
    print("%s check (%s): ok, %s" % (a.name, a.mode, summary))


if __name__ == "__main__":
    main()
