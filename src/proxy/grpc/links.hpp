#pragma once
// The HTTP/2 connections of the gRPC ingress ("links"): a socket, its nghttp2 session, the write
// side, and the flow-control bookkeeping that ties a call's two streams together. A client_link
// is a connection of the gRPC listener (nghttp2 server session); an upstream_link a pooled,
// multiplexed connection to one replica (client session). What happens to a call is decided in
// grpc::call_state (sans-I/O) and carried out by the hub (grpc_proxy.cpp); the links turn frames
// into those events and the hub's decisions into frames.
#include <nghttp2/nghttp2.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ingressd/grpc/link_policy.hpp"
#include "ingressd/grpc/nghttp2.hpp"
#include "ingressd/grpc/protocol.hpp"
#include "ingressd/topology/snapshot.hpp"
#include "proxy/grpc/grpc_proxy.hpp"

namespace ingressd::server {
namespace grpc_links {

using clock = std::chrono::steady_clock;
using socket_t = grpc_hub::socket;

/// Frames gathered from nghttp2 per write: one sendmsg for a whole event-loop turn's output of a
/// connection (every stream's frames together), and what a connection may hold unsent.
inline constexpr std::size_t out_cap = 64 * 1024;
inline constexpr std::size_t read_size = 16 * 1024;
/// Per-stream flow-control window announced on both sides: what a call may hold in each
/// direction. The connection window bounds a client's calls together; on an upstream link it
/// reopens as response bytes arrive (upstream_link::on_data), so the calls of many clients that
/// share a link never wait for each other's readers (docs/grpc.md, "Isolation").
inline constexpr std::int32_t stream_window = 256 * 1024;
inline constexpr std::int32_t connection_window = 1024 * 1024;
/// The header list a gRPC server accepts when it says nothing (grpc core's default
/// GRPC_ARG_MAX_METADATA_SIZE): a larger one waits for the replica's SETTINGS before it is sent.
inline constexpr std::size_t default_header_list = 8 * 1024;
/// A response header list (or trailer list) from a replica past this is refused (the stream
/// fails INTERNAL).
inline constexpr std::size_t max_upstream_headers = 64 * 1024;
/// Streams one upstream link carries at most, whatever the replica allows; and the calls that may
/// wait for one that is still connecting.
inline constexpr std::size_t max_streams_per_link = 1000;
inline constexpr std::size_t max_waiting_per_link = 100;
/// How long an upstream link without calls is kept.
inline constexpr auto upstream_idle = std::chrono::seconds(60);

struct call;
using call_ptr = std::shared_ptr<call>;
class client_link;
class upstream_link;

/// nghttp2 options shared by every session of a worker.
struct options_holder {
  options_holder();
  ~options_holder();
  options_holder(const options_holder&) = delete;
  options_holder& operator=(const options_holder&) = delete;
  nghttp2_option* o = nullptr;
};

/// An HTTP/2 connection: its socket, its nghttp2 session, and the write side (frames nghttp2
/// produced that the socket has not taken). Writes are batched: whatever changes a session marks
/// it dirty, and the hub flushes every dirty connection once per event (a read, a timer), so all
/// of a turn's frames for one connection leave in one send.
class link : public std::enable_shared_from_this<link> {
 public:
  link(grpc_hub::impl& hub, socket_t sock, std::unique_ptr<tls::stream> tls = nullptr);
  virtual ~link() = default;
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  nghttp2_session* s() const { return s_.get(); }
  bool closed() const { return closed_; }
  grpc_hub::impl& hub() { return hub_; }

  void want_flush();
  void flush();
  /// More bytes (or the end) for stream `sid`: its data provider is asked again, and the link
  /// flushed with the rest of this event's output.
  void wake(std::int32_t sid) {
    nghttp2_session_resume_data(s(), sid);
    want_flush();
  }
  /// Ends the connection with GOAWAY `code` (sent before the socket closes).
  void terminate(std::uint32_t code);
  void close();

  /// When the read being handled came off the socket: the time of the bytes it carries (one
  /// clock read per read, not per frame).
  clock::time_point read_at() const { return read_at_; }

  std::unordered_map<std::int32_t, call_ptr> calls;
  call_ptr find(std::int32_t sid) const {
    auto it = calls.find(sid);
    return it == calls.end() ? nullptr : it->second;
  }

 protected:
  static awaitable<void> wait_writable(std::shared_ptr<link> self, asio::socket_base::wait_type wait);
  static awaitable<void> read_loop(std::shared_ptr<link> self);

  /// What of the bytes just read goes to nghttp2 (client_link screens them first:
  /// grpc::frame_screen).
  virtual std::span<const std::uint8_t> incoming(std::span<const std::uint8_t> in) { return in; }
  virtual void on_closed() = 0;
  /// Everything the session had to say is written: end the connection.
  virtual void finish() { close(); }
  virtual void after_flush() {}
  virtual void on_read_error(const error_code&) {}
  virtual void on_recv_error(int rv) {
    terminate(rv == NGHTTP2_ERR_FLOODED ? NGHTTP2_ENHANCE_YOUR_CALM : NGHTTP2_PROTOCOL_ERROR);
  }

  grpc_hub::impl& hub_;
  socket_t sock_;
  std::unique_ptr<tls::stream> tls_;  // gRPC over the HTTPS listener (ALPN h2)
  grpc::session_ptr s_;
  std::vector<std::uint8_t> out_;
  std::size_t out_off_ = 0;
  bool dirty_ = false;
  bool write_waiting_ = false;
  bool closed_ = false;
  bool closing_ = false;  // GOAWAY queued after an error: close once it is written
  /// When a read last took everything the socket held: every frame read since was sent after
  /// it. A busy worker reads a client's HEADERS and the RST_STREAM it sent a deadline later in
  /// one batch; this, not the batch's time, is when such a call may have begun.
  clock::time_point drained_at_ = clock::now();
  clock::time_point read_at_ = clock::now();
  std::optional<asio::steady_timer> timer_;
};

/// A connection of the gRPC listener.
class client_link final : public link {
 public:
  client_link(grpc_hub::impl& hub, socket_t sock, std::unique_ptr<tls::stream> tls);

  void start();
  /// Drain: no new streams; close once the open ones are done.
  void drain();
  const std::string& remote() const { return remote_; }
  void set_remote(std::string r) { remote_ = std::move(r); }
  /// The connection ends for abuse or a protocol error: counted, then GOAWAY `code`.
  void fault(grpc::conn_error why, std::uint32_t code);

 private:
  void arm_idle(std::chrono::nanoseconds after, bool first);
  void after_flush() override;
  void on_recv_error(int rv) override;
  std::span<const std::uint8_t> incoming(std::span<const std::uint8_t> in) override;
  void on_closed() override;
  void finish() override;
  static awaitable<void> linger(std::shared_ptr<client_link> self);

  static client_link& self(void* user) { return *static_cast<client_link*>(user); }
  static int on_begin_frame(nghttp2_session*, const nghttp2_frame_hd* hd, void* user);
  static int on_frame_send(nghttp2_session*, const nghttp2_frame* f, void* user);
  static int on_begin_headers(nghttp2_session*, const nghttp2_frame* f, void* user);
  static int on_header(nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
                       const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* user);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* user);
  static int on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data, std::size_t len,
                     void* user);
  static int on_stream_close(nghttp2_session*, std::int32_t sid, std::uint32_t error_code, void* user);
  /// Response bytes for the client stream (nghttp2's data provider).
  static ssize_t read_response(nghttp2_session* s, std::int32_t sid, std::uint8_t* buf, std::size_t length,
                               std::uint32_t* flags, nghttp2_data_source*, void* user);

  error_code ignored_;
  std::string remote_;
  std::size_t max_header_bytes_ = 64 * 1024;
  std::uint64_t opened_ = 0;  // streams the client opened
  std::size_t active_ = 0;    // calls whose request head is complete and that are not finished
  grpc::frame_budget budget_;
  /// Drops resets of streams the client never opened and stops header blocks over
  /// max_header_bytes_ before nghttp2 (grpc::frame_screen).
  grpc::frame_screen screen_;
  bool draining_ = false;
  bool faulted_ = false;
  bool idle_first_ = true;
  bool lingering_ = false;

  friend struct grpc_hub::impl;
};

/// A pooled connection to one gRPC replica, many calls multiplexed on it.
class upstream_link final : public link {
 public:
  upstream_link(grpc_hub::impl& hub, const topology::endpoint& ep);

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

  /// What the chooser (grpc::choose_link) weighs.
  grpc::link_room room() const;
  void connect();
  /// Closes once no call is on it (topology change, drain).
  void retire();
  bool retired() const { return retired_; }
  /// Queues a request on the link (HEADERS now; DATA as the client's bytes come). Negative: nghttp2's error.
  std::int32_t submit_request(std::span<const nghttp2_nv> head, bool body);
  /// Resets stream `sid` (CANCEL) and takes its call off the link.
  void cancel(std::int32_t sid);

 private:
  static awaitable<void> run(std::shared_ptr<upstream_link> self);
  void open_session();
  void arm_keepalive();
  void connect_failed(const std::string& what);
  void on_closed() override;
  void after_flush() override;

  static upstream_link& self(void* user) { return *static_cast<upstream_link*>(user); }
  static int on_header(nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
                       const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* user);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* f, void* user);
  static int on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data, std::size_t len,
                     void* user);
  static int on_stream_close(nghttp2_session*, std::int32_t sid, std::uint32_t error_code, void* user);
  /// Request bytes for the upstream stream (nghttp2's data provider).
  static ssize_t read_request(nghttp2_session*, std::int32_t sid, std::uint8_t* buf, std::size_t length,
                              std::uint32_t* flags, nghttp2_data_source*, void* user);

  grpc::keepalive keepalive_;
  /// Why the link was given up, when ingressd gave it up (the calls' grpc-message).
  std::string lost_why_;
  bool retired_ = false;
};

}  // namespace grpc_links
}  // namespace ingressd::server
