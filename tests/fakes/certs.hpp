#pragma once
// Certificates for the TLS tests, made with OpenSSL in the test's own temporary directory: a key
// (ECDSA P-256 or RSA 2048) and a self-signed certificate for "localhost" and 127.0.0.1 whose
// validity window is given relative to now, so expired and not-yet-valid ones are as easy to make
// as good ones.
#include <chrono>
#include <filesystem>
#include <string>

namespace ingressd::testing {

enum class key_type { ecdsa_p256, rsa_2048 };

struct cert_files {
  std::string cert;  ///< PEM certificate (also the CA a client verifies it with: self-signed)
  std::string key;   ///< PEM private key
};

struct cert_spec {
  std::string common_name = "localhost";
  key_type type = key_type::ecdsa_p256;
  std::chrono::seconds not_before = std::chrono::hours(-1);  ///< relative to now
  std::chrono::seconds not_after = std::chrono::hours(24);
};

/// Writes `<dir>/<stem>.cert.pem` and `<dir>/<stem>.key.pem`. Throws std::runtime_error on failure.
cert_files make_cert(const std::filesystem::path& dir, const std::string& stem, const cert_spec& spec = {});

/// A fresh directory under the system temp dir, removed when the object goes.
class temp_dir {
 public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace ingressd::testing
