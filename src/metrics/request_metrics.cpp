#include "ingressd/metrics/request_metrics.hpp"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace ingressd::metrics {

std::size_t router_outcome_index(std::optional<reason> failure) noexcept {
  if (!failure) return 0;
  switch (*failure) {
    case reason::router_unreachable: return 1;
    case reason::router_non_200: return 2;
    case reason::unparseable_replica_id: return 3;
    case reason::unknown_replica_id: return 4;
    default: return 0;
  }
}

std::string_view router_outcome_name(std::size_t index) noexcept {
  switch (index) {
    case 1: return to_string(reason::router_unreachable);
    case 2: return to_string(reason::router_non_200);
    case 3: return to_string(reason::unparseable_replica_id);
    case 4: return to_string(reason::unknown_replica_id);
    default: return "ok";
  }
}

std::string_view to_string(attempt_result r) noexcept {
  switch (r) {
    case attempt_result::ok: return "ok";
    case attempt_result::no_reply: return "no_reply";
    case attempt_result::non_200: return "non_200";
    case attempt_result::cancelled: return "cancelled";
  }
  return "ok";
}

std::string_view to_string(hedge_result r) noexcept {
  switch (r) {
    case hedge_result::sent: return "sent";
    case hedge_result::won: return "won";
    case hedge_result::refused: return "refused";
  }
  return "sent";
}

void status_counters::add(unsigned code) noexcept {
  if (code > max_code) {
    other_.add();
    return;
  }
  std::uint8_t s = slot_of_[code];
  if (s == 0) {
    const std::size_t n = used_.load(std::memory_order_relaxed);
    if (n == capacity) {
      other_.add();
      return;
    }
    codes_[n] = static_cast<std::uint16_t>(code);
    used_.store(n + 1, std::memory_order_release);
    s = slot_of_[code] = static_cast<std::uint8_t>(n + 1);
  }
  counts_[s - 1].add();
}

namespace {

template <std::size_t... I>
std::array<histogram, sizeof...(I)> router_histograms(std::index_sequence<I...>) {
  return {{(static_cast<void>(I), histogram(router_buckets()))...}};
}

}  // namespace

void ray_series::observe(std::string_view method, unsigned status, route r, std::chrono::nanoseconds took) noexcept {
  const std::uint32_t key = static_cast<std::uint32_t>(r) << 16 | std::min(status, 0xffffu);
  const std::size_t n = used_.load(std::memory_order_relaxed);  // this thread is the only writer
  for (std::size_t i = 0; i < n; ++i)
    if (keys_[i] == key && methods_[i] == method) {
      hists_[i]->observe(took);
      return;
    }
  if (n == capacity) return;
  try {
    hists_[n] = std::make_unique<histogram>(ray_latency_buckets());
    methods_[n] = method;
  } catch (const std::bad_alloc&) {
    return;
  }
  keys_[n] = key;
  hists_[n]->observe(took);
  used_.store(n + 1, std::memory_order_release);
}

app_metrics::app_metrics(std::string app_name)
    : name(std::move(app_name)),
      duration(request_buckets()),
      first_byte(request_buckets()),
      router_latency(router_histograms(std::make_index_sequence<router_outcome_count>{})),
      grpc_duration(request_buckets()),
      tunnel_duration(request_buckets()),
      llm_ttft(request_buckets()),
      llm_inter_event(router_buckets()) {}

router_slot* app_metrics::router(std::size_t pool_index, std::string_view key) noexcept {
  if (pool_index < routers_.size() && routers_[pool_index]->key == key) return routers_[pool_index].get();
  for (auto& r : routers_)
    if (r->key == key) return r.get();
  return nullptr;
}

worker_metrics::worker_metrics() { blocks_.push_back(std::make_unique<app_metrics>("")); }

std::vector<app_metrics*> worker_metrics::apply(const topology::snapshot& snap, std::vector<app_metrics*>* grpc) {
  std::lock_guard lk(mu_);
  std::unordered_map<std::string_view, app_metrics*> by_name;
  for (auto& b : blocks_) by_name.emplace(b->name, b.get());

  // Blocks first (new names get new blocks), then the router slots of every block.
  std::vector<app_metrics*> out;
  out.reserve(snap.apps.size());
  for (const auto& app : snap.apps) {
    auto it = by_name.find(app.name);
    if (it == by_name.end()) {
      blocks_.push_back(std::make_unique<app_metrics>(app.name));
      it = by_name.emplace(blocks_.back()->name, blocks_.back().get()).first;
    }
    it->second->route_prefix = app.route_prefix;
    out.push_back(it->second);
  }
  if (grpc) {
    grpc->clear();
    for (const auto& app : snap.grpc_apps) {
      auto it = by_name.find(app.name);
      if (it == by_name.end()) {
        blocks_.push_back(std::make_unique<app_metrics>(app.name));
        it = by_name.emplace(blocks_.back()->name, blocks_.back().get()).first;
      }
      grpc->push_back(it->second);
    }
  }

  // Each block's routers become its app's pool (the union of pools for apps sharing a name);
  // slots of routers that stay keep their counts.
  std::unordered_map<app_metrics*, std::vector<std::unique_ptr<router_slot>>> next;
  for (std::size_t i = 0; i < snap.apps.size(); ++i) {
    app_metrics* b = out[i];
    auto& slots = next[b];
    for (const auto& ep : snap.apps[i].router_pool) {
      const std::string& label = ep.name.empty() ? ep.key : ep.name;
      bool dup = false;
      for (const auto& s : slots) dup = dup || (s->key == ep.key && s->label == label);
      if (dup) continue;
      std::unique_ptr<router_slot> slot;
      for (auto& old : b->routers_)
        if (old && old->key == ep.key && old->label == label) slot = std::move(old);
      if (!slot) slot = std::make_unique<router_slot>(ep.key, label, ep.colocated);
      slots.push_back(std::move(slot));
    }
  }
  for (auto& b : blocks_) {
    auto it = next.find(b.get());
    if (it == next.end()) b->routers_.clear();
    else b->routers_ = std::move(it->second);
  }
  return out;
}

}  // namespace ingressd::metrics
