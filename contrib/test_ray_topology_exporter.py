#!/usr/bin/env python3
"""Tests for ray_topology_exporter.py (stdlib only; Ray is not needed)."""

import enum
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


class FakeController:
    """A Serve controller handle with only the methods the real one has that the exporter may
    call: asking for anything else fails the test (there is no public get_fallback_targets)."""

    def __init__(self, groups):
        self.groups = groups
        self.get_target_groups = FakeMethod(lambda **kw: self.groups)

    def __getattr__(self, name):
        raise AssertionError(f"the exporter called controller.{name}, which the Serve controller does not have")


def fake_ray_get(ref, timeout=None):
    assert timeout is not None
    if isinstance(ref.value, Exception):
        raise ref.value
    return ref.value


class PollerTest(unittest.TestCase):
    def test_poll_calls_only_get_target_groups_from_the_proxy_manager_view(self):
        controller = FakeController([V1_GROUP, FakeModelV2(V2_SCALED_TO_ZERO)])
        doc = exporter.ControllerPoller(controller, fake_ray_get).poll_once()
        self.assertEqual(controller.get_target_groups.calls, [((), {"from_proxy_manager": True})])
        self.assertEqual(doc, {"target_groups": [EXPECTED_V1_GROUP, V2_SCALED_TO_ZERO]})

    def test_http_fallback_flag_fills_fallback_targets(self):
        args = exporter.parse_args(["--http-fallback", "10.0.0.1:8500"])
        controller = FakeController([V1_GROUP])
        doc = exporter.ControllerPoller(controller, fake_ray_get, http_fallback=args.http_fallback).poll_once()
        self.assertEqual(doc["fallback_targets"],
                         {"HTTP": {"ip": "10.0.0.1", "port": 8500, "instance_id": "", "name": "SERVE_FALLBACK_PROXY"}})
        self.assertEqual(exporter.fallback_target("[fd00::1]:8500")["ip"], "fd00::1")
        for bad in ("10.0.0.1", "10.0.0.1:0", "10.0.0.1:x", ":8500"):
            with self.assertRaises(ValueError, msg=bad):
                exporter.fallback_target(bad)

    def test_loop_keeps_last_good_document_on_error(self):
        controller = FakeController([V1_GROUP])
        store = exporter.DocumentStore()
        poller = exporter.ControllerPoller(controller, fake_ray_get)
        stop = threading.Event()

        polls = []

        def flaky_get(ref, timeout=None):
            polls.append(1)
            if len(polls) == 2:
                raise TimeoutError("controller busy")
            if len(polls) >= 3:
                stop.set()
            return fake_ray_get(ref, timeout)

        poller.ray_get = flaky_get
        exporter.run_poll_loop(poller, store, 0.0, stop)
        body, _, error, generation = store.snapshot()
        self.assertEqual(json.loads(body), {"target_groups": [EXPECTED_V1_GROUP]})
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
