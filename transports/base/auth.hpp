// Challenge-response proofs over a shared secret (HMAC-SHA256 from OpenSSL's libcrypto), used by
// the connection manager and by transports that accept connections.
//
// Each side sends a fresh random nonce; a side proves it knows the secret by returning
// HMAC(secret, role || nonce it was challenged with || its own nonce). The role string keeps a
// proof made for one direction (or one purpose) from being replayed in another.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace comm::auth {

/// Bytes of a nonce.
inline constexpr size_t nonce_size = 16;
/// Bytes of a proof (SHA-256 digest).
inline constexpr size_t proof_size = 32;

using nonce = std::array<uint8_t, nonce_size>;
using proof = std::array<uint8_t, proof_size>;

/// A fresh nonce from the kernel's random source.
nonce make_nonce();

/// HMAC-SHA256(secret, role || challenge || own).
proof make_proof(std::string_view secret, std::string_view role, const uint8_t* challenge,
                 size_t challenge_length, const uint8_t* own, size_t own_length);

/// True when `candidate` (of `length` bytes) equals make_proof(...) for these inputs; compared in
/// constant time.
bool check_proof(std::string_view secret, std::string_view role, const uint8_t* challenge,
                 size_t challenge_length, const uint8_t* own, size_t own_length,
                 const uint8_t* candidate, size_t length);

}  // namespace comm::auth
