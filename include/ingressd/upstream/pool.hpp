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

class pool {
 public:
  explicit pool(unsigned max_idle_per_endpoint) : max_idle_(max_idle_per_endpoint) {}

  /// How take() deals with connections the peer may have closed while they sat in the pool.
  enum class staleness {
    peek,            ///< a non-blocking peek finds closed ones (or ones with unexpected bytes) and closes them
    caller_retries,  ///< no peek: the caller re-sends on a fresh connection when a reused one fails
                     ///< before any reply byte (one system call less per request; the sweep still
                     ///< closes dead idle connections every second)
  };
  /// The most recently pooled connection to `key`, or nullptr.
  connection_ptr take(const std::string& key, staleness check = staleness::peek);
  /// Returns a connection for reuse; closed instead when the endpoint already has `scale` times
  /// the maximum idle connections (routers: see router_pool_scale).
  void put(connection_ptr c, unsigned scale = 1);
  /// Closes idle connections of endpoints for which keep(key) is false (topology change).
  void retain(const std::function<bool(const std::string&)>& keep);
  /// Closes idle connections idle for longer than `max_idle` or found dead by a peek.
  void sweep(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration max_idle);
  void close_all();
  std::size_t idle_count() const;
  void set_max_idle(unsigned n) { max_idle_ = n; }

 private:
  static bool alive(connection& c);
  unsigned max_idle_;
  std::unordered_map<std::string, std::vector<connection_ptr>> idle_;
};

}  // namespace ingressd::upstream
