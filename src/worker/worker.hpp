#pragma once
// A worker: one thread, one io_context, its own SO_REUSEPORT listener, and everything its
// connections touch (per-app cursors and load counters, upstream connection pools). Nothing in a
// worker is shared with another thread except through `shared_state` (atomics) and immutable
// snapshots posted to it.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/intrusive/list.hpp>

#include "ingressd/config/config.hpp"
#include "ingressd/net/proxy_protocol.hpp"
#include "ingressd/grpc/protocol.hpp"
#include "ingressd/core/asio.hpp"
#include "ingressd/metrics/access_log.hpp"
#include "ingressd/metrics/counter.hpp"
#include "ingressd/metrics/request_metrics.hpp"
#include "ingressd/routing/hedge.hpp"
#include "ingressd/routing/router_memory.hpp"
#include "ingressd/routing/router_pool.hpp"
#include "ingressd/tls/context.hpp"
#include "ingressd/tls/stream.hpp"
#include "ingressd/topology/snapshot.hpp"
#include "ingressd/upstream/pool.hpp"

namespace ingressd::server {

/// State shared by all workers and the control thread. Only atomics and immutable values.
struct shared_state {
  std::atomic<bool> draining{false};
  /// Something (a load balancer, a Kubernetes probe) has asked /-/healthz since start: a drain
  /// then keeps accepting for drain.min_period so that it notices; with no one asking there is
  /// no one to tell, and the drain stops accepting at once.
  std::atomic<bool> health_polled{false};
  std::atomic<std::uint64_t> connections{0};  ///< open client connections, all workers
  std::atomic<std::uint64_t> tunnels{0};      ///< open WebSocket tunnels, all workers (client.max_tunnels)
  std::atomic<std::uint64_t> topology_updates{0};  ///< ingressd_topology_updates_total
  std::atomic<std::uint64_t> topology_errors{0};   ///< ingressd_topology_errors_total
  std::atomic<std::uint64_t> config_reloads{0};    ///< ingressd_config_reloads_total
  std::atomic<std::uint64_t> config_errors{0};     ///< ingressd_config_reload_errors_total
  std::atomic<std::uint64_t> config_generations{0};  ///< ingressd_config_generations (daemon::impl::track)
  std::atomic<std::uint64_t> accept_errors{0};     ///< ingressd_accept_errors_total (main and admin listeners)
  /// The HTTPS listener's certificate in force: its notAfter in Unix seconds (0: no TLS).
  std::atomic<std::int64_t> tls_not_after{0};
  /// A gRPC listener is open (grpc.listen; set before the workers start, fixed after).
  bool grpc = false;
  /// ingressd_topology_last_success_timestamp_seconds, in Unix ms: -1 while there is no source
  /// that polls (--demo), 0 until the source's first confirmation.
  std::atomic<std::int64_t> topology_current_ms{-1};
  /// The access log, or null when off. Set before the workers start; thread-safe.
  metrics::access_log* access_log = nullptr;
  /// Passive health: marks an upstream down (key, why) on behalf of a worker. Set before the
  /// workers start; thread-safe.
  std::function<void(const std::string& key, std::string cause)> passive_down;
  /// Why an upstream is down ("" when up or unknown): for the body of a no_healthy_replica 503.
  /// Takes the daemon's lock: error paths only.
  std::function<std::string(const std::string& key)> down_cause;
};

/// accept() failed for lack of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM). The
/// connection stays queued and the listener stays readable, so accepting again at once would
/// spin (hardening H1).
bool accept_starved(const error_code& ec);

/// The pause after a starved accept: 5 ms, doubling to 1 s (Go net/http's accept back-off);
/// back to 5 ms once an accept succeeds.
class accept_backoff {
 public:
  std::chrono::milliseconds next() {
    const auto d = delay_;
    delay_ = std::min<std::chrono::milliseconds>(delay_ * 2, max_delay);
    return d;
  }
  void reset() { delay_ = min_delay; }

  static constexpr std::chrono::milliseconds min_delay{5};
  static constexpr std::chrono::milliseconds max_delay{1000};

 private:
  std::chrono::milliseconds delay_ = min_delay;
};

/// A single-writer counter: only the owning worker increments it, any thread may read it.
using counter = metrics::counter;

struct worker_stats {
  counter requests;
  counter active_connections;
  counter active_streams;
  // The HTTPS listener (tls.listen): requests whose head was read over TLS, open TLS
  // connections, handshakes done (and how many resumed a connection), and failed ones by reason.
  counter tls_requests;
  counter tls_connections;
  counter tls_handshakes;
  counter tls_resumed;
  std::array<counter, tls::handshake_failure_count> tls_failures;
  // The gRPC listener (grpc.listen): open connections (in active_connections too), open calls,
  // and connections ended by us for a protocol error or abuse, by grpc::conn_error.
  counter grpc_connections;
  counter grpc_streams;
  std::array<counter, grpc::conn_error_count> grpc_conn_errors;
  /// client.proxy_protocol: connections closed for their PROXY header, by net::proxy_error.
  std::array<counter, net::proxy_error_count> proxy_protocol_errors;
  /// X-Forwarded-For chains from trusted proxies that held something other than addresses.
  counter forwarded_chain_errors;
  /// Router replies' request_headers members left out for not being strings.
  counter router_headers_skipped;
  // WebSocket tunnels (issue #32): open now, and the bytes they carried each way.
  counter tunnels;
  counter tunnel_bytes_to_replica;
  counter tunnel_bytes_to_client;
};

/// Per-app state of a worker, rebuilt on each topology change. (Replica loads and health are
/// node-wide: topology::upstream_state.)
struct app_state {
  routing::rr_cursor router_cursor;     ///< kept while the router pool is unchanged
  std::string pool_signature;
  std::size_t lb_rotor = 0;             ///< rotates ties between equally loaded replicas
  metrics::app_metrics* metrics = nullptr;  ///< this worker's metric block of the app (by name)
  /// router.hedge auto: each router's latency (parallel to the pool), kept while the pool is
  /// unchanged. A call is hedged to router h after twice h's usual latency: what matters is how
  /// soon the router asked next would answer, not how slow the late one usually is (which, for a
  /// router that is always slow, would teach the delay to wait for it).
  std::vector<routing::hedge_delay> router_latency;
};

class connection;
class grpc_hub;
struct request_scratch;
using connection_hook = boost::intrusive::list_base_hook<boost::intrusive::link_mode<boost::intrusive::auto_unlink>>;

/// Bytes relayed per read on a stream (each direction): the worker's relay window, and the
/// per-stream buffer that holds what a slow client has not taken yet (hardening H4).
inline constexpr std::size_t relay_size = 16 * 1024;

class worker {
 public:
  worker(unsigned index, std::shared_ptr<const config::config> cfg, shared_state& shared);
  ~worker();

  /// Opens this worker's listener on `ep`, in one SO_REUSEPORT group with the other workers'.
  /// `first`: the first worker's bind, which fails when another process holds the address.
  /// `tls`: the HTTPS listener (tls.listen) instead of the plain one.
  /// Which listener a socket came from.
  enum class listener : std::uint8_t { plain, tls, grpc };
  error_code bind(const tcp::endpoint& ep, bool first, listener which = listener::plain);
  std::uint16_t port() const { return port_; }
  std::uint16_t tls_port() const { return tls_port_; }
  std::uint16_t grpc_port() const { return grpc_port_; }
  /// The HTTPS listener's certificate for handshakes from now on (start, SIGHUP); connections
  /// keep the one they were made with.
  void set_tls(std::shared_ptr<const tls::server_context> ctx) { tls_ctx_ = std::move(ctx); }
  /// Thread body: accepts and serves until stopped.
  void run();

  // --- Called on the worker's own thread (post to it from elsewhere) ---
  void apply(std::shared_ptr<const topology::snapshot> snap);
  void stop_accepting();
  void close_idle();   ///< drain: close idle keep-alive connections, ask busy ones to close after
  void abort_all();    ///< hard stop: close every connection
  asio::io_context& ioc() { return ioc_; }

  // --- Used by connections (same thread) ---
  const config::config& cfg() const { return *cfg_; }
  /// The config new requests start with; a request keeps the one it started with (SIGHUP).
  const std::shared_ptr<const config::config>& cfg_ptr() const { return cfg_; }
  /// SIGHUP: new requests use `next` (listen address and thread count are unchanged).
  void apply_config(std::shared_ptr<const config::config> next);
  const topology::snapshot* snap() const { return snap_.get(); }
  const std::shared_ptr<const topology::snapshot>& snapshot_ptr() const { return snap_; }
  app_state& app(std::size_t i) { return apps_[i]; }
  upstream::pool& pool() { return pool_; }
  routing::router_memory& routers() { return routers_; }
  /// router.hedge_budget: the hedges this worker may still send.
  routing::hedge_budget& hedge_budget() { return hedge_budget_; }
  /// How long a call of `app` waits before it is hedged to the router at `pool_index` under the
  /// current config, or nullopt when its calls are not hedged.
  std::optional<std::chrono::steady_clock::duration> hedge_after(const app_state& app, std::size_t pool_index) const;
  /// Shows `app`'s current hedge delays on /metrics and /topology (its router slots).
  void publish_hedge(const app_state& app, std::size_t pool_index) const;
  void publish_hedge(const app_state& app) const;
  shared_state& shared() { return shared_; }
  /// Passive health (health.error_limit = `limit`, 0 = off): one more consecutive connection error
  /// to `ep` (refused, timed out, lost before a response head); the limit reached marks it down on
  /// every worker. Used by the HTTP connections and the gRPC calls alike.
  void note_upstream_error(const topology::endpoint& ep, std::string_view what, unsigned limit);
  /// The hard stop has begun (abort_all).
  bool stopping() const { return stopping_; }
  /// The metric block of the gRPC app at `index` of the current snapshot's grpc_apps, or of the
  /// app named `name` (a call that began under an older snapshot); null when there is none.
  metrics::app_metrics* grpc_block(std::size_t index) const {
    return index < grpc_blocks_.size() ? grpc_blocks_[index] : nullptr;
  }
  metrics::app_metrics* grpc_block_named(std::string_view name) const;
  worker_stats& stats() { return stats_; }
  const worker_stats& stats() const { return stats_; }
  /// Per-app request metrics: written on this worker's thread, read by the admin thread.
  metrics::worker_metrics& metrics() { return metrics_; }
  const metrics::worker_metrics& metrics() const { return metrics_; }
  /// A fresh request id (UUID-4 text) from this worker's generator; by value, no allocation.
  std::array<char, 36> next_request_id();
  /// Request scratch (heads, body prefix, relay buffer, per-request timers, access-log record)
  /// that connections gave back when they went idle, for the next request on this worker: an idle
  /// connection holds none, and a busy worker does not allocate it per request (the 16 KiB relay
  /// buffer would take glibc's slow path every time). The spares follow the load: as many as
  /// requests in flight needed at their peak, trimmed once a second by trim_spare_scratch().
  std::unique_ptr<request_scratch> take_scratch();
  void give_scratch(std::unique_ptr<request_scratch> s);
  /// Frees half of the spares that no request needed since the last trim, so that a burst's
  /// scratch is gone some seconds after it. (A fixed cap instead made every request beyond it
  /// allocate and free ~17 KiB whenever more requests were in flight than the cap.)
  void trim_spare_scratch();
  /// The worker's relay window: relay_size bytes that a response's body pieces pass through on
  /// their way to the client. It is valid only until the using coroutine suspends: a piece the
  /// client does not take at once is copied to the request's own buffer first (exchange.cpp,
  /// relay loop). One window per worker instead of a buffer per stream: ~4 KiB less resident
  /// per open SSE stream, and the same cache lines for every response.
  unsigned char* relay_window() { return relay_window_.get(); }
  bool healthy() const;  ///< topology loaded and (no apps, or some app has a healthy replica or fallback)

  void add_connection(connection& s);
  /// A TLS connection whose ALPN chose h2 (gRPC over the HTTPS listener): served as gRPC.
  void hand_to_grpc(asio::basic_stream_socket<tcp, executor> sock, std::unique_ptr<tls::stream> tls,
                    std::string remote);
  std::size_t connection_count() const { return connections_.size(); }

 private:
  void event_loop();  // run(), with busy_poll_us spinning
  awaitable<void> accept_loop(tcp::acceptor& acceptor, listener which);
  /// At most this many connections are accepted per wake-up of a listener (then others run).
  static constexpr unsigned accept_batch = 32;
  /// A new client connection: a connection, or a reset when client.max_connections are open.
  void admit(asio::basic_stream_socket<tcp, asio::io_context::executor_type> sock, listener which);
  /// client.proxy_protocol: reads the connection's PROXY header, then hands it on as admit()
  /// does, with the header's source as the client.
  awaitable<void> admit_proxied(asio::basic_stream_socket<tcp, asio::io_context::executor_type> sock,
                                listener which);
  void hand_on(asio::basic_stream_socket<tcp, asio::io_context::executor_type> sock, listener which,
               std::optional<tcp::endpoint> client);
  awaitable<void> sweep_loop();
  awaitable<void> idle_loop();

  unsigned index_;
  std::shared_ptr<const config::config> cfg_;
  shared_state& shared_;
  std::optional<tcp::acceptor> acceptor_;
  std::uint16_t port_ = 0;
  std::optional<tcp::acceptor> tls_acceptor_;
  std::uint16_t tls_port_ = 0;
  std::shared_ptr<const tls::server_context> tls_ctx_;
  std::optional<tcp::acceptor> grpc_acceptor_;
  std::uint16_t grpc_port_ = 0;
  std::vector<metrics::app_metrics*> grpc_blocks_;  // parallel to snap_->grpc_apps
  std::shared_ptr<const topology::snapshot> snap_;
  std::vector<app_state> apps_;
  std::unique_ptr<unsigned char[]> relay_window_ = std::make_unique<unsigned char[]>(relay_size);
  upstream::pool pool_;
  routing::router_memory routers_;
  routing::hedge_budget hedge_budget_;
  worker_stats stats_;
  metrics::worker_metrics metrics_;
  std::uint64_t id_state_;  // request id generator state
  bool stopping_ = false;
  std::uint64_t peak_connections_ = 0;  // for returning memory after a burst (sweep_loop)
  asio::steady_timer* sweep_timer_ = nullptr;  // lives in sweep_loop's frame; cancelled on stop
  asio::steady_timer* idle_timer_ = nullptr;   // lives in idle_loop's frame; cancelled on stop
  // Accept back-offs, in the accept loops' frames (plain, TLS); cancelled on stop.
  std::array<asio::steady_timer*, 3> accept_timers_{};
  boost::intrusive::list<connection, boost::intrusive::base_hook<connection_hook>,
                         boost::intrusive::constant_time_size<false>> connections_;
  // Declared last so it is destroyed first: connection coroutines still pending at destruction are
  // destroyed while the stats, loads and connection list they touch are alive.
  // One thread runs it and only that thread touches its sockets: the reactor needs no locks.
  // Posts from other threads (topology, admin) still go through the scheduler's lock.
  asio::io_context ioc_{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  // After ioc_, so destroyed before it: its connections hold sockets of this io_context.
  std::unique_ptr<grpc_hub> grpc_;
  // After ioc_, so destroyed before it: the spares hold timers of this io_context.
  std::vector<std::unique_ptr<request_scratch>> spare_scratch_;
  std::size_t spare_low_ = 0;  ///< fewest spares since the last trim: that many went unused
};

}  // namespace ingressd::server
