// HMAC-SHA256 challenge-response proofs (see auth.hpp).
#include "base/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cstring>
#include <vector>

namespace comm::auth {

nonce make_nonce() {
  nonce n{};
  size_t filled = 0;
  while (filled < n.size()) {
    const ssize_t got = getrandom(n.data() + filled, n.size() - filled, 0);
    if (got > 0) filled += static_cast<size_t>(got);
  }
  return n;
}

proof make_proof(std::string_view secret, std::string_view role, const uint8_t* challenge,
                 size_t challenge_length, const uint8_t* own, size_t own_length) {
  std::vector<uint8_t> input;
  input.reserve(role.size() + 1 + challenge_length + own_length);
  input.insert(input.end(), role.begin(), role.end());
  input.push_back(0);
  input.insert(input.end(), challenge, challenge + challenge_length);
  input.insert(input.end(), own, own + own_length);
  proof out{};
  unsigned length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), input.data(), input.size(),
       out.data(), &length);
  return out;
}

bool check_proof(std::string_view secret, std::string_view role, const uint8_t* challenge,
                 size_t challenge_length, const uint8_t* own, size_t own_length,
                 const uint8_t* candidate, size_t length) {
  if (candidate == nullptr || length != proof_size) return false;
  const proof expected = make_proof(secret, role, challenge, challenge_length, own, own_length);
  return CRYPTO_memcmp(expected.data(), candidate, proof_size) == 0;
}

}  // namespace comm::auth
