// Tag matching engine of the protocol layer: pairs incoming tagged messages with posted receives.
//
// Private to libcomm/src. The matcher owns no entries: receive requests and unexpected-message
// descriptors embed a tag_expected / tag_unexpected and are linked in place (no allocation per
// operation). The only allocation is the bucket array, made once at construction.
//
// Ordering rules (MPI-like):
//  - match_expected returns the earliest *posted* receive that accepts the tag, whether it sits in
//    the tag's hash bucket (full mask) or in the wildcard list (any other mask);
//  - match_unexpected returns the earliest *arrived* message that the receive accepts.
//
// A posted receive may also sit in a transport's own tag matching (`offloaded`, tag_offload.hpp):
// it stays in this queue, in posting order, so that a message matched here still finds the
// earliest receive whoever else holds it. The matcher counts the receives that only it matches
// (software receives) per bucket, so tag_offload can tell when handing a receive to the transport
// would let the transport match it ahead of an earlier software receive.
//
// Not thread-safe: one matcher belongs to one worker.
#pragma once

#include <comm/types.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace comm::detail {

// -- intrusive list ------------------------------------------------------------------------------

/// Links of an element in one intrusive doubly linked list.
template <class T>
struct list_hook {
  T* prev = nullptr;  ///< previous element, null at the head
  T* next = nullptr;  ///< next element, null at the tail
};

/// A null-terminated doubly linked list threaded through `T::*Hook`; it never allocates.
template <class T, list_hook<T> T::*Hook>
struct intrusive_list {
  T* first = nullptr;  ///< oldest element
  T* last = nullptr;   ///< newest element

  /// @returns whether the list holds no element.
  bool empty() const noexcept { return first == nullptr; }

  /// Appends `x`, which must not be in this list.
  void push_back(T* x) noexcept {
    list_hook<T>& h = x->*Hook;
    h.prev = last;
    h.next = nullptr;
    if (last != nullptr)
      (last->*Hook).next = x;
    else
      first = x;
    last = x;
  }

  /// Unlinks `x`, which must be in this list, and clears its links.
  void erase(T* x) noexcept {
    list_hook<T>& h = x->*Hook;
    if (h.prev != nullptr)
      (h.prev->*Hook).next = h.next;
    else
      first = h.next;
    if (h.next != nullptr)
      (h.next->*Hook).prev = h.prev;
    else
      last = h.prev;
    h = {};
  }

  /// @returns the element after `x`, or null.
  static T* next(const T* x) noexcept { return (x->*Hook).next; }
};

// -- queue entries -------------------------------------------------------------------------------

/// The matching part of a posted receive; embedded in a receive request.
/// Set `tag` and `mask` before post_expected and leave them alone while the entry is queued.
struct tag_expected {
  tag_t tag = 0;   ///< the tag the receive wants (only bits under `mask` count)
  tag_t mask = 0;  ///< bits of an incoming tag that must equal `tag`; tag_mask_full = exact
  list_hook<tag_expected> hook;  ///< links in a bucket or in the wildcard list (matcher-owned)
  uint64_t sn = 0;  ///< posting sequence number, > 0 while queued, 0 when not (matcher-owned)
  /// Also posted in a transport's tag matching. Set before post_expected and left alone while the
  /// entry is queued (the matcher counts software receives by it).
  bool offloaded = false;

  /// @returns whether the entry sits in a matcher's expected queue.
  bool queued() const noexcept { return sn != 0; }
  /// @returns whether this receive accepts a message tagged `t`.
  bool accepts(tag_t t) const noexcept { return ((t ^ tag) & mask) == 0; }
};

/// The matching part of a message that arrived before its receive; embedded in an
/// unexpected-message descriptor. Set `tag` before add_unexpected and leave it alone while queued.
struct tag_unexpected {
  tag_t tag = 0;  ///< the sender's tag
  list_hook<tag_unexpected> bucket_hook;   ///< links in the tag's bucket (matcher-owned)
  list_hook<tag_unexpected> arrival_hook;  ///< links in the arrival-order list (matcher-owned)
  uint64_t sn = 0;  ///< arrival sequence number, > 0 while queued, 0 when not (matcher-owned)

  /// @returns whether the entry sits in a matcher's unexpected queue.
  bool queued() const noexcept { return sn != 0; }
};

// -- matcher -------------------------------------------------------------------------------------

/// Matches tagged messages against posted receives in MPI order; O(1) for exact tags.
class tag_matcher {
public:
  /// Default number of hash buckets.
  static constexpr size_t default_bucket_count = 1024;

  /// Allocates the bucket array.
  /// @param bucket_count rounded up to a power of two (at least 1)
  explicit tag_matcher(size_t bucket_count = default_bucket_count);
  /// Frees the buckets; entries still queued are left untouched (the matcher owns none).
  ~tag_matcher();

  tag_matcher(const tag_matcher&) = delete;
  tag_matcher& operator=(const tag_matcher&) = delete;

  // -- expected (posted receives) --

  /// Appends `e` to the expected queue; `e` must not be queued.
  void post_expected(tag_expected* e) noexcept;

  /// Removes and returns the earliest posted receive that accepts `tag`.
  /// @returns the receive, or null when none accepts `tag`
  tag_expected* match_expected(tag_t tag) noexcept;

  /// Whether a queued software (not offloaded) receive could take a message tagged `tag`: one
  /// in the tag's bucket (conservatively: any exact receive of a tag hashing there) or a wildcard
  /// receive that accepts `tag`.
  bool software_may_take(tag_t tag) const noexcept;

  /// Cancels a posted receive.
  /// @returns true if `e` was queued and is now removed, false if it was not queued
  bool remove_expected(tag_expected* e) noexcept;

  // -- unexpected (messages without a receive yet) --

  /// Appends `u` to the unexpected queue (arrival order); `u` must not be queued.
  void add_unexpected(tag_unexpected* u) noexcept;

  /// Finds the earliest arrived message whose tag `t` has `(t & mask) == (tag & mask)`.
  /// @param remove whether to remove the message found (false = probe)
  /// @returns the message, or null when none matches
  tag_unexpected* match_unexpected(tag_t tag, tag_t mask, bool remove) noexcept;

  /// Removes a message from the unexpected queue.
  /// @returns true if `u` was queued and is now removed, false if it was not queued
  bool remove_unexpected(tag_unexpected* u) noexcept;

  // -- inspection --

  /// @returns the number of posted receives.
  size_t expected_count() const noexcept { return expected_count_; }
  /// @returns the number of unexpected messages.
  size_t unexpected_count() const noexcept { return unexpected_count_; }
  /// @returns the number of hash buckets (a power of two).
  size_t bucket_count() const noexcept { return bucket_mask_ + 1; }

  /// Calls `f(tag_expected*)` for every posted receive, bucket by bucket and then the wildcard
  /// list. `f` may remove the entry it is given (e.g. remove_expected) but must not otherwise
  /// modify the matcher.
  template <class F>
  void for_each_expected(F&& f) {
    for (size_t i = 0; i <= bucket_mask_; ++i)
      visit(buckets_[i].expected, f);
    visit(wildcards_, f);
  }

  /// Calls `f(tag_unexpected*)` for every unexpected message in arrival order. `f` may remove the
  /// entry it is given (e.g. remove_unexpected) but must not otherwise modify the matcher.
  template <class F>
  void for_each_unexpected(F&& f) {
    visit(arrivals_, f);
  }

private:
  using expected_list = intrusive_list<tag_expected, &tag_expected::hook>;
  using bucket_list = intrusive_list<tag_unexpected, &tag_unexpected::bucket_hook>;
  using arrival_list = intrusive_list<tag_unexpected, &tag_unexpected::arrival_hook>;

  /// The entries of one hash value: exact-tag receives and unexpected messages, both in order.
  struct bucket {
    expected_list expected;
    bucket_list unexpected;
    size_t software = 0;  ///< receives in `expected` that are not offloaded
  };

  // The helpers below are defined here, hence inline: with -fPIC, out-of-line members could be
  // interposed and the compiler would not inline them into the operations.

  /// Mixes all 64 bits of a tag into bits 32..63 of the result: the high half is folded onto the
  /// low half (tags often differ only in a source/context field up there), then a multiply by an
  /// odd constant (2^64 / golden ratio) carries every low bit upwards.
  static uint64_t hash_tag(tag_t tag) noexcept {
    return ((tag ^ (tag >> 32)) * 0x9e3779b97f4a7c15ull) >> 32;
  }

  /// @returns the bucket of an exact tag.
  bucket& bucket_of(tag_t tag) const noexcept { return buckets_[hash_tag(tag) & bucket_mask_]; }

  /// Unlinks the queued receive `e` and marks it not queued.
  void unlink(tag_expected* e) noexcept {
    if (e->mask == tag_mask_full) return unlink_exact(bucket_of(e->tag), e);
    wildcards_.erase(e);
    e->sn = 0;
    --expected_count_;
  }

  /// Unlinks the queued exact-tag receive `e` of bucket `b` (its tag's) and marks it not queued.
  void unlink_exact(bucket& b, tag_expected* e) noexcept {
    b.software -= !e->offloaded;
    b.expected.erase(e);
    e->sn = 0;
    --expected_count_;
  }

  /// Unlinks the queued message `u` from both lists and marks it not queued.
  void unlink(tag_unexpected* u) noexcept {
    bucket_of(u->tag).unexpected.erase(u);
    arrivals_.erase(u);
    u->sn = 0;
    --unexpected_count_;
  }

  /// Calls `f` on each element of `list`, reading the next link before the call.
  template <class List, class F>
  static void visit(List& list, F& f) {
    for (auto* x = list.first; x != nullptr;) {
      auto* next = List::next(x);
      f(x);
      x = next;
    }
  }

  std::unique_ptr<bucket[]> buckets_;
  size_t bucket_mask_;            ///< bucket count - 1
  expected_list wildcards_;       ///< receives whose mask is not full, in posting order
  arrival_list arrivals_;         ///< every unexpected message, in arrival order
  uint64_t expected_sn_ = 0;      ///< last posting sequence number handed out
  uint64_t unexpected_sn_ = 0;    ///< last arrival sequence number handed out
  size_t expected_count_ = 0;
  size_t unexpected_count_ = 0;
};

}  // namespace comm::detail
