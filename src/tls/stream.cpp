#include "ingressd/tls/stream.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

namespace ingressd::tls {

std::string_view to_string(handshake_failure f) {
  switch (f) {
    case handshake_failure::timeout: return "timeout";
    case handshake_failure::http_request: return "http_request";
    case handshake_failure::protocol_version: return "protocol_version";
    case handshake_failure::no_shared_cipher: return "no_shared_cipher";
    case handshake_failure::peer_closed: return "peer_closed";
    case handshake_failure::bad_certificate: return "bad_certificate";
    case handshake_failure::other: return "other";
  }
  return "other";
}

namespace {

/// OpenSSL's packed error codes as an error category (the message is OpenSSL's text).
class ssl_category_impl final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "openssl"; }
  std::string message(int v) const override {
    std::array<char, 256> text{};
    ERR_error_string_n(static_cast<unsigned long>(v), text.data(), text.size());
    return text.data();
  }
};

const boost::system::error_category& ssl_category() {
  static const ssl_category_impl c;
  return c;
}

/// The OpenSSL error queue's first entry as an error_code, and the queue cleared: it is per
/// thread, and a stale entry would be blamed on the next connection.
error_code take_ssl_error() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return asio::error::connection_reset;
  return error_code(static_cast<int>(e), ssl_category());
}

handshake_failure classify(unsigned long e) {
  if (ERR_GET_LIB(e) != ERR_LIB_SSL) return handshake_failure::other;
  switch (ERR_GET_REASON(e)) {
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
      return handshake_failure::http_request;
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_VERSION_TOO_LOW:
    case SSL_R_UNKNOWN_PROTOCOL:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_RECORD_LENGTH_MISMATCH:
      return handshake_failure::protocol_version;
    case SSL_R_NO_SHARED_CIPHER:
    case SSL_R_NO_SHARED_GROUPS:
    case SSL_R_NO_SHARED_SIGNATURE_ALGORITHMS:
    case SSL_R_NO_SUITABLE_SIGNATURE_ALGORITHM:
      return handshake_failure::no_shared_cipher;
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
      return handshake_failure::bad_certificate;
    default:
      return handshake_failure::other;
  }
}

}  // namespace

stream::stream(socket_type& sock, SSL_CTX* ctx) : sock_(&sock), ssl_(SSL_new(ctx)) {
  if (ssl_ == nullptr) return;  // out of memory: handshake_now reports it
  SSL_set_fd(ssl_, sock_->native_handle());
  SSL_set_accept_state(ssl_);
}

stream::~stream() {
  if (ssl_ != nullptr) SSL_free(ssl_);
}

stream::io stream::handshake_now(error_code& ec) {
  if (ssl_ == nullptr) {
    ec = asio::error::no_memory;
    return io::error;
  }
  ERR_clear_error();
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) return io::ok;
  const int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_WANT_READ) return io::want_read;
  if (e == SSL_ERROR_WANT_WRITE) return io::want_write;
  const unsigned long first = ERR_peek_error();
  if (e == SSL_ERROR_ZERO_RETURN || ((e == SSL_ERROR_SYSCALL || e == SSL_ERROR_SSL) && first == 0)) {
    // Closed or reset by the peer (an EOF inside the handshake is an SSL error with no entry in
    // OpenSSL 3 when SSL_OP_IGNORE_UNEXPECTED_EOF is off: errno says which).
    failure_ = handshake_failure::peer_closed;
    ec = asio::error::eof;
    ERR_clear_error();
    return io::eof;
  }
  failure_ = classify(first);
  if (failure_ == handshake_failure::other && ERR_GET_REASON(first) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    failure_ = handshake_failure::peer_closed;
  }
  ec = take_ssl_error();
  return io::error;
}

std::string_view stream::alpn() const {
  const unsigned char* p = nullptr;
  unsigned n = 0;
  SSL_get0_alpn_selected(ssl_, &p, &n);
  return p == nullptr ? std::string_view{} : std::string_view(reinterpret_cast<const char*>(p), n);
}

bool stream::resumed() const { return SSL_session_reused(ssl_) == 1; }

stream::io stream::step(bool write, const void* p, std::size_t n, std::size_t& moved, error_code& ec) {
  ERR_clear_error();
  int r = 0;
  if (write) {
    r = SSL_write_ex(ssl_, p, n, &moved);
  } else {
    r = SSL_read_ex(ssl_, const_cast<void*>(p), n, &moved);
  }
  if (r == 1) return io::ok;
  moved = 0;
  switch (SSL_get_error(ssl_, r)) {
    case SSL_ERROR_WANT_READ:
      return io::want_read;
    case SSL_ERROR_WANT_WRITE:
      return io::want_write;
    case SSL_ERROR_ZERO_RETURN:
      return io::eof;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        // The socket failed or hit EOF without close_notify: for a reader that is an EOF (clients
        // routinely skip close_notify); for a writer, the socket's error.
        const int err = errno;
        ERR_clear_error();
        if (!write || err == 0) return io::eof;
        ec = error_code(err, asio::error::get_system_category());
        return io::error;
      }
      [[fallthrough]];
    default:
      if (ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        return io::eof;
      }
      ec = take_ssl_error();
      return io::error;
  }
}

stream::io stream::read_now(void* p, std::size_t n, std::size_t& got, error_code& ec) {
  return step(false, p, n, got, ec);
}

stream::io stream::write_now(const void* p, std::size_t n, std::size_t& put, error_code& ec) {
  return step(true, p, n, put, ec);
}

bool stream::pending() const { return ssl_ != nullptr && SSL_has_pending(ssl_) == 1; }

void stream::shutdown_now() {
  if (ssl_ == nullptr || !SSL_is_init_finished(ssl_) || (SSL_get_shutdown(ssl_) & SSL_SENT_SHUTDOWN) != 0) return;
  ERR_clear_error();
  SSL_shutdown(ssl_);  // one try: queues close_notify and sends it if the socket takes it
  ERR_clear_error();
}

unsigned char* stream::gather_scratch() {
  thread_local std::array<unsigned char, record_size> scratch;
  return scratch.data();
}

bool write_now(stream& s, std::span<asio::const_buffer>& bufs, error_code& ec) {
  while (!bufs.empty()) {
    const auto b = stream::gather(bufs.begin(), bufs.end());
    if (b.size() == 0) {
      bufs = {};
      break;
    }
    std::size_t put = 0;
    switch (s.write_now(b.data(), b.size(), put, ec)) {
      case stream::io::ok:
        break;
      case stream::io::want_read:
      case stream::io::want_write:
        return false;
      case stream::io::eof:
        ec = asio::error::broken_pipe;
        return true;
      case stream::io::error:
        return true;
    }
    while (!bufs.empty() && put >= bufs.front().size()) {
      put -= bufs.front().size();
      bufs = bufs.subspan(1);
    }
    if (put > 0) bufs.front() += put;
  }
  return true;
}

std::ptrdiff_t recv_now(stream& s, void* p, std::size_t n) {
  std::size_t got = 0;
  error_code ec;
  switch (s.read_now(p, n, got, ec)) {
    case stream::io::ok: return static_cast<std::ptrdiff_t>(got);
    case stream::io::eof: return 0;
    default: return -1;
  }
}

}  // namespace ingressd::tls
