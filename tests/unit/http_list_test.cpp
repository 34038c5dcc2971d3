// RFC 9110 §5.6.1 list splitting (include/ingressd/http/list.hpp), the one tokenizer behind
// Connection, Transfer-Encoding and X-Forwarded-For.
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "ingressd/http/list.hpp"

namespace ingressd::http {
namespace {

std::vector<std::string> split(std::string_view value, empty_elements empties) {
  std::vector<std::string> out;
  for (const auto e : list_elements(value, empties)) out.emplace_back(e);
  return out;
}

struct list_case {
  std::string_view value;
  std::vector<std::string> skipped;  // empty_elements::skip
  std::vector<std::string> kept;     // empty_elements::keep
};

using v = std::vector<std::string>;

TEST(HttpList, ElementsTable) {
  const std::vector<list_case> cases{
      {"", {}, {""}},
      {" ", {}, {""}},
      {"\t \t", {}, {""}},
      {"a", {"a"}, {"a"}},
      {"  a\t", {"a"}, {"a"}},
      {"a,b", {"a", "b"}, {"a", "b"}},
      {"a , \tb\t,c", {"a", "b", "c"}, {"a", "b", "c"}},
      {"a,,b", {"a", "b"}, {"a", "", "b"}},
      {"a, ,b", {"a", "b"}, {"a", "", "b"}},
      {",a", {"a"}, {"", "a"}},
      {"a,", {"a"}, {"a", ""}},
      {"a, ", {"a"}, {"a", ""}},
      {",", {}, {"", ""}},
      {" , ,", {}, {"", "", ""}},
      // Only SP and HTAB are OWS; the inside of an element is left as it is.
      {"gzip; q=1 , chunked", {"gzip; q=1", "chunked"}, {"gzip; q=1", "chunked"}},
      {"a b,c", {"a b", "c"}, {"a b", "c"}},
      {"\ra\r", {"\ra\r"}, {"\ra\r"}},
      {"[2001:db8::1]:80, 10.0.0.1", {"[2001:db8::1]:80", "10.0.0.1"}, {"[2001:db8::1]:80", "10.0.0.1"}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(split(c.value, empty_elements::skip), c.skipped) << '"' << c.value << '"';
    EXPECT_EQ(split(c.value, empty_elements::keep), c.kept) << '"' << c.value << '"';
  }
}

TEST(HttpList, SkipIsTheDefault) {
  std::vector<std::string> out;
  for (const auto e : list_elements(",x,,")) out.emplace_back(e);
  EXPECT_EQ(out, v{"x"});
}

TEST(HttpList, ElementsAreViewsIntoTheValue) {
  const std::string value = "close, X-A";
  auto it = list_elements(value).begin();
  ASSERT_FALSE(it == std::default_sentinel);
  EXPECT_EQ((*it).data(), value.data());
  ++it;
  ASSERT_FALSE(it == std::default_sentinel);
  EXPECT_EQ((*it).data(), value.data() + 7);
  it++;
  EXPECT_TRUE(it == std::default_sentinel);
}

TEST(HttpList, ContainsTable) {
  struct contains_case {
    std::string_view value, token;
    bool listed;
  };
  const std::vector<contains_case> cases{
      {"close", "close", true},
      {"Close", "close", true},
      {"keep-alive, CLOSE", "close", true},
      {"close, X-A ,x-b", "x-a", true},
      {"close, X-A ,x-b", "X-B", true},
      {"close, X-A ,x-b", "x", false},
      {"closed", "close", false},
      {"x-close", "close", false},
      {"", "close", false},
      {"a,,b", "", false},  // an empty element names nothing
      {"a, ", "", false},
      {"", "", false},
  };
  for (const auto& c : cases)
    EXPECT_EQ(list_contains(c.value, c.token), c.listed) << '"' << c.value << "\" / \"" << c.token << '"';
}

}  // namespace
}  // namespace ingressd::http
