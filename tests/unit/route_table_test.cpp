// Longest-prefix matching (contract §4.1), root_path stripping and request-target splitting.
#include <gtest/gtest.h>

#include "ingressd/routing/route_table.hpp"

namespace ingressd::routing {
namespace {

TEST(RouteTable, EmptyTableMatchesNothing) {
  const route_table t;
  EXPECT_FALSE(t.match("/").has_value());
  EXPECT_FALSE(t.match("/x").has_value());
  EXPECT_FALSE(route_table(std::vector<std::string>{}).match("/").has_value());
}

TEST(RouteTable, ExactAndSegmentBoundary) {
  const route_table t({"/api"});
  EXPECT_EQ(t.match("/api"), 0u);
  EXPECT_EQ(t.match("/api/"), 0u);
  EXPECT_EQ(t.match("/api/v1/chat"), 0u);
  EXPECT_FALSE(t.match("/apix").has_value());
  EXPECT_FALSE(t.match("/ap").has_value());
  EXPECT_FALSE(t.match("/").has_value());
  EXPECT_FALSE(t.match("").has_value());
  EXPECT_FALSE(t.match("/API").has_value());  // paths are case-sensitive
}

TEST(RouteTable, RootIsCatchAll) {
  const route_table t({"/"});
  EXPECT_EQ(t.match("/"), 0u);
  EXPECT_EQ(t.match("/anything/at/all"), 0u);
  EXPECT_EQ(t.match("/apix"), 0u);
  EXPECT_EQ(t.match(""), 0u);
  EXPECT_EQ(t.match("*"), 0u);
}

TEST(RouteTable, LongestPrefixWinsRegardlessOfOrder) {
  // App indices follow the input order; the table's internal order must not leak.
  const route_table t({"/", "/v1", "/v1/chat", "/v2"});
  EXPECT_EQ(t.match("/v1/chat"), 2u);
  EXPECT_EQ(t.match("/v1/chat/completions"), 2u);
  EXPECT_EQ(t.match("/v1/chatx"), 1u);
  EXPECT_EQ(t.match("/v1/models"), 1u);
  EXPECT_EQ(t.match("/v1"), 1u);
  EXPECT_EQ(t.match("/v2/x"), 3u);
  EXPECT_EQ(t.match("/v3"), 0u);
  EXPECT_EQ(t.match("/"), 0u);

  const route_table reversed({"/v1/chat", "/v1", "/"});
  EXPECT_EQ(reversed.match("/v1/chat/x"), 0u);
  EXPECT_EQ(reversed.match("/v1/x"), 1u);
  EXPECT_EQ(reversed.match("/x"), 2u);
}

TEST(RouteTable, SiblingPrefixesDoNotShadowEachOther) {
  const route_table t({"/a", "/ab", "/abc"});
  EXPECT_EQ(t.match("/a/bc"), 0u);
  EXPECT_EQ(t.match("/ab"), 1u);
  EXPECT_EQ(t.match("/abc/d"), 2u);
  EXPECT_FALSE(t.match("/abcd").has_value());
}

TEST(RouteTableStripRootPath, Cases) {
  EXPECT_EQ(strip_root_path("/x", ""), "/x");
  EXPECT_EQ(strip_root_path("/", ""), "/");
  EXPECT_EQ(strip_root_path("/root", "/root"), "/");
  EXPECT_EQ(strip_root_path("/root/", "/root"), "/");
  EXPECT_EQ(strip_root_path("/root/x", "/root"), "/x");
  EXPECT_EQ(strip_root_path("/root/x/y", "/root"), "/x/y");
  EXPECT_FALSE(strip_root_path("/rootx", "/root").has_value());
  EXPECT_FALSE(strip_root_path("/roo", "/root").has_value());
  EXPECT_FALSE(strip_root_path("/other/x", "/root").has_value());
  EXPECT_FALSE(strip_root_path("", "/root").has_value());
  // A trailing slash on the configured root, or "/" alone, changes nothing.
  EXPECT_EQ(strip_root_path("/root/x", "/root/"), "/x");
  EXPECT_EQ(strip_root_path("/x", "/"), "/x");
  EXPECT_EQ(strip_root_path("/a/b/c", "/a/b"), "/c");
}

TEST(RouteTableStripRootPath, ThenMatch) {
  const route_table t({"/api", "/"});
  auto stripped = strip_root_path("/serve/api/v1", "/serve");
  ASSERT_TRUE(stripped.has_value());
  EXPECT_EQ(t.match(*stripped), 0u);
  stripped = strip_root_path("/serve", "/serve");
  ASSERT_TRUE(stripped.has_value());
  EXPECT_EQ(t.match(*stripped), 1u);
}

TEST(RouteTablePathOf, Cases) {
  EXPECT_EQ(path_of("/a/b?x=1&y=2"), "/a/b");
  EXPECT_EQ(path_of("/a/b"), "/a/b");
  EXPECT_EQ(path_of("/?"), "/");
  EXPECT_EQ(path_of("?q"), "");
  EXPECT_EQ(path_of(""), "");
  EXPECT_EQ(path_of("/a?b?c"), "/a");
}

}  // namespace
}  // namespace ingressd::routing
