#include "fakes/certs.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>

namespace ingressd::testing {

namespace {

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("make_cert: ") + what);
}

void add_extension(X509* cert, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  check(ext != nullptr, "extension");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

void write_pem(const std::filesystem::path& path, auto write) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  check(f != nullptr, "open output file");
  const bool ok = write(f);
  std::fclose(f);
  check(ok, "write PEM");
}

}  // namespace

cert_files make_cert(const std::filesystem::path& dir, const std::string& stem, const cert_spec& spec) {
  pkey_ptr key(spec.type == key_type::rsa_2048 ? EVP_RSA_gen(2048) : EVP_EC_gen("P-256"));
  check(key != nullptr, "key generation");
  x509_ptr cert(X509_new());
  check(cert != nullptr, "X509_new");
  X509_set_version(cert.get(), 2);
  std::random_device rd;
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), static_cast<long>(rd() & 0x7fffffff));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), static_cast<long>(spec.not_before.count()));
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(spec.not_after.count()));
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(spec.common_name.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  add_extension(cert.get(), NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
  add_extension(cert.get(), NID_basic_constraints, "critical,CA:TRUE");
  check(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0, "sign");

  cert_files out{(dir / (stem + ".cert.pem")).string(), (dir / (stem + ".key.pem")).string()};
  write_pem(out.cert, [&](std::FILE* f) { return PEM_write_X509(f, cert.get()) == 1; });
  write_pem(out.key, [&](std::FILE* f) {
    return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
  });
  return out;
}

temp_dir::temp_dir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() / ("ingressd-test-" + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

temp_dir::~temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace ingressd::testing
