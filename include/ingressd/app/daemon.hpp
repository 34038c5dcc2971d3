#pragma once
// The ingressd daemon as an object: worker threads (one io_context each, each with its own
// SO_REUSEPORT listener), and a control thread (admin listener, topology publication, signals).
// main.cpp and the integration tests drive the same object.
//
// Thread safety: all public member functions may be called from any thread.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "ingressd/config/config.hpp"
#include "ingressd/tls/context.hpp"
#include "ingressd/topology/snapshot.hpp"

namespace ingressd::server {

class daemon {
 public:
  explicit daemon(std::shared_ptr<const config::config> cfg);
  ~daemon();
  daemon(const daemon&) = delete;
  daemon& operator=(const daemon&) = delete;

  /// The HTTPS listener's certificate, already loaded (the runner checks it first, to exit 2 on a
  /// bad one); without it start() loads tls.cert_file and tls.key_file itself.
  void set_tls(std::shared_ptr<const tls::server_context> ctx);
  /// Binds the main and admin listeners (and tls.listen) and starts all threads. Throws std::runtime_error, its
  /// message naming the address and its setting, when a listener cannot be opened (also when
  /// another process holds the address): a startup failure, exit code 1.
  void start();

  /// Publishes a new topology to every worker (they apply it on their own thread).
  void set_topology(std::shared_ptr<const topology::snapshot> snap);
  /// Active health checks marked replica `key` ("ip:port") up or down (`cause`: why, shown in
  /// /topology); workers stop choosing a down replica at once (a router-pinned one falls through
  /// to a healthy one).
  void set_replica_health(const std::string& key, bool up, std::string cause = {});
  /// Passive health (health.error_limit): a worker marked upstream `key` down after consecutive
  /// connection errors. `f` runs on that worker's thread, set before start(); the runner hands
  /// the key to the active checker, whose checks bring it back.
  void on_passive_down(std::function<void(const std::string& key)> f);
  /// SIGHUP (contract §2): applies a validated config to new requests; requests already running
  /// keep theirs. Listeners keep their sockets. Returns an error message, and changes nothing,
  /// when the new config changes what needs a restart (listen, admin_listen, tls.listen, threads),
  /// or when its certificate and key cannot be loaded (the running ones stay). With TLS, the
  /// certificate and key are read again whether or not the config changed: new handshakes use
  /// them, open connections keep theirs.
  std::optional<std::string> reload(std::shared_ptr<const config::config> next);
  /// Counts a config file rejected on SIGHUP (ingressd_config_reload_errors_total).
  void count_config_error();
  /// Counts a rejected topology document or failed fetch (ingressd_topology_errors_total).
  void count_topology_error();
  /// A topology source polls for this daemon: from now on /metrics has
  /// ingressd_topology_last_success_timestamp_seconds (0 until note_topology_current()).
  void expect_topology_source();
  /// The topology source confirmed the topology in force (topology::source_callbacks::on_current).
  void note_topology_current();
  /// SIGUSR1 (logrotate): reopens the access log file at its path. False (logged; the old file
  /// stays in use) when it cannot be opened. No-op when the access log is off or stdout.
  bool reopen_access_log();
  /// The topology most recently published (nullptr before the first).
  std::shared_ptr<const topology::snapshot> current_topology() const;

  /// Returns once every worker has run everything posted to it before this call (for example a
  /// set_topology). Used by tests instead of sleeping.
  void sync();

  /// The bound ports (useful with port 0).
  std::uint16_t port() const;
  std::uint16_t admin_port() const;
  std::uint16_t tls_port() const;  ///< 0 without tls.listen
  std::uint16_t grpc_port() const;  ///< 0 without grpc.listen

  /// SIGTERM: starts the drain of contract §7 and returns at once. `wait()` returns when done.
  void begin_drain();
  /// Whether a drain has begun (a second SIGINT then stops at once).
  bool draining() const;
  /// Stops at once: closes listeners and connections, ends all threads.
  void stop();
  /// Blocks until all threads have ended (after stop() or a finished drain). Returns the exit code.
  int wait();

 private:
  /// Records `key` up or down (with why); true when that changed its state.
  bool mark(const std::string& key, bool up, std::string cause, bool passive);
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace ingressd::server
