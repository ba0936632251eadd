// Counter-based random streams: one per logical process, keyed by (seed, LP id), so that an LP
// draws the same numbers whatever process or partition it runs in.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace comm::sim {

/// SplitMix64's output function (Steele, Lea and Flood): a bijection of 64 bits whose output
/// passes BigCrush when fed a Weyl sequence.
constexpr uint64_t mix64(uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A random stream in the SplitMix style: draw i is mix64(origin + i * gamma), a pure function of
/// the seed, the stream number and i. Each stream has its own odd gamma, so two streams are not
/// shifted copies of one sequence. Draws can be undone (rewind) for reverse computation.
class random_stream {
public:
  /// A stream that is not keyed yet (all zero: draws are still well defined).
  random_stream() = default;

  /// Stream number `stream` (an LP id) of the family chosen by `seed`.
  random_stream(uint64_t seed, uint64_t stream) noexcept
      : origin_(mix64(seed ^ mix64(stream))),
        gamma_(make_gamma(mix64(seed + 0x9e3779b97f4a7c15ull * (stream + 1)))) {}

  /// The next 64 random bits.
  uint64_t next() noexcept { return mix64(origin_ + ++count_ * gamma_); }

  /// A double uniform in [0, 1), with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  /// An integer uniform in [low, high] (inclusive; low <= high), without bias (Lemire's
  /// multiply-and-reject).
  uint64_t integer(uint64_t low, uint64_t high) noexcept {
    const uint64_t range = high - low + 1;
    if (range == 0) return next();  // the whole 64-bit range
    unsigned __int128 product = static_cast<unsigned __int128>(next()) * range;
    if (static_cast<uint64_t>(product) < range) {
      const uint64_t threshold = (0 - range) % range;
      while (static_cast<uint64_t>(product) < threshold) {
        product = static_cast<unsigned __int128>(next()) * range;
      }
    }
    return low + static_cast<uint64_t>(product >> 64);
  }

  /// An exponentially distributed double with the given mean (0 for a mean of 0, without a draw).
  double exponential(double mean) noexcept {
    if (mean == 0) return 0;
    return -mean * std::log1p(-uniform());
  }

  /// Number of 64-bit draws made so far.
  uint64_t draws() const noexcept { return count_; }

  /// Takes back the last `n` draws (reverse computation), n <= draws().
  void rewind(uint64_t n) noexcept { count_ -= n; }

private:
  /// An odd increment with enough bit transitions to give a good Weyl sequence.
  static constexpr uint64_t make_gamma(uint64_t z) noexcept {
    z |= 1;
    if (std::popcount(z ^ (z >> 1)) < 24) z ^= 0xaaaaaaaaaaaaaaaaull;
    return z;
  }

  uint64_t origin_ = 0;
  uint64_t gamma_ = 1;
  uint64_t count_ = 0;
};

}  // namespace comm::sim
