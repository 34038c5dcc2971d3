// parse_document / normalise_prefix: the accepted document shapes and every rejection reason.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ingressd/topology/snapshot.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::topology {
namespace {

namespace fs = std::filesystem;

const fs::path data_dir = fs::path(INGRESSD_TEST_DATA) / "topology";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

document parse_ok(std::string_view text) {
  auto r = parse_document(text);
  if (auto* e = std::get_if<parse_error>(&r)) {
    ADD_FAILURE() << "unexpected parse error: " << e->message;
    return {};
  }
  return std::get<document>(r);
}

std::string parse_fail(std::string_view text) {
  auto r = parse_document(text);
  if (std::holds_alternative<document>(r)) {
    ADD_FAILURE() << "document was accepted:\n" << text;
    return {};
  }
  return std::get<parse_error>(r).message;
}

document parse_file_ok(const std::string& name) {
  SCOPED_TRACE(name);
  return parse_ok(read_file(data_dir / "valid" / name));
}

// ---- valid documents ----

TEST(TopologyParse, TargetGroupsJson) {
  const document d = parse_file_ok("target_groups.json");
  ASSERT_EQ(d.apps.size(), 2u);

  const app& llm = d.apps[0];
  EXPECT_EQ(llm.name, "llm");
  EXPECT_EQ(llm.route_prefix, "/llm");  // trailing slash normalised away
  EXPECT_TRUE(llm.router_fallback);
  ASSERT_EQ(llm.replicas.size(), 2u);
  EXPECT_EQ(llm.replicas[0], (target{"10.0.0.5", 30001, "i-0a5", "SERVE_REPLICA::llm#LLMServer#ab12"}));
  EXPECT_EQ(llm.replicas[1].name, "SERVE_REPLICA::llm#LLMServer#cd34");
  ASSERT_EQ(llm.routers.size(), 2u);
  EXPECT_EQ(llm.routers[1], (target{"10.0.0.6", 30004, "i-0a6", "SERVE_REPLICA::llm#Router#r2"}));

  const app& echo = d.apps[1];
  EXPECT_EQ(echo.name, "echo");
  EXPECT_EQ(echo.route_prefix, "/");
  EXPECT_FALSE(echo.router_fallback);
  EXPECT_TRUE(echo.routers.empty());
  ASSERT_EQ(echo.replicas.size(), 1u);
  EXPECT_EQ(echo.replicas[0], (target{"fd00::7", 30010, "", "SERVE_REPLICA::echo#Echo#ef56"}));

  ASSERT_TRUE(d.http_fallback.has_value());
  EXPECT_EQ(*d.http_fallback, (target{"10.0.0.1", 8000, "i-head", "SERVE_PROXY_ACTOR-head"}));

  EXPECT_TRUE(d.warnings.empty());
  ASSERT_EQ(d.grpc_apps.size(), 1u);
  EXPECT_EQ(d.grpc_apps[0].name, "grpc-llm");
}

TEST(TopologyParse, YamlEqualsJson) {
  const document json_doc = parse_file_ok("target_groups.json");
  const document yaml_doc = parse_file_ok("target_groups.yaml");
  EXPECT_EQ(yaml_doc, json_doc);
  EXPECT_EQ(yaml_doc.warnings, json_doc.warnings);
}

TEST(TopologyParse, FullServeInstanceDetails) {
  const document d = parse_file_ok("serve_instance_details.json");
  ASSERT_EQ(d.apps.size(), 2u);
  EXPECT_EQ(d.apps[0].name, "llm");
  EXPECT_EQ(d.apps[0].route_prefix, "/v1");
  EXPECT_EQ(d.apps[0].replicas.size(), 3u);
  ASSERT_EQ(d.apps[0].routers.size(), 3u);
  EXPECT_EQ(d.apps[0].routers[0].ip, "10.0.0.9");
  EXPECT_FALSE(d.apps[0].router_fallback);
  EXPECT_EQ(d.apps[1].name, "embed");
  EXPECT_TRUE(d.apps[1].routers.empty());
  EXPECT_FALSE(d.http_fallback.has_value());
  EXPECT_TRUE(d.warnings.empty());
  ASSERT_EQ(d.grpc_apps.size(), 1u);
  EXPECT_EQ(d.grpc_apps[0].name, "grpc_app");
}

TEST(TopologyParse, HaproxyModeDashboardProxyGroup) {
  const document d = parse_file_ok("haproxy_mode_dashboard.json");
  ASSERT_EQ(d.apps.size(), 1u);
  EXPECT_EQ(d.apps[0].name, "");
  EXPECT_EQ(d.apps[0].route_prefix, "/");
  EXPECT_EQ(d.apps[0].replicas.size(), 2u);
  EXPECT_TRUE(d.apps[0].routers.empty());
  // Served as it is, with one line that says what the document lacks and what to use instead.
  ASSERT_EQ(d.warnings.size(), 1u);
  EXPECT_NE(d.warnings[0].find("lists Serve proxies, not replicas"), std::string::npos) << d.warnings[0];
}

TEST(TopologyParse, ServeNotRunningIsValidAndEmpty) {
  // ray schema.py ServeInstanceDetails.get_empty_schema_dict(): what the dashboard answers while
  // no Serve controller runs.
  const document d = parse_ok(R"({"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": null})");
  EXPECT_FALSE(d.serve_running);
  EXPECT_TRUE(d.apps.empty());
  EXPECT_EQ(parse_ok(to_json(d)), d);
  // Without any ServeInstanceDetails key, a missing target_groups is still an error.
  EXPECT_NE(parse_fail(R"({"target_group": []})").find("target_groups: missing required field"), std::string::npos);
}

TEST(TopologyParse, GroupFallbackTarget) {
  const document d = parse_ok(R"({"target_groups": [
      {"app_name": "llm", "route_prefix": "/", "protocol": "HTTP", "targets": [],
       "fallback_target": {"ip": "10.0.0.1", "port": 8500, "instance_id": "i-head", "name": "SERVE_PROXY_ACTOR-fallback"}},
      {"app_name": "b", "route_prefix": "/b", "protocol": "HTTP", "targets": [], "fallback_target": null}]})");
  ASSERT_TRUE(d.apps[0].fallback.has_value());
  EXPECT_EQ(*d.apps[0].fallback, (target{"10.0.0.1", 8500, "i-head", "SERVE_PROXY_ACTOR-fallback"}));
  EXPECT_FALSE(d.apps[1].fallback.has_value());
  EXPECT_EQ(parse_ok(to_json(d)), d);
  EXPECT_NE(parse_fail(R"({"target_groups": [{"route_prefix": "/", "protocol": "HTTP", "targets": [],
                                              "fallback_target": {"ip": "x", "port": 1, "name": "f"}}]})")
                .find("target_groups[0].fallback_target.ip"),
            std::string::npos);
}

TEST(TopologyParse, FallbackOnly) {
  const document d = parse_file_ok("fallback_only.json");
  EXPECT_TRUE(d.apps.empty());
  ASSERT_TRUE(d.http_fallback.has_value());
  EXPECT_EQ(d.http_fallback->port, 8000);
}

TEST(TopologyParse, EveryValidFixtureParses) {
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(data_dir / "valid")) {
    parse_file_ok(entry.path().filename().string());
    ++n;
  }
  EXPECT_GE(n, 5u);
}

TEST(TopologyParse, HandWrittenAppsWithoutRoutersNeedNoProtocolOrNames) {
  // Issue #29 item 5: `protocol` defaults to HTTP; a target name is needed only where a router
  // answers with it, so other targets are named ip:port.
  const document d = parse_ok(R"({"target_groups": [
      {"route_prefix": "/", "targets": [{"ip": "127.0.0.1", "port": 8001}, {"ip": "::1", "port": 8002}],
       "fallback_target": {"ip": "127.0.0.1", "port": 8500}}],
      "fallback_targets": {"HTTP": {"ip": "127.0.0.1", "port": 8000}}})");
  ASSERT_EQ(d.apps.size(), 1u);
  EXPECT_TRUE(d.grpc_apps.empty());
  ASSERT_EQ(d.apps[0].replicas.size(), 2u);
  EXPECT_EQ(d.apps[0].replicas[0].name, "127.0.0.1:8001");
  EXPECT_EQ(d.apps[0].replicas[1].name, "[::1]:8002");
  ASSERT_TRUE(d.apps[0].fallback.has_value());
  EXPECT_EQ(d.apps[0].fallback->name, "");
  EXPECT_EQ(parse_ok(to_json(d)), d);
  // The same address twice is still one replica named twice.
  EXPECT_NE(parse_fail(R"({"target_groups": [{"route_prefix": "/", "targets": [
      {"ip": "127.0.0.1", "port": 8001}, {"ip": "127.0.0.1", "port": 8001}]}]})")
                .find("duplicate replica name '127.0.0.1:8001'"),
            std::string::npos);
  // With routers, the replicas' names are the replica_ids routers answer with: required.
  EXPECT_NE(parse_fail(R"({"target_groups": [{"route_prefix": "/", "targets": [{"ip": "127.0.0.1", "port": 8001}],
      "ingress_request_router_targets": [{"ip": "127.0.0.1", "port": 9001}]}]})")
                .find("target_groups[0].targets[0].name"),
            std::string::npos);
}

TEST(TopologyParse, EveryMissingFieldIsNamedInOneError) {
  const std::string e = parse_fail(R"({"target_groups": [
      {"targets": [{"port": 8001}, {"ip": "127.0.0.1"}]},
      {"route_prefix": "/b", "protocol": "HTTP"},
      {"route_prefix": "/c", "targets": [{"ip": "127.0.0.1", "port": 1}],
       "ingress_request_router_targets": [{"ip": "127.0.0.1"}]}],
      "fallback_targets": {"HTTP": {"port": 8000}}})");
  for (const char* where : {"target_groups[0].route_prefix", "target_groups[0].targets[0].ip",
                            "target_groups[0].targets[1].port", "target_groups[1].targets",
                            "target_groups[2].targets[0].name", "target_groups[2].ingress_request_router_targets[0].port",
                            "fallback_targets.HTTP.ip"})
    EXPECT_NE(e.find(where), std::string::npos) << where << " not named in: " << e;
  EXPECT_EQ(e.find("target_groups[0].targets[0].name"), std::string::npos) << "no routers: no name needed: " << e;
  EXPECT_NE(e.find("missing required fields: "), std::string::npos) << e;
}

TEST(TopologyParse, RayProxiesMapAndThisNodesDrain) {
  // ray schema.py ServeInstanceDetails.proxies: node id -> ProxyDetails (status DRAINING while
  // Ray drains the node), in the dashboard's document and in the exporter's.
  for (const char* file : {"dashboard_draining.json", "exporter_draining.json"}) {
    SCOPED_TRACE(file);
    std::ifstream in(std::string(INGRESSD_TEST_DATA) + "/ray/" + file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const document d = parse_ok(text);
    ASSERT_EQ(d.proxies.size(), 2u);
    EXPECT_EQ(parse_ok(to_json(d)), d);
    const auto drained = topology::make_snapshot(d, "127.0.0.3", "", 1);
    EXPECT_TRUE(drained->ray_node_draining());
    EXPECT_EQ(drained->ray_node_status, "DRAINING");
    EXPECT_FALSE(drained->ray_node_id.empty());
    const auto healthy = topology::make_snapshot(d, "127.0.0.2", "", 1);
    EXPECT_FALSE(healthy->ray_node_draining());
    EXPECT_EQ(healthy->ray_node_status, "HEALTHY");
    // --ray-node-id picks the entry by id, whatever the node IP.
    const auto by_id = topology::make_snapshot(d, "10.9.9.9", "", 1, {}, nullptr, drained->ray_node_id);
    EXPECT_TRUE(by_id->ray_node_draining());
    EXPECT_FALSE(topology::make_snapshot(d, "10.9.9.9", "", 1)->ray_node_draining()) << "no entry for this node";
  }
  // Entries Ray's schema may grow into, or garbage, are left out rather than failing the topology.
  const document odd = parse_ok(R"({"target_groups": [], "proxies": {"a": 5, "b": {"node_ip": 7, "status": "HEALTHY"},
      "c": {"node_ip": "10.0.0.1", "status": "DRAINING", "new_field": [1]}}})");
  ASSERT_EQ(odd.proxies.size(), 1u);
  EXPECT_EQ(odd.proxies[0].node_id, "c");
}

TEST(TopologyParse, Defaults) {
  const document d = parse_ok(R"({"target_groups": [
      {"route_prefix": "/x", "protocol": "HTTP",
       "targets": [{"ip": "127.0.0.1", "port": 1, "name": "r"}]}]})");
  ASSERT_EQ(d.apps.size(), 1u);
  EXPECT_EQ(d.apps[0].name, "");
  EXPECT_TRUE(d.apps[0].routers.empty());
  EXPECT_FALSE(d.apps[0].router_fallback);
  EXPECT_EQ(d.apps[0].replicas[0].instance_id, "");
  EXPECT_FALSE(d.http_fallback.has_value());
}

TEST(TopologyParse, NullOptionalFieldsMeanDefault) {
  const document d = parse_ok(R"({"target_groups": [
      {"app_name": null, "route_prefix": "/x", "protocol": "HTTP",
       "ingress_request_router_targets": null, "ingress_router_fallback": null,
       "targets": [{"ip": "127.0.0.1", "port": 1, "name": "r", "instance_id": null}]}],
      "fallback_targets": null})");
  ASSERT_EQ(d.apps.size(), 1u);
  EXPECT_EQ(d.apps[0].name, "");
  EXPECT_FALSE(d.apps[0].router_fallback);
}

TEST(TopologyParse, EmptyTargetsAllowedForScaleFromZero) {
  const document d = parse_ok(R"({"target_groups": [
      {"app_name": "a", "route_prefix": "/a", "protocol": "HTTP", "targets": []}]})");
  ASSERT_EQ(d.apps.size(), 1u);
  EXPECT_TRUE(d.apps[0].replicas.empty());
}

TEST(TopologyParse, RouterNamesMayBeEmpty) {
  const document d = parse_ok(R"({"target_groups": [
      {"app_name": "a", "route_prefix": "/a", "protocol": "HTTP", "targets": [],
       "ingress_request_router_targets": [{"ip": "10.0.0.1", "port": 5, "name": ""}]}]})");
  ASSERT_EQ(d.apps[0].routers.size(), 1u);
  EXPECT_EQ(d.apps[0].routers[0].name, "");
}

TEST(TopologyParse, UnknownFieldsAndOtherFallbackProtocolsIgnored) {
  const document d = parse_ok(R"({"target_groups": [
      {"app_name": "a", "route_prefix": "/a", "protocol": "HTTP", "future": {"x": [1]},
       "targets": [{"ip": "::1", "port": 65535, "name": "r", "zone": "z"}]}],
      "fallback_targets": {"WebSocket": {"ip": "x", "port": "y"}}, "extra": 1})");
  EXPECT_EQ(d.apps[0].replicas[0].port, 65535);
  EXPECT_FALSE(d.http_fallback.has_value());
}

TEST(TopologyParse, GrpcGroupsAreGrpcApps) {
  const document d = parse_ok(R"({"target_groups": [
      {"app_name": "g", "route_prefix": "/g", "protocol": "gRPC",
       "targets": [{"ip": "10.0.0.1", "port": 40001, "instance_id": "n1", "name": "SERVE_REPLICA::g#G#a"}],
       "ingress_request_router_targets": [], "fallback_target": {"ip": "10.0.0.9", "port": 9000, "name": "proxy"}}],
      "fallback_targets": {"gRPC": {"ip": "10.0.0.8", "port": 9000, "name": "head"}}})");
  EXPECT_TRUE(d.apps.empty());
  ASSERT_EQ(d.grpc_apps.size(), 1u);
  EXPECT_EQ(d.grpc_apps[0].name, "g");
  EXPECT_EQ(d.grpc_apps[0].replicas[0], (target{"10.0.0.1", 40001, "n1", "SERVE_REPLICA::g#G#a"}));
  ASSERT_TRUE(d.grpc_apps[0].fallback);
  EXPECT_EQ(d.grpc_apps[0].fallback->ip, "10.0.0.9");
  ASSERT_TRUE(d.grpc_fallback);
  EXPECT_EQ(d.grpc_fallback->name, "head");
  EXPECT_TRUE(d.warnings.empty());
  // Round trip, gRPC groups and the gRPC fallback included.
  EXPECT_EQ(parse_ok(to_json(d)), d);
}

// Found by topology_fuzz in CI: a gRPC group without a string route_prefix was written back
// with "route_prefix": "" and parsed again as "/".
TEST(TopologyParse, GrpcGroupWithoutRoutePrefixRoundTrips) {
  for (const char* prefix : {"", R"("route_prefix": 7,)", R"("route_prefix": "",)", R"("route_prefix": "/g/",)"}) {
    const document d = parse_ok(std::string(R"({"target_groups": [{"app_name": "g", )") + prefix +
                                R"( "protocol": "gRPC", "targets": []}]})");
    ASSERT_EQ(d.grpc_apps.size(), 1u) << prefix;
    EXPECT_EQ(parse_ok(to_json(d)), d) << prefix << "\n" << to_json(d);
  }
}

TEST(TopologyParse, GrpcGroupIsValidatedLikeAnHttpOne) {
  EXPECT_EQ(parse_fail(R"({"target_groups": [
      {"app_name": "g", "route_prefix": "/g", "protocol": "gRPC", "targets": [{"ip": "nope", "port": 1, "name": "r"}]}]})")
                .rfind("target_groups[0].targets[0].ip", 0),
            0u);
  EXPECT_EQ(parse_fail(R"({"target_groups": [
      {"app_name": "g", "route_prefix": "/g", "protocol": "gRPC", "targets": []},
      {"app_name": "g", "route_prefix": "/h", "protocol": "gRPC", "targets": []}]})")
                .rfind("target_groups[1].app_name", 0),
            0u);
}

TEST(TopologyParse, GrpcGroupMayShareAnHttpPrefix) {
  const document d = parse_ok(R"({"target_groups": [
      {"app_name": "a", "route_prefix": "/a", "protocol": "HTTP", "targets": []},
      {"app_name": "a", "route_prefix": "/a", "protocol": "gRPC", "targets": []}]})");
  EXPECT_EQ(d.apps.size(), 1u);
  EXPECT_EQ(d.grpc_apps.size(), 1u);
}

TEST(TopologyParse, SameReplicaNameInDifferentAppsIsFine) {
  parse_ok(R"({"target_groups": [
      {"app_name": "a", "route_prefix": "/a", "protocol": "HTTP",
       "targets": [{"ip": "10.0.0.1", "port": 1, "name": "r"}]},
      {"app_name": "b", "route_prefix": "/b", "protocol": "HTTP",
       "targets": [{"ip": "10.0.0.1", "port": 2, "name": "r"}]}]})");
}

TEST(TopologyParse, WarningsDoNotAffectEquality) {
  document a = parse_ok(R"({"target_groups": []})");
  document b = a;
  b.warnings.push_back("target group for route '/' lists Serve proxies, not replicas");
  EXPECT_EQ(a, b);
}

TEST(TopologyParse, YamlScalarTyping) {
  // Plain scalars are typed (YAML 1.2 core schema); quoted ones stay strings.
  const document d = parse_ok(
      "target_groups:\n"
      "  - app_name: '123'\n"
      "    route_prefix: /v1\n"
      "    protocol: HTTP\n"
      "    ingress_router_fallback: True\n"
      "    targets:\n"
      "      - {ip: 10.0.0.5, port: 0x1f40, name: \"true\"}\n"
      "      - {ip: '::1', port: +8001, name: null_is_text_here, instance_id: ~}\n");
  ASSERT_EQ(d.apps.size(), 1u);
  EXPECT_EQ(d.apps[0].name, "123");
  EXPECT_TRUE(d.apps[0].router_fallback);
  EXPECT_EQ(d.apps[0].replicas[0].port, 8000);
  EXPECT_EQ(d.apps[0].replicas[0].name, "true");
  EXPECT_EQ(d.apps[0].replicas[1].ip, "::1");
  EXPECT_EQ(d.apps[0].replicas[1].port, 8001);
  EXPECT_EQ(d.apps[0].replicas[1].instance_id, "");
}

TEST(TopologyReject, YamlNumbersThatAreNotPorts) {
  for (const char* port : {"8000.5", "1e3", ".inf", "-.inf", ".nan", "-8000", "0o17777777", "1_000"}) {
    SCOPED_TRACE(port);
    const std::string m = parse_fail(
        std::string("target_groups:\n  - {protocol: HTTP, route_prefix: /, targets: [{ip: 1.2.3.4, port: ") +
        port + ", name: r}]}\n");
    EXPECT_EQ(m.rfind("target_groups[0].targets[0].port: expected an integer 1-65535", 0), 0u) << m;
  }
}

TEST(TopologyParse, YamlFlowMappingStartingWithBrace) {
  const document d = parse_ok("{target_groups: [{app_name: a, route_prefix: /a, protocol: HTTP, targets: []}]}");
  ASSERT_EQ(d.apps.size(), 1u);
  EXPECT_EQ(d.apps[0].name, "a");
}

TEST(TopologyParse, YamlAnchorsAreResolved) {
  const document d = parse_ok(
      "router: &r {ip: 10.0.0.9, port: 30004, name: rt}\n"
      "target_groups:\n"
      "  - {app_name: a, route_prefix: /a, protocol: HTTP, targets: [], ingress_request_router_targets: [*r]}\n"
      "  - {app_name: b, route_prefix: /b, protocol: HTTP, targets: [], ingress_request_router_targets: [*r]}\n");
  ASSERT_EQ(d.apps.size(), 2u);
  EXPECT_EQ(d.apps[1].routers.at(0), (target{"10.0.0.9", 30004, "", "rt"}));
}

// ---- rejections ----

TEST(TopologyReject, EveryInvalidFixture) {
  const fs::path dir = data_dir / "invalid";
  std::map<std::string, std::vector<std::string>> expected;
  std::istringstream manifest(read_file(dir / "expected_messages.txt"));
  for (std::string line; std::getline(manifest, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    std::istringstream cols(line);
    for (std::string col; std::getline(cols, col, '\t');) fields.push_back(col);
    ASSERT_GE(fields.size(), 2u) << "manifest line without an expected message: " << line;
    expected[fields[0]].assign(fields.begin() + 1, fields.end());
  }

  std::size_t checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "expected_messages.txt") continue;
    SCOPED_TRACE(name);
    auto it = expected.find(name);
    ASSERT_NE(it, expected.end()) << "no entry in expected_messages.txt";
    const std::string message = parse_fail(read_file(entry.path()));
    for (const std::string& want : it->second)
      EXPECT_NE(message.find(want), std::string::npos) << "message: " << message << "\nwanted: " << want;
    expected.erase(it);
    ++checked;
  }
  EXPECT_TRUE(expected.empty()) << "manifest names a missing file: " << expected.begin()->first;
  EXPECT_GE(checked, 30u);
}

TEST(TopologyReject, PortMessageIsExact) {
  const std::string m = parse_fail(R"({"target_groups": [
      {"app_name": "a", "route_prefix": "/a", "protocol": "HTTP", "targets": []},
      {"app_name": "b", "route_prefix": "/b", "protocol": "HTTP",
       "targets": [{"ip": "10.0.0.1", "port": 0, "name": "r"}]}]})");
  EXPECT_EQ(m.rfind("target_groups[1].targets[0].port: expected an integer 1-65535", 0), 0u) << m;
}

TEST(TopologyReject, DuplicatePrefixNamesBothApps) {
  const std::string m = parse_fail(R"({"target_groups": [
      {"app_name": "first", "route_prefix": "/same/", "protocol": "HTTP", "targets": []},
      {"app_name": "second", "route_prefix": "/same", "protocol": "HTTP", "targets": []}]})");
  EXPECT_NE(m.find("target_groups[1].route_prefix"), std::string::npos) << m;
  EXPECT_NE(m.find("'first'"), std::string::npos) << m;
  EXPECT_NE(m.find("'second'"), std::string::npos) << m;
  EXPECT_NE(m.find("'/same'"), std::string::npos) << m;
}

TEST(TopologyReject, InvalidJsonCarriesParserMessage) {
  const std::string m = parse_fail(R"({"target_groups": [}")");
  EXPECT_NE(m.find("invalid JSON"), std::string::npos) << m;
  EXPECT_NE(m.find("line 1"), std::string::npos) << m;
}

TEST(TopologyReject, InvalidYamlCarriesParserMessage) {
  const std::string m = parse_fail("target_groups:\n  - a: [1, 2\n");
  EXPECT_NE(m.find("invalid YAML"), std::string::npos) << m;
  EXPECT_NE(m.find("line"), std::string::npos) << m;
}

TEST(TopologyReject, NeverThrowsOnHostileInput) {
  const std::vector<std::string> inputs = {
      "",
      std::string(1, '\0'),
      "\xff\xfe\xfd",
      std::string(10000, '['),
      std::string(10000, '{'),
      "a: " + std::string(2000, '[') ,
      "- " + std::string(5000, '-'),
      "*undefined_alias",
      "target_groups: !!binary AAAA",
      "{\"target_groups\": [{\"protocol\": \"HTTP\", \"route_prefix\": \"/\", \"targets\": "
      "[{\"ip\": \"1.2.3.4\", \"port\": 1e400, \"name\": \"r\"}]}]}",
      "target_groups:\n  - {protocol: HTTP, route_prefix: /, targets: [{ip: 1.2.3.4, port: 99999999999999999999999, name: r}]}",
      "target_groups:\n  - {protocol: HTTP, route_prefix: /, targets: [{ip: 1.2.3.4, port: -9223372036854775808, name: r}]}",
  };
  for (const auto& text : inputs) {
    SCOPED_TRACE(text.substr(0, 60));
    EXPECT_NO_THROW({
      auto r = parse_document(text);
      EXPECT_TRUE(std::holds_alternative<parse_error>(r));
    });
  }
}

// ---- normalise_prefix ----

TEST(TopologyNormalisePrefix, Cases) {
  EXPECT_EQ(normalise_prefix(""), "/");
  EXPECT_EQ(normalise_prefix("/"), "/");
  EXPECT_EQ(normalise_prefix("//"), "/");
  EXPECT_EQ(normalise_prefix("/api"), "/api");
  EXPECT_EQ(normalise_prefix("/api/"), "/api");
  EXPECT_EQ(normalise_prefix("/api///"), "/api");
  EXPECT_EQ(normalise_prefix("/a/b/"), "/a/b");
}

}  // namespace
}  // namespace ingressd::topology
