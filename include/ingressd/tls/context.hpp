#pragma once
// The HTTPS listener's server context (contract §9 TLS): certificate chain, private key, protocol
// floor, cipher lists, ALPN and session tickets, as one OpenSSL SSL_CTX. Immutable once loaded; it
// crosses threads as std::shared_ptr<const server_context> (SIGHUP builds a new one: handshakes
// that start after the swap use it, connections keep the SSL they were made with).
#include <chrono>
#include <memory>
#include <string>
#include <variant>

#include "ingressd/config/config.hpp"

using SSL_CTX = struct ssl_ctx_st;

namespace ingressd::tls {

class server_context {
 public:
  /// Reads and checks `s.cert_file` and `s.key_file` and builds the context. The error names the
  /// key and file and says why: unreadable, not PEM, key does not match the certificate,
  /// certificate expired or not yet valid (at `now`), a cipher list OpenSSL rejects. `h2`: ALPN
  /// may choose h2 (a gRPC listener exists; see alpn_select in context.cpp).
  static std::variant<std::shared_ptr<const server_context>, std::string> load(
      const config::tls_settings& s, std::chrono::system_clock::time_point now = std::chrono::system_clock::now(),
      bool h2 = false);
  ~server_context();
  server_context(const server_context&) = delete;
  server_context& operator=(const server_context&) = delete;

  SSL_CTX* native() const { return ctx_; }
  /// The leaf certificate's notAfter (ingressd_tls_certificate_expiry_timestamp_seconds).
  std::chrono::system_clock::time_point not_after() const { return not_after_; }
  /// The leaf certificate's subject, one line (logs).
  const std::string& subject() const { return subject_; }
  /// "SUBJECT, valid until 2027-01-01T00:00:00Z" (logs, --check-config).
  std::string describe() const;

 private:
  server_context() = default;
  SSL_CTX* ctx_ = nullptr;
  std::chrono::system_clock::time_point not_after_{};
  std::string subject_;
};

/// Session-ticket keys (RFC 5077 / TLS 1.3 resumption): every worker and every context (reloads
/// included) shares one ring, so a ticket from any worker resumes on any other, and after a
/// certificate reload. A new key encrypts tickets every `rotation`; the previous one still
/// decrypts (and the ticket is renewed), so a ticket lives at most two periods and a key that
/// leaked stops being useful after that.
inline constexpr std::chrono::hours ticket_key_rotation{1};

}  // namespace ingressd::tls
