#!/usr/bin/env python3
"""Tests for ray_topology_exporter.py (stdlib only; Ray is not needed)."""

import enum
import inspect
import json
import os
import sys
import threading
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ray_topology_exporter as exporter  # noqa: E402


class RequestProtocol(str, enum.Enum):
    HTTP = "HTTP"
    GRPC = "gRPC"


class FakeModelV2:
    """Looks like a pydantic v2 model: model_dump(mode="json") already gives JSON values."""

    def __init__(self, data):
        self._data = data
        self.modes = []

    def model_dump(self, mode="python"):
        self.modes.append(mode)
        return dict(self._data)


class FakeModelV1:
    """Looks like a pydantic v1 model: .dict() keeps enums and nested models as dicts."""

    def __init__(self, **fields):
        self._fields = fields

    def dict(self):
        out = {}
        for name, value in self._fields.items():
            if isinstance(value, FakeModelV1):
                value = value.dict()
            elif isinstance(value, list):
                value = [v.dict() if isinstance(v, FakeModelV1) else v for v in value]
            out[name] = value
        return out


def v1_target(ip, port, name):
    return FakeModelV1(ip=ip, port=port, instance_id="i-" + ip, name=name)


# Field by field as Ray's pydantic models have them (ray python/ray/serve/schema.py, TargetGroup
# and Target at ray-project/ray 0c64d3d): every field, defaults included, as model_dump gives it.
V1_GROUP = FakeModelV1(
    targets=[v1_target("10.0.0.5", 30001, "SERVE_REPLICA::llm#LLMServer#a")],
    route_prefix="/v1",
    protocol=RequestProtocol.HTTP,
    app_name="llm",
    ingress_request_router_targets=[v1_target("10.0.0.5", 30004, "SERVE_REPLICA::llm#LLMRouter#r")],
    ingress_router_fallback=False,
    ingress_deployment_name="LLMServer",
)

EXPECTED_V1_GROUP = {
    "targets": [{"ip": "10.0.0.5", "port": 30001, "instance_id": "i-10.0.0.5", "name": "SERVE_REPLICA::llm#LLMServer#a"}],
    "route_prefix": "/v1",
    "protocol": "HTTP",
    "app_name": "llm",
    "ingress_request_router_targets": [
        {"ip": "10.0.0.5", "port": 30004, "instance_id": "i-10.0.0.5", "name": "SERVE_REPLICA::llm#LLMRouter#r"}
    ],
    "ingress_router_fallback": False,
    "ingress_deployment_name": "LLMServer",
}

# An app scaled to zero as get_target_groups(from_proxy_manager=True) gives it in HAProxy mode
# (controller.py _get_target_groups_for_app_with_no_running_replicas): no targets, no routers;
# with a Serve version whose TargetGroup carries fallback_target (contract §9), that too.
V2_SCALED_TO_ZERO = {
    "targets": [],
    "route_prefix": "/v1",
    "protocol": "HTTP",
    "app_name": "llm",
    "ingress_request_router_targets": [],
    "ingress_router_fallback": False,
    "ingress_deployment_name": "LLMServer",
    "fallback_target": {"ip": "10.0.0.1", "port": 8500, "instance_id": "i-head", "name": "SERVE_PROXY_ACTOR-fallback"},
}

class ConversionTest(unittest.TestCase):
    def test_module_does_not_import_ray(self):
        self.assertFalse(hasattr(exporter, "ray"))

    def test_pydantic_v1_models_with_enums(self):
        doc = exporter.build_document([V1_GROUP])
        self.assertEqual(doc, {"target_groups": [EXPECTED_V1_GROUP]})
        # Round-trips through JSON with the enum as its value.
        self.assertEqual(json.loads(exporter.encode_document(doc))["target_groups"][0]["protocol"], "HTTP")

    def test_pydantic_v2_models_use_json_mode(self):
        group = FakeModelV2({"targets": [], "route_prefix": "/", "protocol": "gRPC", "app_name": "g"})
        doc = exporter.build_document([group])
        self.assertEqual(doc["target_groups"][0]["protocol"], "gRPC")
        self.assertEqual(group.modes, ["json"])

    def test_group_fallback_target_passes_through_as_ray_returns_it(self):
        doc = exporter.build_document([FakeModelV2(V2_SCALED_TO_ZERO)])
        self.assertEqual(doc, {"target_groups": [V2_SCALED_TO_ZERO]})
        # A Serve version without a fallback for the group dumps None: passed through too
        # (ingressd reads a null field as absent).
        no_fallback = dict(V2_SCALED_TO_ZERO, fallback_target=None)
        self.assertEqual(exporter.build_document([FakeModelV2(no_fallback)])["target_groups"][0]["fallback_target"],
                         None)

    def test_fallback_targets_keyed_by_enum(self):
        fallback = {
            RequestProtocol.HTTP: v1_target("10.0.0.1", 8000, "SERVE_PROXY_ACTOR-head"),
            RequestProtocol.GRPC: None,
        }
        doc = exporter.build_document([], fallback)
        self.assertEqual(doc["target_groups"], [])
        self.assertEqual(
            doc["fallback_targets"],
            {"HTTP": {"ip": "10.0.0.1", "port": 8000, "instance_id": "i-10.0.0.1", "name": "SERVE_PROXY_ACTOR-head"}},
        )

    def test_empty_or_missing_fallback_is_omitted(self):
        self.assertEqual(exporter.build_document(None, {}), {"target_groups": []})
        self.assertEqual(exporter.build_document([], {RequestProtocol.HTTP: None}), {"target_groups": []})

    def test_unknown_objects_are_rejected(self):
        with self.assertRaises(TypeError):
            exporter.to_jsonable(object())


class FakeRef:
    def __init__(self, value):
        self.value = value


class FakeMethod:
    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def remote(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return FakeRef(self.fn(*args, **kwargs))


class ProxyStatus(str, enum.Enum):
    """Ray's ProxyStatus (python/ray/serve/schema.py at ray-project/ray 0c64d3d)."""

    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"


def v2_target(ip, port, instance_id, name):
    """A pydantic v2 Target (schema.py: ip, port, instance_id, name)."""
    return FakeModelV2({"ip": ip, "port": port, "instance_id": instance_id, "name": name})


def v1_proxy_details(node_id, node_ip, status):
    """A ProxyDetails (schema.py: ServeActorDetails' node_id, node_ip, node_instance_id, actor_id,
    actor_name, worker_id, log_file_path, plus status) as pydantic v1 gives it: the status an enum."""
    return FakeModelV1(node_id=node_id, node_ip=node_ip, node_instance_id="i-" + node_id,
                       actor_id="a-proxy-" + node_id, actor_name="SERVE_PROXY_ACTOR-" + node_id,
                       worker_id="w-proxy-" + node_id,
                       log_file_path=f"/tmp/ray/session_latest/logs/serve/proxy_{node_ip}.log", status=status)


def expected_proxy(node_id, node_ip, status):
    return {"node_id": node_id, "node_ip": node_ip, "node_instance_id": "i-" + node_id,
            "actor_id": "a-proxy-" + node_id, "actor_name": "SERVE_PROXY_ACTOR-" + node_id,
            "worker_id": "w-proxy-" + node_id,
            "log_file_path": f"/tmp/ray/session_latest/logs/serve/proxy_{node_ip}.log", "status": status}


HEAD_FALLBACK = {
    RequestProtocol.HTTP: v2_target("10.0.0.1", 8500, "i-head", "SERVE_PROXY_ACTOR-fallback"),
    RequestProtocol.GRPC: v2_target("10.0.0.1", 9500, "i-head", "SERVE_PROXY_ACTOR-fallback"),
}
EXPECTED_HEAD_FALLBACK = {
    "HTTP": {"ip": "10.0.0.1", "port": 8500, "instance_id": "i-head", "name": "SERVE_PROXY_ACTOR-fallback"},
    "gRPC": {"ip": "10.0.0.1", "port": 9500, "instance_id": "i-head", "name": "SERVE_PROXY_ACTOR-fallback"},
}


class FakeProxyStateManager:
    """The controller's ProxyStateManager, only what the controller (controller.py at 0c64d3d:
    run_control_loop_step, broadcast_fallback_targets_if_changed, get_serve_instance_details)
    calls on it, with the interface of Ray's own fake in
    python/ray/serve/tests/unit/test_controller_direct_ingress.py (01588f9f)."""

    def __init__(self, fallback_targets=None, started=True, proxy_details=None):
        self.fallback_targets = dict(fallback_targets or {})
        self.started = started
        self.proxy_details = dict(proxy_details or {})

    def get_fallback_proxy_targets(self):
        return dict(self.fallback_targets)

    def started_fallback_proxy_at_least_once(self):
        return self.started

    def get_proxy_details(self):
        return dict(self.proxy_details)


class OldProxyStateManager:
    """A Ray release whose ProxyStateManager has no fallback targets: only get_proxy_details."""

    def __init__(self, proxy_details=None):
        self.proxy_details = dict(proxy_details or {})

    def get_proxy_details(self):
        return dict(self.proxy_details)


class FakeServeController:
    """The ServeController actor instance that __ray_call__ hands the probe."""

    def __init__(self, proxy_state_manager):
        self.proxy_state_manager = proxy_state_manager


class FakeController:
    """A Serve controller actor handle. `instance` is the ServeController object that
    ``__ray_call__`` runs the probe on (Ray's ``_modify_class``: ``return fn(self, *args,
    **kwargs)``); without it the handle has no ``__ray_call__`` (Ray < 2.9).
    `instance_details` is what ``get_serve_instance_details()`` returns (the dashboard's
    ServeInstanceDetails dict); None leaves that method out. Any other attribute is an
    AttributeError, as on a real ActorHandle, and is recorded in `missing`."""

    def __init__(self, groups, instance=None, instance_details=None):
        self.groups = groups
        self.missing = []
        self.get_target_groups = FakeMethod(lambda **kw: self.groups)
        if instance is not None:
            self.__ray_call__ = FakeMethod(lambda fn, *a, **kw: fn(instance, *a, **kw))
        if instance_details is not None:
            self.get_serve_instance_details = FakeMethod(lambda: instance_details)

    def __getattr__(self, name):
        self.missing.append(name)
        raise AttributeError(f"'ActorHandle' object has no attribute '{name}'")


def current_controller(groups, manager=None):
    return FakeController(groups, instance=FakeServeController(manager or FakeProxyStateManager()),
                          instance_details={"proxies": {"ignored": {}}})


def fake_ray_get(ref, timeout=None):
    assert timeout is not None
    if isinstance(ref.value, Exception):
        raise ref.value
    return ref.value


def load_fixture(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "ray", name)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class PollerTest(unittest.TestCase):
    def test_poll_asks_get_target_groups_for_the_proxy_manager_view(self):
        controller = current_controller([V1_GROUP, FakeModelV2(V2_SCALED_TO_ZERO)])
        doc = exporter.ControllerPoller(controller, fake_ray_get).poll_once()
        self.assertEqual(controller.get_target_groups.calls, [((), {"from_proxy_manager": True})])
        self.assertEqual(len(controller.__ray_call__.calls), 1)
        # The probe gave the proxies: the heavy get_serve_instance_details is not called.
        self.assertEqual(controller.get_serve_instance_details.calls, [])
        self.assertEqual(controller.missing, [])
        self.assertEqual(doc, {"target_groups": [EXPECTED_V1_GROUP, V2_SCALED_TO_ZERO], "proxies": {}})

    def test_fallback_targets_come_from_the_controller_each_poll(self):
        manager = FakeProxyStateManager(fallback_targets=HEAD_FALLBACK)
        controller = current_controller([V1_GROUP], manager)
        poller = exporter.ControllerPoller(controller, fake_ray_get)
        self.assertEqual(poller.poll_once()["fallback_targets"], EXPECTED_HEAD_FALLBACK)
        self.assertEqual(poller.poll_once()["fallback_targets"], EXPECTED_HEAD_FALLBACK)
        self.assertEqual(len(controller.__ray_call__.calls), 2)  # asked again on every poll

    def test_fallback_follows_the_head_proxy_when_it_moves(self):
        manager = FakeProxyStateManager(fallback_targets=HEAD_FALLBACK)
        poller = exporter.ControllerPoller(current_controller([V1_GROUP], manager), fake_ray_get)
        self.assertEqual(poller.poll_once()["fallback_targets"]["HTTP"]["ip"], "10.0.0.1")
        # A new head node: the controller now names the fallback proxy there.
        manager.fallback_targets = {
            RequestProtocol.HTTP: v2_target("10.0.0.9", 8500, "i-head2", "SERVE_PROXY_ACTOR-fallback"),
            RequestProtocol.GRPC: v2_target("10.0.0.9", 9500, "i-head2", "SERVE_PROXY_ACTOR-fallback"),
        }
        moved = poller.poll_once()["fallback_targets"]
        self.assertEqual(moved, {
            "HTTP": {"ip": "10.0.0.9", "port": 8500, "instance_id": "i-head2", "name": "SERVE_PROXY_ACTOR-fallback"},
            "gRPC": {"ip": "10.0.0.9", "port": 9500, "instance_id": "i-head2", "name": "SERVE_PROXY_ACTOR-fallback"},
        })
        # The fallback proxy unhealthy (its target None, as HAProxy's update_fallback_targets gets
        # it): that protocol leaves the document, the other stays.
        manager.fallback_targets = {RequestProtocol.HTTP: None, RequestProtocol.GRPC: HEAD_FALLBACK[RequestProtocol.GRPC]}
        self.assertEqual(poller.poll_once()["fallback_targets"], {"gRPC": EXPECTED_HEAD_FALLBACK["gRPC"]})
        manager.fallback_targets = {}
        self.assertNotIn("fallback_targets", poller.poll_once())

    def test_fallback_waits_for_the_fallback_proxy_like_the_controller(self):
        # After a controller restart the fallback proxy is STARTING and its target None; the
        # controller broadcasts nothing until started_fallback_proxy_at_least_once().
        manager = FakeProxyStateManager(fallback_targets={RequestProtocol.HTTP: None}, started=False)
        poller = exporter.ControllerPoller(current_controller([V1_GROUP], manager), fake_ray_get)
        self.assertNotIn("fallback_targets", poller.poll_once())
        manager.started, manager.fallback_targets = True, HEAD_FALLBACK
        self.assertEqual(poller.poll_once()["fallback_targets"], EXPECTED_HEAD_FALLBACK)
        # Restarted again: the last fallback read stays until the proxy has started.
        manager.started, manager.fallback_targets = False, {RequestProtocol.HTTP: None, RequestProtocol.GRPC: None}
        self.assertEqual(poller.poll_once()["fallback_targets"], EXPECTED_HEAD_FALLBACK)

    def test_older_controller_without_fallback_state(self):
        # __ray_call__ exists, but the ProxyStateManager has no get_fallback_proxy_targets.
        details = {"n2": v1_proxy_details("n2", "10.0.0.2", ProxyStatus.HEALTHY)}
        controller = FakeController([V1_GROUP], instance=FakeServeController(OldProxyStateManager(details)))
        doc = exporter.ControllerPoller(controller, fake_ray_get).poll_once()
        self.assertEqual(doc, {"target_groups": [EXPECTED_V1_GROUP],
                               "proxies": {"n2": expected_proxy("n2", "10.0.0.2", "HEALTHY")}})
        # With --http-fallback, that address is the HTTP fallback.
        override = exporter.fallback_target("10.0.0.1:8500")
        doc = exporter.ControllerPoller(controller, fake_ray_get, http_fallback=override).poll_once()
        self.assertEqual(doc["fallback_targets"], {"HTTP": override})

    def test_a_reconnected_controller_without_fallback_state_drops_the_old_fallback(self):
        manager = FakeProxyStateManager(fallback_targets=HEAD_FALLBACK)
        poller = exporter.ControllerPoller(current_controller([V1_GROUP], manager), fake_ray_get)
        self.assertEqual(poller.poll_once()["fallback_targets"], EXPECTED_HEAD_FALLBACK)
        # run_poll_loop's reconnect() hands over a new handle, here of a Ray without that state.
        poller.controller = FakeController([V1_GROUP], instance=FakeServeController(OldProxyStateManager()))
        self.assertNotIn("fallback_targets", poller.poll_once())

    def test_older_ray_without_ray_call_reads_proxies_from_serve_instance_details(self):
        dashboard = load_fixture("dashboard_draining.json")
        controller = FakeController([V1_GROUP], instance_details=dashboard)
        doc = exporter.ControllerPoller(controller, fake_ray_get).poll_once()
        self.assertEqual(controller.missing, ["__ray_call__"])
        self.assertEqual(controller.get_serve_instance_details.calls, [((), {})])
        self.assertNotIn("fallback_targets", doc)
        self.assertEqual(doc["proxies"], dashboard["proxies"])
        self.assertEqual(doc["proxies"]["n3"]["status"], "DRAINING")
        # Neither __ray_call__ nor get_serve_instance_details: no "proxies" key at all.
        doc = exporter.ControllerPoller(FakeController([V1_GROUP]), fake_ray_get).poll_once()
        self.assertEqual(doc, {"target_groups": [EXPECTED_V1_GROUP]})

    def test_proxies_pass_through_with_draining_status(self):
        details = {
            "n2": v1_proxy_details("n2", "127.0.0.2", ProxyStatus.HEALTHY),
            "n3": v1_proxy_details("n3", "127.0.0.3", ProxyStatus.DRAINING),
        }
        manager = FakeProxyStateManager(fallback_targets=HEAD_FALLBACK, proxy_details=details)
        poller = exporter.ControllerPoller(current_controller([V1_GROUP], manager), fake_ray_get)
        doc = poller.poll_once()
        # Exactly the dashboard's ServeInstanceDetails.proxies shape (tests/data/ray/dashboard_draining.json).
        self.assertEqual(doc["proxies"], load_fixture("dashboard_draining.json")["proxies"])
        self.assertEqual(list(doc), ["target_groups", "fallback_targets", "proxies"])
        # The drain ends (the proxy is removed): the next poll says so.
        del manager.proxy_details["n3"]
        self.assertEqual(poller.poll_once()["proxies"], {"n2": expected_proxy("n2", "127.0.0.2", "HEALTHY")})

    def test_exporter_fixture_is_what_the_exporter_serves(self):
        fixture = load_fixture("exporter_draining.json")
        details = {
            "n2": v1_proxy_details("n2", "127.0.0.2", ProxyStatus.HEALTHY),
            "n3": v1_proxy_details("n3", "127.0.0.3", ProxyStatus.DRAINING),
        }
        fallback = {RequestProtocol.HTTP: FakeModelV2(fixture["fallback_targets"]["HTTP"]),
                    RequestProtocol.GRPC: FakeModelV2(fixture["fallback_targets"]["gRPC"])}
        manager = FakeProxyStateManager(fallback_targets=fallback, proxy_details=details)
        controller = current_controller([FakeModelV2(g) for g in fixture["target_groups"]], manager)
        self.assertEqual(exporter.ControllerPoller(controller, fake_ray_get).poll_once(), fixture)

    def test_probe_error_keeps_the_fallback_and_asks_serve_instance_details(self):
        manager = FakeProxyStateManager(fallback_targets=HEAD_FALLBACK)
        dashboard = load_fixture("dashboard_draining.json")
        controller = FakeController([V1_GROUP], instance=FakeServeController(manager), instance_details=dashboard)
        poller = exporter.ControllerPoller(controller, fake_ray_get)
        self.assertEqual(poller.poll_once()["fallback_targets"], EXPECTED_HEAD_FALLBACK)

        def broken():
            raise RuntimeError("proxy state is being rebuilt")

        manager.get_fallback_proxy_targets = broken
        with self.assertLogs(exporter.log, "WARNING") as logs:
            doc = poller.poll_once()
        self.assertIn("RuntimeError('proxy state is being rebuilt')", "\n".join(logs.output))
        self.assertEqual(doc["fallback_targets"], EXPECTED_HEAD_FALLBACK)
        self.assertEqual(doc["proxies"], dashboard["proxies"])

    def test_probe_runs_in_the_controller_without_this_module(self):
        # Ray's cloudpickle ships a nested function by value; the probe must need no global of
        # this module on the controller (which cannot import it).
        probe = exporter.make_controller_probe()
        self.assertIn("<locals>", probe.__qualname__)
        self.assertEqual(inspect.getclosurevars(probe).globals, {})
        self.assertEqual(inspect.getclosurevars(probe).nonlocals, {})
        self.assertEqual(probe(object()), {})  # no proxy_state_manager: nothing, no exception
        self.assertEqual(probe(FakeServeController(None)), {"fallback_targets": {}, "proxies": {}})

    def test_http_fallback_flag_fills_fallback_targets(self):
        args = exporter.parse_args(["--http-fallback", "10.0.0.1:8500"])
        controller = current_controller([V1_GROUP])
        doc = exporter.ControllerPoller(controller, fake_ray_get, http_fallback=args.http_fallback).poll_once()
        self.assertEqual(doc["fallback_targets"],
                         {"HTTP": {"ip": "10.0.0.1", "port": 8500, "instance_id": "", "name": "SERVE_FALLBACK_PROXY"}})
        self.assertEqual(exporter.fallback_target("[fd00::1]:8500")["ip"], "fd00::1")
        for bad in ("10.0.0.1", "10.0.0.1:0", "10.0.0.1:x", ":8500"):
            with self.assertRaises(ValueError, msg=bad):
                exporter.fallback_target(bad)

    def test_http_fallback_overrides_only_the_controllers_http_fallback(self):
        manager = FakeProxyStateManager(fallback_targets=HEAD_FALLBACK)
        override = exporter.fallback_target("192.0.2.7:18500")
        doc = exporter.ControllerPoller(current_controller([V1_GROUP], manager), fake_ray_get,
                                        http_fallback=override).poll_once()
        self.assertEqual(doc["fallback_targets"], {"HTTP": override, "gRPC": EXPECTED_HEAD_FALLBACK["gRPC"]})

    def test_loop_keeps_last_good_document_on_error(self):
        controller = current_controller([V1_GROUP])
        store = exporter.DocumentStore()
        poller = exporter.ControllerPoller(controller, fake_ray_get)
        stop = threading.Event()

        def groups(**kw):
            polls = len(controller.get_target_groups.calls)
            if polls >= 3:
                stop.set()
            return TimeoutError("controller busy") if polls == 2 else [V1_GROUP]

        controller.get_target_groups = FakeMethod(groups)
        exporter.run_poll_loop(poller, store, 0.0, stop)
        body, _, error, generation = store.snapshot()
        self.assertEqual(len(controller.get_target_groups.calls), 3)
        self.assertEqual(json.loads(body), {"target_groups": [EXPECTED_V1_GROUP], "proxies": {}})
        self.assertIsNone(error)  # cleared by the later success
        self.assertEqual(generation, 1)  # the same document twice is one generation


class ServerTest(unittest.TestCase):
    def setUp(self):
        self.store = exporter.DocumentStore()
        self.server = exporter.make_server(self.store, "127.0.0.1", 0)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def tearDown(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.headers.get("Content-Type"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type"), e.read()

    def test_503_before_the_first_document(self):
        status, ctype, body = self.get("/topology")
        self.assertEqual(status, 503)
        self.assertIn("error", json.loads(body))
        self.store.set_error("RayActorError: controller died")
        status, _, body = self.get("/")
        self.assertEqual(status, 503)
        self.assertIn("controller died", json.loads(body)["error"])
        self.assertEqual(self.get("/-/healthz")[0], 503)

    def test_serves_the_latest_document_on_both_paths(self):
        first = exporter.build_document([V1_GROUP])
        self.assertTrue(self.store.set_document(first))
        for path in ("/", "/topology", "/topology?x=1"):
            status, ctype, body = self.get(path)
            self.assertEqual(status, 200, path)
            self.assertEqual(ctype, "application/json")
            self.assertEqual(json.loads(body), first)

        second = exporter.build_document([], {RequestProtocol.HTTP: v1_target("10.0.0.1", 8000, "proxy")})
        self.assertTrue(self.store.set_document(second))
        self.assertFalse(self.store.set_document(second))
        status, _, body = self.get("/topology")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body), second)

        # An error after a good document: the document stays.
        self.store.set_error("GetTimeoutError")
        status, _, body = self.get("/topology")
        self.assertEqual(json.loads(body), second)
        status, _, body = self.get("/-/healthz")
        self.assertEqual(status, 200)
        self.assertIn(b"GetTimeoutError", body)

    def test_unknown_path_is_404(self):
        self.assertEqual(self.get("/nope")[0], 404)


class ArgsTest(unittest.TestCase):
    def test_defaults(self):
        args = exporter.parse_args([])
        self.assertEqual((args.host, args.port, args.interval, args.address, args.namespace, args.controller),
                         ("127.0.0.1", 8266, 1.0, "auto", "serve", "SERVE_CONTROLLER_ACTOR"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
