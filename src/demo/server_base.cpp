#include "ingressd/demo/server_base.hpp"

#include <array>
#include <exception>
#include <tuple>

#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/http/list.hpp"

namespace ingressd::demo {
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

constexpr std::size_t read_chunk = 64 * 1024;
// Generous: the servers must accept whatever the proxy forwards, which it caps itself.
constexpr std::uint32_t header_limit = 1024 * 1024;
// A stop() that cannot finish the loops gracefully (a bug) still returns after this.
constexpr auto stop_grace = std::chrono::seconds(2);

auto log_errors(std::string who) {
  return [who = std::move(who)](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::error("{}: {}", who, ex.what());
    }
  };
}

}  // namespace

// --- recorded_request --------------------------------------------------------------------------

std::optional<std::string> find_header(const header_list& headers, std::string_view name) {
  for (const auto& [n, v] : headers)
    if (beast::iequals(n, name)) return v;
  return std::nullopt;
}

std::size_t count_header(const header_list& headers, std::string_view name) {
  std::size_t count = 0;
  for (const auto& h : headers)
    if (beast::iequals(h.first, name)) ++count;
  return count;
}

std::optional<std::string> recorded_request::header(std::string_view name) const {
  return find_header(headers, name);
}

std::size_t recorded_request::header_count(std::string_view name) const { return count_header(headers, name); }

std::string recorded_request::path() const { return target.substr(0, target.find('?')); }

// --- response helpers --------------------------------------------------------------------------

std::string format_response(unsigned status, const header_list& headers, std::string_view body,
                            bool keep_alive, bool head_only) {
  auto reason = http::obsolete_reason(static_cast<http::status>(status));
  if (reason.empty() || reason.front() == '<') reason = "Unknown";
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
  bool framed = false;
  bool has_connection = false;
  for (const auto& [name, value] : headers) {
    out += name + ": " + value + "\r\n";
    if (beast::iequals(name, "content-length") || beast::iequals(name, "transfer-encoding"))
      framed = true;
    if (beast::iequals(name, "connection")) has_connection = true;
  }
  bool bodiless_status = status < 200 || status == 204 || status == 304;
  if (!framed && !bodiless_status) out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (!keep_alive && !has_connection) out += "Connection: close\r\n";
  out += "\r\n";
  if (!head_only) out += body;
  return out;
}

header_list parse_head_fields(std::string_view raw) {
  header_list out;
  if (auto end = raw.find("\r\n\r\n"); end != std::string_view::npos) raw = raw.substr(0, end + 2);
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  bool start_line = true;
  while (!raw.empty()) {
    auto eol = raw.find("\r\n");
    auto line = raw.substr(0, eol);
    raw = eol == std::string_view::npos ? std::string_view{} : raw.substr(eol + 2);
    if (start_line) {
      start_line = false;
      continue;
    }
    if (line.empty()) break;
    if ((line.front() == ' ' || line.front() == '\t') && !out.empty()) {  // obs-fold continuation
      out.back().second += ' ';
      out.back().second.append(trim(line));
      continue;
    }
    auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    out.emplace_back(std::string(line.substr(0, colon)), std::string(trim(line.substr(colon + 1))));
  }
  return out;
}

bool wants_close(const header_list& headers) {
  for (const auto& [name, value] : headers)
    if (beast::iequals(name, "connection") && ingressd::http::list_contains(value, "close")) return true;
  return false;
}

// --- exchange ----------------------------------------------------------------------------------

bool exchange::stopping() const { return server_.stopping_; }

awaitable<bool> exchange::write(std::string_view bytes) {
  if (peer_gone_ || server_.stopping_) co_return false;
  auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(bytes.data(), bytes.size()), nothrow);
  if (!ec) co_return true;
  if (!server_.stopping_ && !peer_gone_) {
    peer_gone_ = true;
    server_.note_peer_gone(true);
  }
  co_return false;
}

awaitable<bool> exchange::wait(clock::duration d) {
  const auto deadline = clock::now() + d;
  for (;;) {
    if (peer_gone_ || server_.stopping_) co_return false;
    if (clock::now() >= deadline) co_return true;
    asio::steady_timer timer(socket_.get_executor(), deadline);
    // Race the timer against a read so that a peer closing mid-wait is seen at once. Both results
    // come back (not just the winner's), so pipelined bytes read by a losing read are not lost.
    auto [order, timer_ec, read_ec, n] =
        co_await asio::experimental::make_parallel_group(
            timer.async_wait(asio::deferred),
            socket_.async_read_some(buffer_.prepare(read_chunk), asio::deferred))
            .async_wait(asio::experimental::wait_for_one(), use_awaitable);
    (void)order;
    (void)timer_ec;
    if (n > 0) buffer_.commit(n);
    if (read_ec && read_ec != asio::error::operation_aborted) {
      if (!server_.stopping_) {
        peer_gone_ = true;
        server_.note_peer_gone(true);
      }
      co_return false;
    }
  }
}

awaitable<void> exchange::wait_for_peer_close() {
  while (!peer_gone_ && !server_.stopping_) {
    auto [ec, n] = co_await socket_.async_read_some(buffer_.prepare(read_chunk), nothrow);
    if (n > 0) buffer_.commit(n);
    if (ec) {
      if (!server_.stopping_) {
        peer_gone_ = true;
        server_.note_peer_gone(true);
      }
      co_return;
    }
  }
}

void exchange::close() {
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
}

void exchange::reset() {
  error_code ec;
  socket_.set_option(asio::socket_base::linger(true, 0), ec);
  socket_.close(ec);
}

// --- server_base -------------------------------------------------------------------------------

server_base::server_base(std::string bind_ip, std::uint16_t port, std::string log_name)
    : bind_ip_(std::move(bind_ip)),
      log_name_(std::move(log_name)),
      ioc_(std::make_unique<asio::io_context>(1)),
      acceptor_(std::make_unique<tcp::acceptor>(*ioc_)) {
  tcp::endpoint ep(asio::ip::make_address(bind_ip_), port);
  acceptor_->open(ep.protocol());
  // Lets a test restart a server on the port of one it just stopped (TIME_WAIT leftovers).
  acceptor_->set_option(asio::socket_base::reuse_address(true));
  acceptor_->bind(ep);
  acceptor_->listen();
  port_ = acceptor_->local_endpoint().port();
}

server_base::~server_base() { stop(); }

tcp::endpoint server_base::endpoint() const { return {asio::ip::make_address(bind_ip_), port_}; }

void server_base::start() {
  std::promise<void> finished;
  finished_ = finished.get_future();
  asio::co_spawn(*ioc_, accept_loop(), log_errors(log_name_));
  thread_ = std::thread([this, finished = std::move(finished)]() mutable {
    try {
      ioc_->run();
    } catch (const std::exception& e) {
      spdlog::error("{}: I/O thread: {}", log_name_, e.what());
    }
    finished.set_value();
  });
}

void server_base::stop() {
  std::call_once(stop_once_, [this] {
    if (thread_.joinable()) {
      asio::post(*ioc_, [this] {
        stopping_ = true;
        error_code ec;
        acceptor_->close(ec);
        for (auto& [id, socket] : open_) socket->close(ec);
      });
      // Closing every socket ends every loop; the fallback only guards against a handler bug.
      if (finished_.wait_for(stop_grace) != std::future_status::ready) {
        spdlog::warn("{}: connection loops did not end after stop; forcing", log_name_);
        ioc_->stop();
      }
      thread_.join();
    }
    acceptor_.reset();
    ioc_.reset();
  });
}

awaitable<void> server_base::accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_->async_accept(nothrow);
    if (stopping_) co_return;
    if (ec) {
      if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor) co_return;
      // E.g. EMFILE: back off instead of spinning.
      spdlog::warn("{}: accept: {}", log_name_, ec.message());
      asio::steady_timer t(*ioc_, std::chrono::milliseconds(10));
      co_await t.async_wait(nothrow);
      continue;
    }
    const auto id = ++next_id_;
    {
      std::lock_guard lock(mu_);
      ++accepted_;
      ++open_count_;
    }
    cv_.notify_all();
    asio::co_spawn(*ioc_, serve(std::move(socket), id), log_errors(log_name_));
  }
}

void server_base::note_peer_gone(bool mid_response) {
  {
    std::lock_guard lock(mu_);
    ++disconnects_;
    if (mid_response) ++aborted_;
  }
  cv_.notify_all();
}

awaitable<void> server_base::serve(tcp::socket socket, std::uint64_t id) {
  // Unregisters on every exit, including frame destruction when stop() has to force the loop.
  struct registration {
    server_base& server;
    std::uint64_t id;
    ~registration() {
      server.open_.erase(id);
      {
        std::lock_guard lock(server.mu_);
        --server.open_count_;
      }
      server.cv_.notify_all();
    }
  } reg{*this, id};
  if (stopping_) co_return;  // stop() ran between accept and this coroutine's first step
  open_[id] = &socket;

  error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  const auto remote = socket.remote_endpoint(ec);
  beast::flat_buffer buffer;

  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(header_limit);
    parser.body_limit(boost::none);
    parser.eager(true);
    recorded_request rec;
    bool head_seen = false;

    // Feed the parser by hand rather than with http::async_read so that the exact bytes of each
    // request are known (recorded_request::raw) and leftovers stay buffered for the next one.
    for (;;) {
      if (buffer.size() > 0) {
        error_code pec;
        const auto n = parser.put(buffer.data(), pec);
        rec.raw.append(static_cast<const char*>(buffer.data().data()), n);
        buffer.consume(n);
        if (pec == http::error::need_more) pec = {};
        if (pec) {
          auto reply = format_response(400, {{"Content-Type", "text/plain"}}, "Bad Request: " + pec.message(), false);
          co_await asio::async_write(socket, asio::buffer(reply), nothrow);
          socket.shutdown(tcp::socket::shutdown_both, ec);
          socket.close(ec);
          co_return;
        }
        if (!head_seen && parser.is_header_done()) {
          head_seen = true;
          rec.head_at = clock::now();
          auto expect = parser.get()[http::field::expect];
          if (!parser.is_done() && beast::iequals(expect, "100-continue")) {
            static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
            auto [wec, wn] = co_await asio::async_write(socket, asio::buffer(cont.data(), cont.size()), nothrow);
            if (wec) {
              if (!stopping_) note_peer_gone(false);
              co_return;
            }
          }
        }
        if (parser.is_done()) break;
        if (n > 0 && buffer.size() > 0) continue;
      }
      auto [rec_ec, n] = co_await socket.async_read_some(buffer.prepare(read_chunk), nothrow);
      if (n > 0) buffer.commit(n);
      if (rec_ec) {
        if (!stopping_) note_peer_gone(false);
        co_return;
      }
    }

    auto& msg = parser.get();
    rec.method = std::string(msg.method_string());
    rec.target = std::string(msg.target());
    rec.version = msg.version();
    rec.headers = parse_head_fields(rec.raw);
    rec.body = std::move(msg.body());
    rec.keep_alive = msg.keep_alive();
    rec.peer_ip = remote.address().to_string();
    rec.peer_port = remote.port();
    rec.connection_id = id;
    rec.completed_at = clock::now();
    {
      std::lock_guard lock(mu_);
      if (is_probe(rec))
        ++probes_;
      else {
        requests_.push_back(rec);
        ++recorded_;
        while (requests_.size() > record_limit_) requests_.pop_front();
      }
    }
    cv_.notify_all();

    exchange ex(*this, socket, buffer, rec);
    const auto outcome = co_await handle(ex);
    if (ex.peer_gone() || stopping_ || outcome == after_reply::done) co_return;
    if (outcome == after_reply::close || !rec.keep_alive) {
      socket.shutdown(tcp::socket::shutdown_send, ec);
      socket.close(ec);
      co_return;
    }
  }
}

std::vector<recorded_request> server_base::requests() const {
  std::lock_guard lock(mu_);
  return {requests_.begin(), requests_.end()};
}

std::size_t server_base::request_count() const {
  std::lock_guard lock(mu_);
  return recorded_;
}

void server_base::set_record_limit(std::size_t n) {
  std::lock_guard lock(mu_);
  record_limit_ = n;
  while (requests_.size() > record_limit_) requests_.pop_front();
}

std::size_t server_base::record_limit() const {
  std::lock_guard lock(mu_);
  return record_limit_;
}

std::size_t server_base::probe_count() const {
  std::lock_guard lock(mu_);
  return probes_;
}

void server_base::clear_requests() {
  std::lock_guard lock(mu_);
  requests_.clear();
  recorded_ = 0;
}

std::size_t server_base::connections_accepted() const {
  std::lock_guard lock(mu_);
  return accepted_;
}

std::size_t server_base::connections_open() const {
  std::lock_guard lock(mu_);
  return open_count_;
}

std::size_t server_base::disconnects() const {
  std::lock_guard lock(mu_);
  return disconnects_;
}

std::size_t server_base::aborted_responses() const {
  std::lock_guard lock(mu_);
  return aborted_;
}

bool server_base::wait_for(const std::function<bool()>& pred, clock::duration timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, pred);
}

bool server_base::wait_for_requests(std::size_t n, clock::duration timeout) const {
  return wait_for([&] { return recorded_ >= n; }, timeout);
}

bool server_base::wait_for_connections(std::size_t n, clock::duration timeout) const {
  return wait_for([&] { return accepted_ >= n; }, timeout);
}

bool server_base::wait_for_disconnects(std::size_t n, clock::duration timeout) const {
  return wait_for([&] { return disconnects_ >= n; }, timeout);
}

bool server_base::wait_for_aborted_responses(std::size_t n, clock::duration timeout) const {
  return wait_for([&] { return aborted_ >= n; }, timeout);
}

}  // namespace ingressd::demo
