#include "ingressd/grpc/protocol.hpp"

#include <algorithm>
#include <charconv>

#include "ingressd/topology/snapshot.hpp"

namespace ingressd::grpc {

status status_of_h2_error(std::uint32_t code) noexcept {
  switch (code) {
    case 0x7: return status::unavailable;         // REFUSED_STREAM
    case 0x8: return status::cancelled;           // CANCEL
    case 0xb: return status::resource_exhausted;  // ENHANCE_YOUR_CALM
    case 0xc: return status::permission_denied;   // INADEQUATE_SECURITY
    default: return status::internal;
  }
}

std::optional<std::chrono::nanoseconds> parse_timeout(std::string_view text) noexcept {
  if (text.size() < 2 || text.size() > 9) return std::nullopt;
  const char unit = text.back();
  text.remove_suffix(1);
  std::uint64_t n = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<unsigned>(c - '0');
  }
  using namespace std::chrono;
  // At most 99,999,999 hours: clamp to what nanoseconds hold (~292 years) first.
  constexpr std::uint64_t max_ns = static_cast<std::uint64_t>(nanoseconds::max().count());
  auto scaled = [&](std::uint64_t per) -> nanoseconds {
    if (n > max_ns / per) return nanoseconds::max();
    return nanoseconds(static_cast<std::int64_t>(n * per));
  };
  switch (unit) {
    case 'H': return scaled(3'600'000'000'000ull);
    case 'M': return scaled(60'000'000'000ull);
    case 'S': return scaled(1'000'000'000ull);
    case 'm': return scaled(1'000'000ull);
    case 'u': return scaled(1'000ull);
    case 'n': return scaled(1);
    default: return std::nullopt;
  }
}

std::string encode_message(std::string_view text) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xf]);
    }
  }
  return out;
}

std::optional<unsigned> parse_status(std::string_view text) noexcept {
  unsigned v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || text.empty() || v >= status_count) return std::nullopt;
  return v;
}

std::optional<std::size_t> pick_app(const topology::snapshot& snap, std::optional<std::string_view> application) {
  if (snap.grpc_apps.size() == 1) return 0;
  if (!application) return std::nullopt;
  if (auto it = snap.grpc_by_name.find(std::string(*application)); it != snap.grpc_by_name.end()) return it->second;
  return std::nullopt;
}

std::string_view to_string(conn_error e) noexcept {
  switch (e) {
    case conn_error::protocol: return "protocol";
    case conn_error::flow_control: return "flow_control";
    case conn_error::compression: return "compression";
    case conn_error::flood: return "flood";
    case conn_error::header_list: return "header_list";
    case conn_error::reset_flood: return "reset_flood";
    case conn_error::timeout: return "timeout";
  }
  return "protocol";
}

std::span<const std::uint8_t> idle_reset_filter::feed(std::span<const std::uint8_t> in) {
  // Nearly every read passes unchanged: scan a copy of the state, and copy bytes only when a
  // reset is dropped or a frame header is held.
  if (st_.head_have == 0) {
    state trial = st_;
    if (scan(trial, in, nullptr)) {
      st_ = trial;
      return in;
    }
  }
  out_.clear();
  out_.reserve(in.size() + st_.head.size());
  scan(st_, in, &out_);
  return out_;
}

bool idle_reset_filter::scan(state& st, std::span<const std::uint8_t> in, std::vector<std::uint8_t>* out) {
  constexpr std::uint8_t headers_type = 0x1, rst_stream_type = 0x3;
  std::size_t i = 0;
  auto pass = [&](std::size_t k) {
    if (out && !st.dropping) out->insert(out->end(), in.begin() + static_cast<std::ptrdiff_t>(i),
                                         in.begin() + static_cast<std::ptrdiff_t>(i + k));
    i += k;
  };
  while (i < in.size()) {
    if (st.preface_left > 0) {
      const auto k = std::min(st.preface_left, in.size() - i);
      pass(k);  // (dropping is false: no frame came yet)
      st.preface_left -= k;
      continue;
    }
    if (st.payload_left > 0) {
      if (st.dropping && !out) return false;
      const auto k = std::min(st.payload_left, in.size() - i);
      pass(k);
      st.payload_left -= k;
      continue;
    }
    const auto k = std::min(st.head.size() - st.head_have, in.size() - i);
    if (!out && st.head_have + k < st.head.size()) return false;  // a header split across reads is held
    std::memcpy(st.head.data() + st.head_have, in.data() + i, k);
    st.head_have += k;
    i += k;
    if (st.head_have < st.head.size()) break;  // the rest of this frame header comes with the next read
    const bool held = st.head_have > k;        // part of it came with an earlier read
    st.head_have = 0;
    const std::size_t length = (std::size_t{st.head[0]} << 16) | (std::size_t{st.head[1]} << 8) | st.head[2];
    const std::uint32_t sid = ((std::uint32_t{st.head[5]} << 24) | (std::uint32_t{st.head[6]} << 16) |
                               (std::uint32_t{st.head[7]} << 8) | st.head[8]) & 0x7fffffffu;
    const bool client_stream = (sid & 1u) != 0;
    if (st.head[3] == headers_type && client_stream && sid > st.max_opened) st.max_opened = sid;
    st.dropping = st.head[3] == rst_stream_type && client_stream && sid > st.max_opened;
    if (st.dropping) {
      if (!out) return false;
      ++st.dropped;
    } else if (out) {
      out->insert(out->end(), st.head.begin(), st.head.end());
    } else if (held) {
      return false;
    }
    st.payload_left = length;
  }
  return true;
}

}  // namespace ingressd::grpc
