// The HTTP field rules every part of ingressd shares (include/ingressd/http/syntax.hpp).
#include <gtest/gtest.h>

#include "ingressd/http/syntax.hpp"

namespace ingressd::http {
namespace {

TEST(HttpSyntax, Tokens) {
  EXPECT_TRUE(is_token("x-session-id"));
  EXPECT_TRUE(is_token("serve_multiplexed_model_id"));
  EXPECT_TRUE(is_token("!#$%&'*+-.^_`|~09azAZ"));
  EXPECT_FALSE(is_token(""));
  for (const char* bad : {"a b", "a:b", "a\r", "a\n", "a\"", "a(b)", "a,b", "a;b", "a=b", "a{b}", "\x7f", "\x80"})
    EXPECT_FALSE(is_token(bad)) << bad;
}

TEST(HttpSyntax, FieldValues) {
  EXPECT_TRUE(valid_field_value(""));
  EXPECT_TRUE(valid_field_value("text/plain; q=0.5\t\x80"));
  EXPECT_FALSE(valid_field_value("a\rb"));
  EXPECT_FALSE(valid_field_value("a\nb"));
  EXPECT_FALSE(valid_field_value(std::string_view("a\0b", 3)));
}

TEST(HttpSyntax, OwnedFields) {
  for (const char* f : {"X-Request-Id", "x-forwarded-for", "X-FORWARDED-PROTO", "Forwarded", "x-real-ip"}) {
    EXPECT_TRUE(forwarding_field(f)) << f;
    EXPECT_TRUE(proxy_owned_field(f)) << f;
    EXPECT_TRUE(reserved_for_router(f)) << f;
  }
  // The router's own namespace: never from a client, always allowed from a router.
  for (const char* f : {"x-serve-router-model", "X-Serve-Router-", "x-SERVE-router-tenant"}) {
    EXPECT_TRUE(router_owned_field(f)) << f;
    EXPECT_TRUE(proxy_owned_field(f)) << f;
    EXPECT_FALSE(reserved_for_router(f)) << f;
  }
  for (const char* f : {"x-serve-route", "x-serve-routerless", "x-session-id", "content-type", "xff", "f"}) {
    EXPECT_FALSE(proxy_owned_field(f)) << f;
  }
  // Framing and hop-by-hop: a router may not set them either.
  for (const char* f : {"Host", "content-length", "Transfer-Encoding", "connection", "keep-alive", "proxy-connection",
                        "te", "upgrade", "expect", "trailer"}) {
    EXPECT_TRUE(reserved_for_router(f)) << f;
    EXPECT_FALSE(proxy_owned_field(f)) << f;
  }
  EXPECT_FALSE(reserved_for_router("serve_multiplexed_model_id"));
}

}  // namespace
}  // namespace ingressd::http
