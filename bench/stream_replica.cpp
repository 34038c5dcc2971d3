// bench/stream.sh's fake SSE replica: one thread, epoll, no library beyond libc, so that
// thousands of token streams cost the load core little and the replica is never the limit
// (bench/README.md "Token streams at scale"; the Python sse_server.py tops out far below).
//
//   ingressd-bench-stream-replica --listen 127.0.0.1:PORT
//
// Every request except GET /-/healthz gets a chunked text/event-stream response. The target's
// query picks the stream's shape: `ev=K` events (default 3) at `rate=R` events/s (default 200).
// The head and the first event go out at once (a replica with its first token ready), then one
// event per 1/R s, each in its own chunk and its own write(). An event is ~100 bytes:
//   data: {"i":SEQ,"t":WRITE_NS,"d":DUE_NS,"p":"xxxx"}\n\n
// t = CLOCK_MONOTONIC just before its write(), d = when the schedule wanted it: the client
// measures each hop's delay from t and the replica's own lateness from t - d. After the last
// event, `data: [DONE]` and the last chunk. Keep-alive (the proxies pool their connections).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <queue>
#include <string>
#include <vector>

namespace {

std::int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct conn {
  int fd = -1;
  unsigned gen = 0;      // bumped on close: stale timer entries are skipped
  std::string in;        // request bytes not parsed yet
  std::string out;       // bytes a write() could not take (only when the peer stops reading)
  std::size_t body_left = 0;
  bool streaming = false;
  int events = 0, sent = 0;
  std::int64_t start = 0, period = 0;
};

struct due {
  std::int64_t at;
  int fd;
  unsigned gen;
  bool operator>(const due& o) const { return at > o.at; }
};

std::vector<conn> conns;
std::priority_queue<due, std::vector<due>, std::greater<>> timers;
int ep = -1, tfd = -1;
std::int64_t armed_at = 0;
volatile sig_atomic_t stop = 0;
unsigned long long events_written = 0, late_1ms = 0;

void close_conn(conn& c) {
  close(c.fd);
  c.fd = -1;
  ++c.gen;
  c.in.clear();
  c.out.clear();
  c.streaming = false;
}

void want_out(conn& c, bool on) {
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP | (on ? unsigned(EPOLLOUT) : 0u);
  e.data.fd = c.fd;
  epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &e);
}

bool send_bytes(conn& c, const char* p, std::size_t n) {
  if (!c.out.empty()) {  // keep order behind what is already waiting
    c.out.append(p, n);
    return true;
  }
  const ssize_t w = write(c.fd, p, n);
  if (w < 0 && errno != EAGAIN) return false;
  const std::size_t done = w < 0 ? 0 : std::size_t(w);
  if (done < n) {
    c.out.assign(p + done, n - done);
    want_out(c, true);
  }
  return true;
}

void schedule(conn& c, std::int64_t at) {
  timers.push({at, c.fd, c.gen});
  if (armed_at == 0 || at < armed_at) {
    itimerspec its{};
    its.it_value.tv_sec = at / 1000000000;
    its.it_value.tv_nsec = at % 1000000000;
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, nullptr);
    armed_at = at;
  }
}

// One event (its own chunk) written now; the last one carries [DONE] and the last chunk too.
bool write_event(conn& c, const char* head, std::size_t head_len) {
  char buf[512];
  std::size_t n = 0;
  if (head_len) {
    std::memcpy(buf, head, head_len);
    n = head_len;
  }
  const std::int64_t due = c.start + c.period * c.sent;
  const std::int64_t t = now_ns();
  // The payload pads the event to ~100 bytes, the size of an OpenAI chat-completion delta.
  char ev[160];
  const int evn = std::snprintf(ev, sizeof ev, "data: {\"i\":%d,\"t\":%lld,\"d\":%lld,\"p\":\"%.*s\"}\n\n", c.sent,
                                static_cast<long long>(t), static_cast<long long>(due), 40,
                                "tokentokentokentokentokentokentokentoken");
  n += std::snprintf(buf + n, sizeof buf - n, "%x\r\n%s\r\n", evn, ev);
  ++c.sent;
  ++events_written;
  if (t - due > 1000000) ++late_1ms;
  if (c.sent == c.events) {
    static const char done[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    std::memcpy(buf + n, done, sizeof done - 1);
    n += sizeof done - 1;
    c.streaming = false;
  }
  return send_bytes(c, buf, n);
}

std::size_t query_int(const std::string& target, const char* key, std::size_t dflt) {
  const auto q = target.find('?');
  if (q == std::string::npos) return dflt;
  const std::string k = std::string(key) + "=";
  for (std::size_t p = q + 1; p < target.size();) {
    if (target.compare(p, k.size(), k) == 0) return std::strtoul(target.c_str() + p + k.size(), nullptr, 10);
    const auto amp = target.find('&', p);
    if (amp == std::string::npos) break;
    p = amp + 1;
  }
  return dflt;
}

// Parses whole requests out of c.in; starts a stream or answers the health check.
bool on_request_bytes(conn& c) {
  for (;;) {
    if (c.body_left) {
      const std::size_t k = std::min(c.body_left, c.in.size());
      c.in.erase(0, k);
      c.body_left -= k;
      if (c.body_left) return true;
    }
    if (c.streaming) return true;  // the next request (pipelined) waits for this response
    const auto end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) return c.in.size() < 65536;
    const std::string head = c.in.substr(0, end);
    c.in.erase(0, end + 4);
    const auto sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos) return false;
    const std::string method = head.substr(0, sp1), target = head.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string lower(head);
    for (auto& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (lower.find("transfer-encoding:") != std::string::npos) return false;  // nobody here sends one
    if (const auto cl = lower.find("\r\ncontent-length:"); cl != std::string::npos)
      c.body_left = std::strtoul(lower.c_str() + cl + 17, nullptr, 10);
    const bool close_after = lower.find("\r\nconnection: close") != std::string::npos;
    if (target.rfind("/-/healthz", 0) == 0) {
      static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\n\r\nsuccess";
      if (!send_bytes(c, ok, sizeof ok - 1)) return false;
      if (close_after) return false;
      continue;
    }
    if (close_after) return false;  // the proxies keep their replica connections alive
    c.events = int(std::max<std::size_t>(1, query_int(target, "ev", 3)));
    const std::size_t rate = std::max<std::size_t>(1, query_int(target, "rate", 200));
    c.period = 1000000000 / std::int64_t(rate);
    c.sent = 0;
    c.streaming = true;
    c.start = now_ns();
    static const char head_out[] =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    if (!write_event(c, head_out, sizeof head_out - 1)) return false;
    if (c.streaming) schedule(c, c.start + c.period);
  }
}

void on_timer() {
  std::uint64_t expirations;
  (void)!read(tfd, &expirations, sizeof expirations);
  armed_at = 0;
  const std::int64_t now = now_ns();
  while (!timers.empty() && timers.top().at <= now) {
    const due d = timers.top();
    timers.pop();
    conn& c = conns[d.fd];
    if (c.fd < 0 || c.gen != d.gen || !c.streaming) continue;
    if (!write_event(c, nullptr, 0)) {
      close_conn(c);
      continue;
    }
    if (c.streaming) {
      timers.push({c.start + c.period * c.sent, c.fd, c.gen});
    } else if (!c.in.empty() && !on_request_bytes(c)) {
      close_conn(c);
    }
  }
  if (!timers.empty()) {
    const std::int64_t at = timers.top().at;
    itimerspec its{};
    its.it_value.tv_sec = at / 1000000000;
    its.it_value.tv_nsec = at % 1000000000;
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, nullptr);
    armed_at = at;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen_at;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--listen") listen_at = argv[i + 1];
  const auto colon = listen_at.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "usage: %s --listen HOST:PORT\n", argv[0]);
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGTERM, [](int) { stop = 1; });
  std::signal(SIGINT, [](int) { stop = 1; });

  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(std::uint16_t(std::atoi(listen_at.c_str() + colon + 1)));
  inet_pton(AF_INET, listen_at.substr(0, colon).c_str(), &sa.sin_addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(lfd, 4096) != 0) {
    std::perror("bind/listen");
    return 1;
  }
  ep = epoll_create1(EPOLL_CLOEXEC);
  tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = lfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &e);
  e.data.fd = tfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &e);

  std::vector<epoll_event> ready(1024);
  char rbuf[65536];
  while (!stop) {
    const int n = epoll_wait(ep, ready.data(), int(ready.size()), 1000);
    for (int i = 0; i < n; ++i) {
      const int fd = ready[i].data.fd;
      if (fd == lfd) {
        for (;;) {
          const int cfd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (cfd < 0) {
            if (errno == EMFILE || errno == ENFILE) {  // say so, and do not spin on the ready listener
              std::fprintf(stderr, "accept: %s\n", std::strerror(errno));
              usleep(10000);
            }
            break;
          }
          setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          if (std::size_t(cfd) >= conns.size()) conns.resize(std::size_t(cfd) + 1024);
          conns[cfd].fd = cfd;
          epoll_event ce{};
          ce.events = EPOLLIN | EPOLLRDHUP;
          ce.data.fd = cfd;
          epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ce);
        }
        continue;
      }
      if (fd == tfd) {
        on_timer();
        continue;
      }
      conn& c = conns[fd];
      if (c.fd < 0) continue;
      if (ready[i].events & EPOLLOUT) {
        const ssize_t w = write(fd, c.out.data(), c.out.size());
        if (w < 0 && errno != EAGAIN) {
          close_conn(c);
          continue;
        }
        if (w > 0) c.out.erase(0, std::size_t(w));
        if (c.out.empty()) want_out(c, false);
      }
      if (ready[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        const ssize_t r = read(fd, rbuf, sizeof rbuf);
        if (r == 0 || (r < 0 && errno != EAGAIN)) {
          close_conn(c);
          continue;
        }
        if (r > 0) {
          c.in.append(rbuf, std::size_t(r));
          if (!on_request_bytes(c)) close_conn(c);
        }
      }
    }
  }
  std::printf("{\"events_written\":%llu,\"late_1ms\":%llu}\n", events_written, late_1ms);
  return 0;
}
