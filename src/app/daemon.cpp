#include "ingressd/app/daemon.hpp"

#include <csignal>
#include <pthread.h>

#include <future>
#include <mutex>
#include <thread>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/http/message.hpp"
#include "ingressd/metrics/access_log.hpp"
#include "admin/admin.hpp"
#include "worker/worker.hpp"

namespace ingressd::server {

namespace {

/// A listener that cannot be opened is a startup failure whose message names the address and
/// its setting, not the Boost call that failed (exit 1, contract §1).
[[noreturn]] void cannot_listen(std::string_view key, const config::host_port& hp, const error_code& ec) {
  std::string hint;
  if (ec == asio::error::address_in_use) {
    const std::string_view holder = config::usual_holder(hp.port);
    hint = holder.empty() ? std::string("; another process holds it (ss -ltnp 'sport = :") + std::to_string(hp.port) +
                                "' shows which)"
                          : std::string("; on a Ray node that is usually ") + std::string(holder) +
                                " (config/beside-ray-haproxy.yaml has ports that clash with nothing Ray binds)";
  }
  throw std::runtime_error("cannot listen on " + hp.to_string() + " (" + std::string(key) + "): " + ec.message() + hint);
}

/// An IP literal as is; a host name resolved once at startup (the first IPv4 address, else the
/// first address).
tcp::endpoint to_endpoint(std::string_view key, const config::host_port& hp) {
  error_code ec;
  auto ip = asio::ip::make_address(hp.host, ec);
  if (!ec) return {ip, hp.port};
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(hp.host, std::to_string(hp.port), tcp::resolver::numeric_service, ec);
  if (!ec && results.empty()) ec = asio::error::host_not_found;
  if (ec) cannot_listen(key, hp, ec);
  for (const auto& r : results)
    if (r.endpoint().address().is_v4()) return r.endpoint();
  return results.begin()->endpoint();
}

// Named so that `top -H`, `ps -L` and the benchmark's per-thread CPU budgets can tell the workers
// from the control thread (Linux keeps at most 15 characters).
void name_thread(const std::string& name) { pthread_setname_np(pthread_self(), name.substr(0, 15).c_str()); }
}  // namespace

struct daemon::impl {
  explicit impl(std::shared_ptr<const config::config> c) : cfg(track(std::move(c))) {}

  // First, so that it goes last: every config generation still held by a member below counts
  // itself out of shared.config_generations as it goes.
  shared_state shared;
  std::unique_ptr<metrics::access_log> access_log;  // outlives the workers that write to it
  // The config new requests get. Replaced by reload() on the main thread and read by the drain
  // on the control thread, hence the lock; workers get their own copy posted to them.
  mutable std::mutex cfg_mu;
  std::shared_ptr<const config::config> cfg;
  std::vector<std::unique_ptr<worker>> workers;
  std::vector<std::thread> threads;
  asio::io_context control{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> control_guard;
  std::thread control_thread;
  std::unique_ptr<admin_server> admin;
  mutable std::mutex snap_mu;
  std::shared_ptr<const topology::snapshot> snap;
  /// Upstreams marked down, by key, with why (for /topology); under snap_mu. The truth for
  /// routing is each upstream_state's `up`, which this sets.
  std::unordered_map<std::string, std::string> down;
  std::function<void(const std::string&)> on_passive_down;  // set before start()
  std::uint16_t port = 0;
  std::uint16_t tls_port = 0;
  std::uint16_t grpc_port = 0;
  std::shared_ptr<const tls::server_context> tls;  // the HTTPS listener's certificate in force
  std::mutex stop_mu;
  bool stopped = false;
  bool joined = false;
  std::optional<asio::steady_timer> drain_timer;

  /// The certificate in force, for /metrics (ingressd_tls_certificate_expiry_timestamp_seconds).
  void note_tls() {
    shared.tls_not_after.store(std::chrono::system_clock::to_time_t(tls->not_after()), std::memory_order_relaxed);
  }

  std::shared_ptr<const config::config> current_config() const {
    std::lock_guard lk(cfg_mu);
    return cfg;
  }

  /// The same config, counted in ingressd_config_generations until its last holder (the
  /// daemon, a worker, a request that started under it) lets go: a reload storm must not leave
  /// generations behind once their requests have ended (hardening I3).
  std::shared_ptr<const config::config> track(std::shared_ptr<const config::config> c) {
    shared.config_generations.fetch_add(1, std::memory_order_relaxed);
    const auto* raw = c.get();
    return {raw, [owner = std::move(c), &gens = shared.config_generations](const config::config*) mutable {
              owner.reset();
              gens.fetch_sub(1, std::memory_order_relaxed);
            }};
  }

  void stop_all() {
    std::lock_guard lk(stop_mu);
    if (stopped) return;
    stopped = true;
    for (auto& w : workers) asio::post(w->ioc(), [w = w.get()] { w->abort_all(); });
    asio::post(control, [this] {
      if (admin) admin->stop();
      if (drain_timer) drain_timer->cancel();
      control_guard.reset();
    });
  }

  std::uint64_t open_connections() const {
    std::uint64_t n = 0;
    for (auto& w : workers) n += w->stats().active_connections.get();
    return n;
  }

  // Drain (contract §7): runs on the control thread.
  void drain_phase_accepting(std::chrono::steady_clock::time_point hard_deadline) {
    for (auto& w : workers)
      asio::post(w->ioc(), [w = w.get()] {
        w->stop_accepting();
        w->close_idle();
      });
    spdlog::info("drain: stopped accepting; {} connections open", open_connections());
    drain_wait(hard_deadline);
  }

  void drain_wait(std::chrono::steady_clock::time_point hard_deadline) {
    if (open_connections() == 0 || std::chrono::steady_clock::now() >= hard_deadline) {
      if (open_connections() > 0) spdlog::warn("drain: timeout, aborting {} connections", open_connections());
      else spdlog::info("drain: complete");
      stop_all();
      return;
    }
    drain_timer->expires_after(std::chrono::milliseconds(50));
    drain_timer->async_wait([this, hard_deadline](error_code ec) {
      if (!ec) drain_wait(hard_deadline);
    });
  }
};

daemon::daemon(std::shared_ptr<const config::config> cfg) : impl_(std::make_unique<impl>(std::move(cfg))) {
  impl_->shared.passive_down = [this](const std::string& key, std::string cause) {
    const std::string why = cause;
    if (!mark(key, false, std::move(cause), true)) return;  // another worker marked it first
    spdlog::warn("health: replica {} is DOWN: {}", key, why);
    if (impl_->on_passive_down) impl_->on_passive_down(key);
  };
  impl_->shared.down_cause = [this](const std::string& key) {
    std::lock_guard lk(impl_->snap_mu);
    const auto it = impl_->down.find(key);
    return it == impl_->down.end() ? std::string() : it->second;
  };
}

daemon::~daemon() {
  stop();
  wait();
}

void daemon::start() {
  auto& d = *impl_;
  const unsigned n = d.cfg->effective_threads();
  auto ep = to_endpoint("listen", d.cfg->listen);
  if (d.cfg->access_log != "off" && !d.access_log) {
    d.access_log = std::make_unique<metrics::access_log>(d.cfg->access_log);
    d.shared.access_log = d.access_log.get();
  }
  for (unsigned i = 0; i < n; ++i) {
    d.workers.push_back(std::make_unique<worker>(i, d.cfg, d.shared));
    // The first worker may bind port 0; the others share the port it got.
    if (auto ec = d.workers.back()->bind(ep, i == 0)) cannot_listen("listen", d.cfg->listen, ec);
    if (i == 0) ep.port(d.workers[0]->port());
  }
  d.port = ep.port();
  if (d.cfg->tls.enabled()) {
    // OpenSSL writes the client sockets with write(), not send(MSG_NOSIGNAL) as ingressd's own
    // writes do: a client that resets the connection while an alert or a record goes out must
    // not kill the process with SIGPIPE (nginx and HAProxy ignore it too).
    std::signal(SIGPIPE, SIG_IGN);
    if (!d.tls) {
      auto loaded = tls::server_context::load(d.cfg->tls, std::chrono::system_clock::now(), d.cfg->grpc.enabled());
      if (auto* err = std::get_if<std::string>(&loaded)) throw std::runtime_error(*err);
      d.tls = std::get<std::shared_ptr<const tls::server_context>>(std::move(loaded));
    }
    d.note_tls();
    auto tls_ep = to_endpoint("tls.listen", d.cfg->tls.listen);
    for (unsigned i = 0; i < n; ++i) {
      if (auto ec = d.workers[i]->bind(tls_ep, i == 0, worker::listener::tls))
        cannot_listen("tls.listen", d.cfg->tls.listen, ec);
      if (i == 0) tls_ep.port(d.workers[0]->tls_port());
      d.workers[i]->set_tls(d.tls);
    }
    d.tls_port = tls_ep.port();
  }
  if (d.cfg->grpc.enabled()) {
    auto grpc_ep = to_endpoint("grpc.listen", d.cfg->grpc.listen);
    for (unsigned i = 0; i < n; ++i) {
      if (auto ec = d.workers[i]->bind(grpc_ep, i == 0, worker::listener::grpc))
        cannot_listen("grpc.listen", d.cfg->grpc.listen, ec);
      if (i == 0) grpc_ep.port(d.workers[0]->grpc_port());
    }
    d.grpc_port = grpc_ep.port();
    d.shared.grpc = true;
  }
  const auto admin_ep = to_endpoint("admin_listen", d.cfg->admin_listen);
  error_code admin_ec;
  d.admin = std::make_unique<admin_server>(d.control, admin_ep, admin_ec, admin_server::handlers{
      [this] { return current_topology(); },
      [this] {
        std::vector<const worker*> ws;
        for (auto& w : impl_->workers) ws.push_back(w.get());
        return ws;
      },
      &d.shared,
      [this] {
        std::lock_guard lk(impl_->snap_mu);
        return impl_->down;
      },
      [this] { return impl_->current_config(); }});
  if (admin_ec) cannot_listen("admin_listen", d.cfg->admin_listen, admin_ec);
  d.control_guard.emplace(d.control.get_executor());
  d.drain_timer.emplace(d.control);
  d.admin->start();
  {
    // A topology published before start() is in force before the first connection is accepted.
    std::lock_guard lk(d.snap_mu);
    if (d.snap)
      for (auto& w : d.workers) w->apply(d.snap);
  }
  for (unsigned i = 0; i < n; ++i)
    d.threads.emplace_back([w = d.workers[i].get(), i] {
      name_thread("ingressd-w" + std::to_string(i));
      w->run();
    });
  d.control_thread = std::thread([&d] {
    name_thread("ingressd-ctl");
    d.control.run();
  });
}

void daemon::set_topology(std::shared_ptr<const topology::snapshot> snap) {
  {
    std::lock_guard lk(impl_->snap_mu);
    // A key that left the topology forgets why it was down: the checker starts it again as up
    // when it comes back.
    std::erase_if(impl_->down, [&](const auto& kv) { return !snap->states.contains(kv.first); });
    for (const auto& [key, state] : snap->states) state->up.store(!impl_->down.contains(key), std::memory_order_relaxed);
    impl_->snap = snap;
  }
  impl_->shared.topology_updates.fetch_add(1, std::memory_order_relaxed);
  for (auto& w : impl_->workers) asio::post(w->ioc(), [w = w.get(), snap] { w->apply(snap); });
}

bool daemon::mark(const std::string& key, bool up, std::string cause, bool passive) {
  std::lock_guard lk(impl_->snap_mu);
  const bool was_down = impl_->down.contains(key);
  topology::upstream_state* state = nullptr;
  if (impl_->snap)
    if (auto it = impl_->snap->states.find(key); it != impl_->snap->states.end()) state = it->second.get();
  if (up) {
    impl_->down.erase(key);
    if (state) state->errors.store(0, std::memory_order_relaxed);  // a new run of errors starts from 0
  } else {
    impl_->down[key] = std::move(cause);
    if (state && !was_down) (passive ? state->downs_by_errors : state->downs_by_check).fetch_add(1, std::memory_order_relaxed);
  }
  if (state) state->up.store(up, std::memory_order_relaxed);
  return was_down == up;
}

void daemon::set_replica_health(const std::string& key, bool up, std::string cause) {
  mark(key, up, cause.empty() ? std::string("health check") : std::move(cause), false);
}

void daemon::on_passive_down(std::function<void(const std::string& key)> f) { impl_->on_passive_down = std::move(f); }

bool daemon::reopen_access_log() {
  if (!impl_->access_log) return true;
  if (impl_->access_log->reopen()) return true;
  spdlog::error("access log: cannot reopen '{}'; still writing to the old file", impl_->access_log->target());
  return false;
}

std::optional<std::string> daemon::reload(std::shared_ptr<const config::config> next) {
  auto& d = *impl_;
  const auto cur = d.current_config();
  // Listener sockets and worker threads stay as they are across a reload.
  if (next->listen != cur->listen) return "listen cannot change without a restart";
  if (next->admin_listen != cur->admin_listen) return "admin_listen cannot change without a restart";
  if (next->tls.listen != cur->tls.listen) return "tls.listen cannot change without a restart";
  if (next->grpc.listen != cur->grpc.listen) return "grpc.listen cannot change without a restart";
  if (next->effective_threads() != cur->effective_threads()) return "threads cannot change without a restart";
  std::shared_ptr<const tls::server_context> tls;
  if (next->tls.enabled()) {
    auto loaded = tls::server_context::load(next->tls, std::chrono::system_clock::now(), next->grpc.enabled());
    if (auto* err = std::get_if<std::string>(&loaded)) return *err;
    tls = std::get<std::shared_ptr<const tls::server_context>>(std::move(loaded));
  }
  next = d.track(std::move(next));
  {
    std::lock_guard lk(d.cfg_mu);
    d.cfg = next;
  }
  // Counted before any worker can apply it: whoever sees the new config in effect (a request,
  // then a scrape) also sees the reload counted.
  d.shared.config_reloads.fetch_add(1, std::memory_order_relaxed);
  for (auto& w : d.workers)
    asio::post(w->ioc(), [w = w.get(), next, tls] {
      if (tls) w->set_tls(tls);
      w->apply_config(next);
    });
  if (tls) {
    d.tls = std::move(tls);
    d.note_tls();
    spdlog::info("tls: certificate loaded: {}", d.tls->describe());
  }
  return std::nullopt;
}

void daemon::count_config_error() { impl_->shared.config_errors.fetch_add(1, std::memory_order_relaxed); }

void daemon::count_topology_error() { impl_->shared.topology_errors.fetch_add(1, std::memory_order_relaxed); }

void daemon::expect_topology_source() {
  std::int64_t none = -1;
  impl_->shared.topology_current_ms.compare_exchange_strong(none, 0, std::memory_order_relaxed);
}

void daemon::note_topology_current() {
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  impl_->shared.topology_current_ms.store(now.count(), std::memory_order_relaxed);
}

std::shared_ptr<const topology::snapshot> daemon::current_topology() const {
  std::lock_guard lk(impl_->snap_mu);
  return impl_->snap;
}

void daemon::sync() {
  std::vector<std::future<void>> done;
  for (auto& w : impl_->workers) {
    auto p = std::make_shared<std::promise<void>>();
    done.push_back(p->get_future());
    asio::post(w->ioc(), [p] { p->set_value(); });
  }
  for (auto& f : done) f.wait();
}

std::uint16_t daemon::port() const { return impl_->port; }
std::uint16_t daemon::admin_port() const { return impl_->admin ? impl_->admin->port() : 0; }
std::uint16_t daemon::tls_port() const { return impl_->tls_port; }
std::uint16_t daemon::grpc_port() const { return impl_->grpc_port; }

void daemon::set_tls(std::shared_ptr<const tls::server_context> ctx) { impl_->tls = std::move(ctx); }

void daemon::begin_drain() {
  auto& d = *impl_;
  if (d.shared.draining.exchange(true)) return;
  asio::post(d.control, [&d] {
    const auto cfg = d.current_config();
    // drain.min_period is for health checkers: it gives them time to see the 503 before the
    // listener stops accepting. With none (nothing ever asked /-/healthz: a Ctrl-C at a
    // terminal, a node without a load balancer) there is no one to wait for.
    auto accept_for = cfg->drain.min_period;
    if (d.shared.health_polled.load(std::memory_order_relaxed)) {
      spdlog::info("drain: /-/healthz now fails; accepting for {}ms more so that health checkers notice",
                   accept_for.count());
    } else {
      if (accept_for.count() > 0)
        spdlog::info("drain: nothing has polled /-/healthz since start: not waiting drain.min_period");
      accept_for = ingressd::duration{0};
    }
    auto hard_deadline = std::chrono::steady_clock::now() + accept_for + cfg->drain.timeout;
    d.drain_timer->expires_after(accept_for);
    d.drain_timer->async_wait([&d, hard_deadline](error_code ec) {
      if (!ec) d.drain_phase_accepting(hard_deadline);
    });
  });
}

bool daemon::draining() const { return impl_->shared.draining.load(std::memory_order_relaxed); }

void daemon::stop() {
  if (impl_->workers.empty() && !impl_->control_thread.joinable()) return;
  impl_->stop_all();
}

int daemon::wait() {
  auto& d = *impl_;
  if (d.joined) return 0;
  for (auto& t : d.threads)
    if (t.joinable()) t.join();
  if (d.control_thread.joinable()) d.control_thread.join();
  d.joined = true;
  return 0;
}

}  // namespace ingressd::server
