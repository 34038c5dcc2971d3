#pragma once
// A fake Ray Serve data-plane replica (ray-serve-ingress.md §2.3): an HTTP/1.1 keep-alive server
// that streams OpenAI-style SSE completions token by token. Used by `ingressd --demo` and, with
// scripted behaviours, as the integration tests' upstream.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "ingressd/demo/server_base.hpp"

namespace ingressd::demo {

/// What the replica does with a request. Applies to every request except `/-/healthz` (health
/// is scripted separately with set_healthy(), so that a proxy's health checks do not disturb a
/// test that makes requests hang or fail).
struct replica_behaviour {
  enum class kind {
    normal,                ///< healthz / SSE completions / JSON echo (see replica_server)
    hang,                  ///< read the request, never answer (until the peer closes)
    close_before_headers,  ///< read the request, then close with FIN, no response byte
    reset_after_events,    ///< send SSE headers and `events` token events, then RST
    stream_events,         ///< on any path: SSE with `events` token events `event_delay` apart, then [DONE]
    respond,               ///< fixed reply: `status`, `headers`, `body` (see format_response)
  };
  kind what = kind::normal;
  std::size_t events = 0;
  std::chrono::milliseconds event_delay{0};
  unsigned status = 200;
  header_list headers;
  std::string body;
  /// Extra delay between reading the request and sending the response headers (any kind
  /// except hang) — time-to-first-byte, for first_byte_timeout tests.
  std::chrono::milliseconds header_delay{0};

  static replica_behaviour normal() { return {}; }
  static replica_behaviour hang() { return with_kind(kind::hang); }
  static replica_behaviour close_before_headers() { return with_kind(kind::close_before_headers); }
  /// Events are spaced by the replica's token_delay.
  static replica_behaviour reset_after_events(std::size_t n) {
    auto b = with_kind(kind::reset_after_events);
    b.events = n;
    return b;
  }
  static replica_behaviour stream_events(std::size_t n, std::chrono::milliseconds delay) {
    auto b = with_kind(kind::stream_events);
    b.events = n;
    b.event_delay = delay;
    return b;
  }
  static replica_behaviour respond(unsigned status, header_list headers, std::string body) {
    auto b = with_kind(kind::respond);
    b.status = status;
    b.headers = std::move(headers);
    b.body = std::move(body);
    return b;
  }
  replica_behaviour& after(std::chrono::milliseconds delay) {
    header_delay = delay;
    return *this;
  }

 private:
  static replica_behaviour with_kind(kind k) {
    replica_behaviour b;
    b.what = k;
    return b;
  }
};

/// The fake replica. Every response carries `x-served-by: <name>`.
///
/// Normal behaviour:
///  - `/-/healthz` → 200 `success`, or 503 `UNHEALTHY` after set_healthy(false); counted by
///    probe_count(), not recorded in requests();
///  - `POST` to a path ending in `/chat/completions` or `/completions` whose JSON body has
///    `"stream": true` → 200 `text/event-stream`, chunked, one chunk per event: `tokens` events
///    `data: {"id":..,"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"<tok>"}}]}`
///    (for `/completions`: `"object":"text_completion"`, `"choices":[{"index":0,"text":"<tok>"}]`),
///    the first right after the headers and the next ones `token_delay` apart, then
///    `data: [DONE]` and the last chunk. An HTTP/1.0 request gets the same events unchunked,
///    ended by close;
///  - anything else → 200 `application/json` `{"replica":name,"method":..,"target":..,"body_bytes":n}`.
/// Streaming stops as soon as the peer goes away (see aborted_responses()).
class replica_server final : public server_base {
 public:
  struct options {
    std::string name = "SERVE_REPLICA::llm#LLMServer#demo";
    std::string bind_ip = "127.0.0.1";
    std::uint16_t port = 0;
    std::chrono::milliseconds token_delay{20};
    std::size_t tokens = 8;
  };

  /// Binds, listens and starts serving (throws boost::system::system_error if it cannot bind).
  explicit replica_server(options opts);
  ~replica_server() override;

  const std::string& name() const { return opts_.name; }

  void set_healthy(bool healthy);
  bool healthy() const;
  /// Sets the behaviour for all following requests (once the queue below is empty).
  void set_behaviour(replica_behaviour b);
  /// Queues a one-shot behaviour: the next request (not counting health checks) gets it, then
  /// the following queued one, then the set_behaviour() one.
  void queue_behaviour(replica_behaviour b);

 protected:
  awaitable<after_reply> handle(exchange& ex) override;
  bool is_probe(const recorded_request& r) const override;

 private:
  replica_behaviour next_behaviour();
  awaitable<after_reply> stream(exchange& ex, std::size_t events, std::chrono::milliseconds delay,
                                bool chat, bool finish);
  std::string event_json(std::size_t index, bool chat) const;

  options opts_;
  mutable std::mutex script_mu_;
  bool healthy_ = true;
  replica_behaviour behaviour_;
  std::deque<replica_behaviour> queued_;
  std::uint64_t stream_seq_ = 0;  // I/O thread only
};

}  // namespace ingressd::demo
