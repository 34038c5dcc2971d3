#pragma once
// One client connection: reads requests (keep-alive, in-order pipelining), routes each one and
// relays it to a replica, streaming the response back. Lives on its worker's thread only.
//
// The life of a proxied request (session::proxy, src/server/session_proxy.cpp) is a sequence of
// stages over one request_state: decide_route (the router call included), connect_upstream
// (choose and connect), send_request, read_response_head, relay_response. A stage answers
// step::next, step::done (the request has ended: request_state::result) or step::again (the
// pooled connection the request went out on was stale: choose, connect and send once more).
// The connection's own life (idle waits, request heads, probes, generated responses, the
// watchdog and the client watch) is in session.cpp; router calls in session_route.cpp.
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
#include "ingressd/http/parse_guards.hpp"
#include "ingressd/http/relay_parser.hpp"
#include "ingressd/metrics/access_log.hpp"
#include "ingressd/metrics/request_metrics.hpp"
#include "ingressd/routing/router_reply.hpp"
#include "ingressd/upstream/pool.hpp"
#include "server/worker.hpp"

namespace ingressd::server {

namespace bhttp = boost::beast::http;

struct request_state;

class session : public std::enable_shared_from_this<session>, public session_hook {
  friend struct request_scratch;
  friend struct request_state;

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
  session(worker& w, client_socket sock, SSL_CTX* tls = nullptr, std::optional<tcp::endpoint> client = std::nullopt);
  ~session();
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
  /// What the session waits for; a deadline that passes cancels the I/O of that phase.
  /// body_wait: router.body_wait, the longest wait for the body prefix the router is to see.
  enum class phase : std::uint8_t { none, handshake, head, body, body_wait, connect, first_byte, stream };
  using clock = std::chrono::steady_clock;
  // Beast's parsers, minus the field-length throw and trailer merging (http/parse_guards.hpp).
  using request_parser = http::guarded_parser<true, bhttp::buffer_body>;
  using response_parser = http::relay_response_parser;

  enum class outcome { keep_alive, close };
  /// What a stage of a proxied request leaves it to do (see the top of this file).
  enum class step : std::uint8_t { next, again, done };

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
  awaitable<outcome> serve_one();
  /// The request head from what the socket holds right now (one non-blocking recv, no Beast read
  /// operation). True when that settled it: the head is parsed, or `ec` says why not; false when
  /// more bytes must be awaited (async_read_header carries on with the same parser and buffer).
  bool head_now(http::bounded_buffer& in, error_code& ec);
  /// The response to a request head that could not be read: 408 after header_timeout, else the
  /// status for Beast's error (400, 413, 414, 431, 505).
  std::string head_error_response(error_code ec);
  /// An HTTP/2 connection preface where a request line should be: answered in HTTP/2 (a GOAWAY
  /// with HTTP_1_1_REQUIRED that says why), counted as a 505, and the connection closes.
  awaitable<outcome> refuse_http2();
  /// The response refusing a head Beast read but ingressd does not forward (smuggling shapes,
  /// versions, targets), or nullopt.
  std::optional<std::string> refuse_head();
  /// A request for app `app_index` (its request-target for the replica: `target`), through its
  /// stages; src/server/session_proxy.cpp.
  awaitable<outcome> proxy(std::size_t app_index, std::string target);
  /// Stages. Each may end the request (step::done, with rs.result). A stage whose common case
  /// needs no waiting has that part as a plain function, so that it costs no coroutine frame.
  /// Route: true when a router decides where the request goes (the rest of decide_route).
  bool router_decides(request_state& rs);
  awaitable<step> decide_route(request_state& rs);
  /// Upstream: chooses it (routing::choose_upstream over the node-wide states) and takes a pooled
  /// connection to it when there is one; connect_upstream opens one when not.
  enum class pick : std::uint8_t { pooled, connect, none };
  pick pick_upstream(request_state& rs);
  awaitable<step> connect_upstream(request_state& rs);
  /// The pooled connection was stale: the request goes out once more on a fresh one.
  static void send_again(request_state& rs);
  awaitable<step> send_request(request_state& rs);
  awaitable<step> read_response_head(request_state& rs);
  awaitable<step> relay_response(request_state& rs);
  /// The forwarded request head, re-framed (contract §4.4), into rq_->head.
  void build_request_head(const request_state& rs);
  /// The response head for the client after read_response_head (rq_->head): the replica's
  /// end-to-end fields, the request's id, our framing. Sets rs.close for what the client gets.
  void finish_response_head(request_state& rs);
  /// After the response body: the lease back to the pool (or reset, and the client's connection
  /// too, when the stream broke: `broken`), the outcome for the connection.
  step end_relay(request_state& rs, bool broken);
  /// How body_now left the next response piece: parsed into the relay window; the socket has
  /// nothing yet (wait for readability); or for Beast's read (EOF, or a full buffer).
  enum class piece_read : std::uint8_t { parsed, wait, beast };
  /// One read of the replica socket without waiting, parsed into the relay window; errors in `ec`.
  piece_read body_now(request_state& rs, error_code& ec);
  /// Ends the request with the response ingressd generates for `r`.
  awaitable<step> answer(request_state& rs, reason r);
  /// X-Forwarded-For lines (joined) and X-Forwarded-Proto of a request from a trusted proxy.
  static void collect_forwarded(std::string_view name, std::string_view value, std::string& chain,
                                std::string_view& proto);
  void forwarded_chain_refused(std::string_view chain);
  /// The access log's client_ip: the rightmost untrusted address of a trusted proxy's chain.
  std::string client_ip() const;
  /// Why an app has no healthy replica, for the 503's body: the first replica down and its cause.
  std::string down_replicas_text(const topology::app_view& v) const;
  /// Ends the request after an upstream failure: the upstream connection is reset, the client
  /// gets the response for `r`.
  awaitable<step> upstream_failed(request_state& rs, reason r);
  static step finish(request_state& rs, outcome o);
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
  /// async_read_some for a request body, plus a check Beast lacks (http::malformed_chunk_line).
  awaitable<error_code> read_body_some();
  /// read_body_some's first step, without I/O: parses what buf_ holds. True when that settled
  /// the read (progress, done, or an error in `ec`); false when bytes must be read. Called inline
  /// first, since the body nearly always came with the head: no coroutine frame for it.
  bool body_from_buffer(error_code& ec);
  /// A connection to replica `ep` failed (refused, timed out, reset before a response head):
  /// health.error_limit of them in a row mark it down (passive health, contract §9).
  void note_upstream_error(const topology::endpoint& ep, std::string_view what);
  /// A response head came from `ep`: its run of connection errors is over.
  static void note_upstream_ok(const topology::endpoint& ep);

  /// One routing decision: tries the app's router pool from this worker's cursor, failing over
  /// only when a router gave no reply (contract §4.2), and hedging a late call to the next router
  /// (router.hedge). Returns the reply or a failure reason. `rs` and `body` outlive the call
  /// (proxy()'s frame awaits it; the body prefix is not touched while it runs).
  awaitable<std::pair<routing::router_reply, std::optional<reason>>> ask_routers(
      const request_state& rs, std::string_view body, std::optional<std::uint64_t> truncated_total);
  struct router_exchange {
    bool replied = false;
    bool timed_out = false;  ///< no reply within the attempt's timeout
    bool lost = false;       ///< cancelled: the other call of a hedged pair won first
    unsigned status = 0;
    std::string body;
  };
  /// One attempt at one router over a pooled keep-alive connection; a stale pooled connection
  /// is retried once on a fresh one. It is call slot `slot` (0: the call ask_routers awaits, 1:
  /// its hedge), bounded by that slot's timer; at `hedge_at` (slot 0) the timer sends the hedge.
  awaitable<router_exchange> router_attempt(const topology::endpoint& ep, const std::string& request,
                                            clock::duration timeout, std::size_t slot,
                                            clock::time_point hedge_at = clock::time_point::max());
  /// A router call in progress, for its timer, its hedge and abort(): its connection and what
  /// ended it.
  struct router_call {
    upstream::lease lease;
    clock::time_point deadline;                             ///< router.timeout (or a probe's)
    clock::time_point hedge_at = clock::time_point::max();  ///< when the hedge goes out (slot 0)
    bool timed_out = false;
    bool lost = false;  ///< the other call of a hedged pair won: this one was cancelled
  };
  /// Where a router call registers (request_scratch::calls): its timer's handler finds it there
  /// while `gen` matches.
  struct call_slot {
    router_call* call = nullptr;
    unsigned gen = 0;
  };
  /// The hedge of one routing decision (router.hedge): the second call, to the next router in
  /// attempt order. Lives in ask_routers' frame, which does not end before the hedge call has.
  struct hedge_race {
    const topology::endpoint* ep = nullptr;  ///< the router the hedge asks
    std::size_t pool_index = 0;
    bool probe = false;                      ///< that router failed recently: a probe's timeout
    routing::router_request_parts request;   ///< views that outlive the race
    bool launched = false;  ///< the hedge went out
    bool refused = false;   ///< it was due, but the budget was spent
    bool settled = false;   ///< a call's 200 reply was taken: the other one is not wanted
    bool won = false;       ///< the hedge's reply was taken (`reply`)
    bool done = false;      ///< the hedge call has ended (`result`, `took`)
    router_exchange result;
    routing::router_reply reply;
    clock::duration took{};
  };
  void arm_router_timer(std::size_t slot);
  void on_router_timer(std::size_t slot, unsigned gen);
  /// The hedge is due (the timer of call slot 0): send it, if the budget allows.
  void launch_hedge();
  awaitable<void> hedge_call(std::shared_ptr<session> self, hedge_race& race);
  /// Waits until the hedge call has ended.
  awaitable<void> hedge_ended(hedge_race& race);
  /// The worker's state of the request's app now (the worker may have applied a new topology
  /// while the request waited), or null when the app is gone; `same_pool`: only if its router
  /// pool is still the one the request uses.
  app_state* app_now(const request_state& rs, bool same_pool);

  // Watchdog: one timer per connection, moved only when a deadline comes closer.
  void arm(clock::duration d, phase p);
  void disarm() { deadline_ = clock::time_point::max(); }
  void start_wait();
  void on_deadline();
  bool timed_out(phase p) const { return timed_out_ == p; }

  // Client watch: a readiness wait kept pending on the client while the upstream works, so that
  // a client that goes away is noticed at once (even during a long prefill) and the upstream is
  // closed. When the request ends on a keep-alive connection with nothing buffered, the pending
  // wait is parked and becomes the idle wait: one epoll_ctl per request, where a watch read
  // (EAGAIN) and then a new idle wait made two system calls.
  void start_watch();
  void arm_watch();
  /// One read from the client that never waits (plain or TLS): bytes into `room` (`got`), or what
  /// to wait for before the next try, or gone (EOF, reset, a TLS error).
  enum class client_read : std::uint8_t { data, wait_read, wait_write, gone };
  client_read read_client_now(asio::mutable_buffer room, std::size_t& got);
  void on_watch(error_code ec);
  awaitable<void> stop_watch();
  void park_watch();
  /// The rest of the request body is in buf_ (or there is none): no client read is needed for it.
  bool body_buffered() const;
  /// off: no watch; on: watching; stopping: stop_watch() asked it to end; parked: the request
  /// ended and the pending wait serves as the idle wait.
  enum class watch : std::uint8_t { off, on, stopping, parked };

  /// RST instead of FIN: a truncated stream must never look like a clean end (hardening G3).
  static void hard_close(client_socket& s);
  void release_buffers();
  unsigned char* relay_buffer();

  // Request accounting (metrics and access log, src/server/session_record.cpp). A record starts
  // before each request head is read and is finished by serve() after serve_one() returns.
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
    // For the access log only (filled when it is on):
    std::string router, router_addr, replica, replica_addr, request_id;
  };
  bool logging() const { return w_.shared().access_log != nullptr; }
  void begin_request();
  void finish_request();
  /// One router attempt ended after `took` (ingressd_router_attempts_total,
  /// ingressd_router_attempt_latency_seconds).
  void note_router_attempt(std::size_t pool_index, const topology::endpoint& ep, const router_exchange& ex,
                           clock::duration took);
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
  unsigned router_gen_ = 0;      // numbers router calls, so that a stale timer handler finds no call
  upstream::lease* up_ = nullptr;  // the replica connection in use (registration), for cancellation
  unsigned waits_ = 0;
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

/// One proxied request from stage to stage (session::proxy). Lives in proxy()'s coroutine frame.
struct request_state {
  using clock = std::chrono::steady_clock;
  // The request, fixed once its head is read.
  std::string target;          ///< request-target for the replica (root_path stripped)
  std::string_view request_id;
  unsigned client_version = 11;
  bool head_only = false;
  bool has_body = false;        ///< body bytes follow the head
  bool chunked_in = false;
  bool expect_continue = false;  ///< ingressd answers 100-continue before reading the body
  bool close = false;            ///< the client connection closes after this response
  // The route (decide_route); `snap` and `where` follow topology changes (connect_upstream).
  std::shared_ptr<const topology::snapshot> snap;
  topology::placement where;
  bool prefer_fallback = false;  ///< the app's fallback target first (see routing::choice_inputs)
  std::vector<std::pair<std::string, std::string>> router_headers;
  /// A request that a pooled connection can carry again on a fresh one if the replica had closed
  /// it while it sat in the pool: no body and an idempotent method (RFC 9110 §9.2.2), and no
  /// router decision to honour. It skips the pool's liveness peek (a system call per request)
  /// and is sent once more (step::again) when its reused connection fails before any response byte.
  bool resend_ok = false;
  bool resent = false;
  // The upstream (connect_upstream ... relay_response).
  std::vector<std::string> tried;          ///< keys of upstreams that refused it
  unsigned connect_failures = 0;
  reason no_upstream = reason::no_healthy_replica;  ///< why pick_upstream found none
  const topology::endpoint* ep = nullptr;  ///< where it goes (in `snap`)
  bool observed = false;                   ///< ep is a replica: passive health watches the exchange
  upstream::lease lease;
  topology::in_flight_mark load;
  clock::time_point sent_at;
  std::optional<http::relay_response_parser> rp;
  /// The last read took all the replica socket held (a short read or EAGAIN) and no readiness
  /// wait has completed since: the next read would most likely fail with EAGAIN, so the relay
  /// waits for readability first (nginx's `ready` flag). Always safe: the wait re-arms the
  /// registration, so bytes or a FIN that came meanwhile complete it at once.
  bool up_empty = false;
  bool chunked_out = false;  ///< the response goes to the client chunked (finish_response_head)
  session::outcome result = session::outcome::close;  ///< set by the stage that ended it
};

/// What only a request in progress needs. Idle connections hold none of it (hardening H3): it
/// goes back to the worker's spares, so busy connections do not allocate it per request.
struct request_scratch {
  explicit request_scratch(asio::io_context& ioc)
      : watch_done(ioc.get_executor()),
        router_timers{session::watchdog_timer(ioc.get_executor()), session::watchdog_timer(ioc.get_executor())},
        hedge_done(ioc.get_executor()) {}
  std::string head;                        ///< scratch for serialising heads
  /// The request's id (contract §4.4, §9): the client's X-Request-Id when usable (a view into the
  /// parsed head), else `generated`. Empty until chosen; every response carries it.
  std::string_view request_id;
  std::array<char, 36> generated{};
  std::string router_request;              ///< the router call being made (its capacity is kept)
  std::string hedge_request;               ///< its hedge (router.hedge)
  std::string prebody;                     ///< body bytes read before the upstream was chosen
  std::unique_ptr<unsigned char[]> relay;  ///< relay_size bytes, made on first use: a streamed upload, or a response piece a slow client has not taken
  session::watchdog_timer watch_done;      ///< stop_watch() waits on it for the watch to end
  /// Router calls in progress: [0] the one ask_routers awaits, [1] its hedge; each with its
  /// timer (router.timeout; slot 0's also sends the hedge).
  std::array<session::call_slot, 2> calls;
  std::array<session::watchdog_timer, 2> router_timers;
  session::hedge_race* race = nullptr;     ///< the routing decision's hedge (registration)
  session::watchdog_timer hedge_done;      ///< hedge_ended() waits on it for the hedge call to end
  session::request_record rec;
};

}  // namespace ingressd::server
