#include "service/tls_check.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace entrokv::service {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioFree> Memory(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::unique_ptr<X509, X509Free> FirstCertificate(const std::string& pem) {
  auto bio = Memory(pem);
  return std::unique_ptr<X509, X509Free>(
      bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

absl::Status Invalid(absl::string_view option, absl::string_view why) {
  ERR_clear_error();  // leave no OpenSSL error queued for gRPC's own use of the library
  return absl::InvalidArgumentError(absl::StrCat("--", option, ": ", why));
}

}  // namespace

absl::Status CheckTlsMaterial(const std::string& cert_pem, const std::string& key_pem,
                              const std::string& ca_pem) {
  const auto cert = FirstCertificate(cert_pem);
  if (cert == nullptr) return Invalid("tls_cert", "holds no PEM certificate");
  auto key_bio = Memory(key_pem);
  const std::unique_ptr<EVP_PKEY, KeyFree> key(
      key_bio == nullptr ? nullptr
                         : PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) return Invalid("tls_key", "holds no PEM private key");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return Invalid("tls_key", "does not match the certificate of --tls_cert");
  }
  if (!ca_pem.empty() && FirstCertificate(ca_pem) == nullptr) {
    return Invalid("tls_ca", "holds no PEM certificate");
  }
  ERR_clear_error();
  return absl::OkStatus();
}

}  // namespace entrokv::service
