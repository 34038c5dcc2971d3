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

/// One client connection, driven synchronously. Each call runs its own deadline; nothing blocks
/// longer than the timeout it was given.
class connection {
 public:
  /// Connects within `timeout`; check connected() / error().
  static connection open(const std::string& host, std::uint16_t port, clock::duration timeout = std::chrono::seconds(5));

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

}  // namespace ingressd::testing
