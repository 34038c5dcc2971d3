#pragma once
// A stand-in for the Ray dashboard (`GET /api/serve/applications/`) or any topology URL: serves
// a JSON body that the test changes at run time, and fails or hangs on demand.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "ingressd/demo/server_base.hpp"

namespace ingressd::testing {

class fake_dashboard final : public demo::server_base {
 public:
  struct options {
    std::string body = R"({"applications":{}})";
    std::string path = "/api/serve/applications/";  ///< the one path served; others get 404
    std::string bind_ip = "127.0.0.1";
    std::uint16_t port = 0;
  };

  fake_dashboard();
  explicit fake_dashboard(options opts);
  ~fake_dashboard() override;

  /// "http://<ip>:<port>" — the value for --ray-dashboard.
  std::string url() const;
  /// url() + the served path — the value for --topology-url.
  std::string document_url() const;

  void set_body(std::string body);
  /// Any status other than 200 is answered with body `{"error":"fake dashboard failure"}`.
  void set_status(unsigned status);
  /// While true, requests are read and never answered (for topology.timeout tests).
  void set_hang(bool hang);
  /// How many times the document was served with 200.
  std::size_t served_count() const;

 protected:
  awaitable<demo::after_reply> handle(demo::exchange& ex) override;

 private:
  options opts_;
  mutable std::mutex script_mu_;
  std::string body_;
  unsigned status_ = 200;
  bool hang_ = false;
  std::size_t served_ = 0;
};

}  // namespace ingressd::testing
