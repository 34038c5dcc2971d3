#!/usr/bin/env python3
"""Ray Serve topology exporter for ingressd (contract §3.2, "topology URL").

When Ray Serve runs its own HAProxy, the dashboard's ``GET /api/serve/applications/`` lists only
the proxies, not the per-app router and replica targets (ray-serve-ingress.md §3.4). The Serve
controller still has them: ``get_target_groups(from_proxy_manager=True)`` returns exactly what
Serve's HAProxy manager receives. This program attaches to the cluster as a Ray driver, asks the
controller every ``--interval`` seconds and serves the latest topology document over HTTP
(``GET /`` and ``GET /topology``) for ``ingressd --topology-url http://HOST:PORT/topology``::

    {"target_groups": [TargetGroup, ...],
     "fallback_targets": {"HTTP": Target, "gRPC": Target},
     "proxies": {node_id: ProxyDetails, ...}}

Each poll:
  * ``target_groups``: ``get_target_groups(from_proxy_manager=True)``, each pydantic
    ``TargetGroup`` passed through exactly as Ray returns it (``model_dump(mode="json")``), its
    per-group ``fallback_target`` included when the Serve version has one.
  * ``fallback_targets``: what the controller broadcasts to its HAProxy managers on the
    ``FALLBACK_TARGETS`` long poll: ``proxy_state_manager.get_fallback_proxy_targets()`` (one
    ``Target`` per ``RequestProtocol``, the head node's fallback Serve proxy), read only once
    ``proxy_state_manager.started_fallback_proxy_at_least_once()`` (the controller's own gate
    in ``run_control_loop_step``; until then the last fallback read stays). It is read through
    the actor handle's ``__ray_call__`` (Ray >= 2.9 runs ``fn(controller)`` inside the
    controller), since the controller has no actor method for it. Every poll replaces the
    previous value, so the document follows the head proxy when it moves; a protocol whose
    target is None is left out (HAProxy drops its backup server then). A Ray without that
    state (a release before Serve's HAProxy fallback proxy, or before ``__ray_call__``) gives
    no ``fallback_targets`` from the controller, and one log line.
  * ``proxies``: the Serve proxies per node with their ``status`` (``STARTING``, ``HEALTHY``,
    ``UNHEALTHY``, ``DRAINING``, ``DRAINED``), in the shape of the dashboard's
    ``ServeInstanceDetails.proxies`` (``ProxyDetails``: node_id, node_ip, node_instance_id,
    actor_id, actor_name, worker_id, log_file_path, status): ``proxy_state_manager
    .get_proxy_details()`` read in the same ``__ray_call__``, or, where that is not available,
    ``get_serve_instance_details()["proxies"]`` (the dashboard's own source). ingressd finds
    its node there and fails its ``/-/healthz`` while Ray drains that node's proxy.
  * ``--http-fallback HOST:PORT`` is an explicit override: it replaces the controller's
    ``fallback_targets.HTTP`` (gRPC still comes from the controller). A pinned address does not
    follow the head node; use it only where the controller has no fallback state (older Ray)
    or its address is not reachable from ingressd.

Behaviour:
  * Until the first successful poll, ``/`` and ``/topology`` answer 503 (ingressd counts that as a
    topology error and keeps waiting); afterwards the last good document is served, also while
    the controller is unreachable (``/-/healthz`` reports how old it is).

Ray source this follows (ray-project/ray at commit 0c64d3d35211e0c2f2d9b2047bd2d9d89d758e09,
read for issue #28): python/ray/serve/_private/controller.py (``get_target_groups``,
``run_control_loop_step``, ``broadcast_fallback_targets_if_changed``,
``get_serve_instance_details``, ``get_proxy_details``), python/ray/serve/schema.py
(``TargetGroup``, ``Target``, ``ServeActorDetails``, ``ProxyDetails``, ``ProxyStatus``,
``ServeInstanceDetails``), python/ray/serve/_private/constants.py
(``RAY_SERVE_FALLBACK_PROXY_HTTP_PORT`` 8500, ``..._GRPC_PORT`` 9500, ``DRAINING_MESSAGE``);
python/ray/serve/_private/haproxy.py at 00526a246a3304459bac849add421f8ae2c6c408
(``HAProxyManager.update_fallback_targets``); the ``ProxyStateManager`` interface as Ray's own
fake has it, python/ray/serve/tests/unit/test_controller_direct_ingress.py at
01588f9f011bd04b43bd51b137d29fcbb576d7dc (``get_fallback_proxy_targets`` ->
``{RequestProtocol: Target}``, ``started_fallback_proxy_at_least_once``, ``get_proxy_details``);
``ActorHandle.__ray_call__``: python/ray/actor.py ``_modify_class`` (``return fn(self, *args,
**kwargs)``, ray-project/ray#41534). All of this is private to Ray Serve and may change.

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
# The name --http-fallback gives its pinned target (Ray names the fallback proxy's actor itself;
# ingressd uses the name only in /topology and the access log).
FALLBACK_PROXY_NAME = "SERVE_FALLBACK_PROXY"
# Ray's ProxyStatus values (python/ray/serve/schema.py), for the log line only: the statuses are
# passed through as the controller gives them.
PROXY_DRAINING = "DRAINING"


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


def build_document(target_groups: Optional[Iterable[Any]], fallback_targets: Optional[Dict[Any, Any]] = None,
                   proxies: Optional[Dict[Any, Any]] = None) -> Dict[str, Any]:
    """The topology document for a list of ``TargetGroup`` objects, an optional
    ``{RequestProtocol: Target}`` fallback mapping (entries whose target is None are dropped) and
    an optional ``{node_id: ProxyDetails}`` mapping (``ServeInstanceDetails.proxies``; kept even
    when empty, None leaves it out)."""
    doc: Dict[str, Any] = {"target_groups": [to_jsonable(group) for group in (target_groups or [])]}
    if fallback_targets:
        fallback = {_key(protocol): to_jsonable(target) for protocol, target in fallback_targets.items() if target is not None}
        if fallback:
            doc["fallback_targets"] = fallback
    if proxies is not None:
        doc["proxies"] = {_key(node_id): to_jsonable(details) for node_id, details in proxies.items()}
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


def make_controller_probe() -> Callable[[Any], Dict[str, Any]]:
    """The function the exporter runs inside the Serve controller through
    ``controller.__ray_call__.remote(probe)`` (Ray calls ``probe(controller_instance)``).

    It returns a dict with, where this Ray has them:
      * ``"fallback_targets"``: ``proxy_state_manager.get_fallback_proxy_targets()``
        (``{RequestProtocol: Target or None}``), or None while
        ``started_fallback_proxy_at_least_once()`` is False (the controller does not broadcast
        them either then);
      * ``"proxies"``: ``proxy_state_manager.get_proxy_details()`` (``{node_id: ProxyDetails}``);
      * ``"error"``: what went wrong inside the controller, if anything did.
    A key that is absent means this Ray has no such state.

    The probe is made inside this function so that Ray's cloudpickle ships it by value (a nested
    function cannot be imported by name on the controller), and it refers to no global of this
    module, only to builtins."""

    def probe(controller: Any) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        try:
            manager = getattr(controller, "proxy_state_manager", AttributeError)
            if manager is AttributeError:
                return out
            if manager is None:  # the controller's own "no proxies" case (controller.get_proxies)
                out["fallback_targets"] = {}
                out["proxies"] = {}
                return out
            get_fallback = getattr(manager, "get_fallback_proxy_targets", None)
            if callable(get_fallback):
                started = getattr(manager, "started_fallback_proxy_at_least_once", None)
                if callable(started) and not started():
                    out["fallback_targets"] = None
                else:
                    out["fallback_targets"] = dict(get_fallback() or {})
            get_details = getattr(manager, "get_proxy_details", None)
            if callable(get_details):
                out["proxies"] = dict(get_details() or {})
        except Exception as exc:  # reported, not raised: the poll goes on with what it has
            out["error"] = repr(exc)
        return out

    return probe


class ControllerPoller:
    """Builds the document from a Serve controller actor handle: each poll calls
    ``get_target_groups(from_proxy_manager=True)`` and runs ``make_controller_probe()`` in the
    controller (``__ray_call__``); where the probe gives no proxies it calls
    ``get_serve_instance_details()`` for them.

    `ray_get` is ``ray.get`` (called as ``ray_get(ref, timeout=...)``); `http_fallback` is the
    ``--http-fallback`` override for ``fallback_targets.HTTP`` (see ``fallback_target``), or
    None to use the controller's."""

    def __init__(self, controller: Any, ray_get: Callable[..., Any], timeout_s: float = 10.0,
                 http_fallback: Optional[Dict[str, Any]] = None) -> None:
        self.controller = controller
        self.ray_get = ray_get
        self.timeout_s = timeout_s
        self.http_fallback = http_fallback
        self.probe = make_controller_probe()
        # The fallback targets last read from the controller ({"HTTP": Target, "gRPC": Target}).
        self.controller_fallback: Dict[str, Any] = {}
        self._said: set = set()

    def poll_once(self) -> Dict[str, Any]:
        groups = self.ray_get(self.controller.get_target_groups.remote(from_proxy_manager=True), timeout=self.timeout_s)
        state = self._probe_controller()
        return build_document(groups, self._fallback_targets(state), self._proxies(state))

    def _say_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)

    def _probe_controller(self) -> Dict[str, Any]:
        try:
            ray_call = self.controller.__ray_call__
        except AttributeError:
            self._say_once("no __ray_call__", "this Ray's actor handles have no __ray_call__ (Ray < 2.9): no fallback "
                           "targets from the controller, proxies from get_serve_instance_details()")
            return {}
        state = self.ray_get(ray_call.remote(self.probe), timeout=self.timeout_s)
        if not isinstance(state, dict):
            return {}
        if "error" in state:
            log.warning("reading the fallback targets and proxies in the Serve controller failed: %s", state["error"])
        return state

    def _fallback_targets(self, state: Dict[str, Any]) -> Dict[str, Any]:
        if "fallback_targets" in state:
            targets = state["fallback_targets"]
            if targets is not None:  # None: the fallback proxy has not started yet; keep the last
                self.controller_fallback = build_document([], targets).get("fallback_targets", {})
        elif "error" not in state:
            self._say_once("no fallback state", "the Serve controller has no fallback proxy targets "
                           "(proxy_state_manager.get_fallback_proxy_targets): the document has %s",
                           "only the --http-fallback override" if self.http_fallback else "no fallback_targets")
            self.controller_fallback = {}
        fallback = dict(self.controller_fallback)
        if self.http_fallback is not None:
            fallback["HTTP"] = self.http_fallback
        return fallback

    def _proxies(self, state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        if state.get("proxies") is not None:
            return state["proxies"]
        try:
            get_details = self.controller.get_serve_instance_details
        except AttributeError:
            self._say_once("no proxies", "the Serve controller lists no proxies: the document has no \"proxies\"")
            return None
        details = self.ray_get(get_details.remote(), timeout=self.timeout_s)
        proxies = details.get("proxies") if isinstance(details, dict) else None
        return proxies if isinstance(proxies, dict) else None


def run_poll_loop(poller: ControllerPoller, store: DocumentStore, interval_s: float, stop: threading.Event,
                  reconnect: Optional[Callable[[], Any]] = None) -> None:
    """Polls until `stop` is set. On failure the last good document stays; `reconnect`, if given,
    returns a fresh controller handle (the controller actor may have restarted)."""
    while not stop.is_set():
        try:
            doc = poller.poll_once()
            if store.set_document(doc):
                groups = doc["target_groups"]
                proxies = doc.get("proxies") or {}
                log.info("topology changed: %d target groups, %d targets, %d router targets, fallback %s, "
                         "%d proxies (%d draining)", len(groups),
                         sum(len(g.get("targets") or []) for g in groups),
                         sum(len(g.get("ingress_request_router_targets") or []) for g in groups),
                         ", ".join(f"{p} {t.get('ip')}:{t.get('port')}" for p, t in (doc.get("fallback_targets") or {}).items())
                         or "none", len(proxies),
                         sum(1 for p in proxies.values() if isinstance(p, dict) and p.get("status") == PROXY_DRAINING))
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
                   help="override: pin fallback_targets.HTTP to HOST:PORT instead of the fallback proxy the "
                        "controller names (which follows the head node); only for a Ray whose controller has no "
                        "fallback targets, or whose fallback address ingressd cannot reach")
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

    if args.http_fallback:
        log.warning("--http-fallback pins fallback_targets.HTTP to %s:%d; the controller's fallback proxy (which "
                    "follows the head node) is not used for HTTP", args.http_fallback["ip"], args.http_fallback["port"])
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
