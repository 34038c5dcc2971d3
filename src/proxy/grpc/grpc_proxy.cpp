#include "proxy/grpc/grpc_proxy.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <spdlog/spdlog.h>

#include "ingressd/grpc/nghttp2.hpp"
#include "ingressd/grpc/protocol.hpp"
#include "ingressd/routing/chooser.hpp"
#include "worker/worker.hpp"

namespace ingressd::server {
namespace {

using clock = std::chrono::steady_clock;
using socket_t = grpc_hub::socket;

/// Frames gathered from nghttp2 per write: one sendmsg for a whole event-loop turn's output of a
/// connection (every stream's frames together), and what a connection may hold unsent.
constexpr std::size_t out_cap = 64 * 1024;
constexpr std::size_t read_size = 16 * 1024;
/// Per-stream flow-control window announced on both sides: what a call may hold in each
/// direction. The connection window bounds a client's calls together; on an upstream link it
/// reopens as response bytes arrive (upstream_link::on_data), so the calls of many clients that
/// share a link never wait for each other's readers (docs/grpc.md, "Isolation").
constexpr std::int32_t stream_window = 256 * 1024;
constexpr std::int32_t connection_window = 1024 * 1024;
/// The header list a gRPC server accepts when it says nothing (grpc core's default
/// GRPC_ARG_MAX_METADATA_SIZE): a larger one waits for the replica's SETTINGS before it is sent.
constexpr std::size_t default_header_list = 8 * 1024;
/// A response header list from a replica past this is refused (the stream fails INTERNAL).
constexpr std::size_t max_upstream_headers = 64 * 1024;
/// How long an upstream connection without streams is kept.
constexpr auto upstream_idle = std::chrono::seconds(60);

struct header {
  std::string name, value;
};

using grpc::nv;
using grpc::session_ptr;
using grpc::sv;

struct options_holder {
  nghttp2_option* o = nullptr;
  options_holder() {
    nghttp2_option_new(&o);
    // Windows are opened by hand: a stream's as the other side takes its bytes (the
    // back-pressure of a relay), an upstream link's connection window as the bytes arrive
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
  ~options_holder() { nghttp2_option_del(o); }
  options_holder(const options_holder&) = delete;
  options_holder& operator=(const options_holder&) = delete;
};

class link;
class client_link;
class upstream_link;

/// One proxied call: a client stream and, once dispatched, an upstream stream. Held by the maps
/// of the connections it is on; `client`/`up` are set exactly while it is in their maps.
struct call {
  client_link* client = nullptr;
  std::int32_t csid = 0;
  upstream_link* up = nullptr;
  std::int32_t usid = 0;

  std::string method, scheme, authority, path;
  std::vector<header> headers;  // the request's regular headers (metadata), in order
  std::size_t header_bytes = 0;
  std::optional<std::string> application;
  bool grpc_content = false;  // content-type application/grpc[+...]
  bool started = false;  // the request head is complete (the call was dispatched)
  /// A whole request head that is not a gRPC call (an h2-only HTTP client): refused with
  /// HTTP_1_1_REQUIRED, logged as 505, not counted as a gRPC call.
  bool http_request() const noexcept { return started && !grpc_content; }
  std::string request_id;
  std::optional<std::chrono::nanoseconds> timeout;

  grpc::byte_queue req, resp;
  bool req_end = false;      // the client ended its side
  bool resp_started = false; // response headers submitted to the client
  bool resp_end = false;     // nothing more will be added to resp (trailers below, if any)
  bool resp_trailers_only = false;
  std::vector<header> resp_headers, resp_trailers;
  std::optional<unsigned> status;  // grpc-status the client gets

  std::shared_ptr<const topology::snapshot> snap;
  std::optional<std::size_t> app;
  const topology::endpoint* target = nullptr;
  topology::in_flight_mark mark;
  std::vector<std::string> tried;  // keys that refused this call
  unsigned retries = 0;
  std::optional<asio::steady_timer> deadline;
  /// The client sent the call's HEADERS no earlier than this (link::drained_at).
  clock::time_point sent_after;
  /// When a reset of this call by its client is on time, not abuse (client_link::on_stream_close):
  /// from a little before its grpc-timeout counted from `sent_after`. Unset: no deadline.
  std::optional<clock::time_point> reset_on_time_from;

  clock::time_point start = clock::now();
  std::chrono::system_clock::time_point wall = std::chrono::system_clock::now();
  std::uint64_t bytes_out = 0;
  std::optional<reason> why;
  std::optional<metrics::termination> term;
};
using call_ptr = std::shared_ptr<call>;

}  // namespace

struct grpc_hub::impl {
  explicit impl(worker& w) : w(w) {}
  worker& w;
  options_holder opts;
  std::unordered_set<std::shared_ptr<client_link>> clients;
  std::unordered_map<std::string, std::vector<std::shared_ptr<upstream_link>>> upstreams;
  std::vector<std::shared_ptr<link>> dirty;
  bool draining = false;
  std::uint64_t streams = 0;  // open client streams (calls)
  std::size_t rotor = 0;      // where ties among equally loaded replicas start

  void flush_dirty();
  // The call flow (below the link classes).
  void start(const call_ptr& c);
  void dispatch(const call_ptr& c);
  void submit(const call_ptr& c, upstream_link& l);
  void fail(const call_ptr& c, grpc::status st, reason why, std::string_view text);
  void respond(const call_ptr& c, bool end_stream);
  void finish(const call_ptr& c, std::uint32_t error_code);
  void upstream_gone(const call_ptr& c, std::uint32_t error_code, bool connection_lost);
  std::shared_ptr<upstream_link> acquire(const topology::endpoint& ep);
  void drop(upstream_link* l);
};

namespace {

/// An HTTP/2 connection: its socket, its nghttp2 session, and the write side (frames nghttp2
/// produced that the socket has not taken). Writes are batched: whatever changes a session marks
/// it dirty, and the hub flushes every dirty connection once per event (a read, a timer), so all
/// of a turn's frames for one connection leave in one send.
class link : public std::enable_shared_from_this<link> {
 public:
  link(grpc_hub::impl& hub, socket_t sock, std::unique_ptr<tls::stream> tls = nullptr)
      : hub_(hub), sock_(std::move(sock)), tls_(std::move(tls)) {
    error_code ignored;
    sock_.set_option(tcp::no_delay(true), ignored);
    if (tls_) tls_->rebind(sock_);
  }
  virtual ~link() = default;
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  nghttp2_session* s() const { return s_.get(); }
  bool closed() const { return closed_; }
  grpc_hub::impl& hub() { return hub_; }

  void want_flush() {
    if (dirty_ || closed_) return;
    dirty_ = true;
    hub_.dirty.push_back(shared_from_this());
  }

  void flush() {
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

  /// Ends the connection with GOAWAY `code` (sent before the socket closes).
  void terminate(std::uint32_t code) {
    if (closed_ || !s_) return;
    nghttp2_session_terminate_session(s(), code);
    closing_ = true;
    want_flush();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    if (tls_ && sock_.is_open()) tls_->shutdown_now();
    sock_.close(ignored);
    if (timer_) timer_->cancel();
    on_closed();
  }

 protected:
  static awaitable<void> wait_writable(std::shared_ptr<link> self, asio::socket_base::wait_type wait) {
    auto [ec] = co_await self->sock_.async_wait(wait, nothrow);
    self->write_waiting_ = false;
    if (ec) {
      self->close();
    } else {
      self->flush();
    }
    self->hub_.flush_dirty();
  }

  static awaitable<void> read_loop(std::shared_ptr<link> self) {
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
      const auto read_at = clock::now();
      const auto bytes = self->incoming({buf.data(), n});
      const auto rv = nghttp2_session_mem_recv(self->s(), bytes.data(), bytes.size());
      if (n < buf.size()) self->drained_at = read_at;  // after the batch: its frames use the earlier mark
      if (rv < 0) self->on_recv_error(static_cast<int>(rv));
      self->want_flush();
      self->hub_.flush_dirty();
    }
  }

  /// What of the bytes just read goes to nghttp2 (client_link drops resets of idle streams).
  virtual std::span<const std::uint8_t> incoming(std::span<const std::uint8_t> in) { return in; }
  virtual void on_closed() = 0;
  /// Everything the session had to say is written: end the connection.
  virtual void finish() { close(); }
  virtual void after_flush() {}
  virtual void on_read_error(const error_code&) {}
  virtual void on_recv_error(int rv) { terminate(rv == NGHTTP2_ERR_FLOODED ? NGHTTP2_ENHANCE_YOUR_CALM : NGHTTP2_PROTOCOL_ERROR); }

  grpc_hub::impl& hub_;
  socket_t sock_;
  std::unique_ptr<tls::stream> tls_;  // gRPC over the HTTPS listener (ALPN h2)
  session_ptr s_;
  std::vector<std::uint8_t> out_;
  std::size_t out_off_ = 0;
  bool dirty_ = false;
  bool write_waiting_ = false;
  bool closed_ = false;
  /// When a read last took everything the socket held: every frame read since was sent after
  /// it. A busy worker reads a client's HEADERS and the RST_STREAM it sent a deadline later in
  /// one batch; this, not the batch's time, is when such a call may have begun.
  clock::time_point drained_at = clock::now();
  bool closing_ = false;  // GOAWAY queued after an error: close once it is written
  std::optional<asio::steady_timer> timer_;

 public:
  std::unordered_map<std::int32_t, call_ptr> calls;
  call_ptr find(std::int32_t sid) const {
    auto it = calls.find(sid);
    return it == calls.end() ? nullptr : it->second;
  }
};

/// More bytes (or the end) for stream `sid` of `l`: its data provider is asked again, and `l`
/// flushed with the rest of this event's output.
void wake(link* l, std::int32_t sid) {
  nghttp2_session_resume_data(l->s(), sid);
  l->want_flush();
}

// ------------------------------------------------------------------------------------------
// Client side: a connection of the gRPC listener.

class client_link final : public link {
 public:
  client_link(grpc_hub::impl& hub, socket_t sock, std::unique_ptr<tls::stream> tls)
      : link(hub, std::move(sock), std::move(tls)) {
    remote_ = sock_.remote_endpoint(ignored_).address().to_string();
  }

  void start() {
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

  /// Drain: no new streams; close once the open ones are done.
  void drain() {
    if (closed_ || draining_) return;
    draining_ = true;
    nghttp2_submit_goaway(s(), NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(s()), NGHTTP2_NO_ERROR,
                          nullptr, 0);
    want_flush();
  }

  const std::string& remote() const { return remote_; }
  void set_remote(std::string r) { remote_ = std::move(r); }
  std::uint64_t opened = 0;

  /// The connection ends for abuse or a protocol error: counted, then GOAWAY `code`.
  void fault(grpc::conn_error why, std::uint32_t code) {
    if (!faulted_) {
      faulted_ = true;
      hub_.w.stats().grpc_conn_errors[static_cast<std::size_t>(why)].add(1);
      spdlog::debug("grpc: closing connection from {}: {}", remote_, grpc::to_string(why));
    }
    terminate(code);
  }

  grpc::frame_budget budget;
  /// Resets of streams the client never opened, dropped before nghttp2 (grpc::idle_reset_filter).
  grpc::idle_reset_filter filter_;

 private:
  void arm_idle(std::chrono::nanoseconds after, bool first) {
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

  void after_flush() override {
    if (draining_ && calls.empty() && !nghttp2_session_want_write(s())) close();
  }

  void on_recv_error(int rv) override {
    fault(rv == NGHTTP2_ERR_FLOODED ? grpc::conn_error::flood : grpc::conn_error::protocol,
          rv == NGHTTP2_ERR_FLOODED ? NGHTTP2_ENHANCE_YOUR_CALM : NGHTTP2_PROTOCOL_ERROR);
  }

  std::span<const std::uint8_t> incoming(std::span<const std::uint8_t> in) override {
    const auto before = filter_.dropped();
    auto out = filter_.feed(in);
    if (filter_.dropped() != before)
      spdlog::debug("grpc: {} RST_STREAM from {} for streams it never opened, dropped", filter_.dropped() - before, remote_);
    return out;
  }
  void on_closed() override;

  static client_link& self(void* user) { return *static_cast<client_link*>(user); }

  static int on_begin_frame(nghttp2_session*, const nghttp2_frame_hd* hd, void* user) {
    auto& l = self(user);
    // Every frame but HEADERS starts as a cheap one: a DATA frame earns its useful count in
    // on_frame_recv once it is known to carry payload (padding alone does not; DATA on a closed
    // stream never does), so that no padded or empty DATA flood passes as useful.
    if (hd->type == NGHTTP2_HEADERS) {
      l.budget.useful();
    } else if (!l.budget.cheap()) {
      l.fault(grpc::conn_error::flood, NGHTTP2_ENHANCE_YOUR_CALM);
    }
    return 0;
  }

  static int on_frame_send(nghttp2_session*, const nghttp2_frame* f, void* user) {
    auto& l = self(user);
    if (f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) l.budget.useful();
    // Protocol errors nghttp2 finds itself (window overflow, bad HPACK, DATA on stream 0, too many
    // streams, ...) end the connection with its own GOAWAY: counted here by its code.
    if (f->hd.type == NGHTTP2_GOAWAY && f->goaway.error_code != NGHTTP2_NO_ERROR && !l.faulted_) {
      l.faulted_ = true;
      const auto code = f->goaway.error_code;
      const auto why = code == NGHTTP2_FLOW_CONTROL_ERROR ? grpc::conn_error::flow_control
                       : code == NGHTTP2_COMPRESSION_ERROR ? grpc::conn_error::compression
                       : code == NGHTTP2_ENHANCE_YOUR_CALM ? grpc::conn_error::flood
                                                           : grpc::conn_error::protocol;
      l.hub_.w.stats().grpc_conn_errors[static_cast<std::size_t>(why)].add(1);
    }
    return 0;
  }

  static int on_begin_headers(nghttp2_session* s, const nghttp2_frame* f, void* user) {
    auto& l = self(user);
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    if (l.closing_ || l.closed_) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    auto c = std::make_shared<call>();
    c->client = &l;
    c->csid = f->hd.stream_id;
    c->sent_after = l.drained_at;
    l.calls.emplace(c->csid, c);
    ++l.opened;
    ++l.hub_.streams;
    l.hub_.w.stats().grpc_streams.add(1);
    (void)s;
    return 0;
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
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
      if (n == ":method") c->method = v;
      else if (n == ":scheme") c->scheme = v;
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

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* user) {
    auto& l = self(user);
    auto c = l.find(f->hd.stream_id);
    if (!c) return 0;
    const bool end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
      // A whole request head: the connection is busy (the header or keep-alive deadline stops
      // until its calls are done; a header block left half-sent keeps it running).
      c->started = true;
      if (l.active_++ == 0 && l.timer_) l.timer_->cancel();
      c->req_end = end;
      l.hub_.start(c);
      return 0;
    }
    if (f->hd.type == NGHTTP2_DATA && f->hd.length > f->data.padlen) l.budget.useful();
    if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) && end && !c->req_end) {
      c->req_end = true;
      if (c->up) {
        wake(reinterpret_cast<link*>(c->up), c->usid);
      }
    }
    return 0;
  }

  static int on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data, std::size_t len,
                     void* user);
  static int on_stream_close(nghttp2_session*, std::int32_t sid, std::uint32_t error_code, void* user);

  error_code ignored_;
  std::string remote_;
  std::size_t max_header_bytes_ = 64 * 1024;
  bool draining_ = false;
  bool faulted_ = false;
  bool idle_first_ = true;
  bool lingering_ = false;
  std::size_t active_ = 0;  // calls whose request head is complete and that are not finished

  /// After the last frame (a GOAWAY above all): the write side is shut, and what the client
  /// still sends is read and dropped for up to a second before the socket closes. Closing with
  /// unread bytes in the socket makes the kernel answer RST, which discards what was still queued
  /// for the client — the GOAWAY that says why (HAProxy's and nginx's lingering close).
  void finish() override {
    if (closed_ || lingering_) return;
    lingering_ = true;
    closing_ = true;  // the read loop stops; linger() reads from here on
    if (tls_) tls_->shutdown_now();
    error_code ignored;
    sock_.shutdown(asio::socket_base::shutdown_send, ignored);
    asio::co_spawn(sock_.get_executor(), linger(std::static_pointer_cast<client_link>(shared_from_this())),
                   asio::detached);
  }
  static awaitable<void> linger(std::shared_ptr<client_link> self) {
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

  friend struct grpc_hub::impl;
};

// ------------------------------------------------------------------------------------------
// Upstream side: a pooled connection to one gRPC replica, many calls multiplexed on it.

class upstream_link final : public link {
 public:
  upstream_link(grpc_hub::impl& hub, const topology::endpoint& ep)
      : link(hub, socket_t(hub.w.ioc())), key(ep.key), dial(ep.dial) {}

  const std::string key;
  const tcp::endpoint dial;
  bool ready = false;
  /// The replica's SETTINGS have arrived (its header list limit is known).
  bool settings_known = false;
  /// The replica sent GOAWAY: the connection closes because the replica chose to (a call it
  /// refused, a drain), which says nothing of the replica's health.
  bool said_goodbye = false;
  /// Calls that wait for the connect, or for the replica's SETTINGS (a header list larger than
  /// a gRPC server accepts by default: grpc_hub::impl::submit).
  std::vector<call_ptr> waiting;
  clock::time_point idle_since = clock::now();

  /// Streams it may still take.
  bool has_room() const {
    if (closed_ || closing_) return false;
    if (!ready) return waiting.size() < 100;
    if (!nghttp2_session_check_request_allowed(s())) return false;
    const auto limit = std::min<std::uint32_t>(
        nghttp2_session_get_remote_settings(s(), NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS), 1000);
    return calls.size() < limit;
  }

  void connect() {
    timer_.emplace(sock_.get_executor());
    asio::co_spawn(sock_.get_executor(), run(std::static_pointer_cast<upstream_link>(shared_from_this())),
                   asio::detached);
  }

  /// Closes once no call is on it (topology change, drain).
  void retire() {
    retired_ = true;
    if (calls.empty() && waiting.empty()) close();
  }
  bool retired() const { return retired_; }

 private:
  static awaitable<void> run(std::shared_ptr<upstream_link> self) {
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
    auto waiting = std::move(self->waiting);
    for (auto& c : waiting)
      if (c->client) self->hub_.submit(c, *self);
    self->want_flush();
    self->hub_.flush_dirty();
    co_await read_loop(self);
  }

  void open_session() {
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

  void connect_failed(const std::string& what);
  void on_closed() override;
  void on_read_error(const error_code&) override {}
  void after_flush() override {
    if (calls.empty()) {
      idle_since = clock::now();
      if (retired_) close();
    }
  }

  static upstream_link& self(void* user) { return *static_cast<upstream_link*>(user); }

  static int on_header(nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
                       const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* user) {
    auto& l = self(user);
    auto c = l.find(f->hd.stream_id);
    if (!c || f->hd.type != NGHTTP2_HEADERS) return 0;
    auto& list = f->headers.cat == NGHTTP2_HCAT_HEADERS ? c->resp_trailers : c->resp_headers;
    std::size_t total = 0;
    for (const auto& h : list) total += h.name.size() + h.value.size() + 32;
    if (total + namelen + valuelen > max_upstream_headers) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    list.push_back({std::string(sv(name, namelen)), std::string(sv(value, valuelen))});
    return 0;
  }

  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* user) {
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
    auto c = l.find(f->hd.stream_id);
    if (!c) return 0;
    const bool end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (f->hd.type == NGHTTP2_HEADERS) {
      if (f->headers.cat == NGHTTP2_HCAT_RESPONSE) {
        // 1xx heads are informational; gRPC servers send none, and the client needs none.
        for (const auto& h : c->resp_headers)
          if (h.name == ":status" && !h.value.empty() && h.value.front() == '1') {
            c->resp_headers.clear();
            return 0;
          }
        if (c->target && c->target->state) c->target->state->errors.store(0, std::memory_order_relaxed);
        l.hub_.respond(c, end);
      } else if (end) {
        c->resp_end = true;
        if (c->client) {
          wake(reinterpret_cast<link*>(c->client), c->csid);
        }
      }
      return 0;
    }
    if (f->hd.type == NGHTTP2_DATA && end) {
      c->resp_end = true;
      if (c->client) {
        wake(reinterpret_cast<link*>(c->client), c->csid);
      }
    }
    return 0;
  }

  static int on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data, std::size_t len,
                     void* user) {
    auto& l = self(user);
    auto c = l.find(sid);
    if (!c || !c->client) {
      nghttp2_session_consume(s, sid, len);  // nobody takes them: open the window at once
      return 0;
    }
    c->resp.append(data, len);
    // Isolation (issue #31): the link's connection window reopens as soon as the bytes are
    // queued, and only the stream's window waits for the client to take them (read_response).
    // A client that stops reading then holds at most one stream window (256 KiB) of its own
    // call, and never the window every other call on this link shares.
    nghttp2_session_consume_connection(s, len);
    wake(reinterpret_cast<link*>(c->client), c->csid);
    return 0;
  }

  static int on_stream_close(nghttp2_session*, std::int32_t sid, std::uint32_t error_code, void* user) {
    auto& l = self(user);
    auto it = l.calls.find(sid);
    if (it == l.calls.end()) return 0;
    auto c = std::move(it->second);
    l.calls.erase(it);
    c->up = nullptr;
    // (Bytes still queued for the client were acknowledged to the connection when they came.)
    if (l.calls.empty()) l.idle_since = clock::now();
    if (!c->resp_end || error_code != NGHTTP2_NO_ERROR) l.hub_.upstream_gone(c, error_code, false);
    if (l.retired_ && l.calls.empty()) l.want_flush();
    return 0;
  }

  bool retired_ = false;
  friend struct grpc_hub::impl;
};

// --- Data providers: a call's queue read into the other connection's DATA frames -------------

/// Response bytes for the client stream. What is taken is acknowledged to the replica's stream
/// (its window reopens): a call's replica sends no faster than its client reads.
ssize_t read_response(nghttp2_session* s, std::int32_t sid, std::uint8_t* buf, std::size_t length,
                      std::uint32_t* flags, nghttp2_data_source*, void* user) {
  auto& l = *static_cast<client_link*>(user);
  auto c = l.find(sid);
  if (!c) return NGHTTP2_ERR_DEFERRED;
  const std::size_t n = c->resp.take(buf, length);
  c->bytes_out += n;
  if (n > 0 && c->up) {
    // The stream's window only: the connection's reopened when the bytes arrived (on_data).
    nghttp2_session_consume_stream(reinterpret_cast<link*>(c->up)->s(), c->usid, n);
    reinterpret_cast<link*>(c->up)->want_flush();
  }
  if (c->resp.empty() && c->resp_end) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!c->resp_trailers.empty()) {
      std::vector<nghttp2_nv> t;
      t.reserve(c->resp_trailers.size());
      for (const auto& h : c->resp_trailers) {
        if (h.name == "grpc-status") c->status = grpc::parse_status(h.value);
        t.push_back(nv(h.name, h.value));
      }
      if (nghttp2_submit_trailer(s, sid, t.data(), t.size()) == 0) *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    c->resp.release();
    return static_cast<ssize_t>(n);
  }
  if (n == 0) return NGHTTP2_ERR_DEFERRED;
  return static_cast<ssize_t>(n);
}

/// Request bytes for the upstream stream; what is taken is acknowledged to the client.
ssize_t read_request(nghttp2_session*, std::int32_t sid, std::uint8_t* buf, std::size_t length, std::uint32_t* flags,
                     nghttp2_data_source*, void* user) {
  auto& l = *static_cast<upstream_link*>(user);
  auto c = l.find(sid);
  if (!c) return NGHTTP2_ERR_DEFERRED;
  const std::size_t n = c->req.take(buf, length);
  if (n > 0 && c->client) {
    nghttp2_session_consume(reinterpret_cast<link*>(c->client)->s(), c->csid, n);
    reinterpret_cast<link*>(c->client)->want_flush();
  }
  if (c->req.empty() && c->req_end) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    c->req.release();
    return static_cast<ssize_t>(n);
  }
  if (n == 0) return NGHTTP2_ERR_DEFERRED;
  return static_cast<ssize_t>(n);
}

int client_link::on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data,
                         std::size_t len, void* user) {
  auto& l = self(user);
  auto c = l.find(sid);
  // A call that already has its answer (an error before the request ended): its bytes are
  // dropped, the window reopened so that the client can finish sending.
  if (!c || c->status || c->resp_end) {
    nghttp2_session_consume(s, sid, len);
    return 0;
  }
  c->req.append(data, len);
  if (c->up) {
    wake(reinterpret_cast<link*>(c->up), c->usid);
  }
  return 0;
}

int client_link::on_stream_close(nghttp2_session*, std::int32_t sid, std::uint32_t error_code, void* user) {
  auto& l = self(user);
  auto it = l.calls.find(sid);
  if (it == l.calls.end()) return 0;
  auto c = std::move(it->second);
  l.calls.erase(it);
  // A client that resets most of its streams before their answer starts is flooding us (rapid
  // reset): each such stream cost a dispatch and an upstream stream. A reset when the call's own
  // deadline has (nearly) passed is a client giving up on time, as grpcio does for every call
  // whose deadline passes: not counted (issue #31: 1,500 calls with a 20 ms deadline tripped the
  // rule and cut unrelated calls). Such resets come at most one per stream per deadline, so the
  // streams a connection may hold bound them; the attack opens and resets at once.
  const bool on_time = c->reset_on_time_from && clock::now() >= *c->reset_on_time_from;
  if (error_code != NGHTTP2_NO_ERROR && !c->resp_started && !on_time && !l.budget.reset_early(l.opened))
    l.fault(grpc::conn_error::reset_flood, NGHTTP2_ENHANCE_YOUR_CALM);
  l.hub_.finish(c, error_code);
  if (c->started && --l.active_ == 0 && !l.closed_ && !l.draining_)
    l.arm_idle(l.hub_.w.cfg().client.keepalive_timeout, false);
  if (l.calls.empty() && l.draining_) l.want_flush();
  return 0;
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
    hub_.upstream_gone(c, NGHTTP2_INTERNAL_ERROR, !said_goodbye);
  }
  auto waiting_calls = std::move(waiting);
  waiting.clear();
  for (auto& c : waiting_calls)
    if (c->client) hub_.fail(c, grpc::status::unavailable, reason::upstream_error, "connection to the replica closed");
}

}  // namespace

// ------------------------------------------------------------------------------------------
// The call flow.

void grpc_hub::impl::flush_dirty() {
  // Flushing may mark more connections dirty (a data provider reopens the other side's window).
  for (std::size_t i = 0; i < dirty.size(); ++i) {
    auto l = dirty[i];
    l->flush();
  }
  dirty.clear();
}

void grpc_hub::impl::start(const call_ptr& c) {
  c->snap = w.snapshot_ptr();
  if (c->timeout && c->client) {
    c->deadline.emplace(w.ioc());
    const auto timeout = std::chrono::duration_cast<clock::duration>(
        std::min<std::chrono::nanoseconds>(*c->timeout, std::chrono::hours(24 * 365)));
    c->deadline->expires_after(timeout);
    c->reset_on_time_from = c->sent_after + timeout - std::max<clock::duration>(timeout / 10, std::chrono::milliseconds(5));
    std::weak_ptr<call> weak = c;
    c->deadline->async_wait([this, weak](error_code ec) {
      auto cp = weak.lock();
      if (ec || !cp || !cp->client) return;
      fail(cp, grpc::status::deadline_exceeded, reason::upstream_timeout, "deadline exceeded (grpc-timeout)");
      flush_dirty();
    });
  }
  if (c->http_request()) {
    // Not a gRPC call: an HTTP client that offered only h2 over TLS (ALPN), or spoke HTTP/2 by
    // prior knowledge. HTTP apps are served over HTTP/1.1 (docs/grpc.md): HTTP_1_1_REQUIRED
    // (RFC 9113 §7) says so in the protocol, and clients such as curl then retry over HTTP/1.1.
    c->status = static_cast<unsigned>(grpc::status::unimplemented);
    c->term = metrics::termination::error;
    nghttp2_submit_rst_stream(c->client->s(), NGHTTP2_FLAG_NONE, c->csid, NGHTTP2_HTTP_1_1_REQUIRED);
    c->client->want_flush();
    return;
  }
  if (!c->snap) {
    fail(c, grpc::status::unavailable, reason::no_healthy_replica, "no topology yet");
    return;
  }
  if (grpc::is_serve_api(c->path) && c->snap->grpc_fallback) {
    c->target = &*c->snap->grpc_fallback;
    c->mark.set(c->target->state);
    auto l = acquire(*c->target);
    if (l->ready) submit(c, *l);
    else l->waiting.push_back(c);
    return;
  }
  c->app = grpc::pick_app(*c->snap, c->application ? std::optional<std::string_view>(*c->application) : std::nullopt);
  if (!c->app) {
    fail(c, grpc::status::not_found, reason::no_route,
         c->application ? "no gRPC application matches the call's 'application' metadata"
                        : "the call names no application ('application' metadata) and several gRPC applications are served");
    return;
  }
  dispatch(c);
}

void grpc_hub::impl::dispatch(const call_ptr& c) {
  const auto& app = c->snap->grpc_apps[*c->app];
  boost::container::small_vector<routing::candidate, 8> cands;
  cands.reserve(app.replicas.size());
  bool any_up = false;
  for (const auto& r : app.replicas) {
    const bool up = r.state->up.load(std::memory_order_relaxed);
    any_up = any_up || up;
    const bool tried = std::find(c->tried.begin(), c->tried.end(), r.key) != c->tried.end();
    cands.push_back({up, r.state->in_flight.load(std::memory_order_relaxed), tried});
  }
  routing::choice_inputs in;
  in.prefer_fallback = !any_up;
  in.fallback_usable = app.fallback && app.fallback->state->up.load(std::memory_order_relaxed);
  in.tried_any = !c->tried.empty();
  in.start = rotor++;
  const auto choice = routing::choose_upstream(cands, in);
  if (choice.what == routing::choice::kind::none) {
    if (c->tried.empty())
      fail(c, grpc::status::unavailable, reason::no_healthy_replica,
           "app '" + app.name + "' has no healthy gRPC replica");
    else
      fail(c, grpc::status::unavailable, reason::upstream_error, "no replica of app '" + app.name + "' could be reached");
    return;
  }
  c->target = choice.what == routing::choice::kind::fallback ? &*app.fallback : &app.replicas[choice.index];
  c->mark.set(c->target->state);
  auto l = acquire(*c->target);
  if (l->ready) submit(c, *l);
  else l->waiting.push_back(c);
}

std::shared_ptr<upstream_link> grpc_hub::impl::acquire(const topology::endpoint& ep) {
  auto& list = upstreams[ep.key];
  for (auto& l : list)
    if (!l->retired() && l->has_room()) return l;
  auto l = std::make_shared<upstream_link>(*this, ep);
  list.push_back(l);
  l->connect();
  return l;
}

void grpc_hub::impl::drop(upstream_link* l) {
  auto it = upstreams.find(l->key);
  if (it == upstreams.end()) return;
  auto& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(), [l](const auto& p) { return p.get() == l; }), list.end());
  if (list.empty()) upstreams.erase(it);
}

void grpc_hub::impl::submit(const call_ptr& c, upstream_link& l) {
  std::vector<nghttp2_nv> h;
  h.reserve(c->headers.size() + 4);
  h.push_back(nv(":method", c->method.empty() ? std::string_view("POST") : std::string_view(c->method)));
  h.push_back(nv(":scheme", "http"));
  h.push_back(nv(":authority", c->authority.empty() ? std::string_view(l.key) : std::string_view(c->authority)));
  h.push_back(nv(":path", c->path));
  for (const auto& x : c->headers) h.push_back(nv(x.name, x.value));
  // A header list the replica said it refuses (SETTINGS_MAX_HEADER_LIST_SIZE) is never sent:
  // grpcio fails every call of the connection and closes it (issue #31), so only this caller
  // hears of it. A large list on a link whose SETTINGS have not arrived yet waits for them.
  std::size_t list_size = 0;
  for (const auto& x : h) list_size += x.namelen + x.valuelen + 32;  // RFC 9113 §6.5.2
  if (!l.settings_known && list_size > default_header_list) {
    l.waiting.push_back(c);
    return;
  }
  const std::uint32_t limit =
      l.settings_known ? nghttp2_session_get_remote_settings(l.s(), NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE) : UINT32_MAX;
  if (list_size > limit) {
    fail(c, grpc::status::resource_exhausted, reason::upstream_error,
         "the call's metadata (" + std::to_string(list_size) + " bytes) is more than the replica accepts (" +
             std::to_string(limit) + " bytes)");
    return;
  }
  nghttp2_data_provider prd{};
  prd.read_callback = read_request;
  const bool body = !(c->req_end && c->req.empty());
  const auto sid = nghttp2_submit_request(l.s(), nullptr, h.data(), h.size(), body ? &prd : nullptr, nullptr);
  if (sid < 0) {
    fail(c, grpc::status::unavailable, reason::upstream_error, "could not open a stream to the replica");
    return;
  }
  c->up = &l;
  c->usid = sid;
  l.calls.emplace(sid, c);
  l.want_flush();
}

void grpc_hub::impl::respond(const call_ptr& c, bool end_stream) {
  if (!c->client || c->resp_started) return;
  auto& cl = *c->client;
  std::vector<nghttp2_nv> h;
  h.reserve(c->resp_headers.size());
  for (const auto& x : c->resp_headers) {
    if (end_stream && x.name == "grpc-status") c->status = grpc::parse_status(x.value);
    h.push_back(nv(x.name, x.value));
  }
  nghttp2_data_provider prd{};
  prd.read_callback = read_response;
  c->resp_started = true;
  if (end_stream) {
    c->resp_end = true;
    c->resp_trailers_only = true;
  }
  nghttp2_submit_response(cl.s(), c->csid, h.data(), h.size(), end_stream ? nullptr : &prd);
  c->resp_headers.clear();
  c->resp_headers.shrink_to_fit();
  cl.want_flush();
}

namespace {
/// Cancels the call's upstream stream (RST_STREAM CANCEL) and takes it off that connection (its
/// queued response bytes were acknowledged to the connection when they came: on_data).
void cancel_upstream(call& c) {
  if (!c.up) return;
  auto* ul = c.up;
  nghttp2_submit_rst_stream(ul->s(), NGHTTP2_FLAG_NONE, c.usid, NGHTTP2_CANCEL);
  ul->calls.erase(c.usid);
  c.up = nullptr;
  ul->want_flush();
}
}  // namespace

void grpc_hub::impl::fail(const call_ptr& c, grpc::status st, reason why, std::string_view text) {
  cancel_upstream(*c);
  c->mark.clear();
  // A call whose whole answer is in hand (the replica's trailers too) keeps it.
  if (!c->client || c->status || c->resp_end) return;
  c->why = why;
  c->status = static_cast<unsigned>(st);
  const std::string code = std::to_string(static_cast<unsigned>(st));
  const std::string message = grpc::encode_message(std::string(to_string(why)) + ": " + std::string(text));
  auto& cl = *c->client;
  if (!c->resp_started) {
    c->resp_started = true;
    c->resp_end = true;
    c->resp_trailers_only = true;
    const nghttp2_nv h[] = {nv(":status", "200"), nv("content-type", "application/grpc"), nv("grpc-status", code),
                            nv("grpc-message", message)};
    nghttp2_submit_response(cl.s(), c->csid, h, std::size(h), nullptr);
  } else {
    // Mid-stream: what the replica sent so far still goes out, then these trailers.
    c->resp_trailers = {{"grpc-status", code}, {"grpc-message", message}};
    c->resp_end = true;
    nghttp2_session_resume_data(cl.s(), c->csid);
  }
  cl.want_flush();
}

void grpc_hub::impl::upstream_gone(const call_ptr& c, std::uint32_t error_code, bool connection_lost) {
  if (!c->client || c->status) return;
  if (c->resp_end && error_code == NGHTTP2_NO_ERROR) return;
  if (error_code == NGHTTP2_REFUSED_STREAM && !c->resp_started) {
    // The replica did not process it: the client may retry it safely (gRPC clients do so
    // transparently for a refused stream).
    c->why = reason::upstream_error;
    c->status = static_cast<unsigned>(grpc::status::unavailable);
    c->mark.clear();
    nghttp2_submit_rst_stream(c->client->s(), NGHTTP2_FLAG_NONE, c->csid, NGHTTP2_REFUSED_STREAM);
    c->client->want_flush();
    return;
  }
  if (connection_lost) {
    if (c->target && !c->resp_started) w.note_upstream_error(*c->target, "connection lost", w.cfg().health.error_limit);
    fail(c, grpc::status::unavailable, reason::upstream_error, "connection to the replica lost");
    return;
  }
  fail(c, grpc::status_of_h2_error(error_code), reason::upstream_error,
       std::string("the replica reset the stream (") + nghttp2_http2_strerror(error_code) + ")");
}

void grpc_hub::impl::finish(const call_ptr& c, std::uint32_t error_code) {
  cancel_upstream(*c);
  // Request bytes the replica never took: acknowledged to the client's connection, whose window
  // would otherwise shrink by them for good.
  if (c->client && !c->client->closed() && !c->req.empty())
    nghttp2_session_consume_connection(c->client->s(), c->req.size());
  if (c->deadline) c->deadline->cancel();
  const bool complete = error_code == NGHTTP2_NO_ERROR && c->resp_end;
  metrics::termination term = metrics::termination::ok;
  if (!complete) term = w.stopping() ? metrics::termination::shutdown : c->term.value_or(metrics::termination::client_abort);
  else if (c->why == reason::upstream_timeout) term = metrics::termination::timeout;
  else if (c->why) term = metrics::termination::error;
  unsigned status = c->status.value_or(complete ? static_cast<unsigned>(grpc::status::unknown)
                                                : static_cast<unsigned>(grpc::status::cancelled));
  if (!complete && !c->status) status = static_cast<unsigned>(grpc::status::cancelled);
  if (status >= grpc::status_count) status = static_cast<unsigned>(grpc::status::unknown);
  metrics::app_metrics* block = nullptr;
  if (c->app && c->snap == w.snapshot_ptr()) block = w.grpc_block(*c->app);
  if (!block && c->app && c->snap) block = w.grpc_block_named(c->snap->grpc_apps[*c->app].name);
  if (!block) block = &w.metrics().no_app();
  block->grpc_status[status].add(1);
  const auto took = clock::now() - c->start;
  block->grpc_duration.observe(took);
  if (w.cfg().metrics.ray_compatible && !c->http_request())
    block->ray_grpc.observe(c->path, status, metrics::ray_series::route::app, took);
  if (c->why) block->generated[static_cast<std::size_t>(*c->why)].add(1);
  --streams;
  w.stats().grpc_streams.sub(1);
  if (auto* log = w.shared().access_log) {
    metrics::access_entry e;
    e.time = c->wall;
    e.client = c->client ? std::string_view(c->client->remote()) : std::string_view();
    e.listener = "grpc";
    e.method = c->method;
    e.path = c->path;
    if (c->app && c->snap) e.app = c->snap->grpc_apps[*c->app].name;
    // HTTP status: 200 once the response began; else 505 for an HTTP request refused above, and
    // 499 (nginx's and Ray's code for a client that went away) for a call cancelled before any
    // response: there was no HTTP status to log, and 0 read as a success to log filters.
    e.status = c->resp_started ? 200 : c->http_request() ? 505 : 499;
    e.grpc_status = static_cast<int>(status);
    e.bytes = c->bytes_out;
    e.duration = took;
    if (c->target) {
      e.replica = c->target->name.empty() ? std::string_view(c->target->key) : std::string_view(c->target->name);
      e.replica_addr = c->target->key;
    }
    e.retries = c->retries;
    e.term = term;
    if (c->why) e.reason = to_string(*c->why);
    e.request_id = c->request_id;
    log->write(e);
  }
  c->mark.clear();
  c->client = nullptr;
  c->req.release();
  c->resp.release();
}

// ------------------------------------------------------------------------------------------

grpc_hub::grpc_hub(worker& w) : impl_(std::make_unique<impl>(w)) {}

grpc_hub::~grpc_hub() { abort_all(); }

void grpc_hub::accept(socket sock, std::unique_ptr<tls::stream> tls, std::string remote) {
  auto l = std::make_shared<client_link>(*impl_, std::move(sock), std::move(tls));
  if (!remote.empty()) l->set_remote(std::move(remote));
  impl_->clients.insert(l);
  l->start();
}

void grpc_hub::drain() {
  impl_->draining = true;
  std::vector<std::shared_ptr<client_link>> all(impl_->clients.begin(), impl_->clients.end());
  for (auto& l : all) l->drain();
  // Collected first: retiring an idle connection closes it, which takes it out of the map.
  std::vector<std::shared_ptr<upstream_link>> ups;
  for (auto& [key, list] : impl_->upstreams) ups.insert(ups.end(), list.begin(), list.end());
  for (auto& l : ups) l->retire();
  impl_->flush_dirty();
}

void grpc_hub::abort_all() {
  std::vector<std::shared_ptr<client_link>> all(impl_->clients.begin(), impl_->clients.end());
  for (auto& l : all) l->close();
  std::vector<std::shared_ptr<upstream_link>> ups;
  for (auto& [key, list] : impl_->upstreams) ups.insert(ups.end(), list.begin(), list.end());
  for (auto& l : ups) l->close();
  impl_->dirty.clear();
}

void grpc_hub::topology_changed() {
  const auto* snap = impl_->w.snap();
  std::vector<std::shared_ptr<upstream_link>> gone;
  for (auto& [key, list] : impl_->upstreams)
    if (!snap || !snap->grpc_keys.contains(key)) gone.insert(gone.end(), list.begin(), list.end());
  for (auto& l : gone) l->retire();
  impl_->flush_dirty();
}

void grpc_hub::sweep() {
  const auto now = clock::now();
  std::vector<std::shared_ptr<upstream_link>> idle;
  for (auto& [key, list] : impl_->upstreams)
    for (auto& l : list)
      if (l->ready && l->calls.empty() && now - l->idle_since > upstream_idle) idle.push_back(l);
  for (auto& l : idle) l->close();
}

}  // namespace ingressd::server
