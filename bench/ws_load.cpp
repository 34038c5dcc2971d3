// bench/websocket.sh's load tool (issue #32): a WebSocket echo replica and the two clients, one
// thread each, epoll, libc only (SHA-1 and base64 for the handshake are here). A Python client
// spends ~50 us of its own per message and its queueing would be most of every latency figure;
// this one leaves the direct round trip at a few tens of microseconds.
//
//   ws_load serve --listen IP:PORT
//   ws_load echo  --connect IP:PORT [--conns 1] [--messages 10000] [--warmup 500] [--size 64]
//                 [--rate 0] [--pid PID]... [--timeout 120] [--path /ws/echo]
//   ws_load idle  --connect IP:PORT [--conns 5000] [--batch 250] [--settle-ms 1000] [--sample 200]
//                 [--no-echo] [--pid PID]... [--replica-stats IP:PORT] [--timeout 120]
//
// serve: answers GET /-/healthz with 200 "ok" and GET /stats with its counters (plain HTTP,
//   Connection: close), and a WebSocket handshake (Upgrade: websocket, any path) with its 101;
//   then every frame back as it came (opcode, FIN and payload; unmasked), ping -> pong, close ->
//   close echoed and the connection ended after it. Back-pressure: it stops reading a connection
//   whose replies it could not send yet.
// echo: opens --conns WebSocket connections (the handshake's Sec-WebSocket-Accept checked), then
//   runs echo rounds: a masked text frame of --size bytes (its sequence number, then 'x's), and
//   the echo must come back byte for byte. Closed loop (--rate 0): each connection sends its next
//   message as soon as the echo of the last one arrived, until --messages echoes completed after
//   the --warmup ones. Paced (--rate R): R messages per second over all connections, connection i
//   due every conns/R s, shifted by i/R (a timerfd); a message due while its connection still
//   waits for the last echo goes out when that echo arrives and counts as "late". Round trip =
//   CLOCK_MONOTONIC after the read() that completed the echo minus before the write(), in both
//   modes (paced: from the write, not from the due time; "late" says how often the schedule
//   slipped). The --pid processes' utime + stime (/proc/PID/stat; stime alone too: the kernel's
//   part), run time (/proc/PID/task/*/schedstat) and every CPU's busy time (/proc/stat) are read
//   when the measured echoes start and when they end.
// idle: reads the --pid processes' VmRSS, opens --conns WebSocket connections, --batch at a time
//   in flight, each followed by one echo (unless --no-echo), waits --settle-ms, reads VmRSS again,
//   then checks that --sample of them, spread over all, still echo. With --replica-stats, the
//   replica's open WebSocket count before and after (one replica connection per tunnel).
//   Closes everything at exit.
// Each client prints one JSON object and exits 0 when every connection and echo succeeded.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "ws_load: %s: %s\n", what, std::strerror(errno));
  std::exit(2);
}

// ------------------------------------------------------------------ SHA-1, base64 (handshake only)
std::array<std::uint8_t, 20> sha1(std::string_view s) {
  std::uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  std::string m(s);
  const std::uint64_t bits = std::uint64_t(s.size()) * 8;
  m.push_back(char(0x80));
  while (m.size() % 64 != 56) m.push_back('\0');
  for (int i = 7; i >= 0; --i) m.push_back(char((bits >> (i * 8)) & 0xff));
  auto rol = [](std::uint32_t x, int n) { return (x << n) | (x >> (32 - n)); };
  for (std::size_t off = 0; off < m.size(); off += 64) {
    std::uint32_t w[80];
    for (int i = 0; i < 16; ++i)
      w[i] = std::uint32_t(std::uint8_t(m[off + 4 * i])) << 24 | std::uint32_t(std::uint8_t(m[off + 4 * i + 1])) << 16 |
             std::uint32_t(std::uint8_t(m[off + 4 * i + 2])) << 8 | std::uint32_t(std::uint8_t(m[off + 4 * i + 3]));
    for (int i = 16; i < 80; ++i) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f, k;
      if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
      else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
      else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
      else { f = b ^ c ^ d; k = 0xCA62C1D6; }
      const std::uint32_t t = rol(a, 5) + f + e + k + w[i];
      e = d; d = c; c = rol(b, 30); b = a; a = t;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
  }
  std::array<std::uint8_t, 20> out;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = std::uint8_t(h[i] >> (24 - 8 * j));
  return out;
}

std::string base64(const std::uint8_t* p, std::size_t n) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  for (std::size_t i = 0; i < n; i += 3) {
    const std::uint32_t v = std::uint32_t(p[i]) << 16 | (i + 1 < n ? std::uint32_t(p[i + 1]) << 8 : 0) |
                            (i + 2 < n ? std::uint32_t(p[i + 2]) : 0);
    o.push_back(t[(v >> 18) & 63]);
    o.push_back(t[(v >> 12) & 63]);
    o.push_back(i + 1 < n ? t[(v >> 6) & 63] : '=');
    o.push_back(i + 2 < n ? t[v & 63] : '=');
  }
  return o;
}

std::string accept_key(std::string_view key) {
  const auto d = sha1(std::string(key) + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
  return base64(d.data(), d.size());
}

// A header's value from an HTTP head ("" when absent); names compared without case.
std::string header(std::string_view head, std::string_view name) {
  std::size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos && pos + 2 < head.size()) {
    const std::size_t start = pos + 2, end = head.find("\r\n", start);
    const std::string_view line = head.substr(start, end == std::string_view::npos ? head.npos : end - start);
    const std::size_t colon = line.find(':');
    if (colon == name.size() && strncasecmp(line.data(), name.data(), name.size()) == 0) {
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
      return std::string(v);
    }
    pos = end;
  }
  return {};
}

bool contains_token(std::string v, std::string_view token) {
  for (auto& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return v.find(token) != std::string::npos;
}

bool parse_addr(const std::string& s, sockaddr_in& a) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  std::memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(std::uint16_t(std::atoi(s.c_str() + colon + 1)));
  return inet_pton(AF_INET, s.substr(0, colon).c_str(), &a.sin_addr) == 1;
}

void raise_nofile() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// Writes what it can now; false on an error (EAGAIN is not one).
bool flush(int fd, std::string& out, std::size_t& off) {
  while (off < out.size()) {
    const ssize_t w = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (w > 0) { off += std::size_t(w); continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
  out.clear();
  off = 0;
  return true;
}

// ------------------------------------------------------------------ WebSocket frames
struct frame {
  bool fin = true;
  int opcode = 0;
  std::size_t header = 0, len = 0;  // header bytes (with the mask key), payload bytes
  bool masked = false;
  std::uint8_t mask[4] = {};
};

// Parses a frame header at the front of buf: 1 done, 0 more bytes needed, -1 malformed.
int parse_frame(std::string_view buf, frame& f) {
  if (buf.size() < 2) return 0;
  const auto b0 = std::uint8_t(buf[0]), b1 = std::uint8_t(buf[1]);
  f.fin = b0 & 0x80;
  f.opcode = b0 & 0x0f;
  f.masked = b1 & 0x80;
  std::size_t need = 2;
  std::uint64_t len = b1 & 0x7f;
  if (len == 126) {
    need += 2;
    if (buf.size() < need) return 0;
    len = std::uint64_t(std::uint8_t(buf[2])) << 8 | std::uint8_t(buf[3]);
  } else if (len == 127) {
    need += 8;
    if (buf.size() < need) return 0;
    len = 0;
    for (int i = 0; i < 8; ++i) len = len << 8 | std::uint8_t(buf[2 + i]);
  }
  if (len > (64u << 20)) return -1;
  if (f.masked) {
    if (buf.size() < need + 4) return 0;
    std::memcpy(f.mask, buf.data() + need, 4);
    need += 4;
  }
  f.header = need;
  f.len = std::size_t(len);
  return 1;
}

void put_frame_header(std::string& out, std::uint8_t b0, std::size_t len, const std::uint8_t* mask) {
  out.push_back(char(b0));
  const std::uint8_t m = mask ? 0x80 : 0;
  if (len < 126) {
    out.push_back(char(m | len));
  } else if (len < 65536) {
    out.push_back(char(m | 126));
    out.push_back(char(len >> 8));
    out.push_back(char(len & 0xff));
  } else {
    out.push_back(char(m | 127));
    for (int i = 7; i >= 0; --i) out.push_back(char((std::uint64_t(len) >> (8 * i)) & 0xff));
  }
  if (mask) out.append(reinterpret_cast<const char*>(mask), 4);
}

// ------------------------------------------------------------------ serve
struct srv_conn {
  int fd = -1;
  bool ws = false, closing = false, reading = true;
  std::string in, out;
  std::size_t out_off = 0;
};

int serve(const std::string& listen_addr) {
  sockaddr_in a;
  if (!parse_addr(listen_addr, a)) { std::fprintf(stderr, "bad --listen %s\n", listen_addr.c_str()); return 2; }
  raise_nofile();
  signal(SIGPIPE, SIG_IGN);
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
  if (::listen(lfd, 4096) != 0) die("listen");
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  std::uint64_t accepted = 0, open = 0, ws_open = 0, ws_total = 0, echoed = 0;
  std::vector<char> rbuf(256 * 1024);
  std::vector<epoll_event> evs(512);

  auto update = [&](srv_conn* c) {
    epoll_event e{};
    e.events = (c->reading ? EPOLLIN : 0u) | (c->out.empty() ? 0u : EPOLLOUT);
    e.data.ptr = c;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
  };
  auto close_conn = [&](srv_conn* c) {
    ::close(c->fd);
    --open;
    if (c->ws) --ws_open;
    delete c;
  };
  // Handles what c->in holds: false when the connection is to be closed now.
  auto consume = [&](srv_conn* c) -> bool {
    if (!c->ws) {
      const auto end = c->in.find("\r\n\r\n");
      if (end == std::string::npos) return c->in.size() < 16384;
      const std::string head = c->in.substr(0, end + 4);
      c->in.erase(0, end + 4);
      const auto sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
      const std::string path = sp1 == std::string::npos ? "" : head.substr(sp1 + 1, sp2 - sp1 - 1);
      const std::string key = header(head, "Sec-WebSocket-Key");
      if (contains_token(header(head, "Upgrade"), "websocket") && !key.empty()) {
        c->out += "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Accept: " + accept_key(key) + "\r\n\r\n";
        c->ws = true;
        ++ws_open;
        ++ws_total;
      } else {
        std::string body;
        int status = 200;
        if (path.rfind("/-/healthz", 0) == 0) body = "ok";
        else if (path.rfind("/stats", 0) == 0) {
          char b[256];
          std::snprintf(b, sizeof b,
                        "accepted=%" PRIu64 " open=%" PRIu64 " ws_open=%" PRIu64 " ws_total=%" PRIu64 " echoed=%" PRIu64 "\n",
                        accepted, open - 1, ws_open, ws_total, echoed);
          body = b;
        } else { status = 404; body = "not found"; }
        c->out += "HTTP/1.1 " + std::to_string(status) + (status == 200 ? " OK" : " Not Found") +
                  "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
                  "\r\nConnection: close\r\n\r\n" + body;
        c->closing = true;
        c->in.clear();
        return true;
      }
    }
    std::size_t pos = 0;
    while (!c->closing) {
      frame f;
      const int r = parse_frame(std::string_view(c->in).substr(pos), f);
      if (r < 0) return false;
      if (r == 0 || c->in.size() - pos < f.header + f.len) break;
      char* p = c->in.data() + pos + f.header;
      if (f.masked)
        for (std::size_t i = 0; i < f.len; ++i) p[i] ^= char(f.mask[i & 3]);
      if (f.opcode == 0x9) {  // ping -> pong
        put_frame_header(c->out, 0x8A, f.len, nullptr);
        c->out.append(p, f.len);
      } else if (f.opcode == 0xA) {  // pong: nothing
      } else if (f.opcode == 0x8) {  // close: echoed, then the end
        put_frame_header(c->out, 0x88, f.len, nullptr);
        c->out.append(p, f.len);
        c->closing = true;
      } else {
        put_frame_header(c->out, std::uint8_t((f.fin ? 0x80 : 0) | f.opcode), f.len, nullptr);
        c->out.append(p, f.len);
        if (f.fin) ++echoed;
      }
      pos += f.header + f.len;
    }
    c->in.erase(0, pos);
    return true;
  };

  for (;;) {
    const int n = epoll_wait(ep, evs.data(), int(evs.size()), -1);
    if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
    for (int i = 0; i < n; ++i) {
      auto* c = static_cast<srv_conn*>(evs[i].data.ptr);
      if (!c) {
        for (;;) {
          const int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          auto* nc = new srv_conn;
          nc->fd = fd;
          ++accepted;
          ++open;
          epoll_event e{};
          e.events = EPOLLIN;
          e.data.ptr = nc;
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
        }
        continue;
      }
      bool dead = false;
      if ((evs[i].events & EPOLLOUT) || (evs[i].events & (EPOLLERR | EPOLLHUP))) {
        if (!flush(c->fd, c->out, c->out_off)) dead = true;
      }
      if (!dead && c->reading && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
        for (;;) {
          const ssize_t r = ::recv(c->fd, rbuf.data(), rbuf.size(), 0);
          if (r > 0) {
            c->in.append(rbuf.data(), std::size_t(r));
            if (std::size_t(r) < rbuf.size()) break;
            continue;
          }
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          dead = true;  // EOF or error: the peer is gone (an echo server has nothing more to say)
          break;
        }
        if (!dead && !consume(c)) dead = true;
        if (!dead && !flush(c->fd, c->out, c->out_off)) dead = true;
      }
      if (!dead && c->closing && c->out.empty()) {
        ::shutdown(c->fd, SHUT_WR);  // then wait for the peer's end (or error)
        c->in.clear();
      }
      if (dead) { epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr); close_conn(c); continue; }
      // back-pressure: no reading while 4 MiB of replies wait
      c->reading = c->out.size() < (4u << 20);
      update(c);
    }
  }
}

// ------------------------------------------------------------------ the clients
// The replica's counters (GET /stats, Connection: close), "" when it does not answer.
std::string replica_stats(const std::string& addr) {
  sockaddr_in a;
  if (addr.empty() || !parse_addr(addr, a)) return {};
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string got;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /stats HTTP/1.1\r\nHost: " + addr + "\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == ssize_t(req.size())) {
      char b[1024];
      ssize_t r;
      while ((r = ::recv(fd, b, sizeof b, 0)) > 0) got.append(b, std::size_t(r));
    }
  }
  ::close(fd);
  const auto body = got.find("\r\n\r\n");
  if (body == std::string::npos) return {};
  got.erase(0, body + 4);
  while (!got.empty() && (got.back() == '\n' || got.back() == '\r')) got.pop_back();
  return got;
}

long long stat_field(const std::string& stats, const std::string& key) {
  const auto p = stats.find(key + "=");
  return p == std::string::npos ? -1 : std::atoll(stats.c_str() + p + key.size() + 1);
}

struct proc_sample {
  long long ticks = 0, sys_ticks = 0, rss_kib = 0, sched_ns = 0;
  std::vector<std::pair<long long, long long>> cpus;  // /proc/stat per CPU: (busy, total) ticks
};

// "cpuN_busy": the share of each CPU that was busy between two samples, %
std::string cpu_busy_json(const proc_sample& a, const proc_sample& b) {
  std::string o;
  for (std::size_t i = 0; i < a.cpus.size() && i < b.cpus.size(); ++i) {
    const long long busy = b.cpus[i].first - a.cpus[i].first, total = b.cpus[i].second - a.cpus[i].second;
    char buf[64];
    std::snprintf(buf, sizeof buf, ", \"cpu%zu_busy\": %.1f", i, total > 0 ? 100.0 * double(busy) / double(total) : 0.0);
    o += buf;
  }
  return o;
}

proc_sample sample_procs(const std::vector<int>& pids) {
  proc_sample s;
  {
    std::ifstream st("/proc/stat");
    std::string line;
    while (std::getline(st, line)) {
      if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
      std::istringstream is(line.substr(line.find(' ')));
      long long v, total = 0, idle = 0;
      for (int i = 0; is >> v; ++i) {
        total += v;
        if (i == 3 || i == 4) idle += v;  // idle, iowait
      }
      s.cpus.emplace_back(total - idle, total);
    }
  }
  for (int pid : pids) {
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (std::getline(st, line)) {
      const auto rp = line.rfind(')');
      std::istringstream is(line.substr(rp + 2));
      std::string f;
      long long v[16] = {};
      for (int i = 3; i <= 15 && (is >> f); ++i) v[i] = std::atoll(f.c_str());  // field 3 is state
      s.ticks += v[14] + v[15];
      s.sys_ticks += v[15];
    }
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    while (std::getline(status, line))
      if (line.rfind("VmRSS:", 0) == 0) s.rss_kib += std::atoll(line.c_str() + 6);
    const std::string dir = "/proc/" + std::to_string(pid) + "/task/";
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::ifstream ss(dir + e->d_name + "/schedstat");
        long long run = 0;
        if (ss >> run) s.sched_ns += run;
      }
      closedir(d);
    }
  }
  return s;
}

enum class cstate { connecting, handshake, open, dead };

struct cli_conn {
  int fd = -1;
  int idx = 0;
  cstate st = cstate::connecting;
  std::string key, in, out;
  std::size_t out_off = 0;
  bool waiting = false;          // an echo outstanding
  std::string expect;            // its payload
  std::int64_t sent_at = 0;      // when it was written (or due)
  std::int64_t next_due = 0;     // paced: when the next message is due
  std::uint64_t seq = 0;
  bool echoed_once = false;      // idle: its first echo came back
};

struct client {
  sockaddr_in dst{};
  std::string host_header, path = "/ws/echo";
  int ep = -1;
  std::size_t size = 64;
  std::uint32_t rng = 2463534242u;
  std::vector<char> rbuf = std::vector<char>(64 * 1024);
  std::string first_error;
  std::uint64_t errors = 0;

  std::uint32_t next_rand() {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
  }
  void error(cli_conn* c, const std::string& what) {
    ++errors;
    if (first_error.empty()) {  // goes into the JSON as is: no quotes, backslashes or controls
      first_error = what;
      for (auto& ch : first_error)
        if (ch == '"' || ch == '\\' || static_cast<unsigned char>(ch) < 0x20) ch = '\'';
    }
    if (c->st != cstate::dead) {
      epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr);
      ::close(c->fd);
      c->fd = -1;
      c->st = cstate::dead;
    }
  }
  void watch(cli_conn* c, bool add) {
    epoll_event e{};
    e.events = EPOLLIN | (c->st == cstate::connecting || !c->out.empty() ? EPOLLOUT : 0u);
    e.data.ptr = c;
    epoll_ctl(ep, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &e);
  }
  bool start(cli_conn* c) {
    c->fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) { c->st = cstate::dead; ++errors; if (first_error.empty()) first_error = std::string("socket: ") + std::strerror(errno); return false; }
    const int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->st = cstate::connecting;
    const int r = ::connect(c->fd, reinterpret_cast<const sockaddr*>(&dst), sizeof dst);
    if (r != 0 && errno != EINPROGRESS) {
      c->st = cstate::handshake;  // so that error() closes it
      error(c, std::string("connect: ") + std::strerror(errno));
      return false;
    }
    std::uint8_t k[16];
    for (auto& b : k) b = std::uint8_t(next_rand());
    c->key = base64(k, 16);
    c->out = "GET " + path + " HTTP/1.1\r\nHost: " + host_header +
             "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + c->key +
             "\r\nSec-WebSocket-Version: 13\r\n\r\n";
    c->out_off = 0;
    watch(c, true);
    return true;
  }
  // Sends one masked text frame: the sequence number, then 'x's to --size bytes.
  bool send_msg(cli_conn* c, std::int64_t at) {
    char num[32];
    const int n = std::snprintf(num, sizeof num, "%d:%" PRIu64 ":", c->idx, c->seq++);
    c->expect.assign(num, std::size_t(n));
    if (c->expect.size() < size) c->expect.append(size - c->expect.size(), 'x');
    else c->expect.resize(size);
    std::uint8_t mask[4];
    const std::uint32_t m = next_rand();
    std::memcpy(mask, &m, 4);
    const bool was_empty = c->out.empty();
    put_frame_header(c->out, 0x81, c->expect.size(), mask);
    const std::size_t at0 = c->out.size();
    c->out += c->expect;
    for (std::size_t i = 0; i < c->expect.size(); ++i) c->out[at0 + i] ^= char(mask[i & 3]);
    c->waiting = true;
    c->sent_at = at ? at : now_ns();
    if (!flush(c->fd, c->out, c->out_off)) { error(c, "send: " + std::string(std::strerror(errno))); return false; }
    if (was_empty && !c->out.empty()) watch(c, false);
    return true;
  }
  // Reads what the socket has; calls on_open(c) after a good 101, on_echo(c, t) per echo.
  template <class Open, class Echo>
  void on_event(cli_conn* c, std::uint32_t events, Open&& on_open, Echo&& on_echo) {
    if (c->st == cstate::dead) return;
    if (c->st == cstate::connecting && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int err = 0;
      socklen_t l = sizeof err;
      getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
      if (err) { error(c, std::string("connect: ") + std::strerror(err)); return; }
      c->st = cstate::handshake;
    }
    if (!c->out.empty() && (events & EPOLLOUT)) {
      if (!flush(c->fd, c->out, c->out_off)) { error(c, "send: " + std::string(std::strerror(errno))); return; }
      if (c->out.empty()) watch(c, false);
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    for (;;) {
      const ssize_t r = ::recv(c->fd, rbuf.data(), rbuf.size(), 0);
      if (r > 0) {
        const std::int64_t t = now_ns();
        c->in.append(rbuf.data(), std::size_t(r));
        if (!process(c, t, on_open, on_echo)) return;
        if (std::size_t(r) < rbuf.size()) break;
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      error(c, r == 0 ? std::string("closed by the peer") + (c->st == cstate::open ? " (tunnel open)" : " before the 101")
                      : "recv: " + std::string(std::strerror(errno)));
      return;
    }
  }
  template <class Open, class Echo>
  bool process(cli_conn* c, std::int64_t t, Open& on_open, Echo& on_echo) {
    if (c->st == cstate::handshake || c->st == cstate::connecting) {
      const auto end = c->in.find("\r\n\r\n");
      if (end == std::string::npos) return true;
      const std::string head = c->in.substr(0, end + 4);
      c->in.erase(0, end + 4);
      if (head.rfind("HTTP/1.1 101", 0) != 0) {
        error(c, "handshake answered: " + head.substr(0, head.find("\r\n")) +
                     (header(head, "X-Serve-Reason").empty() ? "" : " (" + header(head, "X-Serve-Reason") + ")"));
        return false;
      }
      if (header(head, "Sec-WebSocket-Accept") != accept_key(c->key)) { error(c, "bad Sec-WebSocket-Accept"); return false; }
      c->st = cstate::open;
      on_open(c);
      if (c->st == cstate::dead) return false;
    }
    for (;;) {
      frame f;
      const int r = parse_frame(c->in, f);
      if (r < 0) { error(c, "malformed frame"); return false; }
      if (r == 0 || c->in.size() < f.header + f.len) return true;
      if (f.masked || f.opcode != 0x1 || !f.fin) { error(c, "unexpected frame opcode " + std::to_string(f.opcode)); return false; }
      if (!c->waiting || std::string_view(c->in).substr(f.header, f.len) != c->expect) {
        error(c, "echo does not match what was sent");
        return false;
      }
      c->in.erase(0, f.header + f.len);
      c->waiting = false;
      on_echo(c, t);
      if (c->st == cstate::dead) return false;
    }
  }
};

struct stats {
  std::vector<std::int64_t> v;
  double pct(double p) {
    if (v.empty()) return 0;
    const std::size_t i = std::min(v.size() - 1, std::size_t(p / 100.0 * double(v.size())));
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(i), v.end());
    return double(v[i]) / 1000.0;
  }
  double max() { return v.empty() ? 0 : double(*std::max_element(v.begin(), v.end())) / 1000.0; }
  double mean() {
    if (v.empty()) return 0;
    long double s = 0;
    for (auto x : v) s += x;
    return double(s / v.size()) / 1000.0;
  }
};

struct cli_opts {
  std::string connect, path = "/ws/echo", replica;
  int conns = -1, batch = 250, sample = 200;
  long long messages = 10000, warmup = 500;
  double rate = 0, timeout = 120, settle_ms = 1000;
  std::size_t size = 64;
  bool echo = true;
  std::vector<int> pids;
};

int run_echo(const cli_opts& o) {
  client cl;
  if (!parse_addr(o.connect, cl.dst)) { std::fprintf(stderr, "bad --connect %s\n", o.connect.c_str()); return 2; }
  cl.host_header = o.connect;
  cl.path = o.path;
  cl.size = o.size;
  cl.ep = epoll_create1(EPOLL_CLOEXEC);
  const int K = o.conns < 0 ? 1 : o.conns;
  const std::int64_t deadline = now_ns() + std::int64_t(o.timeout * 1e9);
  std::vector<std::unique_ptr<cli_conn>> conns;
  int opened = 0;
  for (int i = 0; i < K; ++i) {
    conns.push_back(std::make_unique<cli_conn>());
    conns.back()->idx = i;
    cl.start(conns.back().get());
  }
  std::vector<epoll_event> evs(1024);
  const int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = nullptr;
    epoll_ctl(cl.ep, EPOLL_CTL_ADD, tfd, &e);
  }
  // phases: 0 opening, 1 warm-up, 2 measured, 3 done
  int phase = 0;
  long long sent = 0, done = 0;  // in the current phase
  stats rtt;
  rtt.v.reserve(std::size_t(o.messages) + 16);
  proc_sample p0, p1;
  std::int64_t t0 = 0, t1 = 0;
  long long late = 0;  // paced: messages that were due while their connection's last echo was outstanding
  const bool paced = o.rate > 0;
  const std::int64_t period = paced ? std::int64_t(double(K) / o.rate * 1e9) : 0;
  auto target = [&] { return phase == 1 ? o.warmup : o.messages; };
  auto arm_timer = [&] {
    std::int64_t next = INT64_MAX;
    for (auto& c : conns)
      if (c->st == cstate::open && !c->waiting) next = std::min(next, c->next_due);
    itimerspec its{};
    if (next != INT64_MAX) {
      if (next <= 0) next = 1;
      its.it_value.tv_sec = next / 1000000000;
      its.it_value.tv_nsec = next % 1000000000;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, nullptr);
  };
  // A phase ends when all its messages have come back (sent never exceeds the target), so each
  // starts with no echo outstanding.
  auto begin_phase = [&](int ph) {
    if (ph == 1 && o.warmup == 0) ph = 2;
    phase = ph;
    sent = done = 0;
    if (ph == 2) {
      p0 = sample_procs(o.pids);
      t0 = now_ns();
    }
    const std::int64_t base = now_ns();
    for (auto& c : conns) {
      if (c->st != cstate::open) continue;
      if (paced) c->next_due = base + std::int64_t(double(period) * c->idx / K);
      else if (sent < target()) {
        ++sent;
        cl.send_msg(c.get(), 0);
      }
    }
    if (paced) arm_timer();
  };
  auto maybe_send = [&](cli_conn* c, std::int64_t t, bool after_echo) {
    if (sent >= target() || c->waiting || c->st != cstate::open) return;
    if (!paced) { ++sent; cl.send_msg(c, 0); return; }
    if (c->next_due <= t) {
      if (after_echo && phase == 2) ++late;  // it was due while the last echo was still on its way
      ++sent;
      c->next_due += period;
      cl.send_msg(c, 0);
    }
  };
  auto on_open = [&](cli_conn*) {
    if (++opened + int(cl.errors) == K) {
      if (cl.errors) return;
      begin_phase(1);
    }
  };
  auto on_echo = [&](cli_conn* c, std::int64_t t) {
    ++done;
    if (phase == 2) rtt.v.push_back(t - c->sent_at);
    if (done >= target()) {
      if (phase == 1) { begin_phase(2); return; }
      if (phase == 2) { t1 = now_ns(); p1 = sample_procs(o.pids); phase = 3; return; }
    }
    maybe_send(c, paced ? now_ns() : t, true);
    if (paced) arm_timer();
  };
  while (phase != 3 && now_ns() < deadline) {
    if (cl.errors && (phase != 0 || opened + int(cl.errors) == K)) break;
    const int n = epoll_wait(cl.ep, evs.data(), int(evs.size()), 200);
    if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
    for (int i = 0; i < n && phase != 3; ++i) {
      auto* c = static_cast<cli_conn*>(evs[i].data.ptr);
      if (!c) {
        std::uint64_t x;
        while (::read(tfd, &x, sizeof x) > 0) {}
        const std::int64_t t = now_ns();
        for (auto& cc : conns) maybe_send(cc.get(), t, false);
        arm_timer();
        continue;
      }
      cl.on_event(c, evs[i].events, on_open, on_echo);
    }
  }
  if (phase != 3) {
    t1 = now_ns();
    p1 = sample_procs(o.pids);
  }
  const bool ok = phase == 3 && cl.errors == 0;
  const double secs = t1 > t0 && t0 ? double(t1 - t0) / 1e9 : 0;
  const long long echoes = phase == 3 ? o.messages : (phase == 2 ? done : 0);
  const double clk = double(sysconf(_SC_CLK_TCK));
  const double cpu_s = double(p1.ticks - p0.ticks) / clk;
  const double sched_s = double(p1.sched_ns - p0.sched_ns) / 1e9;
  std::printf(
      "{\"ok\": %s, \"conns\": %d, \"opened\": %d, \"size\": %zu, \"rate\": %.0f, \"echoes\": %lld, \"seconds\": %.3f, "
      "\"echoes_per_s\": %.0f, \"rtt_p50_us\": %.1f, \"rtt_p90_us\": %.1f, \"rtt_p99_us\": %.1f, \"rtt_p999_us\": %.1f, "
      "\"rtt_max_us\": %.1f, \"rtt_mean_us\": %.1f, \"late\": %lld, \"cpu_ticks\": %lld, \"cpu_s\": %.3f, "
      "\"cpu_us_per_echo\": %.2f, \"cpu_us_per_msg\": %.2f, \"sys_us_per_msg\": %.2f, \"sched_us_per_msg\": %.2f, \"proxy_core_share\": %.1f, "
      "\"errors\": %" PRIu64 ", \"first_error\": \"%s\"%s}\n",
      ok ? "true" : "false", K, opened, o.size, o.rate, echoes, secs, secs > 0 ? double(echoes) / secs : 0.0,
      rtt.pct(50), rtt.pct(90), rtt.pct(99), rtt.pct(99.9), rtt.max(), rtt.mean(), late, p1.ticks - p0.ticks,
      cpu_s, echoes && !o.pids.empty() ? cpu_s * 1e6 / double(echoes) : 0.0,
      echoes && !o.pids.empty() ? cpu_s * 1e6 / double(2 * echoes) : 0.0,
      echoes && !o.pids.empty() ? double(p1.sys_ticks - p0.sys_ticks) / clk * 1e6 / double(2 * echoes) : 0.0,
      echoes && !o.pids.empty() ? sched_s * 1e6 / double(2 * echoes) : 0.0,
      secs > 0 && !o.pids.empty() ? 100.0 * sched_s / secs : 0.0, cl.errors, cl.first_error.c_str(),
      cpu_busy_json(p0, p1).c_str());
  if (!ok && cl.first_error.empty()) std::fprintf(stderr, "ws_load echo: timed out (phase %d, %lld of %lld)\n", phase, done, target());
  return ok ? 0 : 1;
}

int run_idle(const cli_opts& o) {
  client cl;
  if (!parse_addr(o.connect, cl.dst)) { std::fprintf(stderr, "bad --connect %s\n", o.connect.c_str()); return 2; }
  raise_nofile();
  cl.host_header = o.connect;
  cl.path = o.path;
  cl.size = o.size;
  cl.ep = epoll_create1(EPOLL_CLOEXEC);
  const int K = o.conns < 0 ? 5000 : o.conns;
  const std::int64_t deadline = now_ns() + std::int64_t(o.timeout * 1e9);
  const proc_sample before = sample_procs(o.pids);
  const long long ws_before = stat_field(replica_stats(o.replica), "ws_open");
  const std::int64_t t_start = now_ns();
  std::vector<std::unique_ptr<cli_conn>> conns;
  conns.reserve(std::size_t(K));
  int started = 0, ready = 0, in_flight = 0;
  auto start_more = [&] {
    while (in_flight < o.batch && started < K) {
      conns.push_back(std::make_unique<cli_conn>());
      conns.back()->idx = started++;
      ++in_flight;
      if (!cl.start(conns.back().get())) --in_flight;
    }
  };
  auto settle = [&](cli_conn* c) {
    c->echoed_once = true;
    ++ready;
    --in_flight;
  };
  bool sampling = false;
  int sample_ok = 0;
  auto on_open = [&](cli_conn* c) {
    if (o.echo) cl.send_msg(c, 0);
    else settle(c);
  };
  auto on_echo = [&](cli_conn* c, std::int64_t) {
    if (sampling) { ++sample_ok; return; }
    settle(c);
  };
  std::vector<epoll_event> evs(1024);
  auto pump = [&](auto done) {
    while (!done() && now_ns() < deadline) {
      const int n = epoll_wait(cl.ep, evs.data(), int(evs.size()), 200);
      if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
      for (int i = 0; i < n; ++i) {
        auto* c = static_cast<cli_conn*>(evs[i].data.ptr);
        const bool was_dead = c->st == cstate::dead;
        cl.on_event(c, evs[i].events, on_open, on_echo);
        if (!was_dead && c->st == cstate::dead && !c->echoed_once && !sampling) --in_flight;
      }
      if (!sampling) start_more();
    }
  };
  start_more();
  pump([&] { return started == K && in_flight == 0; });
  const std::int64_t t_open = now_ns();
  const proc_sample opened = sample_procs(o.pids);
  // idle: nothing moves (the loop only watches for tunnels that end)
  const std::int64_t settle_until = now_ns() + std::int64_t(o.settle_ms * 1e6);
  pump([&] { return now_ns() >= settle_until; });
  const proc_sample after = sample_procs(o.pids);
  const long long ws_after = stat_field(replica_stats(o.replica), "ws_open");
  // a sample, spread over all, must still echo
  sampling = true;
  int sample_n = 0;
  const int step = std::max(1, ready / std::max(1, o.sample));
  for (auto& c : conns) {
    if (c->st != cstate::open || c->idx % step != 0 || sample_n >= o.sample) continue;
    ++sample_n;
    cl.send_msg(c.get(), 0);
  }
  const std::int64_t sample_deadline = std::min(deadline, now_ns() + std::int64_t(10e9));
  while (sample_ok < sample_n && now_ns() < sample_deadline) {
    const int n = epoll_wait(cl.ep, evs.data(), int(evs.size()), 200);
    for (int i = 0; i < n; ++i) cl.on_event(static_cast<cli_conn*>(evs[i].data.ptr), evs[i].events, on_open, on_echo);
  }
  const double clk = double(sysconf(_SC_CLK_TCK));
  const double open_s = double(t_open - t_start) / 1e9;
  const bool ok = ready == K && sample_ok == sample_n && cl.errors == 0;
  std::printf(
      "{\"ok\": %s, \"conns\": %d, \"open\": %d, \"echo_each\": %s, \"open_seconds\": %.3f, \"opens_per_s\": %.0f, "
      "\"rss_before_kib\": %lld, \"rss_opened_kib\": %lld, \"rss_after_kib\": %lld, \"kib_per_tunnel\": %.3f, "
      "\"bytes_per_tunnel\": %.0f, \"cpu_us_per_open\": %.1f, \"replica_ws_opened\": %lld, \"sample\": %d, \"sample_ok\": %d, \"errors\": %" PRIu64
      ", \"first_error\": \"%s\"}\n",
      ok ? "true" : "false", K, ready, o.echo ? "true" : "false", open_s, open_s > 0 ? ready / open_s : 0.0,
      before.rss_kib, opened.rss_kib, after.rss_kib,
      ready ? double(after.rss_kib - before.rss_kib) / ready : 0.0,
      ready ? double(after.rss_kib - before.rss_kib) * 1024.0 / ready : 0.0,
      ready && !o.pids.empty() ? double(opened.ticks - before.ticks) / clk * 1e6 / ready : 0.0,
      ws_before >= 0 && ws_after >= 0 ? ws_after - ws_before : -1, sample_n, sample_ok,
      cl.errors, cl.first_error.c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;  // the kernel closes every socket
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ws_load serve|echo|idle [options] (see the head of bench/ws_load.cpp)\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::string listen;
  cli_opts o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--listen") listen = val();
    else if (a == "--connect") o.connect = val();
    else if (a == "--path") o.path = val();
    else if (a == "--replica-stats") o.replica = val();
    else if (a == "--conns") o.conns = std::atoi(val().c_str());
    else if (a == "--batch") o.batch = std::max(1, std::atoi(val().c_str()));
    else if (a == "--sample") o.sample = std::atoi(val().c_str());
    else if (a == "--messages") o.messages = std::atoll(val().c_str());
    else if (a == "--warmup") o.warmup = std::atoll(val().c_str());
    else if (a == "--size") o.size = std::size_t(std::max(16, std::atoi(val().c_str())));
    else if (a == "--rate") o.rate = std::atof(val().c_str());
    else if (a == "--timeout") o.timeout = std::atof(val().c_str());
    else if (a == "--settle-ms") o.settle_ms = std::atof(val().c_str());
    else if (a == "--no-echo") o.echo = false;
    else if (a == "--pid") o.pids.push_back(std::atoi(val().c_str()));
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_TIMERSLACK, 1UL);  // the paced schedule's timerfd: no 50 us default slack
  if (mode == "serve") return serve(listen);
  if (mode == "echo") return run_echo(o);
  if (mode == "idle") return run_idle(o);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
