#include "fakes/fake_dashboard.hpp"

namespace ingressd::testing {

fake_dashboard::fake_dashboard() : fake_dashboard(options{}) {}

fake_dashboard::fake_dashboard(options opts)
    : server_base(opts.bind_ip, opts.port, "fake dashboard"), opts_(std::move(opts)), body_(opts_.body) {
  start();
}

fake_dashboard::~fake_dashboard() { stop(); }

std::string fake_dashboard::url() const { return "http://" + bind_ip() + ":" + std::to_string(port()); }

std::string fake_dashboard::document_url() const { return url() + opts_.path; }

void fake_dashboard::set_body(std::string body) {
  std::lock_guard lock(script_mu_);
  body_ = std::move(body);
}

void fake_dashboard::set_status(unsigned status) {
  std::lock_guard lock(script_mu_);
  status_ = status;
}

void fake_dashboard::set_hang(bool hang) {
  std::lock_guard lock(script_mu_);
  hang_ = hang;
}

std::size_t fake_dashboard::served_count() const {
  std::lock_guard lock(script_mu_);
  return served_;
}

awaitable<demo::after_reply> fake_dashboard::handle(demo::exchange& ex) {
  const auto& req = ex.request();
  unsigned status = 404;
  std::string body = R"({"detail":"Not Found"})";
  bool hang = false;
  if (req.path() == opts_.path && (req.method == "GET" || req.method == "HEAD")) {
    std::lock_guard lock(script_mu_);
    hang = hang_;
    status = status_;
    if (status == 200) {
      body = body_;
      if (!hang) ++served_;
    } else {
      body = R"({"error":"fake dashboard failure"})";
    }
  }
  if (hang) {
    co_await ex.wait_for_peer_close();
    co_return demo::after_reply::done;
  }
  const demo::header_list headers = {{"Content-Type", "application/json"}};
  const auto reply = demo::format_response(status, headers, body, req.keep_alive, req.method == "HEAD");
  if (!co_await ex.write(reply)) co_return demo::after_reply::done;
  co_return demo::after_reply::keep_alive;
}

}  // namespace ingressd::testing
