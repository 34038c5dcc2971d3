#include "fakes/http_client.hpp"

#include <algorithm>

#include <openssl/ssl.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/ssl/impl/src.hpp>  // Asio's SSL, compiled here (BOOST_ASIO_SEPARATE_COMPILATION)
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "ingressd/core/asio.hpp"
#include "ingressd/demo/server_base.hpp"

namespace ingressd::testing {
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

constexpr std::size_t read_chunk = 64 * 1024;

struct io_result {
  error_code ec;
  std::size_t n = 0;
  bool timed_out = false;
};

bool contains_token(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    auto comma = list.find(',');
    auto item = list.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (beast::iequals(item, token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

sse_event make_event(std::string raw, clock::time_point at) {
  sse_event ev{.raw = std::move(raw), .data = {}, .at = at};
  std::string_view rest = ev.raw;
  bool first = true;
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    auto line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") continue;
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (!first) ev.data += '\n';
    ev.data.append(line);
    first = false;
  }
  return ev;
}

}  // namespace

// --- http_response -----------------------------------------------------------------------------

std::optional<std::string> http_response::header(std::string_view name) const {
  return demo::find_header(headers, name);
}

std::size_t http_response::header_count(std::string_view name) const { return demo::count_header(headers, name); }

bool http_response::keep_alive() const {
  const auto conn = header("connection").value_or("");
  if (version >= 11) return !contains_token(conn, "close");
  return contains_token(conn, "keep-alive");
}

// --- connection --------------------------------------------------------------------------------

struct connection::state {
  asio::io_context ioc{1};
  tcp::socket socket{ioc};
  // The HTTPS client (open_tls): its context and the TLS stream over `socket`.
  std::unique_ptr<asio::ssl::context> tls_ctx;
  std::unique_ptr<asio::ssl::stream<tcp::socket&>> tls;
  beast::flat_buffer buffer;
  std::string error;
  bool connected = false;
  // Sticky end of the read side: once the peer closed or failed, later reads report it at once.
  std::optional<error_code> read_end;

  // Runs the io_context until `done` or the deadline; on timeout cancels the pending operation
  // and lets it complete (with operation_aborted) so nothing outlives the call.
  bool run_until(const bool& done, clock::time_point deadline) {
    ioc.restart();
    while (!done)
      if (ioc.run_one_until(deadline) == 0) break;
    if (done) return true;
    error_code ec;
    socket.cancel(ec);
    ioc.restart();
    ioc.run();
    return false;
  }

  io_result read_some(clock::time_point deadline) {
    io_result r;
    if (read_end) {
      r.ec = *read_end;
      return r;
    }
    bool done = false;
    auto on_read = [&](error_code ec, std::size_t n) {
      r.ec = ec;
      r.n = n;
      done = true;
    };
    if (tls) {
      tls->async_read_some(buffer.prepare(read_chunk), on_read);
    } else {
      socket.async_read_some(buffer.prepare(read_chunk), on_read);
    }
    const bool in_time = run_until(done, deadline);
    buffer.commit(r.n);
    if (!in_time && r.ec == asio::error::operation_aborted) {
      r.timed_out = true;
      r.ec = {};
      return r;
    }
    // A TLS peer that closes without close_notify is an EOF to an HTTP client too.
    if (r.ec == asio::ssl::error::stream_truncated) r.ec = asio::error::eof;
    if (r.ec) read_end = r.ec;
    return r;
  }
};

connection::connection(std::unique_ptr<state> s) : s_(std::move(s)) {}
connection::connection(connection&&) noexcept = default;
connection& connection::operator=(connection&&) noexcept = default;
connection::~connection() = default;

connection connection::open(const std::string& host, std::uint16_t port, clock::duration timeout) {
  auto s = std::make_unique<state>();
  const auto deadline = clock::now() + timeout;
  error_code ec;
  tcp::resolver resolver(s->ioc);
  auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  if (ec) {
    s->error = "resolve: " + ec.message();
    return connection(std::move(s));
  }
  bool done = false;
  error_code connect_ec;
  asio::async_connect(s->socket, endpoints, [&](error_code e, const tcp::endpoint&) {
    connect_ec = e;
    done = true;
  });
  if (!s->run_until(done, deadline)) {
    s->error = "connect: timeout";
    return connection(std::move(s));
  }
  if (connect_ec) {
    s->error = "connect: " + connect_ec.message();
    return connection(std::move(s));
  }
  s->socket.set_option(tcp::no_delay(true), ec);
  s->connected = true;
  return connection(std::move(s));
}

connection connection::open_tls(const std::string& host, std::uint16_t port, const tls_options& options,
                                clock::duration timeout) {
  const auto deadline = clock::now() + timeout;
  auto c = open(host, port, timeout);
  if (!c.connected()) return c;
  if (!options.preamble.empty() && !c.write(options.preamble, timeout)) return c;
  auto& s = *c.s_;
  s.connected = false;
  s.tls_ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  SSL_CTX* ctx = s.tls_ctx->native_handle();
  if (!options.ca_file.empty()) {
    s.tls_ctx->load_verify_file(options.ca_file);
    s.tls_ctx->set_verify_mode(asio::ssl::verify_peer);
  }
  auto version = [](const std::string& v) { return v == "1.1" ? TLS1_1_VERSION : v == "1.2" ? TLS1_2_VERSION : TLS1_3_VERSION; };
  if (!options.max_version.empty()) SSL_CTX_set_max_proto_version(ctx, version(options.max_version));
  if (!options.min_version.empty()) {
    SSL_CTX_set_security_level(ctx, 0);  // TLS 1.1 needs it: OpenSSL 3's default policy refuses it
    SSL_CTX_set_min_proto_version(ctx, version(options.min_version));
  }
  if (!options.ciphers.empty()) SSL_CTX_set_cipher_list(ctx, options.ciphers.c_str());
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT);
  s.tls = std::make_unique<asio::ssl::stream<tcp::socket&>>(s.socket, *s.tls_ctx);
  SSL* ssl = s.tls->native_handle();
  SSL_set_tlsext_host_name(ssl, options.server_name.c_str());
  if (!options.ca_file.empty()) SSL_set1_host(ssl, options.server_name.c_str());
  if (!options.alpn.empty()) {
    std::string wire;
    for (const auto& p : options.alpn) wire += static_cast<char>(p.size()) + p;
    SSL_set_alpn_protos(ssl, reinterpret_cast<const unsigned char*>(wire.data()), static_cast<unsigned>(wire.size()));
  }
  if (options.session) SSL_set_session(ssl, static_cast<SSL_SESSION*>(options.session.get()));
  bool done = false;
  error_code ec;
  s.tls->async_handshake(asio::ssl::stream_base::client, [&](error_code e) {
    ec = e;
    done = true;
  });
  if (!s.run_until(done, deadline)) {
    s.error = "handshake: timeout";
    return c;
  }
  if (ec) {
    s.error = "handshake: " + ec.message();
    return c;
  }
  s.connected = true;
  return c;
}

void* connection::tls_native() const { return s_->tls ? s_->tls->native_handle() : nullptr; }

bool connection::tls_resumed() const { return s_->tls && SSL_session_reused(s_->tls->native_handle()) == 1; }

std::string connection::tls_alpn() const {
  if (!s_->tls) return {};
  const unsigned char* p = nullptr;
  unsigned n = 0;
  SSL_get0_alpn_selected(s_->tls->native_handle(), &p, &n);
  return p ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
}

std::string connection::tls_version() const { return s_->tls ? SSL_get_version(s_->tls->native_handle()) : ""; }

std::shared_ptr<void> connection::tls_session() const {
  if (!s_->tls) return nullptr;
  // A copy: OpenSSL marks a connection's own session not resumable when the connection ends
  // without close_notify, as these test connections do.
  SSL_SESSION* session = SSL_get0_session(s_->tls->native_handle());
  if (!session || !SSL_SESSION_is_resumable(session)) return nullptr;
  session = SSL_SESSION_dup(session);
  if (!session) return nullptr;
  return std::shared_ptr<void>(session, [](void* p) { SSL_SESSION_free(static_cast<SSL_SESSION*>(p)); });
}

bool connection::connected() const { return s_ && s_->connected; }

const std::string& connection::error() const { return s_->error; }

std::string connection::local_address() const {
  error_code ec;
  auto ep = s_->socket.local_endpoint(ec);
  if (ec) return {};
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

bool connection::write(std::string_view bytes, clock::duration timeout) {
  if (!connected()) return false;
  bool done = false;
  error_code ec;
  auto on_write = [&](error_code e, std::size_t) {
    ec = e;
    done = true;
  };
  if (s_->tls) {
    asio::async_write(*s_->tls, asio::buffer(bytes.data(), bytes.size()), on_write);
  } else {
    asio::async_write(s_->socket, asio::buffer(bytes.data(), bytes.size()), on_write);
  }
  if (!s_->run_until(done, clock::now() + timeout)) {
    s_->error = "write: timeout";
    return false;
  }
  if (ec) {
    s_->error = "write: " + ec.message();
    return false;
  }
  return true;
}

http_response connection::read_response(clock::duration timeout, bool head_request) {
  http_response out;
  if (!connected()) {
    out.error = s_->error.empty() ? "not connected" : s_->error;
    return out;
  }
  const auto deadline = clock::now() + timeout;
  auto stamp = clock::now();

  http::response_parser<http::string_body> parser;
  parser.header_limit(1024 * 1024);
  parser.body_limit(boost::none);
  parser.eager(true);
  if (head_request) parser.skip(true);

  std::string partial_chunk;
  auto on_chunk = [&](std::uint64_t remain, std::string_view data, error_code&) -> std::size_t {
    parser.get().body().append(data);
    partial_chunk.append(data);
    if (remain == data.size()) {
      out.chunks.push_back({std::move(partial_chunk), stamp});
      partial_chunk.clear();
    }
    return data.size();
  };
  parser.on_chunk_body(on_chunk);

  bool head_seen = false;
  std::string head_bytes;  // what the parser consumed up to the end of the head (and maybe more)
  bool sse = false;
  std::size_t body_seen = 0;
  std::size_t sse_pos = 0;
  // Picks up what the last parser step produced: head fields, body pieces, finished SSE events.
  auto absorb = [&] {
    if (!head_seen && parser.is_header_done()) {
      head_seen = true;
      out.headers_at = stamp;
      const auto& msg = parser.get();
      out.status = msg.result_int();
      out.version = msg.version();
      out.reason = std::string(msg.reason());
      out.headers = demo::parse_head_fields(head_bytes);
      out.chunked = parser.chunked();
      sse = out.header("content-type").value_or("").find("text/event-stream") != std::string::npos;
    }
    const auto& body = parser.get().body();
    if (!out.chunked && body.size() > body_seen) out.chunks.push_back({body.substr(body_seen), stamp});
    body_seen = body.size();
    while (sse) {
      const auto lf = body.find("\n\n", sse_pos);
      const auto crlf = body.find("\r\n\r\n", sse_pos);
      if (lf == std::string::npos && crlf == std::string::npos) break;
      const bool use_lf = crlf == std::string::npos || (lf != std::string::npos && lf < crlf);
      const auto end = use_lf ? lf : crlf;
      out.events.push_back(make_event(body.substr(sse_pos, end - sse_pos), stamp));
      sse_pos = end + (use_lf ? 2 : 4);
    }
  };
  auto finish = [&](bool complete, std::string error) {
    out.complete = complete;
    out.error = std::move(error);
    out.body = parser.get().body();
    out.finished_at = clock::now();
    return out;
  };

  for (;;) {
    if (s_->buffer.size() > 0) {
      error_code ec;
      const auto n = parser.put(s_->buffer.data(), ec);
      if (!head_seen) head_bytes.append(static_cast<const char*>(s_->buffer.data().data()), n);
      s_->buffer.consume(n);
      if (ec == http::error::need_more) ec = {};
      if (ec) return finish(false, "parse: " + ec.message());
      absorb();
      if (parser.is_done()) return finish(true, {});
      if (n > 0 && s_->buffer.size() > 0) continue;
    }
    const auto r = s_->read_some(deadline);
    stamp = clock::now();
    if (r.timed_out) {
      out.timed_out = true;
      return finish(false, "timeout");
    }
    // A read returns data or an error, never both, and the buffer was parsed as far as it goes
    // before reading: whatever is left cannot complete the response.
    if (r.ec == asio::error::eof) {
      if (head_seen && parser.need_eof()) {
        error_code ec;
        parser.put_eof(ec);
        absorb();
        if (!ec && parser.is_done()) return finish(true, {});
      }
      return finish(false, "eof");
    }
    if (r.ec) return finish(false, r.ec.message());
  }
}

raw_read connection::read_until_close(clock::duration timeout) {
  raw_read out;
  if (!connected()) return out;
  const auto deadline = clock::now() + timeout;
  for (;;) {
    const auto r = s_->read_some(deadline);
    if (r.timed_out) {
      out.timed_out = true;
      break;
    }
    if (r.ec == asio::error::eof) {
      out.closed = true;
      break;
    }
    if (r.ec) {
      out.reset = true;
      break;
    }
  }
  const auto data = s_->buffer.data();
  out.bytes.assign(static_cast<const char*>(data.data()), data.size());
  s_->buffer.consume(data.size());
  return out;
}

bool connection::is_closed(clock::duration timeout) {
  if (!connected()) return true;
  const auto deadline = clock::now() + timeout;
  for (;;) {
    const auto r = s_->read_some(deadline);
    if (r.timed_out) return false;
    if (r.ec) return true;
  }
}

bool connection::write_raw(std::string_view bytes) {
  error_code ec;
  asio::write(s_->socket, asio::buffer(bytes.data(), bytes.size()), ec);
  if (ec) s_->error = "write: " + ec.message();
  return !ec;
}

void connection::shutdown_write() {
  error_code ec;
  s_->socket.shutdown(tcp::socket::shutdown_send, ec);
}

void connection::close() {
  error_code ec;
  s_->socket.close(ec);
  s_->connected = false;
}

void connection::reset() {
  error_code ec;
  s_->socket.set_option(asio::socket_base::linger(true, 0), ec);
  s_->socket.close(ec);
  s_->connected = false;
}

// --- helpers -----------------------------------------------------------------------------------

connection send_raw(const std::string& host, std::uint16_t port, std::string_view bytes, clock::duration timeout) {
  auto c = connection::open(host, port, timeout);
  if (c.connected()) c.write(bytes, timeout);
  return c;
}

std::string format_request(std::string_view method, std::string_view target, const std::string& host,
                           std::uint16_t port, const header_list& headers, std::string_view body) {
  bool has_host = false;
  bool framed = false;
  for (const auto& [name, value] : headers) {
    if (beast::iequals(name, "host")) has_host = true;
    if (beast::iequals(name, "content-length") || beast::iequals(name, "transfer-encoding")) framed = true;
  }
  std::string out;
  out.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  if (!has_host) out += "Host: " + host + ":" + std::to_string(port) + "\r\n";
  for (const auto& [name, value] : headers) out += name + ": " + value + "\r\n";
  const bool bodyless_method = method == "GET" || method == "HEAD" || method == "DELETE" || method == "OPTIONS";
  if (!framed && (!body.empty() || !bodyless_method)) out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += "\r\n";
  out.append(body);
  return out;
}

http_response http_request(const std::string& host, std::uint16_t port, std::string_view method,
                           std::string_view target, const header_list& headers, std::string_view body,
                           clock::duration timeout) {
  const auto deadline = clock::now() + timeout;
  auto left = [&] { return std::max<clock::duration>(deadline - clock::now(), clock::duration::zero()); };
  auto c = connection::open(host, port, timeout);
  if (!c.connected()) {
    http_response r;
    r.error = c.error();
    r.timed_out = c.error().find("timeout") != std::string::npos;
    return r;
  }
  if (!c.write(format_request(method, target, host, port, headers, body), left())) {
    // The server may have answered and closed before reading it all (e.g. 413); try to read.
    auto r = c.read_response(std::min<clock::duration>(left(), std::chrono::seconds(1)), method == "HEAD");
    if (!r.complete) r.error = c.error();
    return r;
  }
  auto r = c.read_response(left(), method == "HEAD");
  c.close();
  return r;
}

http_response http_get(const std::string& host, std::uint16_t port, std::string_view target,
                       const header_list& headers, clock::duration timeout) {
  return http_request(host, port, "GET", target, headers, {}, timeout);
}

http_response http_post(const std::string& host, std::uint16_t port, std::string_view target,
                        const header_list& headers, std::string_view body, clock::duration timeout) {
  return http_request(host, port, "POST", target, headers, body, timeout);
}

namespace {
std::uint32_t be32(std::string_view b) {
  return static_cast<std::uint32_t>(static_cast<unsigned char>(b[0])) << 24 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(b[1])) << 16 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(b[2])) << 8 | static_cast<unsigned char>(b[3]);
}
}  // namespace

std::uint32_t h2_frame::error_code() const {
  if (type == 0x3 && payload.size() >= 4) return be32(payload);
  if (type == 0x7 && payload.size() >= 8) return be32(std::string_view(payload).substr(4));
  return ~0u;
}

std::string h2_frame::debug_data() const { return type == 0x7 && payload.size() > 8 ? payload.substr(8) : std::string(); }

std::vector<h2_frame> h2_frames(std::string_view bytes) {
  std::vector<h2_frame> out;
  while (bytes.size() >= 9) {
    const std::size_t n = be32(std::string("\0", 1) + std::string(bytes.substr(0, 3)));
    if (bytes.size() < 9 + n) break;
    h2_frame f;
    f.type = static_cast<unsigned char>(bytes[3]);
    f.flags = static_cast<unsigned char>(bytes[4]);
    f.stream = be32(bytes.substr(5, 4)) & 0x7fffffffu;
    f.payload = std::string(bytes.substr(9, n));
    out.push_back(std::move(f));
    bytes.remove_prefix(9 + n);
  }
  return out;
}

}  // namespace ingressd::testing
