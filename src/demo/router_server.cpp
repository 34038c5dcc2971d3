#include "ingressd/demo/router_server.hpp"

#include <optional>

#include <nlohmann/json.hpp>

namespace ingressd::demo {

namespace {

const header_list json_type = {{"Content-Type", "application/json"}};

// Parameters by value: the coroutine frame owns them (and GCC 12 mis-handles temporaries that
// live across a co_await).
awaitable<after_reply> reply(exchange& ex, unsigned status, header_list headers, std::string body) {
  const auto& req = ex.request();
  const bool keep_open = req.keep_alive && !wants_close(headers);
  const auto bytes = format_response(status, headers, body, keep_open, req.method == "HEAD");
  if (!co_await ex.write(bytes)) co_return after_reply::done;
  co_return keep_open ? after_reply::keep_alive : after_reply::close;
}

}  // namespace

router_server::router_server(options opts)
    : server_base(opts.bind_ip, opts.port, "router " + opts.name), opts_(std::move(opts)) {
  start();
}

router_server::~router_server() { stop(); }

void router_server::set_replicas(const std::vector<std::string>& names) {
  std::vector<topology::target> replicas;
  replicas.reserve(names.size());
  for (const auto& n : names) replicas.push_back(topology::target{.ip = "", .port = 0, .instance_id = "", .name = n});
  set_replicas(std::move(replicas));
}

void router_server::set_replicas(std::vector<topology::target> replicas) {
  std::lock_guard lock(script_mu_);
  replicas_ = std::move(replicas);
  cursor_ = 0;
}

void router_server::set_behaviour(router_behaviour b) {
  std::lock_guard lock(script_mu_);
  behaviour_ = std::move(b);
}

void router_server::queue_behaviour(router_behaviour b) {
  std::lock_guard lock(script_mu_);
  queued_.push_back(std::move(b));
}

router_behaviour router_server::next_behaviour() {
  std::lock_guard lock(script_mu_);
  if (queued_.empty()) return behaviour_;
  auto b = std::move(queued_.front());
  queued_.pop_front();
  return b;
}

bool router_server::delayed(const router_behaviour& b) {
  if (b.delay.count() <= 0 || b.delay_share <= 0) return false;
  if (b.delay_share >= 1) return true;
  std::lock_guard lock(script_mu_);
  // splitmix64: a repeatable sequence from the fixed seed, the same in every run.
  std::uint64_t z = (coin_ += 0x9e3779b97f4a7c15);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 < b.delay_share;
}

std::vector<recorded_request> router_server::route_requests() const {
  auto all = requests();
  std::erase_if(all, [](const recorded_request& r) { return r.path() != "/internal/route"; });
  return all;
}

std::vector<std::string> router_server::picks() const {
  std::lock_guard lock(script_mu_);
  return {picks_.begin(), picks_.end()};
}

awaitable<after_reply> router_server::handle(exchange& ex) {
  const auto& req = ex.request();
  const auto path = req.path();
  if (path == "/health" && (req.method == "GET" || req.method == "HEAD"))
    co_return co_await reply(ex, 200, json_type, R"({"status":"ok"})");
  if (path != "/internal/route") co_return co_await reply(ex, 404, json_type, R"({"detail":"Not Found"})");
  if (req.method != "POST") co_return co_await reply(ex, 405, json_type, R"({"detail":"Method Not Allowed"})");

  const auto b = next_behaviour();
  if (b.what == router_behaviour::kind::hang) {
    co_await ex.wait_for_peer_close();
    co_return after_reply::done;
  }
  if (delayed(b) && !co_await ex.wait(b.delay)) co_return after_reply::done;

  switch (b.what) {
    case router_behaviour::kind::close_without_reply:
      ex.close();
      co_return after_reply::done;
    case router_behaviour::kind::respond:
      co_return co_await reply(ex, b.status, b.headers, b.body);
    case router_behaviour::kind::hang:
    case router_behaviour::kind::round_robin:
      break;
  }

  std::optional<topology::target> pick;
  {
    std::lock_guard lock(script_mu_);
    if (!replicas_.empty()) {
      pick = replicas_[cursor_ % replicas_.size()];
      ++cursor_;
      picks_.push_back(pick->name);
      if (picks_.size() > record_limit()) picks_.pop_front();
    }
  }
  if (!pick) co_return co_await reply(ex, 503, json_type, R"({"detail":"No replicas available for the deployment."})");

  nlohmann::ordered_json body;
  body["host"] = pick->ip;
  body["port"] = pick->port;
  body["replica_id"] = pick->name;
  if (!b.request_headers.empty()) body["request_headers"] = b.request_headers;
  auto text = body.dump();
  co_return co_await reply(ex, 200, json_type, std::move(text));
}

}  // namespace ingressd::demo
