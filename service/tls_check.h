// Checks the PEM files of --tls_cert, --tls_key and --tls_ca before anything is bound: gRPC
// would only find them unusable when the server starts, and then blame --listen.
#ifndef ENTROKV_SERVICE_TLS_CHECK_H_
#define ENTROKV_SERVICE_TLS_CHECK_H_

#include <string>

#include "absl/status/status.h"

namespace entrokv::service {

// INVALID_ARGUMENT naming the option: a certificate file without a PEM certificate, a key file
// without a PEM private key, a key that does not match the certificate, a CA file without a
// certificate. The contents are given, not the paths (the caller read them).
[[nodiscard]] absl::Status CheckTlsMaterial(const std::string& cert_pem, const std::string& key_pem,
                                            const std::string& ca_pem);

}  // namespace entrokv::service

#endif  // ENTROKV_SERVICE_TLS_CHECK_H_
