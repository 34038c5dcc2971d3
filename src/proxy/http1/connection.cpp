#include "proxy/http1/connection.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
#include <span>
#include <tuple>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/container/small_vector.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/core/scope.hpp"
#include "ingressd/core/socket_io.hpp"
#include "ingressd/http/parse_now.hpp"
#include "ingressd/http/forwarded.hpp"
#include "ingressd/http/message.hpp"
#include "ingressd/http/validate.hpp"
#include "ingressd/routing/route_table.hpp"
#include "proxy/http1/exchange.hpp"
#include "proxy/http1/parts.hpp"

namespace ingressd::server {

namespace beast = boost::beast;
using http::iequals;

connection::connection(worker& w, client_socket sock, SSL_CTX* tls, std::optional<tcp::endpoint> client)
    : w_(w), cfg_(w.cfg_ptr()), sock_(std::move(sock)), timer_(w.ioc()) {
  error_code ec;
  auto ep = client ? *client : sock_.remote_endpoint(ec);
  if (!ec) {
    peer_addr_ = net::unmapped(ep.address());
    peer_ = peer_addr_.to_string();
  }
  sock_.set_option(tcp::no_delay(true), ec);
  w_.stats().active_connections.add();
  if (tls) {
    // OpenSSL reads and writes the descriptor itself: it must never block the worker (Asio makes
    // a socket non-blocking only once it runs an operation on it).
    sock_.non_blocking(true, ec);
    tls_ = std::make_unique<tls::stream>(sock_, tls);
    w_.stats().tls_connections.add();
  }
}

connection::~connection() {
  // Idle memory accounting lives with the worker; nothing else to release here.
  w_.stats().active_connections.sub();
  if (handed_over_) return;  // the gRPC connection counts it (and its TLS) from now on
  if (tls_) w_.stats().tls_connections.sub();
  w_.shared().connections.fetch_sub(1, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Watchdog

void connection::arm(clock::duration d, phase p) {
  deadline_ = clock::now() + d;
  phase_ = p;
  timed_out_ = phase::none;
  if (waits_ > 0 && timer_.expiry() <= deadline_) return;  // fires earlier and re-arms itself
  timer_.expires_at(deadline_);
  start_wait();
}

void connection::start_wait() {
  ++waits_;
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    --self->waits_;
    if (!ec) self->on_deadline();
  });
}

void connection::on_deadline() {
  if (deadline_ == clock::time_point::max()) return;
  if (clock::now() < deadline_) {
    if (waits_ == 0) {
      timer_.expires_at(deadline_);
      start_wait();
    }
    return;
  }
  timed_out_ = phase_;
  deadline_ = clock::time_point::max();
  error_code ignored;
  sock_.cancel(ignored);
  if (ex_) ex_->cancel_upstream();
}

// ---------------------------------------------------------------------------------------------
// Client watch

void connection::start_watch() {
  watch_ = watch::on;
  ++watch_gen_;
  if (tls_ && tls_->pending()) {
    asio::post(w_.ioc(), [self = shared_from_this(), gen = watch_gen_] { self->on_watch({}, gen); });
    return;
  }
  arm_watch();
}

void connection::arm_watch() {
  sock_.async_wait(tcp::socket::wait_read,
                   [self = shared_from_this(), gen = watch_gen_](error_code ec) { self->on_watch(ec, gen); });
}

void connection::end_watch(bool keep_alive) {
  if (watch_ != watch::on) return;
  if (keep_alive && buf_.size() == 0) {
    watch_ = watch::parked;
    return;
  }
  // Not awaited: the cancelled wait completes later and finds a newer generation.
  watch_ = watch::off;
  ++watch_gen_;
  error_code ignored;
  sock_.cancel(ignored);
}

void connection::on_watch(error_code ec, unsigned gen) {
  if (gen != watch_gen_) return;  // a watch that was ended
  if (watch_ == watch::parked) {
    // The exchange ended while this wait was pending; it has been the idle wait since.
    watch_ = watch::off;
    on_idle_ready(ec);
    return;
  }
  bool gone = ec && ec != asio::error::operation_aborted;
  if (!ec) {
    // Readable: pipelined bytes (kept for the next request, up to the header limit), or the
    // client closed or reset. Read without blocking until the socket is drained.
    const auto cap = cfg().client.max_header_bytes;
    for (;;) {
      if (buf_.size() >= cap) break;  // full: stop watching, the next request is complete or too large
      auto room = buf_.prepare(std::min<std::size_t>(1024, cap - buf_.size()));
      std::size_t got = 0;
      const auto r = read_client_now(room, got);
      if (r == client_read::data) {
        buf_.commit(got);
        continue;
      }
      if (r == client_read::wait_read) {
        arm_watch();
        return;
      }
      if (r == client_read::wait_write) {  // TLS: OpenSSL must write first (a key update's reply)
        sock_.async_wait(tcp::socket::wait_write,
                         [self = shared_from_this(), gen](error_code e) { self->on_watch(e, gen); });
        return;
      }
      gone = true;  // EOF or an error
      break;
    }
  }
  if (gone) {
    // EOF or reset: the client is gone. Closing the upstream read makes the replica see its
    // connection close, which aborts the generation and frees the GPU (hardening G1).
    client_gone_ = true;
    if (ex_) ex_->cancel_upstream();
  }
  watch_ = watch::off;
}

connection::client_read connection::read_client_now(asio::mutable_buffer room, std::size_t& got) {
  if (tls_) {
    // A readable socket may hold a record without data (a key update, an alert): after
    // want_read OpenSSL has taken what it holds, so waiting on the socket again is right.
    error_code ignored;
    switch (tls_->read_now(room.data(), room.size(), got, ignored)) {
      case tls::stream::io::ok: return client_read::data;
      case tls::stream::io::want_read: return client_read::wait_read;
      case tls::stream::io::want_write: return client_read::wait_write;
      case tls::stream::io::eof: return client_read::eof;
      default: return client_read::error;
    }
  }
  return read_socket_now(sock_.native_handle(), room, got);
}

connection::client_read connection::read_socket_now(int fd, asio::mutable_buffer room, std::size_t& got) {
  for (;;) {
    const auto n = ::recv(fd, room.data(), room.size(), MSG_DONTWAIT);
    if (n > 0) {
      got = static_cast<std::size_t>(n);
      return client_read::data;
    }
    if (n == 0) return client_read::eof;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? client_read::wait_read : client_read::error;
  }
}

bool connection::body_buffered() const {
  if (parser_->is_done()) return true;
  const auto left = parser_->content_length_remaining();
  return left && !parser_->chunked() && *left <= buf_.size();
}

// ---------------------------------------------------------------------------------------------


unsigned char* connection::relay_buffer() {
  if (!rq_->relay) rq_->relay.reset(new unsigned char[relay_size]);
  return rq_->relay.get();
}

void connection::hard_close(client_socket& s) {
  error_code ignored;
  s.set_option(asio::socket_base::linger(true, 0), ignored);
  s.close(ignored);
}

void connection::release_buffers() {
  parser_.reset();
  w_.give_scratch(std::move(rq_));
  buf_.shrink_to_fit();
}

void connection::expire_idle(clock::time_point now, clock::duration keepalive) {
  if (!idle_ || now - idle_since_ < keepalive) return;
  close_if_idle();
}

void connection::close_if_idle() {
  close_after_ = true;
  if (idle_) {
    error_code ignored;
    sock_.cancel(ignored);
  }
}

void connection::abort() {
  aborted_ = true;
  close_after_ = true;
  error_code ignored;
  sock_.close(ignored);
  // The upstream operations end with operation_aborted; the exchange that holds the
  // connections sees aborted_ and resets them.
  if (ex_) ex_->cancel_all();
}

bool connection::method_routed(std::string_view method) const {
  for (const auto& m : cfg().router.methods)
    if (m == method) return true;
  return false;
}

std::string connection::refusal_body(unsigned status, std::string_view why) const {
  // A 413 names the limit the request passed and the key that sets it, so that a client (or its
  // operator) knows what to change.
  if (status == 413)
    return "Content Too Large: the request body is larger than client.max_body_bytes (" +
           std::to_string(cfg().client.max_body_bytes) + " bytes)";
  std::string body(bhttp::obsolete_reason(static_cast<bhttp::status>(status)));
  if (!why.empty()) body.append(": ").append(why);
  return body;
}

awaitable<connection::outcome> connection::body_error(error_code ec) {
  if (aborted_) co_return outcome::close;
  if (timed_out(phase::body))
    co_return co_await respond(http::make_response(408, "text/plain", "Request Timeout", true), true);
  if (ec == asio::error::eof || ec == bhttp::error::partial_message || ec == asio::error::connection_reset)
    co_return outcome::close;  // the client went away mid-upload
  const auto v = http::body_error_verdict(ec);
  co_return co_await respond(http::make_response(v.status, "text/plain", refusal_body(v.status, v.why), true), true);
}

bool connection::body_from_buffer(error_code& ec) {
  return http::body_from_buffer(*parser_, buf_, cfg().client.max_header_bytes, ec);
}

awaitable<error_code> connection::read_body_some() {
  const std::size_t cap = http::body_read_cap(cfg().client.max_header_bytes);  // A10, A11
  for (;;) {
    if (error_code settled; body_from_buffer(settled)) co_return settled;
    // As Beast sizes its reads: what the buffer has room for, 512 bytes to 64 KiB.
    const std::size_t room =
        std::min(cap - buf_.size(), std::clamp<std::size_t>(buf_.capacity() - buf_.size(), 512, 64 * 1024));
    auto [ec, n] = co_await client([&](auto& s) { return s.async_read_some(buf_.prepare(room), nothrow); });
    if (ec == asio::error::eof) {
      parser_->put_eof(ec);  // an unfinished body: partial_message
      co_return ec;
    }
    if (ec) co_return ec;
    buf_.commit(n);
  }
}

awaitable<error_code> connection::read_prebody(std::size_t cap, std::optional<clock::duration> wait) {
  const auto& cfg = this->cfg();
  const auto wait_until = wait ? std::optional(clock::now() + *wait) : std::nullopt;
  while (!parser_->is_done() && rq_->prebody.size() < cap) {
    const std::size_t old = rq_->prebody.size();
    // resize() zero-fills, so grow only by what can arrive in this step: the rest of a known
    // Content-Length, or what is already buffered (Beast parses that before reading more).
    std::size_t room = std::min(cap - old, relay_size);
    if (const auto cl = parser_->content_length_remaining(); cl && !parser_->chunked())
      room = std::min<std::size_t>(room, std::max<std::uint64_t>(*cl, 1));
    else if (buf_.size() > 0)
      room = std::min(room, buf_.size());
    rq_->prebody.resize(old + room);
    auto& body = parser_->get().body();
    body.data = rq_->prebody.data() + old;
    body.size = room;
    // The body of an LLM request nearly always came with the head: read_body_some parses it in
    // place and reads only when that makes no progress.
    if (wait_until && *wait_until - clock::now() < cfg.client.body_timeout) {
      if (clock::now() >= *wait_until) {
        rq_->prebody.resize(old);
        break;  // router.body_wait is over: route on what has arrived
      }
      arm(*wait_until - clock::now(), phase::body_wait);
    } else {
      arm(cfg.client.body_timeout, phase::body);
    }
    error_code ec;
    if (!body_from_buffer(ec)) ec = co_await read_body_some();
    if (ec == bhttp::error::need_buffer) ec = {};
    rq_->prebody.resize(old + room - body.size);
    if (timed_out(phase::body_wait) && !aborted_) break;
    if (ec) co_return ec;
  }
  co_return error_code{};
}

awaitable<bool> connection::write_all(std::string_view data) {
  std::array<asio::const_buffer, 1> out{asio::buffer(data)};
  co_return !(co_await client([&](auto& s) { return send(s, out); }));
}

void connection::choose_request_id() {
  // The client's id is a view into the parsed head, alive for the whole request; a generated one
  // lives in the request scratch: no allocation either way.
  const auto& req = parser_->get();
  if (auto it = req.find("x-request-id"); it != req.end() && !it->value().empty() && it->value().size() <= 200 &&
                                          http::valid_field_value(it->value())) {
    rq_->request_id = std::string_view(it->value().data(), it->value().size());
  } else {
    rq_->generated = w_.next_request_id();
    rq_->request_id = std::string_view(rq_->generated.data(), rq_->generated.size());
  }
  if (logging()) rq_->rec.request_id.assign(rq_->request_id);
}

std::string_view connection::request_id() {
  if (rq_->request_id.empty()) {  // answered before a usable head was read (400, 408, 431, ...)
    rq_->generated = w_.next_request_id();
    rq_->request_id = std::string_view(rq_->generated.data(), rq_->generated.size());
    if (logging()) rq_->rec.request_id.assign(rq_->request_id);
  }
  return rq_->request_id;
}

awaitable<connection::outcome> connection::respond(std::string response, bool close) {
  arm(cfg().client.header_timeout, phase::head);
  // Every response carries the request's id, the ones ingressd generates included (contract §9):
  // a client that reports a failure can name it.
  http::insert_field(response, "X-Request-Id", request_id());
  bool ok = co_await write_all(response);
  note_response(response, ok);
  co_return (ok && !close) ? outcome::keep_alive : outcome::close;
}

awaitable<connection::outcome> connection::respond_reason(reason r, bool close, std::string_view path,
                                                     std::string_view detail) {
  bool head_only = parser_ && parser_->get().method() == bhttp::verb::head;
  rq_->rec.why = r;
  co_return co_await respond(http::make_reason_response(r, close, 11, head_only, path, detail), close);
}

// ---------------------------------------------------------------------------------------------
// The client behind trusted proxies

void connection::collect_forwarded(std::string_view name, std::string_view value, std::string& chain,
                                std::string_view& proto) {
  if (iequals(name, "x-forwarded-for")) {
    // Several lines are one list (RFC 9110 §5.3).
    if (!chain.empty()) chain.push_back(',');
    chain.append(value);
  } else if (iequals(name, "x-forwarded-proto")) {
    proto = value;
  }
}

void connection::forwarded_chain_refused(std::string_view chain) {
  w_.stats().forwarded_chain_errors.add();
  spdlog::warn("X-Forwarded-For from trusted proxy {} is not a list of addresses, ignored: {}", peer_,
               chain.substr(0, 256));
}

bool connection::peer_trusted() const {
  const auto& trusted = cfg().client.trusted_proxies;
  return !trusted.empty() && net::any_contains(trusted, peer_addr_);
}

std::string connection::client_ip() const {
  if (!cfg_ || !parser_ || !peer_trusted()) return peer_;
  const auto& trusted = cfg().client.trusted_proxies;
  std::string chain;
  std::string_view proto;
  for (const auto& f : parser_->get()) collect_forwarded(f.name_string(), f.value(), chain, proto);
  return http::evaluate_forwarded(chain, proto, peer_addr_, peer_, trusted).client_ip;
}

// ---------------------------------------------------------------------------------------------

void connection::start() {
  if (!tls_) {
    wait_idle();
    return;
  }
  arm(cfg().tls.handshake_timeout, phase::handshake);
  handshake_step();
}

void connection::handshake_step() {
  error_code ec;
  switch (const auto r = tls_->handshake_now(ec)) {
    case tls::stream::io::ok:
      w_.stats().tls_handshakes.add();
      if (tls_->resumed()) w_.stats().tls_resumed.add();
      if (tls_->alpn() == "h2") {
        // ALPN chose h2 (a gRPC client; tls/context.cpp): the gRPC listener's code serves the
        // connection from here on, and this connection ends.
        disarm();
        handed_over_ = true;
        w_.hand_to_grpc(std::move(sock_), std::move(tls_), peer_);
        return;
      }
      wait_idle();  // disarms the handshake deadline
      return;
    case tls::stream::io::want_read:
    case tls::stream::io::want_write: {
      const auto wait = r == tls::stream::io::want_write ? tcp::socket::wait_write : tcp::socket::wait_read;
      sock_.async_wait(wait, [self = shared_from_this()](error_code e) {
        if (!e && !self->aborted_) return self->handshake_step();
        self->handshake_failed(self->timed_out(phase::handshake) ? tls::handshake_failure::timeout
                                                                 : tls::handshake_failure::peer_closed);
      });
      return;
    }
    default:
      handshake_failed(tls_->failure());
  }
}

void connection::handshake_failed(tls::handshake_failure why) {
  if (aborted_) {
    close_now();
    return;
  }
  w_.stats().tls_failures[static_cast<std::size_t>(why)].add();
  spdlog::debug("TLS handshake with {} failed: {}", peer_, tls::to_string(why));
  if (why == tls::handshake_failure::http_request) {
    // Plain HTTP on the HTTPS port: say so in plain HTTP, as nginx does, instead of a bare close
    // the client cannot explain. One non-blocking send (the socket is fresh: it takes it).
    static const std::string response = http::make_response(
        400, "text/plain", "Bad Request: plain HTTP was sent to the HTTPS port (tls.listen)", true);
    [[maybe_unused]] const auto n = ::send(sock_.native_handle(), response.data(), response.size(),
                                           MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  close_now();  // (no close_notify: the handshake did not finish)
}

void connection::wait_idle() {
  // Idle between requests: no coroutine frame, no buffers, no request scratch (hardening H3) —
  // only this wait and the keep-alive deadline. The next request starts a new coroutine.
  // The keep-alive deadline is enforced by the worker's idle sweep (expire_idle), so an idle
  // connection holds no pending timer operation either.
  idle_ = true;
  idle_since_ = clock::now();
  // Nor a config: a generation replaced by SIGHUP is freed when the last request under it
  // ends, not when some keep-alive connection that once served one closes (hardening I3).
  cfg_.reset();
  disarm();
  if (waits_ > 0) timer_.cancel();
  if (watch_ == watch::parked) return;  // the last request's watch is still waiting: it serves as this wait
  when_readable([self = shared_from_this()](error_code ec) { self->on_idle_ready(ec); });
}

template <class Handler>
void connection::when_readable(Handler&& h) {
  if (tls_ && tls_->pending()) {
    asio::post(w_.ioc(), [h = std::forward<Handler>(h)]() mutable { h(error_code{}); });
    return;
  }
  sock_.async_wait(tcp::socket::wait_read, std::forward<Handler>(h));
}

void connection::on_idle_ready(error_code ec) {
  idle_ = false;
  if (ec || close_after_ || aborted_ || !sock_.is_open()) {
    close_now();  // idle timeout, drain or error: close quietly
    return;
  }
  // The request runs with the config in force when it started, even across a SIGHUP reload.
  cfg_ = w_.cfg_ptr();
  asio::co_spawn(w_.ioc(), serve(), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::error("connection failed: {}", ex.what());
    }
  });
}

awaitable<void> connection::serve() {
  auto self = shared_from_this();
  while (!aborted_) {
    const auto o = co_await serve_one();
    finish_request();
    if (o == outcome::close) break;
    if (buf_.size() == 0) {
      release_buffers();
      if (close_after_) break;
      wait_idle();  // completes only after this coroutine has returned
      co_return;
    }
    cfg_ = w_.cfg_ptr();  // a pipelined request: served at once, with the current config
  }
  error_code ignored;
  if (!aborted_ && sock_.is_open()) {
    if (tls_) tls_->shutdown_now();
    sock_.shutdown(tcp::socket::shutdown_send, ignored);
    if ((parser_ && !parser_->is_done()) || buf_.size() > 0) {
      // Lingering close (hardening C5): the client may still be sending a body we refused;
      // closing now would reset the connection and could destroy our response in flight.
      // Read and discard for a bounded time and amount, until the client closes.
      arm(std::chrono::seconds(2), phase::head);
      auto sink = std::make_unique<char[]>(4096);
      std::size_t discarded = 0;
      while (discarded < 1024 * 1024) {
        auto [ec, n] = co_await sock_.async_read_some(asio::buffer(sink.get(), 4096), nothrow);
        if (ec) break;
        discarded += n;
      }
    }
  }
  close_now();
}

void connection::close_now() {
  error_code ignored;
  if (tls_ && !aborted_ && sock_.is_open()) tls_->shutdown_now();
  if (!aborted_ && sock_.is_open()) sock_.shutdown(tcp::socket::shutdown_send, ignored);
  disarm();
  timer_.cancel();
  sock_.close(ignored);
}

connection::outcome connection::builtin(std::string_view path, std::string& response) {
  const auto& req = parser_->get();
  const bool head_only = req.method() == bhttp::verb::head;
  const bool close = !parser_->keep_alive() || !parser_->is_done();
  const bool draining = w_.shared().draining.load(std::memory_order_relaxed);
  rq_->rec.probe = true;
  if (path == "/-/healthz" && !w_.shared().health_polled.load(std::memory_order_relaxed))
    w_.shared().health_polled.store(true, std::memory_order_relaxed);
  const auto* snap = w_.snap();
  if (draining || (snap && snap->ray_node_draining())) {
    // Ray's own text (ray proxy.py DRAINING_MESSAGE): a SIGTERM, or Ray draining this node.
    response = http::make_response(503, "text/plain", "This node is being drained.", close, 11, head_only);
  } else if (!snap) {
    response = http::make_response(503, "text/plain", "Route table is not populated yet.", close, 11, head_only);
  } else if (!snap->doc.serve_running) {
    // The dashboard's answer while Serve is not running (contract §9): nothing can be served.
    response = http::make_response(503, "text/plain", "Serve is not running: it has no applications.", close, 11,
                                   head_only);
  } else if (!w_.healthy()) {
    response = http::make_response(503, "text/plain", "Service Unavailable", close, 11, head_only);
  } else if (path == "/-/healthz") {
    response = http::make_response(200, "text/plain", "success", close, 11, head_only);
  } else {
    nlohmann::json routes = nlohmann::json::object();
    for (const auto& a : snap->apps) routes[a.route_prefix] = a.name;
    response = http::make_response(200, "application/json", routes.dump(), close, 11, head_only);
  }
  return close ? outcome::close : outcome::keep_alive;
}

bool connection::head_now(http::bounded_buffer& in, error_code& ec) {
  // Readiness (or a pipelined request) brought us here, so the head is nearly always there.
  return client([&](auto& s) { return parse_now(s, in, in.max_size(), *parser_, false, ec); });
}

std::string connection::head_error_response(error_code ec, unsigned status) {
  if (timed_out(phase::head)) return http::make_response(408, "text/plain", "Request Timeout", true);
  // A Content-Length over the limit is refused once every field is parsed: the client's id is
  // known and goes on the 413 and its log line.
  if (ec == bhttp::error::body_limit) choose_request_id();
  return http::make_response(status, "text/plain", refusal_body(status, {}), true);
}

awaitable<connection::outcome> connection::refuse_http2() {
  // An h2-only client: by prior knowledge, or over TLS after ALPN found no common protocol (h2
  // is chosen only with a gRPC listener, for gRPC clients: tls/context.cpp). An HTTP/1.1 505
  // would reach it as a protocol error with no words; this says what to do instead.
  const std::string frames = http::http2_refusal(
      cfg().grpc.enabled() ? "ingressd serves HTTP applications over HTTP/1.1; HTTP/2 is for gRPC calls on its gRPC listener"
                     : "ingressd serves HTTP applications over HTTP/1.1; use HTTP/1.1 (ALPN http/1.1)");
  const bool ok = co_await write_all(frames);
  rq_->rec.status = 505;
  if (!ok) rq_->rec.term = client_side_end();
  co_return outcome::close;
}

std::string connection::refusal_response(const http::head_verdict& v) const {
  // What Beast lets through but ingressd refuses (smuggling shapes, hardening A, B, D): the
  // request goes nowhere and the connection closes.
  return http::make_response(v.status, "text/plain", refusal_body(v.status, v.why), true, 11,
                             parser_->get().method() == bhttp::verb::head);
}

awaitable<std::optional<connection::head_read>> connection::read_head() {
  const auto& cfg = this->cfg();
  rq_->client_head.clear();
  for (int skips = 0;; ++skips) {
    parser_ = std::make_unique<request_parser>();
    parser_->header_limit(static_cast<std::uint32_t>(cfg.client.max_header_bytes));
    parser_->body_limit(cfg.client.max_body_bytes);
    // The raw head lands in rq_->client_head as Beast consumes it, for http::judge_head.
    http::bounded_buffer in(buf_, cfg.client.max_header_bytes, &rq_->client_head);
    error_code ec;
    if (!head_now(in, ec))
      std::tie(ec, std::ignore) =
          co_await client([&](auto& s) { return bhttp::async_read_header(s, in, *parser_, nothrow); });
    if (ec && (aborted_ || ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
               ec == asio::error::connection_reset || (ec == asio::error::operation_aborted && !timed_out(phase::head))))
      co_return std::nullopt;  // the client went away (or a drain cancelled the wait)
    const auto v = http::judge_head(ec, skips, rq_->client_head, http::pending(buf_), cfg.client.max_header_bytes,
                              parser_->get());
    if (v.what != http::head_verdict::kind::skip) co_return head_read{v, ec};
    buf_.consume(v.skip);
    rq_->client_head.clear();
  }
}

std::string connection::upstream_target(std::string_view target, std::string_view path, std::string_view stripped) {
  if (stripped.size() == path.size()) return std::string(target);
  std::string t(stripped);
  t.append(target.substr(path.size()));
  return t;
}

awaitable<connection::outcome> connection::serve_one() {
  const auto& cfg = this->cfg();
  begin_request();
  arm(cfg.client.header_timeout, phase::head);
  const auto head = co_await read_head();
  if (!head) co_return outcome::close;
  if (head->ec) {  // Beast refused the head while reading it
    if (http::http2_preface(http::pending(buf_))) co_return co_await refuse_http2();
    co_return co_await respond(head_error_response(head->ec, head->verdict.status), true);
  }
  w_.stats().requests.add();
  if (tls_) w_.stats().tls_requests.add();
  choose_request_id();
  if (head->verdict.what == http::head_verdict::kind::refuse)
    co_return co_await respond(refusal_response(head->verdict), true);
  const auto& req = parser_->get();
  const bool close = !parser_->keep_alive() || close_after_;
  const std::string_view target = req.target();
  std::string_view path = routing::path_of(target);
  if ((path == "/-/healthz" || path == "/-/routes") &&
      (req.method() == bhttp::verb::get || req.method() == bhttp::verb::head)) {
    std::string response;
    auto o = builtin(path, response);
    co_return co_await respond(std::move(response), o == outcome::close || close);
  }

  // Everything below may reply before the body is read; such replies close the connection.
  const bool unread_body = !parser_->is_done();
  const auto* snap = w_.snap();
  if (!snap) co_return co_await respond_reason(reason::no_healthy_replica, close || unread_body);
  auto stripped = routing::strip_root_path(path, cfg.root_path);
  std::optional<std::size_t> app;
  if (stripped) app = snap->routes.match(*stripped);
  if (!app) co_return co_await respond_reason(reason::no_route, close || unread_body, path);
  exchange ex(*this, *app, upstream_target(target, path, *stripped));
  co_return co_await ex.run();
}

}  // namespace ingressd::server
