#pragma once
// A fake ingress request router (Ray's LLMRouter protocol, ray-serve-ingress.md §2.1):
// `POST /internal/route` → 200 `{"host":..,"port":..,"replica_id":"<name>"}`, picking replicas
// round-robin, or a scripted reply. Speaks HTTP/1.1 keep-alive (ingressd pools router
// connections) as well as Ray's HTTP/1.0 + `Connection: close` form.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ingressd/demo/server_base.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::demo {

/// What the router does with `POST /internal/route` (`GET /health` and other paths are not
/// scripted).
struct router_behaviour {
  enum class kind {
    round_robin,          ///< 200 with the next replica; 503 `{"detail":..}` when it has none
    respond,              ///< fixed reply: `status`, `headers`, `body` (any status, any body)
    hang,                 ///< read the request, never reply (until the peer closes)
    close_without_reply,  ///< read the request, close with FIN
  };
  kind what = kind::round_robin;
  unsigned status = 200;
  header_list headers;
  std::string body;
  /// round_robin: added to the reply as `"request_headers": {...}` when not empty.
  std::map<std::string, std::string> request_headers;
  /// Delay before replying (round_robin, respond, close_without_reply), e.g. to exceed
  /// router.timeout. The delay ends early if the peer closes.
  std::chrono::milliseconds delay{0};
  /// The share of replies that get `delay` (drawn at random per request from a seeded generator;
  /// 1: every reply). A router that stalls now and then: a GC pause, a cold cache.
  double delay_share = 1.0;

  static router_behaviour round_robin() { return {}; }
  static router_behaviour respond(unsigned status, std::string body, header_list headers = {{"Content-Type", "application/json"}}) {
    router_behaviour b;
    b.what = kind::respond;
    b.status = status;
    b.body = std::move(body);
    b.headers = std::move(headers);
    return b;
  }
  static router_behaviour hang() {
    router_behaviour b;
    b.what = kind::hang;
    return b;
  }
  static router_behaviour close_without_reply() {
    router_behaviour b;
    b.what = kind::close_without_reply;
    return b;
  }
  router_behaviour& after(std::chrono::milliseconds d) {
    delay = d;
    return *this;
  }
  router_behaviour& sometimes(double share) {
    delay_share = share;
    return *this;
  }
  router_behaviour& with_request_headers(std::map<std::string, std::string> h) {
    request_headers = std::move(h);
    return *this;
  }
};

/// The fake router. Records every request (all paths; see server_base). Replies:
///  - `POST /internal/route` → per the behaviour (default round_robin);
///  - `GET /health` → 200 `{"status":"ok"}`;
///  - `/internal/route` with another method → 405; other paths → 404 `{"detail":"Not Found"}`.
/// Replies have Content-Length; the connection is kept open unless the request was HTTP/1.0
/// (without keep-alive) or asked for `Connection: close`.
class router_server final : public server_base {
 public:
  struct options {
    std::string name = "SERVE_REPLICA::llm#LLMRouter#demo";
    std::string bind_ip = "127.0.0.1";
    std::uint16_t port = 0;
  };

  explicit router_server(options opts);
  ~router_server() override;

  const std::string& name() const { return opts_.name; }

  /// Replicas to hand out round-robin, by name (host/port in the reply are then "" and 0).
  void set_replicas(const std::vector<std::string>& names);
  /// Same, with the host/port LLMRouter also reports (ingressd ignores them).
  void set_replicas(std::vector<topology::target> replicas);
  void set_behaviour(router_behaviour b);
  /// One-shot behaviours for the next route requests, in order, before set_behaviour()'s.
  void queue_behaviour(router_behaviour b);
  /// Recorded `POST /internal/route` requests only.
  std::vector<recorded_request> route_requests() const;
  /// `replica_id`s handed out by round_robin so far, in order.
  std::vector<std::string> picks() const;

 protected:
  awaitable<after_reply> handle(exchange& ex) override;

 private:
  router_behaviour next_behaviour();
  /// Whether this request gets the behaviour's delay (delay_share).
  bool delayed(const router_behaviour& b);

  options opts_;
  mutable std::mutex script_mu_;
  std::vector<topology::target> replicas_;
  std::size_t cursor_ = 0;
  std::uint64_t coin_ = 0x9e3779b97f4a7c15;  // delay_share's generator (splitmix64 state), fixed seed
  std::deque<std::string> picks_;  // the most recent record_limit() picks
  router_behaviour behaviour_;
  std::deque<router_behaviour> queued_;
};

}  // namespace ingressd::demo
