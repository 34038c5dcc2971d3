#!/usr/bin/env python3
"""Ray Serve topology exporter for ingressd (contract §3.2, "topology URL").

When Ray Serve runs its own HAProxy, the dashboard's ``GET /api/serve/applications/`` lists only
the proxies, not the per-app router and replica targets (ray-serve-ingress.md §3.4). The Serve
controller still has them: ``get_target_groups(from_proxy_manager=True)`` returns exactly what
Serve's HAProxy manager receives. This program attaches to the cluster as a Ray driver, calls that
method every ``--interval`` seconds, converts the pydantic ``TargetGroup`` objects to ingressd's
topology document::

    {"target_groups": [TargetGroup, ...], "fallback_targets": {"HTTP": Target, ...}}

and serves the latest document over HTTP (``GET /`` and ``GET /topology``) for
``ingressd --topology-url http://HOST:PORT/topology``.

Behaviour:
  * Until the first successful poll, ``/`` and ``/topology`` answer 503 (ingressd counts that as a
    topology error and keeps waiting); afterwards the last good document is served, also while
    the controller is unreachable (``/-/healthz`` reports how old it is).
  * ``get_target_groups`` is the only controller method called. Each group is passed through
    exactly as Ray returns it, its ``fallback_target`` included when the Serve version has one.
  * The controller has no public method for the fallback targets (it broadcasts them to its
    HAProxy managers on the FALLBACK_TARGETS long poll, ray python/ray/serve/_private/
    controller.py ``broadcast_fallback_targets_if_changed``). ``--http-fallback HOST:PORT`` names
    the head node's fallback Serve proxy (``RAY_SERVE_FALLBACK_PROXY_HTTP_PORT``, 8500 by
    default) for ``fallback_targets.HTTP``: where ingressd sends an app with no running replica.

Ray is imported only inside ``main()``; the conversion and the HTTP server work (and are tested)
without Ray installed. Run it with the same Python environment (same Ray version) as the
cluster, on any node that can reach the head node::

    python3 ray_topology_exporter.py --port 8266
    ingressd --topology-url http://127.0.0.1:8266/topology
"""

from __future__ import annotations

import argparse
import enum
import http.server
import json
import logging
import socket
import socketserver
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

log = logging.getLogger("ray_topology_exporter")

SERVE_NAMESPACE = "serve"
SERVE_CONTROLLER_NAME = "SERVE_CONTROLLER_ACTOR"
DOCUMENT_PATHS = ("/", "/topology")
# The name --http-fallback gives the fallback target (Ray names the fallback proxy's actor itself;
# ingressd uses the name only in /topology and the access log).
FALLBACK_PROXY_NAME = "SERVE_FALLBACK_PROXY"


# ------------------------------------------------------------------------------------------------
# Conversion (no Ray needed)


def to_jsonable(value: Any) -> Any:
    """Converts pydantic models (v2 ``model_dump(mode="json")`` or v1 ``.dict()``), enums,
    mappings and sequences to plain JSON values. Enum members become their ``.value`` (so
    ``RequestProtocol.HTTP`` -> ``"HTTP"``), also as mapping keys."""
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return to_jsonable(model_dump(mode="json"))
    as_dict = getattr(value, "dict", None)
    if callable(as_dict) and not isinstance(value, dict):
        return to_jsonable(as_dict())
    if isinstance(value, dict):
        return {_key(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    raise TypeError(f"cannot convert {type(value).__name__} to JSON")


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    return str(key)


def build_document(target_groups: Optional[Iterable[Any]], fallback_targets: Optional[Dict[Any, Any]] = None) -> Dict[str, Any]:
    """The topology document for a list of ``TargetGroup`` objects and an optional
    ``{RequestProtocol: Target}`` fallback mapping (entries whose target is None are dropped)."""
    doc: Dict[str, Any] = {"target_groups": [to_jsonable(group) for group in (target_groups or [])]}
    if fallback_targets:
        fallback = {_key(protocol): to_jsonable(target) for protocol, target in fallback_targets.items() if target is not None}
        if fallback:
            doc["fallback_targets"] = fallback
    return doc


def encode_document(doc: Dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=False).encode("utf-8")


# ------------------------------------------------------------------------------------------------
# Latest document + HTTP server (no Ray needed)


class DocumentStore:
    """The latest good document (thread-safe), plus the last poll error."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._body: Optional[bytes] = None
        self._updated: Optional[float] = None
        self._error: Optional[str] = None
        self._generation = 0

    def set_document(self, doc: Dict[str, Any]) -> bool:
        """Stores `doc`; returns True when its content changed."""
        body = encode_document(doc)
        with self._lock:
            changed = body != self._body
            self._body = body
            self._updated = self._clock()
            self._error = None
            if changed:
                self._generation += 1
            return changed

    def set_error(self, message: str) -> None:
        with self._lock:
            self._error = message

    def snapshot(self) -> Tuple[Optional[bytes], Optional[float], Optional[str], int]:
        with self._lock:
            return self._body, self._updated, self._error, self._generation


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "ray-topology-exporter/1"
    protocol_version = "HTTP/1.1"
    store: DocumentStore  # set on the subclass made by make_server

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._answer(head_only=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head_only=True)

    def _answer(self, head_only: bool) -> None:
        path = self.path.split("?", 1)[0]
        body, updated, error, generation = self.store.snapshot()
        if path in DOCUMENT_PATHS:
            if body is None:
                message = error or "no topology fetched from the Serve controller yet"
                self._send(503, "application/json", encode_document({"error": message}), head_only)
            else:
                self._send(200, "application/json", body, head_only, {"X-Topology-Generation": str(generation)})
        elif path == "/-/healthz":
            if body is None:
                self._send(503, "text/plain", b"no topology yet\n", head_only)
            else:
                age = time.time() - (updated or 0.0)
                text = f"ok, updated {age:.1f}s ago" + (f", last error: {error}" if error else "")
                self._send(200, "text/plain", (text + "\n").encode("utf-8"), head_only)
        else:
            self._send(404, "application/json", encode_document({"error": "not found"}), head_only)

    def _send(self, status: int, content_type: str, body: bytes, head_only: bool, extra: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), fmt % args)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(store: DocumentStore, host: str = "127.0.0.1", port: int = 0) -> http.server.HTTPServer:
    """An HTTP server (not yet serving) that answers from `store`. Port 0 picks a free port
    (see ``server.server_address``). Call ``serve_forever()`` on a thread and ``shutdown()`` +
    ``server_close()`` to stop it."""
    handler = type("Handler", (_Handler,), {"store": store})
    if ":" in host:
        server_class = type("Server6", (_Server,), {"address_family": socket.AF_INET6})
        return server_class((host, port), handler)
    return _Server((host, port), handler)


# ------------------------------------------------------------------------------------------------
# Polling the controller (Ray objects are passed in, so tests can fake them)


def fallback_target(address: str) -> Dict[str, Any]:
    """A Ray ``Target`` for ``--http-fallback HOST:PORT`` (IPv6 as ``[::1]:8500``)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return {"ip": host, "port": int(port), "instance_id": "", "name": FALLBACK_PROXY_NAME}


class ControllerPoller:
    """Fetches the document from a Serve controller actor handle: ``get_target_groups`` is the one
    controller method it calls.

    `ray_get` is ``ray.get`` (called as ``ray_get(ref, timeout=...)``); `http_fallback` is the
    ``fallback_targets.HTTP`` target (see ``fallback_target``), or None."""

    def __init__(self, controller: Any, ray_get: Callable[..., Any], timeout_s: float = 10.0,
                 http_fallback: Optional[Dict[str, Any]] = None) -> None:
        self.controller = controller
        self.ray_get = ray_get
        self.timeout_s = timeout_s
        self.http_fallback = http_fallback

    def poll_once(self) -> Dict[str, Any]:
        groups = self.ray_get(self.controller.get_target_groups.remote(from_proxy_manager=True), timeout=self.timeout_s)
        return build_document(groups, {"HTTP": self.http_fallback} if self.http_fallback else None)


def run_poll_loop(poller: ControllerPoller, store: DocumentStore, interval_s: float, stop: threading.Event,
                  reconnect: Optional[Callable[[], Any]] = None) -> None:
    """Polls until `stop` is set. On failure the last good document stays; `reconnect`, if given,
    returns a fresh controller handle (the controller actor may have restarted)."""
    while not stop.is_set():
        try:
            doc = poller.poll_once()
            if store.set_document(doc):
                groups = doc["target_groups"]
                log.info("topology changed: %d target groups, %d targets, %d router targets", len(groups),
                         sum(len(g.get("targets") or []) for g in groups),
                         sum(len(g.get("ingress_request_router_targets") or []) for g in groups))
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            log.warning("polling the Serve controller failed: %s", message)
            store.set_error(message)
            if reconnect is not None:
                try:
                    poller.controller = reconnect()
                except Exception as again:
                    log.warning("cannot get the Serve controller actor: %s", again)
        stop.wait(interval_s)


# ------------------------------------------------------------------------------------------------


def parse_args(argv: Optional[Iterable[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Serve Ray Serve target groups as an ingressd topology document.")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8266, help="listen port (default 8266)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between controller polls (default 1)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for one controller call (default 10)")
    p.add_argument("--address", default="auto", help='Ray cluster address for ray.init (default "auto")')
    p.add_argument("--namespace", default=SERVE_NAMESPACE, help='Serve namespace (default "serve")')
    p.add_argument("--controller", default=SERVE_CONTROLLER_NAME, help="Serve controller actor name")
    p.add_argument("--http-fallback", default=None, metavar="HOST:PORT", type=fallback_target,
                   help="the head node's fallback Serve proxy (port 8500 unless RAY_SERVE_FALLBACK_PROXY_HTTP_PORT "
                        "says otherwise): fallback_targets.HTTP, where ingressd sends apps with no running replica")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p.parse_args(list(argv) if argv is not None else None)


def main(argv: Optional[Iterable[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import ray  # noqa: WPS433 (lazy on purpose: the rest of the module works without Ray)
    except ImportError:
        log.error("Ray is not installed in this Python environment; use the cluster's Python")
        return 2

    ray.init(address=args.address, namespace=args.namespace, log_to_driver=False)

    def get_controller() -> Any:
        return ray.get_actor(args.controller, namespace=args.namespace)

    try:
        controller = get_controller()
    except ValueError as exc:
        log.error("Serve controller actor %r not found in namespace %r (is Serve running?): %s",
                  args.controller, args.namespace, exc)
        return 1

    store = DocumentStore()
    server = make_server(store, args.host, args.port)
    host, port = server.server_address[:2]
    log.info("serving the topology document on http://%s:%d/topology", host if ":" not in host else f"[{host}]", port)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()

    stop = threading.Event()
    poller = ControllerPoller(controller, ray.get, timeout_s=args.timeout, http_fallback=args.http_fallback)
    try:
        run_poll_loop(poller, store, args.interval, stop, reconnect=get_controller)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
