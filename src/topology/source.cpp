// Topology sources: file polling and HTTP polling (topology URL / Ray dashboard).
#include "ingressd/core/scope.hpp"
#include "ingressd/topology/source.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <variant>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <spdlog/spdlog.h>

namespace ingressd::topology {

namespace beast = boost::beast;
namespace http = beast::http;

source::~source() = default;

// ---------------------------------------------------------------------------------------------
// Helpers

std::optional<http_url> parse_http_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (url.size() < scheme.size()) return std::nullopt;
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(url[i])) != scheme[i]) return std::nullopt;
  }
  std::string_view rest = url.substr(scheme.size());
  if (auto hash = rest.find('#'); hash != std::string_view::npos) rest = rest.substr(0, hash);
  const auto end = rest.find_first_of("/?");
  const std::string_view authority = rest.substr(0, end);
  std::string_view target = end == std::string_view::npos ? std::string_view{} : rest.substr(end);
  if (authority.empty() || authority.find('@') != std::string_view::npos) return std::nullopt;
  for (char c : authority) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) return std::nullopt;
  }

  http_url out;
  out.authority = std::string(authority);
  std::string_view host;
  std::string_view port;
  if (authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos || close == 1) return std::nullopt;
    host = authority.substr(1, close - 1);
    const auto after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return std::nullopt;
      port = after.substr(1);
      if (port.empty()) return std::nullopt;
    }
  } else {
    const auto colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return std::nullopt;
    }
  }
  if (host.empty()) return std::nullopt;
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::nullopt;
    }
    const unsigned long value = std::stoul(std::string(port));
    if (value == 0 || value > 65535) return std::nullopt;
    out.port = static_cast<std::uint16_t>(value);
  }
  out.host = std::string(host);
  if (target.empty()) {
    out.target = "/";
  } else if (target.front() == '?') {
    out.target = "/" + std::string(target);
  } else {
    out.target = std::string(target);
  }
  for (char c : out.target) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) return std::nullopt;
  }
  return out;
}

std::string dashboard_applications_url(std::string_view dashboard_url) {
  std::string base(dashboard_url);
  if (auto hash = base.find('#'); hash != std::string::npos) base.resize(hash);
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/api/serve/applications/";
}

duration poll_backoff(duration poll_interval, unsigned consecutive_failures) {
  const duration cap = std::max(max_poll_backoff, poll_interval);
  if (poll_interval.count() <= 0) return consecutive_failures == 0 ? poll_interval : std::min(duration{100}, cap);
  duration d = poll_interval;
  for (unsigned i = 1; i < consecutive_failures && d < cap; ++i) d *= 2;
  return std::min(d, cap);
}

std::optional<std::string> local_address_towards(const std::string& host, std::uint16_t port) {
  asio::io_context ioc;
  error_code ec;
  std::vector<asio::ip::address> candidates;
  if (auto address = asio::ip::make_address(host, ec); !ec) {
    candidates.push_back(address);
  } else {
    tcp::resolver resolver(ioc);
    auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec) return std::nullopt;
    for (const auto& entry : results) candidates.push_back(entry.endpoint().address());
  }
  for (const auto& address : candidates) {
    // A connected UDP socket sends nothing; the kernel only picks the route and source address.
    asio::ip::udp::socket socket(ioc);
    socket.open(address.is_v4() ? asio::ip::udp::v4() : asio::ip::udp::v6(), ec);
    if (ec) continue;
    socket.connect({address, port}, ec);
    if (ec) continue;
    auto local = socket.local_endpoint(ec);
    if (!ec) return local.address().to_string();
  }
  return std::nullopt;
}

namespace {


void log_exception(const char* what, std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    spdlog::error("topology: {} loop ended by an exception: {}", what, x.what());
  } catch (...) {
    spdlog::error("topology: {} loop ended by an unknown exception", what);
  }
}

/// What the sources share: callbacks, the last delivered document and the stop flag.
struct common_state {
  common_state(asio::io_context& i, source_callbacks c, std::string d)
      : ioc(i), callbacks(std::move(c)), description(std::move(d)) {}

  asio::io_context& ioc;
  const source_callbacks callbacks;
  const std::string description;
  std::optional<document> last;  // io thread only
  std::atomic<bool> started{false};
  std::atomic<bool> stopped{false};

  void deliver(document doc) {
    if (last && *last == doc) return;
    last = doc;
    if (!stopped && callbacks.on_document) callbacks.on_document(std::move(doc));
  }
  void report(std::string message) {
    if (!stopped && callbacks.on_error) callbacks.on_error(std::move(message));
  }
  void confirm() {
    if (!stopped && callbacks.on_current) callbacks.on_current();
  }
};

// ---------------------------------------------------------------------------------------------
// File source

struct file_identity {
  bool exists = false;
  int error = 0;
  std::uint64_t dev = 0;
  std::uint64_t ino = 0;
  std::int64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  bool operator==(const file_identity&) const = default;
};

file_identity identify(const std::string& path) {
  struct stat st {};
  file_identity id;
  if (::stat(path.c_str(), &st) != 0) {
    id.error = errno;
    return id;
  }
  id.exists = true;
  id.dev = static_cast<std::uint64_t>(st.st_dev);
  id.ino = static_cast<std::uint64_t>(st.st_ino);
  id.size = static_cast<std::int64_t>(st.st_size);
  id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  id.ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
  return id;
}

/// Reads and parses the file: the document, or an error message naming the file.
std::variant<document, std::string> load_file(const std::string& path, const file_identity& id) {
  const std::string prefix = "topology file " + path + ": ";
  if (!id.exists) return prefix + "cannot stat: " + std::strerror(id.error);
  if (static_cast<std::uint64_t>(id.size) > max_document_bytes) {
    return prefix + "larger than " + format_size(max_document_bytes);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return prefix + "cannot open: " + std::strerror(errno);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return prefix + "read error";
  auto parsed = parse_document(text.str());
  if (auto* err = std::get_if<parse_error>(&parsed)) return prefix + err->message;
  return std::get<document>(std::move(parsed));
}

struct file_state : common_state {
  file_state(asio::io_context& i, std::string p, source_callbacks c, std::optional<document> initial)
      : common_state(i, std::move(c), "topology file " + p), path(std::move(p)) {
    last = std::move(initial);
    silent_baseline = !last.has_value();
  }

  const std::string path;
  bool silent_baseline;                 // io thread only: the first check sets `last` silently
  std::optional<file_identity> seen;    // io thread only: identity last read
  bool unconfirmed_failure = false;     // io thread only: `seen` failed once, not yet reported
  bool seen_valid = false;              // io thread only: `seen` held a valid document
  asio::steady_timer* timer = nullptr;  // io thread only

  void cancel() {
    if (timer) timer->cancel();
  }

  void check() {
    const auto id = identify(path);
    const bool changed = !seen || *seen != id;
    if (!changed && !unconfirmed_failure) {
      // The file is as last read: still current if that read was valid, still failing if not.
      if (seen_valid) confirm();
      return;
    }
    // A failure is reported only when the file still looks the same one poll later (re-read
    // then, in case it changed within the timestamp granularity): a writer caught mid-write is
    // not an error.
    const bool confirming = !changed;
    const bool first = !seen.has_value();
    seen = id;
    unconfirmed_failure = false;
    auto result = load_file(path, id);
    seen_valid = std::holds_alternative<document>(result);
    if (auto* message = std::get_if<std::string>(&result)) {
      if (first) silent_baseline = false;  // the caller could not have this content either
      if (confirming) {
        report(std::move(*message));
      } else {
        unconfirmed_failure = true;
      }
      return;
    }
    auto& doc = std::get<document>(result);
    if (silent_baseline) {
      silent_baseline = false;
      last = std::move(doc);
    } else {
      deliver(std::move(doc));
    }
    confirm();
  }

  static awaitable<void> run(std::shared_ptr<file_state> s) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    registration<asio::steady_timer> reg(s->timer, timer);
    while (!s->stopped) {
      s->check();
      timer.expires_after(file_poll_interval);
      co_await timer.async_wait(nothrow);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// HTTP source

struct fetch_result {
  bool ok = false;
  std::string text;  // the body, or why the fetch failed
};

struct http_state : common_state {
  http_state(asio::io_context& i, std::string u, std::string label, duration poll, duration t, source_callbacks c)
      : common_state(i, std::move(c), label + " " + u),
        url(std::move(u)),
        parsed(parse_http_url(url)),
        poll_interval(poll),
        timeout(t) {}

  const std::string url;
  const std::optional<http_url> parsed;
  const duration poll_interval;
  const duration timeout;
  // io thread only, set while the objects exist in the polling coroutine's frames:
  asio::steady_timer* timer = nullptr;
  asio::steady_timer* deadline = nullptr;
  tcp::resolver* resolver = nullptr;
  beast::tcp_stream* stream = nullptr;

  void cancel() {
    if (timer) timer->cancel();
    if (deadline) deadline->cancel();
    if (resolver) resolver->cancel();
    if (stream) {
      error_code ignored;
      stream->socket().close(ignored);
    }
  }

  std::string describe_error(const char* phase, const error_code& ec) const {
    if (ec == beast::error::timeout) return std::string(phase) + ": timed out after " + format_duration(timeout);
    if (ec == http::error::body_limit) return "response body larger than " + format_size(max_document_bytes);
    return std::string(phase) + ": " + ec.message();
  }

  /// One GET with one deadline for resolve + connect + request + whole response.
  awaitable<fetch_result> fetch() {
    if (!parsed) co_return fetch_result{false, "not a valid http:// URL"};
    const auto ex = co_await asio::this_coro::executor;
    const auto deadline_at = asio::steady_timer::clock_type::now() + timeout;

    std::vector<tcp::endpoint> endpoints;
    error_code ec;
    const auto address = asio::ip::make_address(parsed->host, ec);
    if (!ec) {
      endpoints.emplace_back(address, parsed->port);
    } else {
      using namespace asio::experimental::awaitable_operators;
      tcp::resolver res(ex);
      registration<tcp::resolver> r1(resolver, res);
      asio::steady_timer limit(ex);
      registration<asio::steady_timer> r2(deadline, limit);
      limit.expires_at(deadline_at);
      auto outcome = co_await (res.async_resolve(parsed->host, std::to_string(parsed->port), nothrow) ||
                               limit.async_wait(nothrow));
      if (outcome.index() == 1) {
        co_return fetch_result{false, "resolve " + parsed->host + ": timed out after " + format_duration(timeout)};
      }
      auto& [rec, results] = std::get<0>(outcome);
      if (rec) co_return fetch_result{false, "resolve " + parsed->host + ": " + rec.message()};
      for (const auto& entry : results) endpoints.push_back(entry.endpoint());
      if (endpoints.empty()) co_return fetch_result{false, "resolve " + parsed->host + ": no addresses"};
    }
    if (stopped) co_return fetch_result{false, "stopped"};

    beast::tcp_stream conn(ex);
    registration<beast::tcp_stream> r3(stream, conn);
    conn.expires_at(deadline_at);
    // The condition stops the walk over several addresses once stop() closed the socket.
    auto [cec, cep] = co_await conn.async_connect(
        endpoints, [this](const error_code&, const tcp::endpoint&) { return !stopped.load(); }, nothrow);
    if (cec) co_return fetch_result{false, describe_error("connect", cec)};

    http::request<http::empty_body> req{http::verb::get, parsed->target, 11};
    req.set(http::field::host, parsed->authority);
    req.set(http::field::user_agent, "ingressd/" INGRESSD_VERSION);
    req.set(http::field::accept, "application/json, application/yaml;q=0.9, */*;q=0.5");
    req.set(http::field::connection, "close");
    auto [wec, wn] = co_await http::async_write(conn, req, nothrow);
    if (wec) co_return fetch_result{false, describe_error("send", wec)};

    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(max_document_bytes);
    auto [rec, rn] = co_await http::async_read(conn, buffer, parser, nothrow);
    if (rec) co_return fetch_result{false, describe_error("read", rec)};
    error_code ignored;
    conn.socket().shutdown(tcp::socket::shutdown_both, ignored);
    conn.socket().close(ignored);

    auto& res = parser.get();
    if (res.result_int() != 200) {
      std::string message = "HTTP " + std::to_string(res.result_int());
      if (!res.reason().empty()) message += " " + std::string(res.reason());
      co_return fetch_result{false, std::move(message)};
    }
    co_return fetch_result{true, std::move(res.body())};
  }

  static awaitable<void> run(std::shared_ptr<http_state> s) {
    asio::steady_timer wait(co_await asio::this_coro::executor);
    registration<asio::steady_timer> reg(s->timer, wait);
    unsigned failures = 0;
    while (!s->stopped) {
      auto result = co_await s->fetch();
      if (s->stopped) break;
      std::optional<std::string> error;
      if (!result.ok) {
        error = "GET " + s->url + ": " + result.text;
      } else {
        auto parsed = parse_document(result.text);
        if (auto* err = std::get_if<parse_error>(&parsed)) {
          error = s->url + ": " + err->message;
        } else {
          failures = 0;
          s->deliver(std::get<document>(std::move(parsed)));
          s->confirm();
        }
      }
      if (error) {
        ++failures;
        s->report(std::move(*error));
      }
      if (s->stopped) break;
      wait.expires_after(poll_backoff(s->poll_interval, failures));
      co_await wait.async_wait(nothrow);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The source objects

template <class State>
class polling_source final : public source {
 public:
  explicit polling_source(std::shared_ptr<State> state) : state_(std::move(state)) {}
  ~polling_source() override { stop(); }

  void start() override {
    if (state_->stopped || state_->started.exchange(true)) return;
    asio::co_spawn(state_->ioc, State::run(state_),
                   [what = state_->description](std::exception_ptr e) { log_exception(what.c_str(), e); });
  }

  void stop() override {
    if (state_->stopped.exchange(true)) return;
    if (!state_->started) return;  // nothing runs on the io_context
    asio::dispatch(state_->ioc.get_executor(), [s = state_] { s->cancel(); });
  }

  std::string describe() const override { return state_->description; }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace

std::unique_ptr<source> make_file_source(asio::io_context& ioc, std::string path, source_callbacks callbacks,
                                         std::optional<document> initial) {
  return std::make_unique<polling_source<file_state>>(
      std::make_shared<file_state>(ioc, std::move(path), std::move(callbacks), std::move(initial)));
}

std::unique_ptr<source> make_http_source(asio::io_context& ioc, std::string url, duration poll_interval,
                                         duration timeout, source_callbacks callbacks) {
  return std::make_unique<polling_source<http_state>>(std::make_shared<http_state>(
      ioc, std::move(url), "topology URL", poll_interval, timeout, std::move(callbacks)));
}

std::unique_ptr<source> make_dashboard_source(asio::io_context& ioc, std::string dashboard_url,
                                              duration poll_interval, duration timeout,
                                              source_callbacks callbacks) {
  return std::make_unique<polling_source<http_state>>(
      std::make_shared<http_state>(ioc, dashboard_applications_url(dashboard_url), "Ray dashboard",
                                   poll_interval, timeout, std::move(callbacks)));
}

}  // namespace ingressd::topology
