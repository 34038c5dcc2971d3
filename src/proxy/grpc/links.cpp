#include "proxy/grpc/links.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>

#include <spdlog/spdlog.h>

#include "proxy/grpc/hub.hpp"

namespace ingressd::server::grpc_links {

using grpc::nv;
using grpc::sv;

options_holder::options_holder() {
  nghttp2_option_new(&o);
  // Windows are opened by hand: a stream's as the other side takes its bytes (the back-pressure
  // of a relay), an upstream link's connection window as the bytes arrive
  // (upstream_link::on_data), a client's connection window as the replica takes them.
  nghttp2_option_set_no_auto_window_update(o, 1);
  // Hardening: at most 32 entries in a SETTINGS frame, at most 1000 queued PING/SETTINGS acks
  // (then ENHANCE_YOUR_CALM), at most 8 CONTINUATION frames per header block.
  nghttp2_option_set_max_settings(o, 32);
  nghttp2_option_set_max_outbound_ack(o, 1000);
  nghttp2_option_set_max_continuations(o, 8);
  // nghttp2's own limit on received RST_STREAM (a burst of 1,000, then 33/s: GOAWAY
  // INTERNAL_ERROR) would cut a client whose calls legitimately end by their deadlines; the
  // rapid-reset rule (client_link::on_stream_close, grpc::frame_budget) is the guard, so
  // nghttp2's is set out of reach.
  nghttp2_option_set_stream_reset_rate_limit(o, std::uint64_t{1} << 40, std::uint64_t{1} << 40);
}

options_holder::~options_holder() { nghttp2_option_del(o); }

// ------------------------------------------------------------------------------------------
// link

link::link(grpc_hub::impl& hub, socket_t sock, std::unique_ptr<tls::stream> tls)
    : hub_(hub), sock_(std::move(sock)), tls_(std::move(tls)) {
  error_code ignored;
  sock_.set_option(tcp::no_delay(true), ignored);
  if (tls_) tls_->rebind(sock_);
}

void link::want_flush() {
  if (dirty_ || closed_) return;
  dirty_ = true;
  hub_.dirty.push_back(shared_from_this());
}

void link::flush() {
  dirty_ = false;
  if (closed_ || write_waiting_ || !s_) return;
  for (;;) {
    if (out_off_ == out_.size()) {
      out_.clear();
      out_off_ = 0;
      while (out_.size() < out_cap) {
        const std::uint8_t* p = nullptr;
        const auto n = nghttp2_session_mem_send(s(), &p);
        if (n < 0) {
          close();
          return;
        }
        if (n == 0) break;
        out_.insert(out_.end(), p, p + n);
      }
      if (out_.empty()) break;
    }
    if (tls_) {
      std::size_t put = 0;
      error_code ec;
      switch (const auto r = tls_->write_now(out_.data() + out_off_, out_.size() - out_off_, put, ec)) {
        case tls::stream::io::ok:
          out_off_ += put;
          continue;
        case tls::stream::io::want_write:
        case tls::stream::io::want_read: {
          // The retry offers the same bytes (out_ is untouched until then), as OpenSSL asks.
          const auto wait =
              r == tls::stream::io::want_read ? asio::socket_base::wait_read : asio::socket_base::wait_write;
          write_waiting_ = true;
          asio::co_spawn(sock_.get_executor(), wait_writable(shared_from_this(), wait), asio::detached);
          return;
        }
        default:
          close();
          return;
      }
    }
    const auto r = ::send(sock_.native_handle(), out_.data() + out_off_, out_.size() - out_off_,
                          MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        write_waiting_ = true;
        asio::co_spawn(sock_.get_executor(), wait_writable(shared_from_this(), asio::socket_base::wait_write),
                       asio::detached);
        return;
      }
      close();
      return;
    }
    out_off_ += static_cast<std::size_t>(r);
  }
  if (closing_ || (!nghttp2_session_want_read(s()) && !nghttp2_session_want_write(s()))) {
    finish();
    return;
  }
  after_flush();
}

void link::terminate(std::uint32_t code) {
  if (closed_ || !s_) return;
  nghttp2_session_terminate_session(s(), code);
  closing_ = true;
  want_flush();
}

void link::close() {
  if (closed_) return;
  closed_ = true;
  error_code ignored;
  if (tls_ && sock_.is_open()) tls_->shutdown_now();
  sock_.close(ignored);
  if (timer_) timer_->cancel();
  on_closed();
}

awaitable<void> link::wait_writable(std::shared_ptr<link> self, asio::socket_base::wait_type wait) {
  auto [ec] = co_await self->sock_.async_wait(wait, nothrow);
  self->write_waiting_ = false;
  if (ec) {
    self->close();
  } else {
    self->flush();
  }
  self->hub_.flush_dirty();
}

awaitable<void> link::read_loop(std::shared_ptr<link> self) {
  std::vector<std::uint8_t> buf(read_size);
  while (!self->closed_ && !self->closing_) {
    error_code ec;
    std::size_t n = 0;
    if (self->tls_) {
      // Readiness-driven TLS (tls/stream.hpp): try, wait only when OpenSSL says so. Bytes it
      // already holds (read with the handshake) come out before any wait.
      switch (const auto r = self->tls_->read_now(buf.data(), buf.size(), n, ec)) {
        case tls::stream::io::ok:
          break;
        case tls::stream::io::want_read:
        case tls::stream::io::want_write: {
          auto [wec] = co_await self->sock_.async_wait(
              r == tls::stream::io::want_read ? asio::socket_base::wait_read : asio::socket_base::wait_write, nothrow);
          if (self->closed_) co_return;
          if (!wec) continue;
          ec = wec;
          break;
        }
        case tls::stream::io::eof:
          ec = asio::error::eof;
          break;
        default:
          if (!ec) ec = asio::error::connection_reset;
      }
    } else {
      std::tie(ec, n) = co_await self->sock_.async_read_some(asio::buffer(buf), nothrow);
    }
    if (self->closed_) break;
    if (ec) {
      self->on_read_error(ec);
      self->close();
      self->hub_.flush_dirty();
      break;
    }
    self->read_at_ = clock::now();
    const auto bytes = self->incoming({buf.data(), n});
    const auto rv = nghttp2_session_mem_recv(self->s(), bytes.data(), bytes.size());
    if (n < buf.size()) self->drained_at_ = self->read_at_;  // after the batch: its frames use the earlier mark
    if (rv < 0) self->on_recv_error(static_cast<int>(rv));
    self->want_flush();
    self->hub_.flush_dirty();
  }
}

// ------------------------------------------------------------------------------------------
// client_link: a connection of the gRPC listener.

client_link::client_link(grpc_hub::impl& hub, socket_t sock, std::unique_ptr<tls::stream> tls)
    : link(hub, std::move(sock), std::move(tls)) {
  remote_ = sock_.remote_endpoint(ignored_).address().to_string();
}

void client_link::start() {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_begin_frame_callback(cb, on_begin_frame);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
  nghttp2_session* raw = nullptr;
  nghttp2_session_server_new2(&raw, cb, this, hub_.opts.o);
  nghttp2_session_callbacks_del(cb);
  s_.reset(raw);
  const auto& cfg = hub_.w.cfg();
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, cfg.grpc.max_concurrent_streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<std::uint32_t>(stream_window)},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<std::uint32_t>(cfg.client.max_header_bytes)},
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
  };
  nghttp2_submit_settings(s(), NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(s(), NGHTTP2_FLAG_NONE, 0, connection_window);
  max_header_bytes_ = cfg.client.max_header_bytes;
  timer_.emplace(sock_.get_executor());
  arm_idle(cfg.client.header_timeout, true);
  auto& st = hub_.w.stats();
  st.active_connections.add(1);
  st.grpc_connections.add(1);
  asio::co_spawn(sock_.get_executor(), read_loop(shared_from_this()), asio::detached);
  want_flush();
  hub_.flush_dirty();
}

void client_link::drain() {
  if (closed_ || draining_) return;
  draining_ = true;
  nghttp2_submit_goaway(s(), NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(s()), NGHTTP2_NO_ERROR,
                        nullptr, 0);
  want_flush();
}

void client_link::fault(grpc::conn_error why, std::uint32_t code) {
  if (!faulted_) {
    faulted_ = true;
    hub_.w.stats().grpc_conn_errors[static_cast<std::size_t>(why)].add(1);
    spdlog::debug("grpc: closing connection from {}: {}", remote_, grpc::to_string(why));
  }
  terminate(code);
}

void client_link::arm_idle(std::chrono::nanoseconds after, bool first) {
  if (lingering_) return;  // the timer bounds the lingering close now
  idle_first_ = first;
  timer_->expires_after(std::chrono::duration_cast<clock::duration>(after));
  std::weak_ptr<link> weak = shared_from_this();
  timer_->async_wait([weak](error_code ec) {
    auto self = std::static_pointer_cast<client_link>(weak.lock());
    if (ec || !self || self->closed_ || self->lingering_ || self->active_ > 0) return;
    if (self->idle_first_) {
      self->fault(grpc::conn_error::timeout, NGHTTP2_NO_ERROR);
    } else {
      self->terminate(NGHTTP2_NO_ERROR);
    }
    self->hub_.flush_dirty();
  });
}

void client_link::after_flush() {
  if (draining_ && calls.empty() && !nghttp2_session_want_write(s())) close();
}

void client_link::on_recv_error(int rv) {
  fault(rv == NGHTTP2_ERR_FLOODED ? grpc::conn_error::flood : grpc::conn_error::protocol,
        rv == NGHTTP2_ERR_FLOODED ? NGHTTP2_ENHANCE_YOUR_CALM : NGHTTP2_PROTOCOL_ERROR);
}

std::span<const std::uint8_t> client_link::incoming(std::span<const std::uint8_t> in) {
  const auto before = screen_.dropped();
  const auto out = screen_.feed(in, max_header_bytes_);
  if (screen_.dropped() != before)
    spdlog::debug("grpc: {} RST_STREAM from {} for streams it never opened, dropped", screen_.dropped() - before, remote_);
  // Before nghttp2 sees the block: its HPACK decoder refuses a field over 64 KiB with
  // COMPRESSION_ERROR before on_header could count it.
  if (out.error) fault(*out.error, NGHTTP2_ENHANCE_YOUR_CALM);
  return out.bytes;
}

int client_link::on_begin_frame(nghttp2_session*, const nghttp2_frame_hd* hd, void* user) {
  auto& l = self(user);
  // Every frame but HEADERS starts as a cheap one: a DATA frame earns its useful count in
  // on_frame_recv once it is known to carry payload (padding alone does not; DATA on a closed
  // stream never does), so that no padded or empty DATA flood passes as useful.
  if (hd->type == NGHTTP2_HEADERS) {
    l.budget_.useful();
  } else if (!l.budget_.cheap()) {
    l.fault(grpc::conn_error::flood, NGHTTP2_ENHANCE_YOUR_CALM);
  }
  return 0;
}

int client_link::on_frame_send(nghttp2_session*, const nghttp2_frame* f, void* user) {
  auto& l = self(user);
  if (f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) l.budget_.useful();
  // Protocol errors nghttp2 finds itself (window overflow, bad HPACK, DATA on stream 0, too many
  // streams, ...) end the connection with its own GOAWAY: counted here by its code.
  if (f->hd.type == NGHTTP2_GOAWAY && f->goaway.error_code != NGHTTP2_NO_ERROR && !l.faulted_) {
    l.faulted_ = true;
    const auto code = f->goaway.error_code;
    const auto why = code == NGHTTP2_FLOW_CONTROL_ERROR  ? grpc::conn_error::flow_control
                     : code == NGHTTP2_COMPRESSION_ERROR ? grpc::conn_error::compression
                     : code == NGHTTP2_ENHANCE_YOUR_CALM ? grpc::conn_error::flood
                                                         : grpc::conn_error::protocol;
    l.hub_.w.stats().grpc_conn_errors[static_cast<std::size_t>(why)].add(1);
  }
  return 0;
}

int client_link::on_begin_headers(nghttp2_session*, const nghttp2_frame* f, void* user) {
  auto& l = self(user);
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  if (l.closing_ || l.closed_) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  auto c = std::make_shared<call>();
  c->client = &l;
  c->csid = f->hd.stream_id;
  c->sent_after = l.drained_at_;
  l.calls.emplace(c->csid, c);
  ++l.opened_;
  l.hub_.w.stats().grpc_streams.add(1);
  return 0;
}

int client_link::on_header(nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
                           const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* user) {
  auto& l = self(user);
  auto c = l.find(f->hd.stream_id);
  if (!c) return 0;
  c->header_bytes += namelen + valuelen + 32;  // RFC 9113 §6.5.2's size of a header list
  if (c->header_bytes > l.max_header_bytes_) {
    l.fault(grpc::conn_error::header_list, NGHTTP2_ENHANCE_YOUR_CALM);
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  if (f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;  // request trailers: nothing to keep
  const auto n = sv(name, namelen);
  const auto v = sv(value, valuelen);
  if (!n.empty() && n.front() == ':') {
    // (:scheme is not kept: the replica is always spoken to in cleartext, "http".)
    if (n == ":method") c->method = v;
    else if (n == ":authority") c->authority = v;
    else if (n == ":path") c->path = v;
    return 0;
  }
  if (n == "host") {  // HTTP/1.1-style authority: becomes :authority upstream
    if (c->authority.empty()) c->authority = v;
    return 0;
  }
  if (n == "application") c->application = std::string(v);
  else if (n == "content-type") c->grpc_content = v.starts_with("application/grpc");
  else if (n == "x-request-id") c->request_id = v;
  else if (n == "grpc-timeout") c->timeout = grpc::parse_timeout(v);
  c->headers.push_back({std::string(n), std::string(v)});
  return 0;
}

int client_link::on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* user) {
  auto& l = self(user);
  auto c = l.find(f->hd.stream_id);
  if (!c) return 0;
  const bool end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
    // A whole request head: the connection is busy (the header or keep-alive deadline stops
    // until its calls are done; a header block left half-sent keeps it running).
    if (l.active_++ == 0 && l.timer_) l.timer_->cancel();
    c->state.request_head(end, c->grpc_content);
    l.hub_.start(c);
    return 0;
  }
  if (f->hd.type == NGHTTP2_DATA && f->hd.length > f->data.padlen) l.budget_.useful();
  if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) && end && c->state.request_end() && c->up)
    c->up->wake(c->usid);
  return 0;
}

int client_link::on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data,
                         std::size_t len, void* user) {
  auto& l = self(user);
  auto c = l.find(sid);
  // A call that already has its answer (an error before the request ended): its bytes are
  // dropped, the window reopened so that the client can finish sending.
  if (!c || !c->state.takes_request_data()) {
    nghttp2_session_consume(s, sid, len);
    return 0;
  }
  c->req.append(data, len);
  c->last_activity = l.read_at_;
  if (c->up) c->up->wake(c->usid);
  return 0;
}

int client_link::on_stream_close(nghttp2_session*, std::int32_t sid, std::uint32_t error_code, void* user) {
  auto& l = self(user);
  auto it = l.calls.find(sid);
  if (it == l.calls.end()) return 0;
  auto c = std::move(it->second);
  l.calls.erase(it);
  // (grpc::call_state::counts_as_early_reset says which resets are the rapid-reset attack.)
  if (c->state.counts_as_early_reset(error_code, clock::now()) && !l.budget_.reset_early(l.opened_))
    l.fault(grpc::conn_error::reset_flood, NGHTTP2_ENHANCE_YOUR_CALM);
  l.hub_.finish(c, error_code);
  if (c->state.started() && --l.active_ == 0 && !l.closed_ && !l.draining_)
    l.arm_idle(l.hub_.w.cfg().client.keepalive_timeout, false);
  if (l.calls.empty() && l.draining_) l.want_flush();
  return 0;
}

ssize_t client_link::read_response(nghttp2_session* s, std::int32_t sid, std::uint8_t* buf, std::size_t length,
                                   std::uint32_t* flags, nghttp2_data_source*, void* user) {
  auto& l = self(user);
  auto c = l.find(sid);
  if (!c) return NGHTTP2_ERR_DEFERRED;
  const std::size_t n = c->resp.take(buf, length);
  c->bytes_out += n;
  if (n > 0 && c->up) {
    // What the client took is acknowledged to the replica's stream (its window reopens): a
    // call's replica sends no faster than its client reads. The stream's window only: the
    // connection's reopened when the bytes arrived (upstream_link::on_data).
    nghttp2_session_consume_stream(c->up->s(), c->usid, n);
    c->up->want_flush();
  }
  if (c->resp.empty() && c->state.response_ended()) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!c->resp_trailers.empty()) {
      std::vector<nghttp2_nv> t;
      t.reserve(c->resp_trailers.size());
      std::optional<unsigned> status;
      for (const auto& h : c->resp_trailers) {
        if (h.name == "grpc-status") status = grpc::parse_status(h.value);
        t.push_back(nv(h.name, h.value));
      }
      c->state.trailers_sent(status);
      if (nghttp2_submit_trailer(s, sid, t.data(), t.size()) == 0) *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    c->resp.release();
    return static_cast<ssize_t>(n);
  }
  if (n == 0) return NGHTTP2_ERR_DEFERRED;
  return static_cast<ssize_t>(n);
}

/// After the last frame (a GOAWAY above all): the write side is shut, and what the client still
/// sends is read and dropped for up to a second before the socket closes. Closing with unread
/// bytes in the socket makes the kernel answer RST, which discards what was still queued for the
/// client — the GOAWAY that says why (HAProxy's and nginx's lingering close).
void client_link::finish() {
  if (closed_ || lingering_) return;
  lingering_ = true;
  closing_ = true;  // the read loop stops; linger() reads from here on
  if (tls_) tls_->shutdown_now();
  error_code ignored;
  sock_.shutdown(asio::socket_base::shutdown_send, ignored);
  asio::co_spawn(sock_.get_executor(), linger(std::static_pointer_cast<client_link>(shared_from_this())),
                 asio::detached);
}

awaitable<void> client_link::linger(std::shared_ptr<client_link> self) {
  self->timer_->expires_after(std::chrono::seconds(1));
  std::weak_ptr<link> weak = self;
  self->timer_->async_wait([weak](error_code ec) {
    if (auto l = weak.lock(); l && !ec) l->close();
  });
  std::array<std::uint8_t, 4096> sink;
  for (;;) {
    auto [ec, n] = co_await self->sock_.async_read_some(asio::buffer(sink), nothrow);
    if (ec || self->closed_) break;
  }
  self->close();
}

void client_link::on_closed() {
  auto calls_left = std::move(calls);
  calls.clear();
  for (auto& [sid, c] : calls_left) hub_.finish(c, NGHTTP2_CANCEL);
  auto& st = hub_.w.stats();
  st.active_connections.sub(1);
  st.grpc_connections.sub(1);
  if (tls_) st.tls_connections.sub(1);
  hub_.w.shared().connections.fetch_sub(1, std::memory_order_relaxed);
  hub_.clients.erase(std::static_pointer_cast<client_link>(shared_from_this()));
}

// ------------------------------------------------------------------------------------------
// upstream_link: a pooled connection to one gRPC replica.

upstream_link::upstream_link(grpc_hub::impl& hub, const topology::endpoint& ep)
    : link(hub, socket_t(hub.w.ioc())),
      key(ep.key),
      dial(ep.dial),
      keepalive_(std::chrono::duration_cast<clock::duration>(hub.w.cfg().grpc.keepalive_interval),
                 std::chrono::duration_cast<clock::duration>(hub.w.cfg().grpc.keepalive_timeout)) {}

grpc::link_room upstream_link::room() const {
  grpc::link_room r;
  r.usable = !closed_ && !closing_ && !retired_;
  if (!ready) {
    // Still connecting: the replica's limits are not known; a fresh connection's window is
    // HTTP/2's initial one.
    r.calls = waiting.size();
    r.stream_limit = max_waiting_per_link;
    r.send_window = 65535;
    return r;
  }
  r.calls = calls.size() + waiting.size();
  // After the replica's GOAWAY no new stream may open here.
  r.usable = r.usable && nghttp2_session_check_request_allowed(s()) != 0;
  r.stream_limit = std::min<std::size_t>(
      nghttp2_session_get_remote_settings(s(), NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS), max_streams_per_link);
  r.send_window = nghttp2_session_get_remote_window_size(s());
  return r;
}

void upstream_link::connect() {
  timer_.emplace(sock_.get_executor());
  asio::co_spawn(sock_.get_executor(), run(std::static_pointer_cast<upstream_link>(shared_from_this())),
                 asio::detached);
}

void upstream_link::retire() {
  retired_ = true;
  if (calls.empty() && waiting.empty()) close();
}

std::int32_t upstream_link::submit_request(std::span<const nghttp2_nv> head, bool body) {
  nghttp2_data_provider prd{};
  prd.read_callback = read_request;
  const auto sid = nghttp2_submit_request(s(), nullptr, head.data(), head.size(), body ? &prd : nullptr, nullptr);
  if (sid >= 0) want_flush();
  return sid;
}

void upstream_link::cancel(std::int32_t sid) {
  nghttp2_submit_rst_stream(s(), NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
  calls.erase(sid);
  want_flush();
}

awaitable<void> upstream_link::run(std::shared_ptr<upstream_link> self) {
  const auto timeout = self->hub_.w.cfg().upstream.connect_timeout;
  self->timer_->expires_after(std::chrono::duration_cast<clock::duration>(timeout));
  std::weak_ptr<link> weak = self;
  bool timed_out = false;
  self->timer_->async_wait([weak, &timed_out](error_code ec) {
    if (ec) return;
    if (auto l = weak.lock()) {
      timed_out = true;
      error_code ignored;
      static_cast<upstream_link*>(l.get())->sock_.close(ignored);
    }
  });
  auto [ec] = co_await self->sock_.async_connect(self->dial, nothrow);
  self->timer_->cancel();
  if (self->closed_) co_return;
  if (ec) {
    self->connect_failed(timed_out ? "connect timed out" : ec.message());
    self->hub_.flush_dirty();
    co_return;
  }
  error_code ignored;
  self->sock_.set_option(tcp::no_delay(true), ignored);
  self->open_session();
  self->ready = true;
  self->read_at_ = clock::now();
  self->arm_keepalive();
  auto waiting = std::move(self->waiting);
  for (auto& c : waiting)
    if (c->client) self->hub_.submit(c, *self);
  self->want_flush();
  self->hub_.flush_dirty();
  co_await read_loop(self);
}

void upstream_link::open_session() {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
  nghttp2_session* raw = nullptr;
  nghttp2_session_client_new2(&raw, cb, this, hub_.opts.o);
  nghttp2_session_callbacks_del(cb);
  s_.reset(raw);
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<std::uint32_t>(stream_window)},
  };
  nghttp2_submit_settings(s(), NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(s(), NGHTTP2_FLAG_NONE, 0, connection_window);
}

void upstream_link::arm_keepalive() {
  if (!keepalive_.enabled() || closed_) return;
  timer_->expires_after(keepalive_.next_tick());
  std::weak_ptr<link> weak = shared_from_this();
  timer_->async_wait([weak](error_code ec) {
    auto self = std::static_pointer_cast<upstream_link>(weak.lock());
    if (ec || !self || self->closed_) return;
    switch (self->keepalive_.tick(clock::now(), !self->calls.empty(), self->read_at_)) {
      case grpc::keepalive::action::ping:
        nghttp2_submit_ping(self->s(), NGHTTP2_FLAG_NONE, nullptr);
        self->want_flush();
        break;
      case grpc::keepalive::action::lost:
        spdlog::info("grpc: replica {} did not answer a keepalive PING in time: connection closed", self->key);
        self->lost_why_ = "the replica did not answer a keepalive PING within grpc.keepalive_timeout";
        self->close();
        self->hub_.flush_dirty();
        return;
      case grpc::keepalive::action::none:
        break;
    }
    self->arm_keepalive();
    self->hub_.flush_dirty();
  });
}

void upstream_link::after_flush() {
  if (calls.empty()) {
    idle_since = clock::now();
    if (retired_) close();
  }
}

int upstream_link::on_header(nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
                             const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* user) {
  auto& l = self(user);
  auto c = l.find(f->hd.stream_id);
  if (!c || f->hd.type != NGHTTP2_HEADERS) return 0;
  const bool trailers = f->headers.cat == NGHTTP2_HCAT_HEADERS;
  auto& list = trailers ? c->resp_trailers : c->resp_headers;
  auto& size = trailers ? c->resp_trailers_size : c->resp_headers_size;
  size += namelen + valuelen + 32;  // RFC 9113 §6.5.2
  if (size > max_upstream_headers) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  list.push_back({std::string(sv(name, namelen)), std::string(sv(value, valuelen))});
  return 0;
}

int upstream_link::on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* user) {
  auto& l = self(user);
  if (f->hd.type == NGHTTP2_GOAWAY) {
    // No new calls here; the open ones finish (streams past last_stream_id are closed by
    // nghttp2 with REFUSED_STREAM, and their clients told to retry).
    l.said_goodbye = true;
    l.retire();
    return 0;
  }
  if (f->hd.type == NGHTTP2_SETTINGS && !(f->hd.flags & NGHTTP2_FLAG_ACK) && !l.settings_known) {
    // The replica's limits are known now (nghttp2 applied them before this callback): the
    // calls held for them go out, or are answered here (grpc_hub::impl::submit).
    l.settings_known = true;
    auto held = std::move(l.waiting);
    l.waiting.clear();
    for (auto& c : held)
      if (c->client) l.hub_.submit(c, l);
    return 0;
  }
  if (f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) l.keepalive_.data_received();
  auto c = l.find(f->hd.stream_id);
  if (!c) return 0;
  const bool end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_RESPONSE) {
    c->last_activity = l.read_at_;
    bool informational = false;
    for (const auto& h : c->resp_headers)
      if (h.name == ":status") informational = !h.value.empty() && h.value.front() == '1';
    if (!informational && c->target && c->target->state) c->target->state->errors.store(0, std::memory_order_relaxed);
    l.hub_.respond(c, end, informational);
    return 0;
  }
  if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) && end) {
    c->state.response_end();
    if (c->client) c->client->wake(c->csid);
  }
  return 0;
}

int upstream_link::on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data,
                           std::size_t len, void* user) {
  auto& l = self(user);
  auto c = l.find(sid);
  if (!c || !c->client) {
    nghttp2_session_consume(s, sid, len);  // nobody takes them: open the window at once
    return 0;
  }
  c->resp.append(data, len);
  c->last_activity = l.read_at_;
  // Isolation (issue #31): the link's connection window reopens as soon as the bytes are
  // queued, and only the stream's window waits for the client to take them (read_response).
  // A client that stops reading then holds at most one stream window (256 KiB) of its own call,
  // and never the window every other call on this link shares.
  nghttp2_session_consume_connection(s, len);
  c->client->wake(c->csid);
  return 0;
}

int upstream_link::on_stream_close(nghttp2_session*, std::int32_t sid, std::uint32_t error_code, void* user) {
  auto& l = self(user);
  auto it = l.calls.find(sid);
  if (it == l.calls.end()) return 0;
  auto c = std::move(it->second);
  l.calls.erase(it);
  c->up = nullptr;
  // (Bytes still queued for the client were acknowledged to the connection when they came.)
  if (l.calls.empty()) l.idle_since = clock::now();
  l.hub_.upstream_gone(c, error_code, false);
  if (l.retired_ && l.calls.empty()) l.want_flush();
  return 0;
}

ssize_t upstream_link::read_request(nghttp2_session*, std::int32_t sid, std::uint8_t* buf, std::size_t length,
                                    std::uint32_t* flags, nghttp2_data_source*, void* user) {
  auto& l = self(user);
  auto c = l.find(sid);
  if (!c) return NGHTTP2_ERR_DEFERRED;
  const std::size_t n = c->req.take(buf, length);
  if (n > 0 && c->client) {
    // What the replica took is acknowledged to the client (stream and connection windows).
    nghttp2_session_consume(c->client->s(), c->csid, n);
    c->client->want_flush();
  }
  if (c->req.empty() && c->state.request_ended()) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    c->req.release();
    return static_cast<ssize_t>(n);
  }
  if (n == 0) return NGHTTP2_ERR_DEFERRED;
  return static_cast<ssize_t>(n);
}

void upstream_link::connect_failed(const std::string& what) {
  spdlog::debug("grpc: connect to {} failed: {}", key, what);
  auto waiting_calls = std::move(waiting);
  waiting.clear();
  close();
  for (auto& c : waiting_calls) {
    if (!c->client) continue;
    if (c->target) hub_.w.note_upstream_error(*c->target, what, hub_.w.cfg().health.error_limit);
    c->tried.push_back(key);
    c->mark.clear();
    if (c->retries++ < hub_.w.cfg().upstream.retries) {
      hub_.dispatch(c);
    } else {
      hub_.fail(c, grpc::status::unavailable, reason::upstream_error, "could not connect to a replica: " + what);
    }
  }
}

void upstream_link::on_closed() {
  hub_.drop(this);
  auto calls_left = std::move(calls);
  calls.clear();
  for (auto& [sid, c] : calls_left) {
    c->up = nullptr;
    hub_.upstream_gone(c, NGHTTP2_INTERNAL_ERROR, !said_goodbye, lost_why_);
  }
  auto waiting_calls = std::move(waiting);
  waiting.clear();
  for (auto& c : waiting_calls)
    if (c->client) hub_.fail(c, grpc::status::unavailable, reason::upstream_error, "connection to the replica closed");
}

}  // namespace ingressd::server::grpc_links
