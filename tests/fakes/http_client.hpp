#pragma once
// Blocking HTTP/1.1 test client with a bound on every wait. Responses are parsed with Beast and
// keep the arrival time of each chunk and SSE event, so tests can tell streamed bodies from
// buffered ones.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ingressd::testing {

using clock = std::chrono::steady_clock;
using header_list = std::vector<std::pair<std::string, std::string>>;

struct body_part {
  std::string data;
  clock::time_point at;  ///< when the read that completed this part returned
};

struct sse_event {
  std::string raw;   ///< the event's lines, without the blank line that ends it
  std::string data;  ///< its `data:` lines joined by '\n' (one leading space stripped)
  clock::time_point at;
};

struct http_response {
  bool complete = false;   ///< a whole response was read
  bool timed_out = false;  ///< the timeout expired first
  std::string error;       ///< why it is not complete: "timeout", "eof", a socket or parse error

  unsigned status = 0;
  unsigned version = 0;    ///< 10 or 11
  std::string reason;
  header_list headers;     ///< in wire order
  std::string body;        ///< de-chunked
  bool chunked = false;
  /// Chunked bodies: one part per chunk. Other bodies: one part per read that carried body bytes.
  std::vector<body_part> chunks;
  /// When Content-Type is text/event-stream: the events, each stamped when its end arrived.
  std::vector<sse_event> events;
  clock::time_point headers_at;   ///< when the head was complete
  clock::time_point finished_at;  ///< when the response was complete (or the read gave up)

  std::optional<std::string> header(std::string_view name) const;  ///< first, case-insensitive
  std::size_t header_count(std::string_view name) const;
  bool has_header(std::string_view name) const { return header_count(name) > 0; }
  /// Whether the response allows the connection to stay open (version and Connection header).
  bool keep_alive() const;
};

struct raw_read {
  std::string bytes;       ///< everything received (including bytes buffered by earlier reads)
  bool closed = false;     ///< the peer closed cleanly (FIN)
  bool reset = false;      ///< the connection ended with an error (e.g. RST)
  bool timed_out = false;
};

/// A TLS client's settings (connection::open_tls), as a real HTTPS client would have them.
struct tls_options {
  std::string ca_file;                    ///< verify the server's certificate against this PEM ("" = no check)
  std::string server_name = "localhost";  ///< SNI, and the name the certificate must carry
  std::vector<std::string> alpn;          ///< protocols offered ("" none)
  std::string max_version;                ///< "1.2" caps the client at TLS 1.2 ("" = 1.3)
  std::string min_version;                ///< "1.1" lets the client offer TLS 1.1 (if OpenSSL's policy lets it)
  std::string ciphers;                    ///< TLS 1.2 cipher list ("" = OpenSSL's)
  std::shared_ptr<void> session;          ///< a session from tls_session() to resume
  std::string preamble;                   ///< bytes sent in the clear before the handshake (a PROXY header)
};

/// One client connection, driven synchronously. Each call runs its own deadline; nothing blocks
/// longer than the timeout it was given.
class connection {
 public:
  /// Connects within `timeout`; check connected() / error().
  static connection open(const std::string& host, std::uint16_t port, clock::duration timeout = std::chrono::seconds(5));
  /// Connects and completes a TLS handshake within `timeout`; reads and writes then go through
  /// TLS. A failed handshake leaves connected() false and error() "handshake: ...".
  static connection open_tls(const std::string& host, std::uint16_t port, const tls_options& options = {},
                             clock::duration timeout = std::chrono::seconds(5));
  bool tls_resumed() const;          ///< the handshake resumed options.session
  std::string tls_alpn() const;      ///< the protocol the server chose ("" none)
  std::string tls_version() const;   ///< "TLSv1.3", ...
  /// The session to resume on another connection (after a response has been read: TLS 1.3 sends
  /// its tickets after the handshake); null when the server gave none.
  std::shared_ptr<void> tls_session() const;
  /// The client's OpenSSL SSL* (for tests that misbehave at the TLS level), or null.
  void* tls_native() const;

  connection(connection&&) noexcept;
  connection& operator=(connection&&) noexcept;
  ~connection();

  bool connected() const;
  const std::string& error() const;  ///< last error (connect, write or read)
  std::string local_address() const; ///< "ip:port" of our end

  /// Writes all bytes; false on error or timeout.
  bool write(std::string_view bytes, clock::duration timeout = std::chrono::seconds(5));
  /// Reads one response. `head_request`: the request was HEAD (no body follows the head).
  /// 1xx responses are returned on their own; call again for the final one.
  http_response read_response(clock::duration timeout = std::chrono::seconds(10), bool head_request = false);
  /// Reads until the peer closes (or errors, or the timeout expires).
  raw_read read_until_close(clock::duration timeout = std::chrono::seconds(10));
  /// True when the peer closes or resets the connection within `timeout`. Bytes that arrive
  /// meanwhile are kept for the next read.
  bool is_closed(clock::duration timeout);
  /// Writes bytes on the socket itself, past TLS (a client that breaks the record layer).
  bool write_raw(std::string_view bytes);
  void shutdown_write();
  void close();
  /// Closes with RST (SO_LINGER 0): an abrupt client abort.
  void reset();

 private:
  struct state;
  explicit connection(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

/// Connects and writes `bytes` (check connected() / error() on the result).
connection send_raw(const std::string& host, std::uint16_t port, std::string_view bytes,
                    clock::duration timeout = std::chrono::seconds(5));

/// Serialises a request: request line, `Host` (unless given), `headers` in order,
/// `Content-Length` (unless given or there is no body and the method is GET/HEAD), body.
std::string format_request(std::string_view method, std::string_view target, const std::string& host,
                           std::uint16_t port, const header_list& headers, std::string_view body);

/// One-shot request on a fresh connection (closed afterwards).
http_response http_request(const std::string& host, std::uint16_t port, std::string_view method,
                           std::string_view target, const header_list& headers = {},
                           std::string_view body = {}, clock::duration timeout = std::chrono::seconds(10));
http_response http_get(const std::string& host, std::uint16_t port, std::string_view target,
                       const header_list& headers = {}, clock::duration timeout = std::chrono::seconds(10));
http_response http_post(const std::string& host, std::uint16_t port, std::string_view target,
                        const header_list& headers = {}, std::string_view body = {},
                        clock::duration timeout = std::chrono::seconds(10));

/// One HTTP/2 frame as read off the wire (RFC 9113 §4.1), for tests of what an HTTP/1.1-only
/// listener answers an HTTP/2 client.
struct h2_frame {
  unsigned type = 0;
  unsigned flags = 0;
  std::uint32_t stream = 0;
  std::string payload;
  /// GOAWAY's or RST_STREAM's error code.
  std::uint32_t error_code() const;
  /// GOAWAY's debug data.
  std::string debug_data() const;
};
/// The whole frames at the start of `bytes` (a partial frame at the end is left out).
std::vector<h2_frame> h2_frames(std::string_view bytes);

}  // namespace ingressd::testing
