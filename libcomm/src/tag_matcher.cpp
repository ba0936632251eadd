// Tag matching engine: hash buckets for exact tags, ordered lists for wildcards and arrivals.
#include "tag_matcher.hpp"

#include <bit>
#include <cassert>
#include <limits>

namespace comm::detail {

namespace {

/// Bucket count rounded up to a power of two, at least 1 and at most 2^32.
size_t round_bucket_count(size_t n) noexcept {
  constexpr size_t max = size_t{1} << 32;
  return std::bit_ceil(n == 0 ? 1 : (n > max ? max : n));
}

/// @returns the first receive in a bucket list waiting for exactly `tag`, or null.
tag_expected* find_exact(tag_expected* e, tag_t tag) noexcept {
  while (e != nullptr && e->tag != tag)
    e = e->hook.next;
  return e;
}

/// @returns the first wildcard receive from `w` on that accepts `tag` and was posted before
/// `sn_limit`, or null. The wildcard list is in posting order, so the scan stops at the limit.
tag_expected* find_wildcard(tag_expected* w, tag_t tag, uint64_t sn_limit) noexcept {
  for (; w != nullptr && w->sn < sn_limit; w = w->hook.next)
    if (w->accepts(tag))
      return w;
  return nullptr;
}

/// @returns the first message in a bucket list tagged exactly `tag`, or null.
tag_unexpected* find_exact(tag_unexpected* u, tag_t tag) noexcept {
  while (u != nullptr && u->tag != tag)
    u = u->bucket_hook.next;
  return u;
}

/// @returns the first message in the arrival list with `(u->tag & mask) == (tag & mask)`, or null.
tag_unexpected* find_masked(tag_unexpected* u, tag_t tag, tag_t mask) noexcept {
  while (u != nullptr && ((u->tag ^ tag) & mask) != 0)
    u = u->arrival_hook.next;
  return u;
}

}  // namespace

tag_matcher::tag_matcher(size_t bucket_count)
    : buckets_(new bucket[round_bucket_count(bucket_count)]()),
      bucket_mask_(round_bucket_count(bucket_count) - 1) {
}

tag_matcher::~tag_matcher() = default;

// -- expected ------------------------------------------------------------------------------------

void tag_matcher::post_expected(tag_expected* e) noexcept {
  assert(!e->queued());
  e->sn = ++expected_sn_;
  if (e->mask == tag_mask_full) {
    bucket& b = bucket_of(e->tag);
    b.software += !e->offloaded;
    b.expected.push_back(e);
  } else {
    wildcards_.push_back(e);
  }
  ++expected_count_;
}

tag_expected* tag_matcher::match_expected(tag_t tag) noexcept {
  bucket& b = bucket_of(tag);
  tag_expected* e = find_exact(b.expected.first, tag);
  if (!wildcards_.empty()) {
    uint64_t limit = e != nullptr ? e->sn : std::numeric_limits<uint64_t>::max();
    if (tag_expected* w = find_wildcard(wildcards_.first, tag, limit)) {
      unlink(w);
      return w;
    }
  }
  if (e != nullptr)
    unlink_exact(b, e);
  return e;
}

bool tag_matcher::software_may_take(tag_t tag) const noexcept {
  if (bucket_of(tag).software != 0) return true;
  for (const tag_expected* w = wildcards_.first; w != nullptr; w = w->hook.next) {
    if (!w->offloaded && w->accepts(tag)) return true;
  }
  return false;
}

bool tag_matcher::remove_expected(tag_expected* e) noexcept {
  if (!e->queued())
    return false;
  unlink(e);
  return true;
}

// -- unexpected ----------------------------------------------------------------------------------

void tag_matcher::add_unexpected(tag_unexpected* u) noexcept {
  assert(!u->queued());
  u->sn = ++unexpected_sn_;
  bucket_of(u->tag).unexpected.push_back(u);
  arrivals_.push_back(u);
  ++unexpected_count_;
}

tag_unexpected* tag_matcher::match_unexpected(tag_t tag, tag_t mask, bool remove) noexcept {
  tag_unexpected* u = mask == tag_mask_full ? find_exact(bucket_of(tag).unexpected.first, tag)
                                             : find_masked(arrivals_.first, tag, mask);
  if (u != nullptr && remove)
    unlink(u);
  return u;
}

bool tag_matcher::remove_unexpected(tag_unexpected* u) noexcept {
  if (!u->queued())
    return false;
  unlink(u);
  return true;
}

}  // namespace comm::detail
