#include "ingressd/app/runner.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unordered_set>

#include <boost/asio/signal_set.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ingressd/config/config.hpp"
#include "ingressd/core/asio.hpp"
#include "ingressd/demo/cluster.hpp"
#include "ingressd/health/checker.hpp"
#include "ingressd/topology/source.hpp"
#include "ingressd/app/daemon.hpp"
#include "ingressd/topology/snapshot.hpp"
#include "ingressd/topology/topology.hpp"
#include "ingressd/tls/context.hpp"

namespace ingressd::server {

namespace {

struct node_ip_choice {
  std::string ip;
  std::string how;
};

/// Contract §3.3: flag/config, then RAY_NODE_IP_ADDRESS, then the source address the kernel picks
/// to reach the topology source's host (127.0.0.1 for a file source).
node_ip_choice resolve_node_ip(const config::config& cfg) {
  if (!cfg.node_ip.empty()) return {cfg.node_ip, "--node-ip/node_ip"};
  if (const char* env = std::getenv("RAY_NODE_IP_ADDRESS"); env && *env) return {env, "RAY_NODE_IP_ADDRESS"};
  std::string url = !cfg.topology.ray_dashboard.empty() ? cfg.topology.ray_dashboard : cfg.topology.url;
  if (!url.empty()) {
    if (auto u = topology::parse_http_url(url)) {
      if (auto ip = topology::local_address_towards(u->host, u->port)) {
        if (ip->starts_with("127.") || *ip == "::1")
          spdlog::warn("node ip {} is a loopback address: no target will count as co-located unless the "
                       "topology lists loopback ips; set --node-ip or RAY_NODE_IP_ADDRESS", *ip);
        return {*ip, "source address towards " + u->host};
      }
    }
    return {"127.0.0.1", "default: the topology source's host could not be resolved"};
  }
  return {"127.0.0.1", "default for a file source"};
}

/// The file's text, or nullopt with `why` set to the system's reason ("No such file or
/// directory", "Permission denied", "Is a directory").
std::optional<std::string> read_file(const std::string& path, std::string& why) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = std::strerror(errno != 0 ? errno : ENOENT);
    return std::nullopt;
  }
  std::ostringstream ss;
  errno = 0;
  if (in.peek() == std::ifstream::traits_type::eof() && errno != 0) {  // e.g. EISDIR
    why = std::strerror(errno);
    return std::nullopt;
  }
  ss << in.rdbuf();
  return ss.str();
}

spdlog::level::level_enum to_spdlog(config::log_level l) {
  switch (l) {
    case config::log_level::trace: return spdlog::level::trace;
    case config::log_level::debug: return spdlog::level::debug;
    case config::log_level::info: return spdlog::level::info;
    case config::log_level::warn: return spdlog::level::warn;
    case config::log_level::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

int run(int argc, const char* const* argv) {
  auto parsed = config::parse_command_line(argc, argv);
  if (auto* err = std::get_if<config::config_error>(&parsed)) {
    std::fprintf(stderr, "ingressd: %s\n", err->message.c_str());
    return 2;
  }
  auto& cl = std::get<config::command_line>(parsed);
  if (cl.help) {
    std::fputs(config::usage().c_str(), stdout);
    return 0;
  }
  if (cl.version) {
    std::printf("ingressd %s\n", INGRESSD_VERSION);
    return 0;
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("ingressd"));
  spdlog::set_level(to_spdlog(cl.cfg.level));
  auto cfg = std::make_shared<const config::config>(cl.cfg);

  // Topology at start: a bad file is a configuration error (contract §3.2).
  topology::document doc;
  std::string source;
  std::unique_ptr<demo::cluster> demo_cluster;
  std::optional<node_ip_choice> demo_node;
  if (cl.demo) {
    // The demo cluster lives in this process, on loopback: this node is 127.0.0.1 and the
    // remote router stands on 127.0.0.3 ("another node").
    {
      auto c = *cfg;
      if (c.node_ip.empty()) {
        c.node_ip = "127.0.0.1";
        demo_node = node_ip_choice{c.node_ip, "the demo cluster's node"};
      }
      // No load balancer stands in front of the demo: Ctrl-C need not wait for one to notice.
      if (c.drain == config::drain_settings{}) c.drain.min_period = ingressd::duration{0};
      cfg = std::make_shared<const config::config>(std::move(c));
    }
    try {
      demo::cluster::options o;
      o.local_ip = cfg->node_ip;
      demo_cluster = std::make_unique<demo::cluster>(o);
    } catch (const std::exception& e) {
      spdlog::error("cannot start the demo cluster: {}", e.what());
      return 1;
    }
    doc = demo_cluster->document();
    source = "demo cluster";
  } else if (!cfg->topology.file.empty()) {
    source = "file " + cfg->topology.file;
    std::string why;
    auto text = read_file(cfg->topology.file, why);
    if (!text) {
      std::fprintf(stderr, "ingressd: --topology-file: cannot read '%s': %s\n", cfg->topology.file.c_str(),
                   why.c_str());
      return 2;
    }
    auto res = topology::parse_document(*text);
    if (auto* err = std::get_if<topology::parse_error>(&res)) {
      std::fprintf(stderr, "ingressd: %s: %s\n", cfg->topology.file.c_str(), err->message.c_str());
      return 2;
    }
    doc = std::get<topology::document>(std::move(res));
  } else if (!cfg->topology.ray_dashboard.empty()) {
    source = "ray dashboard " + cfg->topology.ray_dashboard;
  } else if (!cfg->topology.url.empty()) {
    source = "url " + cfg->topology.url;
  }
  auto node = demo_node ? *demo_node : resolve_node_ip(*cfg);

  // The certificate at start: unreadable, mismatched or expired is a configuration error.
  std::shared_ptr<const tls::server_context> tls_ctx;
  std::string tls_line;
  if (cfg->tls.enabled()) {
    auto loaded = tls::server_context::load(cfg->tls, std::chrono::system_clock::now(), cfg->grpc.enabled());
    if (auto* err = std::get_if<std::string>(&loaded)) {
      std::fprintf(stderr, "ingressd: %s\n", err->c_str());
      return 2;
    }
    tls_ctx = std::get<std::shared_ptr<const tls::server_context>>(std::move(loaded));
    tls_line = ", https " + cfg->tls.listen.to_string() + " (" + tls_ctx->describe() + ")";
  }

  if (cl.check_config) {
    std::printf("configuration OK: listen %s, admin %s%s, threads %u, node ip %s (%s), topology %s\n",
                cfg->listen.to_string().c_str(), cfg->admin_listen.to_string().c_str(), tls_line.c_str(),
                cfg->effective_threads(), node.ip.c_str(), node.how.c_str(), source.c_str());
    return 0;
  }

  daemon d(cfg);
  if (tls_ctx) d.set_tls(tls_ctx);

  asio::io_context main_ioc(1);

  // Replica health checks, once per daemon (contract health.*): routers are not checked (Ray's
  // HAProxy does not either); the failover memory covers them.
  health::checker checker(main_ioc, cfg->health, [&d](const std::string& key, bool up, const std::string& cause) {
    d.set_replica_health(key, up, cause);
  }, cfg->grpc.health_path);
  // Passive health (health.error_limit): the workers have stopped routing to the upstream; the
  // checker counts it down and checks it now, and its checks bring it back.
  d.on_passive_down([&checker](const std::string& key) { checker.mark_down(key); });

  std::uint64_t generation = 0;
  auto publish = [&](topology::document next) {
    for (const auto& w : next.warnings) spdlog::warn("topology: {}", w);
    if (!cfg->grpc.enabled())
      for (const auto& g : next.grpc_apps)
        spdlog::warn("topology: ignored gRPC target group '{}' (no gRPC listener: grpc.listen / --grpc-listen)", g.name);
    const bool serve_running = next.serve_running;
    const auto before = d.current_topology();
    auto snap = topology::make_snapshot(std::move(next), node.ip, cfg->topology.local_dial_host, ++generation,
                                        source, before.get(), cfg->ray_node_id);
    if (snap->ray_node_draining() && !(before && before->ray_node_draining()))
      spdlog::warn("topology: Ray is draining this node (its Serve proxy {} is DRAINING): /-/healthz fails, requests "
                   "are still served",
                   snap->ray_node_id);
    else if (!snap->ray_node_draining() && before && before->ray_node_draining())
      spdlog::info("topology: Ray no longer drains this node ({}): /-/healthz passes again", snap->ray_node_status);
    if (!serve_running)
      spdlog::info("topology: Serve is not running (no applications) (generation {})", snap->generation);
    else
      spdlog::info("topology: {} apps, {} routers, {} replicas{} (generation {})", snap->apps.size(),
                   snap->router_count(), snap->replica_count(),
                   snap->grpc_apps.empty() ? std::string() : fmt::format(", {} gRPC apps", snap->grpc_apps.size()),
                   snap->generation);
    // Replicas and fallback targets are checked (Ray's HAProxy checks its backup server too).
    std::vector<health::target_ref> targets;
    auto check = [&targets, seen = std::unordered_set<std::string>()](const topology::endpoint& e,
                                                                        bool grpc = false) mutable {
      if (seen.insert(e.key).second) targets.push_back({e.key, e.dial, grpc});
    };
    for (const auto& a : snap->apps) {
      for (const auto& r : a.replicas) check(r);
      if (a.fallback) check(*a.fallback);
    }
    if (snap->fallback) check(*snap->fallback);
    // gRPC targets get the gRPC health RPC (grpc.health_path), Ray's Healthz.
    if (cfg->grpc.enabled()) {
      for (const auto& a : snap->grpc_apps) {
        for (const auto& r : a.replicas) check(r, true);
        if (a.fallback) check(*a.fallback, true);
      }
      if (snap->grpc_fallback) check(*snap->grpc_fallback, true);
    }
    checker.set_targets(std::move(targets));
    d.set_topology(std::move(snap));
  };
  if (!cfg->topology.file.empty() || cl.demo) publish(doc);

  // SIGHUP: the command line is parsed again, so the file is re-read and the flags still override
  // it; the result is validated whole before anything changes (hardening I2).
  auto reload = [&] {
    // Without a config file there is nothing to re-read but the certificate (flags name it).
    if ((cl.demo || cfg->config_file.empty()) && !cfg->tls.enabled()) {
      spdlog::warn("SIGHUP: no --config file to reload");
      return;
    }
    auto again = config::parse_command_line(argc, argv);
    if (auto* err = std::get_if<config::config_error>(&again)) {
      spdlog::error("SIGHUP: config rejected, the running config stays: {}", err->message);
      d.count_config_error();
      return;
    }
    auto next = std::make_shared<const config::config>(std::get<config::command_line>(again).cfg);
    if (auto why = d.reload(next)) {
      spdlog::error("SIGHUP: config rejected, the running config stays: {}", *why);
      d.count_config_error();
      return;
    }
    auto checks = next->health;
    checks.error_limit = cfg->health.error_limit;  // passive health is read per request: it applies
    if (next->topology != cfg->topology || checks != cfg->health || next->access_log != cfg->access_log ||
        next->node_ip != cfg->node_ip)
      spdlog::warn("SIGHUP: topology, health, node_ip and access_log settings take effect on restart");
    if (!next->config_file.empty()) spdlog::info("SIGHUP: configuration reloaded from {}", next->config_file);
  };

  // Installed before the listeners open: a signal that comes as soon as the port answers is
  // queued until main_ioc runs, instead of taking its default action and killing the process.
  asio::signal_set signals(main_ioc, SIGINT, SIGTERM, SIGHUP);
  signals.add(SIGUSR1);  // reopen the access log (logrotate)
  std::function<void()> wait_signal = [&] {
    signals.async_wait([&](error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGHUP) {
        reload();
      } else if (sig == SIGUSR1) {
        if (d.reopen_access_log()) spdlog::info("SIGUSR1: access log reopened");
      } else if (sig == SIGINT && d.draining()) {
        // A second Ctrl-C: the operator does not want to wait for the drain.
        spdlog::warn("SIGINT during the drain: exiting now, cutting what is still open");
        d.stop();
      } else {
        spdlog::info("{}: draining (SIGINT again exits at once)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        d.begin_drain();
      }
      wait_signal();
    });
  };
  wait_signal();

  // Every mode but the demo has exactly one topology source (config validation): from the first
  // scrape on, /metrics says when it last confirmed the topology (0 until its first check).
  if (!cl.demo) d.expect_topology_source();
  try {
    d.start();
  } catch (const std::exception& e) {
    spdlog::error("cannot start: {}", e.what());
    return 1;
  }
  // The ports as bound: with port 0 the kernel chose them (tests, scripts read them here).
  const auto bound = [](config::host_port hp, std::uint16_t port) {
    hp.port = port;
    return hp.to_string();
  };
  spdlog::info("ingressd {} listening on {} (admin {}){}{}, {} threads, node ip {} ({}), topology {}",
               INGRESSD_VERSION, bound(cfg->listen, d.port()), bound(cfg->admin_listen, d.admin_port()),
               tls_ctx ? ", https " + bound(cfg->tls.listen, d.tls_port()) : std::string(),
               cfg->grpc.enabled() ? ", grpc " + bound(cfg->grpc.listen, d.grpc_port()) : std::string(),
               cfg->effective_threads(), node.ip, node.how, source);

  topology::source_callbacks callbacks{
      [&](topology::document next) { publish(std::move(next)); },
      [&](std::string error) {
        spdlog::error("topology rejected, keeping the last good one: {}", error);
        d.count_topology_error();
      },
      [&] { d.note_topology_current(); }};
  std::unique_ptr<topology::source> topo_source;
  if (!cfg->topology.file.empty())
    topo_source = topology::make_file_source(main_ioc, cfg->topology.file, callbacks, doc);
  else if (!cfg->topology.ray_dashboard.empty())
    topo_source = topology::make_dashboard_source(main_ioc, cfg->topology.ray_dashboard,
                                                  cfg->topology.poll_interval, cfg->topology.timeout, callbacks);
  else if (!cfg->topology.url.empty())
    topo_source = topology::make_http_source(main_ioc, cfg->topology.url, cfg->topology.poll_interval,
                                             cfg->topology.timeout, callbacks);
  if (topo_source) topo_source->start();

  if (cl.demo) {
    auto base = fmt::format("http://127.0.0.1:{}", d.port());
    auto admin = fmt::format("http://127.0.0.1:{}", d.admin_port());
    std::printf(
        "\ningressd demo: 3 replicas streaming SSE, 2 routers on this node (%s), 1 on another (127.0.0.3)\n\n"
        "  # a streamed chat completion, routed by a co-located router:\n"
        "  curl -N %s/v1/chat/completions -H 'content-type: application/json' \\\n"
        "       -d '{\"model\":\"demo\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n"
        "  # the same with headers: x-served-by names the replica the router picked\n"
        "  curl -si %s/v1/chat/completions -d '{\"stream\":false}' | grep -i x-served-by\n"
        "  # a plain GET (no router call, least-loaded replica) and the echo app\n"
        "  curl -s %s/v1/models; echo; curl -s %s/echo/hello; echo\n"
        "  # health, routes, topology (router pool, co-located first) and metrics\n"
        "  curl -s %s/-/healthz; echo; curl -s %s/-/routes; echo\n"
        "  curl -s %s/topology; echo; curl -s %s/metrics\n\n"
        "Ctrl-C drains and exits.\n",
        cfg->node_ip.c_str(), base.c_str(), base.c_str(), base.c_str(), base.c_str(), base.c_str(), base.c_str(),
        admin.c_str(), admin.c_str());
    std::fflush(stdout);
  }

  std::thread waiter([&] {
    d.wait();
    asio::post(main_ioc, [&] {
      signals.cancel();
      if (topo_source) topo_source->stop();
      checker.stop();
    });
  });
  main_ioc.run();
  waiter.join();
  topo_source.reset();
  spdlog::info("ingressd exiting");
  return 0;
}

}  // namespace ingressd::server
