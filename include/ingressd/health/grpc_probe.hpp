#pragma once
// The health check of a gRPC target (grpc.health_path): one unary call over h2c on a fresh
// connection, the way Ray's HAProxy template checks its gRPC servers (haproxy.py
// build_grpc_healthcheck_request_hex: preface, SETTINGS, HEADERS, a DATA frame with an empty
// message; the reply must say "success"). Passes on grpc-status 0 with "success" in the reply.
#include <string>
#include <string_view>

#include <boost/beast/core/tcp_stream.hpp>

#include "ingressd/core/asio.hpp"
#include "ingressd/core/units.hpp"

namespace ingressd::health {

/// Connects `stream` (its deadline already set by the caller) to `dial` and calls `path`.
/// Returns "" when the check passed, else why it failed.
awaitable<std::string> grpc_probe(boost::beast::tcp_stream& stream, const tcp::endpoint& dial, std::string_view path);

}  // namespace ingressd::health
