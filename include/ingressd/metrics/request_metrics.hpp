#pragma once
// Per-worker request metrics (contract §6). Every worker owns one `worker_metrics`: a block of
// counters and histograms per application, written only by that worker's thread, and read by the
// admin thread on scrape (summed over workers). Nothing on the request path takes a lock, builds
// a string or looks up a hash map: a session reaches its app's block through the worker's app
// table (`app_state::metrics`, parallel to the snapshot's apps), counts status codes through a
// fixed per-block slot table, and a router by its index in the app's router pool.
//
// Blocks are per app *name*: a topology change keeps the block (and its counts) of every app
// whose name stays, so counters never go back. Blocks of apps that leave the topology are kept
// too (their series stay on /metrics with their last values); the label set stays bounded by the
// app names the topology ever had. Router slots follow the app's current router pool (counts of
// a router that stays in the pool are carried over).
#include "ingressd/grpc/protocol.hpp"
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ingressd/core/reason.hpp"
#include "ingressd/metrics/counter.hpp"
#include "ingressd/metrics/histogram.hpp"
#include "ingressd/topology/snapshot.hpp"

namespace ingressd::metrics {

/// Outcomes of a routing decision (label `outcome` of ingressd_router_latency_seconds, label
/// `reason` of ingressd_router_failures_total): `ok`, then the four router failure reasons.
inline constexpr std::size_t router_outcome_count = 5;
/// 0 for success, 1..4 for router_unreachable, router_non_200, unparseable_replica_id,
/// unknown_replica_id; any other reason maps to 0 (not a router failure).
std::size_t router_outcome_index(std::optional<reason> failure) noexcept;
std::string_view router_outcome_name(std::size_t index) noexcept;

/// Result of one router attempt (label `result` of ingressd_router_attempts_total). cancelled: a
/// hedged call whose other call won first (router.hedge); not a failure of the router.
enum class attempt_result : std::uint8_t { ok, no_reply, non_200, cancelled };
inline constexpr std::size_t attempt_result_count = 4;
std::string_view to_string(attempt_result r) noexcept;

/// What became of a hedge (label `result` of ingressd_router_hedges_total): sent (a second
/// router was asked), won (its reply was the one used), refused (late, but router.hedge_budget
/// was spent).
enum class hedge_result : std::uint8_t { sent, won, refused };
inline constexpr std::size_t hedge_result_count = 3;
std::string_view to_string(hedge_result r) noexcept;

/// Counts per HTTP status code without a map: a fixed table of slots, filled in first-seen order.
/// Single writer; readers see a slot once its code is published (release/acquire on `used_`).
class status_counters {
 public:
  static constexpr std::size_t capacity = 32;
  static constexpr unsigned max_code = 999;

  /// Owning thread only. Codes above 999, and new codes once all slots are taken, go to other().
  void add(unsigned code) noexcept;
  /// Any thread: calls f(code, count) for each code seen, in first-seen order.
  template <class F>
  void for_each(F&& f) const {
    const std::size_t n = used_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i) f(static_cast<unsigned>(codes_[i]), counts_[i].get());
  }
  /// Requests whose code found no slot (exposed as code="other").
  std::uint64_t other() const noexcept { return other_.get(); }

 private:
  std::array<std::uint8_t, max_code + 1> slot_of_{};  // writer only: slot + 1, 0 = none yet
  std::array<std::uint16_t, capacity> codes_{};       // published through used_
  std::array<counter, capacity> counts_;
  std::atomic<std::size_t> used_{0};
  counter other_;
};

/// metrics.ray_compatible: Ray Serve's own proxy series of one app (ray_serve_num_http_requests_total,
/// ray_serve_num_http_error_requests_total, ray_serve_http_request_latency_ms, and the gRPC ones),
/// so that Ray's Serve dashboard shows ingressd's traffic. One latency histogram (milliseconds)
/// per (method, status, route), whose count is the request counter: fixed slots filled in
/// first-seen order, like status_counters; a histogram is allocated when its slot is first used.
/// Combinations past `capacity` are not counted in these series (ingressd_* still counts them).
class ray_series {
 public:
  static constexpr std::size_t capacity = 32;
  /// Which `route` label: the app's route prefix (its gRPC name for a gRPC app; "" for requests
  /// that matched no app), or one of the built-in endpoints (Ray counts its probes too).
  enum class route : std::uint8_t { app, healthz, routes };
  /// `method`: the HTTP method, or the gRPC method path; `status`: the HTTP status, or the
  /// grpc-status for gRPC. Owning thread only.
  void observe(std::string_view method, unsigned status, route r, std::chrono::nanoseconds took) noexcept;
  /// Any thread: f(method, status, route, const histogram&) per combination seen.
  template <class F>
  void for_each(F&& f) const {
    const std::size_t n = used_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i)
      f(std::string_view(methods_[i]), static_cast<unsigned>(keys_[i] & 0xffff), static_cast<route>(keys_[i] >> 16),
        *hists_[i]);
  }

 private:
  // Slot i is written once, before used_ is raised past it, and never again.
  std::array<std::uint32_t, capacity> keys_{};  // route << 16 | status
  std::array<std::string, capacity> methods_;
  std::array<std::unique_ptr<histogram>, capacity> hists_;
  std::atomic<std::size_t> used_{0};
};

/// Attempt counters of one router of an app's pool.
struct router_slot {
  router_slot(std::string k, std::string l, bool c) : key(std::move(k)), label(std::move(l)), colocated(c) {}
  const std::string key;    ///< "ip:port"
  const std::string label;  ///< label `router`: the target's name, or its key when it has none
  /// Label `colocated`: on this node. Fixed for the slot: the key's ip decides it, and the node
  /// IP does not change while the process runs.
  const bool colocated;
  std::array<counter, attempt_result_count> results;
  /// ingressd_router_attempt_latency_seconds: one call to this router, reply or failure, so that
  /// co-located and remote routers can be compared (the decision histogram mixes them).
  histogram latency{router_buckets()};
  /// ingressd_router_hedge_delay_seconds: how long this worker lets a call to another router of
  /// the pool wait before it hedges the call to this one, in microseconds; -1 when it does not
  /// hedge (router.hedge off, a pool of one router). Written by the owning worker, read by
  /// /metrics and /topology.
  std::atomic<std::int64_t> hedge_delay_us{-1};
};

/// Everything counted for one app on one worker.
struct app_metrics {
  explicit app_metrics(std::string app_name);
  app_metrics(const app_metrics&) = delete;
  app_metrics& operator=(const app_metrics&) = delete;

  const std::string name;  ///< label `app` ("" for requests that matched no app)
  status_counters codes;   ///< ingressd_requests_total{code}
  histogram duration;      ///< ingressd_request_duration_seconds
  histogram first_byte;    ///< ingressd_upstream_first_byte_seconds
  std::array<histogram, router_outcome_count> router_latency;  ///< by router_outcome_index
  std::array<counter, router_outcome_count> router_failures;   ///< index 0 unused
  counter truncations;     ///< ingressd_router_truncations_total
  std::array<counter, hedge_result_count> hedges;  ///< ingressd_router_hedges_total, by hedge_result
  /// ingressd_generated_responses_total: responses ingressd generated itself, by reason (the
  /// X-Serve-Reason it sent), indexed by the enum's value.
  std::array<counter, reason_count> generated;
  /// ingressd_grpc_requests_total: gRPC calls of this app by the grpc-status the client got
  /// (1 CANCELLED when it reset the call first).
  std::array<counter, grpc::status_count> grpc_status;
  histogram grpc_duration;  ///< ingressd_grpc_request_duration_seconds
  histogram tunnel_duration;  ///< ingressd_tunnel_duration_seconds: WebSocket tunnels, from 101 to the end
  // LLM figures of event-stream responses (issue #34, http::llm_meter).
  histogram llm_ttft;         ///< ingressd_llm_ttft_seconds: first request byte -> first SSE event out
  histogram llm_inter_event;  ///< ingressd_llm_inter_event_seconds: between reads that carried events
  counter llm_events;         ///< ingressd_llm_events_total
  counter llm_prompt_tokens;      ///< ingressd_llm_tokens_total{kind="prompt"}
  counter llm_completion_tokens;  ///< ingressd_llm_tokens_total{kind="completion"}
  /// Ray's proxy series (metrics.ray_compatible), HTTP requests and gRPC calls.
  ray_series ray_http;
  ray_series ray_grpc;
  /// The app's route prefix (label `route` of the Ray series), as of the last topology applied;
  /// written by apply() and read by visit(), both under the worker_metrics lock.
  std::string route_prefix;

  /// The slot of the router at `pool_index` in the app's current pool (checked against `key`;
  /// a pool that changed since the caller's snapshot is searched by key). nullptr when the
  /// router is no longer in the pool. Owning thread only.
  router_slot* router(std::size_t pool_index, std::string_view key) noexcept;
  /// Slots of the current router pool, in pool order. Read under worker_metrics::visit.
  const std::vector<std::unique_ptr<router_slot>>& routers() const { return routers_; }

 private:
  friend class worker_metrics;
  std::vector<std::unique_ptr<router_slot>> routers_;
};

/// The metric blocks of one worker.
class worker_metrics {
 public:
  worker_metrics();
  worker_metrics(const worker_metrics&) = delete;
  worker_metrics& operator=(const worker_metrics&) = delete;

  /// Owning thread: makes sure every app of `snap` has a block and that each block's router
  /// slots follow its app's router pool. Returns the blocks parallel to snap.apps (apps that
  /// share a name share a block).
  /// `grpc`, when given, gets the blocks parallel to snap.grpc_apps (same name, same block).
  std::vector<app_metrics*> apply(const topology::snapshot& snap, std::vector<app_metrics*>* grpc = nullptr);
  /// The block of requests that matched no app (label app="").
  app_metrics& no_app() noexcept { return *blocks_.front(); }

  /// Any thread: calls f(const app_metrics&) for every block, under a lock that apply() also takes.
  template <class F>
  void visit(F&& f) const {
    std::lock_guard lk(mu_);
    for (const auto& b : blocks_) f(static_cast<const app_metrics&>(*b));
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<app_metrics>> blocks_;  // [0] is the "" block; never shrinks
};

}  // namespace ingressd::metrics
