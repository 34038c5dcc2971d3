// Unit tests for the config module (src/config/config.cpp): YAML keys (contract §2), flags
// (contract §1), cross-field validation, and the example config file.
#include "ingressd/config/config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace ingressd::config {
namespace {

using namespace std::chrono_literals;

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

::testing::AssertionResult starts_with(const std::string& text, const std::string& prefix) {
  if (text.starts_with(prefix)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not start with '" << prefix << "'";
}

/// The config, or a test failure carrying the error message.
config load_ok(const std::string& yaml, config base = {}) {
  auto result = load_yaml(yaml, "t.yaml", std::move(base));
  if (const auto* err = std::get_if<config_error>(&result)) {
    ADD_FAILURE() << "unexpected error: " << err->message;
    return {};
  }
  return std::get<config>(result);
}

/// The error message, or a test failure if the YAML loaded.
std::string load_error(const std::string& yaml) {
  auto result = load_yaml(yaml, "t.yaml");
  if (const auto* err = std::get_if<config_error>(&result)) return err->message;
  ADD_FAILURE() << "expected an error for:\n" << yaml;
  return {};
}

/// Every dotted leaf key in a YAML map ("router.timeout"), as the test reads it independently.
std::set<std::string> yaml_leaf_keys(const YAML::Node& node, const std::string& prefix = "") {
  std::set<std::string> keys;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const auto key = prefix + it->first.Scalar();
    if (it->second.IsMap()) {
      keys.merge(yaml_leaf_keys(it->second, key + "."));
    } else {
      keys.insert(key);
    }
  }
  return keys;
}

std::set<std::string> known_key_set() {
  std::set<std::string> keys;
  for (auto k : known_keys()) keys.emplace(k);
  return keys;
}

// ---------------------------------------------------------------------------------------------
// host:port

TEST(ConfigHostPort, ParsesIpv4HostNameAndIpv6) {
  EXPECT_EQ(parse_host_port("0.0.0.0:8000"), (host_port{"0.0.0.0", 8000}));
  EXPECT_EQ(parse_host_port("127.0.0.1:0"), (host_port{"127.0.0.1", 0}));
  EXPECT_EQ(parse_host_port("localhost:9101"), (host_port{"localhost", 9101}));
  EXPECT_EQ(parse_host_port("proxy-1.example.com:65535"), (host_port{"proxy-1.example.com", 65535}));
  EXPECT_EQ(parse_host_port("[::1]:8000"), (host_port{"::1", 8000}));
  EXPECT_EQ(parse_host_port("[::]:80"), (host_port{"::", 80}));
  EXPECT_EQ(parse_host_port("[2001:db8::5]:443"), (host_port{"2001:db8::5", 443}));
}

TEST(ConfigHostPort, RejectsMalformed) {
  for (const char* text : {"", "8000", ":8000", "host:", "host:65536", "host:-1", "host:80x", "host:+80",
                           "::1:8000", "[::1]", "[::1]8000", "[::1]:", "[zz]:80", "[127.0.0.1]:80",
                           "a b:80", "999.1.1.1:80", "-host:80", "host_name:80", "host:123456",
                           "[::1]:8000x", "http://host:80"}) {
    EXPECT_EQ(parse_host_port(text), std::nullopt) << "'" << text << "'";
  }
}

TEST(ConfigHostPort, ToStringBracketsIpv6AndRoundTrips) {
  EXPECT_EQ((host_port{"127.0.0.1", 8000}).to_string(), "127.0.0.1:8000");
  EXPECT_EQ((host_port{"::1", 8000}).to_string(), "[::1]:8000");
  for (const char* text : {"0.0.0.0:8000", "[::1]:8000", "localhost:0", "[fe80::1]:65535"}) {
    const auto hp = parse_host_port(text);
    ASSERT_TRUE(hp) << text;
    EXPECT_EQ(hp->to_string(), text);
  }
}

TEST(ConfigThreads, EffectiveThreadsResolvesZero) {
  config cfg;
  cfg.threads = 3;
  EXPECT_EQ(cfg.effective_threads(), 3u);
  cfg.threads = 0;
  const unsigned cpus = std::thread::hardware_concurrency();
  EXPECT_EQ(cfg.effective_threads(), cpus == 0 ? 1u : cpus);
}

// ---------------------------------------------------------------------------------------------
// YAML: accepted documents

TEST(ConfigDefaults, NeverCutALongGenerationAndFollowRay) {
  // Ray's HAProxy sets no server timeout and `timeout client 3600s` (ray constants.py
  // RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S): a reasoning model may queue or think for many minutes.
  // The 300 s defaults once cut such generations off.
  const config c;
  EXPECT_GE(c.upstream.first_byte_timeout, std::chrono::seconds(3600));
  EXPECT_GE(c.upstream.idle_timeout, std::chrono::seconds(3600));
  // `wait-for-body time 5s` and `observe layer4 error-limit 3` (haproxy_templates.py).
  EXPECT_EQ(c.router.body_wait, std::chrono::seconds(5));
  EXPECT_EQ(c.health.error_limit, 3u);
}

TEST(ConfigDefaults, HedgeAutomaticallyWithinATenthOfCalls) {
  const config c;
  EXPECT_TRUE(c.router.hedge_auto);
  EXPECT_EQ(c.router.hedge_budget_permille, 100u);
}

TEST(ConfigYaml, HedgeOffAutoOrADuration) {
  auto off = load_ok("router:\n  hedge: off\n");
  EXPECT_FALSE(off.router.hedge_auto);
  EXPECT_EQ(off.router.hedge_after, duration{0});
  auto fixed = load_ok("router:\n  hedge: 3ms\n  hedge_budget: 2.5%\n");
  EXPECT_FALSE(fixed.router.hedge_auto);
  EXPECT_EQ(fixed.router.hedge_after, 3ms);
  EXPECT_EQ(fixed.router.hedge_budget_permille, 25u);
  config base;
  base.router.hedge_auto = false;
  EXPECT_TRUE(load_ok("router:\n  hedge: auto\n", base).router.hedge_auto);
  EXPECT_EQ(load_ok("router:\n  hedge_budget: 0%\n").router.hedge_budget_permille, 0u);
  EXPECT_EQ(load_ok("router:\n  hedge_budget: 100\n").router.hedge_budget_permille, 1000u);
}

TEST(ConfigYaml, EmptyDocumentsGiveDefaults) {
  EXPECT_EQ(load_ok(""), config{});
  EXPECT_EQ(load_ok("# only a comment\n\n"), config{});
  EXPECT_EQ(load_ok("~\n"), config{});
  EXPECT_EQ(load_ok("router:\nhealth:\n"), config{});  // empty sections keep their defaults
}

// One YAML with a non-default value for every key; every field is checked.
constexpr const char* every_key_yaml = R"(
listen: "[::1]:8080"
admin_listen: 127.0.0.2:9200
threads: 6
busy_poll_us: 150
node_ip: 10.0.0.5
ray_node_id: 6f1b2c3d4e5f
root_path: /api
log_level: debug
access_log: /var/log/ingressd/access.log
topology:
  file: /etc/ingressd/topology.json
  ray_dashboard: http://10.0.0.1:8265
  url: http://exporter:9000/topology
  poll_interval: 3s
  timeout: 1500ms
  local_dial_host: 127.0.0.1
router:
  methods: [POST, PUT, PATCH]
  timeout: 750ms
  forward_body: true
  body_limit: 1MiB
  body_wait: 1500ms
  session_header: X-Conversation-ID
  hedge: 4ms
  hedge_budget: 5%
  on_failure: fail_open
upstream:
  connect_timeout: 3s
  first_byte_timeout: 2m
  idle_timeout: 90s
  retries: 5
  max_idle_per_replica: 0
client:
  header_timeout: 15s
  body_timeout: 45s
  keepalive_timeout: 2m
  max_header_bytes: 32KiB
  max_body_bytes: 1GiB
  max_connections: 500
  trusted_proxies: [10.0.0.0/8, "fd00::/8", 192.0.2.7]
  proxy_protocol: true
  max_tunnels: 77
timeout:
  tunnel: 90s
health:
  path: /health
  interval: 10s
  fast_interval: 100ms
  fall: 3
  rise: 4
  timeout: 1s
  error_limit: 7
drain:
  min_period: 5s
  timeout: 1h
tls:
  listen: 127.0.0.1:8443
  cert_file: /etc/ingressd/tls/cert.pem
  key_file: /etc/ingressd/tls/key.pem
  min_version: "1.3"
  ciphers: ECDHE-RSA-AES128-GCM-SHA256
  ciphersuites: TLS_AES_128_GCM_SHA256
  handshake_timeout: 3s
grpc:
  listen: 127.0.0.1:9000
  max_concurrent_streams: 50
  health_path: /grpc.health.v1.Health/Check
  max_upstream_connections: 3
  keepalive_interval: 20s
  keepalive_timeout: 7s
metrics:
  ray_compatible: false
)";

TEST(ConfigYaml, EveryKeyIsParsed) {
  const config cfg = load_ok(every_key_yaml);
  EXPECT_EQ(cfg.listen, (host_port{"::1", 8080}));
  EXPECT_EQ(cfg.admin_listen, (host_port{"127.0.0.2", 9200}));
  EXPECT_EQ(cfg.threads, 6u);
  EXPECT_EQ(cfg.busy_poll_us, 150u);
  EXPECT_EQ(cfg.node_ip, "10.0.0.5");
  EXPECT_EQ(cfg.ray_node_id, "6f1b2c3d4e5f");
  EXPECT_FALSE(cfg.metrics.ray_compatible);
  EXPECT_EQ(cfg.root_path, "/api");
  EXPECT_EQ(cfg.level, log_level::debug);
  EXPECT_EQ(cfg.access_log, "/var/log/ingressd/access.log");

  EXPECT_EQ(cfg.topology.file, "/etc/ingressd/topology.json");
  EXPECT_EQ(cfg.topology.ray_dashboard, "http://10.0.0.1:8265");
  EXPECT_EQ(cfg.topology.url, "http://exporter:9000/topology");
  EXPECT_EQ(cfg.topology.poll_interval, 3s);
  EXPECT_EQ(cfg.topology.timeout, 1500ms);
  EXPECT_EQ(cfg.topology.local_dial_host, "127.0.0.1");

  EXPECT_EQ(cfg.router.methods, (std::vector<std::string>{"POST", "PUT", "PATCH"}));
  EXPECT_EQ(cfg.router.timeout, 750ms);
  EXPECT_TRUE(cfg.router.forward_body);
  EXPECT_EQ(cfg.router.body_limit, 1024u * 1024);
  EXPECT_EQ(cfg.router.body_wait, 1500ms);
  EXPECT_EQ(cfg.router.session_header, "x-conversation-id");  // stored lowercased
  EXPECT_FALSE(cfg.router.hedge_auto);
  EXPECT_EQ(cfg.router.hedge_after, 4ms);
  EXPECT_EQ(cfg.router.hedge_budget_permille, 50u);
  EXPECT_EQ(cfg.router.failure_mode, on_failure::fail_open);

  EXPECT_EQ(cfg.upstream.connect_timeout, 3s);
  EXPECT_EQ(cfg.upstream.first_byte_timeout, 2min);
  EXPECT_EQ(cfg.upstream.idle_timeout, 90s);
  EXPECT_EQ(cfg.upstream.retries, 5u);
  EXPECT_EQ(cfg.upstream.max_idle_per_replica, 0u);

  EXPECT_EQ(cfg.client.header_timeout, 15s);
  EXPECT_EQ(cfg.client.body_timeout, 45s);
  EXPECT_EQ(cfg.client.keepalive_timeout, 2min);
  EXPECT_EQ(cfg.client.max_header_bytes, 32u * 1024);
  EXPECT_EQ(cfg.client.max_body_bytes, 1ull << 30);
  EXPECT_EQ(cfg.client.max_connections, 500u);
  ASSERT_EQ(cfg.client.trusted_proxies.size(), 3u);
  EXPECT_EQ(cfg.client.trusted_proxies[1].to_string(), "fd00::/8");
  EXPECT_EQ(cfg.client.trusted_proxies[2].to_string(), "192.0.2.7/32");
  EXPECT_TRUE(cfg.client.proxy_protocol);

  EXPECT_EQ(cfg.health.path, "/health");
  EXPECT_EQ(cfg.health.interval, 10s);
  EXPECT_EQ(cfg.health.fast_interval, 100ms);
  EXPECT_EQ(cfg.health.fall, 3u);
  EXPECT_EQ(cfg.health.rise, 4u);
  EXPECT_EQ(cfg.health.timeout, 1s);
  EXPECT_EQ(cfg.health.error_limit, 7u);

  EXPECT_EQ(cfg.drain.min_period, 5s);
  EXPECT_EQ(cfg.drain.timeout, 1h);

  EXPECT_EQ(cfg.tls.listen, (host_port{"127.0.0.1", 8443}));
  EXPECT_TRUE(cfg.tls.enabled());
  EXPECT_EQ(cfg.tls.cert_file, "/etc/ingressd/tls/cert.pem");
  EXPECT_EQ(cfg.tls.key_file, "/etc/ingressd/tls/key.pem");
  EXPECT_EQ(cfg.tls.min_version, "1.3");
  EXPECT_EQ(cfg.tls.ciphers, "ECDHE-RSA-AES128-GCM-SHA256");
  EXPECT_EQ(cfg.tls.ciphersuites, "TLS_AES_128_GCM_SHA256");
  EXPECT_EQ(cfg.tls.handshake_timeout, 3s);

  EXPECT_EQ(cfg.grpc.listen, (host_port{"127.0.0.1", 9000}));
  EXPECT_EQ(cfg.grpc.max_concurrent_streams, 50u);
  EXPECT_EQ(cfg.grpc.max_upstream_connections, 3u);
  EXPECT_EQ(cfg.client.max_tunnels, 77u);
  EXPECT_EQ(cfg.timeout.tunnel, 90s);
  EXPECT_EQ(cfg.grpc.keepalive_interval, 20s);
  EXPECT_EQ(cfg.grpc.keepalive_timeout, 7s);
  EXPECT_EQ(cfg.grpc.health_path, "/grpc.health.v1.Health/Check");
}

TEST(ConfigYaml, EveryKeyTestCoversEveryKnownKey) {
  // If a key is added to the loader, EveryKeyIsParsed must set it too.
  EXPECT_EQ(yaml_leaf_keys(YAML::Load(every_key_yaml)), known_key_set());
}

TEST(ConfigYaml, KnownKeysAreTheContractKeys) {
  // busy_poll_us, tls.handshake_timeout, the grpc.* keys but grpc.listen, client.max_tunnels and
  // timeout.tunnel are the keys beyond the contract (docs/configuration.md).
  const std::set<std::string> contract{
      "listen", "admin_listen", "threads", "busy_poll_us", "node_ip", "root_path", "log_level", "access_log",
      "topology.file", "topology.ray_dashboard", "topology.url", "topology.poll_interval",
      "topology.timeout", "topology.local_dial_host", "router.methods", "router.timeout",
      "router.forward_body", "router.body_limit", "router.body_wait", "router.session_header", "router.hedge",
      "router.hedge_budget", "router.on_failure",
      "upstream.connect_timeout", "upstream.first_byte_timeout", "upstream.idle_timeout",
      "upstream.retries", "upstream.max_idle_per_replica", "client.header_timeout",
      "client.body_timeout", "client.keepalive_timeout", "client.max_header_bytes",
      "client.max_body_bytes", "client.max_connections", "client.trusted_proxies", "client.proxy_protocol",
      "client.max_tunnels", "timeout.tunnel", "health.path", "health.interval",
      "health.fast_interval", "health.fall", "health.rise", "health.timeout", "health.error_limit",
      "drain.min_period", "drain.timeout", "tls.listen", "tls.cert_file", "tls.key_file", "tls.min_version",
      "tls.ciphers", "tls.ciphersuites", "tls.handshake_timeout", "grpc.listen", "grpc.max_concurrent_streams",
      "grpc.health_path", "grpc.max_upstream_connections", "grpc.keepalive_interval", "grpc.keepalive_timeout",
      "metrics.ray_compatible", "ray_node_id"};
  EXPECT_EQ(known_key_set(), contract);
}

TEST(ConfigYaml, KeysOverrideBaseAndKeepTheRest) {
  config base;
  base.threads = 9;
  base.router.timeout = 7s;
  const config cfg = load_ok("router:\n  timeout: 1s\n", base);
  EXPECT_EQ(cfg.threads, 9u);
  EXPECT_EQ(cfg.router.timeout, 1s);
}

TEST(ConfigYaml, FlowStyleAndQuotedScalarsWork) {
  const config cfg = load_ok("router: {timeout: '2s', methods: [\"POST\", GET]}\nthreads: \"4\"\n");
  EXPECT_EQ(cfg.router.timeout, 2s);
  EXPECT_EQ(cfg.router.methods, (std::vector<std::string>{"POST", "GET"}));
  EXPECT_EQ(cfg.threads, 4u);
}

TEST(ConfigYaml, ZeroIsAllowedWhereItMeansSomething) {
  const config cfg = load_ok(
      "threads: 0\ndrain: {min_period: 0, timeout: 0s}\nupstream: {retries: 0, max_idle_per_replica: 0}\n"
      "router: {body_limit: 0, methods: []}\n");
  EXPECT_EQ(cfg.drain.min_period, 0s);
  EXPECT_EQ(cfg.drain.timeout, 0s);
  EXPECT_EQ(cfg.upstream.retries, 0u);
  EXPECT_EQ(cfg.router.body_limit, 0u);
  EXPECT_TRUE(cfg.router.methods.empty());
}

TEST(ConfigYaml, EmptyStringsAndNullsUnsetStringKeys) {
  config base;
  base.node_ip = "10.0.0.1";
  base.topology.file = "/x";
  base.router.session_header = "x-a";
  const config cfg = load_ok("node_ip:\ntopology: {file: ~}\nrouter: {session_header: \"\"}\n", base);
  EXPECT_EQ(cfg.node_ip, "");
  EXPECT_EQ(cfg.topology.file, "");
  EXPECT_EQ(cfg.router.session_header, "");  // "" disables forwarding
}

TEST(ConfigYaml, AccessLogAcceptsDashAndOff) {
  EXPECT_EQ(load_ok("access_log: '-'\n").access_log, "-");
  EXPECT_EQ(load_ok("access_log: off\n").access_log, "off");
}

TEST(ConfigYaml, EveryLogLevel) {
  EXPECT_EQ(load_ok("log_level: trace").level, log_level::trace);
  EXPECT_EQ(load_ok("log_level: debug").level, log_level::debug);
  EXPECT_EQ(load_ok("log_level: info").level, log_level::info);
  EXPECT_EQ(load_ok("log_level: warn").level, log_level::warn);
  EXPECT_EQ(load_ok("log_level: error").level, log_level::error);
}

// ---------------------------------------------------------------------------------------------
// YAML: errors

TEST(ConfigYaml, UnknownKeyNamesDottedKeyAndLine) {
  const auto message = load_error("listen: 0.0.0.0:1\nrouter:\n  timeout: 5s\n  timout: 3s\n");
  EXPECT_TRUE(starts_with(message, "t.yaml:4: unknown key 'router.timout'"));
  EXPECT_TRUE(contains(message, "did you mean 'router.timeout'?"));
}

TEST(ConfigYaml, UnknownTopLevelKeyAndSection) {
  EXPECT_TRUE(starts_with(load_error("\n\nlisten_addr: 0.0.0.0:1\n"), "t.yaml:3: unknown key 'listen_addr'"));
  EXPECT_TRUE(starts_with(load_error("routers:\n  timeout: 5s\n"), "t.yaml:1: unknown key 'routers'"));
  EXPECT_TRUE(starts_with(load_error("drain:\n  grace: 5s\n"), "t.yaml:2: unknown key 'drain.grace'"));
}

TEST(ConfigYaml, DottedKeyAtTopLevelIsNotNested) {
  const auto message = load_error("router.timeout: 5s\n");
  EXPECT_TRUE(starts_with(message, "t.yaml:1: unknown key 'router.timeout'"));
  EXPECT_TRUE(contains(message, "under 'router:'"));
}

TEST(ConfigYaml, SectionKeyAtTopLevelSuggestsSections) {
  const auto message = load_error("retries: 2\n");
  EXPECT_TRUE(starts_with(message, "t.yaml:1: unknown key 'retries'"));
  EXPECT_TRUE(contains(message, "'upstream.retries'"));
}

TEST(ConfigYaml, DuplicateKeyIsAnError) {
  const auto message = load_error("threads: 1\nrouter: {timeout: 1s}\nthreads: 2\n");
  EXPECT_TRUE(starts_with(message, "t.yaml:3: duplicate key 'threads' (first at line 1)"));
}

TEST(ConfigYaml, StructuralErrors) {
  EXPECT_TRUE(contains(load_error("- a\n- b\n"), "expected a map of settings at the top level"));
  EXPECT_TRUE(starts_with(load_error("router: 5\n"), "t.yaml:1: router: expected a map"));
  EXPECT_TRUE(starts_with(load_error("listen: [a, b]\n"), "t.yaml:1: listen: expected a single value"));
  EXPECT_TRUE(starts_with(load_error("health:\n  path: {a: 1}\n"), "t.yaml:2: health.path: expected a single value"));
  EXPECT_TRUE(contains(load_error("a: 1\n---\nb: 2\n"), "expected one YAML document"));
}

TEST(ConfigYaml, SyntaxErrorNamesLine) {
  const auto message = load_error("threads: 1\nrouter:\n  methods: [POST\n");
  EXPECT_TRUE(starts_with(message, "t.yaml:"));
  EXPECT_TRUE(contains(message, "invalid YAML"));
}

struct bad_value {
  const char* yaml;
  const char* prefix;   ///< expected start of the message: "t.yaml:<line>: <key>: "
  const char* detail;   ///< a part of the message that explains the problem
};

class ConfigYamlBadValue : public ::testing::TestWithParam<bad_value> {};

TEST_P(ConfigYamlBadValue, NamesKeyAndLine) {
  const auto& param = GetParam();
  const auto message = load_error(param.yaml);
  EXPECT_TRUE(starts_with(message, param.prefix));
  EXPECT_TRUE(contains(message, param.detail));
}

INSTANTIATE_TEST_SUITE_P(
    ConfigEveryKey, ConfigYamlBadValue,
    ::testing::Values(
        bad_value{"listen: 8000", "t.yaml:1: listen: ", "expected HOST:PORT"},
        bad_value{"tls:\n  listen: 8443", "t.yaml:2: tls.listen: ", "expected HOST:PORT"},
        bad_value{"tls:\n  min_version: \"1.1\"", "t.yaml:2: tls.min_version: ", "expected \"1.2\" or \"1.3\""},
        bad_value{"tls:\n  ciphers: ''", "t.yaml:2: tls.ciphers: ", "must not be empty"},
        bad_value{"tls:\n  ciphersuites: ''", "t.yaml:2: tls.ciphersuites: ", "must not be empty"},
        bad_value{"tls:\n  handshake_timeout: 0s", "t.yaml:2: tls.handshake_timeout: ", "greater than 0"},
        bad_value{"listen: ::1:8000", "t.yaml:1: listen: ", "[::1]:8000"},
        bad_value{"admin_listen: localhost", "t.yaml:1: admin_listen: ", "expected HOST:PORT"},
        bad_value{"threads: x", "t.yaml:1: threads: ", "expected a whole number, got 'x'"},
        bad_value{"threads: -1", "t.yaml:1: threads: ", "expected a whole number, got '-1'"},
        bad_value{"threads: 2.5", "t.yaml:1: threads: ", "expected a whole number"},
        bad_value{"threads: 5000", "t.yaml:1: threads: ", "at most 1024"},
        bad_value{"threads: 99999999999999999999999", "t.yaml:1: threads: ", "at most"},
        bad_value{"node_ip: node-1", "t.yaml:1: node_ip: ", "expected an IP address"},
        bad_value{"root_path: /", "t.yaml:1: root_path: ", "not end with '/'"},
        bad_value{"root_path: /api/", "t.yaml:1: root_path: ", "not end with '/'"},
        bad_value{"root_path: api", "t.yaml:1: root_path: ", "starts with '/'"},
        bad_value{"log_level: verbose", "t.yaml:1: log_level: ", "trace, debug, info, warn, error"},
        bad_value{"access_log: ''", "t.yaml:1: access_log: ", "expected a file path"},
        bad_value{"topology:\n  ray_dashboard: https://10.0.0.1:8265", "t.yaml:2: topology.ray_dashboard: ",
                  "https is not supported"},
        bad_value{"topology:\n  url: https://x/topo", "t.yaml:2: topology.url: ", "https is not supported"},
        bad_value{"topology:\n  url: ftp://x/topo", "t.yaml:2: topology.url: ", "expected an http:// URL"},
        bad_value{"topology:\n  ray_dashboard: 10.0.0.1:8265", "t.yaml:2: topology.ray_dashboard: ",
                  "expected an http:// URL"},
        bad_value{"topology:\n  url: http://", "t.yaml:2: topology.url: ", "expected an http:// URL"},
        bad_value{"topology:\n  url: http://user:pw@host/", "t.yaml:2: topology.url: ", "credentials"},
        bad_value{"topology:\n  poll_interval: 1", "t.yaml:2: topology.poll_interval: ",
                  "expected a duration like 250ms or 5s, got '1'"},
        bad_value{"topology:\n  poll_interval: 0s", "t.yaml:2: topology.poll_interval: ", "greater than 0"},
        bad_value{"topology:\n  timeout: -1s", "t.yaml:2: topology.timeout: ", "expected a duration"},
        bad_value{"topology:\n  local_dial_host: 'bad host'", "t.yaml:2: topology.local_dial_host: ",
                  "expected a host name or IP address"},
        bad_value{"router:\n  methods: [post]", "t.yaml:2: router.methods: ", "case-sensitive"},
        bad_value{"router:\n  methods:\n    - POST\n    - 'GE T'", "t.yaml:4: router.methods: ",
                  "expected an HTTP method"},
        bad_value{"router:\n  methods: POST", "t.yaml:2: router.methods: ", "expected a list"},
        bad_value{"router:\n  methods: [POST, POST]", "t.yaml:2: router.methods: ", "listed twice"},
        bad_value{"router:\n  methods: [[POST]]", "t.yaml:2: router.methods: ", "expected a list"},
        bad_value{"router:\n  timeout: 5", "t.yaml:2: router.timeout: ", "expected a duration like 250ms or 5s"},
        bad_value{"router:\n  timeout: 0", "t.yaml:2: router.timeout: ", "greater than 0"},
        bad_value{"router:\n  forward_body: yes", "t.yaml:2: router.forward_body: ", "expected true or false"},
        bad_value{"router:\n  body_limit: 256kb", "t.yaml:2: router.body_limit: ", "expected a size"},
        bad_value{"router:\n  session_header: 'x session'", "t.yaml:2: router.session_header: ",
                  "expected a header name"},
        bad_value{"router:\n  hedge: 0ms", "t.yaml:2: router.hedge: ", "expected auto, off or a duration"},
        bad_value{"router:\n  hedge: sometimes", "t.yaml:2: router.hedge: ", "expected auto, off or a duration"},
        bad_value{"router:\n  hedge_budget: 120%", "t.yaml:2: router.hedge_budget: ", "from 0% to 100%"},
        bad_value{"router:\n  hedge_budget: ten", "t.yaml:2: router.hedge_budget: ", "from 0% to 100%"},
        bad_value{"router:\n  hedge_budget: -1%", "t.yaml:2: router.hedge_budget: ", "from 0% to 100%"},
        bad_value{"router:\n  on_failure: open", "t.yaml:2: router.on_failure: ", "fail_closed or fail_open"},
        bad_value{"upstream:\n  connect_timeout: 0s", "t.yaml:2: upstream.connect_timeout: ", "greater than 0"},
        bad_value{"upstream:\n  first_byte_timeout: 5 m", "t.yaml:2: upstream.first_byte_timeout: ",
                  "expected a duration"},
        bad_value{"upstream:\n  idle_timeout: 1d", "t.yaml:2: upstream.idle_timeout: ", "expected a duration"},
        bad_value{"upstream:\n  retries: many", "t.yaml:2: upstream.retries: ", "expected a whole number"},
        bad_value{"busy_poll_us: 10001", "t.yaml:1: busy_poll_us: ", "at most 10000"},
        bad_value{"busy_poll_us: 50us", "t.yaml:1: busy_poll_us: ", "expected a whole number"},
        bad_value{"upstream:\n  max_idle_per_replica: -3", "t.yaml:2: upstream.max_idle_per_replica: ",
                  "expected a whole number"},
        bad_value{"client:\n  header_timeout: 0", "t.yaml:2: client.header_timeout: ", "greater than 0"},
        bad_value{"client:\n  body_timeout: ''", "t.yaml:2: client.body_timeout: ", "expected a duration"},
        bad_value{"client:\n  keepalive_timeout:", "t.yaml:2: client.keepalive_timeout: ", "expected a duration"},
        bad_value{"client:\n  max_header_bytes: 512", "t.yaml:2: client.max_header_bytes: ",
                  "at least 1KiB, got 512B"},
        bad_value{"client:\n  max_header_bytes: 2GiB", "t.yaml:2: client.max_header_bytes: ", "at most 1GiB"},
        bad_value{"client:\n  max_body_bytes: 0", "t.yaml:2: client.max_body_bytes: ", "at least 1B"},
        bad_value{"client:\n  max_body_bytes: 1.5GiB", "t.yaml:2: client.max_body_bytes: ", "expected a size"},
        bad_value{"client:\n  max_connections: 0", "t.yaml:2: client.max_connections: ", "at least 1"},
        bad_value{"client:\n  trusted_proxies: [10.0.0.0/33]", "t.yaml:2: client.trusted_proxies: ", "CIDR"},
        bad_value{"client:\n  trusted_proxies: 10.0.0.0/8", "t.yaml:2: client.trusted_proxies: ", "expected a list"},
        bad_value{"health:\n  path: healthz", "t.yaml:2: health.path: ", "starting with '/'"},
        bad_value{"health:\n  interval: 0s", "t.yaml:2: health.interval: ", "greater than 0"},
        bad_value{"health:\n  fast_interval: fast", "t.yaml:2: health.fast_interval: ", "expected a duration"},
        bad_value{"health:\n  fall: 0", "t.yaml:2: health.fall: ", "at least 1"},
        bad_value{"health:\n  rise: 0", "t.yaml:2: health.rise: ", "at least 1"},
        bad_value{"health:\n  timeout: 0ms", "t.yaml:2: health.timeout: ", "greater than 0"},
        bad_value{"drain:\n  min_period: -1s", "t.yaml:2: drain.min_period: ", "expected a duration"},
        bad_value{"drain:\n  timeout: forever", "t.yaml:2: drain.timeout: ", "expected a duration"}));

TEST(ConfigYaml, MethodsMayUseAnyUppercaseToken) {
  EXPECT_EQ(load_ok("router: {methods: [POST, GET, M-SEARCH]}").router.methods,
            (std::vector<std::string>{"POST", "GET", "M-SEARCH"}));
}

TEST(ConfigYaml, UrlsWithoutPortOrWithIpv6AreAccepted) {
  EXPECT_EQ(load_ok("topology: {url: 'http://exporter/topology?x=1'}").topology.url,
            "http://exporter/topology?x=1");
  EXPECT_EQ(load_ok("topology: {url: 'http://[::1]:9000/t'}").topology.url, "http://[::1]:9000/t");
  EXPECT_EQ(load_ok("topology: {ray_dashboard: 'http://10.0.0.1:8265/'}").topology.ray_dashboard,
            "http://10.0.0.1:8265/");
}

// ---------------------------------------------------------------------------------------------
// Files

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("ingressd_config_test_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigFile, LoadsAndRecordsThePath) {
  const auto path = write("ingressd.yaml", "threads: 2\n");
  auto result = load_file(path);
  ASSERT_TRUE(std::holds_alternative<config>(result)) << std::get<config_error>(result).message;
  EXPECT_EQ(std::get<config>(result).threads, 2u);
  EXPECT_EQ(std::get<config>(result).config_file, path);
}

TEST_F(ConfigFile, ErrorsCarryThePathAndLine) {
  const auto path = write("ingressd.yaml", "threads: 2\n\nrouter:\n  timout: 1s\n");
  auto result = load_file(path);
  ASSERT_TRUE(std::holds_alternative<config_error>(result));
  EXPECT_EQ(std::get<config_error>(result).message,
            path + ":4: unknown key 'router.timout'; did you mean 'router.timeout'?");
}

TEST_F(ConfigFile, MissingFileAndDirectoryAreErrorsNamingThePath) {
  const auto missing = (dir_ / "nope.yaml").string();
  auto result = load_file(missing);
  ASSERT_TRUE(std::holds_alternative<config_error>(result));
  EXPECT_TRUE(contains(std::get<config_error>(result).message, "'" + missing + "'"));
  EXPECT_TRUE(contains(std::get<config_error>(result).message, "No such file"));

  result = load_file(dir_.string());
  ASSERT_TRUE(std::holds_alternative<config_error>(result));
  EXPECT_TRUE(contains(std::get<config_error>(result).message, "is a directory"));
}

TEST(ConfigExample, LoadsAndEqualsDefaults) {
  const std::string path = INGRESSD_TEST_DATA "/../../config/ingressd.example.yaml";
  auto result = load_file(path);
  ASSERT_TRUE(std::holds_alternative<config>(result)) << std::get<config_error>(result).message;
  auto cfg = std::get<config>(result);
  EXPECT_EQ(cfg.config_file, path);
  cfg.config_file.clear();
  EXPECT_EQ(cfg, config{});
}

TEST(ConfigExample, BesideRayHaproxyClashesWithNothingRayBinds) {
  // Issue #28 item 6: Ray's HAProxy binds 8000, 9101 (metrics) and 8404 (stats) on every node,
  // Serve's gRPC proxy 9000 (ray haproxy.py, constants.py); the default admin port was 9101.
  const std::string path = INGRESSD_TEST_DATA "/../../config/beside-ray-haproxy.yaml";
  auto result = load_file(path);
  ASSERT_TRUE(std::holds_alternative<config>(result)) << std::get<config_error>(result).message;
  const auto& cfg = std::get<config>(result);
  for (const std::uint16_t ray : {8000, 9000, 9101, 8404, 8265, 6379, 10001, 8500}) {
    EXPECT_NE(cfg.listen.port, ray);
    EXPECT_NE(cfg.admin_listen.port, ray);
    EXPECT_NE(config{}.admin_listen.port, ray) << "the default admin port";
    EXPECT_FALSE(usual_holder(ray).empty()) << ray << ": a bind error names what holds it";
  }
  EXPECT_NE(usual_holder(9101).find("HAProxy metrics"), std::string_view::npos);
  EXPECT_NE(usual_holder(8404).find("HAProxy stats"), std::string_view::npos);
  EXPECT_TRUE(usual_holder(8100).empty());
  EXPECT_FALSE(cfg.topology.url.empty());
}

TEST(ConfigExample, HasEveryKeyWithAComment) {
  const std::string path = INGRESSD_TEST_DATA "/../../config/ingressd.example.yaml";
  EXPECT_EQ(yaml_leaf_keys(YAML::LoadFile(path)), known_key_set());
  std::ifstream in(path);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const auto first = line.find_first_not_of(' ');
    if (first == std::string::npos || line[first] == '#') continue;
    const bool section_header = line.back() == ':' && first == 0;
    if (!section_header) {
      EXPECT_TRUE(contains(line, " # ")) << "line " << number << " has no comment";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Command line

std::variant<command_line, config_error> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ingressd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

command_line parse_ok(std::vector<std::string> args) {
  auto result = parse(std::move(args));
  if (const auto* err = std::get_if<config_error>(&result)) {
    ADD_FAILURE() << "unexpected error: " << err->message;
    return {};
  }
  return std::get<command_line>(result);
}

std::string parse_error(std::vector<std::string> args) {
  auto result = parse(std::move(args));
  if (const auto* err = std::get_if<config_error>(&result)) return err->message;
  ADD_FAILURE() << "expected an error";
  return {};
}

TEST(ConfigCli, EveryValueFlagSetsItsField) {
  const auto cl = parse_ok({"--listen", "127.0.0.1:8001", "--admin-listen", "[::1]:9102", "--node-ip",
                            "10.1.2.3", "--topology-file", "/t.json", "--threads", "7", "--log-level", "warn",
                            "--access-log", "-", "--tls-listen", "127.0.0.1:8443", "--tls-cert", "/c.pem",
                            "--tls-key", "/k.pem"});
  EXPECT_EQ(cl.cfg.listen, (host_port{"127.0.0.1", 8001}));
  EXPECT_EQ(cl.cfg.tls.listen, (host_port{"127.0.0.1", 8443}));
  EXPECT_EQ(cl.cfg.tls.cert_file, "/c.pem");
  EXPECT_EQ(cl.cfg.tls.key_file, "/k.pem");
  EXPECT_EQ(cl.cfg.admin_listen, (host_port{"::1", 9102}));
  EXPECT_EQ(cl.cfg.node_ip, "10.1.2.3");
  EXPECT_EQ(cl.cfg.topology.file, "/t.json");
  EXPECT_EQ(cl.cfg.threads, 7u);
  EXPECT_EQ(cl.cfg.level, log_level::warn);
  EXPECT_EQ(cl.cfg.access_log, "-");
  EXPECT_FALSE(cl.check_config);
  EXPECT_FALSE(cl.demo);
  EXPECT_FALSE(cl.help);
  EXPECT_FALSE(cl.version);
}

TEST(ConfigCli, EachTopologySourceFlag) {
  EXPECT_EQ(parse_ok({"--ray-dashboard", "http://10.0.0.1:8265"}).cfg.topology.ray_dashboard,
            "http://10.0.0.1:8265");
  EXPECT_EQ(parse_ok({"--topology-url=http://exp:9000/t"}).cfg.topology.url, "http://exp:9000/t");
  EXPECT_EQ(parse_ok({"--topology-file=/etc/t.yaml"}).cfg.topology.file, "/etc/t.yaml");
}

TEST(ConfigCli, Switches) {
  const auto cl = parse_ok({"--check-config", "--topology-file", "/t.json"});
  EXPECT_TRUE(cl.check_config);
  EXPECT_FALSE(cl.demo);
}

TEST(ConfigCli, DemoNeedsNoTopologySource) {
  const auto cl = parse_ok({"--demo"});
  EXPECT_TRUE(cl.demo);
  EXPECT_EQ(cl.cfg, config{});
}

TEST(ConfigCli, DemoWithATopologySourceIsAnError) {
  EXPECT_TRUE(contains(parse_error({"--demo", "--topology-file", "/t.json"}), "--demo uses its built-in topology"));
}

TEST(ConfigCli, NoTopologySourceIsAnError) {
  const auto message = parse_error({});
  EXPECT_TRUE(starts_with(message, "no topology source"));
  EXPECT_TRUE(contains(message, "--topology-file"));
  EXPECT_TRUE(contains(message, "--demo"));
  EXPECT_TRUE(starts_with(parse_error({"--check-config"}), "no topology source"));
}

TEST(ConfigCli, TwoTopologySourcesAreAnError) {
  const auto message = parse_error({"--topology-file", "/t.json", "--topology-url", "http://x/t"});
  EXPECT_TRUE(starts_with(message, "more than one topology source"));
  EXPECT_TRUE(contains(message, "'/t.json'"));
  EXPECT_TRUE(contains(message, "'http://x/t'"));
}

TEST(ConfigCli, HelpAndVersionSkipValidation) {
  auto cl = parse_ok({"--help"});
  EXPECT_TRUE(cl.help);
  cl = parse_ok({"--version"});
  EXPECT_TRUE(cl.version);
  // Even with a config file that does not exist, or two topology sources.
  cl = parse_ok({"--config", "/nonexistent/ingressd.yaml", "--help"});
  EXPECT_TRUE(cl.help);
  cl = parse_ok({"--version", "--topology-file", "/a", "--topology-url", "http://b/"});
  EXPECT_TRUE(cl.version);
}

TEST(ConfigCli, UnknownFlagIsNamed) {
  EXPECT_TRUE(starts_with(parse_error({"--bogus"}), "--bogus: unknown flag"));
  EXPECT_TRUE(starts_with(parse_error({"--bogus=1", "--demo"}), "--bogus: unknown flag"));
  const auto message = parse_error({"--lisen", "0.0.0.0:1", "--demo"});
  EXPECT_TRUE(starts_with(message, "--lisen: unknown flag"));
  EXPECT_TRUE(contains(message, "did you mean '--listen'?"));
}

TEST(ConfigCli, PrefixesAndShortFlagsAreNotGuessed) {
  EXPECT_TRUE(starts_with(parse_error({"--list", "0.0.0.0:1", "--demo"}), "--list: unknown flag"));
  EXPECT_TRUE(starts_with(parse_error({"-h"}), "-h: unknown flag"));
}

TEST(ConfigCli, StrayArgumentIsAnError) {
  EXPECT_TRUE(starts_with(parse_error({"--demo", "extra"}), "unexpected argument 'extra'"));
}

TEST(ConfigCli, BadValuesNameTheFlag) {
  EXPECT_EQ(parse_error({"--threads", "x", "--demo"}), "--threads: expected a whole number, got 'x'");
  EXPECT_TRUE(starts_with(parse_error({"--listen", "nope", "--demo"}), "--listen: expected HOST:PORT"));
  EXPECT_TRUE(starts_with(parse_error({"--admin-listen", "1.2.3.4", "--demo"}), "--admin-listen: expected HOST:PORT"));
  EXPECT_TRUE(starts_with(parse_error({"--node-ip", "x", "--demo"}), "--node-ip: expected an IP address"));
  EXPECT_TRUE(starts_with(parse_error({"--ray-dashboard", "https://10.0.0.1:8265"}),
                          "--ray-dashboard: https is not supported"));
  EXPECT_TRUE(starts_with(parse_error({"--topology-url", "x"}), "--topology-url: expected an http:// URL"));
  EXPECT_TRUE(starts_with(parse_error({"--log-level", "loud", "--demo"}), "--log-level: expected one of"));
  EXPECT_TRUE(starts_with(parse_error({"--threads", "-2", "--demo"}), "--threads: expected a whole number"));
}

TEST(ConfigCli, MissingValuesNameTheFlag) {
  EXPECT_EQ(parse_error({"--demo", "--listen"}), "--listen: missing value");
  EXPECT_EQ(parse_error({"--listen=", "--demo"}), "--listen: missing value");
  EXPECT_TRUE(starts_with(parse_error({"--listen", "--demo"}), "--listen: missing value"));
  EXPECT_TRUE(starts_with(parse_error({"--topology-file", "", "--demo"}), "--topology-file: missing value"));
  EXPECT_TRUE(starts_with(parse_error({"--config"}), "--config: missing value"));
}

TEST(ConfigCli, RepeatedFlagAndSwitchValueAreErrors) {
  EXPECT_EQ(parse_error({"--demo", "--threads", "1", "--threads", "2"}), "--threads: given more than once");
  EXPECT_EQ(parse_error({"--demo=1"}), "--demo: takes no value");
}

TEST(ConfigCli, TrustedProxyRepeatsAndProxyProtocolNeedsIt) {
  const auto cl = parse_ok({"--demo", "--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "2001:db8::/32",
                            "--proxy-protocol"});
  ASSERT_EQ(cl.cfg.client.trusted_proxies.size(), 2u);
  EXPECT_EQ(cl.cfg.client.trusted_proxies[0].to_string(), "10.0.0.0/8");
  EXPECT_EQ(cl.cfg.client.trusted_proxies[1].to_string(), "2001:db8::/32");
  EXPECT_TRUE(cl.cfg.client.proxy_protocol);
  EXPECT_FALSE(parse_ok({"--demo"}).cfg.client.proxy_protocol);
  EXPECT_EQ(parse_error({"--demo", "--trusted-proxy", "10.0.0.0/40"}).find("--trusted-proxy: "), 0u);
  EXPECT_NE(parse_error({"--demo", "--proxy-protocol"}).find("client.proxy_protocol: needs client.trusted_proxies"),
            std::string::npos);
}

TEST_F(ConfigFile, FlagsOverrideTheFile) {
  const auto path = write("ingressd.yaml",
                          "listen: 0.0.0.0:7000\nthreads: 3\nlog_level: debug\n"
                          "topology:\n  file: /from-file.json\n  poll_interval: 4s\n");
  const auto cl = parse_ok({"--listen", "127.0.0.1:7001", "--config", path, "--threads", "5"});
  EXPECT_EQ(cl.cfg.config_file, path);
  EXPECT_EQ(cl.cfg.listen, (host_port{"127.0.0.1", 7001}));  // flag wins
  EXPECT_EQ(cl.cfg.threads, 5u);                              // flag wins
  EXPECT_EQ(cl.cfg.level, log_level::debug);                  // file kept
  EXPECT_EQ(cl.cfg.topology.file, "/from-file.json");         // file kept
  EXPECT_EQ(cl.cfg.topology.poll_interval, 4s);               // file kept

  // The same-setting flag replaces the file's topology file.
  EXPECT_EQ(parse_ok({"--config", path, "--topology-file", "/flag.json"}).cfg.topology.file, "/flag.json");
}

TEST_F(ConfigFile, SourceFromFileAndDifferentSourceFlagIsTwoSources) {
  const auto path = write("ingressd.yaml", "topology:\n  file: /from-file.json\n");
  const auto message = parse_error({"--config", path, "--ray-dashboard", "http://10.0.0.1:8265"});
  EXPECT_TRUE(starts_with(message, "more than one topology source"));
}

TEST_F(ConfigFile, ConfigFlagErrorsNameTheFile) {
  const auto missing = (dir_ / "missing.yaml").string();
  EXPECT_TRUE(contains(parse_error({"--config", missing, "--demo"}), missing));
  const auto bad = write("bad.yaml", "router:\n  on_failure: maybe\n");
  EXPECT_TRUE(starts_with(parse_error({"--config", bad, "--demo"}), bad + ":2: router.on_failure: "));
}

TEST(ConfigCli, UsageListsEveryFlagWithDefaults) {
  const auto text = usage();
  for (const char* flag : {"--config FILE", "--listen HOST:PORT", "--admin-listen HOST:PORT", "--node-ip IP",
                           "--topology-file PATH", "--ray-dashboard URL", "--topology-url URL", "--threads N",
                           "--log-level", "--access-log PATH|-|off", "--check-config", "--demo", "--version",
                           "--help"}) {
    EXPECT_TRUE(contains(text, flag));
  }
  EXPECT_TRUE(contains(text, "default 0.0.0.0:8000"));
  EXPECT_TRUE(contains(text, "default 127.0.0.1:9190"));
  EXPECT_TRUE(contains(text, "trace|debug|info|warn|error (default info)"));
  EXPECT_TRUE(contains(text, "(default off)"));
}

// ---------------------------------------------------------------------------------------------
// validate() on configs built in code

config with_source() {
  config cfg;
  cfg.topology.file = "/t.json";
  return cfg;
}

TEST(ConfigValidate, DefaultsWithOneSourcePass) { EXPECT_EQ(validate(with_source(), false), std::nullopt); }

TEST(ConfigValidate, RejectsSingleValueViolations) {
  auto expect_error = [](config cfg, const std::string& key) {
    const auto err = validate(cfg, false);
    ASSERT_TRUE(err.has_value()) << key;
    EXPECT_TRUE(starts_with(err->message, key + ": "));
  };
  auto cfg = with_source();
  cfg.router.timeout = 0ms;
  expect_error(cfg, "router.timeout");
  cfg = with_source();
  cfg.upstream.idle_timeout = -1s;
  expect_error(cfg, "upstream.idle_timeout");
  cfg = with_source();
  cfg.router.session_header = "X-Session-Id";
  expect_error(cfg, "router.session_header");
  cfg = with_source();
  cfg.router.methods = {"post"};
  expect_error(cfg, "router.methods");
  cfg = with_source();
  cfg.client.max_header_bytes = 100;
  expect_error(cfg, "client.max_header_bytes");
  cfg = with_source();
  cfg.health.fall = 0;
  expect_error(cfg, "health.fall");
  cfg = with_source();
  cfg.health.path = "x";
  expect_error(cfg, "health.path");
  cfg = with_source();
  cfg.root_path = "/";
  expect_error(cfg, "root_path");
  cfg = with_source();
  cfg.listen.host = "";
  expect_error(cfg, "listen");
  cfg = with_source();
  cfg.topology.file.clear();
  cfg.topology.url = "https://x/";
  expect_error(cfg, "topology.url");
  cfg = with_source();
  cfg.threads = 5000;
  expect_error(cfg, "threads");
}

TEST(ConfigValidate, ListenersMustNotCollide) {
  auto cfg = with_source();
  cfg.admin_listen = cfg.listen;
  ASSERT_TRUE(validate(cfg, false));
  EXPECT_TRUE(contains(validate(cfg, false)->message, "must use different addresses"));
  // A wildcard listener covers every address on that port.
  cfg.listen = {"0.0.0.0", 9000};
  cfg.admin_listen = {"127.0.0.1", 9000};
  EXPECT_TRUE(validate(cfg, false));
  // Port 0 means two different kernel-chosen ports.
  cfg.listen = {"127.0.0.1", 0};
  cfg.admin_listen = {"127.0.0.1", 0};
  EXPECT_EQ(validate(cfg, false), std::nullopt);
}

TEST(ConfigValidate, TlsListenerNeedsCertificateAndKeyAndItsOwnAddress) {
  auto cfg = with_source();
  EXPECT_FALSE(cfg.tls.enabled());  // off by default
  cfg.tls.listen = {"127.0.0.1", 8443};
  auto err = validate(cfg, false);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message, "needs tls.cert_file and tls.key_file"));
  cfg.tls.cert_file = "/c.pem";
  EXPECT_TRUE(validate(cfg, false));
  cfg.tls.key_file = "/k.pem";
  EXPECT_EQ(validate(cfg, false), std::nullopt);
  cfg.tls.listen = {"0.0.0.0", cfg.listen.port};
  err = validate(cfg, false);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message, "tls.listen (0.0.0.0:8000) and listen"));
  cfg.tls.listen = cfg.admin_listen;
  err = validate(cfg, false);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message, "and admin_listen"));
  // A certificate without a listener would be ignored silently.
  cfg.tls.listen = {};
  err = validate(cfg, false);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message, "tls.listen is not"));
  // "" in a file switches it off again.
  EXPECT_FALSE(load_ok("tls:\n  listen: ''\n").tls.enabled());
}

TEST(ConfigValidate, ForwardBodyNeedsABodyLimit) {
  auto cfg = with_source();
  cfg.router.body_limit = 0;
  EXPECT_EQ(validate(cfg, false), std::nullopt);  // unused while forward_body is off
  cfg.router.forward_body = true;
  const auto err = validate(cfg, false);
  ASSERT_TRUE(err);
  EXPECT_TRUE(starts_with(err->message, "router.body_limit: "));
}

TEST(ConfigValidate, TopologySourceRules) {
  config cfg;
  EXPECT_TRUE(validate(cfg, false));           // none
  EXPECT_EQ(validate(cfg, true), std::nullopt);  // none, demo
  cfg.topology.ray_dashboard = "http://10.0.0.1:8265";
  EXPECT_EQ(validate(cfg, false), std::nullopt);
  cfg.topology.url = "http://x/t";
  ASSERT_TRUE(validate(cfg, false));
  EXPECT_TRUE(starts_with(validate(cfg, false)->message, "more than one topology source"));
}


TEST(ConfigGrpc, ListenerKeysFlagAndDefaults) {
  const config d{};
  EXPECT_FALSE(d.grpc.enabled());  // off by default
  EXPECT_EQ(d.grpc.max_concurrent_streams, 100u);
  EXPECT_EQ(d.grpc.health_path, "/ray.serve.RayServeAPIService/Healthz");
  const auto c = load_ok("grpc:\n  listen: 127.0.0.1:9000\n  max_concurrent_streams: 8\n  health_path: /grpc.health.v1.Health/Check\n");
  EXPECT_EQ(c.grpc.listen, (host_port{"127.0.0.1", 9000}));
  EXPECT_EQ(c.grpc.max_concurrent_streams, 8u);
  EXPECT_EQ(c.grpc.health_path, "/grpc.health.v1.Health/Check");
  EXPECT_FALSE(load_ok("grpc:\n  listen: ''\n").grpc.enabled());
  EXPECT_TRUE(starts_with(load_error("grpc:\n  max_concurrent_streams: 0\n"), "t.yaml:2: grpc.max_concurrent_streams"));
  EXPECT_TRUE(starts_with(load_error("grpc:\n  health_path: Healthz\n"), "t.yaml:2: grpc.health_path"));
  EXPECT_EQ(d.grpc.max_upstream_connections, 16u);
  EXPECT_EQ(d.grpc.keepalive_interval, 10s);
  EXPECT_EQ(d.grpc.keepalive_timeout, 5s);
  const auto k = load_ok("grpc:\n  max_upstream_connections: 2\n  keepalive_interval: 0s\n  keepalive_timeout: 250ms\n");
  EXPECT_EQ(k.grpc.max_upstream_connections, 2u);
  EXPECT_EQ(k.grpc.keepalive_interval, 0s);  // 0: no keepalive
  EXPECT_EQ(k.grpc.keepalive_timeout, 250ms);
  EXPECT_TRUE(starts_with(load_error("grpc:\n  max_upstream_connections: 0\n"), "t.yaml:2: grpc.max_upstream_connections"));
  EXPECT_TRUE(starts_with(load_error("grpc:\n  keepalive_timeout: 0s\n"), "t.yaml:2: grpc.keepalive_timeout"));
  const char* argv[] = {"ingressd", "--topology-file", "/t.json", "--grpc-listen", "127.0.0.2:0"};
  auto cl = parse_command_line(5, argv);
  ASSERT_TRUE(std::holds_alternative<command_line>(cl));
  EXPECT_EQ(std::get<command_line>(cl).cfg.grpc.listen, (host_port{"127.0.0.2", 0}));
}

TEST(ConfigValidate, GrpcListenerNeedsItsOwnAddress) {
  auto cfg = with_source();
  cfg.grpc.listen = {"0.0.0.0", cfg.listen.port};
  auto err = validate(cfg, false);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message, "grpc.listen (0.0.0.0:8000) and listen"));
  cfg.grpc.listen = cfg.admin_listen;
  err = validate(cfg, false);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message, "grpc.listen") && contains(err->message, "and admin_listen"));
  cfg.grpc.listen = {"127.0.0.1", 9000};
  EXPECT_EQ(validate(cfg, false), std::nullopt);
}
}  // namespace
}  // namespace ingressd::config
