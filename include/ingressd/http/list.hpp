#pragma once
// RFC 9110 §5.6.1 lists (`#element`): the comma-separated field values ingressd reads
// (Connection, Transfer-Encoding, X-Forwarded-For) split one way in one place. Sans-I/O, no
// allocation: the elements are views into the value.
#include <cstddef>
#include <iterator>
#include <string_view>

#include "ingressd/core/text.hpp"

namespace ingressd::http {

/// Empty elements ("a,,b", "a, ", " "): RFC 9110 §5.6.1.2 has a recipient ignore them, which is
/// right for lists of names (Connection). Fields ingressd refuses when they have a hole
/// (Transfer-Encoding, an X-Forwarded-For chain) need to see them: `keep`, where a value of n
/// commas always has n + 1 elements, an empty value one empty element.
enum class empty_elements { skip, keep };

/// The elements of one list value, in order, each without the optional whitespace around it:
/// `for (std::string_view e : list_elements(value)) ...`.
class list_elements {
 public:
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    using pointer = const std::string_view*;
    using reference = std::string_view;

    iterator() = default;
    std::string_view operator*() const noexcept { return element_; }
    iterator& operator++() noexcept {
      advance();
      return *this;
    }
    iterator operator++(int) noexcept {
      auto before = *this;
      advance();
      return before;
    }
    friend bool operator==(const iterator& i, std::default_sentinel_t) noexcept { return i.done_; }

   private:
    friend class list_elements;
    iterator(std::string_view value, empty_elements empties) noexcept
        : rest_(value), more_(true), done_(false), keep_empty_(empties == empty_elements::keep) {
      advance();
    }
    void advance() noexcept {
      for (;;) {
        if (!more_) {
          done_ = true;
          return;
        }
        const auto comma = rest_.find(',');
        element_ = trim_ows(rest_.substr(0, comma));
        if (comma == std::string_view::npos) {
          more_ = false;
          rest_ = {};
        } else {
          rest_.remove_prefix(comma + 1);
        }
        if (keep_empty_ || !element_.empty()) return;
      }
    }

    std::string_view rest_;     // after the element's comma
    std::string_view element_;  // the current element
    bool more_ = false;         // a comma was seen: another element follows, maybe empty
    bool done_ = true;
    bool keep_empty_ = false;
  };

  explicit constexpr list_elements(std::string_view value, empty_elements empties = empty_elements::skip) noexcept
      : value_(value), empties_(empties) {}
  iterator begin() const noexcept { return iterator(value_, empties_); }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  std::string_view value_;
  empty_elements empties_;
};

/// True when one of the list's elements is `token`, compared case-insensitively (Connection
/// options, field names). An empty `token` is never listed: empty elements do not count.
inline bool list_contains(std::string_view value, std::string_view token) noexcept {
  for (const auto element : list_elements(value))
    if (iequals(element, token)) return true;
  return false;
}

}  // namespace ingressd::http
