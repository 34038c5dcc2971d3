#pragma once
// One HTTP/1 client connection: the TLS handshake, idle waits, request heads (keep-alive,
// in-order pipelining), the answers ingressd gives itself (probes, refusals), the watchdog and
// the client watch. Each request that goes to a replica is an exchange (exchange.hpp), which
// lives while the request does and uses the connection only through the members it befriends.
// Lives on its worker's thread only.
//
// Files: connection.cpp (the connection's life), connection_record.cpp (metrics and the access
// log line of each request), exchange.cpp (a proxied request's stages), exchange_router.cpp (its
// router call and hedge).
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>

#include "ingressd/core/asio.hpp"
#include "ingressd/core/reason.hpp"
#include "ingressd/http/llm_meter.hpp"
#include "ingressd/http/parse_guards.hpp"
#include "ingressd/http/validate.hpp"
#include "ingressd/metrics/access_log.hpp"
#include "ingressd/metrics/request_metrics.hpp"
#include "worker/worker.hpp"

namespace ingressd::server {

namespace bhttp = boost::beast::http;

class exchange;
struct request_scratch;

class connection : public std::enable_shared_from_this<connection>, public connection_hook {
  friend class exchange;
  friend struct request_scratch;

 public:
  /// Client sockets and the watchdog timer name the io_context's executor type: 48 bytes less
  /// each than with any_io_executor, and the same again for every pending operation on them —
  /// memory that every idle connection holds (hardening H3).
  using client_socket = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;
  using watchdog_timer = asio::basic_waitable_timer<std::chrono::steady_clock,
                                                    asio::wait_traits<std::chrono::steady_clock>,
                                                    asio::io_context::executor_type>;
  /// `tls`: the HTTPS listener's context (the connection starts with a handshake), or null.
  /// `client`: the client a PROXY protocol header named (else the socket's peer is).
  connection(worker& w, client_socket sock, SSL_CTX* tls = nullptr, std::optional<tcp::endpoint> client = std::nullopt);
  ~connection();
  /// Serves the connection until it closes: waits for the first request without a coroutine
  /// (after the TLS handshake, on the HTTPS listener).
  void start();
  /// Drain: closes the connection now if it is idle between requests, else after this response.
  void close_if_idle();
  /// Closes the connection if it has been idle for `keepalive` or longer (the worker's sweep).
  void expire_idle(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration keepalive);
  /// Hard stop: closes the connection whatever it is doing.
  void abort();

 private:
  /// What the connection waits for; a deadline that passes cancels the I/O of that phase.
  /// body_wait: router.body_wait, the longest wait for the body prefix the router is to see.
  /// tunnel: a WebSocket tunnel between two moves of bytes (timeout.tunnel).
  enum class phase : std::uint8_t { none, handshake, head, body, body_wait, connect, first_byte, stream, tunnel };
  using clock = std::chrono::steady_clock;
  // Beast's parsers, minus the field-length throw and trailer merging (http/parse_guards.hpp).
  using request_parser = http::guarded_parser<true, bhttp::buffer_body>;

  enum class outcome { keep_alive, close };

  /// The TLS handshake, as plain handlers (an idle connection holds no coroutine frame): a step
  /// that would block waits for readiness; tls.handshake_timeout bounds the whole.
  void handshake_step();
  void handshake_failed(tls::handshake_failure why);
  /// Runs `f` on the client stream: the TLS stream on the HTTPS listener, else the socket. Both
  /// read and write through the same calls (core/socket_io.hpp, tls/stream.hpp).
  template <class F>
  decltype(auto) client(F&& f) {
    if (tls_) return f(*tls_);
    return f(sock_);
  }
  /// Calls `h(error_code)` once the client has bytes to read: at once (posted) when TLS already
  /// holds some that a wait on the socket would not see.
  template <class Handler>
  void when_readable(Handler&& h);
  /// Waits (a plain handler, no coroutine) until the idle connection is readable, then serve().
  void wait_idle();
  /// The idle wait's completion: serve the next request, or close (keep-alive timeout, drain).
  void on_idle_ready(error_code ec);
  /// Serves requests while bytes are buffered (pipelining), then goes idle or closes.
  awaitable<void> serve();
  /// Closes the connection: FIN after anything written, timers stopped.
  void close_now();
  /// One request: its head, then an answer of ingressd's own or an exchange with a replica.
  awaitable<outcome> serve_one();
  /// Reads the request head (leading empty lines skipped) and decides it (http::judge_head).
  /// `ec`: Beast's error when it refused the head while reading it. Nullopt when the client went
  /// away (or a drain cancelled the wait) before there was a head.
  struct head_read {
    http::head_verdict verdict;
    error_code ec;
  };
  awaitable<std::optional<head_read>> read_head();
  /// The request head from what the socket holds right now (one non-blocking recv, no Beast read
  /// operation). True when that settled it: the head is parsed, or `ec` says why not; false when
  /// more bytes must be awaited (async_read_header carries on with the same parser and buffer).
  bool head_now(http::bounded_buffer& in, error_code& ec);
  /// The response to a request head that could not be read: 408 after header_timeout, else the
  /// status judge_head chose (400, 413, 414, 431, 505).
  std::string head_error_response(error_code ec, unsigned status);
  /// The response refusing a head Beast read but ingressd does not forward (smuggling shapes,
  /// versions, targets: judge_head).
  std::string refusal_response(const http::head_verdict& v) const;
  /// The body of every refusal of a head or a body: the status's reason phrase and what was
  /// wrong (`why`, when known); a 413 names client.max_body_bytes instead.
  std::string refusal_body(unsigned status, std::string_view why) const;
  /// An HTTP/2 connection preface where a request line should be: answered in HTTP/2 (a GOAWAY
  /// with HTTP_1_1_REQUIRED that says why), counted as a 505, and the connection closes.
  awaitable<outcome> refuse_http2();
  /// The request-target for the replica when the path (`path`, of `target`) lost root_path.
  static std::string upstream_target(std::string_view target, std::string_view path, std::string_view stripped);
  awaitable<bool> write_all(std::string_view data);
  /// Picks the request's id once its head is parsed (rq_->request_id).
  void choose_request_id();
  /// The request's id; one is generated for a response sent before a usable head was read.
  std::string_view request_id();
  awaitable<outcome> respond(std::string response, bool close);
  awaitable<outcome> respond_reason(reason r, bool close, std::string_view path = {}, std::string_view detail = {});
  outcome builtin(std::string_view path, std::string& response);
  awaitable<outcome> body_error(error_code ec);
  bool method_routed(std::string_view method) const;

  /// Reads request body bytes into rq_->prebody until the body ends or it holds `cap` bytes; with
  /// `wait` (router.body_wait), stops waiting for more once that much time has passed (not an error).
  awaitable<error_code> read_prebody(std::size_t cap, std::optional<clock::duration> wait = std::nullopt);
  /// Reads request body bytes into the parser's body window until it makes progress: Beast's
  /// async_read_some for a request body, plus the checks of http::body_from_buffer.
  awaitable<error_code> read_body_some();
  /// read_body_some's first step, without I/O (http::body_from_buffer on buf_). Called inline
  /// first, since the body nearly always came with the head: no coroutine frame for it.
  bool body_from_buffer(error_code& ec);

  // Watchdog: one timer per connection, moved only when a deadline comes closer.
  void arm(clock::duration d, phase p);
  void disarm() { deadline_ = clock::time_point::max(); }
  void start_wait();
  void on_deadline();
  bool timed_out(phase p) const { return timed_out_ == p; }

  // Client watch: a readiness wait kept pending on the client while an exchange works with the
  // replica, so that a client that goes away is noticed at once (even during a long prefill) and
  // the upstream is closed. An exchange starts it (start_watch) and ends it when it ends
  // (end_watch, from its destructor): on a keep-alive connection with nothing buffered the
  // pending wait is parked and becomes the idle wait (one epoll_ctl per request, where a watch
  // read (EAGAIN) and then a new idle wait made two system calls); otherwise it is cancelled,
  // and its completion, when it comes, finds a newer generation and does nothing.
  void start_watch();
  void end_watch(bool keep_alive);
  bool watching() const { return watch_ == watch::on; }
  void arm_watch();
  /// One read from the client that never waits (plain or TLS): bytes into `room` (`got`), or what
  /// to wait for before the next try, or the end: `eof` (FIN, a TLS close) or `error` (reset, a TLS
  /// error). Also the WebSocket tunnel's reads (tunnel.cpp), which pass an EOF on as a half close.
  enum class client_read : std::uint8_t { data, wait_read, wait_write, eof, error };
  client_read read_client_now(asio::mutable_buffer room, std::size_t& got);
  /// The same for a plain socket `fd` (the client's, or a tunnel's replica connection).
  static client_read read_socket_now(int fd, asio::mutable_buffer room, std::size_t& got);
  void on_watch(error_code ec, unsigned gen);
  /// The rest of the request body is in buf_ (or there is none): no client read is needed for it.
  bool body_buffered() const;
  /// off: no watch; on: watching; parked: the exchange ended and the pending wait serves as the
  /// idle wait.
  enum class watch : std::uint8_t { off, on, parked };

  /// RST instead of FIN: a truncated stream must never look like a clean end (hardening G3).
  static void hard_close(client_socket& s);
  void release_buffers();
  unsigned char* relay_buffer();

  // The client as the request's forwarding headers tell it (client.trusted_proxies).
  /// X-Forwarded-For lines (joined) and X-Forwarded-Proto of a request from a trusted proxy.
  static void collect_forwarded(std::string_view name, std::string_view value, std::string& chain,
                                std::string_view& proto);
  void forwarded_chain_refused(std::string_view chain);
  bool peer_trusted() const;
  /// The access log's client_ip: the rightmost untrusted address of a trusted proxy's chain.
  std::string client_ip() const;

  // Request accounting (metrics and access log, connection_record.cpp). A record starts before
  // each request head is read and is finished by serve() after serve_one() returns.
  struct request_record {
    bool active = false;
    bool probe = false;                        ///< /-/healthz, /-/routes: not counted, not logged
    clock::time_point start;
    metrics::app_metrics* block = nullptr;     ///< null: the app="" block
    unsigned status = 0;                       ///< status sent to the client (0: none yet)
    std::uint64_t bytes = 0;                   ///< response body bytes sent
    std::optional<reason> why;                 ///< reason of a response ingressd generated
    std::optional<metrics::termination> term;  ///< set where the exchange ended abnormally
    bool routed = false;                       ///< a router was consulted
    std::optional<reason> router_failure;
    clock::duration router_latency{};
    bool hedged = false;                       ///< a hedge went out (router.hedge)
    unsigned retries = 0;
    // LLM figures of an event-stream or JSON response (http::llm_meter): see access_entry.
    std::optional<clock::duration> ttft;
    std::uint64_t events = 0;
    clock::duration max_gap{};
    std::optional<http::llm_usage> usage;
    bool tunnel = false;                       ///< a WebSocket tunnel (bytes: the replica's)
    std::uint64_t tunnel_bytes_to_replica = 0;
    std::string_view closed_by;                ///< the side that ended the tunnel first
    // For the access log only (filled when it is on):
    std::string router, router_addr, replica, replica_addr, request_id;
  };
  bool logging() const { return w_.shared().access_log != nullptr; }
  void begin_request();
  void finish_request();
  /// One router attempt ended after `took` (ingressd_router_attempts_total,
  /// ingressd_router_attempt_latency_seconds): it replied with `status`, or gave no reply
  /// (`lost`: it was cancelled because the other call of a hedged pair won).
  void note_router_attempt(std::size_t pool_index, const topology::endpoint& ep, std::optional<unsigned> status,
                           bool lost, clock::duration took);
  /// The router whose answer decided (or the last one consulted), and whether the call was
  /// hedged (access log).
  void note_router_used(const topology::endpoint& ep, bool hedged);
  void note_hedge(metrics::hedge_result r);
  /// The routing decision is final: latency by outcome, failures by reason.
  void note_router_outcome(std::optional<reason> failure);
  /// The request goes to `ep` after `retries` connect failures.
  void note_replica(const topology::endpoint& ep, unsigned retries);
  /// A response ingressd generated was written (or failed to be): status, body bytes, ending.
  void note_response(std::string_view response, bool written);
  /// A write to the client failed or a stream ended early: how, from the timers and flags.
  metrics::termination client_side_end() const;

  const config::config& cfg() const { return *cfg_; }

  worker& w_;
  std::shared_ptr<const config::config> cfg_;  // of the current request (SIGHUP-safe)
  client_socket sock_;
  std::unique_ptr<tls::stream> tls_;  // the HTTPS listener's connections only
  bool handed_over_ = false;           // ALPN h2: the connection went to the gRPC listener's code
  boost::beast::flat_buffer buf_;
  std::unique_ptr<request_parser> parser_;  // on the heap: an idle connection holds none
  watchdog_timer timer_;
  clock::time_point deadline_ = clock::time_point::max();
  std::string peer_;                  ///< the client as ingressd knows it (socket peer or PROXY source)
  boost::asio::ip::address peer_addr_;  ///< the same, for client.trusted_proxies
  exchange* ex_ = nullptr;  ///< the exchange in progress (registration), for the watchdog, the watch and abort()
  unsigned waits_ = 0;
  unsigned watch_gen_ = 0;
  unsigned router_gen_ = 0;  ///< numbers router calls (exchange::calls_), so that a stale timer handler finds no call  ///< numbers client watches: a cancelled one's completion finds a newer number
  phase phase_ = phase::none;
  phase timed_out_ = phase::none;
  bool idle_ = false;
  clock::time_point idle_since_;
  bool close_after_ = false;
  bool aborted_ = false;
  watch watch_ = watch::off;
  bool client_gone_ = false;
  /// Present from the start of a request until the connection goes idle (worker's spares).
  std::unique_ptr<request_scratch> rq_;
};

/// What only a request in progress needs. Idle connections hold none of it (hardening H3): it
/// goes back to the worker's spares, so busy connections do not allocate it per request.
struct request_scratch {
  explicit request_scratch(asio::io_context& ioc)
      : router_timers{connection::watchdog_timer(ioc.get_executor()), connection::watchdog_timer(ioc.get_executor())},
        hedge_done(ioc.get_executor()) {}
  /// The request head as the client sent it (the bytes Beast consumed), for http::judge_head.
  std::string client_head;
  std::string request_head;   ///< the head the exchange forwards to the replica
  std::string response_head;  ///< the replica's response head as the client gets it (and interim heads)
  /// The request's id (contract §4.4, §9): the client's X-Request-Id when usable (a view into the
  /// parsed head), else `generated`. Empty until chosen; every response carries it.
  std::string_view request_id;
  std::array<char, 36> generated{};
  std::string router_request;              ///< the router call being made (its capacity is kept)
  std::string hedge_request;               ///< its hedge (router.hedge)
  std::string prebody;                     ///< body bytes read before the upstream was chosen
  std::unique_ptr<unsigned char[]> relay;  ///< relay_size bytes, made on first use: a streamed upload, or a response piece a slow client has not taken
  /// The router calls' timers (router.timeout; the first call's also sends the hedge): [0] the
  /// call the routing decision awaits, [1] its hedge.
  std::array<connection::watchdog_timer, 2> router_timers;
  connection::watchdog_timer hedge_done;      ///< the exchange waits on it for the hedge call to end
  connection::request_record rec;
};

}  // namespace ingressd::server
