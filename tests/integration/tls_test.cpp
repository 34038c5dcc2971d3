// TLS termination (contract §9 TLS, issue #19): the HTTPS listener serves the same request path
// as the plain one, with a real TLS client (OpenSSL through Asio) and certificates made here;
// reloads swap the certificate for new handshakes only; bad input at the TLS layer (plain HTTP,
// handshakes that never finish, records cut short, renegotiation, old protocol versions) never
// reaches a replica.
#include <openssl/ssl.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fakes/admin_client.hpp"
#include "fakes/certs.hpp"
#include "fakes/http_client.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/servers.hpp"
#include "fakes/topology_builder.hpp"
#include "ingressd/demo/replica_server.hpp"
#include "ingressd/demo/router_server.hpp"
#include "ingressd/tls/context.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::replica_behaviour;
using demo::replica_server;
using testing::cert_files;
using testing::cert_spec;
using testing::connection;
using testing::format_request;
using testing::http_response;
using testing::make_cert;
using testing::make_replica;
using testing::make_router;
using testing::proxy;
using testing::replica_named;
using testing::scrape_until;
using testing::target_of;
using testing::temp_dir;
using testing::test_config;
using testing::tls_options;
using testing::topology_builder;

const std::string loopback = "127.0.0.1";

config::config tls_config(const cert_files& c, unsigned threads = 1) {
  auto cfg = test_config(threads);
  cfg.tls.listen = {loopback, 0};
  cfg.tls.cert_file = c.cert;
  cfg.tls.key_file = c.key;
  return cfg;
}

/// A client that checks the certificate against `c` (self-signed: its own CA) and "localhost".
tls_options verified(const cert_files& c) {
  tls_options o;
  o.ca_file = c.cert;
  return o;
}

http_response https(const proxy& p, const tls_options& o, std::string_view method, std::string_view target,
                    const testing::header_list& headers = {}, std::string_view body = {}) {
  auto c = connection::open_tls(loopback, p.tls_port(), o);
  if (!c.connected()) {
    http_response r;
    r.error = c.error();
    return r;
  }
  EXPECT_TRUE(c.write(format_request(method, target, loopback, p.tls_port(), headers, body))) << c.error();
  return c.read_response();
}

std::string served_by(const http_response& r) { return r.header("x-served-by").value_or(""); }

double metric(const proxy& p, const std::string& series) { return testing::scrape_metrics(p.admin_port()).at(series); }

TEST(Tls, ServesHttpsBesidePlainHttpAndTellsTheReplica) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto r = make_replica("SERVE_REPLICA::llm#A#1");
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {target_of(*r, r->name())}));

  auto res = https(p, verified(cert), "GET", "/v1/models", {{"X-Forwarded-Proto", "http"}});
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(served_by(res), r->name());
  EXPECT_TRUE(res.has_header("x-request-id"));
  auto plain = testing::http_get(loopback, p.port(), "/v1/models");
  ASSERT_TRUE(plain.complete) << plain.error;
  EXPECT_EQ(plain.status, 200u);

  const auto seen = r->requests();
  ASSERT_EQ(seen.size(), 2u);
  // The client's own X-Forwarded-Proto is replaced by what ingressd saw (contract §4.4).
  EXPECT_EQ(seen[0].header("x-forwarded-proto").value_or(""), "https");
  EXPECT_EQ(demo::count_header(seen[0].headers, "x-forwarded-proto"), 1u);
  EXPECT_EQ(seen[1].header("x-forwarded-proto").value_or(""), "http");

  const auto m = scrape_until(p.admin_port(), [](const testing::metrics_scrape& s) {
    return s.at(R"(ingressd_listener_requests_total{listener="https"})") == 1 &&
           s.at(R"(ingressd_listener_requests_total{listener="http"})") == 1;
  });
  EXPECT_EQ(m.at(R"(ingressd_listener_requests_total{listener="https"})"), 1) << m.text;
  EXPECT_EQ(m.at(R"(ingressd_tls_handshakes_total{kind="full"})"), 1) << m.text;
  EXPECT_GT(m.at("ingressd_tls_certificate_expiry_timestamp_seconds"), 0) << m.text;
}

TEST(Tls, RouterPathOverTlsPinsTheRoutersReplica) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto a = make_replica("SERVE_REPLICA::llm#A#a", "127.0.0.2");
  auto b = make_replica("SERVE_REPLICA::llm#A#b", "127.0.0.2");
  auto router = make_router("127.0.0.2", "router-1");
  router->set_replicas({b->name()});
  proxy p(tls_config(cert), "127.0.0.2");
  p.set_topology(topology_builder()
                     .app("llm", "/", {target_of(*a, a->name()), target_of(*b, b->name())})
                     .routers({target_of(*router, router->name())}));
  for (int i = 0; i < 3; ++i) {
    auto res = https(p, verified(cert), "POST", "/v1/chat/completions", {{"Content-Type", "application/json"}},
                     R"({"prompt":"hi"})");
    ASSERT_TRUE(res.complete) << res.error;
    EXPECT_EQ(res.status, 200u) << res.body;
    EXPECT_EQ(served_by(res), b->name());
  }
  EXPECT_EQ(router->route_requests().size(), 3u);
  EXPECT_TRUE(a->requests().empty());
}

TEST(Tls, SseEventsAreRelayedOneByOneOverTls) {
  // As Streaming.ScriptedEventStreamOnAnyPathIsRelayedEventByEvent: no event may wait for the
  // next one (no record coalescing across writes).
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::stream_events(4, 400ms));
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {target_of(r, r.name())}));
  auto res = https(p, verified(cert), "GET", "/events");
  ASSERT_TRUE(res.complete) << res.error;
  ASSERT_EQ(res.events.size(), 5u);
  for (std::size_t i = 1; i < res.events.size(); ++i)
    EXPECT_GE(res.events[i].at - res.events[i - 1].at, 150ms) << "event " << i << " arrived with the one before it";
}

TEST(Tls, PipelinedAndKeptAliveRequestsShareOneTlsConnection) {
  // Two requests in one TLS record: the second is decrypted (held by OpenSSL or the session's
  // buffer) before the first is answered, and must be served without waiting for the socket.
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto r = make_replica("SERVE_REPLICA::llm#A#1");
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {target_of(*r, r->name())}));
  auto c = connection::open_tls(loopback, p.tls_port(), verified(cert));
  ASSERT_TRUE(c.connected()) << c.error();
  const auto get = [&](std::string_view path) { return format_request("GET", path, loopback, p.tls_port(), {}, {}); };
  ASSERT_TRUE(c.write(get("/one") + get("/two")));
  auto first = c.read_response(5s);
  auto second = c.read_response(5s);
  ASSERT_TRUE(first.complete) << first.error;
  ASSERT_TRUE(second.complete) << second.error;
  EXPECT_NE(first.body.find("/one"), std::string::npos) << first.body;
  EXPECT_NE(second.body.find("/two"), std::string::npos) << second.body;
  // After the idle wait, the same connection serves a third one.
  ASSERT_TRUE(c.write(get("/three")));
  auto third = c.read_response(5s);
  ASSERT_TRUE(third.complete) << third.error;
  EXPECT_NE(third.body.find("/three"), std::string::npos) << third.body;
  EXPECT_EQ(metric(p, R"(ingressd_tls_handshakes_total{kind="full"})"), 1);
}

TEST(Tls, ClientDisconnectMidStreamClosesTheUpstream) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 50ms, 200));  // ~10 s if nobody stops it
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {target_of(r, r.name())}));
  auto c = connection::open_tls(loopback, p.tls_port(), verified(cert));
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(format_request("POST", "/v1/chat/completions", loopback, p.tls_port(),
                                     {{"Content-Type", "application/json"}}, R"({"stream":true})")));
  auto partial = c.read_response(400ms);
  ASSERT_TRUE(partial.timed_out) << partial.error;
  ASSERT_GE(partial.events.size(), 2u);
  c.close();
  EXPECT_TRUE(r.wait_for_aborted_responses(1, 3s)) << "the replica never saw its connection close";
}

TEST(Tls, PlainHttpOnTheTlsPortIsAnsweredInPlainHttpAndReachesNoReplica) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto r = make_replica("SERVE_REPLICA::llm#A#1");
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {target_of(*r, r->name())}));
  auto res = testing::http_get(loopback, p.tls_port(), "/v1/models");
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 400u);
  EXPECT_NE(res.body.find("HTTPS port"), std::string::npos) << res.body;
  EXPECT_TRUE(r->requests().empty());
  EXPECT_EQ(metric(p, R"(ingressd_tls_handshake_failures_total{reason="http_request"})"), 1);
}

TEST(Tls, HandshakeThatNeverFinishesIsClosedAtTheHandshakeTimeout) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto cfg = tls_config(cert);
  cfg.tls.handshake_timeout = 200ms;
  proxy p(cfg);
  p.set_topology(topology_builder().app("llm", "/", {}));
  // Silent after connect, and silent after the first bytes of a ClientHello record.
  auto silent = connection::open(loopback, p.tls_port());
  auto partial = connection::open(loopback, p.tls_port());
  ASSERT_TRUE(silent.connected() && partial.connected());
  ASSERT_TRUE(partial.write(std::string("\x16\x03\x01\x02\x00\x01", 6)));
  EXPECT_TRUE(silent.is_closed(10s));
  EXPECT_TRUE(partial.is_closed(10s));
  const auto m = scrape_until(p.admin_port(), [](const testing::metrics_scrape& s) {
    return s.at(R"(ingressd_tls_handshake_failures_total{reason="timeout"})") == 2 &&
           s.at("ingressd_tls_connections") == 0;
  });
  EXPECT_EQ(m.at(R"(ingressd_tls_handshake_failures_total{reason="timeout"})"), 2) << m.text;
  EXPECT_EQ(m.at("ingressd_tls_connections"), 0) << m.text;
}

TEST(Tls, ClientStallingMidRecordIsTimedOutAndReachesNoReplica) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto r = make_replica("SERVE_REPLICA::llm#A#1");
  auto cfg = tls_config(cert);
  cfg.client.header_timeout = 300ms;
  proxy p(cfg);
  p.set_topology(topology_builder().app("llm", "/", {target_of(*r, r->name())}));
  auto c = connection::open_tls(loopback, p.tls_port(), verified(cert));
  ASSERT_TRUE(c.connected()) << c.error();
  // An application-data record header announcing 64 bytes, and 10 of them.
  ASSERT_TRUE(c.write_raw(std::string("\x17\x03\x03\x00\x40", 5) + std::string(10, 'x')));
  EXPECT_TRUE(c.is_closed(10s));
  EXPECT_TRUE(r->requests().empty());
}

TEST(Tls, RenegotiationIsRefusedAndTheServerKeepsServing) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto r = make_replica("SERVE_REPLICA::llm#A#1");
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {target_of(*r, r->name())}));
  auto o = verified(cert);
  o.max_version = "1.2";  // TLS 1.3 has no renegotiation
  auto c = connection::open_tls(loopback, p.tls_port(), o);
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(format_request("GET", "/first", loopback, p.tls_port(), {}, {})));
  ASSERT_EQ(c.read_response(5s).status, 200u);
  auto* ssl = static_cast<SSL*>(c.tls_native());
  ASSERT_EQ(SSL_renegotiate(ssl), 1);
  // The next write starts the renegotiation; ingressd declines it (no_renegotiation). Whatever
  // the client makes of that, no second handshake happens and a second request is either
  // served on the old keys or not sent at all.
  if (c.write(format_request("GET", "/second", loopback, p.tls_port(), {}, {}), 5s)) (void)c.read_response(5s);
  EXPECT_LE(r->requests().size(), 2u);
  for (const auto& req : r->requests()) EXPECT_TRUE(req.target == "/first" || req.target == "/second") << req.target;
  EXPECT_EQ(metric(p, R"(ingressd_tls_handshakes_total{kind="full"})"), 1);
  // A fresh connection is served as usual.
  auto fresh = https(p, verified(cert), "GET", "/third");
  ASSERT_TRUE(fresh.complete) << fresh.error;
  EXPECT_EQ(fresh.status, 200u);
}

TEST(Tls, ProtocolVersionsBelowTheFloorAreRefused) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto cfg = tls_config(cert);
  cfg.tls.min_version = "1.3";
  proxy p(cfg);
  p.set_topology(topology_builder().app("llm", "/", {}));
  auto o = verified(cert);
  o.max_version = "1.2";
  auto old = connection::open_tls(loopback, p.tls_port(), o);
  EXPECT_FALSE(old.connected());
  EXPECT_NE(old.error().find("handshake"), std::string::npos) << old.error();
  auto fine = connection::open_tls(loopback, p.tls_port(), verified(cert));
  ASSERT_TRUE(fine.connected()) << fine.error();
  EXPECT_EQ(fine.tls_version(), "TLSv1.3");
  const auto m = scrape_until(p.admin_port(), [](const testing::metrics_scrape& s) {
    return s.at(R"(ingressd_tls_handshake_failures_total{reason="protocol_version"})") == 1;
  });
  EXPECT_EQ(m.at(R"(ingressd_tls_handshake_failures_total{reason="protocol_version"})"), 1) << m.text;
}

TEST(Tls, DefaultFloorRefusesTls11) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {}));
  tls_options o;
  o.min_version = "1.1";
  o.max_version = "1.1";
  auto c = connection::open_tls(loopback, p.tls_port(), o);
  EXPECT_FALSE(c.connected());
  auto ok = connection::open_tls(loopback, p.tls_port(), verified(cert));
  EXPECT_TRUE(ok.connected()) << ok.error();
}

void expect_resumption(const std::string& max_version) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  auto r = make_replica("SERVE_REPLICA::llm#A#1");
  proxy p(tls_config(cert, 2));  // two workers: a ticket from one resumes on the other
  p.set_topology(topology_builder().app("llm", "/", {target_of(*r, r->name())}));
  auto o = verified(cert);
  o.max_version = max_version;
  auto first = connection::open_tls(loopback, p.tls_port(), o);
  ASSERT_TRUE(first.connected()) << first.error();
  EXPECT_FALSE(first.tls_resumed());
  ASSERT_TRUE(first.write(format_request("GET", "/", loopback, p.tls_port(), {}, {})));
  ASSERT_EQ(first.read_response(5s).status, 200u);  // TLS 1.3 tickets come after the handshake
  o.session = first.tls_session();
  ASSERT_TRUE(o.session) << "no session ticket";
  constexpr int n = 6;
  for (int i = 0; i < n; ++i) {
    auto again = connection::open_tls(loopback, p.tls_port(), o);
    ASSERT_TRUE(again.connected()) << again.error();
    ASSERT_TRUE(again.write(format_request("GET", "/", loopback, p.tls_port(), {}, {})));
    EXPECT_EQ(again.read_response(5s).status, 200u);
    EXPECT_TRUE(again.tls_resumed()) << "connection " << i;
    // As browsers do (RFC 8446 C.4: tickets are for one use), the next one resumes with the
    // ticket this connection got.
    o.session = again.tls_session();
    ASSERT_TRUE(o.session) << "no ticket on a resumed connection";
  }
  const auto m = scrape_until(p.admin_port(), [](const testing::metrics_scrape& s) {
    return s.at(R"(ingressd_tls_handshakes_total{kind="resumed"})") == n;
  });
  EXPECT_EQ(m.at(R"(ingressd_tls_handshakes_total{kind="resumed"})"), n) << m.text;
  EXPECT_EQ(m.at(R"(ingressd_tls_handshakes_total{kind="full"})"), 1) << m.text;
}

TEST(Tls, SessionTicketsResumeOnEveryWorkerTls13) { expect_resumption(""); }
TEST(Tls, SessionTicketsResumeOnEveryWorkerTls12) { expect_resumption("1.2"); }

TEST(Tls, AlpnChoosesHttp11AndNoOverlapIsNoError) {
  temp_dir dir;
  const auto cert = make_cert(dir.path(), "a");
  proxy p(tls_config(cert));
  p.set_topology(topology_builder().app("llm", "/", {}));
  auto o = verified(cert);
  o.alpn = {"h2", "http/1.1"};
  auto both = connection::open_tls(loopback, p.tls_port(), o);
  ASSERT_TRUE(both.connected()) << both.error();
  EXPECT_EQ(both.tls_alpn(), "http/1.1");
  o.alpn = {"h2"};
  auto h2_only = connection::open_tls(loopback, p.tls_port(), o);
  ASSERT_TRUE(h2_only.connected()) << h2_only.error();
  EXPECT_EQ(h2_only.tls_alpn(), "");
  // Issue #29 item 3: such a client then speaks HTTP/2 anyway. It gets the server preface and a
  // GOAWAY that says HTTP/1.1 is required, in frames it can read, not an HTTP/1.1 505.
  ASSERT_TRUE(h2_only.write(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string("\0\0\0\x04\0\0\0\0\0", 9)));
  const auto got = h2_only.read_until_close(5s);
  EXPECT_TRUE(got.closed || got.reset);
  const auto frames = testing::h2_frames(got.bytes);
  ASSERT_EQ(frames.size(), 2u) << got.bytes;
  EXPECT_EQ(frames[0].type, 0x4) << "the server preface (SETTINGS) comes first";
  EXPECT_EQ(frames[1].type, 0x7);
  EXPECT_EQ(frames[1].error_code(), 0xdu) << "HTTP_1_1_REQUIRED";
  EXPECT_NE(frames[1].debug_data().find("HTTP/1.1"), std::string::npos) << frames[1].debug_data();
}

TEST(Tls, ReloadSwapsTheCertificateForNewHandshakesOnlyAndRefusesABadPair) {
  temp_dir dir;
  const auto a = make_cert(dir.path(), "a", {.common_name = "cert-a"});
  const auto b = make_cert(dir.path(), "b", {.common_name = "cert-b", .type = testing::key_type::rsa_2048});
  auto r = make_replica("SERVE_REPLICA::llm#A#1");
  proxy p(tls_config(a, 2));
  p.set_topology(topology_builder().app("llm", "/", {target_of(*r, r->name())}));
  auto old = connection::open_tls(loopback, p.tls_port(), verified(a));
  ASSERT_TRUE(old.connected()) << old.error();
  const auto get = format_request("GET", "/", loopback, p.tls_port(), {}, {});
  ASSERT_TRUE(old.write(get));
  ASSERT_EQ(old.read_response(5s).status, 200u);

  EXPECT_EQ(p.daemon().reload(std::make_shared<const config::config>(tls_config(b, 2))), std::nullopt);
  p.daemon().sync();  // every worker has the new certificate
  EXPECT_FALSE(connection::open_tls(loopback, p.tls_port(), verified(a)).connected());
  auto fresh = connection::open_tls(loopback, p.tls_port(), verified(b));
  ASSERT_TRUE(fresh.connected()) << fresh.error();
  // The connection made before the reload keeps its session and keys.
  ASSERT_TRUE(old.write(get));
  EXPECT_EQ(old.read_response(5s).status, 200u);

  // A pair that does not match is refused whole; b stays.
  auto bad = tls_config(b, 2);
  bad.tls.key_file = a.key;
  const auto why = p.daemon().reload(std::make_shared<const config::config>(bad));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("does not match"), std::string::npos) << *why;
  p.daemon().sync();
  EXPECT_TRUE(connection::open_tls(loopback, p.tls_port(), verified(b)).connected());
  // tls.listen needs a restart.
  auto moved = tls_config(b, 2);
  moved.tls.listen.port = 1;
  EXPECT_TRUE(p.daemon().reload(std::make_shared<const config::config>(moved)));
}

TEST(TlsContext, CertificateProblemsAreClearErrors) {
  temp_dir dir;
  const auto good = make_cert(dir.path(), "good");
  const auto other = make_cert(dir.path(), "other");
  auto load = [](std::string cert, std::string key, auto now) -> std::string {
    config::tls_settings s;
    s.cert_file = std::move(cert);
    s.key_file = std::move(key);
    auto r = tls::server_context::load(s, now);
    if (auto* e = std::get_if<std::string>(&r)) return *e;
    return "ok";
  };
  const auto now = std::chrono::system_clock::now();
  EXPECT_EQ(load(good.cert, good.key, now), "ok");
  EXPECT_EQ(load(make_cert(dir.path(), "rsa", {.type = testing::key_type::rsa_2048}).cert,
                 (dir.path() / "rsa.key.pem").string(), now),
            "ok");
  auto e = load((dir.path() / "missing.pem").string(), good.key, now);
  EXPECT_NE(e.find("tls.cert_file"), std::string::npos) << e;
  EXPECT_NE(e.find("No such file"), std::string::npos) << e;
  e = load(good.cert, other.key, now);
  EXPECT_NE(e.find("does not match"), std::string::npos) << e;
  e = load(good.key, good.key, now);
  EXPECT_NE(e.find("not a PEM certificate"), std::string::npos) << e;
  e = load(good.cert, good.cert, now);
  EXPECT_NE(e.find("tls.key_file"), std::string::npos) << e;
  e = load(good.cert, good.key, now + std::chrono::hours(48));
  EXPECT_NE(e.find("expired at"), std::string::npos) << e;
  const auto late = make_cert(dir.path(), "late", {.not_before = std::chrono::hours(1)});
  e = load(late.cert, late.key, now);
  EXPECT_NE(e.find("not valid before"), std::string::npos) << e;
  config::tls_settings s;
  s.cert_file = good.cert;
  s.key_file = good.key;
  s.ciphers = "NO-SUCH-CIPHER";
  auto r = tls::server_context::load(s);
  ASSERT_TRUE(std::holds_alternative<std::string>(r));
  EXPECT_NE(std::get<std::string>(r).find("tls.ciphers"), std::string::npos);
}

}  // namespace
}  // namespace ingressd
