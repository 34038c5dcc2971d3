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

/// The process's exit code when a step ends it before the daemon serves (contract §1: 0 clean
/// exit, 1 runtime failure, 2 usage or configuration error); nullopt: go on.
using early_exit = std::optional<int>;

/// What is decided before the daemon exists. Declared before the daemon in run() so that the
/// demo cluster and the certificate outlive it.
struct startup {
  std::shared_ptr<const config::config> cfg;
  topology::document doc;  ///< the first topology (file or demo; the other sources fetch it)
  std::string source;      ///< where the topology comes from, for the log lines
  std::unique_ptr<demo::cluster> demo_cluster;
  node_ip_choice node;     ///< empty ip: not chosen yet
  std::shared_ptr<const tls::server_context> tls;
};

int answer_help_or_version(const config::command_line& cl) {
  if (cl.help)
    std::fputs(config::usage().c_str(), stdout);
  else
    std::printf("ingressd %s\n", INGRESSD_VERSION);
  return 0;
}

/// The demo cluster lives in this process, on loopback: this node is 127.0.0.1 and the remote
/// router stands on 127.0.0.3 ("another node").
early_exit start_demo(startup& s) {
  auto c = *s.cfg;
  if (c.node_ip.empty()) {
    c.node_ip = "127.0.0.1";
    s.node = node_ip_choice{c.node_ip, "the demo cluster's node"};
  }
  // No load balancer stands in front of the demo: Ctrl-C need not wait for one to notice.
  if (c.drain == config::drain_settings{}) c.drain.min_period = ingressd::duration{0};
  s.cfg = std::make_shared<const config::config>(std::move(c));
  try {
    demo::cluster::options o;
    o.local_ip = s.cfg->node_ip;
    s.demo_cluster = std::make_unique<demo::cluster>(o);
  } catch (const std::exception& e) {
    spdlog::error("cannot start the demo cluster: {}", e.what());
    return 1;
  }
  s.doc = s.demo_cluster->document();
  s.source = "demo cluster";
  return std::nullopt;
}

/// A bad topology file at start is a configuration error (contract §3.2).
early_exit read_topology_file(startup& s) {
  const auto& path = s.cfg->topology.file;
  s.source = "file " + path;
  std::string why;
  auto text = read_file(path, why);
  if (!text) {
    std::fprintf(stderr, "ingressd: --topology-file: cannot read '%s': %s\n", path.c_str(), why.c_str());
    return 2;
  }
  auto res = topology::parse_document(*text);
  if (auto* err = std::get_if<topology::parse_error>(&res)) {
    std::fprintf(stderr, "ingressd: %s: %s\n", path.c_str(), err->message.c_str());
    return 2;
  }
  s.doc = std::get<topology::document>(std::move(res));
  return std::nullopt;
}

/// The first topology where it is at hand (demo, file); the polled sources deliver theirs later.
early_exit load_topology(bool demo, startup& s) {
  const auto& t = s.cfg->topology;
  if (demo) return start_demo(s);
  if (!t.file.empty()) return read_topology_file(s);
  if (!t.ray_dashboard.empty())
    s.source = "ray dashboard " + t.ray_dashboard;
  else if (!t.url.empty())
    s.source = "url " + t.url;
  return std::nullopt;
}

/// An unreadable, mismatched or expired certificate at start is a configuration error.
early_exit load_certificate(startup& s) {
  if (!s.cfg->tls.enabled()) return std::nullopt;
  auto loaded = tls::server_context::load(s.cfg->tls, std::chrono::system_clock::now(), s.cfg->grpc.enabled());
  if (auto* err = std::get_if<std::string>(&loaded)) {
    std::fprintf(stderr, "ingressd: %s\n", err->c_str());
    return 2;
  }
  s.tls = std::get<std::shared_ptr<const tls::server_context>>(std::move(loaded));
  return std::nullopt;
}

early_exit prepare(const config::command_line& cl, startup& s) {
  s.cfg = std::make_shared<const config::config>(cl.cfg);
  if (auto code = load_topology(cl.demo, s)) return code;
  if (s.node.ip.empty()) s.node = resolve_node_ip(*s.cfg);
  return load_certificate(s);
}

int print_config_check(const startup& s) {
  const auto& cfg = *s.cfg;
  const std::string tls_line =
      s.tls ? ", https " + cfg.tls.listen.to_string() + " (" + s.tls->describe() + ")" : std::string();
  std::printf("configuration OK: listen %s, admin %s%s, threads %u, node ip %s (%s), topology %s\n",
              cfg.listen.to_string().c_str(), cfg.admin_listen.to_string().c_str(), tls_line.c_str(),
              cfg.effective_threads(), s.node.ip.c_str(), s.node.how.c_str(), s.source.c_str());
  return 0;
}

/// Publishes each new topology document: logs what changed, points the health checker at the new
/// targets and hands the snapshot to the daemon. Runs on the main thread only.
class topology_publisher {
 public:
  topology_publisher(daemon& d, health::checker& checker, const startup& s) : d_(d), checker_(checker), s_(s) {}

  void operator()(topology::document next) {
    warn_about(next);
    const bool serve_running = next.serve_running;
    const auto before = d_.current_topology();
    auto snap = topology::make_snapshot(std::move(next), s_.node.ip, s_.cfg->topology.local_dial_host, ++generation_,
                                        s_.source, before.get(), s_.cfg->ray_node_id);
    log_change(before.get(), *snap, serve_running);
    checker_.set_targets(health_targets(*snap));
    d_.set_topology(std::move(snap));
  }

 private:
  void warn_about(const topology::document& next) const {
    for (const auto& w : next.warnings) spdlog::warn("topology: {}", w);
    if (!s_.cfg->grpc.enabled())
      for (const auto& g : next.grpc_apps)
        spdlog::warn("topology: ignored gRPC target group '{}' (no gRPC listener: grpc.listen / --grpc-listen)",
                     g.name);
  }

  static void log_change(const topology::snapshot* before, const topology::snapshot& snap, bool serve_running) {
    const bool was_draining = before && before->ray_node_draining();
    if (snap.ray_node_draining() && !was_draining)
      spdlog::warn("topology: Ray is draining this node (its Serve proxy {} is DRAINING): /-/healthz fails, requests "
                   "are still served",
                   snap.ray_node_id);
    else if (!snap.ray_node_draining() && was_draining)
      spdlog::info("topology: Ray no longer drains this node ({}): /-/healthz passes again", snap.ray_node_status);
    if (!serve_running)
      spdlog::info("topology: Serve is not running (no applications) (generation {})", snap.generation);
    else
      spdlog::info("topology: {} apps, {} routers, {} replicas{} (generation {})", snap.apps.size(),
                   snap.router_count(), snap.replica_count(),
                   snap.grpc_apps.empty() ? std::string() : fmt::format(", {} gRPC apps", snap.grpc_apps.size()),
                   snap.generation);
  }

  /// Replicas and fallback targets, each once (Ray's HAProxy checks its backup server too);
  /// routers are not checked (Ray's HAProxy does not either): the failover memory covers them.
  std::vector<health::target_ref> health_targets(const topology::snapshot& snap) const {
    std::vector<health::target_ref> targets;
    std::unordered_set<std::string> seen;
    auto check = [&](const topology::endpoint& e, bool grpc) {
      if (seen.insert(e.key).second) targets.push_back({e.key, e.dial, grpc});
    };
    auto check_group = [&](const std::vector<topology::app_view>& apps,
                           const std::optional<topology::endpoint>& fallback, bool grpc) {
      for (const auto& a : apps) {
        for (const auto& r : a.replicas) check(r, grpc);
        if (a.fallback) check(*a.fallback, grpc);
      }
      if (fallback) check(*fallback, grpc);
    };
    check_group(snap.apps, snap.fallback, false);
    // gRPC targets get the gRPC health RPC (grpc.health_path), Ray's Healthz.
    if (s_.cfg->grpc.enabled()) check_group(snap.grpc_apps, snap.grpc_fallback, true);
    return targets;
  }

  daemon& d_;
  health::checker& checker_;
  const startup& s_;
  std::uint64_t generation_ = 0;
};

/// SIGHUP: the command line is parsed again, so the file is re-read and the flags still override
/// it; the result is validated whole before anything changes (hardening I2). `running` is the
/// config of the start, which the settings that need a restart are compared with.
void reload(int argc, const char* const* argv, bool demo, const config::config& running, daemon& d) {
  // Without a config file there is nothing to re-read but the certificate (flags name it).
  if ((demo || running.config_file.empty()) && !running.tls.enabled()) {
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
  checks.error_limit = running.health.error_limit;  // passive health is read per request: it applies
  if (next->topology != running.topology || checks != running.health || next->access_log != running.access_log ||
      next->node_ip != running.node_ip)
    spdlog::warn("SIGHUP: topology, health, node_ip and access_log settings take effect on restart");
  if (!next->config_file.empty()) spdlog::info("SIGHUP: configuration reloaded from {}", next->config_file);
}

/// SIGINT and SIGTERM drain (a second SIGINT exits at once), SIGHUP reloads, SIGUSR1 reopens the
/// access log (logrotate). Constructed before the listeners open: a signal that comes as soon as
/// the port answers is queued until the main loop runs, instead of taking its default action and
/// killing the process.
class signal_handler {
 public:
  signal_handler(asio::io_context& ioc, daemon& d, std::function<void()> on_reload)
      : signals_(ioc, SIGINT, SIGTERM, SIGHUP), d_(d), on_reload_(std::move(on_reload)) {
    signals_.add(SIGUSR1);
    wait();
  }
  signal_handler(const signal_handler&) = delete;  // the pending wait holds `this`
  signal_handler& operator=(const signal_handler&) = delete;

  void cancel() { signals_.cancel(); }

 private:
  void wait() {
    signals_.async_wait([this](error_code ec, int sig) {
      if (ec) return;
      handle(sig);
      wait();
    });
  }

  void handle(int sig) {
    if (sig == SIGHUP) {
      on_reload_();
    } else if (sig == SIGUSR1) {
      if (d_.reopen_access_log()) spdlog::info("SIGUSR1: access log reopened");
    } else if (sig == SIGINT && d_.draining()) {
      // A second Ctrl-C: the operator does not want to wait for the drain.
      spdlog::warn("SIGINT during the drain: exiting now, cutting what is still open");
      d_.stop();
    } else {
      spdlog::info("{}: draining (SIGINT again exits at once)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      d_.begin_drain();
    }
  }

  asio::signal_set signals_;
  daemon& d_;
  std::function<void()> on_reload_;
};

/// Opens the listeners and starts the workers; a port that cannot be bound is a runtime failure.
early_exit start_serving(daemon& d, const startup& s) {
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
  const auto& cfg = *s.cfg;
  spdlog::info("ingressd {} listening on {} (admin {}){}{}, {} threads, node ip {} ({}), topology {}",
               INGRESSD_VERSION, bound(cfg.listen, d.port()), bound(cfg.admin_listen, d.admin_port()),
               s.tls ? ", https " + bound(cfg.tls.listen, d.tls_port()) : std::string(),
               cfg.grpc.enabled() ? ", grpc " + bound(cfg.grpc.listen, d.grpc_port()) : std::string(),
               cfg.effective_threads(), s.node.ip, s.node.how, s.source);
  return std::nullopt;
}

/// The source that keeps the topology current (none for the demo). The file source starts from
/// the document already published, so that it reports changes only.
std::unique_ptr<topology::source> start_topology_source(asio::io_context& ioc, const startup& s,
                                                        topology_publisher& publish, daemon& d) {
  topology::source_callbacks callbacks{
      [&publish](topology::document next) { publish(std::move(next)); },
      [&d](std::string error) {
        spdlog::error("topology rejected, keeping the last good one: {}", error);
        d.count_topology_error();
      },
      [&d] { d.note_topology_current(); }};
  const auto& t = s.cfg->topology;
  std::unique_ptr<topology::source> source;
  if (!t.file.empty())
    source = topology::make_file_source(ioc, t.file, callbacks, s.doc);
  else if (!t.ray_dashboard.empty())
    source = topology::make_dashboard_source(ioc, t.ray_dashboard, t.poll_interval, t.timeout, callbacks);
  else if (!t.url.empty())
    source = topology::make_http_source(ioc, t.url, t.poll_interval, t.timeout, callbacks);
  if (source) source->start();
  return source;
}

void print_demo_banner(const config::config& cfg, const daemon& d) {
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
      cfg.node_ip.c_str(), base.c_str(), base.c_str(), base.c_str(), base.c_str(), base.c_str(), base.c_str(),
      admin.c_str(), admin.c_str());
  std::fflush(stdout);
}

/// Runs the main thread's loop (signals, topology source, health checks) until the daemon has
/// stopped; then stops what runs on that loop so that it returns.
void run_until_stopped(asio::io_context& ioc, daemon& d, signal_handler& signals, topology::source* source,
                       health::checker& checker) {
  std::thread waiter([&] {
    d.wait();
    asio::post(ioc, [&] {
      signals.cancel();
      if (source) source->stop();
      checker.stop();
    });
  });
  ioc.run();
  waiter.join();
}

}  // namespace

int run(int argc, const char* const* argv) {
  auto parsed = config::parse_command_line(argc, argv);
  if (auto* err = std::get_if<config::config_error>(&parsed)) {
    std::fprintf(stderr, "ingressd: %s\n", err->message.c_str());
    return 2;
  }
  const auto& cl = std::get<config::command_line>(parsed);
  if (cl.help || cl.version) return answer_help_or_version(cl);
  spdlog::set_default_logger(spdlog::stderr_color_mt("ingressd"));
  spdlog::set_level(to_spdlog(cl.cfg.level));

  startup s;
  if (auto code = prepare(cl, s)) return *code;
  if (cl.check_config) return print_config_check(s);

  daemon d(s.cfg);
  if (s.tls) d.set_tls(s.tls);
  asio::io_context main_ioc(1);
  // Replica health checks, once per daemon (contract health.*).
  health::checker checker(main_ioc, s.cfg->health, [&d](const std::string& key, bool up, const std::string& cause) {
    d.set_replica_health(key, up, cause);
  }, s.cfg->grpc.health_path);
  // Passive health (health.error_limit): the workers have stopped routing to the upstream; the
  // checker counts it down and checks it now, and its checks bring it back.
  d.on_passive_down([&checker](const std::string& key) { checker.mark_down(key); });
  topology_publisher publish(d, checker, s);
  if (!s.cfg->topology.file.empty() || cl.demo) publish(s.doc);
  signal_handler signals(main_ioc, d, [&] { reload(argc, argv, cl.demo, *s.cfg, d); });

  // Every mode but the demo has exactly one topology source (config validation): from the first
  // scrape on, /metrics says when it last confirmed the topology (0 until its first check).
  if (!cl.demo) d.expect_topology_source();
  if (auto code = start_serving(d, s)) return *code;
  auto topo_source = start_topology_source(main_ioc, s, publish, d);
  if (cl.demo) print_demo_banner(*s.cfg, d);

  run_until_stopped(main_ioc, d, signals, topo_source.get(), checker);
  topo_source.reset();
  spdlog::info("ingressd exiting");
  return 0;
}

}  // namespace ingressd::server
