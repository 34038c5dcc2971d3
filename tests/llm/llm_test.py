#!/usr/bin/python3
"""LLM figures measured at the ingress (issue #34): time to first event, events, gaps and
OpenAI-style usage, in ingressd's metrics and access log, against what the client itself saw.

    /usr/bin/python3 tests/llm/llm_test.py --ingressd build/release/ingressd [-v] [TEST ...]

The replica is a fake in this process (http.server, HTTP/1.1, chunked) that streams
`text/event-stream` replies as told by the path, or a JSON reply; the client is http.client.
Loopback only (127.0.0.2), ports bound as 0, everything stopped in cleanups; waits are for events
(a response read to its end, an access log line or a metric polled against a deadline).
"""

import http.client
import http.server
import json
import os
import socket
import sys
import threading
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "grpc"))
import support  # noqa: E402
from support import metric_value  # noqa: E402

NODE = support.THIS_NODE

USAGE = {"prompt_tokens": 17, "completion_tokens": 40, "total_tokens": 57}


def chunk(i):
    return "data: " + json.dumps({"id": "c", "choices": [{"delta": {"content": "t%d" % i}}], "usage": None})


class Replica:
    """/v1/stream?n=N&usage=1&pace_ms=P&eol=lf|crlf|cr&split=1: N events (and the usage chunk), a
    flush per event (or per byte with split=1); /v1/json: a chat.completion with usage;
    /v1/garbage: bytes that are no event stream, sent as one."""

    def __init__(self):
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                self.route()

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(n)
                self.route()

            def send_piece(self, data):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def route(self):
                url = urllib.parse.urlparse(self.path)
                q = dict(urllib.parse.parse_qsl(url.query))
                if url.path == "/-/healthz":
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                    return
                if url.path == "/v1/json":
                    body = json.dumps({"id": "c", "object": "chat.completion",
                                       "choices": [{"message": {"content": "hi"}}], "usage": USAGE}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if url.path == "/v1/garbage":
                    self.send_piece(b"\x00\xffnot: an\rev\nent {\"usage\": {\"prompt_tokens\": 1")
                else:
                    eol = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}[q.get("eol", "lf")]
                    events = [chunk(i) for i in range(int(q.get("n", "5")))]
                    if q.get("usage") == "1":
                        events.append("data: " + json.dumps({"id": "c", "choices": [], "usage": USAGE}))
                    events.append("data: [DONE]")
                    pace = float(q.get("pace_ms", "0")) / 1000
                    for e in events:
                        data = (": a comment" + eol + e + eol + eol).encode()
                        if q.get("split") == "1":
                            for b in data:
                                self.send_piece(bytes([b]))
                        else:
                            self.send_piece(data)
                        if pace:
                            time.sleep(pace)  # the model's pace: the stimulus under test
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = http.server.ThreadingHTTPServer((NODE, 0), H)
        self.host, self.port = NODE, self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def key(self):
        return "%s:%d" % (self.host, self.port)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class LlmTest(unittest.TestCase):
    maxDiff = 4000

    def setUp(self):
        self.r = Replica()
        self.addCleanup(self.r.stop)
        topo = {"target_groups": [{"app_name": "llm", "route_prefix": "/", "protocol": "HTTP",
                                   "targets": [{"ip": NODE, "port": self.r.port, "instance_id": "n1",
                                                "name": "SERVE_REPLICA::llm#r1"}]}],
                "fallback_targets": {}}
        self.d = support.Ingressd(topo, config=support.HTTP_APP_CONFIG, access_log=True)
        self.addCleanup(self.d.stop)
        self.d.wait_http_app("llm", 1)

    def request(self, path, method="GET"):
        """The client's own figures: the body, its time to first event (from sending the request
        to the first complete event it read) and the events it counted."""
        c = http.client.HTTPConnection(NODE, self.d.port, timeout=30)
        self.addCleanup(c.close)
        t0 = time.monotonic()
        c.request(method, path, body=b"{}" if method == "POST" else None,
                  headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        body = b""
        ttft = None
        while True:
            piece = resp.read1(65536)
            if not piece:
                break
            body += piece
            if ttft is None and any(s in body for s in (b"\n\n", b"\r\n\r\n", b"\r\r")):
                ttft = time.monotonic() - t0
        return resp.status, body, ttft

    def line(self, path):
        def find():
            try:
                with open(self.d.access_log_path) as f:
                    for raw in f:
                        e = json.loads(raw)
                        if e.get("path") == path.split("?")[0]:
                            return e
            except FileNotFoundError:
                return None
            return None
        return self.d.wait_until("the access log line of " + path, find)

    def test_stream_events_ttft_gaps_and_usage(self):
        status, body, client_ttft = self.request("/v1/stream?n=30&usage=1&pace_ms=20")
        self.assertEqual(status, 200)
        client_events = body.count(b"data: ")
        self.assertEqual(client_events, 32)  # 30 chunks, the usage chunk, [DONE]
        e = self.line("/v1/stream")
        self.assertEqual(e["events"], client_events)
        self.assertEqual((e["prompt_tokens"], e["completion_tokens"]), (17, 40))
        # ingressd's clock starts after the client sent and its first event left before the client
        # read it: its TTFT is no larger than the client's.
        self.assertIsNotNone(e["ttft_ms"])
        self.assertLessEqual(e["ttft_ms"], client_ttft * 1000)
        # The model paused 20 ms between events: the largest gap ingressd saw is at least that.
        self.assertGreaterEqual(e["max_gap_ms"], 20.0)
        m = self.d.metrics()
        self.assertEqual(metric_value(m, "ingressd_llm_events_total", {"app": "llm"}), client_events)
        self.assertEqual(metric_value(m, "ingressd_llm_tokens_total", {"app": "llm", "kind": "prompt"}), 17)
        self.assertEqual(metric_value(m, "ingressd_llm_tokens_total", {"app": "llm", "kind": "completion"}), 40)
        self.assertEqual(metric_value(m, "ingressd_llm_ttft_seconds_count", {"app": "llm"}), 1)
        self.assertEqual(metric_value(m, "ingressd_llm_inter_event_seconds_count", {"app": "llm"}), client_events - 1)

    def test_line_ends_and_events_split_at_every_byte(self):
        for eol in ("crlf", "cr"):
            path = "/v1/stream?n=7&usage=1&split=1&eol=" + eol
            status, body, _ = self.request(path)
            self.assertEqual(status, 200)
        lines = []
        with open(self.d.access_log_path) as f:
            for raw in f:
                lines.append(json.loads(raw))
        got = [(x["events"], x["prompt_tokens"], x["completion_tokens"]) for x in lines if x["path"] == "/v1/stream"]
        self.assertEqual(got, [(9, 17, 40)] * 2)

    def test_json_reply_usage(self):
        status, body, _ = self.request("/v1/json", "POST")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["usage"], USAGE)
        e = self.line("/v1/json")
        self.assertEqual((e["prompt_tokens"], e["completion_tokens"]), (17, 40))
        self.assertIsNone(e["ttft_ms"])
        self.assertIsNone(e["events"])

    def test_malformed_stream_relayed_unchanged_without_usage(self):
        status, body, _ = self.request("/v1/garbage")
        self.assertEqual(status, 200)
        self.assertEqual(body, b"\x00\xffnot: an\rev\nent {\"usage\": {\"prompt_tokens\": 1")
        e = self.line("/v1/garbage")
        self.assertIsNone(e["prompt_tokens"])
        self.assertIsNone(e["ttft_ms"])

    def test_ten_thousand_events(self):
        status, body, _ = self.request("/v1/stream?n=10000&usage=1")
        self.assertEqual(status, 200)
        self.assertEqual(body.count(b"data: "), 10002)
        e = self.line("/v1/stream")
        self.assertEqual(e["events"], 10002)
        self.assertEqual(e["completion_tokens"], 40)


if __name__ == "__main__":
    support.run_suite()
