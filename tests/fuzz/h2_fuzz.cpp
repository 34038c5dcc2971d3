// libFuzzer target: bytes from a client of the gRPC listener (issue #20 item 6) through the real
// entry point — a worker's gRPC hub (src/proxy/grpc/grpc_proxy.cpp) on one end of a socket pair,
// nghttp2's server session and every callback of ours (frame budget, header limits, call start,
// dispatch to a replica that refuses on loopback, error answers, GOAWAY, lingering close).
//
// Invariants: no crash or sanitizer report; the connection ends once the input is over (the hub
// holds no client connection and no call after the worker's hard stop); what the daemon writes
// back starts with a SETTINGS frame (its connection preface), whatever the input was.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "ingressd/topology/snapshot.hpp"
#include "proxy/grpc/grpc_proxy.hpp"
#include "worker/worker.hpp"

namespace {

using namespace ingressd;

struct fixture {
  server::shared_state shared;
  std::unique_ptr<server::worker> w;
  std::unique_ptr<server::grpc_hub> hub;
  fixture() {
    auto cfg = std::make_shared<config::config>();
    cfg->grpc.listen = {"127.0.0.1", 0};
    cfg->client.header_timeout = std::chrono::seconds(3600);  // no timer fires during one input
    cfg->upstream.retries = 1;
    w = std::make_unique<server::worker>(0, cfg, shared);
    // Two gRPC apps (so that the `application` metadata matters); their replica is a loopback
    // port nothing listens on: a dispatch ends in a refused connect and an UNAVAILABLE answer.
    topology::document doc;
    for (const char* name : {"a", "b"}) {
      topology::app app;
      app.name = name;
      app.replicas.push_back({"127.0.0.1", 1, "n", std::string("SERVE_REPLICA::") + name});
      doc.grpc_apps.push_back(app);
    }
    w->apply(topology::make_snapshot(std::move(doc), "127.0.0.1", "", 1));
    hub = std::make_unique<server::grpc_hub>(*w);
  }
};

/// Runs what is ready (no waiting) and drains what the daemon wrote to `peer`.
void settle(server::worker& w, int peer, std::string& out) {
  char buf[65536];
  for (int round = 0; round < 10000; ++round) {
    const auto n = w.ioc().poll();
    bool read_any = false;
    for (;;) {
      const auto r = ::read(peer, buf, sizeof buf);
      if (r <= 0) break;
      read_any = true;
      if (out.size() < 64) out.append(buf, static_cast<std::size_t>(r));
    }
    if (n == 0 && !read_any) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fixture f;
  if (size > 256 * 1024) return -1;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) std::abort();
  auto& w = *f.w;
  w.ioc().restart();
  asio::basic_stream_socket<tcp, executor> sock(w.ioc());
  error_code ec;
  sock.assign(tcp::v4(), sv[0], ec);  // a stream socket is a stream socket: reads and writes work
  if (ec) std::abort();
  f.shared.connections.fetch_add(1);
  f.hub->accept(std::move(sock));

  // The preface most inputs need, unless the input brings its own (or is about a bad one).
  static const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  std::string in;
  if (size > 0 && (data[0] & 1)) in = preface;
  in.append(reinterpret_cast<const char*>(data), size);
  std::string out;
  std::size_t off = 0;
  while (off < in.size()) {
    const auto r = ::write(sv[1], in.data() + off, in.size() - off);
    if (r > 0) off += static_cast<std::size_t>(r);
    settle(w, sv[1], out);
    if (r <= 0 && ::write(sv[1], in.data() + off, 0) != 0) break;  // the daemon is gone
    if (r <= 0) {
      // Everything ready has run and the daemon still does not take more: it stopped reading.
      const auto again = ::write(sv[1], in.data() + off, in.size() - off);
      if (again <= 0) break;
      off += static_cast<std::size_t>(again);
    }
  }
  ::shutdown(sv[1], SHUT_WR);
  settle(w, sv[1], out);
  // The daemon's first frame is its SETTINGS (type 4 on stream 0).
  if (out.size() >= 9 && !(out[3] == 4 && out[5] == 0 && out[6] == 0 && out[7] == 0 && out[8] == 0)) std::abort();
  // Whatever is left (a connection waiting for writability, an upstream connect) ends here.
  f.hub->abort_all();
  settle(w, sv[1], out);
  ::close(sv[1]);
  w.ioc().restart();
  w.ioc().poll();
  return 0;
}
