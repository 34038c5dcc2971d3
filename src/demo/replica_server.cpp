#include "ingressd/demo/replica_server.hpp"

#include <chrono>

#include <array>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace ingressd::demo {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string chunk(std::string_view data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out = size;
  out.append(data);
  out += "\r\n";
  return out;
}

// Readable demo output: "Hello from replica <id>:" followed by a pangram, looping.
std::string token_text(std::size_t i, const std::string& name) {
  static constexpr std::array<std::string_view, 9> words = {" the",  " quick", " brown", " fox", " jumps",
                                                             " over", " the",   " lazy",  " dog."};
  switch (i) {
    case 0: return "Hello";
    case 1: return " from";
    case 2: return " replica";
    case 3: return " " + name.substr(name.rfind('#') == std::string::npos ? 0 : name.rfind('#') + 1) + ":";
    default: return std::string(words[(i - 4) % words.size()]);
  }
}

}  // namespace

replica_server::replica_server(options opts)
    : server_base(opts.bind_ip, opts.port, "replica " + opts.name), opts_(std::move(opts)) {
  start();
}

replica_server::~replica_server() { stop(); }

void replica_server::set_healthy(bool healthy) {
  std::lock_guard lock(script_mu_);
  healthy_ = healthy;
}

bool replica_server::healthy() const {
  std::lock_guard lock(script_mu_);
  return healthy_;
}

void replica_server::set_behaviour(replica_behaviour b) {
  std::lock_guard lock(script_mu_);
  behaviour_ = std::move(b);
}

void replica_server::queue_behaviour(replica_behaviour b) {
  std::lock_guard lock(script_mu_);
  queued_.push_back(std::move(b));
}

replica_behaviour replica_server::next_behaviour() {
  std::lock_guard lock(script_mu_);
  if (queued_.empty()) return behaviour_;
  auto b = std::move(queued_.front());
  queued_.pop_front();
  return b;
}

bool replica_server::is_probe(const recorded_request& r) const { return r.path() == "/-/healthz"; }

std::string replica_server::event_json(std::size_t index, bool chat) const {
  nlohmann::ordered_json ev;
  ev["id"] = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(stream_seq_);
  ev["object"] = chat ? "chat.completion.chunk" : "text_completion";
  ev["model"] = "demo-llm";
  nlohmann::ordered_json choice;
  choice["index"] = 0;
  if (chat)
    choice["delta"] = {{"content", token_text(index, opts_.name)}};
  else
    choice["text"] = token_text(index, opts_.name);
  ev["choices"] = nlohmann::ordered_json::array({choice});
  return ev.dump();
}

awaitable<after_reply> replica_server::stream(exchange& ex, std::size_t events, std::chrono::milliseconds delay,
                                              bool chat, bool finish) {
  const bool chunked = ex.request().version >= 11;
  ++stream_seq_;
  std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nx-served-by: " + opts_.name +
      "\r\n";
  head += chunked ? "Transfer-Encoding: chunked\r\n\r\n" : "Connection: close\r\n\r\n";
  if (!co_await ex.write(head)) co_return after_reply::done;

  // Each event is its own write (and chunk) so a proxy that buffers shows up as bunched arrivals.
  for (std::size_t i = 0; i < events; ++i) {
    if (i > 0 && !co_await ex.wait(delay)) co_return after_reply::done;
    // GCC 12 mis-destroys temporaries inside co_await operands: build every payload beforehand.
    const auto event = "data: " + event_json(i, chat) + "\n\n";
    const auto bytes = chunked ? chunk(event) : event;
    if (!co_await ex.write(bytes)) co_return after_reply::done;
  }
  if (!finish) {
    // Give the events already written time to be read before the RST can overtake them.
    co_await ex.wait(delay);
    co_return after_reply::done;
  }
  if (events > 0 && !co_await ex.wait(delay)) co_return after_reply::done;
  static constexpr std::string_view done = "data: [DONE]\n\n";
  const auto last = chunked ? chunk(done) + "0\r\n\r\n" : std::string(done);
  if (!co_await ex.write(last)) co_return after_reply::done;
  co_return(chunked && ex.request().keep_alive) ? after_reply::keep_alive : after_reply::close;
}

awaitable<after_reply> replica_server::handle(exchange& ex) {
  const auto& req = ex.request();
  const bool head_only = req.method == "HEAD";

  if (is_probe(req)) {
    const bool ok = healthy();
    header_list headers = {{"Content-Type", "text/plain"}, {"x-served-by", opts_.name}};
    const auto reply = format_response(ok ? 200 : 503, headers, ok ? "success" : "UNHEALTHY", req.keep_alive, head_only);
    if (!co_await ex.write(reply)) co_return after_reply::done;
    co_return after_reply::keep_alive;
  }

  const auto b = next_behaviour();
  if (b.what == replica_behaviour::kind::hang) {
    co_await ex.wait_for_peer_close();
    co_return after_reply::done;
  }
  if (b.header_delay.count() > 0 && !co_await ex.wait(b.header_delay)) co_return after_reply::done;

  const auto path = req.path();
  const bool chat = ends_with(path, "/chat/completions");
  const bool chat_events = chat || !ends_with(path, "/completions");  // text events only for /completions
  switch (b.what) {
    case replica_behaviour::kind::close_before_headers:
      ex.close();
      co_return after_reply::done;
    case replica_behaviour::kind::reset_after_events:
      co_await stream(ex, b.events, opts_.token_delay, chat_events, false);
      ex.reset();
      co_return after_reply::done;
    case replica_behaviour::kind::stream_events:
      co_return co_await stream(ex, b.events, b.event_delay, chat_events, true);
    case replica_behaviour::kind::respond: {
      auto headers = b.headers;
      headers.emplace_back("x-served-by", opts_.name);
      const bool keep = req.keep_alive && !wants_close(b.headers);
      const auto reply = format_response(b.status, headers, b.body, keep, head_only);
      if (!co_await ex.write(reply)) co_return after_reply::done;
      co_return keep ? after_reply::keep_alive : after_reply::close;
    }
    case replica_behaviour::kind::hang:
    case replica_behaviour::kind::normal:
      break;
  }

  const bool completion = req.method == "POST" && ends_with(path, "/completions");
  if (completion) {
    const auto body = nlohmann::json::parse(req.body, nullptr, false);
    bool streaming = false;
    if (body.is_object()) {
      const auto it = body.find("stream");
      streaming = it != body.end() && it->is_boolean() && it->get<bool>();
    }
    if (streaming) co_return co_await stream(ex, opts_.tokens, opts_.token_delay, chat, true);
  }

  nlohmann::ordered_json echo;
  if (completion) {
    // A non-streamed completion is an OpenAI object (SDKs read choices[0]), with the echo below
    // as extra fields, which SDKs ignore.
    ++stream_seq_;
    std::string text;
    for (std::size_t i = 0; i < opts_.tokens; ++i) text += token_text(i, opts_.name);
    echo["id"] = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(stream_seq_);
    echo["object"] = chat ? "chat.completion" : "text_completion";
    echo["created"] = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
    echo["model"] = "demo-llm";
    nlohmann::ordered_json choice;
    choice["index"] = 0;
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    else
      choice["text"] = text;
    choice["finish_reason"] = "stop";
    echo["choices"] = nlohmann::ordered_json::array({choice});
    echo["usage"] = {{"prompt_tokens", 1}, {"completion_tokens", opts_.tokens}, {"total_tokens", opts_.tokens + 1}};
  }
  echo["replica"] = opts_.name;
  echo["method"] = req.method;
  echo["target"] = req.target;
  echo["body_bytes"] = req.body.size();
  header_list headers = {{"Content-Type", "application/json"}, {"x-served-by", opts_.name}};
  const auto reply = format_response(200, headers, echo.dump(), req.keep_alive, head_only);
  if (!co_await ex.write(reply)) co_return after_reply::done;
  co_return after_reply::keep_alive;
}

}  // namespace ingressd::demo
