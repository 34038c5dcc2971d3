#pragma once
// Per-worker pools of idle keep-alive connections to replicas and routers, keyed by endpoint.
// Thread safety: none — a pool belongs to one worker and is touched only on that worker's thread.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/beast/core/flat_buffer.hpp>

#include "ingressd/core/asio.hpp"

namespace ingressd::upstream {

/// One upstream HTTP/1.1 connection and the read buffer that belongs to it (bytes read past a
/// response stay with the connection, and a connection with leftovers is never pooled).
struct connection {
  /// Bound to the worker's io_context itself rather than a type-erased any_io_executor, like
  /// the client socket: every operation on it copies its executor, and the erased one made each
  /// asynchronous read ~150 bytes larger and a few hundred instructions dearer.
  using socket_type = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;
  explicit connection(const asio::io_context::executor_type& ex) : sock(ex) {}
  socket_type sock;
  boost::beast::flat_buffer buf;
  std::string key;      ///< endpoint key ("ip:port")
  bool reused = false;  ///< true when taken from the pool (a first-write failure may be staleness)
  std::chrono::steady_clock::time_point idle_since{};
};
using connection_ptr = std::unique_ptr<connection>;

/// Router connections may stay idle in larger numbers than replica connections: every request
/// calls a router, so each co-located router carries the whole node's concurrency (a node's 256
/// streams over 2 routers keep 128 router connections each busy), while replica connections are
/// spread over all replicas. With the replica cap of 64 (upstream.max_idle_per_replica), bursts
/// closed and reopened router connections at 256 concurrent requests (8.6% of requests paid a
/// connect). Idle ones are still closed after 60 s.
inline constexpr unsigned router_pool_scale = 4;

class pool;

/// One upstream connection in use for one exchange (contract §4.4; a router call or a proxied
/// request). Returned to its pool with release() when the exchange ended clean; closed with a
/// reset otherwise — also when the lease is dropped without either — so that a truncated
/// exchange never looks like a clean end to the peer, and a connection in an unknown state is
/// never reused.
class lease {
 public:
  lease() = default;
  lease(lease&& o) noexcept { *this = std::move(o); }
  lease& operator=(lease&& o) noexcept;
  lease(const lease&) = delete;
  lease& operator=(const lease&) = delete;
  ~lease() { reset(); }

  /// Holds a connection (a pooled one, or one connect() opened).
  explicit operator bool() const noexcept { return c_ != nullptr; }
  connection* operator->() const noexcept { return c_.get(); }
  connection& conn() const noexcept { return *c_; }
  /// Taken from the pool rather than opened for this exchange: a failure before any reply byte
  /// may be the peer having closed it while it sat idle.
  bool reused() const noexcept { return c_ && c_->reused; }

  /// The exchange ended clean: back to the pool when `keep_alive` and nothing is left unread on
  /// it, else closed (FIN).
  void release(bool keep_alive);
  /// Closed with FIN (an exchange that ended, but the connection is not to be reused).
  void close() noexcept;
  /// Closed with RST.
  void reset() noexcept;
  /// Opens the lease's connection: a new connection to its key, dialled at `dial`, with
  /// TCP_NODELAY — the one connect path of routers and replicas. The lease holds the connection
  /// before anything is awaited, so that whoever can reach the lease can cancel the connect (a
  /// deadline, an abort). An error leaves the lease without a connection.
  awaitable<error_code> connect(const tcp::endpoint& dial, const asio::io_context::executor_type& ex);
  /// Cancels what is pending on it (a deadline, a client that left, a hard stop): the operation
  /// ends with operation_aborted and the connection stays held, to be reset by whoever holds the
  /// lease (a connection is never destroyed under an operation in progress).
  void cancel() noexcept;

 private:
  friend class pool;
  pool* pool_ = nullptr;
  connection_ptr c_;
  const std::string* key_ = nullptr;  // acquire()'s key (the caller's, e.g. the snapshot's endpoint)
  unsigned scale_ = 1;
};

/// How pool::acquire gets a connection.
struct acquire_policy {
  enum class staleness {
    peek,            ///< a non-blocking peek finds closed ones (or ones with unexpected bytes) and closes them
    caller_retries,  ///< no peek: the caller re-sends on a fresh connection when a reused one fails
                     ///< before any reply byte (one system call less per request; the sweep still
                     ///< closes dead idle connections every second)
  };
  staleness check = staleness::peek;
  bool fresh = false;    ///< a new connection even when one is pooled (the re-send after a stale one)
  unsigned scale = 1;    ///< when it goes back: the pool's cap times this (routers: router_pool_scale)
};

class pool {
 public:
  explicit pool(unsigned max_idle_per_endpoint) : max_idle_(max_idle_per_endpoint) {}

  /// A lease on a connection to `key` for one exchange: a pooled one (vetted as `p` says) when
  /// there is one; else (and with `p.fresh`) a lease without a connection yet, to connect().
  /// Either way it returns to this pool when it ends clean (`p.scale`). `key` must outlive the
  /// lease's connect() (no copy per request).
  lease acquire(const std::string& key, acquire_policy p);

  using staleness = acquire_policy::staleness;
  /// The most recently pooled connection to `key`, or nullptr.
  connection_ptr take(const std::string& key, staleness check = staleness::peek);
  /// Returns a connection for reuse; closed instead when the endpoint already has `scale` times
  /// the maximum idle connections (routers: see router_pool_scale).
  void put(connection_ptr c, unsigned scale = 1);
  /// Closes idle connections of endpoints for which keep(key) is false (topology change).
  void retain(const std::function<bool(const std::string&)>& keep);
  /// The endpoints of the topology in force: idle connections to any other are closed now, and a
  /// connection to another that comes back from a request (one that was in use when its replica
  /// left the topology) is closed instead of pooled. Until the first call, any endpoint pools.
  void set_endpoints(const std::function<bool(const std::string&)>& keep, const std::vector<std::string_view>& keys);
  /// Closes idle connections idle for longer than `max_idle` or found dead by a peek.
  void sweep(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration max_idle);
  void close_all();
  std::size_t idle_count() const;
  void set_max_idle(unsigned n) { max_idle_ = n; }

 private:
  static bool alive(connection& c);
  unsigned max_idle_;
  /// By endpoint key; after set_endpoints(), exactly the topology's endpoints (empty vectors
  /// included), so that put() needs no other lookup to refuse a removed one.
  std::unordered_map<std::string, std::vector<connection_ptr>> idle_;
  bool closed_set_ = false;  ///< set_endpoints() was called: idle_'s keys are the allowed ones
};

}  // namespace ingressd::upstream
