#include "ingressd/upstream/pool.hpp"

#include <sys/socket.h>

#include <cerrno>

namespace ingressd::upstream {

lease& lease::operator=(lease&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_;
    c_ = std::move(o.c_);
    key_ = o.key_;
    scale_ = o.scale_;
  }
  return *this;
}

void lease::release(bool keep_alive) {
  if (!c_) return;
  if (keep_alive && c_->buf.size() == 0 && pool_) pool_->put(std::move(c_), scale_);
  else close();
}

void lease::close() noexcept {
  if (!c_) return;
  error_code ignored;
  c_->sock.close(ignored);
  c_.reset();
}

void lease::reset() noexcept {
  if (!c_) return;
  error_code ignored;
  c_->sock.set_option(asio::socket_base::linger(true, 0), ignored);
  c_->sock.close(ignored);
  c_.reset();
}

void lease::cancel() noexcept {
  if (!c_) return;
  error_code ignored;
  c_->sock.cancel(ignored);
}

awaitable<error_code> lease::connect(const tcp::endpoint& dial, const asio::io_context::executor_type& ex) {
  reset();
  c_ = std::make_unique<connection>(ex);
  c_->key = *key_;
  auto [ec] = co_await c_->sock.async_connect(dial, nothrow);
  if (ec) {
    close();
    co_return ec;
  }
  error_code ignored;
  c_->sock.set_option(tcp::no_delay(true), ignored);
  co_return error_code{};
}

lease pool::acquire(const std::string& key, acquire_policy p) {
  lease l;
  l.pool_ = this;
  l.key_ = &key;
  l.scale_ = p.scale;
  if (!p.fresh) l.c_ = take(key, p.check);
  return l;
}

bool pool::alive(connection& c) {
  // An idle HTTP/1.1 connection must have nothing to read: EOF means the peer closed it,
  // bytes mean the peer sent something unsolicited. Either way it is unusable.
  char byte;
  ssize_t n = ::recv(c.sock.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

connection_ptr pool::take(const std::string& key, staleness check) {
  auto it = idle_.find(key);
  if (it == idle_.end()) return nullptr;
  auto& v = it->second;
  while (!v.empty()) {
    connection_ptr c = std::move(v.back());
    v.pop_back();
    if (check == staleness::caller_retries || alive(*c)) {
      c->reused = true;
      return c;
    }
    error_code ignored;
    c->sock.close(ignored);
  }
  return nullptr;
}

void pool::put(connection_ptr c, unsigned scale) {
  auto it = idle_.find(c->key);
  if (it == idle_.end()) {
    if (closed_set_) {  // its endpoint left the topology while the connection was in use
      error_code ignored;
      c->sock.close(ignored);
      return;
    }
    it = idle_.try_emplace(c->key).first;
  }
  auto& v = it->second;
  if (v.size() >= std::size_t{max_idle_} * scale) {
    error_code ignored;
    c->sock.close(ignored);
    return;
  }
  c->idle_since = std::chrono::steady_clock::now();
  v.push_back(std::move(c));
}

void pool::retain(const std::function<bool(const std::string&)>& keep) {
  for (auto it = idle_.begin(); it != idle_.end();) {
    if (keep(it->first)) {
      ++it;
      continue;
    }
    for (auto& c : it->second) {
      error_code ignored;
      c->sock.close(ignored);
    }
    it = idle_.erase(it);
  }
}

void pool::set_endpoints(const std::function<bool(const std::string&)>& keep,
                         const std::vector<std::string_view>& keys) {
  retain(keep);
  for (const auto k : keys) idle_.try_emplace(std::string(k));
  closed_set_ = true;
}

void pool::sweep(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration max_idle) {
  for (auto it = idle_.begin(); it != idle_.end();) {
    auto& v = it->second;
    std::erase_if(v, [&](connection_ptr& c) {
      if (now - c->idle_since < max_idle && alive(*c)) return false;
      error_code ignored;
      c->sock.close(ignored);
      return true;
    });
    // After set_endpoints() an empty entry still marks an endpoint of the topology.
    it = v.empty() && !closed_set_ ? idle_.erase(it) : std::next(it);
  }
}

void pool::close_all() {
  retain([](const std::string&) { return false; });
}

std::size_t pool::idle_count() const {
  std::size_t n = 0;
  for (auto& [k, v] : idle_) n += v.size();
  return n;
}

}  // namespace ingressd::upstream
