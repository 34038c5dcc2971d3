#pragma once
// What tests read back from a running ingressd besides the responses themselves: its /metrics
// (parsed into samples) and /topology on the admin listener, and its access log lines. Every wait
// here is a bounded poll of a condition, never a sleep standing in for an event.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/http_client.hpp"

namespace ingressd::testing {

/// Polls `pred` every 10 ms until it holds or `timeout` passes; returns its last value.
template <class Pred>
bool eventually(Pred pred, clock::duration timeout) {
  const auto deadline = clock::now() + timeout;
  while (!pred()) {
    if (clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// Parsed /metrics: sample line (name + labels, as written) -> value.
struct metrics_scrape {
  std::string text;
  std::map<std::string, double> samples;

  /// The sample's value, or -1 when the series is absent.
  double at(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
  bool has(const std::string& series) const { return samples.contains(series); }
  /// Sum of every sample whose series starts with `prefix`.
  double sum(const std::string& prefix) const {
    double s = 0;
    for (const auto& [k, v] : samples)
      if (k.rfind(prefix, 0) == 0) s += v;
    return s;
  }
};

/// GET /metrics from the admin listener on 127.0.0.1:`admin_port`.
inline metrics_scrape scrape_metrics(std::uint16_t admin_port) {
  auto r = http_get("127.0.0.1", admin_port, "/metrics", {}, std::chrono::seconds(5));
  metrics_scrape s;
  EXPECT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.header("content-type").value_or(""), "text/plain; version=0.0.4");
  s.text = r.body;
  std::istringstream in(r.body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    const auto v = line.substr(sp + 1);
    s.samples[line.substr(0, sp)] = v == "+Inf" ? 1e300 : std::stod(v);
  }
  return s;
}

/// Scrapes until `ready` holds (requests are counted as they end, just after the client has its
/// response), or `within` passes; returns the last scrape.
inline metrics_scrape scrape_until(std::uint16_t admin_port, const std::function<bool(const metrics_scrape&)>& ready,
                                   clock::duration within = std::chrono::seconds(5)) {
  const auto deadline = clock::now() + within;
  for (;;) {
    auto s = scrape_metrics(admin_port);
    if (ready(s) || clock::now() >= deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// Requests counted in ingressd_requests_total with status `code`, over all apps ("499": the
/// client left first).
inline double requests_with_code(const metrics_scrape& s, const std::string& code) {
  double n = 0;
  for (const auto& [series, value] : s.samples)
    if (series.rfind("ingressd_requests_total{", 0) == 0 && series.find("code=\"" + code + "\"") != std::string::npos)
      n += value;
  return n;
}

/// Waits (bounded) until ingressd has counted `n` requests the client left (499): the event
/// that the daemon itself ended them.
inline double wait_client_left(std::uint16_t admin_port, double n, clock::duration within = std::chrono::seconds(10)) {
  return requests_with_code(
      scrape_until(admin_port, [&](const metrics_scrape& s) { return requests_with_code(s, "499") >= n; }, within),
      "499");
}

/// GET /topology from the admin listener (a discarded JSON value when it cannot be read).
inline nlohmann::json admin_topology(std::uint16_t admin_port) {
  auto r = http_get("127.0.0.1", admin_port, "/topology", {}, std::chrono::seconds(5));
  return nlohmann::json::parse(r.body, nullptr, false);
}

/// The /topology entry of app `app`'s replica or fallback named `name` (null when absent).
inline nlohmann::json topology_upstream(const nlohmann::json& topo, const std::string& app, const std::string& name) {
  if (!topo.is_object() || !topo.contains("apps")) return nullptr;
  for (const auto& a : topo["apps"]) {
    if (a.value("name", "") != app) continue;
    for (const auto& r : a["replicas"])
      if (r.value("name", "") == name) return r;
    if (a.contains("fallback") && a["fallback"].value("name", "") == name) return a["fallback"];
  }
  return nullptr;
}

/// The access log's lines, each parsed as JSON.
inline std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
    out.push_back(std::move(j));
  }
  return out;
}

/// Waits (bounded) for the access log's writer to have flushed `n` lines.
inline std::vector<nlohmann::json> wait_json_lines(const std::string& path, std::size_t n,
                                                   clock::duration within = std::chrono::seconds(5)) {
  std::vector<nlohmann::json> lines;
  eventually([&] { return (lines = read_json_lines(path)).size() >= n; }, within);
  return lines;
}

}  // namespace ingressd::testing
