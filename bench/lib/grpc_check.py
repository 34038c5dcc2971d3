#!/usr/bin/python3
"""bench/grpc.sh's correctness check of one gRPC endpoint (a proxy, or the fake replica directly),
with a real gRPC client (Debian's python3-grpcio, generic calls: no .proto needed).

    /usr/bin/python3 bench/lib/grpc_check.py --name haproxy --port 18903 [--wait 15]

Checks, each must hold (h2load counts HTTP 200s only, and a proxy's own gRPC errors are HTTP 200
trailers-only responses, so this is where grpc-status is checked):
  - /bench.Echo/Unary x 20 with a 100-byte message: the message comes back unchanged, status OK
    (grpc-status 0 in the trailers), with and without the `application: bench` metadata;
  - /bench.Echo/Stream n=5: five messages with sequence numbers 0..4, then status OK;
  - /ray.serve.RayServeAPIService/Healthz: b"\\n\\x07success", status OK;
  - an unknown method: UNIMPLEMENTED from the replica, relayed as such.
Until --wait seconds have passed, a failing first call is retried (a proxy may still be marking
its replica up). Prints one line; exit 0 when everything held, 1 otherwise.
"""
import argparse
import struct
import sys
import time

import grpc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--wait", type=float, default=15.0)
    a = ap.parse_args()

    ch = grpc.insecure_channel("%s:%d" % (a.host, a.port))
    unary = ch.unary_unary("/bench.Echo/Unary")
    stream = ch.unary_stream("/bench.Echo/Stream")
    healthz = ch.unary_unary("/ray.serve.RayServeAPIService/Healthz")
    unknown = ch.unary_unary("/bench.Echo/NoSuchMethod")

    deadline = time.time() + a.wait
    last = None
    while True:  # readiness: the first unary call
        try:
            resp, call = unary.with_call(b"ready", timeout=3)
            if resp == b"ready" and call.code() == grpc.StatusCode.OK:
                break
            last = "unexpected %r %s" % (resp[:40], call.code())
        except grpc.RpcError as e:
            last = "%s %s" % (e.code(), e.details())
        if time.time() > deadline:
            print("%s: not ready on port %d: %s" % (a.name, a.port, last))
            return 1
        time.sleep(0.2)

    failures = []
    n_ok = 0
    payload = bytes(range(100))
    for i in range(20):
        md = (("application", "bench"),) if i % 2 else None
        try:
            resp, call = unary.with_call(payload, metadata=md, timeout=5)
            trailers = dict(call.trailing_metadata() or ())
            if resp != payload or call.code() != grpc.StatusCode.OK:
                failures.append("unary %d: %r %s" % (i, resp[:20], call.code()))
            else:
                n_ok += 1
            _ = trailers
        except grpc.RpcError as e:
            failures.append("unary %d: %s %s" % (i, e.code(), e.details()))

    try:
        call = stream(b"n=5 interval_us=2000 offset_us=0", timeout=5)
        msgs = list(call)
        seqs = [struct.unpack_from("<Q", m, 0)[0] for m in msgs]
        if seqs != [0, 1, 2, 3, 4] or call.code() != grpc.StatusCode.OK:
            failures.append("stream: seqs %s status %s" % (seqs, call.code()))
    except grpc.RpcError as e:
        failures.append("stream: %s %s" % (e.code(), e.details()))

    try:
        resp, call = healthz.with_call(b"", timeout=5)
        if resp != b"\n\x07success" or call.code() != grpc.StatusCode.OK:
            failures.append("healthz: %r %s" % (resp, call.code()))
    except grpc.RpcError as e:
        failures.append("healthz: %s %s" % (e.code(), e.details()))

    try:
        unknown(b"", timeout=5)
        failures.append("unknown method: answered OK")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNIMPLEMENTED:
            failures.append("unknown method: %s %s (want UNIMPLEMENTED)" % (e.code(), e.details()))

    ch.close()
    if failures:
        print("%s: gRPC check FAILED: %s" % (a.name, "; ".join(failures[:6])))
        return 1
    print("%s: gRPC check ok (python grpcio %s): %d unary echoes with grpc-status 0, server stream "
          "5/5 messages + OK, Healthz 'success', unknown method -> UNIMPLEMENTED"
          % (a.name, grpc.__version__, n_ok))
    return 0


if __name__ == "__main__":
    sys.exit(main())
