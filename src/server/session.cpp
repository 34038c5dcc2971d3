#include "server/session.hpp"

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
#include "ingressd/http/message.hpp"
#include "ingressd/http/validate.hpp"
#include "ingressd/routing/route_table.hpp"
#include "ingressd/routing/router_memory.hpp"

namespace ingressd::server {

namespace beast = boost::beast;
using http::iequals;

namespace {

/// Body bytes read ahead while a router decides (forward_body off): bounds per-request buffering.
constexpr std::size_t prebody_cap = 64 * 1024;
constexpr std::uint32_t router_header_limit = 16 * 1024;
constexpr std::uint64_t router_body_limit = 1024 * 1024;
/// Timeout for an attempt at a router that recently gave no reply: a probe, not a full wait.
constexpr auto router_probe_timeout = std::chrono::seconds(1);
constexpr std::uint32_t upstream_header_limit = 64 * 1024;
constexpr std::string_view continue_100 = "HTTP/1.1 100 Continue\r\n\r\n";
constexpr std::string_view last_chunk = "0\r\n\r\n";

/// Writes as much of `bufs` as the socket takes right now — one sendmsg that never waits — and
/// drops what went out from the front of `bufs`. True when nothing is left to write, or on an
/// error (in `ec`); false when the socket buffer is full and the caller must async_write the rest.
/// Why: nearly every write here fits the socket buffer, yet an async_write still allocates an
/// operation and resumes the coroutine through the scheduler queue, after the other ready
/// handlers, by which time the request's state has left the cache (at 256 connections that
/// is most of the cost of a request). Writing at once keeps going while it is hot.
template <class Socket>
bool write_now(Socket& s, std::span<asio::const_buffer>& bufs, error_code& ec) {
  std::array<iovec, 8> iov;
  std::size_t k = 0;
  for (const auto& b : bufs) {
    if (k == iov.size()) break;
    iov[k++] = {const_cast<void*>(b.data()), b.size()};
  }
  msghdr msg{};
  msg.msg_iov = iov.data();
  msg.msg_iovlen = k;
  const ssize_t r = ::sendmsg(s.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    ec = error_code(errno, asio::error::get_system_category());
    return true;
  }
  auto left = static_cast<std::size_t>(r);
  while (!bufs.empty() && left >= bufs.front().size()) {
    left -= bufs.front().size();
    bufs = bufs.subspan(1);
  }
  if (left > 0) bufs.front() += left;
  return bufs.empty();
}

/// write_now, then async_write for whatever the socket did not take at once.
template <class Socket>
awaitable<error_code> send(Socket& s, std::span<asio::const_buffer> bufs) {
  error_code ec;
  if (!write_now(s, bufs, ec)) std::tie(ec, std::ignore) = co_await asio::async_write(s, bufs, nothrow);
  co_return ec;
}

/// Resumes the caller after the worker's other ready handlers, to read a reply just asked for.
/// Why: a reply is never there the moment its request has been written, so reading at once (Asio
/// tries a read before it waits) costs a recv that fails with EAGAIN, then the wait. Under load the
/// other ready handlers take long enough for the router or replica to answer, and the first read
/// finds the reply: 4 recv per routed request instead of 6, and at 256 connections half the
/// cross-core wake-ups (IPIs 0.23 -> 0.08-0.13 per request; bench/README "c64 -> c256"). An idle
/// worker has nothing else queued and resumes at once. A timer or cancellation that fires while
/// the caller waits here finds nothing to cancel, so callers check for one before they read.
auto after_ready_handlers(asio::io_context& ioc) { return asio::post(ioc, asio::use_awaitable); }

/// Takes what the socket holds now (only when nothing is buffered yet; at most `cap` bytes
/// buffered) and parses it here. `whole`: the complete message, else its head only.
/// True when no read operation is needed: the part is parsed, or `ec` says why it cannot be.
/// Why: when the bytes are already there, a Beast or Asio read finds them with its first try too,
/// but it completes through the scheduler queue, so the request resumes only after every other
/// ready handler, its state out of the cache again. Used where the bytes are nearly always there:
/// a request head that readiness brought (head_now), a reply after after_ready_handlers.
template <class Socket, class Buffer, class Parser>
bool parse_now(Socket& s, Buffer& buf, std::size_t cap, Parser& p, bool whole, error_code& ec) {
  if (buf.size() == 0) {
    const std::size_t want = std::min(std::max<std::size_t>(512, buf.capacity()), cap);
    auto room = buf.prepare(want);
    const auto n = ::recv(s.native_handle(), room.data(), room.size(), MSG_DONTWAIT);
    if (n <= 0) return false;  // nothing yet, EOF or an error: the read operation reports it
    buf.commit(static_cast<std::size_t>(n));
  }
  if (whole) {
    http::put_buffered(p, buf, ec);
  } else {
    buf.consume(p.put(buf.data(), ec));  // one step: the head, and nothing of the body yet
  }
  if (ec == bhttp::error::need_more) ec = {};
  return ec || (whole ? p.is_done() : p.is_header_done());
}

/// Counts a request in its upstream's node-wide in-flight count while it is proxied, however it
/// ends. The state outlives the request: the request holds its snapshot.
struct load_guard {
  topology::upstream_state* l = nullptr;
  void set(topology::upstream_state* x) {
    release();
    l = x;
    if (l) l->in_flight.fetch_add(1, std::memory_order_relaxed);
  }
  void release() {
    if (l) l->in_flight.fetch_sub(1, std::memory_order_relaxed);
    l = nullptr;
  }
  ~load_guard() { release(); }
};

/// The app's fallback target when it is up (a fallback that health checks marked down is as
/// good as none: HAProxy skips a down backup server too), else null.
const topology::endpoint* usable_fallback(const topology::app_view& v) {
  return v.fallback && v.fallback->state->up.load(std::memory_order_relaxed) ? &*v.fallback : nullptr;
}

bool has_healthy_replica(const topology::app_view& v) {
  for (const auto& r : v.replicas)
    if (r.state->up.load(std::memory_order_relaxed)) return true;
  return false;
}

/// Counts a stream as active while a response body is being relayed.
struct stream_guard {
  counter& c;
  explicit stream_guard(counter& x) : c(x) { c.add(); }
  ~stream_guard() { c.sub(); }
};

}  // namespace

session::session(worker& w, client_socket sock)
    : w_(w), cfg_(w.cfg_ptr()), sock_(std::move(sock)), timer_(w.ioc()) {
  error_code ec;
  auto ep = sock_.remote_endpoint(ec);
  if (!ec) peer_ = ep.address().to_string();
  sock_.set_option(tcp::no_delay(true), ec);
  w_.stats().active_connections.add();
}

session::~session() {
  // Idle memory accounting lives with the worker; nothing else to release here.
  w_.stats().active_connections.sub();
  w_.shared().connections.fetch_sub(1, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Watchdog

void session::arm(clock::duration d, phase p) {
  deadline_ = clock::now() + d;
  phase_ = p;
  timed_out_ = phase::none;
  if (waits_ > 0 && timer_.expiry() <= deadline_) return;  // fires earlier and re-arms itself
  timer_.expires_at(deadline_);
  start_wait();
}

void session::start_wait() {
  ++waits_;
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    --self->waits_;
    if (!ec) self->on_deadline();
  });
}

void session::on_deadline() {
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
  if (up_) up_->sock.cancel(ignored);
}

// ---------------------------------------------------------------------------------------------
// Client watch

void session::start_watch() {
  watching_ = true;
  watch_stop_ = false;
  watch_parked_ = false;
  arm_watch();
}

void session::arm_watch() {
  sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) { self->on_watch(ec); });
}

void session::on_watch(error_code ec) {
  if (watch_parked_) {
    // The request ended while this wait was pending; it has been the idle wait since.
    watch_parked_ = false;
    watching_ = false;
    on_idle_ready(ec);
    return;
  }
  bool gone = ec && ec != asio::error::operation_aborted;
  if (!ec && !watch_stop_) {
    // Readable: pipelined bytes (kept for the next request, up to the header limit), or the
    // client closed or reset. Read without blocking until the socket is drained.
    const auto cap = cfg().client.max_header_bytes;
    for (;;) {
      if (buf_.size() >= cap) break;  // full: stop watching, the next request is complete or too large
      auto room = buf_.prepare(std::min<std::size_t>(1024, cap - buf_.size()));
      const auto n = ::recv(sock_.native_handle(), room.data(), room.size(), MSG_DONTWAIT);
      if (n > 0) {
        buf_.commit(static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        arm_watch();
        return;
      }
      if (n < 0 && errno == EINTR) continue;
      gone = true;  // EOF or an error
      break;
    }
  }
  if (gone) {
    // EOF or reset: the client is gone. Closing the upstream read makes the replica see its
    // connection close, which aborts the generation and frees the GPU (hardening G1).
    client_gone_ = true;
    error_code ignored;
    if (up_) up_->sock.cancel(ignored);
  }
  watching_ = false;
  if (rq_) rq_->watch_done.cancel();
}

void session::park_watch() {
  if (watching_ && buf_.size() == 0) watch_parked_ = true;
}

awaitable<void> session::stop_watch() {
  if (!watching_) co_return;
  watch_stop_ = true;
  error_code ignored;
  sock_.cancel(ignored);
  rq_->watch_done.expires_at(clock::time_point::max());
  co_await rq_->watch_done.async_wait(nothrow);
}

// ---------------------------------------------------------------------------------------------


unsigned char* session::relay_buffer() {
  if (!rq_->relay) rq_->relay.reset(new unsigned char[relay_size]);
  return rq_->relay.get();
}

void session::release_buffers() {
  parser_.reset();
  w_.give_scratch(std::move(rq_));
  buf_.shrink_to_fit();
}

void session::expire_idle(clock::time_point now, clock::duration keepalive) {
  if (!idle_ || now - idle_since_ < keepalive) return;
  close_if_idle();
}

void session::close_if_idle() {
  close_after_ = true;
  if (idle_) {
    error_code ignored;
    sock_.cancel(ignored);
  }
}

void session::abort() {
  aborted_ = true;
  close_after_ = true;
  error_code ignored;
  sock_.close(ignored);
  if (up_) up_->sock.close(ignored);
  if (router_conn_) router_conn_->sock.close(ignored);
}

bool session::method_routed(std::string_view method) const {
  for (const auto& m : cfg().router.methods)
    if (m == method) return true;
  return false;
}

/// The 413 body: which limit the request passed and the key that sets it, so that a client (or
/// its operator) knows what to change.
std::string too_large_body(std::uint64_t limit) {
  return "Content Too Large: the request body is larger than client.max_body_bytes (" + std::to_string(limit) +
         " bytes)";
}

awaitable<session::outcome> session::body_error(error_code ec) {
  if (aborted_) co_return outcome::close;
  if (timed_out(phase::body))
    co_return co_await respond(http::make_response(408, "text/plain", "Request Timeout", true), true);
  if (ec == bhttp::error::body_limit)
    co_return co_await respond(
        http::make_response(413, "text/plain", too_large_body(cfg().client.max_body_bytes), true), true);
  if (ec == asio::error::eof || ec == bhttp::error::partial_message || ec == asio::error::connection_reset)
    co_return outcome::close;  // the client went away mid-upload
  if (ec == bhttp::error::bad_chunk_extension)
    co_return co_await respond(
        http::make_response(400, "text/plain", "Bad Request: malformed chunk extension", true), true);
  co_return co_await respond(http::make_response(400, "text/plain", "Bad Request", true), true);
}

bool session::body_from_buffer(error_code& ec) {
  ec = {};
  if (buf_.size() == 0) return false;
  const std::size_t used = http::put_buffered(*parser_, buf_, ec);
  if (ec != bhttp::error::need_more && (ec || used > 0 || parser_->is_done())) return true;
  ec = {};
  if (used > 0) return true;
  // No progress on what is buffered: a chunk line Beast cannot decide is a bad request, not one
  // to wait for (it waited until body_timeout, then answered 408).
  if (parser_->chunked() && http::malformed_chunk_line(http::pending(buf_)))
    ec = bhttp::error::bad_chunk_extension;
  else if (buf_.size() >= http::body_read_cap(cfg().client.max_header_bytes))  // A10, A11
    ec = bhttp::error::buffer_overflow;
  return static_cast<bool>(ec);
}

awaitable<error_code> session::read_body_some() {
  const std::size_t cap = http::body_read_cap(cfg().client.max_header_bytes);  // A10, A11
  for (;;) {
    if (error_code settled; body_from_buffer(settled)) co_return settled;
    // As Beast sizes its reads: what the buffer has room for, 512 bytes to 64 KiB.
    const std::size_t room =
        std::min(cap - buf_.size(), std::clamp<std::size_t>(buf_.capacity() - buf_.size(), 512, 64 * 1024));
    auto [ec, n] = co_await sock_.async_read_some(buf_.prepare(room), nothrow);
    if (ec == asio::error::eof) {
      parser_->put_eof(ec);  // an unfinished body: partial_message
      co_return ec;
    }
    if (ec) co_return ec;
    buf_.commit(n);
  }
}

awaitable<error_code> session::read_prebody(std::size_t cap, std::optional<clock::duration> wait) {
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

void session::note_upstream_error(const topology::endpoint& ep, std::string_view what) {
  const unsigned limit = cfg().health.error_limit;
  if (limit == 0) return;
  const auto errors = ep.state->errors.fetch_add(1, std::memory_order_relaxed) + 1;
  // Several workers may see the limit reached at once; marking down is idempotent.
  if (errors >= limit && ep.state->up.load(std::memory_order_relaxed) && w_.shared().passive_down)
    w_.shared().passive_down(ep.key, fmt::format("{} consecutive connection errors (last: {})", errors, what));
}

void session::note_upstream_ok(const topology::endpoint& ep) {
  if (ep.state->errors.load(std::memory_order_relaxed) != 0) ep.state->errors.store(0, std::memory_order_relaxed);
}

awaitable<session::router_exchange> session::router_attempt(const topology::endpoint& ep,
                                                             const std::string& request,
                                                             clock::duration timeout) {
  const unsigned gen = ++router_gen_;
  router_timed_out_ = false;
  rq_->router_timer.expires_after(timeout);
  rq_->router_timer.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (ec || gen != self->router_gen_) return;
    self->router_timed_out_ = true;
    error_code ignored;
    if (self->router_conn_) self->router_conn_->sock.cancel(ignored);
  });
  struct timer_stop {
    session& s;
    ~timer_stop() {
      ++s.router_gen_;
      s.router_conn_ = nullptr;
      s.rq_->router_timer.cancel();
    }
  } stop_timer{*this};

  for (int attempt = 0; attempt < 2; ++attempt) {
    // Router calls are re-sent on a fresh connection when a pooled one turns out stale (below),
    // so the pool skips its liveness peek: one system call less per request.
    upstream::connection_ptr conn =
        attempt == 0 ? w_.pool().take(ep.key, upstream::pool::staleness::caller_retries) : nullptr;
    const bool reused = conn != nullptr;
    if (!conn) {
      conn = std::make_unique<upstream::connection>(w_.ioc().get_executor());
      conn->key = ep.key;
      router_conn_ = conn.get();
      auto [ec] = co_await conn->sock.async_connect(ep.dial, nothrow);
      router_conn_ = nullptr;
      if (ec || router_timed_out_ || aborted_) co_return router_exchange{};
      error_code ignored;
      conn->sock.set_option(tcp::no_delay(true), ignored);
    }
    router_conn_ = conn.get();
    std::array<asio::const_buffer, 1> request_buf{asio::buffer(request)};
    const error_code wec = co_await send(conn->sock, request_buf);
    http::status_body_parser rp;
    rp.header_limit(router_header_limit);
    rp.body_limit(router_body_limit);
    error_code rec = wec;
    if (!wec) {
      http::bounded_buffer in(conn->buf, http::body_read_cap(router_header_limit));  // endless chunk line
      co_await after_ready_handlers(w_.ioc());
      // The timer or abort() may have fired meanwhile, with no read pending to cancel.
      if (router_timed_out_ || aborted_) rec = asio::error::operation_aborted;
      else if (!parse_now(conn->sock, conn->buf, in.max_size(), rp, true, rec))
        std::tie(rec, std::ignore) = co_await bhttp::async_read(conn->sock, in, rp, nothrow);
    }
    router_conn_ = nullptr;
    if (rec) {
      error_code ignored;
      conn->sock.close(ignored);
      // A pooled connection the router had closed fails before any reply byte: that is
      // staleness, not a router failure; try once more on a fresh connection.
      if (reused && !rp.got_some() && !router_timed_out_ && !aborted_) continue;
      co_return router_exchange{};
    }
    router_exchange out{true, rp.status(), std::move(rp.body())};
    if (rp.keep_alive() && conn->buf.size() == 0) w_.pool().put(std::move(conn), upstream::router_pool_scale);
    co_return out;
  }
  co_return router_exchange{};
}

awaitable<std::pair<routing::router_reply, std::optional<reason>>> session::ask_routers(
    const std::shared_ptr<const topology::snapshot>& snap, std::size_t app_index, std::string_view request_id,
    std::string_view body, std::optional<std::uint64_t> truncated_total) {
  const auto& cfg = this->cfg();
  struct latency_mark {  // the whole decision, failovers included (ingressd_router_latency_seconds)
    session& s;
    clock::time_point t0 = clock::now();
    ~latency_mark() { s.rq_->rec.router_latency = clock::now() - t0; }
  } latency{*this};
  const auto& view = snap->apps[app_index];
  const auto& pool = view.router_pool;
  const std::size_t n = pool.size();
  // The cursor lives in the worker's app table, which follows the worker's current snapshot. If
  // the topology changed while the body prefix was read, use the app's cursor there only when
  // its pool is the same.
  std::size_t start = 0;
  if (w_.snapshot_ptr() == snap) {
    start = w_.app(app_index).router_cursor.take(n);
  } else if (const auto* cur = w_.snap()) {
    for (std::size_t i = 0; i < cur->apps.size(); ++i)
      if (cur->apps[i].name == view.name && cur->apps[i].pool_signature == view.pool_signature)
        start = w_.app(i).router_cursor.take(n);
  }

  // The session header, or its -/_ variant (ray-serve-ingress.md §2.1).
  std::string_view session_value;
  const auto& req = parser_->get();
  if (!cfg.router.session_header.empty()) {
    const std::string& name = cfg.router.session_header;
    auto it = req.find(name);
    if (it == req.end()) {
      boost::container::small_vector<char, 64> alt(name.begin(), name.end());  // no allocation for usual names
      for (auto& c : alt) c = c == '-' ? '_' : c == '_' ? '-' : c;
      it = req.find(std::string_view(alt.data(), alt.size()));
    }
    if (it != req.end() && http::valid_field_value(it->value())) session_value = it->value();
  }

  // Cursor order, but routers that failed recently go last (router_memory).
  auto& memory = w_.routers();
  const auto now = clock::now();
  boost::container::small_vector<std::size_t, 8> order;
  boost::container::small_vector<routing::router_memory::state, 8> states(n);
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t r = (start + i) % n;
      if (pass == 0) states[r] = memory.get(pool[r].key, now);
      bool down = states[r] == routing::router_memory::state::down;
      if (down == (pass == 1)) order.push_back(r);
    }

  for (std::size_t r : order) {
    const auto& ep = pool[r];
    clock::duration timeout = cfg.router.timeout;
    if (states[r] != routing::router_memory::state::up) {
      timeout = std::min<clock::duration>(timeout, router_probe_timeout);
      memory.probing(ep.key, now);
    }
    routing::build_router_request({ep.key, body, truncated_total, cfg.router.session_header, session_value, request_id},
                                  rq_->router_request);
    const auto attempt_start = clock::now();
    auto ex = co_await router_attempt(ep, rq_->router_request, timeout);
    if (aborted_) co_return std::pair{routing::router_reply{}, std::optional(reason::router_unreachable)};
    note_router_attempt(r, ep, ex, clock::now() - attempt_start);
    if (!ex.replied) {
      memory.failed(ep.key, clock::now());
      spdlog::debug("router {} gave no reply{}", ep.key, router_timed_out_ ? " (timeout)" : "");
      continue;
    }
    memory.replied(ep.key);
    auto reply = routing::parse_router_reply(ex.status, ex.body);
    switch (reply.what) {
      case routing::router_reply::kind::pinned:
        co_return std::pair{std::move(reply), std::optional<reason>{}};
      case routing::router_reply::kind::non_200:
        co_return std::pair{std::move(reply), std::optional(reason::router_non_200)};
      case routing::router_reply::kind::unparseable:
        co_return std::pair{std::move(reply), std::optional(reason::unparseable_replica_id)};
    }
  }
  co_return std::pair{routing::router_reply{}, std::optional(reason::router_unreachable)};
}

awaitable<bool> session::write_all(std::string_view data) {
  std::array<asio::const_buffer, 1> out{asio::buffer(data)};
  co_return !(co_await send(sock_, out));
}

void session::choose_request_id() {
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

std::string_view session::request_id() {
  if (rq_->request_id.empty()) {  // answered before a usable head was read (400, 408, 431, ...)
    rq_->generated = w_.next_request_id();
    rq_->request_id = std::string_view(rq_->generated.data(), rq_->generated.size());
    if (logging()) rq_->rec.request_id.assign(rq_->request_id);
  }
  return rq_->request_id;
}

awaitable<session::outcome> session::respond(std::string response, bool close) {
  arm(cfg().client.header_timeout, phase::head);
  // Every response carries the request's id, the ones ingressd generates included (contract §9):
  // a client that reports a failure can name it.
  http::insert_field(response, "X-Request-Id", request_id());
  bool ok = co_await write_all(response);
  note_response(response, ok);
  co_return (ok && !close) ? outcome::keep_alive : outcome::close;
}

awaitable<session::outcome> session::respond_reason(reason r, bool close, std::string_view path) {
  bool head_only = parser_ && parser_->get().method() == bhttp::verb::head;
  rq_->rec.why = r;
  co_return co_await respond(http::make_reason_response(r, close, 11, head_only, path), close);
}

// ---------------------------------------------------------------------------------------------

void session::start() { wait_idle(); }

void session::wait_idle() {
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
  if (watch_parked_) return;  // the last request's watch is still waiting: it serves as this wait
  sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) { self->on_idle_ready(ec); });
}

void session::on_idle_ready(error_code ec) {
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
      spdlog::error("session failed: {}", ex.what());
    }
  });
}

awaitable<void> session::serve() {
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

void session::close_now() {
  error_code ignored;
  if (!aborted_ && sock_.is_open()) sock_.shutdown(tcp::socket::shutdown_send, ignored);
  disarm();
  timer_.cancel();
  sock_.close(ignored);
}

session::outcome session::builtin(std::string_view path, std::string& response) {
  const auto& req = parser_->get();
  const bool head_only = req.method() == bhttp::verb::head;
  const bool close = !parser_->keep_alive() || !parser_->is_done();
  const bool draining = w_.shared().draining.load(std::memory_order_relaxed);
  rq_->rec.probe = true;
  const auto* snap = w_.snap();
  if (draining) {
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

bool session::head_now(http::bounded_buffer& in, error_code& ec) {
  // Readiness (or a pipelined request) brought us here, so the head is nearly always there.
  return parse_now(sock_, in, in.max_size(), *parser_, false, ec);
}

awaitable<session::outcome> session::serve_one() {
  const auto& cfg = this->cfg();
  begin_request();
  arm(cfg.client.header_timeout, phase::head);
  rq_->head.clear();
  for (int skips = 0;; ++skips) {
    parser_ = std::make_unique<request_parser>();
    parser_->header_limit(static_cast<std::uint32_t>(cfg.client.max_header_bytes));
    parser_->body_limit(cfg.client.max_body_bytes);
    // The raw head lands in rq_->head as Beast consumes it, for http::check_request_head below.
    http::bounded_buffer in(buf_, cfg.client.max_header_bytes, &rq_->head);
    error_code ec;
    if (!head_now(in, ec)) std::tie(ec, std::ignore) = co_await bhttp::async_read_header(sock_, in, *parser_, nothrow);
    if (ec == bhttp::error::bad_method && skips < 8) {
      // Empty lines before the request line are ignored (RFC 9112 §2.2, hardening D12).
      if (auto skip = http::leading_empty_lines(http::pending(buf_)); skip > 0) {
        buf_.consume(skip);
        continue;
      }
    }
    if (ec) {
      if (aborted_) co_return outcome::close;
      if (timed_out(phase::head)) {
        co_return co_await respond(http::make_response(408, "text/plain", "Request Timeout", true), true);
      }
      if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
          ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
        co_return outcome::close;
      // A Content-Length over the limit is refused once every field is parsed: the client's
      // id is known and goes on the 413 and its log line.
      if (ec == bhttp::error::body_limit) choose_request_id();
      unsigned status = http::status_for_head_error(ec, rq_->head, http::pending(buf_),
                                                    cfg.client.max_header_bytes);
      const std::string body = status == 413 ? too_large_body(cfg.client.max_body_bytes)
                                             : std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(status)));
      co_return co_await respond(http::make_response(status, "text/plain", body, true), true);
    }
    break;
  }
  w_.stats().requests.add();
  choose_request_id();
  const auto& req = parser_->get();
  if (auto v = http::check_request_head(rq_->head, req); !v.ok()) {
    // What Beast lets through but ingressd refuses (smuggling shapes, hardening A, B, D): the
    // request goes nowhere and the connection closes.
    std::string body(bhttp::obsolete_reason(static_cast<bhttp::status>(v.status)));
    body.append(": ").append(v.why);
    co_return co_await respond(
        http::make_response(v.status, "text/plain", body, true, 11, req.method() == bhttp::verb::head), true);
  }
  if (req.version() != 11 && req.version() != 10) {
    co_return co_await respond(http::make_response(505, "text/plain", "HTTP Version Not Supported", true), true);
  }
  const bool close = !parser_->keep_alive() || close_after_;
  std::string_view target = req.target();
  if (target.empty() || target.front() != '/') {
    co_return co_await respond(http::make_response(400, "text/plain", "Bad Request", true), true);
  }
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

  std::string upstream_target;
  if (stripped && stripped->size() != path.size()) {
    upstream_target.assign(*stripped);
    upstream_target.append(target.substr(path.size()));
  } else {
    upstream_target.assign(target);
  }
  co_return co_await proxy(*app, std::move(upstream_target));
}

awaitable<session::outcome> session::proxy(std::size_t app_index, std::string target) {
  const auto& cfg = this->cfg();
  auto& req = parser_->get();
  const bool head_only = req.method() == bhttp::verb::head;
  bool close = !parser_->keep_alive() || close_after_;
  const bool has_body = !parser_->is_done();
  const bool chunked_in = parser_->chunked();
  const unsigned client_version = req.version();
  rq_->prebody.clear();
  rq_->rec.block = w_.app(app_index).metrics;

  // Expect: only 100-continue is known (RFC 9110 §10.1.1); ingressd answers it itself.
  bool expect_continue = false;
  if (auto it = req.find(bhttp::field::expect); it != req.end() && client_version == 11) {
    if (!iequals(it->value(), "100-continue")) {
      co_return co_await respond(http::make_response(417, "text/plain", "Expectation Failed", true), true);
    }
    expect_continue = has_body;
  }

  const std::string_view request_id = rq_->request_id;

  std::shared_ptr<const topology::snapshot> snap = w_.snapshot_ptr();

  // Router path (contract §4.2): ask a router which replica serves this request. An app with no
  // healthy replica (scaled to zero: Ray sends `targets: []`) goes to its fallback target, the
  // head node's Serve proxy, which scales it up: no router could name a replica for it.
  std::optional<std::size_t> pinned;
  std::vector<std::pair<std::string, std::string>> router_headers;
  const auto& view = snap->apps[app_index];
  bool to_fallback = usable_fallback(view) && !has_healthy_replica(view);
  const bool use_router = !to_fallback && !view.router_pool.empty() && method_routed(req.method_string());
  if (use_router) {
    if (expect_continue) {
      expect_continue = false;
      if (!(co_await write_all(continue_100))) co_return outcome::close;
    }
    routing::router_reply reply;
    std::optional<reason> failure;
    error_code body_ec;
    if (cfg.router.forward_body) {
      // The router sees the first body_limit bytes as soon as they have arrived, or what has
      // arrived after router.body_wait.
      body_ec = co_await read_prebody(cfg.router.body_limit, cfg.router.body_wait);
      if (!body_ec) {
        std::optional<std::uint64_t> total;
        if (!chunked_in && parser_->content_length() && *parser_->content_length() > rq_->prebody.size())
          total = *parser_->content_length();
        if (!parser_->is_done()) rq_->rec.block->truncations.add();
        std::tie(reply, failure) = co_await ask_routers(snap, app_index, request_id, rq_->prebody, total);
      }
    } else if (const auto cl = parser_->content_length();
               parser_->is_done() || (!chunked_in && cl && *cl <= prebody_cap && buf_.size() >= *cl)) {
      // The whole body arrived with the head (the common LLM request): take it from the buffer
      // (no I/O) and ask the router; nothing is left to overlap with.
      body_ec = co_await read_prebody(prebody_cap);
      if (!body_ec) std::tie(reply, failure) = co_await ask_routers(snap, app_index, request_id, {}, std::nullopt);
    } else {
      // The router call starts now; the body keeps arriving meanwhile (bounded by prebody_cap).
      using namespace asio::experimental::awaitable_operators;
      auto both = co_await (ask_routers(snap, app_index, request_id, {}, std::nullopt) && read_prebody(prebody_cap));
      std::tie(reply, failure) = std::get<0>(both);
      body_ec = std::get<1>(both);
    }
    if (aborted_) co_return outcome::close;
    if (body_ec) co_return co_await body_error(body_ec);
    if (!failure) {
      auto it = view.replica_by_name.find(reply.replica_id);
      if (it != view.replica_by_name.end()) {
        pinned = it->second;
        router_headers = std::move(reply.request_headers);
      } else {
        failure = reason::unknown_replica_id;
      }
    }
    note_router_outcome(failure);
    if (failure) {
      if (*failure == reason::unknown_replica_id && usable_fallback(view)) {
        // The router knows a replica we do not yet: the head node's Serve proxy re-picks (Ray #64218).
        to_fallback = true;
      } else if (cfg.router.failure_mode == config::on_failure::fail_open || view.router_fallback) {
        spdlog::debug("router failure {} for app {}: failing open", to_string(*failure), view.name);
      } else {
        co_return co_await respond_reason(*failure, close || !parser_->is_done());
      }
    }
  }

  // A request that a pooled connection can carry again on a fresh one if the replica had closed
  // it while it sat in the pool: no body and an idempotent method (RFC 9110 §9.2.2), and no
  // router decision to honour. Such a request skips the pool's liveness peek (a system call per
  // request) and is re-sent once when its reused connection fails before any response byte.
  const bool resend_ok = !use_router && !has_body && http::idempotent(req.method());
  bool resent = false;
resend:
  // Choose a replica and connect, retrying other replicas on connect failure (contract §4.3).
  std::vector<std::string> tried;
  upstream::connection_ptr conn;
  load_guard load;
  unsigned connect_failures = 0;
  const topology::endpoint* ep = nullptr;
  bool observed = false;  // ep is a replica: passive health watches its connections (not a fallback's)
  for (;;) {
    if (w_.snapshot_ptr() != snap) {
      // The topology changed while we were waiting: route again in the new one.
      auto next = w_.snapshot_ptr();
      std::optional<std::size_t> idx;
      for (std::size_t i = 0; i < next->apps.size(); ++i)
        if (next->apps[i].name == snap->apps[app_index].name) idx = i;  // `snap` is still the old one here
      if (!idx) co_return co_await respond_reason(reason::no_healthy_replica, close || !parser_->is_done());
      if (pinned) {
        auto it = next->apps[*idx].replica_by_name.find(snap->apps[app_index].replicas[*pinned].name);
        pinned = it == next->apps[*idx].replica_by_name.end() ? std::nullopt : std::optional(it->second);
      }
      snap = next;
      app_index = *idx;
    }
    const auto& v = snap->apps[app_index];
    auto was_tried = [&](std::size_t r) {
      for (const auto& k : tried)
        if (k == v.replicas[r].key) return true;
      return false;
    };
    std::optional<std::size_t> pick;
    const auto* fallback = usable_fallback(v);
    if (to_fallback && fallback && tried.empty()) {
      ep = fallback;
    } else {
      // A pinned replica that health checks marked down, or that refused us, falls through.
      if (pinned && !was_tried(*pinned) && v.replicas[*pinned].state->up.load(std::memory_order_relaxed)) pick = pinned;
      else pick = w_.least_loaded(app_index, was_tried);
      if (pick) {
        ep = &v.replicas[*pick];
      } else if (tried.empty() && fallback) {
        ep = fallback;
      } else {
        co_return co_await respond_reason(tried.empty() ? reason::no_healthy_replica : reason::upstream_error,
                                          close || !parser_->is_done());
      }
    }
    if (!resent)
      conn = w_.pool().take(ep->key, resend_ok ? upstream::pool::staleness::caller_retries
                                               : upstream::pool::staleness::peek);
    if (!conn) {
      conn = std::make_unique<upstream::connection>(w_.ioc().get_executor());
      conn->key = ep->key;
      up_ = conn.get();
      arm(cfg.upstream.connect_timeout, phase::connect);
      auto [ec] = co_await conn->sock.async_connect(ep->dial, nothrow);
      up_ = nullptr;
      if (aborted_) co_return outcome::close;
      if (ec) {
        if (pick) note_upstream_error(*ep, timed_out(phase::connect) ? "connect timed out" : ec.message());
        conn.reset();
        tried.push_back(ep->key);
        if (++connect_failures > cfg.upstream.retries)
          co_return co_await respond_reason(reason::upstream_error, close || !parser_->is_done());
        continue;
      }
      error_code ignored;
      conn->sock.set_option(tcp::no_delay(true), ignored);
    }
    load.set(ep->state);
    observed = pick.has_value();
    break;
  }
  note_replica(*ep, connect_failures);
  registration<upstream::connection> current_upstream(up_, *conn);

  // Request head, re-framed (contract §4.4). One allocation for the request's heads instead of
  // one per doubling (the buffer is released when the connection goes idle).
  rq_->head.clear();
  rq_->head.reserve(1024);
  rq_->head.append(req.method_string()).push_back(' ');
  rq_->head.append(target).append(" HTTP/1.1\r\n");
  {
    http::hop_filter hop(req);
    bool have_host = false;
    for (const auto& f : req) {
      auto name = f.name_string();
      if (hop.skip(f.name(), name)) continue;
      switch (f.name()) {
        case bhttp::field::expect:
        case bhttp::field::proxy_authorization:
          continue;
        case bhttp::field::host:
          have_host = true;
          break;
        default:
          if (http::proxy_owned_field(name)) continue;  // incl. x-serve-router-*: only a router sets those
      }
      bool replaced = false;
      for (const auto& [hn, hv] : router_headers) replaced = replaced || iequals(hn, name);
      if (!replaced) http::append_field(rq_->head, name, f.value());
    }
    if (!have_host) http::append_field(rq_->head, "Host", ep->key);
  }
  for (const auto& [hn, hv] : router_headers) http::append_field(rq_->head, hn, hv);
  http::append_field(rq_->head, "X-Forwarded-For", peer_);
  http::append_field(rq_->head, "X-Forwarded-Proto", "http");
  http::append_field(rq_->head, "X-Request-Id", request_id);
  if (has_body) {
    if (chunked_in)
      http::append_field(rq_->head, "Transfer-Encoding", "chunked");
    else
      http::append_field(rq_->head, "Content-Length", std::to_string(*parser_->content_length()));
  } else if (auto cl = parser_->content_length(); cl) {
    http::append_field(rq_->head, "Content-Length", "0");
  }
  rq_->head.append("\r\n");

  auto upstream_failed = [&](reason r) -> awaitable<outcome> {
    hard_close(conn->sock);
    co_return co_await respond_reason(r, close || !parser_->is_done());
  };

  // Body: client -> upstream, one piece at a time, with our own framing. Bytes read while the
  // router was deciding (rq_->prebody) go first.
  if (expect_continue && !(co_await write_all(continue_100))) co_return outcome::close;
  {
    std::array<char, 18> chunk_hdr{};
    bool head_sent = false;
    bool pre = !rq_->prebody.empty();
    unsigned char* relay = nullptr;  // made only when body bytes must still be read from the client
    while (!head_sent || pre || !parser_->is_done()) {
      std::size_t got = 0;
      const void* piece = nullptr;
      if (pre) {
        piece = rq_->prebody.data();
        got = rq_->prebody.size();
        pre = false;
      } else if (!parser_->is_done()) {
        if (!relay) relay = relay_buffer();
        piece = relay;
        auto& body = parser_->get().body();
        body.data = relay;
        body.size = relay_size;
        arm(cfg.client.body_timeout, phase::body);
        auto ec = co_await read_body_some();
        if (ec == bhttp::error::need_buffer) ec = {};
        got = relay_size - body.size;
        if (ec) {
          hard_close(conn->sock);
          co_return co_await body_error(ec);
        }
      }
      std::array<asio::const_buffer, 5> bufs;
      std::size_t nb = 0;
      if (!head_sent) bufs[nb++] = asio::buffer(rq_->head);
      if (got) {
        if (chunked_in) bufs[nb++] = asio::buffer(chunk_hdr.data(), http::chunk_header(chunk_hdr.data(), got));
        bufs[nb++] = asio::buffer(piece, got);
        if (chunked_in) bufs[nb++] = asio::buffer("\r\n", 2);
      }
      if (chunked_in && has_body && !pre && parser_->is_done()) bufs[nb++] = asio::buffer(last_chunk);
      if (nb == 0) continue;
      arm(cfg.client.body_timeout, phase::body);
      const error_code ec = co_await send(conn->sock, std::span(bufs.data(), nb));
      if (ec) {
        if (aborted_) co_return outcome::close;
        if (resend_ok && !resent && conn->reused) {  // stale pooled connection (see resend_ok)
          hard_close(conn->sock);
          resent = true;
          goto resend;
        }
        if (observed) note_upstream_error(*ep, ec.message());
        co_return co_await upstream_failed(reason::upstream_error);
      }
      head_sent = true;
    }
  }
  rq_->prebody.clear();
  const auto request_sent = clock::now();

  // Response head, skipping interim 1xx responses after forwarding them (hardening F2).
  start_watch();
  // The parser writes the head for the client into rq_->head once the status line arrives (a
  // re-send rebuilds the request head after `resend:`).
  std::optional<response_parser> rp;
  for (bool first_head = true;; first_head = false) {
    rp.emplace(rq_->head);
    rp->header_limit(upstream_header_limit);
    rp->body_limit(boost::none);
    if (head_only) rp->skip(true);
    arm(cfg.upstream.first_byte_timeout, phase::first_byte);
    co_await after_ready_handlers(w_.ioc());
    // The deadline, the client watch or abort() may have fired meanwhile, with no read pending
    // to cancel: end as that read would have.
    error_code ec;
    if (timed_out(phase::first_byte) || client_gone_ || aborted_) ec = asio::error::operation_aborted;
    else if (!parse_now(conn->sock, conn->buf, relay_size, *rp, false, ec))
      std::tie(ec, std::ignore) = co_await bhttp::async_read_header(conn->sock, conn->buf, *rp, nothrow);
    if (ec) {
      co_await stop_watch();
      if (aborted_) co_return outcome::close;
      if (client_gone_) {
        hard_close(conn->sock);
        co_return outcome::close;
      }
      if (resend_ok && !resent && conn->reused && first_head && !rp->got_some() && conn->buf.size() == 0 &&
          !timed_out(phase::first_byte)) {  // stale pooled connection: not one byte came back
        hard_close(conn->sock);
        resent = true;
        goto resend;
      }
      // No head within first_byte_timeout is a slow replica, not a broken connection.
      if (observed && !timed_out(phase::first_byte)) note_upstream_error(*ep, ec.message());
      co_return co_await upstream_failed(timed_out(phase::first_byte) ? reason::upstream_timeout
                                                                       : reason::upstream_error);
    }
    if (observed) note_upstream_ok(*ep);
    const unsigned status = rp->status();
    if (status >= 200) {
      // Framing Beast accepts but that cannot be re-framed faithfully (repeated Content-Length,
      // a coding other than chunked): 502, and the upstream connection is discarded (A15, B6).
      if (!rp->framing_error().empty()) {
        co_await stop_watch();
        co_return co_await upstream_failed(reason::upstream_error);
      }
      break;
    }
    if (status == 101) {
      co_await stop_watch();
      co_return co_await upstream_failed(reason::upstream_error);  // we never ask for upgrades
    }
    if ((status == 100 && expect_continue) || client_version != 11) continue;
    rq_->head.append("\r\n");  // the interim head as the parser wrote it
    if (!(co_await write_all(rq_->head))) {
      co_await stop_watch();
      hard_close(conn->sock);
      co_return outcome::close;
    }
  }

  rq_->rec.block->first_byte.observe(clock::now() - request_sent);
  const unsigned status = rp->status();
  const bool no_body = head_only || status == 204 || status == 304;
  const auto length = rp->content_length();
  const bool chunked_out = !no_body && !length && client_version == 11;
  if (!no_body && !length && client_version != 11) close = true;  // close-delimited for HTTP/1.0
  close = close || close_after_;

  // rq_->head holds the status line and the end-to-end fields (relay_response_parser, which
  // leaves out the replica's X-Request-Id); the request's id and our framing follow.
  http::append_field(rq_->head, "X-Request-Id", request_id);
  if (length && (!no_body || head_only))
    http::append_field(rq_->head, "Content-Length", std::to_string(*length));
  else if (chunked_out)
    http::append_field(rq_->head, "Transfer-Encoding", "chunked");
  if (close)
    http::append_field(rq_->head, "Connection", "close");
  else if (client_version == 10)
    http::append_field(rq_->head, "Connection", "keep-alive");
  rq_->head.append("\r\n");

  stream_guard streaming(w_.stats().active_streams);
  std::array<char, 18> chunk_hdr{};
  // Body pieces pass through the worker's relay window (worker::relay_window), which must hold
  // nothing of this stream when this coroutine suspends: bytes already buffered are parsed here
  // (Beast's async_read_some would parse them too, then complete through the scheduler queue,
  // other streams running in between); a read that does I/O parses in its completion, which
  // resumes this coroutine directly; and what the client does not take at once is copied to the
  // request's own buffer before waiting for it.
  unsigned char* const window = w_.relay_window();
  // A replica sending an endless chunk-size line or trailer must not grow the buffer without
  // bound: Beast stops with buffer_overflow at the cap and the stream is aborted (hardening B).
  http::bounded_buffer up_in(conn->buf, http::body_read_cap(upstream_header_limit));
  bool head_sent = false;
  bool upstream_ok = true;
  while (!head_sent || !rp->is_done()) {
    // The watch may have seen the client leave while no upstream read was pending to cancel
    // (the head and the client's EOF arrived together): stop relaying now (hardening G1).
    if (client_gone_) break;
    std::size_t got = 0;
    error_code read_ec;
    if (!rp->is_done()) {
      rp->body_window(window, relay_size);
      if (conn->buf.size() > 0) {
        // All of it, not one framing step: one step sent a head that came with the first event
        // on its own, the event in a second send.
        http::put_buffered(*rp, conn->buf, read_ec);
        if (read_ec == bhttp::error::need_buffer || read_ec == bhttp::error::need_more) read_ec = {};
        got = relay_size - rp->body_left();
      }
      // Each piece goes out as soon as it is read; the head goes with the first piece when it is
      // already buffered, else on its own at once (TTFT).
      if (got == 0 && !read_ec && head_sent && !rp->is_done()) {
        arm(cfg.upstream.idle_timeout, phase::stream);
        auto [ec, n] = co_await bhttp::async_read_some(conn->sock, up_in, *rp, nothrow);
        if (ec == bhttp::error::need_buffer) ec = {};
        read_ec = ec;
        got = relay_size - rp->body_left();
      }
    }
    std::array<asio::const_buffer, 5> bufs;
    std::size_t nb = 0;
    if (!head_sent) bufs[nb++] = asio::buffer(rq_->head);
    if (got) {
      if (chunked_out) bufs[nb++] = asio::buffer(chunk_hdr.data(), http::chunk_header(chunk_hdr.data(), got));
      bufs[nb++] = asio::buffer(window, got);
      if (chunked_out) bufs[nb++] = asio::buffer("\r\n", 2);
    }
    if (!read_ec && chunked_out && rp->is_done()) bufs[nb++] = asio::buffer(last_chunk);
    if (nb > 0) {
      arm(cfg.upstream.idle_timeout, phase::stream);
      std::span<asio::const_buffer> pending(bufs.data(), nb);
      error_code ec;
      if (!write_now(sock_, pending, ec)) {
        for (auto& b : pending) {
          const auto* p = static_cast<const unsigned char*>(b.data());
          if (std::less_equal<>()(window, p) && std::less<>()(p, window + relay_size)) {
            unsigned char* own = relay_buffer();  // the rest of the piece leaves the shared window
            std::memcpy(own, p, b.size());
            b = asio::buffer(own, b.size());
          }
        }
        std::tie(ec, std::ignore) = co_await asio::async_write(sock_, pending, nothrow);
      }
      if (ec) {
        // The client went away (or stalled past the idle timeout): close the upstream too.
        rq_->rec.term = client_side_end();
        co_await stop_watch();
        hard_close(conn->sock);
        hard_close(sock_);
        co_return outcome::close;
      }
      if (!head_sent) rq_->rec.status = status;
      rq_->rec.bytes += got;
      head_sent = true;
    }
    if (read_ec) {
      upstream_ok = false;
      break;
    }
  }
  // The connection stays open with nothing buffered: the watch's wait carries on as the idle
  // wait (park_watch). Otherwise it ends here, before the checks that read what it saw.
  if (close || !upstream_ok || client_gone_ || aborted_ || buf_.size() > 0) co_await stop_watch();
  else park_watch();
  disarm();
  if (!upstream_ok || client_gone_ || aborted_) {
    // Upstream died or hung mid-stream, or the client left: abort both sides (hardening G1, G3).
    rq_->rec.term = aborted_ ? metrics::termination::shutdown
                : client_gone_ ? metrics::termination::client_abort
                : timed_out(phase::stream) ? metrics::termination::timeout
                : metrics::termination::upstream_abort;
    hard_close(conn->sock);
    hard_close(sock_);
    co_return outcome::close;
  }
  if (rp->keep_alive() && conn->buf.size() == 0) {
    up_ = nullptr;
    w_.pool().put(std::move(conn));
  } else {
    error_code ignored;
    conn->sock.close(ignored);
  }
  co_return close ? outcome::close : outcome::keep_alive;
}

}  // namespace ingressd::server
