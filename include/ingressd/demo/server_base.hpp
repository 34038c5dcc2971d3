#pragma once
// Shared skeleton of the demo cluster's loopback HTTP/1.1 servers (replica, router) and of the
// test fakes built on them: one thread and io_context per server, keep-alive request loop,
// request recording, connection accounting, and a clean stop().
//
// The servers exist to be scripted by tests, so they record everything they see (in arrival
// order, with exact raw bytes) and count connection lifecycle events, and every wait a handler
// does also watches the socket so that a peer going away is noticed at once.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/beast/core/flat_buffer.hpp>

#include "ingressd/core/asio.hpp"

namespace ingressd::demo {

using clock = std::chrono::steady_clock;
using header_list = std::vector<std::pair<std::string, std::string>>;

/// The first value of `name` (case-insensitive) in `headers`, or nullopt.
std::optional<std::string> find_header(const header_list& headers, std::string_view name);
/// How many times `name` (case-insensitive) occurs in `headers`.
std::size_t count_header(const header_list& headers, std::string_view name);

/// One request as a demo server received it.
struct recorded_request {
  std::string method;
  std::string target;       ///< request-target as sent (path + query)
  unsigned version = 11;    ///< 10 or 11
  header_list headers;      ///< in wire order, names as sent
  std::string body;         ///< de-chunked body
  std::string raw;          ///< the exact bytes of this request on the wire (head + framed body)
  std::string peer_ip;
  std::uint16_t peer_port = 0;
  std::uint64_t connection_id = 0;  ///< 1-based accept order on this server; equal ids = same connection
  bool keep_alive = true;           ///< whether the request allows the connection to stay open
  clock::time_point head_at;        ///< when the request head was complete
  clock::time_point completed_at;   ///< when the whole request (body included) was read

  /// First header with this name (case-insensitive), if any.
  std::optional<std::string> header(std::string_view name) const;
  /// How many times a header with this name (case-insensitive) occurs.
  std::size_t header_count(std::string_view name) const;
  /// The target without its query string.
  std::string path() const;
};

class server_base;

/// What a handler asks the connection loop to do after it returns.
enum class after_reply {
  keep_alive,  ///< response complete; read the next request if the request allowed keep-alive
  close,       ///< response complete (or deliberately absent); close gracefully (FIN)
  done,        ///< the handler already closed/reset the socket, or the peer went away
};

/// A request in flight, handed to server_base::handle(). Valid only during that call. Every
/// operation notices a peer that goes away (EOF or reset) and records it; after that, write()
/// and wait() return false at once and the handler should return after_reply::done.
class exchange {
 public:
  const recorded_request& request() const { return request_; }
  /// Writes all bytes (flushed as one write). False when the peer is gone or the server stops.
  awaitable<bool> write(std::string_view bytes);
  /// Sleeps for `d` while watching the connection. False when the peer closed meanwhile or the
  /// server stops; bytes the peer sends meanwhile (pipelined requests) are kept for later. A
  /// half-close (EOF) counts as the peer going away, as in uvicorn: a client waiting for a
  /// response does not shut down its sending side.
  awaitable<bool> wait(clock::duration d);
  /// Never answers: waits until the peer closes the connection or the server stops.
  awaitable<void> wait_for_peer_close();
  /// Closes the connection now, gracefully (FIN).
  void close();
  /// Closes with a TCP RST (SO_LINGER 0), as a crashed replica would.
  void reset();
  bool peer_gone() const { return peer_gone_; }
  bool stopping() const;

 private:
  friend class server_base;
  exchange(server_base& server, tcp::socket& socket, boost::beast::flat_buffer& buffer,
           const recorded_request& request)
      : server_(server), socket_(socket), buffer_(buffer), request_(request) {}
  server_base& server_;
  tcp::socket& socket_;
  boost::beast::flat_buffer& buffer_;
  const recorded_request& request_;
  bool peer_gone_ = false;
};

/// Builds a complete HTTP/1.1 response. `headers` are written verbatim in order; Content-Length
/// is added unless they carry Content-Length or Transfer-Encoding (so tests can script broken
/// framing); `Connection: close` is added when `keep_alive` is false and no Connection header
/// was given. With `head_only` the body is omitted (HEAD requests).
std::string format_response(unsigned status, const header_list& headers, std::string_view body,
                            bool keep_alive, bool head_only = false);

/// The header fields of a raw HTTP/1.x head (start line, fields, optionally the blank line and
/// anything after it), exactly in wire order with names as sent and values without surrounding
/// whitespace. Beast's own field container groups repeated names, so recorders parse the bytes.
header_list parse_head_fields(std::string_view raw_head);

/// True when `headers` ask to close (Connection: close).
bool wants_close(const header_list& headers);

/// Base of the demo servers. Derived classes implement handle() and must call start() at the
/// end of their constructor and stop() at the start of their destructor (the I/O thread calls
/// handle(), so it must be gone before derived members are destroyed).
class server_base {
 public:
  server_base(const server_base&) = delete;
  server_base& operator=(const server_base&) = delete;
  virtual ~server_base();

  /// Closes the listener and every connection (peers see a FIN), joins the thread. Idempotent.
  void stop();

  const std::string& bind_ip() const { return bind_ip_; }
  std::uint16_t port() const { return port_; }
  tcp::endpoint endpoint() const;

  /// Copies of the recorded requests, in completion order (probes excluded, see is_probe()):
  /// the most recent record_limit() of them, so that a long-running demo stays bounded.
  std::vector<recorded_request> requests() const;
  /// Requests recorded since the start (or the last clear_requests()), also those the window
  /// no longer holds.
  std::size_t request_count() const;
  /// How many recorded requests requests() keeps (default 4096; older ones are dropped).
  void set_record_limit(std::size_t n);
  std::size_t record_limit() const;
  /// Requests answered without being recorded (e.g. the replica's health checks).
  std::size_t probe_count() const;
  void clear_requests();

  std::size_t connections_accepted() const;
  std::size_t connections_open() const;
  /// Connections that ended because the peer closed or reset them (idle, mid-request or
  /// mid-response); connections the server closed itself (Connection: close, scripted closes,
  /// stop()) are not counted.
  std::size_t disconnects() const;
  /// Responses that never completed because the peer went away during them (a client abort
  /// reaching the upstream shows here, including requests the server was scripted to hang on).
  std::size_t aborted_responses() const;

  /// Bounded waits: true once the count reaches `n`, false on timeout.
  bool wait_for_requests(std::size_t n, clock::duration timeout) const;
  bool wait_for_connections(std::size_t n, clock::duration timeout) const;
  bool wait_for_disconnects(std::size_t n, clock::duration timeout) const;
  bool wait_for_aborted_responses(std::size_t n, clock::duration timeout) const;

 protected:
  /// Binds and listens at once (throws boost::system::system_error when it cannot), so the
  /// port is known after construction. `log_name` names the server in log lines.
  server_base(std::string bind_ip, std::uint16_t port, std::string log_name);
  /// Starts the I/O thread; call at the end of the derived constructor.
  void start();
  /// Answers one fully read request. Runs on the server's I/O thread.
  virtual awaitable<after_reply> handle(exchange& ex) = 0;
  /// Requests for which this returns true are counted by probe_count() instead of recorded.
  virtual bool is_probe(const recorded_request&) const { return false; }
  const std::string& log_name() const { return log_name_; }

 private:
  friend class exchange;
  awaitable<void> accept_loop();
  awaitable<void> serve(tcp::socket socket, std::uint64_t id);
  void note_peer_gone(bool mid_response);
  bool wait_for(const std::function<bool()>& pred, clock::duration timeout) const;

  std::string bind_ip_;
  std::uint16_t port_ = 0;
  std::string log_name_;
  // Destroyed explicitly in stop(), acceptor first: pending coroutine frames die with the
  // io_context while the members they touch are still alive.
  std::unique_ptr<asio::io_context> ioc_;
  std::unique_ptr<tcp::acceptor> acceptor_;
  std::thread thread_;
  std::future<void> finished_;
  std::once_flag stop_once_;
  bool stopping_ = false;                        // I/O thread only
  std::map<std::uint64_t, tcp::socket*> open_;   // I/O thread only
  std::uint64_t next_id_ = 0;                    // I/O thread only

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<recorded_request> requests_;  // the window: at most record_limit_
  std::size_t recorded_ = 0;               // all recorded since the last clear
  std::size_t record_limit_ = 4096;
  std::size_t probes_ = 0;
  std::size_t accepted_ = 0;
  std::size_t open_count_ = 0;
  std::size_t disconnects_ = 0;
  std::size_t aborted_ = 0;
};

}  // namespace ingressd::demo
