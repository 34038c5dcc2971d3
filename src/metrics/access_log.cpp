#include "ingressd/metrics/access_log.hpp"

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <system_error>

#include <fmt/format.h>
#include <spdlog/async_logger.h>
#include <spdlog/details/thread_pool.h>
#include <spdlog/sinks/base_sink.h>

#include "ingressd/core/text.hpp"

namespace ingressd::metrics {

std::string_view to_string(termination t) noexcept {
  switch (t) {
    case termination::ok: return "ok";
    case termination::client_abort: return "client_abort";
    case termination::upstream_abort: return "upstream_abort";
    case termination::timeout: return "timeout";
    case termination::error: return "error";
    case termination::shutdown: return "shutdown";
  }
  return "ok";
}

namespace {

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (std::size_t n = utf8_sequence(s, i)) {
        out.append(s.substr(i, n));
        i += n;
      } else {
        out += "\\ufffd";
        ++i;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
    ++i;
  }
  out += '"';
}

void append_key(std::string& out, std::string_view key, bool first = false) {
  if (!first) out += ',';
  out += '"';
  out += key;
  out += "\":";
}

void append_string_or_null(std::string& out, std::string_view key, std::string_view v) {
  append_key(out, key);
  if (v.empty()) out += "null";
  else append_json_string(out, v);
}

void append_seconds(std::string& out, std::chrono::nanoseconds d) {
  const auto ns = d.count() < 0 ? 0 : d.count();
  fmt::format_to(std::back_inserter(out), "{}.{:06}", ns / 1'000'000'000, (ns / 1000) % 1'000'000);
}

void append_time(std::string& out, std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  fmt::format_to(std::back_inserter(out), "\"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z\"", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms % 1000);
}

/// A file (or stdout) sink that can reopen its path (logrotate) and that flushes whenever the
/// async queue has run empty.
class reopenable_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit reopenable_sink(std::string path) : path_(std::move(path)) {
    if (path_ == "-") {
      file_ = stdout;
      return;
    }
    file_ = std::fopen(path_.c_str(), "ae");
    if (!file_) throw std::system_error(errno, std::generic_category(), "cannot open access log '" + path_ + "'");
  }
  ~reopenable_sink() override {
    if (!file_) return;
    std::fflush(file_);
    if (file_ != stdout) std::fclose(file_);
  }

  void set_pool(spdlog::details::thread_pool* pool) { pool_ = pool; }

  bool reopen() {
    std::lock_guard lk(mutex_);
    if (file_ == stdout) return true;
    std::FILE* next = std::fopen(path_.c_str(), "ae");
    if (!next) return false;
    std::fflush(file_);
    std::fclose(file_);
    file_ = next;
    return true;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::fwrite(msg.payload.data(), 1, msg.payload.size(), file_);
    std::fputc('\n', file_);
    if (pool_ && pool_->queue_size() == 0) std::fflush(file_);
  }
  void flush_() override { std::fflush(file_); }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  spdlog::details::thread_pool* pool_ = nullptr;
};

}  // namespace

void format_access_entry(std::string& out, const access_entry& e) {
  out += '{';
  append_key(out, "time", true);
  append_time(out, e.time);
  append_key(out, "client");
  append_json_string(out, e.client);
  append_key(out, "client_ip");
  append_json_string(out, e.client_ip.empty() ? e.client : e.client_ip);
  append_key(out, "listener");
  append_json_string(out, e.listener);
  append_key(out, "method");
  append_json_string(out, e.method);
  append_key(out, "path");
  append_json_string(out, e.path);
  append_key(out, "app");
  append_json_string(out, e.app);
  append_key(out, "status");
  fmt::format_to(std::back_inserter(out), "{}", e.status);
  append_key(out, "bytes");
  fmt::format_to(std::back_inserter(out), "{}", e.bytes);
  append_key(out, "duration");
  append_seconds(out, e.duration);
  const bool routed = !e.router.empty() || !e.router_outcome.empty();
  append_string_or_null(out, "router", e.router);
  append_string_or_null(out, "router_addr", e.router_addr);
  append_key(out, "router_latency");
  if (routed) append_seconds(out, e.router_latency);
  else out += "null";
  append_string_or_null(out, "router_outcome", e.router_outcome);
  append_key(out, "router_hedged");
  out += !routed ? "null" : e.router_hedged ? "true" : "false";
  append_string_or_null(out, "replica", e.replica);
  append_string_or_null(out, "replica_addr", e.replica_addr);
  append_key(out, "retries");
  fmt::format_to(std::back_inserter(out), "{}", e.retries);
  append_key(out, "termination");
  append_json_string(out, to_string(e.term));
  append_string_or_null(out, "reason", e.reason);
  append_string_or_null(out, "request_id", e.request_id);
  append_key(out, "grpc_status");
  if (e.grpc_status >= 0) fmt::format_to(std::back_inserter(out), "{}", e.grpc_status);
  else out += "null";
  // LLM figures: milliseconds with three decimals (µs resolution), null when not measured.
  auto append_ms = [&](std::string_view key, std::optional<std::chrono::nanoseconds> d) {
    append_key(out, key);
    if (d) fmt::format_to(std::back_inserter(out), "{:.3f}", static_cast<double>(d->count()) / 1e6);
    else out += "null";
  };
  auto append_count = [&](std::string_view key, std::optional<std::uint64_t> v) {
    append_key(out, key);
    if (v) fmt::format_to(std::back_inserter(out), "{}", *v);
    else out += "null";
  };
  append_ms("ttft_ms", e.ttft);
  append_count("events", e.ttft ? std::optional<std::uint64_t>(e.events) : std::nullopt);
  append_ms("max_gap_ms", e.ttft ? std::optional<std::chrono::nanoseconds>(e.max_gap) : std::nullopt);
  append_count("prompt_tokens", e.prompt_tokens);
  append_count("completion_tokens", e.completion_tokens);
  append_key(out, "tunnel");
  if (e.tunnel) {
    out += "{\"bytes_to_replica\":";
    fmt::format_to(std::back_inserter(out), "{}", e.tunnel_bytes_to_replica);
    out += ",\"closed_by\":";
    append_json_string(out, e.closed_by);
    out += '}';
  } else {
    out += "null";
  }
  out += '}';
}

struct access_log::impl {
  std::string target;
  std::shared_ptr<spdlog::details::thread_pool> pool;
  std::shared_ptr<reopenable_sink> sink;
  std::shared_ptr<spdlog::async_logger> logger;
};

access_log::access_log(const std::string& target, std::size_t queue_lines) : impl_(std::make_unique<impl>()) {
  impl_->target = target;
  impl_->sink = std::make_shared<reopenable_sink>(target);
  impl_->pool = std::make_shared<spdlog::details::thread_pool>(queue_lines, 1);
  impl_->sink->set_pool(impl_->pool.get());
  impl_->logger = std::make_shared<spdlog::async_logger>("access", impl_->sink, impl_->pool,
                                                         spdlog::async_overflow_policy::overrun_oldest);
  impl_->logger->set_level(spdlog::level::info);
  impl_->logger->flush_on(spdlog::level::off);
}

access_log::~access_log() {
  // The pool's destructor processes what is queued, then joins its thread; queued messages keep
  // the logger (and the sink) alive until then.
  impl_->logger.reset();
  impl_->pool.reset();
}

void access_log::write(const access_entry& e) {
  thread_local std::string line;
  line.clear();
  format_access_entry(line, e);
  impl_->logger->log(spdlog::level::info, spdlog::string_view_t(line.data(), line.size()));
}

bool access_log::reopen() { return impl_->sink->reopen(); }

void access_log::flush() { impl_->logger->flush(); }

std::uint64_t access_log::dropped() const { return impl_->pool->overrun_counter(); }

const std::string& access_log::target() const { return impl_->target; }

}  // namespace ingressd::metrics
