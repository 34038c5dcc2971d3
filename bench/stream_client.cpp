// bench/stream.sh's SSE client: N concurrent token streams, one thread, epoll, libc only. A Python
// client saturates one core near 7k events/s and its own queueing then dominates every delay
// figure; this one keeps the direct run's p99 well under a millisecond (bench/README.md
// "Token streams at scale").
//
//   ingressd-bench-stream-client --port P [--n 500] [--warmup 3] [--duration 10] [--pid PID]...
//
// N slots each run streams back to back: a new connection (non-blocking connect, from one of 8
// loopback source addresses so that TIME_WAIT does not exhaust the ports), one POST to
// PATH?ev=K&rate=R (K uniform in [ev-min, ev-max] events, R uniform in [rate-min, rate-max]
// events/s, drawn per stream), the chunked SSE response read to its last chunk, then close and
// start the next: new streams arrive as old ones end. The first stream of each slot starts within
// --ramp s and is cut short at random, so ends (and new arrivals) are spread from the start.
//
// Measured over [warmup, warmup + duration) (an event counts when it arrives in the window):
//   delay    arrival - t, where t is the replica's CLOCK_MONOTONIC just before its write() of the
//            event (bench/stream_replica.cpp) and arrival is CLOCK_MONOTONIC just after the read()
//            that completed the event; both on this machine, same clock.
//   batched  an event completed by the same read() as the previous event of its stream although
//            the replica's writes of the two were >= 1 ms apart (its schedule has them 20-50 ms
//            apart): a proxy held one back and sent them together. Must be 0.
//   stalled  streams with 3 events in a row each delayed more than --stall-ms beyond the median
//            delay of all events the replica wrote in the same 50 ms: the check for the "few
//            streams exploded" failure (bench/README.md). Against the moment's median, so that a
//            host that stalls the proxy (other tenants) does not count, and a stream the proxy
//            leaves behind while it serves the others does; 3 in a row, so that the replica or
//            the client preempted between its clock read and its write or read (one event late,
//            seen in direct runs on a busy host) does not either. The worst are listed.
//   ttft     connect() start -> arrival of the first event, for streams that started in the window.
//   cpu      utime + stime of the --pid processes (/proc/PID/stat) over the window -> per event.
//   rss      VmRSS of the --pid processes before the first connection (idle) and at the end of the
//            window (N streams open) -> bytes per open stream.
// Prints one JSON object.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

std::int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct options {
  std::string host = "127.0.0.1", path = "/stream/v1/chat/completions";
  int port = 0, n = 500, ev_min = 100, ev_max = 400, rate_min = 20, rate_max = 50, src_ips = 8;
  double warmup = 3, duration = 10, ramp = 1, stall_ms = 100;
  double pause_share = 0, pause_ms = 3000;
  unsigned seed = 1;
  std::vector<int> pids, aux_pids;
};

enum class phase { idle, connecting, head, body };

struct stream {
  int fd = -1;
  phase ph = phase::idle;
  std::string buf;              // bytes not parsed yet (head, chunk framing)
  std::string sse;              // chunk data not yet a whole event
  bool in_data = false;         // inside a chunk's data
  std::size_t chunk_left = 0;   // data bytes (+2 for CRLF) left of the current chunk
  std::int64_t started = 0;     // connect() start
  std::int64_t last_t = 0;      // write time of the previous event
  std::uint64_t last_read = 0;  // read() serial that completed the previous event
  int events = 0;               // events received
  bool first_seen = false;
  std::uint32_t serial = 0;     // index into `infos`
  int pause_at = -1;            // --pause-share: stop reading after this many events
  bool pause_now = false;
};

// Per stream, for the stalled-stream report
struct stream_info {
  int port = 0, events = 0;
  double started_s = 0;
  std::int64_t resumed = 0;  // a paused stream: when the client read again (events written before are the client's delay)
};
// Per event that arrived in the window
struct sample_ev {
  std::int64_t t;  // replica write time
  std::uint32_t delay, serial;  // delay in µs
  int seq;
};
std::vector<stream_info> infos;
std::vector<sample_ev> samples;

options opt;
std::vector<stream> slots;
std::vector<int> fd_slot;
int ep = -1;
std::mt19937 rng;
std::int64_t t0, w0, w1;
std::uint64_t read_serial = 0;
std::vector<std::uint32_t> delays;     // µs
std::vector<std::uint32_t> ttfts;      // µs
std::vector<std::uint32_t> late;       // replica lateness t - d, µs
std::uint64_t batched = 0, errors = 0, started_in_window = 0, completed = 0, started_total = 0;
std::string first_error;
using start_at = std::pair<std::int64_t, int>;
std::priority_queue<start_at, std::vector<start_at>, std::greater<>> starts;
// paused streams to read again: (when, slot, serial)
std::priority_queue<std::tuple<std::int64_t, int, std::uint32_t>, std::vector<std::tuple<std::int64_t, int, std::uint32_t>>,
                    std::greater<>>
    resumes;
std::uint64_t paused_streams = 0;

bool in_window(std::int64_t t) { return t >= w0 && t < w1; }

// ns -> µs in 32 bits (up to 71 minutes)
std::uint32_t us32(std::int64_t ns) { return std::uint32_t(std::clamp<std::int64_t>(ns / 1000, 0, 0xffffffffLL)); }

void note_error(const std::string& what) {
  ++errors;
  if (first_error.empty()) first_error = what;
}

// A stream's end (complete or not): its delay record joins the stalled-stream report.
void finish(stream& s, int slot, bool ok) {
  if (s.fd >= 0) {
    epoll_ctl(ep, EPOLL_CTL_DEL, s.fd, nullptr);
    close(s.fd);
    fd_slot[s.fd] = -1;
  }
  infos[s.serial].events = s.events;
  if (ok) ++completed;
  s = stream{};
  // the next stream of this slot: at once (or after 10 ms when this one failed)
  starts.push({now_ns() + (ok ? 0 : 10000000), slot});
}

void start_stream(int slot, bool first) {
  stream& s = slots[slot];
  s = stream{};
  int ev = std::uniform_int_distribution<int>(opt.ev_min, opt.ev_max)(rng);
  const int rate = std::uniform_int_distribution<int>(opt.rate_min, opt.rate_max)(rng);
  if (first) ev = std::uniform_int_distribution<int>(1, ev)(rng);  // spread the first ends
  if (opt.pause_share > 0 && ev > 20 && std::uniform_real_distribution<double>(0, 1)(rng) < opt.pause_share)
    s.pause_at = std::uniform_int_distribution<int>(5, ev - 10)(rng);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    note_error(std::string("socket: ") + std::strerror(errno));
    starts.push({now_ns() + 100000000, slot});
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (s.pause_at >= 0) {
    // a small receive buffer (set before connect: the window scale follows it), so that a pause
    // closes the window within a second: the proxy's socket buffer fills and its writes block
    const int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  }
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(0x7f000100u + 1 + unsigned(slot % opt.src_ips));  // 127.0.1.x
  bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(std::uint16_t(opt.port));
  inet_pton(AF_INET, opt.host.c_str(), &dst.sin_addr);
  s.fd = fd;
  s.started = now_ns();
  s.serial = std::uint32_t(infos.size());
  infos.push_back({0, 0, (s.started - t0) / 1e9});
  ++started_total;
  if (in_window(s.started)) ++started_in_window;
  if (std::size_t(fd) >= fd_slot.size()) fd_slot.resize(std::size_t(fd) + 1024, -1);
  fd_slot[fd] = slot;
  epoll_event e{};
  e.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
  e.data.fd = fd;
  epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
  s.ph = phase::connecting;
  s.buf = "POST " + opt.path + "?ev=" + std::to_string(ev) + "&rate=" + std::to_string(rate) +
          " HTTP/1.1\r\nHost: " + opt.host + "\r\nContent-Type: application/json\r\nContent-Length: 29\r\n\r\n" +
          "{\"model\":\"llm\",\"stream\":true}";
  if (connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0 && errno != EINPROGRESS) {
    note_error(std::string("connect: ") + std::strerror(errno));
    finish(s, slot, false);
  }
}

std::int64_t field(const std::string& ev, const char* key) {
  const auto p = ev.find(key);
  return p == std::string::npos ? -1 : std::strtoll(ev.c_str() + p + std::strlen(key), nullptr, 10);
}

// One whole event arrived at `at`, completed by read() number `serial`.
void on_event(stream& s, const std::string& ev, std::int64_t at, std::uint64_t serial) {
  const std::int64_t t = field(ev, "\"t\":");
  if (t < 0) return;  // [DONE]
  const std::int64_t d = field(ev, "\"d\":");
  const int seq = int(field(ev, "\"i\":"));
  const std::int64_t delay = at - t;
  if (!s.first_seen) {
    s.first_seen = true;
    if (in_window(s.started)) ttfts.push_back(us32(at - s.started));
  }
  if (s.events + 1 == s.pause_at) s.pause_now = true;
  // a paused stream's events written before it was read again are late because of the client
  if (in_window(at) && !(s.pause_at >= 0 && (infos[s.serial].resumed == 0 || t < infos[s.serial].resumed))) {
    delays.push_back(us32(delay));
    late.push_back(us32(t - d));
    // (a paused stream's catch-up after the client reads again is not the proxy's batching)
    if (s.pause_at < 0 && s.events > 0 && serial == s.last_read && t - s.last_t >= 1000000) ++batched;
    samples.push_back({t, us32(delay), s.serial, seq});
  }
  ++s.events;
  s.last_t = t;
  s.last_read = serial;
}

// Parses what is buffered; returns false on a protocol error, sets done at the last chunk.
bool parse(stream& s, std::int64_t at, std::uint64_t serial, bool& done) {
  if (s.ph == phase::head) {
    const auto end = s.buf.find("\r\n\r\n");
    if (end == std::string::npos) return s.buf.size() < 16384;
    if (s.buf.compare(0, 12, "HTTP/1.1 200") != 0) {
      note_error("status: " + s.buf.substr(0, s.buf.find('\r')));
      return false;
    }
    s.buf.erase(0, end + 4);
    s.ph = phase::body;
  }
  std::size_t p = 0;
  for (;;) {
    if (!s.in_data) {
      const auto eol = s.buf.find("\r\n", p);
      if (eol == std::string::npos) break;
      const std::size_t size = std::strtoul(s.buf.c_str() + p, nullptr, 16);
      if (size == 0) {  // the last chunk (no trailers here): need its final CRLF
        if (s.buf.size() < eol + 4) break;
        done = true;
        return true;
      }
      p = eol + 2;
      s.in_data = true;
      s.chunk_left = size + 2;
    }
    const std::size_t k = std::min(s.chunk_left, s.buf.size() - p);
    if (k == 0) break;
    // the data part (not the CRLF after it) goes to the SSE text
    const std::size_t data_k = std::min(k, s.chunk_left > 2 ? s.chunk_left - 2 : 0);
    s.sse.append(s.buf, p, data_k);
    p += k;
    s.chunk_left -= k;
    if (s.chunk_left == 0) s.in_data = false;
    for (std::size_t e; (e = s.sse.find("\n\n")) != std::string::npos;) {
      on_event(s, s.sse.substr(0, e), at, serial);
      s.sse.erase(0, e + 2);
    }
  }
  s.buf.erase(0, p);
  return true;
}

void on_ready(int fd, std::uint32_t events) {
  const int slot = fd_slot[fd];
  if (slot < 0) return;
  stream& s = slots[slot];
  if (s.ph == phase::connecting) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
      note_error(std::string("connect: ") + std::strerror(err));
      return finish(s, slot, false);
    }
    sockaddr_in local{};
    socklen_t ll = sizeof local;
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll);
    infos[s.serial].port = ntohs(local.sin_port);
    // the request is small: one write
    if (write(fd, s.buf.data(), s.buf.size()) != ssize_t(s.buf.size())) {
      note_error("request write");
      return finish(s, slot, false);
    }
    s.buf.clear();
    s.ph = phase::head;
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP;
    e.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e);
    return;
  }
  if (!(events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) return;
  char rbuf[65536];
  const ssize_t r = read(fd, rbuf, sizeof rbuf);
  const std::int64_t at = now_ns();
  if (r < 0 && errno == EAGAIN) return;
  if (r <= 0) {
    note_error(r == 0 ? "closed mid-stream" : std::string("read: ") + std::strerror(errno));
    return finish(s, slot, false);
  }
  s.buf.append(rbuf, std::size_t(r));
  bool done = false;
  if (!parse(s, at, ++read_serial, done)) return finish(s, slot, false);
  if (done) return finish(s, slot, true);
  if (s.pause_now) {
    // stop reading this stream for pause_ms: the proxy's writes fill the socket buffers and
    // must wait for the client (its blocked-write path); the stream must catch up at once after
    s.pause_now = false;
    epoll_event e{};
    e.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e);
    resumes.push({at + std::int64_t(opt.pause_ms * 1e6), slot, s.serial});
    ++paused_streams;
  }
}

struct proc_sample {
  long long ticks = 0, sys_ticks = 0, rss_kib = 0, runq_ns = 0;
};

// Time the process's threads spent runnable but not running (/proc/PID/task/TID/schedstat, field
// 2): a proxy that waits for its core because other processes hold it, as opposed to one that
// stalls by itself.
long long runq_wait_ns(int pid) {
  long long sum = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task/";
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream ss(dir + e->d_name + "/schedstat");
    long long run = 0, wait = 0;
    if (ss >> run >> wait) sum += wait;
  }
  closedir(d);
  return sum;
}

proc_sample sample(const std::vector<int>& pids) {
  proc_sample out;
  for (int pid : pids) {
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(st, line);
    const auto rp = line.rfind(')');
    if (rp != std::string::npos) {
      std::istringstream in(line.substr(rp + 2));
      std::string f;
      long long utime = 0, stime = 0;
      for (int i = 3; i <= 15 && in >> f; ++i) {  // field 3 is the state; 14 utime, 15 stime
        if (i == 14) utime = std::atoll(f.c_str());
        if (i == 15) stime = std::atoll(f.c_str());
      }
      out.ticks += utime + stime;
      out.sys_ticks += stime;
    }
    out.runq_ns += runq_wait_ns(pid);
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    while (std::getline(status, line))
      if (line.rfind("VmRSS:", 0) == 0) out.rss_kib += std::atoll(line.c_str() + 6);
  }
  return out;
}

// busy and total jiffies of each core (/proc/stat cpuN lines; idle and iowait are not busy)
std::vector<std::pair<long long, long long>> cores() {
  std::vector<std::pair<long long, long long>> out;
  std::ifstream st("/proc/stat");
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
    std::istringstream in(line.substr(line.find(' ')));
    long long v, total = 0, idle = 0;
    for (int i = 0; in >> v; ++i) {
      total += v;
      if (i == 3 || i == 4) idle += v;
    }
    out.emplace_back(total - idle, total);
  }
  return out;
}

double pct(std::vector<std::uint32_t>& v, double q) {
  if (v.empty()) return -1;
  const std::size_t k = std::min(v.size() - 1, std::size_t(q * double(v.size())));
  std::nth_element(v.begin(), v.begin() + long(k), v.end());
  return v[k];  // µs
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--host") opt.host = v;
    else if (k == "--port") opt.port = std::atoi(v.c_str());
    else if (k == "--path") opt.path = v;
    else if (k == "--n") opt.n = std::atoi(v.c_str());
    else if (k == "--warmup") opt.warmup = std::atof(v.c_str());
    else if (k == "--duration") opt.duration = std::atof(v.c_str());
    else if (k == "--ramp") opt.ramp = std::atof(v.c_str());
    else if (k == "--ev-min") opt.ev_min = std::atoi(v.c_str());
    else if (k == "--ev-max") opt.ev_max = std::atoi(v.c_str());
    else if (k == "--rate-min") opt.rate_min = std::atoi(v.c_str());
    else if (k == "--rate-max") opt.rate_max = std::atoi(v.c_str());
    else if (k == "--stall-ms") opt.stall_ms = std::atof(v.c_str());
    else if (k == "--pause-share") opt.pause_share = std::atof(v.c_str());
    else if (k == "--pause-ms") opt.pause_ms = std::atof(v.c_str());
    else if (k == "--seed") opt.seed = unsigned(std::atoi(v.c_str()));
    else if (k == "--pid") opt.pids.push_back(std::atoi(v.c_str()));
    else if (k == "--aux-pid") opt.aux_pids.push_back(std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (opt.port == 0) {
    std::fprintf(stderr, "usage: %s --port P [--n N] [--warmup S] [--duration S] [--pid PID]...\n", argv[0]);
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  rng.seed(opt.seed);
  slots.resize(std::size_t(opt.n));
  ep = epoll_create1(EPOLL_CLOEXEC);

  const proc_sample idle = sample(opt.pids);
  t0 = now_ns();
  w0 = t0 + std::int64_t(opt.warmup * 1e9);
  w1 = w0 + std::int64_t(opt.duration * 1e9);
  for (int i = 0; i < opt.n; ++i) starts.push({t0 + std::int64_t(opt.ramp * 1e9 * i / opt.n), i});

  proc_sample at_w0, at_w1, aux0, aux1, self0, self1;
  const std::vector<int> self{int(getpid())};
  std::vector<std::pair<long long, long long>> cores0, cores1;
  bool w0_done = false, w1_done = false;
  rusage ru0{};
  std::vector<epoll_event> ready(4096);
  std::size_t open_at_w1 = 0;
  while (!w1_done) {
    std::int64_t now = now_ns();
    while (!starts.empty() && starts.top().first <= now) {
      const int slot = starts.top().second;
      const bool first = slots[slot].started == 0 && started_total < std::uint64_t(opt.n);
      starts.pop();
      start_stream(slot, first);
    }
    while (!resumes.empty() && std::get<0>(resumes.top()) <= now) {
      const auto [when, slot, serial] = resumes.top();
      resumes.pop();
      stream& s = slots[slot];
      if (s.serial != serial || s.fd < 0) continue;
      epoll_event e{};
      e.events = EPOLLIN | EPOLLRDHUP;
      e.data.fd = s.fd;
      epoll_ctl(ep, EPOLL_CTL_MOD, s.fd, &e);
      infos[serial].resumed = now_ns();
    }
    if (!w0_done && now >= w0) {
      at_w0 = sample(opt.pids);
      aux0 = sample(opt.aux_pids);
      self0 = sample(self);
      cores0 = cores();
      getrusage(RUSAGE_SELF, &ru0);
      w0_done = true;
    }
    if (now >= w1) {
      at_w1 = sample(opt.pids);
      aux1 = sample(opt.aux_pids);
      self1 = sample(self);
      cores1 = cores();
      for (const auto& s : slots) open_at_w1 += s.ph == phase::body;
      w1_done = true;
      break;
    }
    std::int64_t next = w0_done ? w1 : w0;
    if (!starts.empty()) next = std::min(next, starts.top().first);
    if (!resumes.empty()) next = std::min(next, std::get<0>(resumes.top()));
    const int timeout_ms = int(std::max<std::int64_t>(0, (next - now + 999999) / 1000000));
    const int k = epoll_wait(ep, ready.data(), int(ready.size()), timeout_ms);
    for (int i = 0; i < k; ++i) on_ready(ready[i].data.fd, ready[i].events);
  }
  rusage ru1{};
  getrusage(RUSAGE_SELF, &ru1);
  for (auto& s : slots)
    if (s.fd >= 0) {
      infos[s.serial].events = s.events;
      close(s.fd);
    }
  // Stalled streams: an event's excess = its delay - the median delay of the events written in
  // the same 50 ms slot (all streams); a stream is stalled when its largest excess > stall_ms.
  const std::int64_t slot_ns = 50000000;
  std::vector<std::vector<std::uint32_t>> by_slot(std::size_t((w1 - w0) / slot_ns + 64));
  const auto slot_of = [&](std::int64_t t) {
    return std::size_t(std::clamp<std::int64_t>((t - w0) / slot_ns + 32, 0, std::int64_t(by_slot.size()) - 1));
  };
  for (const auto& e : samples) by_slot[slot_of(e.t)].push_back(e.delay);
  std::vector<std::uint32_t> slot_median(by_slot.size(), 0);
  for (std::size_t i = 0; i < by_slot.size(); ++i) {
    auto& v = by_slot[i];
    if (v.empty()) continue;
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    slot_median[i] = v[v.size() / 2];
  }
  struct worst {
    std::int64_t excess, delay, median;
    int seq;
    std::uint32_t serial;
  };
  // per stream: the largest excess that 3 events in a row all reached (their minimum), sliding
  std::vector<worst> per_stream(infos.size(), worst{-1, 0, 0, -1, 0});
  std::vector<std::array<std::int64_t, 2>> prev(infos.size(), {-1, -1});  // the two previous excesses
  std::vector<std::uint32_t> excesses;
  excesses.reserve(samples.size());
  for (const auto& e : samples) {
    const std::int64_t med = slot_median[slot_of(e.t)], ex = std::int64_t(e.delay) - med;
    excesses.push_back(std::uint32_t(std::max<std::int64_t>(ex, 0)));
    auto& p = prev[e.serial];
    const std::int64_t run3 = std::min({ex, p[0], p[1]});
    if (run3 > per_stream[e.serial].excess) per_stream[e.serial] = {run3, e.delay, med, e.seq, e.serial};
    p = {ex, p[0]};
  }
  std::vector<worst> worst_streams;
  for (const auto& w : per_stream)
    if (w.excess > std::int64_t(opt.stall_ms * 1e3)) worst_streams.push_back(w);
  const std::size_t stalled = worst_streams.size();

  const double ticks_per_s = double(sysconf(_SC_CLK_TCK));
  const double cpu_s = double(at_w1.ticks - at_w0.ticks) / ticks_per_s;
  const auto tv = [](const timeval& t) { return double(t.tv_sec) + t.tv_usec / 1e6; };
  const double client_cpu = tv(ru1.ru_utime) + tv(ru1.ru_stime) - tv(ru0.ru_utime) - tv(ru0.ru_stime);
  const std::size_t nev = delays.size();
  std::string busy = "[";
  for (std::size_t i = 0; i < cores1.size() && i < cores0.size(); ++i) {
    const long long dt = cores1[i].second - cores0[i].second;
    char b[32];
    std::snprintf(b, sizeof b, "%s%.1f", i ? "," : "", dt > 0 ? 100.0 * double(cores1[i].first - cores0[i].first) / double(dt) : 0.0);
    busy += b;
  }
  busy += "]";
  std::sort(worst_streams.begin(), worst_streams.end(), [](auto& a, auto& b) { return a.excess > b.excess; });
  std::string worst_json = "[";
  for (std::size_t i = 0; i < std::min<std::size_t>(5, worst_streams.size()); ++i) {
    const auto& w = worst_streams[i];
    const auto& info = infos[w.serial];
    char b[300];
    std::snprintf(b, sizeof b,
                  "%s{\"excess_ms\":%.1f,\"delay_ms\":%.1f,\"median_then_ms\":%.1f,\"seq\":%d,\"events\":%d,"
                  "\"port\":%d,\"started_s\":%.2f}",
                  i ? "," : "", w.excess / 1e3, w.delay / 1e3, w.median / 1e3, w.seq, info.events, info.port,
                  info.started_s);
    worst_json += b;
  }
  worst_json += "]";
  std::string err = first_error;
  for (auto& ch : err)
    if (ch == '"' || ch == '\\' || ch < ' ') ch = ' ';
  const double dmax = delays.empty() ? -1 : double(*std::max_element(delays.begin(), delays.end()));
  std::printf(
      "{\"n\":%d,\"window_s\":%.2f,\"events\":%zu,\"events_per_s\":%.1f,"
      "\"delay_p50_us\":%.1f,\"delay_p99_us\":%.1f,\"delay_p999_us\":%.1f,\"delay_max_us\":%.1f,"
      "\"batched\":%" PRIu64 ",\"stalled_streams\":%zu,\"stall_ms\":%.0f,\"excess_p999_us\":%.1f,\"worst\":%s,"
      "\"ttft_n\":%zu,\"ttft_p50_us\":%.1f,\"ttft_p99_us\":%.1f,"
      "\"replica_late_p99_us\":%.1f,\"streams_started\":%" PRIu64 ",\"streams_completed\":%" PRIu64
      ",\"errors\":%" PRIu64 ",\"first_error\":\"%s\","
      "\"proxy_cpu_s\":%.3f,\"proxy_sys_share\":%.3f,\"cpu_us_per_event\":%.2f,\"events_per_core_s\":%.0f,"
      "\"rss_idle_kib\":%lld,\"rss_kib\":%lld,\"open_streams\":%zu,\"rss_bytes_per_stream\":%.0f,"
      "\"paused_streams\":%" PRIu64 ",\"client_cpu_pct\":%.1f,\"aux_cpu_pct\":%.1f,\"core_busy_pct\":%s,"
      "\"proxy_runq_ms_per_s\":%.1f,\"replica_runq_ms_per_s\":%.1f,\"client_runq_ms_per_s\":%.1f}\n",
      opt.n, opt.duration, nev, nev / opt.duration, pct(delays, 0.5), pct(delays, 0.99), pct(delays, 0.999), dmax,
      batched, stalled, opt.stall_ms, pct(excesses, 0.999), worst_json.c_str(), ttfts.size(), pct(ttfts, 0.5), pct(ttfts, 0.99),
      pct(late, 0.99), started_in_window, completed, errors, err.c_str(), cpu_s,
      at_w1.ticks > at_w0.ticks ? double(at_w1.sys_ticks - at_w0.sys_ticks) / double(at_w1.ticks - at_w0.ticks) : 0.0,
      nev && cpu_s > 0 ? cpu_s * 1e6 / double(nev) : 0.0, cpu_s > 0 ? nev / cpu_s : 0.0, idle.rss_kib, at_w1.rss_kib,
      open_at_w1, open_at_w1 ? (at_w1.rss_kib - idle.rss_kib) * 1024.0 / double(open_at_w1) : 0.0,
      paused_streams, 100.0 * client_cpu / opt.duration, 100.0 * double(aux1.ticks - aux0.ticks) / ticks_per_s / opt.duration,
      busy.c_str(), double(at_w1.runq_ns - at_w0.runq_ns) / 1e6 / opt.duration,
      double(aux1.runq_ns - aux0.runq_ns) / 1e6 / opt.duration, double(self1.runq_ns - self0.runq_ns) / 1e6 / opt.duration);
  return 0;
}
