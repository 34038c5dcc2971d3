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

frame_screen::result frame_screen::feed(std::span<const std::uint8_t> in, std::size_t max_header_bytes) {
  if (st_.over) return {{}, conn_error::header_list};
  // Nearly every read passes unchanged: scan a copy of the state, and copy bytes only when a
  // reset is dropped, a frame header is held or a header block goes over.
  if (st_.head_have == 0) {
    state trial = st_;
    if (scan(trial, in, max_header_bytes, nullptr)) {
      st_ = trial;
      return {in, std::nullopt};
    }
  }
  out_.clear();
  out_.reserve(in.size() + st_.head.size());
  scan(st_, in, max_header_bytes, &out_);
  return {out_, st_.over ? std::optional(conn_error::header_list) : std::nullopt};
}

std::size_t frame_screen::walk(hpack_walk& w, std::span<const std::uint8_t> in, std::size_t limit) {
  using at = hpack_walk::at;
  std::size_t i = 0;
  while (i < in.size()) {
    if (w.lost) return in.size();
    const std::uint8_t b = in[i];
    switch (w.where) {
      case at::string: {
        const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(w.value, in.size() - i));
        i += k;
        w.value -= k;
        if (w.value == 0) w.where = w.strings > 0 ? at::length : at::field;
        continue;
      }
      case at::field: {
        // The representation (RFC 7541 §6) and its integer prefix: indexed 1xxxxxxx, literal
        // with indexing 01xxxxxx, table size update 001xxxxx, literal without or never indexed
        // 000xxxxx. A literal's name is a string when its index is 0.
        std::uint8_t mask = 0x0f;
        bool field = true;
        if (b & 0x80) {
          mask = 0x7f;
          w.strings = 0;
        } else if (b & 0x40) {
          mask = 0x3f;
          w.strings = (b & mask) == 0 ? 2 : 1;
        } else if (b & 0x20) {
          mask = 0x1f;
          w.strings = 0;
          field = false;
        } else {
          w.strings = (b & mask) == 0 ? 2 : 1;
        }
        if (field) {
          if (w.least + 32 > limit) return i;
          w.least += 32;
        }
        ++i;
        w.where = (b & mask) == mask ? at::integer : w.strings > 0 ? at::length : at::field;
        continue;
      }
      case at::integer:  // the rest of an index or table size, which does not matter here
        ++i;
        if (!(b & 0x80)) w.where = w.strings > 0 ? at::length : at::field;
        continue;
      case at::length:  // H and a 7-bit prefix
        w.huffman = (b & 0x80) != 0;
        w.value = b & 0x7fu;
        w.shift = 0;
        break;
      case at::length_more:
        if (w.shift > 28) {  // a sixth byte: over 32 bits, which nghttp2 refuses
          w.lost = true;
          continue;
        }
        w.value += std::uint64_t{b & 0x7fu} << w.shift;
        w.shift += 7;
        break;
    }
    // A string's length, or the part of it read so far: the bytes to come only add to it.
    const bool more = w.where == at::length ? w.value == 0x7f : (b & 0x80) != 0;
    const auto counts = !w.huffman || w.value > max_hpack_string ? w.value : w.value * 8 / 30;
    if (w.least + counts > limit) return i;
    ++i;
    if (more) {
      w.where = at::length_more;
      continue;
    }
    w.least += counts;
    --w.strings;
    w.where = w.value > 0 ? at::string : w.strings > 0 ? at::length : at::field;
  }
  return i;
}

bool frame_screen::scan(state& st, std::span<const std::uint8_t> in, std::size_t limit,
                        std::vector<std::uint8_t>* out) {
  constexpr std::uint8_t headers_type = 0x1, rst_stream_type = 0x3, continuation_type = 0x9;
  constexpr std::uint8_t end_headers_flag = 0x4, padded_flag = 0x8, priority_flag = 0x20;
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
      auto k = std::min(st.payload_left, in.size() - i);
      if (st.walking) {
        if (st.pad_pending) {
          st.pad_pending = false;
          k = 1;
          if (in[i] > st.fragment) {
            st.walking = false;  // padding past the frame: nghttp2's PROTOCOL_ERROR
          } else {
            st.fragment -= in[i];
          }
        } else if (st.front > 0) {
          k = std::min(k, st.front);
          st.front -= k;
        } else if (st.fragment > 0) {
          k = std::min(k, st.fragment);
          const auto took = walk(st.hpack, in.subspan(i, k), limit);
          if (took < k) {
            // In a trial this sends the read down the copying path, which stops here.
            if (!out) return false;
            pass(took);
            st.over = true;
            return true;
          }
          st.fragment -= k;
        }
      }
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
    const std::uint8_t type = st.head[3], flags = st.head[4];
    const std::uint32_t sid = ((std::uint32_t{st.head[5]} << 24) | (std::uint32_t{st.head[6]} << 16) |
                               (std::uint32_t{st.head[7]} << 8) | st.head[8]) & 0x7fffffffu;
    const bool client_stream = (sid & 1u) != 0;
    // A header block is HEADERS then CONTINUATIONs of its stream; any other frame in between is
    // nghttp2's PROTOCOL_ERROR, and the block's size no longer matters.
    const bool starts = type == headers_type && client_stream;
    const bool continues = type == continuation_type && st.block_sid != 0 && sid == st.block_sid;
    const bool padded_start = starts && (flags & padded_flag);
    const std::size_t front = starts && (flags & priority_flag) ? 5 : 0;
    const std::size_t before_fragment = (padded_start ? 1 : 0) + front;
    // (A frame too short for its Pad Length and PRIORITY fields is nghttp2's FRAME_SIZE_ERROR.)
    st.walking = (starts || continues) && length <= max_frame_size && length >= before_fragment;
    st.block_sid = st.walking && !(flags & end_headers_flag) ? sid : 0;
    if (st.walking) {
      if (starts) st.hpack = {};
      st.pad_pending = padded_start;
      st.front = front;
      st.fragment = length - before_fragment;
    }
    if (type == headers_type && client_stream && sid > st.max_opened) st.max_opened = sid;
    st.dropping = type == rst_stream_type && client_stream && sid > st.max_opened;
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
