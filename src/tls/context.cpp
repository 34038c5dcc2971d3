#include "ingressd/tls/context.hpp"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

namespace ingressd::tls {

namespace {

/// The OpenSSL error queue as one line ("" when empty), the queue cleared.
std::string ssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    std::array<char, 256> text{};
    ERR_error_string_n(e, text.data(), text.size());
    if (!out.empty()) out += "; ";
    out += text.data();
  }
  return out;
}

std::chrono::system_clock::time_point to_time_point(const ASN1_TIME* t) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return {};
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

std::string format_time(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  std::array<char, 32> out{};
  std::strftime(out.data(), out.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return out.data();
}

// ---------------------------------------------------------------------------------------------
// Session-ticket keys (context.hpp: ticket_key_rotation)

struct ticket_key {
  std::array<unsigned char, 16> name{};
  std::array<unsigned char, 32> aes{};
  std::array<unsigned char, 32> hmac{};
};

class ticket_ring {
 public:
  /// The key that encrypts new tickets, rotated when its period has passed.
  ticket_key current() {
    std::lock_guard lock(mu_);
    rotate_if_due();
    return keys_[0];
  }
  /// The key named `name` (current or previous); false when none is.
  bool find(const unsigned char* name, ticket_key& out) {
    std::lock_guard lock(mu_);
    rotate_if_due();
    for (std::size_t i = 0; i < count_; ++i) {
      if (std::memcmp(keys_[i].name.data(), name, keys_[i].name.size()) == 0) {
        out = keys_[i];
        return true;
      }
    }
    return false;
  }

 private:
  void rotate_if_due() {
    const auto now = std::chrono::steady_clock::now();
    if (count_ > 0 && now - made_ < ticket_key_rotation) return;
    keys_[1] = keys_[0];
    ticket_key k;
    if (RAND_bytes(k.name.data(), k.name.size()) != 1 || RAND_bytes(k.aes.data(), k.aes.size()) != 1 ||
        RAND_bytes(k.hmac.data(), k.hmac.size()) != 1) {
      return;  // no randomness now: keep the current key, try again on the next ticket
    }
    keys_[0] = k;
    count_ = count_ == 0 ? 1 : 2;
    made_ = now;
  }
  std::mutex mu_;
  std::array<ticket_key, 2> keys_{};
  std::size_t count_ = 0;
  std::chrono::steady_clock::time_point made_{};
};

ticket_ring& ring() {
  static ticket_ring r;
  return r;
}

/// OpenSSL's ticket callback (SSL_CTX_set_tlsext_ticket_key_evp_cb): 1 = use this key, 2 = it
/// decrypted, and issue a new ticket under the current key, 0 = unknown key (full handshake).
int ticket_callback(SSL*, unsigned char* name, unsigned char* iv, EVP_CIPHER_CTX* cipher, EVP_MAC_CTX* mac,
                    int encrypt) {
  ticket_key k;
  if (encrypt == 1) {
    k = ring().current();
    if (RAND_bytes(iv, 16) != 1) return -1;
    std::memcpy(name, k.name.data(), k.name.size());
  } else if (!ring().find(name, k)) {
    return 0;
  }
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, k.hmac.data(), k.hmac.size()),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, const_cast<char*>("SHA256"), 0),
      OSSL_PARAM_construct_end(),
  };
  if (EVP_MAC_CTX_set_params(mac, params) != 1) return -1;
  const int ok = encrypt == 1 ? EVP_EncryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, k.aes.data(), iv)
                              : EVP_DecryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, k.aes.data(), iv);
  if (ok != 1) return -1;
  // Decrypted: always issue a fresh ticket (2), not only under a newer key. TLS 1.3 tickets are
  // for one use (RFC 8446 C.4) and OpenSSL sends none after a resumption unless asked, so a
  // client would resume once and then fall back to full handshakes.
  return encrypt == 1 ? 1 : 2;
}

/// ALPN: http/1.1 whenever the client offers it, so that browsers and curl (which offer h2 first)
/// keep the HTTP/1.1 request path; h2 only to a client that offers h2 and not http/1.1 — what gRPC
/// clients do — and only with a gRPC listener (`arg` non-null): such connections are served as
/// gRPC (src/proxy/grpc/grpc_proxy.cpp). No overlap is not an error: the client may still speak
/// HTTP/1.1 without ALPN.
int alpn_select(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned inlen,
                void* arg) {
  static constexpr unsigned char http11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  static constexpr unsigned char h2[] = {2, 'h', '2'};
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, http11, sizeof http11, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
  }
  if (arg != nullptr && SSL_select_next_proto(&chosen, outlen, h2, sizeof h2, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

/// A readable file, or why not (errno's words): OpenSSL's own message for a missing file is a
/// chain of library codes an operator cannot act on.
std::string unreadable(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::strerror(errno);
  std::fclose(f);
  return {};
}

}  // namespace

std::string server_context::describe() const { return subject_ + ", valid until " + format_time(not_after_); }

server_context::~server_context() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

std::variant<std::shared_ptr<const server_context>, std::string> server_context::load(
    const config::tls_settings& s, std::chrono::system_clock::time_point now, bool h2) {
  ERR_clear_error();
  std::shared_ptr<server_context> c(new server_context());
  c->ctx_ = SSL_CTX_new(TLS_server_method());
  if (c->ctx_ == nullptr) return "tls: cannot create an OpenSSL context: " + ssl_errors();
  SSL_CTX* ctx = c->ctx_;

  if (auto why = unreadable(s.cert_file); !why.empty()) return "tls.cert_file " + s.cert_file + ": " + why;
  if (auto why = unreadable(s.key_file); !why.empty()) return "tls.key_file " + s.key_file + ": " + why;
  if (SSL_CTX_use_certificate_chain_file(ctx, s.cert_file.c_str()) != 1) {
    return "tls.cert_file " + s.cert_file + ": not a PEM certificate (chain): " + ssl_errors();
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, s.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = ssl_errors();
    if (why.find("key values mismatch") != std::string::npos) {
      return "tls.key_file " + s.key_file + ": the key does not match the certificate in " + s.cert_file;
    }
    return "tls.key_file " + s.key_file + ": not a PEM private key: " + why;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return "tls.key_file " + s.key_file + ": the key does not match the certificate in " + s.cert_file;
  }
  X509* leaf = SSL_CTX_get0_certificate(ctx);
  if (leaf == nullptr) return "tls.cert_file " + s.cert_file + ": no certificate";
  c->not_after_ = to_time_point(X509_get0_notAfter(leaf));
  const auto not_before = to_time_point(X509_get0_notBefore(leaf));
  if (now >= c->not_after_) {
    return "tls.cert_file " + s.cert_file + ": the certificate expired at " + format_time(c->not_after_);
  }
  if (now < not_before) {
    return "tls.cert_file " + s.cert_file + ": the certificate is not valid before " + format_time(not_before);
  }
  if (char* line = X509_NAME_oneline(X509_get_subject_name(leaf), nullptr, 0)) {
    c->subject_ = line;
    OPENSSL_free(line);
  }

  if (SSL_CTX_set_min_proto_version(ctx, s.min_version == "1.3" ? TLS1_3_VERSION : TLS1_2_VERSION) != 1) {
    return "tls.min_version: " + ssl_errors();
  }
  if (SSL_CTX_set_cipher_list(ctx, s.ciphers.c_str()) != 1) {
    ERR_clear_error();
    return "tls.ciphers: OpenSSL accepts none of \"" + s.ciphers + "\"";
  }
  if (SSL_CTX_set_ciphersuites(ctx, s.ciphersuites.c_str()) != 1) {
    ERR_clear_error();
    return "tls.ciphersuites: OpenSSL accepts none of \"" + s.ciphersuites + "\"";
  }

  // The server's preference order; no renegotiation (a client-driven CPU sink, and never needed
  // by HTTP/1.1 clients); no compression (CRIME).
  SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  // RELEASE_BUFFERS: an idle connection holds no record buffers (hardening H3: 10,000 idle TLS
  // connections). PARTIAL_WRITE and MOVING_WRITE_BUFFER: the session writes what the socket takes
  // and retries from wherever the rest is (tls/stream.hpp).
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE |
                            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Read ahead: one recv takes every record the socket holds (else two per record: header, body).
  SSL_CTX_set_read_ahead(ctx, 1);
  // Resumption by tickets only, keys shared by every worker and rotated (context.hpp); a server
  // session cache per context would neither cross processes nor survive a reload.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_callback);
  SSL_CTX_set_num_tickets(ctx, 1);
  static constexpr unsigned char sid_ctx[] = "ingressd";
  SSL_CTX_set_session_id_context(ctx, sid_ctx, sizeof sid_ctx - 1);
  static int h2_on = 1;  // any non-null argument: h2 may be chosen
  SSL_CTX_set_alpn_select_cb(ctx, alpn_select, h2 ? &h2_on : nullptr);
  return std::shared_ptr<const server_context>(std::move(c));
}

}  // namespace ingressd::tls
