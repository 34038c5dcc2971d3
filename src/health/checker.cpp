// Active replica health checks: the fall/rise state machine and the per-target probe loops.
#include "ingressd/core/scope.hpp"
#include "ingressd/health/checker.hpp"
#include "ingressd/health/grpc_probe.hpp"

#include <algorithm>
#include <exception>
#include <map>
#include <mutex>
#include <random>

#include <boost/asio/dispatch.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ingressd::health {

namespace beast = boost::beast;
namespace http = beast::http;

// ---------------------------------------------------------------------------------------------
// checker

namespace {

/// One checked target. `up` and `stopped` are read from any thread; the I/O pointers are touched
/// only on the io_context's thread, and only while the probe loop's frame owns those objects.
struct target_state {
  explicit target_state(const config::health_settings& s) : sm(s, /*up=*/true) {}
  std::string key;
  tcp::endpoint dial;  // guarded by checker::impl::mu
  bool grpc = false;
  std::atomic<bool> up{true};
  std::atomic<bool> stopped{false};
  state_machine sm;  // the io_context's thread only
  asio::steady_timer* timer = nullptr;
  beast::tcp_stream* stream = nullptr;

  void cancel() {
    if (timer) timer->cancel();
    if (stream) {
      error_code ignored;
      stream->socket().close(ignored);
    }
  }
};


std::string host_header(const tcp::endpoint& ep) {
  const auto addr = ep.address();
  std::string host = addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
  return host + ":" + std::to_string(ep.port());
}

std::string describe_error(const char* phase, const error_code& ec, duration timeout) {
  if (ec == beast::error::timeout) return std::string(phase) + ": timed out after " + format_duration(timeout);
  return std::string(phase) + ": " + ec.message();
}

/// One check. Returns "" when the replica answered 200, else why the check failed.
awaitable<std::string> probe(target_state& ts, tcp::endpoint dial, const std::string& path, duration timeout) {
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  registration<beast::tcp_stream> reg(ts.stream, stream);
  stream.expires_after(timeout);  // one deadline for connect + request + response head

  auto [cec] = co_await stream.async_connect(dial, nothrow);
  if (cec) co_return describe_error("connect", cec, timeout);

  http::request<http::empty_body> req{http::verb::get, path, 11};
  req.set(http::field::host, host_header(dial));
  req.set(http::field::user_agent, "ingressd-health/" INGRESSD_VERSION);
  req.set(http::field::connection, "close");
  auto [wec, wn] = co_await http::async_write(stream, req, nothrow);
  if (wec) co_return describe_error("send", wec, timeout);

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.header_limit(16 * 1024);
  parser.body_limit(64 * 1024);
  auto [hec, hn] = co_await http::async_read_header(stream, buffer, parser, nothrow);
  if (hec) co_return describe_error("read", hec, timeout);
  const unsigned status = parser.get().result_int();
  if (!parser.is_done()) {
    // Read the (small) rest so the connection closes cleanly; the verdict is the status alone.
    auto [bec, bn] = co_await http::async_read(stream, buffer, parser, nothrow);
    (void)bec;
  }
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream.socket().close(ignored);
  if (status != 200) co_return "HTTP " + std::to_string(status) + " on " + path;
  co_return std::string{};
}

/// One check of a gRPC target (grpc_probe.hpp), with the same deadline and cancellation.
awaitable<std::string> probe_grpc(target_state& ts, tcp::endpoint dial, const std::string& path, duration timeout) {
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  registration<beast::tcp_stream> reg(ts.stream, stream);
  stream.expires_after(timeout);
  std::string failure = co_await grpc_probe(stream, dial, path);
  if (failure.ends_with(": timed out")) failure += " after " + format_duration(timeout);
  co_return failure;
}

duration initial_delay(duration spread) {
  if (spread.count() <= 0) return duration{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<duration::rep> dist(0, spread.count());
  return duration{dist(rng)};
}

void log_exception(std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    spdlog::error("health: probe loop ended by an exception: {}", x.what());
  } catch (...) {
    spdlog::error("health: probe loop ended by an unknown exception");
  }
}

}  // namespace

struct checker::impl {
  impl(asio::io_context& i, config::health_settings s, change_callback cb, std::string gp)
      : ioc(i), settings(std::move(s)), on_change(std::move(cb)), grpc_path(std::move(gp)) {}

  asio::io_context& ioc;
  const config::health_settings settings;
  const change_callback on_change;
  const std::string grpc_path;

  mutable std::mutex mu;
  bool stopped = false;                                           // guarded by mu
  std::map<std::string, std::shared_ptr<target_state>> targets;  // guarded by mu

  tcp::endpoint dial_of(const target_state& ts) const {
    std::lock_guard lock(mu);
    return ts.dial;
  }

  static awaitable<void> run(std::shared_ptr<impl> self, std::shared_ptr<target_state> ts) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    registration<asio::steady_timer> reg(ts->timer, timer);
    auto& sm = ts->sm;
    duration delay = initial_delay(self->settings.fast_interval);
    while (!ts->stopped) {
      timer.expires_after(delay);
      co_await timer.async_wait(nothrow);  // mark_down() cancels it: check at once
      if (ts->stopped) break;
      // Not a conditional expression: GCC 12 destroys temporaries of a co_await inside ?: twice.
      std::string failure;
      if (ts->grpc)
        failure = co_await probe_grpc(*ts, self->dial_of(*ts), self->grpc_path, self->settings.timeout);
      else
        failure = co_await probe(*ts, self->dial_of(*ts), self->settings.path, self->settings.timeout);
      if (ts->stopped) break;
      const bool ok = failure.empty();
      if (auto change = sm.record(ok)) {
        ts->up = *change;
        std::string cause;
        if (*change) {
          spdlog::info("health: replica {} is UP ({} consecutive checks passed)", ts->key, self->settings.rise);
        } else {
          cause = fmt::format("health check: {} ({} consecutive checks failed)", failure, self->settings.fall);
          spdlog::warn("health: replica {} is DOWN: {}", ts->key, cause);
        }
        if (self->on_change) self->on_change(ts->key, *change, cause);
      } else if (!ok) {
        spdlog::debug("health: check of {} failed: {}", ts->key, failure);
      }
      delay = sm.next_interval();
    }
  }
};

checker::checker(asio::io_context& ioc, config::health_settings settings, change_callback on_change,
                 std::string grpc_path)
    : impl_(std::make_shared<impl>(ioc, std::move(settings), std::move(on_change), std::move(grpc_path))) {}

checker::~checker() { stop(); }

void checker::set_targets(std::vector<target_ref> targets) {
  std::vector<std::shared_ptr<target_state>> added;
  std::vector<std::shared_ptr<target_state>> removed;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return;
    std::map<std::string, std::shared_ptr<target_state>> next;
    for (auto& t : targets) {
      if (next.contains(t.key)) continue;
      if (auto it = impl_->targets.find(t.key); it != impl_->targets.end()) {
        it->second->dial = t.dial;
        next.emplace(t.key, it->second);
      } else {
        auto ts = std::make_shared<target_state>(impl_->settings);
        ts->key = t.key;
        ts->dial = t.dial;
        ts->grpc = t.grpc;
        next.emplace(t.key, ts);
        added.push_back(std::move(ts));
      }
    }
    for (auto& [key, ts] : impl_->targets) {
      if (!next.contains(key)) {
        ts->stopped = true;
        removed.push_back(ts);
      }
    }
    impl_->targets.swap(next);
  }
  for (auto& ts : removed) asio::dispatch(impl_->ioc.get_executor(), [ts] { ts->cancel(); });
  for (auto& ts : added) asio::co_spawn(impl_->ioc, impl::run(impl_, ts), log_exception);
}

void checker::mark_down(const std::string& key) {
  std::shared_ptr<target_state> ts;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return;
    if (auto it = impl_->targets.find(key); it != impl_->targets.end()) ts = it->second;
  }
  if (!ts) return;
  asio::dispatch(impl_->ioc.get_executor(), [ts] {
    if (ts->stopped || !ts->sm.up()) return;
    ts->sm.force_down();
    ts->up = false;
    if (ts->timer) ts->timer->cancel();  // the next check now, not after `interval`
  });
}

void checker::stop() {
  std::map<std::string, std::shared_ptr<target_state>> targets;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
    targets.swap(impl_->targets);
  }
  for (auto& [key, ts] : targets) ts->stopped = true;
  asio::dispatch(impl_->ioc.get_executor(), [targets = std::move(targets)] {
    for (auto& [key, ts] : targets) ts->cancel();
  });
}

bool checker::is_up(const std::string& key) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->targets.find(key);
  return it != impl_->targets.end() && it->second->up;
}

std::vector<std::string> checker::down_keys() const {
  std::vector<std::string> keys;
  std::lock_guard lock(impl_->mu);
  for (const auto& [key, ts] : impl_->targets) {
    if (!ts->up) keys.push_back(key);
  }
  return keys;
}

}  // namespace ingressd::health
