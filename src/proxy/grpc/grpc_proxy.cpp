// The call flow of the gRPC ingress: a call's route (app, replica, link), what ingressd answers
// itself, and how a call is counted when it ends. The links (links.cpp) turn frames into the
// events of grpc::call_state; this file carries out what it decides.
#include "proxy/grpc/grpc_proxy.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <boost/container/small_vector.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/grpc/nghttp2.hpp"
#include "ingressd/grpc/protocol.hpp"
#include "ingressd/routing/chooser.hpp"
#include "proxy/grpc/hub.hpp"

namespace ingressd::server {

using grpc::nv;
using grpc_links::call;
using grpc_links::call_ptr;
using grpc_links::client_link;
using grpc_links::clock;
using grpc_links::upstream_link;

void grpc_hub::impl::flush_dirty() {
  // Flushing may mark more connections dirty (a data provider reopens the other side's window).
  for (std::size_t i = 0; i < dirty.size(); ++i) {
    auto l = dirty[i];
    l->flush();
  }
  dirty.clear();
}

void grpc_hub::impl::start(const call_ptr& c) {
  c->snap = w.snapshot_ptr();
  if (c->timeout && c->client) {
    c->deadline.emplace(w.ioc());
    const auto timeout = std::chrono::duration_cast<clock::duration>(
        std::min<std::chrono::nanoseconds>(*c->timeout, std::chrono::hours(24 * 365)));
    c->deadline->expires_after(timeout);
    c->state.set_deadline(c->sent_after, timeout);
    std::weak_ptr<call> weak = c;
    c->deadline->async_wait([this, weak](error_code ec) {
      auto cp = weak.lock();
      if (ec || !cp || !cp->client) return;
      fail(cp, grpc::status::deadline_exceeded, reason::upstream_timeout, "deadline exceeded (grpc-timeout)");
      flush_dirty();
    });
  }
  if (c->state.http_request()) {
    // Not a gRPC call: an HTTP client that offered only h2 over TLS (ALPN), or spoke HTTP/2 by
    // prior knowledge. HTTP apps are served over HTTP/1.1 (docs/grpc.md): HTTP_1_1_REQUIRED
    // (RFC 9113 §7) says so in the protocol, and clients such as curl then retry over HTTP/1.1.
    nghttp2_submit_rst_stream(c->client->s(), NGHTTP2_FLAG_NONE, c->csid, NGHTTP2_HTTP_1_1_REQUIRED);
    c->client->want_flush();
    return;
  }
  if (!c->snap) {
    fail(c, grpc::status::unavailable, reason::no_healthy_replica, "no topology yet");
    return;
  }
  if (grpc::is_serve_api(c->path) && c->snap->grpc_fallback) {
    c->target = &*c->snap->grpc_fallback;
    c->mark.set(c->target->state);
    auto l = acquire(*c->target);
    if (l->ready) submit(c, *l);
    else l->waiting.push_back(c);
    return;
  }
  c->app = grpc::pick_app(*c->snap, c->application ? std::optional<std::string_view>(*c->application) : std::nullopt);
  if (!c->app) {
    fail(c, grpc::status::not_found, reason::no_route,
         c->application ? "no gRPC application matches the call's 'application' metadata"
                        : "the call names no application ('application' metadata) and several gRPC applications are served");
    return;
  }
  dispatch(c);
}

void grpc_hub::impl::dispatch(const call_ptr& c) {
  const auto& app = c->snap->grpc_apps[*c->app];
  boost::container::small_vector<routing::candidate, 8> cands;
  cands.reserve(app.replicas.size());
  bool any_up = false;
  for (const auto& r : app.replicas) {
    const bool up = r.state->up.load(std::memory_order_relaxed);
    any_up = any_up || up;
    const bool tried = std::find(c->tried.begin(), c->tried.end(), r.key) != c->tried.end();
    cands.push_back({up, r.state->in_flight.load(std::memory_order_relaxed), tried});
  }
  routing::choice_inputs in;
  in.prefer_fallback = !any_up;
  in.fallback_usable = app.fallback && app.fallback->state->up.load(std::memory_order_relaxed);
  in.tried_any = !c->tried.empty();
  in.start = rotor++;
  const auto choice = routing::choose_upstream(cands, in);
  if (choice.what == routing::choice::kind::none) {
    if (c->tried.empty())
      fail(c, grpc::status::unavailable, reason::no_healthy_replica,
           "app '" + app.name + "' has no healthy gRPC replica");
    else
      fail(c, grpc::status::unavailable, reason::upstream_error, "no replica of app '" + app.name + "' could be reached");
    return;
  }
  c->target = choice.what == routing::choice::kind::fallback ? &*app.fallback : &app.replicas[choice.index];
  c->mark.set(c->target->state);
  auto l = acquire(*c->target);
  if (l->ready) submit(c, *l);
  else l->waiting.push_back(c);
}

std::shared_ptr<upstream_link> grpc_hub::impl::acquire(const topology::endpoint& ep) {
  auto& list = upstreams[ep.key];
  boost::container::small_vector<grpc::link_room, 4> rooms;
  for (const auto& l : list) rooms.push_back(l->room());
  if (const auto i = grpc::choose_link(rooms, w.cfg().grpc.max_upstream_connections)) return list[*i];
  auto l = std::make_shared<upstream_link>(*this, ep);
  list.push_back(l);
  l->connect();
  return l;
}

void grpc_hub::impl::drop(upstream_link* l) {
  auto it = upstreams.find(l->key);
  if (it == upstreams.end()) return;
  auto& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(), [l](const auto& p) { return p.get() == l; }), list.end());
  if (list.empty()) upstreams.erase(it);
}

void grpc_hub::impl::submit(const call_ptr& c, upstream_link& l) {
  std::vector<nghttp2_nv> h;
  h.reserve(c->headers.size() + 4);
  h.push_back(nv(":method", c->method.empty() ? std::string_view("POST") : std::string_view(c->method)));
  h.push_back(nv(":scheme", "http"));
  h.push_back(nv(":authority", c->authority.empty() ? std::string_view(l.key) : std::string_view(c->authority)));
  h.push_back(nv(":path", c->path));
  for (const auto& x : c->headers) h.push_back(nv(x.name, x.value));
  // A header list the replica said it refuses (SETTINGS_MAX_HEADER_LIST_SIZE) is never sent:
  // grpcio fails every call of the connection and closes it (issue #31), so only this caller
  // hears of it. A large list on a link whose SETTINGS have not arrived yet waits for them.
  std::size_t list_size = 0;
  for (const auto& x : h) list_size += x.namelen + x.valuelen + 32;  // RFC 9113 §6.5.2
  if (!l.settings_known && list_size > grpc_links::default_header_list) {
    l.waiting.push_back(c);
    return;
  }
  const std::uint32_t limit =
      l.settings_known ? nghttp2_session_get_remote_settings(l.s(), NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE) : UINT32_MAX;
  if (list_size > limit) {
    fail(c, grpc::status::resource_exhausted, reason::upstream_error,
         "the call's metadata (" + std::to_string(list_size) + " bytes) is more than the replica accepts (" +
             std::to_string(limit) + " bytes)");
    return;
  }
  const bool body = !(c->state.request_ended() && c->req.empty());
  const auto sid = l.submit_request(h, body);
  if (sid < 0) {
    fail(c, grpc::status::unavailable, reason::upstream_error, "could not open a stream to the replica");
    return;
  }
  c->up = &l;
  c->usid = sid;
  c->last_activity = l.read_at();
  l.calls.emplace(sid, c);
}

void grpc_hub::impl::respond(const call_ptr& c, bool end_stream, bool informational) {
  if (!c->client) return;
  std::optional<unsigned> status;
  if (end_stream)
    for (const auto& x : c->resp_headers)
      if (x.name == "grpc-status") status = grpc::parse_status(x.value);
  if (c->state.response_head(informational, end_stream, status) == grpc::call_state::head_action::ignore) {
    // A 1xx head, or one after ingressd answered: nothing of it goes on; the next head starts afresh.
    c->resp_headers.clear();
    c->resp_headers_size = 0;
    return;
  }
  auto& cl = *c->client;
  std::vector<nghttp2_nv> h;
  h.reserve(c->resp_headers.size());
  for (const auto& x : c->resp_headers) h.push_back(nv(x.name, x.value));
  nghttp2_data_provider prd{};
  prd.read_callback = client_link::read_response;
  nghttp2_submit_response(cl.s(), c->csid, h.data(), h.size(), end_stream ? nullptr : &prd);
  c->resp_headers.clear();
  c->resp_headers.shrink_to_fit();
  cl.want_flush();
}

namespace {
/// Cancels the call's upstream stream (RST_STREAM CANCEL) and takes it off that connection (its
/// queued response bytes were acknowledged to the connection when they came: on_data).
void cancel_upstream(call& c) {
  if (!c.up) return;
  c.up->cancel(c.usid);
  c.up = nullptr;
}
}  // namespace

void grpc_hub::impl::fail(const call_ptr& c, grpc::status st, reason why, std::string_view text) {
  cancel_upstream(*c);
  c->mark.clear();
  if (!c->client) return;
  const auto act = c->state.fail(st, why);
  if (act == grpc::call_state::fail_action::none) return;
  const std::string code = std::to_string(static_cast<unsigned>(st));
  const std::string message = grpc::encode_message(std::string(to_string(why)) + ": " + std::string(text));
  auto& cl = *c->client;
  if (act == grpc::call_state::fail_action::trailers_only) {
    const nghttp2_nv h[] = {nv(":status", "200"), nv("content-type", "application/grpc"), nv("grpc-status", code),
                            nv("grpc-message", message)};
    nghttp2_submit_response(cl.s(), c->csid, h, std::size(h), nullptr);
    cl.want_flush();
  } else {
    // Mid-stream: what the replica sent so far still goes out, then these trailers.
    c->resp_trailers = {{"grpc-status", code}, {"grpc-message", message}};
    cl.wake(c->csid);
  }
}

void grpc_hub::impl::upstream_gone(const call_ptr& c, std::uint32_t error_code, bool connection_lost,
                                   std::string_view why) {
  if (!c->client) return;
  switch (c->state.upstream_closed(error_code, connection_lost)) {
    case grpc::call_state::upstream_end::nothing:
      return;
    case grpc::call_state::upstream_end::refuse:
      c->mark.clear();
      nghttp2_submit_rst_stream(c->client->s(), NGHTTP2_FLAG_NONE, c->csid, NGHTTP2_REFUSED_STREAM);
      c->client->want_flush();
      return;
    case grpc::call_state::upstream_end::lost:
      if (c->target && c->state.counts_against_replica())
        w.note_upstream_error(*c->target, "connection lost", w.cfg().health.error_limit);
      fail(c, grpc::status::unavailable, reason::upstream_error,
           why.empty() ? std::string_view("connection to the replica lost") : why);
      return;
    case grpc::call_state::upstream_end::reset:
      fail(c, grpc::status_of_h2_error(error_code), reason::upstream_error,
           std::string("the replica reset the stream (") + nghttp2_http2_strerror(error_code) + ")");
      return;
  }
}

void grpc_hub::impl::finish(const call_ptr& c, std::uint32_t error_code) {
  cancel_upstream(*c);
  // Request bytes the replica never took: acknowledged to the client's connection, whose window
  // would otherwise shrink by them for good.
  if (c->client && !c->client->closed() && !c->req.empty())
    nghttp2_session_consume_connection(c->client->s(), c->req.size());
  if (c->deadline) c->deadline->cancel();
  const auto out = c->state.closed(error_code, w.stopping());
  const auto why = c->state.why();
  metrics::app_metrics* block = nullptr;
  if (c->app && c->snap == w.snapshot_ptr()) block = w.grpc_block(*c->app);
  if (!block && c->app && c->snap) block = w.grpc_block_named(c->snap->grpc_apps[*c->app].name);
  if (!block) block = &w.metrics().no_app();
  block->grpc_status[out.status].add(1);
  const auto took = clock::now() - c->start;
  block->grpc_duration.observe(took);
  if (w.cfg().metrics.ray_compatible && !c->state.http_request())
    block->ray_grpc.observe(c->path, out.status, metrics::ray_series::route::app, took);
  if (why) block->generated[static_cast<std::size_t>(*why)].add(1);
  w.stats().grpc_streams.sub(1);
  if (auto* log = w.shared().access_log) {
    metrics::access_entry e;
    e.time = c->wall;
    e.client = c->client ? std::string_view(c->client->remote()) : std::string_view();
    e.listener = "grpc";
    e.method = c->method;
    e.path = c->path;
    if (c->app && c->snap) e.app = c->snap->grpc_apps[*c->app].name;
    e.status = out.http_status;
    e.grpc_status = static_cast<int>(out.status);
    e.bytes = c->bytes_out;
    e.duration = took;
    if (c->target) {
      e.replica = c->target->name.empty() ? std::string_view(c->target->key) : std::string_view(c->target->name);
      e.replica_addr = c->target->key;
    }
    e.retries = c->retries;
    e.term = out.term;
    if (why) e.reason = to_string(*why);
    e.request_id = c->request_id;
    log->write(e);
  }
  c->mark.clear();
  c->client = nullptr;
  c->req.release();
  c->resp.release();
}

// ------------------------------------------------------------------------------------------

grpc_hub::grpc_hub(worker& w) : impl_(std::make_unique<impl>(w)) {}

grpc_hub::~grpc_hub() { abort_all(); }

void grpc_hub::accept(socket sock, std::unique_ptr<tls::stream> tls, std::string remote) {
  auto l = std::make_shared<client_link>(*impl_, std::move(sock), std::move(tls));
  if (!remote.empty()) l->set_remote(std::move(remote));
  impl_->clients.insert(l);
  l->start();
}

void grpc_hub::drain() {
  std::vector<std::shared_ptr<client_link>> all(impl_->clients.begin(), impl_->clients.end());
  for (auto& l : all) l->drain();
  // Collected first: retiring an idle connection closes it, which takes it out of the map.
  std::vector<std::shared_ptr<upstream_link>> ups;
  for (auto& [key, list] : impl_->upstreams) ups.insert(ups.end(), list.begin(), list.end());
  for (auto& l : ups) l->retire();
  impl_->flush_dirty();
}

void grpc_hub::abort_all() {
  std::vector<std::shared_ptr<client_link>> all(impl_->clients.begin(), impl_->clients.end());
  for (auto& l : all) l->close();
  std::vector<std::shared_ptr<upstream_link>> ups;
  for (auto& [key, list] : impl_->upstreams) ups.insert(ups.end(), list.begin(), list.end());
  for (auto& l : ups) l->close();
  impl_->dirty.clear();
}

void grpc_hub::topology_changed() {
  const auto* snap = impl_->w.snap();
  std::vector<std::shared_ptr<upstream_link>> gone;
  for (auto& [key, list] : impl_->upstreams)
    if (!snap || !snap->grpc_keys.contains(key)) gone.insert(gone.end(), list.begin(), list.end());
  for (auto& l : gone) l->retire();
  impl_->flush_dirty();
}

void grpc_hub::sweep() {
  const auto now = clock::now();
  const auto& cfg = impl_->w.cfg();
  const auto first_byte = std::chrono::duration_cast<clock::duration>(cfg.upstream.first_byte_timeout);
  const auto idle = std::chrono::duration_cast<clock::duration>(cfg.upstream.idle_timeout);
  std::vector<std::shared_ptr<upstream_link>> idle_links;
  std::vector<call_ptr> stalled;
  for (auto& [key, list] : impl_->upstreams)
    for (auto& l : list) {
      if (l->ready && l->calls.empty() && now - l->idle_since > grpc_links::upstream_idle) idle_links.push_back(l);
      for (const auto& [sid, c] : l->calls)
        if (c->client && c->state.idle_expired(now, c->last_activity, first_byte, idle)) stalled.push_back(c);
    }
  // upstream.first_byte_timeout and upstream.idle_timeout, as for HTTP: UNAVAILABLE is gRPC's
  // reading of the 504 an HTTP client would get (grpc/doc/http-grpc-status-mapping.md).
  for (auto& c : stalled)
    impl_->fail(c, grpc::status::unavailable, reason::upstream_timeout,
                c->state.response_started() ? "no bytes from the replica within upstream.idle_timeout"
                                            : "no response from the replica within upstream.first_byte_timeout");
  for (auto& l : idle_links) l->close();
  impl_->flush_dirty();
}

}  // namespace ingressd::server
