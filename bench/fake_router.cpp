// ingressd-bench-router: a fake ingress request router for bench/run.sh --hedge, which needs
// routers that are late on purpose (the nginx fakes of the other scenarios answer at once). It is
// the demo/test router (src/demo/router_server.cpp) with its delay knobs on the command line:
//
//   ingressd-bench-router --listen IP:PORT --replica NAME=HOST:PORT [--replica ...]
//                         [--delay-ms N [--delay-share F]]
//
// Replies LLMRouter's shape, the replicas in turn; with --delay-ms, that share of the replies
// (all by default) come N ms late. Runs until SIGTERM or SIGINT.
#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "ingressd/demo/router_server.hpp"

namespace {

bool split_host_port(const std::string& s, std::string& host, std::uint16_t& port) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  host = s.substr(0, colon);
  try {
    const int p = std::stoi(s.substr(colon + 1));
    if (p <= 0 || p > 65535) return false;
    port = static_cast<std::uint16_t>(p);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string listen;
  std::vector<std::string> replicas;
  int delay_ms = 0;
  double delay_share = 1.0;
  po::options_description opts("ingressd-bench-router");
  opts.add_options()("help,h", "this help")("listen", po::value(&listen)->required(), "IP:PORT to listen on")(
      "replica", po::value(&replicas)->required(), "NAME=HOST:PORT, repeatable: the replicas handed out in turn")(
      "delay-ms", po::value(&delay_ms), "replies come this late")(
      "delay-share", po::value(&delay_share), "share of replies that are late (0..1, default 1)");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << opts;
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "ingressd-bench-router: " << e.what() << "\n" << opts;
    return 2;
  }

  std::string ip;
  std::uint16_t port = 0;
  if (!split_host_port(listen, ip, port)) {
    std::cerr << "ingressd-bench-router: --listen IP:PORT, got " << listen << "\n";
    return 2;
  }
  std::vector<ingressd::topology::target> targets;
  for (const auto& r : replicas) {
    const auto eq = r.find('=');
    ingressd::topology::target t;
    if (eq == std::string::npos || !split_host_port(r.substr(eq + 1), t.ip, t.port)) {
      std::cerr << "ingressd-bench-router: --replica NAME=HOST:PORT, got " << r << "\n";
      return 2;
    }
    t.name = r.substr(0, eq);
    targets.push_back(std::move(t));
  }

  // Block the stop signals before the server's thread starts, so that only sigwait() takes them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  ingressd::demo::router_server router({.name = "bench-router", .bind_ip = ip, .port = port});
  router.set_record_limit(0);  // the bench sends millions of requests: keep none
  router.set_replicas(std::move(targets));
  auto b = ingressd::demo::router_behaviour::round_robin();
  if (delay_ms > 0) b.after(std::chrono::milliseconds(delay_ms)).sometimes(delay_share);
  router.set_behaviour(b);

  int sig = 0;
  sigwait(&stop, &sig);
  router.stop();
  return 0;
}
