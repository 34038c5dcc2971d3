// Request accounting of a connection: per-app metrics (contract §6) and the access log line. Kept
// apart from connection.cpp and the exchange, which only mark the points where a request's facts
// become known.
#include <charconv>

#include "ingressd/http/message.hpp"
#include "ingressd/routing/route_table.hpp"
#include "proxy/http1/connection.hpp"

namespace ingressd::server {

using metrics::termination;

void connection::begin_request() {
  if (!rq_) rq_ = w_.take_scratch();
  rq_->request_id = {};
  auto& r = rq_->rec;
  r.active = true;
  r.probe = false;
  r.start = clock::now();
  r.block = nullptr;
  r.status = 0;
  r.bytes = 0;
  r.why.reset();
  r.term.reset();
  r.routed = false;
  r.router_failure.reset();
  r.router_latency = {};
  r.hedged = false;
  r.retries = 0;
  r.ttft.reset();
  r.events = 0;
  r.max_gap = {};
  r.usage.reset();
  r.tunnel = false;
  r.tunnel_bytes_to_replica = 0;
  r.closed_by = {};
  r.router.clear();
  r.router_addr.clear();
  r.replica.clear();
  r.replica_addr.clear();
  r.request_id.clear();
}

termination connection::client_side_end() const {
  if (aborted_) return termination::shutdown;
  if (timed_out_ != phase::none) return termination::timeout;
  return termination::client_abort;
}

void connection::note_response(std::string_view response, bool written) {
  unsigned status = 0;
  if (response.size() >= 12) std::from_chars(response.data() + 9, response.data() + 12, status);
  rq_->rec.status = status;
  if (!written) {
    rq_->rec.term = client_side_end();
    return;
  }
  if (auto p = response.find("\r\n\r\n"); p != std::string_view::npos) rq_->rec.bytes += response.size() - (p + 4);
  if (status == 408 || rq_->rec.why == reason::upstream_timeout) rq_->rec.term = termination::timeout;
  else if (rq_->rec.why == reason::upstream_error) rq_->rec.term = termination::error;
}

void connection::note_router_attempt(std::size_t pool_index, const topology::endpoint& ep, std::optional<unsigned> status,
                                  bool lost, clock::duration took) {
  const auto result = status ? (*status == 200 ? metrics::attempt_result::ok : metrics::attempt_result::non_200)
                      : lost ? metrics::attempt_result::cancelled
                             : metrics::attempt_result::no_reply;
  if (rq_->rec.block)
    if (auto* slot = rq_->rec.block->router(pool_index, ep.key)) {
      slot->results[static_cast<std::size_t>(result)].add();
      // A cancelled call says nothing about how long the router takes.
      if (result != metrics::attempt_result::cancelled) slot->latency.observe(took);
    }
  rq_->rec.routed = true;
}

void connection::note_router_used(const topology::endpoint& ep, bool hedged) {
  rq_->rec.routed = true;
  rq_->rec.hedged = hedged;
  if (logging()) {
    rq_->rec.router = ep.name.empty() ? ep.key : ep.name;
    rq_->rec.router_addr = ep.key;
  }
}

void connection::note_hedge(metrics::hedge_result r) {
  if (rq_->rec.block) rq_->rec.block->hedges[static_cast<std::size_t>(r)].add();
}

void connection::note_router_outcome(std::optional<reason> failure) {
  rq_->rec.routed = true;
  rq_->rec.router_failure = failure;
  const std::size_t i = metrics::router_outcome_index(failure);
  if (!rq_->rec.block) return;
  rq_->rec.block->router_latency[i].observe(rq_->rec.router_latency);
  if (i != 0) rq_->rec.block->router_failures[i].add();
}

void connection::note_replica(const topology::endpoint& ep, unsigned retries) {
  rq_->rec.retries = retries;
  if (logging()) {
    rq_->rec.replica = ep.name.empty() ? ep.key : ep.name;
    rq_->rec.replica_addr = ep.key;
  }
}

void connection::finish_request() {
  if (!rq_) return;
  auto& r = rq_->rec;
  if (!r.active) return;
  r.active = false;
  const bool ray = cfg_ && cfg().metrics.ray_compatible;
  if (r.probe) {
    // Ray's proxy counts its probes too, with the path as the route (its dashboard hides them).
    if (ray && parser_) {
      const auto& req = parser_->get();
      const auto route = routing::path_of(req.target()) == "/-/healthz" ? metrics::ray_series::route::healthz
                                                                          : metrics::ray_series::route::routes;
      w_.metrics().no_app().ray_http.observe(req.method_string(), r.status, route, clock::now() - r.start);
    }
    return;
  }
  const bool head = parser_ && parser_->is_header_done();
  if (!head && r.status == 0) return;  // the connection ended before a request: nothing to count

  termination term = termination::ok;
  if (r.term) term = *r.term;
  else if (aborted_) term = termination::shutdown;
  else if (client_gone_ || r.status == 0) term = termination::client_abort;
  if (r.status == 0 && term == termination::client_abort) r.status = 499;

  const auto elapsed = clock::now() - r.start;
  auto& block = r.block ? *r.block : w_.metrics().no_app();
  // A client that left mid-response is counted as 499 (nginx's "client closed request", Ray's
  // code for a disconnect), not as the status its response began with: a dashboard of 200s
  // would hide every abandoned stream. The access log keeps the status sent, beside
  // termination client_abort.
  const unsigned counted = term == termination::client_abort ? 499 : r.status;
  block.codes.add(counted);
  // Ray's series: requests that reached routing (an app, or the no_route answer), as Ray's proxy
  // sees them; refusals of the head come from its HTTP server, before the proxy.
  if (ray && parser_ && (r.block || r.why == reason::no_route))
    block.ray_http.observe(parser_->get().method_string(), counted, metrics::ray_series::route::app, elapsed);
  block.duration.observe(elapsed);
  if (r.why) block.generated[static_cast<std::size_t>(*r.why)].add();

  auto* log = w_.shared().access_log;
  if (!log) return;
  metrics::access_entry e;
  e.time = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(elapsed);
  e.client = peer_;
  const std::string client = client_ip();
  e.client_ip = client;
  e.listener = tls_ ? "https" : "http";
  // The request line, also when the head was refused after it (a Content-Length over
  // client.max_body_bytes is refused while the head is parsed: 413).
  if (parser_ && !parser_->get().target().empty()) {
    const auto& req = parser_->get();
    e.method = req.method_string();
    e.path = routing::path_of(req.target());
  }
  e.app = block.name;
  e.status = r.status;
  e.bytes = r.bytes;
  e.duration = elapsed;
  if (r.routed) {
    e.router = r.router;
    e.router_addr = r.router_addr;
    e.router_latency = r.router_latency;
    e.router_outcome = metrics::router_outcome_name(metrics::router_outcome_index(r.router_failure));
    e.router_hedged = r.hedged;
  }
  e.replica = r.replica;
  e.replica_addr = r.replica_addr;
  e.retries = r.retries;
  if (r.ttft) {
    e.ttft = std::chrono::duration_cast<std::chrono::nanoseconds>(*r.ttft);
    e.events = r.events;
    e.max_gap = std::chrono::duration_cast<std::chrono::nanoseconds>(r.max_gap);
  }
  if (r.usage) {
    e.prompt_tokens = r.usage->prompt;
    e.completion_tokens = r.usage->completion;
  }
  e.tunnel = r.tunnel;
  e.tunnel_bytes_to_replica = r.tunnel_bytes_to_replica;
  e.closed_by = r.closed_by;
  e.term = term;
  if (r.why) e.reason = to_string(*r.why);
  if (!r.request_id.empty()) e.request_id = r.request_id;
  log->write(e);
}

}  // namespace ingressd::server
