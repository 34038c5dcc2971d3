// Fake gRPC replica and stream client for bench/grpc.sh (issue #20), on nghttp2 directly.
//
//   grpc_replica serve  --listen HOST:PORT [--payload-bytes 100] [--hold-back]
//   grpc_replica stream --port P [--host H] [--streams 50] [--messages 200] [--interval-ms 20]
//                       [--conns 1] [--app NAME] [--no-stagger] [--hold-ms 10]
//   grpc_replica call   --port P [--host H] --path /svc/Method [--data TEXT] [--app NAME]
//
// serve: one thread, one epoll loop, h2c with prior knowledge (no TLS, no Upgrade). Methods:
//   /bench.Echo/Unary   one message back: the request message (echo), or payload-bytes of 'x' when
//                       the request message is empty; trailers grpc-status 0
//   /bench.Echo/Stream  request message "n=N interval_us=I offset_us=O": N messages of
//                       payload-bytes, the first O us after the request ended, then one every I us
//                       (fixed schedule, no drift); each carries its sequence number (bytes 0-7) and
//                       the replica's CLOCK_MONOTONIC / CLOCK_REALTIME time when it was made (ns,
//                       bytes 8-15 / 16-23, little-endian); trailers grpc-status 0 after the last
//   /ray.serve.RayServeAPIService/Healthz   "\n\x07success" (HealthzResponse{message:"success"})
//   /bench.Echo/Stats   text "conns_accepted=.. conns_open=.. unary=.. stream=.. stream_msgs=..
//                       healthz=.. other=.. send_windows=W,W,.." (the bench reads the calls the
//                       replica served; W: the connection-level send window each other open
//                       connection's peer has left the replica)
//   anything else       trailers-only response, grpc-status 12 (UNIMPLEMENTED)
//   --hold-back: a stream's even-numbered messages (0, 2, ...) are made on time but written only
//   with the next one, as a proxy that holds messages back would: the stream client must count
//   one held-back message per pair (bench/grpc.sh checks its detector with this)
//
// stream: the server-stream latency client. Opens --streams calls of /bench.Echo/Stream over
// --conns HTTP/2 connections (streams spread round robin), each asking for --messages messages
// --interval-ms apart, start offsets staggered over one interval (unless --no-stagger) so that
// the messages of all streams do not leave in one burst. Per message: delay = the client's
// CLOCK_MONOTONIC right after the recv() that completed it minus the replica's stamp. A message is
// HELD BACK when it completed in the same recv() as the stream's next message although the replica
// made them >= --hold-ms apart: a proxy sat on it until the next one came (or a process on the way,
// the client included, did not get a CPU for that long: client_runq_wait_ms is the client's own
// time waiting for its core). Prints one JSON line.
//
// call: one call, prints the response messages (as text, non-printable bytes escaped), the
// grpc-status and grpc-message; exit 0 when grpc-status is 0.
#include <nghttp2/nghttp2.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

int64_t clock_ns(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}
int64_t mono_ns() { return clock_ns(CLOCK_MONOTONIC); }

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "grpc_replica: %s: %s\n", what, strerror(errno));
  exit(1);
}

void put_le64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = char((v >> (8 * i)) & 0xff);
}
uint64_t get_le64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}
// a gRPC length-prefixed message: flag 0 (uncompressed), 4-byte big-endian length, bytes
std::string grpc_frame(const std::string& msg) {
  std::string f(5, '\0');
  uint32_t n = uint32_t(msg.size());
  f[1] = char(n >> 24); f[2] = char(n >> 16); f[3] = char(n >> 8); f[4] = char(n);
  return f + msg;
}
uint32_t get_be32(const char* p) {
  return (uint32_t(uint8_t(p[0])) << 24) | (uint32_t(uint8_t(p[1])) << 16) | (uint32_t(uint8_t(p[2])) << 8) |
         uint32_t(uint8_t(p[3]));
}

nghttp2_nv make_nv(const char* name, const std::string& value) {
  return nghttp2_nv{(uint8_t*)name, (uint8_t*)value.data(), strlen(name), value.size(),
                    NGHTTP2_NV_FLAG_NO_COPY_NAME};
}
nghttp2_nv make_nv(const char* name, const char* value) {
  return nghttp2_nv{(uint8_t*)name, (uint8_t*)value, strlen(name), strlen(value),
                    NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE};
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool parse_hostport(const std::string& s, sockaddr_in* sa) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(uint16_t(atoi(s.c_str() + colon + 1)));
  return inet_pton(AF_INET, s.substr(0, colon).c_str(), &sa->sin_addr) == 1;
}

// ============================================================================ serve

namespace srv {

enum class Kind { Unary, Stream, Healthz, Stats, Other };

struct Conn;
struct Stream {
  Conn* conn = nullptr;
  int32_t id = 0;
  Kind kind = Kind::Other;
  std::string path, req, out;
  size_t off = 0;
  bool finished = false;  // no more messages will be added to out
  int n = 0, sent = 0;
  int64_t interval_ns = 0, next_ns = 0;
  bool timer = false;
};
struct Conn {
  int fd = -1;
  nghttp2_session* s = nullptr;
  std::string wbuf;
  size_t woff = 0;
  bool epollout = false;
  bool dirty = false;
  std::unordered_map<int32_t, Stream*> streams;
};

struct {
  uint64_t conns_accepted = 0, conns_open = 0, unary = 0, stream = 0, stream_msgs = 0, healthz = 0, other = 0;
} stats;

int ep = -1, tfd = -1, lfd = -1;
size_t payload_bytes = 100;
bool hold_back = false;
std::string fixed_payload;
std::set<std::pair<int64_t, Stream*>> timers;
std::vector<Conn*> dirty;
std::set<Conn*> conns;
volatile sig_atomic_t stop = 0;

void mark_dirty(Conn* c) {
  if (!c->dirty) { c->dirty = true; dirty.push_back(c); }
}

void arm_timer() {
  itimerspec its{};
  if (!timers.empty()) {
    int64_t t = timers.begin()->first;
    its.it_value.tv_sec = t / 1000000000LL;
    its.it_value.tv_nsec = t % 1000000000LL;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, nullptr);
}

void submit_trailer(nghttp2_session* s, int32_t id) {
  nghttp2_nv nv[] = {make_nv("grpc-status", "0")};
  nghttp2_submit_trailer(s, id, nv, 1);
}

ssize_t data_read(nghttp2_session* s, int32_t id, uint8_t* buf, size_t len, uint32_t* flags,
                  nghttp2_data_source* src, void*) {
  auto* st = static_cast<Stream*>(src->ptr);
  size_t avail = st->out.size() - st->off;
  if (avail == 0 && !st->finished) return NGHTTP2_ERR_DEFERRED;
  size_t n = std::min(avail, len);
  memcpy(buf, st->out.data() + st->off, n);
  st->off += n;
  if (st->off == st->out.size()) { st->out.clear(); st->off = 0; }
  if (st->finished && st->out.empty()) {
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    submit_trailer(s, id);
  }
  return ssize_t(n);
}

std::string first_message(const std::string& req) {
  if (req.size() < 5) return {};
  uint32_t n = get_be32(req.data() + 1);
  if (req.size() < 5 + size_t(n)) return {};
  return req.substr(5, n);
}

std::string stream_message(Stream* st) {
  std::string m(std::max<size_t>(payload_bytes, 24), 'x');
  put_le64(&m[0], uint64_t(st->sent));
  put_le64(&m[8], uint64_t(mono_ns()));
  put_le64(&m[16], uint64_t(clock_ns(CLOCK_REALTIME)));
  return grpc_frame(m);
}

void respond(Stream* st) {
  nghttp2_session* s = st->conn->s;
  if (st->kind == Kind::Other) {  // trailers-only
    nghttp2_nv nv[] = {make_nv(":status", "200"), make_nv("content-type", "application/grpc"),
                       make_nv("grpc-status", "12"), make_nv("grpc-message", "unknown method")};
    nghttp2_submit_response(s, st->id, nv, 4, nullptr);
    return;
  }
  nghttp2_nv nv[] = {make_nv(":status", "200"), make_nv("content-type", "application/grpc")};
  nghttp2_data_provider prd;
  prd.source.ptr = st;
  prd.read_callback = data_read;
  nghttp2_submit_response(s, st->id, nv, 2, &prd);
}

void handle(Stream* st) {
  const std::string& p = st->path;
  if (p == "/bench.Echo/Unary") {
    st->kind = Kind::Unary;
    ++stats.unary;
    std::string m = first_message(st->req);
    st->out = grpc_frame(m.empty() ? fixed_payload : m);
    st->finished = true;
  } else if (p == "/bench.Echo/Stream") {
    st->kind = Kind::Stream;
    ++stats.stream;
    std::string m = first_message(st->req);
    long long n = 10, interval_us = 20000, offset_us = 0;
    const char* q;
    if ((q = strstr(m.c_str(), "n="))) n = atoll(q + 2);
    if ((q = strstr(m.c_str(), "interval_us="))) interval_us = atoll(q + 12);
    if ((q = strstr(m.c_str(), "offset_us="))) offset_us = atoll(q + 10);
    st->n = int(std::max(0LL, std::min(n, 1000000LL)));
    st->interval_ns = std::max(0LL, interval_us) * 1000;
    if (st->n == 0) {
      st->finished = true;
    } else {
      st->next_ns = mono_ns() + std::max(0LL, offset_us) * 1000;
      st->timer = true;
      timers.insert({st->next_ns, st});
      arm_timer();
    }
  } else if (p == "/ray.serve.RayServeAPIService/Healthz") {
    st->kind = Kind::Healthz;
    ++stats.healthz;
    st->out = grpc_frame(std::string("\n\x07success", 9));
    st->finished = true;
  } else if (p == "/bench.Echo/Stats") {
    st->kind = Kind::Stats;
    char b[256];
    snprintf(b, sizeof b,
             "conns_accepted=%" PRIu64 " conns_open=%" PRIu64 " unary=%" PRIu64 " stream=%" PRIu64
             " stream_msgs=%" PRIu64 " healthz=%" PRIu64 " other=%" PRIu64,
             stats.conns_accepted, stats.conns_open, stats.unary, stats.stream, stats.stream_msgs,
             stats.healthz, stats.other);
    // the send windows the peers left us (connection level): a proxy that stops granting them
    // leaves the replica unable to send DATA (e.g. not consuming data of streams it reset)
    std::string m = b;
    m += " send_windows=";
    for (Conn* c : conns)
      if (c != st->conn) m += std::to_string(nghttp2_session_get_remote_window_size(c->s)) + ",";
    st->out = grpc_frame(m);
    st->finished = true;
  } else {
    st->kind = Kind::Other;
    ++stats.other;
  }
  respond(st);
}

int on_begin_headers(nghttp2_session* s, const nghttp2_frame* f, void* ud) {
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto* c = static_cast<Conn*>(ud);
  auto* st = new Stream;
  st->conn = c;
  st->id = f->hd.stream_id;
  c->streams[st->id] = st;
  nghttp2_session_set_stream_user_data(s, st->id, st);
  return 0;
}
int on_header(nghttp2_session* s, const nghttp2_frame* f, const uint8_t* name, size_t namelen,
              const uint8_t* value, size_t valuelen, uint8_t, void*) {
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto* st = static_cast<Stream*>(nghttp2_session_get_stream_user_data(s, f->hd.stream_id));
  if (st && namelen == 5 && memcmp(name, ":path", 5) == 0) st->path.assign((const char*)value, valuelen);
  return 0;
}
int on_data_chunk(nghttp2_session* s, uint8_t, int32_t id, const uint8_t* data, size_t len, void*) {
  auto* st = static_cast<Stream*>(nghttp2_session_get_stream_user_data(s, id));
  if (st && st->req.size() < (1u << 20)) st->req.append((const char*)data, len);
  return 0;
}
int on_frame_recv(nghttp2_session* s, const nghttp2_frame* f, void*) {
  if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) && (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    auto* st = static_cast<Stream*>(nghttp2_session_get_stream_user_data(s, f->hd.stream_id));
    if (st) handle(st);
  }
  return 0;
}
void forget(Stream* st) {
  if (st->timer) timers.erase({st->next_ns, st});
  st->conn->streams.erase(st->id);
  delete st;
}
int on_stream_close(nghttp2_session* s, int32_t id, uint32_t, void*) {
  auto* st = static_cast<Stream*>(nghttp2_session_get_stream_user_data(s, id));
  if (st) forget(st);
  return 0;
}

nghttp2_session_callbacks* callbacks() {
  static nghttp2_session_callbacks* cb = [] {
    nghttp2_session_callbacks* c;
    nghttp2_session_callbacks_new(&c);
    nghttp2_session_callbacks_set_on_begin_headers_callback(c, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(c, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(c, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(c, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(c, on_stream_close);
    return c;
  }();
  return cb;
}

void close_conn(Conn* c) {
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr);
  close(c->fd);
  for (auto& kv : c->streams) {
    Stream* st = kv.second;
    if (st->timer) timers.erase({st->next_ns, st});
    delete st;
  }
  c->streams.clear();
  nghttp2_session_del(c->s);
  conns.erase(c);
  --stats.conns_open;
  auto it = std::find(dirty.begin(), dirty.end(), c);
  if (it != dirty.end()) dirty.erase(it);
  delete c;
}

void set_epollout(Conn* c, bool on) {
  if (c->epollout == on) return;
  c->epollout = on;
  epoll_event ev{};
  ev.events = EPOLLIN | (on ? uint32_t(EPOLLOUT) : 0u);
  ev.data.ptr = c;
  epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

// pulls frames out of nghttp2 and writes them; false: the connection is done
bool flush(Conn* c) {
  for (;;) {
    while (c->wbuf.size() - c->woff < 65536) {
      const uint8_t* data;
      ssize_t n = nghttp2_session_mem_send(c->s, &data);
      if (n < 0) return false;
      if (n == 0) break;
      c->wbuf.append((const char*)data, size_t(n));
    }
    if (c->wbuf.size() == c->woff) break;
    ssize_t w = send(c->fd, c->wbuf.data() + c->woff, c->wbuf.size() - c->woff, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) { set_epollout(c, true); return true; }
      return false;
    }
    c->woff += size_t(w);
    if (c->woff == c->wbuf.size()) {
      c->wbuf.clear();
      c->woff = 0;
    } else {
      set_epollout(c, true);
      return true;
    }
  }
  c->wbuf.clear();
  c->woff = 0;
  set_epollout(c, false);
  return nghttp2_session_want_read(c->s) || nghttp2_session_want_write(c->s);
}

void on_accept() {
  for (;;) {
    int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN, or out of fds: try again on the next wake-up
    }
    set_nodelay(fd);
    auto* c = new Conn;
    c->fd = fd;
    nghttp2_session_server_new(&c->s, callbacks(), c);
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1000},
                                   {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(c->s, NGHTTP2_FLAG_NONE, 0, 1 << 24);
    ++stats.conns_accepted;
    ++stats.conns_open;
    conns.insert(c);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    if (!flush(c)) close_conn(c);
  }
}

void on_readable(Conn* c) {
  static uint8_t buf[65536];
  for (;;) {
    ssize_t r = recv(c->fd, buf, sizeof buf, 0);
    if (r == 0) { close_conn(c); return; }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      close_conn(c);
      return;
    }
    if (nghttp2_session_mem_recv(c->s, buf, size_t(r)) < 0) { close_conn(c); return; }
    if (size_t(r) < sizeof buf) break;  // drained (level-triggered: more wakes us again)
  }
  mark_dirty(c);
}

void on_timer() {
  uint64_t exp;
  (void)!read(tfd, &exp, sizeof exp);
  int64_t now = mono_ns();
  while (!timers.empty() && timers.begin()->first <= now) {
    Stream* st = timers.begin()->second;
    timers.erase(timers.begin());
    st->timer = false;
    st->out += stream_message(st);
    ++st->sent;
    ++stats.stream_msgs;
    if (st->sent >= st->n) {
      st->finished = true;
    } else {
      st->next_ns += st->interval_ns;
      st->timer = true;
      timers.insert({st->next_ns, st});
    }
    // --hold-back (the held-back detector's own check): every even message waits for the next
    if (hold_back && st->sent % 2 == 1 && !st->finished) continue;
    nghttp2_session_resume_data(st->conn->s, st->id);
    mark_dirty(st->conn);
  }
  arm_timer();
}

int run(const std::string& listen_addr) {
  fixed_payload.assign(payload_bytes, 'x');
  signal(SIGPIPE, SIG_IGN);
  signal(SIGTERM, [](int) { stop = 1; });
  signal(SIGINT, [](int) { stop = 1; });
  sockaddr_in sa;
  if (!parse_hostport(listen_addr, &sa)) { fprintf(stderr, "bad --listen %s\n", listen_addr.c_str()); return 2; }
  lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(lfd, (sockaddr*)&sa, sizeof sa) < 0) die("bind");
  if (listen(lfd, 4096) < 0) die("listen");
  ep = epoll_create1(EPOLL_CLOEXEC);
  tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &lfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  ev.data.ptr = &tfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
  fprintf(stderr, "grpc_replica: serving h2c on %s\n", listen_addr.c_str());
  epoll_event evs[256];
  while (!stop) {
    int n = epoll_wait(ep, evs, 256, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("epoll_wait");
    }
    // closes happen only in on_readable/flush of the same connection, and a closed connection's
    // later events in this batch would dangle: collect the readable ones first, in order
    for (int i = 0; i < n; ++i) {
      void* p = evs[i].data.ptr;
      if (p == &lfd) { on_accept(); continue; }
      if (p == &tfd) { on_timer(); continue; }
      auto* c = static_cast<Conn*>(p);
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        on_readable(c);  // may close c: each fd appears once per batch, so no later event names it
      } else if (evs[i].events & EPOLLOUT) {
        mark_dirty(c);
      }
    }
    std::vector<Conn*> todo;
    todo.swap(dirty);
    for (Conn* c : todo) {
      c->dirty = false;
      if (!flush(c)) close_conn(c);
    }
  }
  return 0;
}

}  // namespace srv

// ============================================================================ client

namespace cli {

struct Call {
  int32_t id = -1;
  std::string req;  // the framed request message
  size_t req_off = 0;
  std::string buf;  // response bytes not yet parsed into messages
  int msgs = 0;
  int64_t last_send = 0;
  uint64_t last_burst = 0;
  int grpc_status = -1;
  std::string grpc_message;
  bool closed = false;
  uint32_t rst = 0;
  std::vector<std::string> texts;  // call mode: the messages
};
struct Conn {
  int fd = -1;
  nghttp2_session* s = nullptr;
  std::string wbuf;
  size_t woff = 0;
  bool dead = false;
};

uint64_t burst = 0;  // one per recv()
int64_t burst_ns = 0;
bool keep_texts = false;
int64_t hold_ns = 10'000'000;
std::vector<double> delays_ms;
uint64_t held_back = 0, calls_done = 0;

ssize_t req_read(nghttp2_session*, int32_t, uint8_t* buf, size_t len, uint32_t* flags, nghttp2_data_source* src,
                 void*) {
  auto* c = static_cast<Call*>(src->ptr);
  size_t n = std::min(len, c->req.size() - c->req_off);
  memcpy(buf, c->req.data() + c->req_off, n);
  c->req_off += n;
  if (c->req_off == c->req.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return ssize_t(n);
}
int on_data_chunk(nghttp2_session* s, uint8_t, int32_t id, const uint8_t* data, size_t len, void*) {
  auto* c = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, id));
  if (!c) return 0;
  c->buf.append((const char*)data, len);
  while (c->buf.size() >= 5) {
    uint32_t n = get_be32(c->buf.data() + 1);
    if (c->buf.size() < 5 + size_t(n)) break;
    if (keep_texts) c->texts.push_back(c->buf.substr(5, n));
    if (n >= 16) {
      int64_t sent = int64_t(get_le64(c->buf.data() + 5 + 8));
      delays_ms.push_back(double(burst_ns - sent) / 1e6);
      if (c->msgs > 0 && c->last_burst == burst && sent - c->last_send >= hold_ns) ++held_back;
      c->last_send = sent;
    }
    c->last_burst = burst;
    ++c->msgs;
    c->buf.erase(0, 5 + size_t(n));
  }
  return 0;
}
int on_header(nghttp2_session* s, const nghttp2_frame* f, const uint8_t* name, size_t namelen,
              const uint8_t* value, size_t valuelen, uint8_t, void*) {
  auto* c = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, f->hd.stream_id));
  if (!c) return 0;
  std::string k((const char*)name, namelen);
  if (k == "grpc-status") c->grpc_status = atoi(std::string((const char*)value, valuelen).c_str());
  if (k == "grpc-message") c->grpc_message.assign((const char*)value, valuelen);
  return 0;
}
int on_stream_close(nghttp2_session* s, int32_t id, uint32_t err, void*) {
  auto* c = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, id));
  if (c && !c->closed) { c->closed = true; c->rst = err; ++calls_done; }
  return 0;
}

nghttp2_session_callbacks* callbacks() {
  static nghttp2_session_callbacks* cb = [] {
    nghttp2_session_callbacks* c;
    nghttp2_session_callbacks_new(&c);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(c, on_data_chunk);
    nghttp2_session_callbacks_set_on_header_callback(c, on_header);
    nghttp2_session_callbacks_set_on_stream_close_callback(c, on_stream_close);
    return c;
  }();
  return cb;
}

bool flush(Conn* c) {
  for (;;) {
    while (c->wbuf.size() - c->woff < 65536) {
      const uint8_t* data;
      ssize_t n = nghttp2_session_mem_send(c->s, &data);
      if (n < 0) return false;
      if (n == 0) break;
      c->wbuf.append((const char*)data, size_t(n));
    }
    if (c->wbuf.size() == c->woff) { c->wbuf.clear(); c->woff = 0; return true; }
    ssize_t w = send(c->fd, c->wbuf.data() + c->woff, c->wbuf.size() - c->woff, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN;
    }
    c->woff += size_t(w);
    if (c->woff < c->wbuf.size()) return true;
    c->wbuf.clear();
    c->woff = 0;
  }
}

int connect_to(const std::string& host, int port) {
  sockaddr_in sa;
  if (!parse_hostport(host + ":" + std::to_string(port), &sa)) { fprintf(stderr, "bad host %s\n", host.c_str()); exit(2); }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, (sockaddr*)&sa, sizeof sa) < 0) die("connect");
  set_nodelay(fd);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

struct Options {
  std::string host = "127.0.0.1", path = "/bench.Echo/Stream", data, app;
  int port = 0, streams = 50, messages = 200, conns = 1;
  double interval_ms = 20, hold_ms = 10;
  bool stagger = true;
};

// runs the calls to the end (or the deadline); returns the wall time in seconds
double run_calls(const Options& o, std::vector<Call>& calls, double deadline_s) {
  signal(SIGPIPE, SIG_IGN);
  std::vector<Conn> conns(size_t(std::max(1, o.conns)));
  for (auto& c : conns) {
    c.fd = connect_to(o.host, o.port);
    nghttp2_session_client_new(&c.s, callbacks(), &c);
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    nghttp2_submit_settings(c.s, NGHTTP2_FLAG_NONE, iv, 1);
    nghttp2_session_set_local_window_size(c.s, NGHTTP2_FLAG_NONE, 0, 1 << 24);
  }
  std::string authority = o.host + ":" + std::to_string(o.port);
  for (size_t i = 0; i < calls.size(); ++i) {
    Conn& c = conns[i % conns.size()];
    std::vector<nghttp2_nv> nv = {make_nv(":method", "POST"), make_nv(":scheme", "http"),
                                  make_nv(":authority", authority), make_nv(":path", o.path),
                                  make_nv("content-type", "application/grpc"), make_nv("te", "trailers"),
                                  make_nv("user-agent", "grpc-bench-client")};
    if (!o.app.empty()) nv.push_back(make_nv("application", o.app));
    nghttp2_data_provider prd;
    prd.source.ptr = &calls[i];
    prd.read_callback = req_read;
    calls[i].id = nghttp2_submit_request(c.s, nullptr, nv.data(), nv.size(), &prd, &calls[i]);
    if (calls[i].id < 0) { fprintf(stderr, "submit_request: %s\n", nghttp2_strerror(calls[i].id)); exit(1); }
  }
  int64_t t0 = mono_ns(), deadline = t0 + int64_t(deadline_s * 1e9);
  for (auto& c : conns) if (!flush(&c)) c.dead = true;
  std::vector<pollfd> pfds(conns.size());
  static uint8_t buf[65536];
  while (calls_done < calls.size()) {
    int64_t now = mono_ns();
    if (now >= deadline) break;
    size_t live = 0;
    for (size_t i = 0; i < conns.size(); ++i) {
      pfds[i].fd = conns[i].dead ? -1 : conns[i].fd;
      pfds[i].events = POLLIN | (conns[i].wbuf.size() > conns[i].woff ? POLLOUT : 0);
      pfds[i].revents = 0;
      live += !conns[i].dead;
    }
    if (!live) break;
    int n = poll(pfds.data(), pfds.size(), int(std::min<int64_t>((deadline - now) / 1000000 + 1, 1000)));
    if (n <= 0) continue;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (c.dead || !pfds[i].revents) continue;
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t r = recv(c.fd, buf, sizeof buf, 0);
        burst_ns = mono_ns();
        ++burst;
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { c.dead = true; continue; }
        if (r > 0 && nghttp2_session_mem_recv(c.s, buf, size_t(r)) < 0) { c.dead = true; continue; }
      }
      if (!flush(&c)) c.dead = true;
    }
  }
  double wall = double(mono_ns() - t0) / 1e9;
  for (auto& c : conns) {
    nghttp2_session_del(c.s);
    close(c.fd);
  }
  return wall;
}

double pct(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = size_t(p / 100.0 * double(v.size() - 1) + 0.5);
  return v[std::min(k, v.size() - 1)];
}

// ns this thread has waited on a run queue (runnable, not running): /proc/thread-self/schedstat
int64_t runq_wait_ns() {
  FILE* f = fopen("/proc/thread-self/schedstat", "r");
  if (!f) return 0;
  long long run = 0, wait = 0;
  if (fscanf(f, "%lld %lld", &run, &wait) != 2) wait = 0;
  fclose(f);
  return wait;
}

int stream_main(const Options& o) {
  hold_ns = int64_t(o.hold_ms * 1e6);
  int64_t wait0 = runq_wait_ns();
  std::vector<Call> calls(size_t(o.streams));
  int64_t interval_us = int64_t(o.interval_ms * 1000);
  for (size_t i = 0; i < calls.size(); ++i) {
    int64_t offset_us = o.stagger ? interval_us * int64_t(i) / int64_t(calls.size()) : 0;
    char m[128];
    snprintf(m, sizeof m, "n=%d interval_us=%" PRId64 " offset_us=%" PRId64, o.messages, interval_us, offset_us);
    calls[i].req = grpc_frame(m);
  }
  delays_ms.reserve(size_t(o.streams) * size_t(o.messages));
  double deadline = o.messages * o.interval_ms / 1000.0 + 15;
  double wall = run_calls(o, calls, deadline);
  double runq_ms = double(runq_wait_ns() - wait0) / 1e6;
  int ok = 0, bad_status = 0, short_streams = 0, resets = 0, unfinished = 0;
  for (auto& c : calls) {
    if (!c.closed) { ++unfinished; continue; }
    if (c.rst) ++resets;
    if (c.grpc_status != 0) ++bad_status;
    if (c.msgs != o.messages) ++short_streams;
    if (c.grpc_status == 0 && !c.rst && c.msgs == o.messages) ++ok;
  }
  std::sort(delays_ms.begin(), delays_ms.end());
  printf("{\"streams\": %d, \"messages\": %zu, \"expected\": %d, \"ok_streams\": %d, \"bad_status\": %d, "
         "\"short_streams\": %d, \"resets\": %d, \"unfinished\": %d, \"delay_p50_ms\": %.3f, "
         "\"delay_p90_ms\": %.3f, \"delay_p99_ms\": %.3f, \"delay_max_ms\": %.3f, \"held_back\": %" PRIu64
         ", \"client_runq_wait_ms\": %.1f, \"wall_s\": %.2f}\n",
         o.streams, delays_ms.size(), o.streams * o.messages, ok, bad_status, short_streams, resets, unfinished,
         pct(delays_ms, 50), pct(delays_ms, 90), pct(delays_ms, 99), delays_ms.empty() ? 0.0 : delays_ms.back(),
         held_back, runq_ms, wall);
  return (ok == o.streams) ? 0 : 1;
}

int call_main(const Options& o) {
  keep_texts = true;
  std::vector<Call> calls(1);
  calls[0].req = grpc_frame(o.data);
  run_calls(o, calls, 10);
  Call& c = calls[0];
  for (auto& t : c.texts) {
    std::string esc;
    for (unsigned char ch : t) {
      if (ch >= 32 && ch < 127 && ch != '\\') esc += char(ch);
      else { char b[8]; snprintf(b, sizeof b, "\\x%02x", ch); esc += b; }
    }
    printf("message: %s\n", esc.c_str());
  }
  printf("grpc-status: %d%s%s%s\n", c.grpc_status, c.grpc_message.empty() ? "" : " grpc-message: ",
         c.grpc_message.c_str(), c.closed ? (c.rst ? " (reset)" : "") : " (not finished)");
  return (c.closed && !c.rst && c.grpc_status == 0) ? 0 : 1;
}

}  // namespace cli

int usage() {
  fputs("usage: grpc_replica serve --listen HOST:PORT [--payload-bytes N] [--hold-back]\n"
        "       grpc_replica stream --port P [--host H] [--streams N] [--messages N] [--interval-ms MS]\n"
        "                           [--conns N] [--app NAME] [--no-stagger] [--hold-ms MS]\n"
        "       grpc_replica call --port P [--host H] --path /svc/Method [--data TEXT] [--app NAME]\n",
        stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string mode = argv[1], listen_addr;
  cli::Options o;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) { fprintf(stderr, "%s needs a value\n", a.c_str()); exit(2); }
      return argv[++i];
    };
    if (a == "--listen") listen_addr = val();
    else if (a == "--payload-bytes") srv::payload_bytes = size_t(atol(val().c_str()));
    else if (a == "--hold-back") srv::hold_back = true;
    else if (a == "--port") o.port = atoi(val().c_str());
    else if (a == "--host") o.host = val();
    else if (a == "--streams") o.streams = atoi(val().c_str());
    else if (a == "--messages") o.messages = atoi(val().c_str());
    else if (a == "--interval-ms") o.interval_ms = atof(val().c_str());
    else if (a == "--hold-ms") o.hold_ms = atof(val().c_str());
    else if (a == "--conns") o.conns = atoi(val().c_str());
    else if (a == "--app") o.app = val();
    else if (a == "--path") o.path = val();
    else if (a == "--data") o.data = val();
    else if (a == "--no-stagger") o.stagger = false;
    else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return usage(); }
  }
  if (mode == "serve") return listen_addr.empty() ? usage() : srv::run(listen_addr);
  if (mode == "stream") return o.port ? cli::stream_main(o) : usage();
  if (mode == "call") return o.port ? cli::call_main(o) : usage();
  return usage();
}
