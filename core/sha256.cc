#include "core/sha256.h"

#include <openssl/evp.h>

#include "core/logging.h"

namespace bagpipe {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) {
    BAGPIPE_LOG(FATAL) << "OpenSSL could not initialise SHA-256";
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::Update(const void* data, size_t bytes) {
  if (EVP_DigestUpdate(impl_->ctx, data, bytes) != 1) {
    BAGPIPE_LOG(FATAL) << "OpenSSL SHA-256 update failed";
  }
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, digest, &length) != 1) {
    BAGPIPE_LOG(FATAL) << "OpenSSL SHA-256 final failed";
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

}  // namespace bagpipe
