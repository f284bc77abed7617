// Incremental SHA-256 (OpenSSL's libcrypto), used to fingerprint parameters in run summaries.
// Not thread-safe: one hasher per thread.
#ifndef BAGPIPE_CORE_SHA256_H_
#define BAGPIPE_CORE_SHA256_H_

#include <cstddef>
#include <memory>
#include <string>

namespace bagpipe {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t bytes);
  // Returns the lowercase hex digest. The hasher must not be updated afterwards.
  std::string HexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_SHA256_H_
