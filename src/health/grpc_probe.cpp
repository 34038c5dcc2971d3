#include "ingressd/health/grpc_probe.hpp"

#include <nghttp2/nghttp2.h>

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include <boost/asio/write.hpp>
#include <boost/beast/core/error.hpp>

#include "ingressd/grpc/nghttp2.hpp"
#include "ingressd/grpc/protocol.hpp"

namespace ingressd::health {
namespace {

using grpc::nv;

struct exchange {
  std::optional<unsigned> status;
  std::string message;
  std::string reply;  // the first 4 KiB of the reply message bytes
  bool closed = false;
  std::uint32_t reset = 0;
  bool request_sent = false;
};


int on_header(nghttp2_session*, const nghttp2_frame*, const std::uint8_t* name, std::size_t namelen,
              const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* user) {
  auto& x = *static_cast<exchange*>(user);
  const auto n = grpc::sv(name, namelen);
  const auto v = grpc::sv(value, valuelen);
  if (n == "grpc-status") x.status = grpc::parse_status(v);
  if (n == "grpc-message") x.message = std::string(v.substr(0, 200));
  return 0;
}

int on_data(nghttp2_session* s, std::uint8_t, std::int32_t sid, const std::uint8_t* data, std::size_t len, void* user) {
  auto& x = *static_cast<exchange*>(user);
  if (x.reply.size() < 4096) x.reply.append(reinterpret_cast<const char*>(data), std::min(len, 4096 - x.reply.size()));
  (void)s;
  (void)sid;
  return 0;
}

int on_close(nghttp2_session*, std::int32_t, std::uint32_t error_code, void* user) {
  auto& x = *static_cast<exchange*>(user);
  x.closed = true;
  x.reset = error_code;
  return 0;
}

ssize_t empty_message(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length, std::uint32_t* flags,
                      nghttp2_data_source*, void*) {
  // A gRPC message frame of length 0: not compressed, 4-byte length 0 (an empty HealthzRequest).
  if (length < 5) return NGHTTP2_ERR_DEFERRED;
  std::fill(buf, buf + 5, std::uint8_t{0});
  *flags |= NGHTTP2_DATA_FLAG_EOF;
  return 5;
}


std::string describe(const char* phase, const error_code& ec) {
  if (ec == boost::beast::error::timeout) return std::string(phase) + ": timed out";
  return std::string(phase) + ": " + ec.message();
}

}  // namespace

awaitable<std::string> grpc_probe(boost::beast::tcp_stream& stream, const tcp::endpoint& dial, std::string_view path) {
  auto [cec] = co_await stream.async_connect(dial, nothrow);
  if (cec) co_return describe("connect", cec);

  exchange x;
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
  nghttp2_session* raw = nullptr;
  nghttp2_session_client_new(&raw, cb, &x);
  nghttp2_session_callbacks_del(cb);
  grpc::session_ptr s(raw);
  nghttp2_submit_settings(raw, NGHTTP2_FLAG_NONE, nullptr, 0);

  const auto address = dial.address();
  const std::string authority =
      (address.is_v6() ? "[" + address.to_string() + "]" : address.to_string()) + ":" + std::to_string(dial.port());
  const nghttp2_nv headers[] = {nv(":method", "POST"),          nv(":scheme", "http"),
                                nv(":authority", authority),    nv(":path", path),
                                nv("content-type", "application/grpc"), nv("te", "trailers"),
                                nv("user-agent", "ingressd-health/" INGRESSD_VERSION)};
  nghttp2_data_provider body{};
  body.read_callback = empty_message;
  if (nghttp2_submit_request(raw, nullptr, headers, std::size(headers), &body, nullptr) < 0)
    co_return "cannot build the health call";

  std::vector<std::uint8_t> out;
  std::array<std::uint8_t, 4096> in;
  while (!x.closed) {
    out.clear();
    for (;;) {
      const std::uint8_t* p = nullptr;
      const auto n = nghttp2_session_mem_send(raw, &p);
      if (n < 0) co_return std::string("HTTP/2: ") + nghttp2_strerror(static_cast<int>(n));
      if (n == 0) break;
      out.insert(out.end(), p, p + n);
    }
    if (!out.empty()) {
      auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(out), nothrow);
      if (wec) co_return describe("send", wec);
    }
    if (x.closed) break;
    if (!nghttp2_session_want_read(raw)) co_return "the connection ended before the reply";
    auto [rec, rn] = co_await stream.async_read_some(asio::buffer(in), nothrow);
    if (rec) co_return describe("read", rec);
    if (nghttp2_session_mem_recv(raw, in.data(), rn) < 0) co_return "HTTP/2 protocol error in the reply";
  }
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (!x.status) {
    if (x.reset != 0) co_return std::string("stream reset: ") + nghttp2_http2_strerror(x.reset);
    co_return "no grpc-status in the reply";
  }
  if (*x.status != 0) co_return "grpc-status " + std::to_string(*x.status) + (x.message.empty() ? "" : " (" + x.message + ")");
  if (x.reply.find("success") == std::string::npos) co_return "the reply does not say \"success\"";
  co_return std::string{};
}

}  // namespace ingressd::health
