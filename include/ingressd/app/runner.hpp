#pragma once
// The process: command line, logging, topology source, signals, the daemon. main() calls run().
namespace ingressd::server {

/// Runs ingressd with the given arguments and returns the process exit code (contract §1:
/// 0 clean exit, 1 runtime failure, 2 usage or configuration error).
int run(int argc, const char* const* argv);

}  // namespace ingressd::server
