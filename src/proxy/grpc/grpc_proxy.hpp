#pragma once
// The gRPC ingress of one worker (issue #20): client connections of the gRPC listener (HTTP/2
// cleartext, nghttp2 server sessions) and pooled, multiplexed HTTP/2 connections to the gRPC
// replicas (nghttp2 client sessions). A call is one client stream relayed to one upstream stream:
// frames are relayed as they arrive, each direction's bytes acknowledged to its sender (HTTP/2
// WINDOW_UPDATE) only once the other connection took them, so a slow reader slows the writer and
// a call holds at most a flow-control window of bytes per direction.
//
// Everything here belongs to the worker's thread: no locks. Topology comes from the worker's
// snapshot, metrics go to the worker's blocks, access log lines to the shared access log.
#include <cstdint>
#include <memory>
#include <string>

#include "ingressd/core/asio.hpp"
#include "ingressd/tls/stream.hpp"

namespace ingressd::server {

class worker;

class grpc_hub {
 public:
  explicit grpc_hub(worker& w);
  ~grpc_hub();
  grpc_hub(const grpc_hub&) = delete;
  grpc_hub& operator=(const grpc_hub&) = delete;

  using socket = asio::basic_stream_socket<tcp, executor>;
  /// A new connection on the gRPC listener (already counted in shared.connections), or a TLS
  /// connection of the HTTPS listener whose ALPN chose h2 (`tls`: its handshake is done; the
  /// connection is counted in tls_connections until it closes).
  /// `remote`: the client's address for logs ("" = the socket's peer; a PROXY header's source).
  void accept(socket sock, std::unique_ptr<tls::stream> tls = nullptr, std::string remote = {});
  /// Drain: every client connection gets GOAWAY (open streams finish; new ones are refused) and
  /// closes once its streams are done; idle upstream connections close.
  void drain();
  /// Hard stop: every connection closes now.
  void abort_all();
  /// After a topology change: upstream connections to targets no longer in it close once idle.
  void topology_changed();
  /// Once a second: idle upstream connections past their time close.
  void sweep();

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace ingressd::server
