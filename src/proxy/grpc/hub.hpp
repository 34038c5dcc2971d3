#pragma once
// The gRPC ingress of one worker, inside: the I/O side of a call (its two streams, their byte
// queues, its timers and accounting) and the hub that owns the links and carries out what
// grpc::call_state decides. Included by links.cpp and grpc_proxy.cpp only.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ingressd/grpc/call.hpp"
#include "proxy/grpc/links.hpp"
#include "worker/worker.hpp"

namespace ingressd::server {
namespace grpc_links {

struct header {
  std::string name, value;
};

/// One proxied call: a client stream and, once dispatched, an upstream stream. Held by the maps
/// of the links it is on; `client`/`up` are set exactly while it is in their maps.
struct call {
  client_link* client = nullptr;
  std::int32_t csid = 0;
  upstream_link* up = nullptr;
  std::int32_t usid = 0;
  grpc::call_state state;

  // The request head, as the client sent it.
  std::string method, authority, path;
  std::vector<header> headers;  // the request's regular headers (metadata), in order
  std::size_t header_bytes = 0;  // RFC 9113 §6.5.2's size of the list so far
  std::optional<std::string> application;
  bool grpc_content = false;  // content-type application/grpc[+...]
  std::string request_id;
  std::optional<std::chrono::nanoseconds> timeout;  // grpc-timeout

  grpc::byte_queue req, resp;
  /// The replica's response head and trailers as they arrive, with their sizes (RFC 9113's
  /// count: kept as they grow, so that a long list costs linear time to check).
  std::vector<header> resp_headers, resp_trailers;
  std::size_t resp_headers_size = 0, resp_trailers_size = 0;

  std::shared_ptr<const topology::snapshot> snap;
  std::optional<std::size_t> app;
  const topology::endpoint* target = nullptr;
  topology::in_flight_mark mark;
  std::vector<std::string> tried;  // keys that refused this call
  unsigned retries = 0;
  std::optional<asio::steady_timer> deadline;
  /// The client sent the call's HEADERS no earlier than this (link::drained_at_).
  clock::time_point sent_after;
  /// The call's bytes last moved, either way (upstream.idle_timeout).
  clock::time_point last_activity;

  clock::time_point start = clock::now();
  std::chrono::system_clock::time_point wall = std::chrono::system_clock::now();
  std::uint64_t bytes_out = 0;
};

}  // namespace grpc_links

struct grpc_hub::impl {
  explicit impl(worker& w) : w(w) {}
  worker& w;
  grpc_links::options_holder opts;
  std::unordered_set<std::shared_ptr<grpc_links::client_link>> clients;
  std::unordered_map<std::string, std::vector<std::shared_ptr<grpc_links::upstream_link>>> upstreams;
  std::vector<std::shared_ptr<grpc_links::link>> dirty;
  std::size_t rotor = 0;  // where ties among equally loaded replicas start

  void flush_dirty();
  // The call flow (grpc_proxy.cpp).
  void start(const grpc_links::call_ptr& c);
  void dispatch(const grpc_links::call_ptr& c);
  void submit(const grpc_links::call_ptr& c, grpc_links::upstream_link& l);
  void fail(const grpc_links::call_ptr& c, grpc::status st, reason why, std::string_view text);
  /// The replica's response head arrived (`informational`: a 1xx).
  void respond(const grpc_links::call_ptr& c, bool end_stream, bool informational);
  void finish(const grpc_links::call_ptr& c, std::uint32_t error_code);
  void upstream_gone(const grpc_links::call_ptr& c, std::uint32_t error_code, bool connection_lost,
                     std::string_view why = {});
  std::shared_ptr<grpc_links::upstream_link> acquire(const topology::endpoint& ep);
  void drop(grpc_links::upstream_link* l);
};

}  // namespace ingressd::server
