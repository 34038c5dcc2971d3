#pragma once
// One proxied request, from its route to the end of its response (contract §4.2–§4.4). It lives
// in its connection's serve_one() frame while the request runs, and is registered with the
// connection (ex_) so that the watchdog, the client watch and abort() can cancel what it waits
// for. Its stages run in order (run(), exchange.cpp): decide_route (the router call included,
// exchange_router.cpp), pick and connect the upstream, send_request, read_response_head,
// relay_response. A stage answers step::next, step::done (the request has ended: result_) or
// step::again (the pooled connection the request went out on was stale: choose, connect and send
// once more).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ingressd/core/asio.hpp"
#include "ingressd/core/reason.hpp"
#include "ingressd/http/relay_parser.hpp"
#include "ingressd/routing/hedge.hpp"
#include "ingressd/routing/router_reply.hpp"
#include "ingressd/topology/snapshot.hpp"
#include "ingressd/upstream/pool.hpp"
#include "proxy/http1/connection.hpp"

namespace ingressd::server {

class exchange {
 public:
  using clock = std::chrono::steady_clock;
  using outcome = connection::outcome;

  /// A request for app `app_index` of the worker's current snapshot; `target`: its
  /// request-target for the replica (root_path stripped).
  exchange(connection& c, std::size_t app_index, std::string target);
  /// Ends the client watch (parked as the idle wait when the connection stays open with nothing
  /// buffered) and unregisters.
  ~exchange();
  exchange(const exchange&) = delete;
  exchange& operator=(const exchange&) = delete;

  /// The request through its stages; what the connection does next.
  awaitable<outcome> run();

  /// The watchdog or the client watch: what the replica connection is doing ends (operation_aborted).
  void cancel_upstream() { lease_.cancel(); }
  /// abort(): the replica connection's and the router calls' operations end.
  void cancel_all();
  /// A router call's timer (its deadline, or the first call's hedge delay) fired; `gen`: the
  /// call it was armed for.
  void on_router_timer(std::size_t slot, unsigned gen);

 private:
  using phase = connection::phase;
  enum class step : std::uint8_t { next, again, done };

  // Route (exchange.cpp, exchange_router.cpp).
  /// True when a router decides where the request goes (the rest of decide_route).
  bool router_decides();
  awaitable<step> decide_route();
  /// The router's reply (or a failure) becomes the route: the replica it names, or a fallback.
  awaitable<step> take_router_reply(routing::router_reply reply, std::optional<reason> failure);

  // Upstream: chooses it (routing::choose_upstream over the node-wide states) and takes a pooled
  // connection to it when there is one; connect_upstream opens one when not.
  enum class pick : std::uint8_t { pooled, connect, none };
  pick pick_upstream();
  awaitable<step> connect_upstream();
  /// The pooled connection was stale: the request goes out once more on a fresh one.
  void send_again();
  awaitable<step> send_request();
  awaitable<step> read_response_head();
  awaitable<step> relay_response();
  // The WebSocket tunnel after a 101 (tunnel.cpp, issue #32).
  awaitable<void> tunnel();
  /// One direction of the tunnel: bytes from the replica to the client (`to_client`) or back,
  /// as they arrive, each read written before the next (back-pressure), until an end.
  awaitable<void> tunnel_pump(bool to_client);
  /// Writes `bufs` to the client (`to_client`) or the replica; what must wait moves out of the
  /// worker's window into the direction's own buffer first. Once written, `carried` bytes (the
  /// tunnel's own, not a head) are counted to the direction. False on an error.
  awaitable<bool> tunnel_write(bool to_client, std::span<asio::const_buffer> bufs, std::size_t carried);
  /// One side ended the tunnel with an error (or a deadline, or the daemon's stop): both close.
  void tunnel_broken(std::string_view side);
  /// The forwarded request head, re-framed (contract §4.4), into request_head.
  void build_request_head();
  /// The response head for the client after read_response_head (response_head): the replica's
  /// end-to-end fields, the request's id, our framing. Sets close_ for what the client gets.
  void finish_response_head();
  /// Body bytes about to go to the client: the LLM meter's events (TTFT, gaps, counts).
  void note_llm(const unsigned char* p, std::size_t n);
  /// After the response body: the lease back to the pool (or reset, and the client's connection
  /// too, when the stream broke: `broken`), the outcome for the connection.
  step end_relay(bool broken);
  /// How body_now left the next response piece: parsed into the relay window; the socket has
  /// nothing yet (wait for readability); or for Beast's read (EOF, or a full buffer).
  enum class piece_read : std::uint8_t { parsed, wait, beast };
  /// One read of the replica socket without waiting, parsed into the relay window; errors in `ec`.
  piece_read body_now(error_code& ec);
  /// Ends the request with the response ingressd generates for `r`.
  awaitable<step> answer(reason r, std::string_view detail = {});
  /// Ends the request after an upstream failure: the upstream connection is reset, the client
  /// gets the response for `r`.
  awaitable<step> upstream_failed(reason r);
  step finish(outcome o);
  /// Why an app has no healthy replica, for the 503's body: the first replica down and its cause.
  std::string down_replicas_text(const topology::app_view& v) const;
  /// A connection to replica `ep` failed (refused, timed out, reset before a response head):
  /// health.error_limit of them in a row mark it down (passive health, contract §9).
  void note_upstream_error(const topology::endpoint& ep, std::string_view what);
  /// A response head came from `ep`: its run of connection errors is over.
  static void note_upstream_ok(const topology::endpoint& ep);

  // The router call (exchange_router.cpp).
  using decision = std::pair<routing::router_reply, std::optional<reason>>;
  /// One routing decision: tries the app's router pool from this worker's cursor, failing over
  /// only when a router gave no reply (contract §4.2), and hedging a late call to the next router
  /// (router.hedge, the race decided by routing::hedge_race). Returns the reply or a failure
  /// reason. `body` outlives the call (the body prefix is not touched while it runs).
  awaitable<decision> ask_routers(std::string_view body, std::optional<std::uint64_t> truncated_total);
  /// What one attempt at one router returned.
  struct router_exchange {
    bool replied = false;
    bool timed_out = false;  ///< no reply within the attempt's timeout
    bool lost = false;       ///< cancelled: the other call of a hedged pair won first
    unsigned status = 0;
    std::string body;
  };
  /// A router call in progress, for its timer, its hedge and cancel_all(): its connection and
  /// what ended it.
  struct router_call {
    upstream::lease lease;
    clock::time_point deadline;                             ///< router.timeout (or a probe's)
    clock::time_point hedge_at = clock::time_point::max();  ///< when the hedge goes out (slot 0)
    bool timed_out = false;
    bool lost = false;  ///< the other call of a hedged pair won: this one was cancelled
  };
  /// One attempt at one router over a pooled keep-alive connection; a stale pooled connection
  /// is retried once on a fresh one. It is call slot `slot` (0: the call ask_routers awaits, 1:
  /// its hedge), bounded by that slot's timer; at `hedge_at` (slot 0) the timer sends the hedge.
  awaitable<router_exchange> router_attempt(const topology::endpoint& ep, const std::string& request,
                                            clock::duration timeout, std::size_t slot,
                                            clock::time_point hedge_at = clock::time_point::max());
  /// The attempt at pool index `r` as the next call of the decision: its request and timeout.
  clock::duration prepare_attempt(std::size_t r, routing::router_request_parts& parts, std::string& request,
                                  bool probe);
  /// The hedge of the coming call, when router.hedge allows one: the race is planned for pool
  /// index `h` (`probe`: that router failed recently). Returns when the hedge is due.
  clock::time_point plan_hedge(std::size_t h, bool probe, const routing::router_request_parts& parts,
                               clock::time_point attempt_start);
  /// Metrics and memory of one ended call at pool index `r` (dead-router memory, the hedge delay).
  void account(std::size_t r, const router_exchange& ex, clock::duration took);
  /// The decision's result from the reply of a call that replied (`hedged`: a hedge went out).
  decision reply_decision(const topology::endpoint& ep, routing::router_reply reply, bool hedged);
  void arm_router_timer(std::size_t slot);
  /// The hedge is due (the timer of call slot 0): send it, if the race and the budget allow.
  void launch_hedge();
  awaitable<void> hedge_call();
  /// Waits until the hedge call has ended.
  awaitable<void> hedge_ended();
  /// Cancels call `slot`: the other call of the race won (or the request is going away).
  void cancel_call(std::size_t slot);
  /// The worker's state of the request's app now (the worker may have applied a new topology
  /// while the request waited), or null when the app is gone; `same_pool`: only if its router
  /// pool is still the one the request uses.
  app_state* app_now(bool same_pool);
  /// The router's connection header value of the request (ray-serve-ingress.md §2.1).
  std::string_view session_value() const;

  const config::config& cfg() const { return c_.cfg(); }
  const topology::app_view& view() const { return snap_->apps[where_.app]; }

  connection& c_;
  worker& w_;
  request_scratch& rq_;
  // The request, fixed once its head is read.
  std::string target_;  ///< request-target for the replica (root_path stripped)
  std::string_view request_id_;
  unsigned client_version_ = 11;
  bool head_only_ = false;
  bool has_body_ = false;  ///< body bytes follow the head
  bool chunked_in_ = false;
  bool expect_continue_ = false;  ///< ingressd answers 100-continue before reading the body
  bool close_ = false;            ///< the client connection closes after this response
  // The route (decide_route); `snap_` and `where_` follow topology changes (pick_upstream).
  std::shared_ptr<const topology::snapshot> snap_;
  topology::placement where_;
  bool prefer_fallback_ = false;  ///< the app's fallback target first (see routing::choice_inputs)
  std::vector<std::pair<std::string, std::string>> router_headers_;
  /// A request that a pooled connection can carry again on a fresh one if the replica had closed
  /// it while it sat in the pool: no body and an idempotent method (RFC 9110 §9.2.2), and no
  /// router decision to honour. It skips the pool's liveness peek (a system call per request)
  /// and is sent once more (step::again) when its reused connection fails before any response byte.
  bool resend_ok_ = false;
  bool resent_ = false;
  // The router calls in progress: [0] the one ask_routers awaits, [1] its hedge; each with its
  // timer in the scratch. `gen` numbers them (connection::router_gen_, across exchanges), so that
  // a stale timer handler finds no call.
  struct call_slot {
    router_call* call = nullptr;
    unsigned gen = 0;
  };
  std::array<call_slot, 2> calls_;
  /// The routing decision's hedge: the race, the router it asks and what its call returned.
  routing::hedge_race race_;
  struct {
    const topology::endpoint* ep = nullptr;
    bool probe = false;                     ///< that router failed recently: a probe's timeout
    routing::router_request_parts request;  ///< views that outlive the race
    bool done = false;                      ///< the hedge call has ended (`result`, `took`)
    router_exchange result;
    routing::router_reply reply;            ///< its reply, parsed, when it replied
    clock::duration took{};
  } hedge_;
  // The upstream (connect_upstream ... relay_response).
  std::vector<std::string> tried_;  ///< keys of upstreams that refused it
  unsigned connect_failures_ = 0;
  reason no_upstream_ = reason::no_healthy_replica;  ///< why pick_upstream found none
  const topology::endpoint* ep_ = nullptr;          ///< where it goes (in `snap_`)
  bool observed_ = false;                           ///< ep_ is a replica: passive health watches the exchange
  upstream::lease lease_;
  topology::in_flight_mark load_;
  clock::time_point sent_at_;
  std::optional<http::relay_response_parser> rp_;
  /// The last read took all the replica socket held (a short read or EAGAIN) and no readiness
  /// wait has completed since: the next read would most likely fail with EAGAIN, so the relay
  /// waits for readability first (nginx's `ready` flag). Always safe: the wait re-arms the
  /// registration, so bytes or a FIN that came meanwhile complete it at once.
  bool up_empty_ = false;
  bool chunked_out_ = false;  ///< the response goes to the client chunked (finish_response_head)
  /// An event-stream or JSON 2xx response: what its body says of the LLM work (issue #34).
  std::optional<http::llm_meter> meter_;
  clock::time_point last_event_at_;
  bool upgrade_ = false;      ///< a WebSocket handshake: a 101 switching to websocket makes a tunnel
  bool tunnel_ = false;       ///< the replica's 101 came: the connection is a tunnel now
  /// The tunnel's two directions: bytes carried, a buffer for what a slow side has not taken
  /// (made on first need: an idle tunnel holds none), and how it ended.
  struct tunnel_direction {
    std::uint64_t bytes = 0;
    std::unique_ptr<unsigned char[]> own;
  };
  struct {
    tunnel_direction to_replica, to_client;
    std::string_view closed_by;  ///< "client", "replica", "timeout" or "shutdown": the first end
    bool broken = false;         ///< ended by an error, a deadline or a stop (both sides reset)
  } tun_;
  outcome result_ = outcome::close;  ///< set by the stage that ended it
};

}  // namespace ingressd::server
