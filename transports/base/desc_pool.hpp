// Descriptors lent to active-message handlers (am_flag_desc): blocks of a transport's private
// receive memory that a handler keeps by returning in_progress, until iface::release_am_desc. The
// transport takes a replacement to receive into and hands the kept block to the pool, so the kept
// bytes are never reused. At most `limit` blocks are lent at once and at most `limit`
// released ones are kept as spares: beyond its own receive memory, an interface holds at most
// 2 x limit blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace comm::tl {

/// Blocks lent to am handlers and spares to replace them (see the file comment).
class desc_pool {
public:
  /// A block of 8-byte words.
  using block = std::unique_ptr<uint64_t[]>;

  /// A pool lending at most `limit` blocks at once.
  explicit desc_pool(size_t limit) : limit_(limit) {}

  /// Most blocks lent at once.
  size_t limit() const { return limit_; }

  /// Blocks lent now.
  size_t lent() const { return lent_.size(); }

  /// True when one more block may be lent.
  bool can_lend() const { return lent_.size() < limit_; }

  /// A block of at least `bytes` to receive into in place of one about to be lent: a spare when
  /// one is large enough, else a new one.
  block replacement(size_t bytes) {
    for (size_t i = 0; i < spare_.size(); ++i) {
      if (spare_[i].bytes < bytes) continue;
      block fresh = std::move(spare_[i].memory);
      spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
      return fresh;
    }
    return block(new uint64_t[(bytes + 7) / 8]);
  }

  /// Takes `kept` (`bytes` long, holding a descriptor a handler kept) until release().
  void lend(block kept, size_t bytes) { lent_.push_back({std::move(kept), bytes}); }

  /// Takes back the lent block that holds `data`, keeping it as a spare (or freeing it when
  /// `limit` spares are kept); false when no lent block holds `data`.
  bool release(const void* data) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < lent_.size(); ++i) {
      const auto* start = reinterpret_cast<const uint8_t*>(lent_[i].memory.get());
      if (p < start || p >= start + lent_[i].bytes) continue;
      if (spare_.size() < limit_) spare_.push_back(std::move(lent_[i]));
      lent_.erase(lent_.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
    return false;
  }

private:
  struct entry {
    block memory;
    size_t bytes = 0;
  };
  size_t limit_;
  std::vector<entry> lent_;   ///< kept by handlers
  std::vector<entry> spare_;  ///< released, reused by lend()
};

}  // namespace comm::tl
