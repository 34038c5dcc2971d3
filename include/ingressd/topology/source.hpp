#pragma once
// Topology sources (contract §3.2): a watched file, the Ray dashboard, or any URL serving the
// topology document. Each source runs on a caller-provided io_context (the daemon's control
// thread) as a C++20 coroutine and reports through callbacks; it never throws and never
// restarts anything itself.
//
//  - File: polls the file's identity (device, inode, size, mtime and ctime in ns) every 250 ms, so
//    in-place writes and rename-into-place are both applied within 1 s; on a change it re-reads
//    and parses the file. A document that fails to parse is reported once it has stayed the same
//    for one more poll (so a half-written file seen mid-write is not counted as an error); a
//    valid one is applied at once.
//  - HTTP (`--topology-url`) / dashboard (`--ray-dashboard`, which polls
//    `<base>/api/serve/applications/`): `GET` every `poll_interval`, each request bounded by
//    `timeout` (name resolution + connect + request + full response). http:// only, HTTP/1.1 with
//    `Connection: close`, response body limit 64 MiB, only status 200 is accepted. After a failure
//    (network, timeout, status, parse) the next poll waits poll_backoff(): poll_interval, then
//    doubling, capped at max(30 s, poll_interval); one success resets it. The first poll runs as
//    soon as start() is called.
//
// Callbacks run on the io_context's thread. `on_document` gets only valid documents that differ
// (document::operator==) from the last one delivered (or, for a file source, from the baseline,
// see make_file_source); `on_error` gets every failed fetch/parse, with a message naming the
// source; `on_current` every poll that found a valid document. The last good document stays with
// the caller; the source only reports.
//
// Threading and lifetime: the io_context must be run by one thread. start(), stop() and the
// destructor may be called from any thread. After stop() returns on the io_context's thread no
// callback runs; called from another thread, a callback already running may still finish. A
// source owns no I/O object (timers and sockets live in its coroutine frame, owned by the
// io_context), so it may be destroyed right after the io_context stops; call stop() (or destroy
// it) before the io_context is destroyed. stop() is idempotent; start() after stop() does nothing.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ingressd/core/asio.hpp"
#include "ingressd/core/units.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::topology {

struct source_callbacks {
  /// A valid document that differs from the last one delivered.
  std::function<void(document)> on_document;
  /// A fetch/parse failure (the caller logs it and counts ingressd_topology_errors_total); the
  /// last good document stays in force.
  std::function<void(std::string)> on_error;
  /// The source found a valid document, changed or not: the topology in force is current as of
  /// now (ingressd_topology_last_success_timestamp_seconds, for staleness alerts). HTTP sources:
  /// every successful poll; file source: every check while the file holds a valid document.
  /// Runs after on_document when both apply. Optional.
  std::function<void()> on_current;
};

class source {
 public:
  virtual ~source();
  /// Starts polling (idempotent). HTTP sources poll at once; a file source checks the file at once.
  virtual void start() = 0;
  /// Stops polling promptly: the pending wait and any request in flight are cancelled.
  virtual void stop() = 0;
  /// For log lines: "topology file /etc/x.json", "topology URL http://...",
  /// "Ray dashboard http://.../api/serve/applications/".
  virtual std::string describe() const = 0;
};

/// How often a file source looks at the file.
inline constexpr duration file_poll_interval{250};
/// The cap on HTTP poll back-off (the poll interval itself when that is longer).
inline constexpr duration max_poll_backoff{30'000};
/// The largest response body an HTTP source accepts.
inline constexpr std::uint64_t max_document_bytes = 64ull * 1024 * 1024;

/// File source. The caller loads the file synchronously at startup; pass that document as
/// `initial` and the source compares the file with it at start() (so a change made between the
/// caller's load and start() is delivered). Without `initial`, the content found at start() is
/// the silent baseline (not delivered; only later changes are).
std::unique_ptr<source> make_file_source(asio::io_context& ioc, std::string path, source_callbacks callbacks,
                                         std::optional<document> initial = std::nullopt);

/// HTTP source for any URL that serves the topology document (`--topology-url`).
std::unique_ptr<source> make_http_source(asio::io_context& ioc, std::string url, duration poll_interval,
                                         duration timeout, source_callbacks callbacks);

/// Ray dashboard source (`--ray-dashboard`): polls dashboard_applications_url(dashboard_url).
std::unique_ptr<source> make_dashboard_source(asio::io_context& ioc, std::string dashboard_url,
                                              duration poll_interval, duration timeout,
                                              source_callbacks callbacks);

/// A parsed http:// URL.
struct http_url {
  std::string host;       ///< host name or IP literal (IPv6 without brackets)
  std::uint16_t port = 80;
  std::string authority;  ///< as written ("10.0.0.1:8265", "[::1]:8265", "dash"): the Host header
  std::string target;     ///< path + query ("/" when empty); any fragment dropped
  bool operator==(const http_url&) const = default;
};

/// Parses "http://HOST[:PORT][/PATH][?QUERY][#FRAGMENT]" (scheme case-insensitive; IPv6 hosts in
/// brackets). nullopt for anything else (https, credentials, bad port, empty host).
std::optional<http_url> parse_http_url(std::string_view url);

/// `<base>/api/serve/applications/` with exactly one '/' between them
/// ("http://h:8265" and "http://h:8265/" both give "http://h:8265/api/serve/applications/").
std::string dashboard_applications_url(std::string_view dashboard_url);

/// The delay before the next poll after `consecutive_failures` failed polls in a row:
/// poll_interval for 0 and 1, then doubling (2 → 2×, 3 → 4×, ...), capped at
/// max(max_poll_backoff, poll_interval).
duration poll_backoff(duration poll_interval, unsigned consecutive_failures);

/// The local address the kernel would use to reach `host` (an IP literal, or a name resolved
/// synchronously: blocking, for startup only), as in contract §3.3 step 3 ("the source address
/// the kernel picks to reach the topology source's host"). A connected UDP socket is used, so
/// nothing is sent. nullopt when it cannot tell (unresolvable name, no route).
std::optional<std::string> local_address_towards(const std::string& host, std::uint16_t port = 80);

}  // namespace ingressd::topology
