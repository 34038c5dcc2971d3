#pragma once
// Small conveniences over nghttp2's C API, shared by the gRPC listener (src/proxy/grpc/grpc_proxy.cpp)
// and the gRPC health check (src/health/grpc_probe.cpp).
#include <nghttp2/nghttp2.h>

#include <cstdint>
#include <memory>
#include <string_view>

namespace ingressd::grpc {

/// A header field for nghttp2_submit_*: views of `n` and `v`, which must outlive the call.
inline nghttp2_nv nv(std::string_view n, std::string_view v, std::uint8_t flags = NGHTTP2_NV_FLAG_NONE) {
  return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(n.data())),
          reinterpret_cast<std::uint8_t*>(const_cast<char*>(v.data())), n.size(), v.size(), flags};
}

/// Bytes nghttp2 hands to a callback, as text.
inline std::string_view sv(const std::uint8_t* p, std::size_t n) { return {reinterpret_cast<const char*>(p), n}; }

struct session_deleter {
  void operator()(nghttp2_session* s) const { nghttp2_session_del(s); }
};
/// An owned nghttp2 session.
using session_ptr = std::unique_ptr<nghttp2_session, session_deleter>;

}  // namespace ingressd::grpc
