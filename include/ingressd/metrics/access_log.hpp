#pragma once
// The access log (contract §6): one JSON object per line per request, written off the request
// path. A session fills an `access_entry` (views into its own state) when a request ends; write()
// formats the line on the calling worker thread and hands it to an spdlog async logger whose one
// background thread writes the file. The queue never blocks a worker: when it is full the oldest
// lines are dropped and counted (ingressd_access_log_dropped_total). Lines are flushed to the
// file whenever the queue runs empty, so under load writes are batched and at rest nothing waits.
//
// Fields (always present, in this order; null when not applicable):
//   time            request start (head started arriving), UTC, RFC 3339 with milliseconds
//   client          the connection's client IP address (a PROXY header's source, with
//                   client.proxy_protocol)
//   client_ip       who the client is: `client`, or behind a trusted proxy the rightmost
//                   X-Forwarded-For address that is not trusted (client.trusted_proxies)
//   listener        "http" (listen), "https" (tls.listen) or "grpc" (grpc.listen)
//   method, path    request method and path (without the query string)
//   app             matched app name ("" when none)
//   status          status sent to the client; 499 when the client left before any response,
//                   0 when the daemon stopped before any response (a client that left mid-
//                   response keeps the status sent; termination says client_abort)
//   bytes           response body bytes sent to the client
//   duration        seconds, request start to end of the response (or of the exchange)
//   router          the router last consulted (its target name, or address), null without router
//   router_addr     its "ip:port"
//   router_latency  seconds, the whole routing decision including failovers
//   router_outcome  "ok" or the router failure reason
//   router_hedged   true when the routing call was hedged (router.hedge: a second router was
//                   asked; `router` is then the one whose reply was used), null without router
//   replica         the replica the request was sent to (target name), replica_addr its "ip:port"
//   retries         connect failures retried on other replicas
//   termination     ok | client_abort | upstream_abort | timeout | error | shutdown
//   reason          X-Serve-Reason of a response ingressd generated, else null
//   request_id      the X-Request-Id sent to the router and the replica (client's or generated);
//                   for requests answered before routing, the client's X-Request-Id or null;
//                   for gRPC calls the client's x-request-id metadata or null
//   grpc_status     gRPC calls (listener "grpc"): the grpc-status the client got (1 CANCELLED
//                   when it reset the call first); null for HTTP requests. A gRPC call's `path`
//                   is /package.Service/Method, `status` 200 (499 when the client cancelled
//                   before any response, 505 for an HTTP request refused with HTTP_1_1_REQUIRED).
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace ingressd::metrics {

/// How a request's exchange with the client ended.
enum class termination : std::uint8_t {
  ok,              ///< a complete response was sent (whatever its status)
  client_abort,    ///< the client went away before the response was complete
  upstream_abort,  ///< the upstream failed after the response head was sent (stream cut, RST)
  timeout,         ///< a deadline ended it: 408, 504, a stalled stream or client
  error,           ///< the upstream failed before a response head (502)
  shutdown,        ///< the daemon stopped (hard stop or drain timeout) during the request
};
std::string_view to_string(termination t) noexcept;

struct access_entry {
  std::chrono::system_clock::time_point time;
  std::string_view client;
  std::string_view client_ip;  ///< "" = the same as client
  std::string_view listener = "http";
  std::string_view method;
  std::string_view path;
  std::string_view app;
  unsigned status = 0;
  std::uint64_t bytes = 0;
  std::chrono::nanoseconds duration{0};
  std::string_view router;  ///< "" = no router consulted (router fields are null)
  std::string_view router_addr;
  std::chrono::nanoseconds router_latency{0};
  std::string_view router_outcome;
  bool router_hedged = false;
  std::string_view replica;  ///< "" = no replica (replica fields are null)
  std::string_view replica_addr;
  unsigned retries = 0;
  termination term = termination::ok;
  std::string_view reason;  ///< "" = null
  std::string_view request_id;  ///< "" = null
  int grpc_status = -1;  ///< -1 = null (not a gRPC call)
  /// A WebSocket tunnel (status 101): the line is written when it ends, with the bytes the client
  /// sent through it (`bytes` are those the replica sent) and which side ended it first
  /// ("client", "replica", "timeout", "shutdown"). Written as "tunnel": {...}, else null.
  bool tunnel = false;
  std::uint64_t tunnel_bytes_to_replica = 0;
  std::string_view closed_by;
  /// LLM figures (issue #34): for an event-stream response, the time to its first event, the
  /// events and the longest gap between reads that carried events (ttft_ms, events, max_gap_ms);
  /// with a usage object, prompt_tokens and completion_tokens. Null when not measured.
  std::optional<std::chrono::nanoseconds> ttft;
  std::uint64_t events = 0;
  std::chrono::nanoseconds max_gap{0};
  std::optional<std::uint64_t> prompt_tokens, completion_tokens;
};

/// Appends `e` as one JSON object (no newline). Strings are escaped; invalid UTF-8 becomes U+FFFD.
void format_access_entry(std::string& out, const access_entry& e);

class access_log {
 public:
  /// `target`: a file path (opened for append, created if missing) or "-" for stdout.
  /// Throws std::system_error when the file cannot be opened.
  explicit access_log(const std::string& target, std::size_t queue_lines = 8192);
  /// Writes every queued line, then closes the file.
  ~access_log();
  access_log(const access_log&) = delete;
  access_log& operator=(const access_log&) = delete;

  /// Any thread: formats and queues one line.
  void write(const access_entry& e);
  /// Any thread (SIGUSR1, logrotate): reopens the file at its path. Returns false, keeping the
  /// current file, when the path cannot be opened. No-op for stdout.
  bool reopen();
  /// Asks the writer thread to flush (asynchronous).
  void flush();
  /// Lines dropped because the queue was full.
  std::uint64_t dropped() const;
  const std::string& target() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace ingressd::metrics
