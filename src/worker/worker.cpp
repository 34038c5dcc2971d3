#include "worker/worker.hpp"

#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "ingressd/core/scope.hpp"
#include "proxy/grpc/grpc_proxy.hpp"
#include "worker/proxy_header.hpp"
#include "proxy/http1/connection.hpp"

namespace ingressd::server {

namespace {

/// SO_REUSEPORT as an Asio socket option (Asio has none of its own outside `detail`).
struct reuse_port {
  int value = 1;
  template <class P> int level(const P&) const { return SOL_SOCKET; }
  template <class P> int name(const P&) const { return SO_REUSEPORT; }
  template <class P> const int* data(const P&) const { return &value; }
  template <class P> std::size_t size(const P&) const { return sizeof value; }
};

/// How long an unused pooled upstream connection is kept.
constexpr auto pool_max_idle = std::chrono::seconds(60);

}  // namespace

worker::worker(unsigned index, std::shared_ptr<const config::config> cfg, shared_state& shared)
    : index_(index),
      cfg_(std::move(cfg)),
      shared_(shared),
      pool_(cfg_->upstream.max_idle_per_replica),
      hedge_budget_(cfg_->router.hedge_budget_permille),
      id_state_((std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^ index) {
  grpc_ = std::make_unique<grpc_hub>(*this);
}

worker::~worker() {
  // Sockets owned here must go before the io_context they belong to.
  acceptor_.reset();
  tls_acceptor_.reset();
  grpc_acceptor_.reset();
  grpc_.reset();
  pool_.close_all();
  pool_ = upstream::pool(0);
}

error_code worker::bind(const tcp::endpoint& ep, bool first, listener which) {
  auto& acceptor = which == listener::tls ? tls_acceptor_ : which == listener::grpc ? grpc_acceptor_ : acceptor_;
  auto& port = which == listener::tls ? tls_port_ : which == listener::grpc ? grpc_port_ : port_;
  acceptor.emplace(ioc_);
  error_code ec;
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  // The first listener binds without SO_REUSEPORT: a socket may share a port only when every
  // socket bound to it has SO_REUSEPORT, so this bind fails with EADDRINUSE whenever another
  // process (a second ingressd included) holds the address, instead of quietly splitting its
  // traffic with it (contract §9). Set before listen(), the option still lets the other
  // workers' listeners join this one's group.
  if (!ec && !first) acceptor->set_option(reuse_port{}, ec);
  if (!ec) acceptor->bind(ep, ec);
  if (!ec && first) acceptor->set_option(reuse_port{}, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) acceptor->non_blocking(true, ec);  // accept_loop takes bursts without waiting
  if (!ec) port = acceptor->local_endpoint(ec).port();
  if (ec) acceptor.reset();
  return ec;
}

void worker::run() {
  auto log_error = [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::error("worker task failed: {}", ex.what());
    }
  };
  if (acceptor_) asio::co_spawn(ioc_, accept_loop(*acceptor_, listener::plain), log_error);
  if (tls_acceptor_) asio::co_spawn(ioc_, accept_loop(*tls_acceptor_, listener::tls), log_error);
  if (grpc_acceptor_) asio::co_spawn(ioc_, accept_loop(*grpc_acceptor_, listener::grpc), log_error);
  asio::co_spawn(ioc_, sweep_loop(), log_error);
  asio::co_spawn(ioc_, idle_loop(), log_error);
  event_loop();
}

void worker::event_loop() {
  // io_context::run(), unless busy_poll_us is set: then, after work, the loop keeps polling
  // (epoll_wait with a zero timeout) for that long before it sleeps. On a VM whose idle vCPU halts,
  // every sleep -> wake-up costs a VM exit and a host reschedule, 30-100 us on a busy host; a
  // request that waits for its router and then its replica pays that three or four times (bench/:
  // SSE TTFT). The spin only follows work, so an idle worker still sleeps. Read on every turn,
  // so a reload applies; at saturation poll() always finds work and costs what run() does.
  using clock = std::chrono::steady_clock;
  auto last_work = clock::now();
  for (;;) {
    if (ioc_.poll() != 0) {
      last_work = clock::now();
      continue;
    }
    if (ioc_.stopped()) return;  // stop() or out of work
    const std::chrono::microseconds spin(cfg_->busy_poll_us);
    if (spin.count() != 0 && clock::now() - last_work < spin) continue;
    if (ioc_.run_one() == 0) return;
    last_work = clock::now();
  }
}

bool accept_starved(const error_code& ec) {
  return ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_buffer_space ||
         ec == asio::error::no_memory;
}

awaitable<void> worker::accept_loop(tcp::acceptor& acceptor, listener which) {
  asio::steady_timer backoff_timer(ioc_);
  registration<asio::steady_timer> reg(accept_timers_[static_cast<std::size_t>(which)], backoff_timer);
  accept_backoff backoff;
  while (acceptor.is_open()) {
    auto [ec, sock] = co_await acceptor.async_accept(ioc_, nothrow);  // typed executor: see connection.hpp
    // Then what else the listen queue holds, without waiting (the listener is non-blocking): one
    // wake-up takes a burst, as HAProxy and nginx's multi_accept do, instead of one event-loop turn
    // per connection while the others wait in the kernel's queue, where no timeout or metric sees
    // them (strace under a burst of TLS handshakes: the queue at 23-56 of 64 where HAProxy's was 0).
    for (unsigned n = 1; !ec; ++n) {
      if (stopping_ || !acceptor.is_open()) co_return;
      backoff.reset();
      admit(std::move(sock), which);
      if (n == accept_batch) break;  // before accepting one more: it would have no taker
      sock = decltype(sock)(ioc_);
      acceptor.accept(sock, ec);
    }
    if (stopping_ || !acceptor.is_open()) break;
    if (!ec || ec == asio::error::would_block || ec == asio::error::try_again) continue;
    if (ec == asio::error::operation_aborted) break;
    // Out of descriptors or memory: pause instead of spinning on a ready listener (hardening H1).
    if (accept_starved(ec)) {
      shared_.accept_errors.fetch_add(1, std::memory_order_relaxed);
      const auto pause = backoff.next();
      spdlog::warn("accept failed: {}; pausing {}ms", ec.message(), pause.count());
      backoff_timer.expires_after(pause);
      co_await backoff_timer.async_wait(nothrow);
    }
  }
}

void worker::admit(connection::client_socket sock, listener which) {
  auto open = shared_.connections.fetch_add(1, std::memory_order_relaxed) + 1;
  if (open > cfg_->client.max_connections) {
    shared_.connections.fetch_sub(1, std::memory_order_relaxed);
    error_code ignored;
    sock.set_option(asio::socket_base::linger(true, 0), ignored);
    sock.close(ignored);
    return;
  }
  if (cfg_->client.proxy_protocol) {
    asio::co_spawn(ioc_, admit_proxied(std::move(sock), which), asio::detached);
    return;
  }
  hand_on(std::move(sock), which, std::nullopt);
}

void worker::hand_on(connection::client_socket sock, listener which, std::optional<tcp::endpoint> client) {
  if (which == listener::grpc) {
    grpc_->accept(std::move(sock), nullptr, client ? net::unmapped(client->address()).to_string() : std::string());
    return;
  }
  auto s = std::make_shared<connection>(*this, std::move(sock), which == listener::tls ? tls_ctx_->native() : nullptr,
                                     client);
  add_connection(*s);
  s->start();
}

awaitable<void> worker::admit_proxied(connection::client_socket sock, listener which) {
  // Held by the deadline's handler too, which may run after this coroutine has handed the
  // socket on (then it cancels nothing).
  struct pending {
    connection::client_socket sock;
    bool timed_out = false;
  };
  auto p = std::make_shared<pending>(pending{std::move(sock)});
  auto drop = [&] {
    error_code ignored;
    p->sock.close(ignored);
    shared_.connections.fetch_sub(1, std::memory_order_relaxed);
  };
  auto refuse = [&](net::proxy_error why, std::string_view detail) {
    stats_.proxy_protocol_errors[static_cast<std::size_t>(why)].add();
    error_code ignored;
    const auto peer = p->sock.remote_endpoint(ignored);
    spdlog::debug("PROXY header from {}: {} ({})", peer.address().to_string(), net::to_string(why), detail);
    drop();
  };
  error_code ec;
  const auto peer = p->sock.remote_endpoint(ec);
  if (ec || !net::any_contains(cfg_->client.trusted_proxies, peer.address())) {
    refuse(net::proxy_error::untrusted, "the peer is not in client.trusted_proxies");
    co_return;
  }
  asio::steady_timer deadline(ioc_);
  deadline.expires_after(cfg_->client.header_timeout);
  deadline.async_wait([p](error_code e) {
    if (e) return;
    p->timed_out = true;
    error_code ignored;
    p->sock.cancel(ignored);
  });
  const auto got = co_await read_proxy_header(p->sock);
  deadline.cancel();
  if (got.st != net::proxy_header::state::done) {
    refuse(p->timed_out ? net::proxy_error::timeout : got.error, got.detail);
    co_return;
  }
  if (stopping_) {
    drop();
    co_return;
  }
  hand_on(std::move(p->sock), which, got.source);
}

awaitable<void> worker::sweep_loop() {
  // Dead pooled connections (peer closed) are found and closed here so that they do not sit
  // in CLOSE_WAIT until their next use.
  asio::steady_timer t(ioc_);
  registration<asio::steady_timer> reg(sweep_timer_, t);
  while (!stopping_) {
    t.expires_after(std::chrono::seconds(1));
    co_await t.async_wait(nothrow);
    if (stopping_) break;
    pool_.sweep(std::chrono::steady_clock::now(), pool_max_idle);
    grpc_->sweep();
    trim_spare_scratch();
    // After a burst of connections has gone, hand the freed heap back to the kernel: glibc
    // keeps it otherwise, and the idle process stays at its peak RSS.
    const auto open = stats_.active_connections.get();
    peak_connections_ = std::max(peak_connections_, open);
    if (peak_connections_ >= open + 1000 && open < peak_connections_ / 2) {
      spare_scratch_.clear();
      ::malloc_trim(0);
      peak_connections_ = open;
    }
  }
}

awaitable<void> worker::idle_loop() {
  // Keep-alive timeouts of idle connections: one sweep over this worker's connections instead of
  // a pending timer operation per idle connection. Ticks at an eighth of the timeout (10 ms to
  // 1 s), so a connection closes at most that much after its keep-alive deadline.
  asio::steady_timer t(ioc_);
  registration<asio::steady_timer> reg(idle_timer_, t);
  while (!stopping_) {
    const auto keepalive = std::chrono::duration_cast<std::chrono::steady_clock::duration>(cfg_->client.keepalive_timeout);
    t.expires_after(std::clamp<std::chrono::steady_clock::duration>(keepalive / 8, std::chrono::milliseconds(10),
                                                                    std::chrono::seconds(1)));
    co_await t.async_wait(nothrow);
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = connections_.begin(); it != connections_.end();) {
      connection& s = *it++;  // closing does not unlink now (the connection lives until its handlers run)
      s.expire_idle(now, keepalive);
    }
  }
}

void worker::add_connection(connection& s) { connections_.push_back(s); }

void worker::hand_to_grpc(asio::basic_stream_socket<tcp, executor> sock, std::unique_ptr<tls::stream> tls,
                          std::string remote) {
  grpc_->accept(std::move(sock), std::move(tls), std::move(remote));
}

std::unique_ptr<request_scratch> worker::take_scratch() {
  if (spare_scratch_.empty()) return std::make_unique<request_scratch>(ioc_);
  auto s = std::move(spare_scratch_.back());
  spare_scratch_.pop_back();
  spare_low_ = std::min(spare_low_, spare_scratch_.size());
  return s;
}

void worker::trim_spare_scratch() {
  const std::size_t unused = (std::min(spare_low_, spare_scratch_.size()) + 1) / 2;
  spare_scratch_.resize(spare_scratch_.size() - unused);
  spare_low_ = spare_scratch_.size();
}

void worker::give_scratch(std::unique_ptr<request_scratch> s) {
  // No cap: the spares never outnumber the requests once in flight at the same time, which
  // client.max_connections bounds, and trim_spare_scratch() returns them after the peak.
  if (!s) return;
  // Keep what a typical request reuses; a large body prefix is not worth holding on to.
  s->client_head.clear();
  s->request_head.clear();
  s->response_head.clear();
  if (s->prebody.capacity() > 4096) std::string().swap(s->prebody);
  s->prebody.clear();
  for (auto& t : s->router_timers) t.cancel();
  s->hedge_done.cancel();
  spare_scratch_.push_back(std::move(s));
}

void worker::apply_config(std::shared_ptr<const config::config> next) {
  pool_.set_max_idle(next->upstream.max_idle_per_replica);
  hedge_budget_.set_share(next->router.hedge_budget_permille);
  cfg_ = std::move(next);
  for (const auto& a : apps_) publish_hedge(a);
}

std::optional<std::chrono::steady_clock::duration> worker::hedge_after(const app_state& app,
                                                                      std::size_t pool_index) const {
  const auto& r = cfg_->router;
  return routing::hedge_after(r.hedge_auto, r.hedge_after, r.hedge_budget_permille, app.router_latency.size(),
                              app.router_latency[pool_index]);
}

void worker::publish_hedge(const app_state& app, std::size_t pool_index) const {
  if (!app.metrics || pool_index >= app.metrics->routers().size()) return;
  const auto d = hedge_after(app, pool_index);
  app.metrics->routers()[pool_index]->hedge_delay_us.store(
      d ? std::chrono::duration_cast<std::chrono::microseconds>(*d).count() : -1, std::memory_order_relaxed);
}

void worker::publish_hedge(const app_state& app) const {
  for (std::size_t i = 0; i < app.router_latency.size(); ++i) publish_hedge(app, i);
}

void worker::apply(std::shared_ptr<const topology::snapshot> snap) {
  std::unordered_map<std::string_view, std::size_t> old_index;
  if (snap_)
    for (std::size_t i = 0; i < snap_->apps.size(); ++i) old_index.emplace(snap_->apps[i].name, i);

  std::vector<app_state> next(snap->apps.size());
  const auto blocks = metrics_.apply(*snap, &grpc_blocks_);
  std::unordered_set<std::string_view> keys;
  for (std::size_t i = 0; i < snap->apps.size(); ++i) {
    const auto& view = snap->apps[i];
    auto& st = next[i];
    st.metrics = blocks[i];
    st.pool_signature = view.pool_signature;
    st.router_cursor = routing::rr_cursor(index_);
    st.router_latency.resize(view.router_pool.size());
    if (auto it = old_index.find(view.name); it != old_index.end()) {
      // An unchanged router pool keeps its cursor (contract §3.2).
      const auto& old = apps_[it->second];
      if (old.pool_signature == view.pool_signature) {
        st.router_cursor = old.router_cursor;
        st.router_latency = old.router_latency;
      }
      st.lb_rotor = old.lb_rotor;
    }
    for (const auto& ep : view.router_pool) keys.insert(ep.key);
  }
  for (const auto& [key, state] : snap->states) keys.insert(key);
  // Removed endpoints get no new requests; their idle pooled connections are closed now.
  pool_.set_endpoints([&](const std::string& key) { return keys.contains(key); },
                      std::vector<std::string_view>(keys.begin(), keys.end()));
  routers_.retain([&](const std::string& key) { return keys.contains(key); });
  apps_ = std::move(next);
  snap_ = std::move(snap);
  for (const auto& a : apps_) publish_hedge(a);
  grpc_->topology_changed();
}

void worker::note_upstream_error(const topology::endpoint& ep, std::string_view what, unsigned limit) {
  if (limit == 0 || !ep.state) return;
  const auto errors = ep.state->errors.fetch_add(1, std::memory_order_relaxed) + 1;
  // Several workers may see the limit reached at once; marking down is idempotent.
  if (errors >= limit && ep.state->up.load(std::memory_order_relaxed) && shared_.passive_down)
    shared_.passive_down(ep.key, fmt::format("{} consecutive connection errors (last: {})", errors, what));
}

metrics::app_metrics* worker::grpc_block_named(std::string_view name) const {
  if (!snap_) return nullptr;
  if (auto it = snap_->grpc_by_name.find(std::string(name)); it != snap_->grpc_by_name.end())
    return grpc_block(it->second);
  return nullptr;
}

bool worker::healthy() const {
  if (!snap_) return false;
  if (snap_->apps.empty()) return true;
  // An app scaled to zero is served by its fallback target (Ray's backup server counts too).
  auto up = [](const topology::endpoint& e) { return e.state->up.load(std::memory_order_relaxed); };
  for (const auto& a : snap_->apps) {
    for (const auto& r : a.replicas)
      if (up(r)) return true;
    if (a.fallback && up(*a.fallback)) return true;
  }
  return false;
}

std::array<char, 36> worker::next_request_id() {
  // UUID version 4 text from this worker's generator (splitmix64 over a random seed): no lock,
  // no syscall, a few nanoseconds.
  auto next = [this] {
    std::uint64_t z = (id_state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::uint64_t hi = next(), lo = next();
  hi = (hi & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;
  lo = (lo & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;
  static constexpr char hex[] = "0123456789abcdef";
  // Where each of the 32 hex digits goes in 8-4-4-4-12 (a fixed table unrolls; a per-digit dash
  // test cost ~2% of a plain request).
  static constexpr std::array<std::uint8_t, 32> at = {0,  1,  2,  3,  4,  5,  6,  7,  9,  10, 11,
                                                      12, 14, 15, 16, 17, 19, 20, 21, 22, 24, 25,
                                                      26, 27, 28, 29, 30, 31, 32, 33, 34, 35};
  std::array<char, 36> out;
  out[8] = out[13] = out[18] = out[23] = '-';
  for (int i = 0; i < 16; ++i) out[at[i]] = hex[(hi >> (60 - 4 * i)) & 0xf];
  for (int i = 0; i < 16; ++i) out[at[16 + i]] = hex[(lo >> (60 - 4 * i)) & 0xf];
  return out;
}

void worker::stop_accepting() {
  error_code ignored;
  if (acceptor_) acceptor_->close(ignored);
  if (tls_acceptor_) tls_acceptor_->close(ignored);
  if (grpc_acceptor_) grpc_acceptor_->close(ignored);
  for (auto* t : accept_timers_)
    if (t) t->cancel();
}

void worker::close_idle() {
  for (auto& s : connections_) s.close_if_idle();
  pool_.close_all();
  grpc_->drain();
}

void worker::abort_all() {
  stopping_ = true;
  stop_accepting();
  for (auto& s : connections_) s.abort();
  pool_.close_all();
  grpc_->abort_all();
  if (sweep_timer_) sweep_timer_->cancel();
  if (idle_timer_) idle_timer_->cancel();
}

}  // namespace ingressd::server
