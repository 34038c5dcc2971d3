#pragma once
// TLS on a client socket, readiness-driven: OpenSSL reads and writes the socket itself (a socket
// BIO on the non-blocking descriptor) and says when it must wait; the caller waits for
// readability or writability with Asio and tries again. This is the shape nginx and HAProxy use,
// and the one the session already has for plain HTTP (try the system call, wait only when it would
// block), so both listeners share one request path (src/proxy/http1/) and a request over
// TLS costs the record's crypto and the same system calls as plain HTTP: no second buffer layer,
// no extra scheduler trip per read as with asio::ssl::stream's memory BIOs.
//
// The stream is also an Asio AsyncReadStream and AsyncWriteStream (async_read_some,
// async_write_some), so that Beast's readers and asio::async_write work on it unchanged.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <boost/asio/append.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/post.hpp>

#include "ingressd/core/asio.hpp"

using SSL = struct ssl_st;
using SSL_CTX = struct ssl_ctx_st;

namespace ingressd::tls {

/// Why a handshake failed (ingressd_tls_handshake_failures_total{reason}).
enum class handshake_failure : std::uint8_t {
  timeout,           ///< tls.handshake_timeout passed
  http_request,      ///< plaintext HTTP on the TLS port
  protocol_version,  ///< below tls.min_version, or not TLS at all
  no_shared_cipher,  ///< no cipher suite, group or signature algorithm in common
  peer_closed,       ///< the client closed or reset the connection mid-handshake
  bad_certificate,   ///< the client refused our certificate (an alert it sent)
  other,
};
inline constexpr std::size_t handshake_failure_count = 7;
std::string_view to_string(handshake_failure f);

class stream {
 public:
  using executor_type = asio::io_context::executor_type;
  using socket_type = asio::basic_stream_socket<tcp, executor_type>;

  /// What a non-blocking step did.
  enum class io : std::uint8_t {
    ok,          ///< done (bytes moved, or the handshake finished)
    want_read,   ///< wait until the socket is readable, then try again
    want_write,  ///< wait until it is writable, then try again
    eof,         ///< the peer closed (close_notify, or TCP EOF)
    error,       ///< a protocol or socket error (ec)
  };

  /// A server-side TLS connection over `sock` (which outlives the stream).
  stream(socket_type& sock, SSL_CTX* ctx);
  ~stream();
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  executor_type get_executor() { return sock_->get_executor(); }
  socket_type& socket() { return *sock_; }
  /// The socket moved to a new owner (a TLS connection whose ALPN chose h2 goes from the HTTP
  /// session to the gRPC listener's connection): the same descriptor, a new object.
  void rebind(socket_type& sock) { sock_ = &sock; }

  /// One handshake step.
  io handshake_now(error_code& ec);
  /// Why the handshake that handshake_now reported as eof or error failed.
  handshake_failure failure() const { return failure_; }
  /// The protocol ALPN chose ("" when none).
  std::string_view alpn() const;
  bool resumed() const;

  /// Reads up to `n` bytes of application data.
  io read_now(void* p, std::size_t n, std::size_t& got, error_code& ec);
  /// Writes up to `n` bytes (a record of at most 16 KiB per call; partial writes are on). After
  /// want_write, the retry must offer the same bytes (they may sit elsewhere in memory).
  io write_now(const void* p, std::size_t n, std::size_t& put, error_code& ec);
  /// Decrypted or still-encrypted bytes already read from the socket: a readiness wait on the
  /// socket would not see them, so callers check this first.
  bool pending() const;
  /// Sends close_notify if it fits in the socket now (never waits): a clean end for the peer.
  void shutdown_now();

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& bufs, Token&& token) {
    return asio::async_compose<Token, void(error_code, std::size_t)>(
        io_op<read_buffers<MutableBuffers>>{this, {bufs}}, token, *sock_);
  }
  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& bufs, Token&& token) {
    return asio::async_compose<Token, void(error_code, std::size_t)>(
        io_op<write_buffers<ConstBuffers>>{this, {bufs}}, token, *sock_);
  }

  /// The bytes one SSL_write takes from `begin..end`: the first buffer where it fills a record
  /// alone or is the only one, else the buffers gathered (up to a record) into a thread-local
  /// scratch. The same buffers give the same bytes, which OpenSSL asks of the retry after
  /// want_write. Valid until the thread's next call.
  template <class It>
  static asio::const_buffer gather(It begin, It end) {
    asio::const_buffer first;
    It it = begin;
    for (; it != end; ++it) {
      first = asio::const_buffer(*it);
      if (first.size() != 0) break;
    }
    if (it == end) return {};
    It next = it;
    ++next;
    if (first.size() >= record_size || next == end) return first;
    unsigned char* out = gather_scratch();
    std::size_t n = 0;
    for (; it != end && n < record_size; ++it) {
      asio::const_buffer b(*it);
      n += asio::buffer_copy(asio::buffer(out + n, record_size - n), b);
    }
    return asio::const_buffer(out, n);
  }
  static constexpr std::size_t record_size = 16 * 1024;

 private:
  static unsigned char* gather_scratch();
  io step(bool write, const void* p, std::size_t n, std::size_t& moved, error_code& ec);

  template <class Buffers>
  struct read_buffers {
    Buffers bufs;
    static constexpr bool write = false;
    asio::mutable_buffer next() const {
      for (auto it = asio::buffer_sequence_begin(bufs); it != asio::buffer_sequence_end(bufs); ++it) {
        asio::mutable_buffer b(*it);
        if (b.size() != 0) return b;
      }
      return {};
    }
  };
  template <class Buffers>
  struct write_buffers {
    Buffers bufs;
    static constexpr bool write = true;
    asio::const_buffer next() const {
      return gather(asio::buffer_sequence_begin(bufs), asio::buffer_sequence_end(bufs));
    }
  };

  /// One read or write: tries now, waits for readiness as OpenSSL asks, tries again. A result
  /// found before any wait is posted, not delivered from inside the initiating call (Asio's rule
  /// for asynchronous operations).
  template <class Buffers>
  struct io_op {
    stream* s;
    Buffers b;
    bool waited = false;
    template <class Self>
    void operator()(Self& self, error_code ec = {}) {
      std::size_t moved = 0;
      if (!ec) {
        const auto buf = b.next();
        if (buf.size() != 0) {
          switch (s->step(Buffers::write, buf.data(), buf.size(), moved, ec)) {
            case io::want_read:
              waited = true;
              return s->sock_->async_wait(socket_type::wait_read, std::move(self));
            case io::want_write:
              waited = true;
              return s->sock_->async_wait(socket_type::wait_write, std::move(self));
            case io::eof:
              ec = asio::error::eof;
              break;
            default:
              break;
          }
        }
      }
      if (waited) return self.complete(ec, moved);
      asio::post(s->get_executor(), asio::append(std::move(self), ec, moved));
    }
    template <class Self>
    void operator()(Self& self, error_code ec, std::size_t moved) {
      self.complete(ec, moved);
    }
  };

  socket_type* sock_;
  SSL* ssl_ = nullptr;
  handshake_failure failure_ = handshake_failure::other;
};

/// write_now for a TLS stream (core/socket_io.hpp has the plain one): writes what the socket takes
/// now, small buffers gathered into one record so that a head and its body piece do not become
/// two records and two system calls; drops what went out from the front of `bufs`. True when
/// nothing is left or on an error; false when the caller must async_write the rest.
bool write_now(stream& s, std::span<asio::const_buffer>& bufs, error_code& ec);

/// recv_now for a TLS stream: application bytes available now (never waits). >0 bytes, 0 at EOF,
/// -1 when nothing is there yet or on an error (the read operation that follows reports it).
std::ptrdiff_t recv_now(stream& s, void* p, std::size_t n);

}  // namespace ingressd::tls
