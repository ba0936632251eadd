// The tag matching a transport does in its receiving interface, as a NIC with tag-matching offload
// does it: a bounded list of posted receives (tag, mask, iov, tag_context), matched in post order
// against each arriving tagged message, and the unexpected-message handlers that get what matches
// nothing. Shared by self and shm; a transport with matching in hardware does not need it.
//
// Posted receives live in a table of max_outstanding entries allocated once, linked in post order
// (no allocation per receive). A receive's tag_context::priv names its entry and the entry's
// generation, so a cancel of a context that is not (or no longer) posted here is recognised and
// refused rather than followed. take() unlinks the earliest matching receive and hands its iov
// back to the transport, which moves the data and then calls finish(): tag_consumed, then
// completed, with message_truncated when the message was longer than the iov. A transport whose
// data movement may fail (a peer's memory it reads) peeks instead, moves the data into the iov,
// and consumes the receive only when that worked, so a message it cannot fetch ends no receive;
// no callback may run between the peek and the consume. Callbacks may post and cancel receives:
// the matched entry is off the list before any of them runs.
//
// Not thread safe: it belongs to one interface, used by one thread.
#pragma once

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace comm::tl {

/// Most iov entries of a posted receive.
inline constexpr size_t tag_recv_max_iov = 8;

/// A posted receive taken off the list by a matching message.
struct tag_match {
  tag_context* ctx = nullptr;      ///< the receive's context
  iov entries[tag_recv_max_iov];   ///< its iov
  size_t count = 0;                ///< entries in use
  size_t capacity = 0;             ///< sum of their lengths
  uint32_t index = 0;              ///< its entry (for consume after peek)

  /// Copies `length` bytes at `data` to byte `offset` of the iov, as far as it reaches; returns
  /// the bytes copied.
  size_t scatter(size_t offset, const void* data, size_t length) const;

  /// The iov cut to its first `length` bytes, into `out` (room for tag_recv_max_iov entries);
  /// returns the entries used.
  size_t clipped(size_t length, iov* out) const;
};

/// Posted receives and unexpected handlers of one interface (see the file comment).
class tag_offload {
public:
  /// A list of at most `max_outstanding` posted receives.
  explicit tag_offload(size_t max_outstanding);
  tag_offload(const tag_offload&) = delete;
  tag_offload& operator=(const tag_offload&) = delete;

  // -- posted receives --

  /// iface::tag_recv_zcopy: ok, exceeds_limit, or invalid_param (null context, a context already
  /// posted here, more than tag_recv_max_iov entries, a null buffer with a length, a sum that
  /// overflows).
  status post(tag_t tag, tag_t mask, const iov* entries, size_t count, tag_context* ctx);

  /// iface::tag_recv_cancel: ok (completed with canceled unless `force`), or no_elem.
  status cancel(tag_context* ctx, bool force);

  /// Takes the earliest posted receive that accepts `stag` off the list into `*out`; false when
  /// none does.
  bool take(tag_t stag, tag_match* out) {
    if (!peek(stag, out)) return false;
    consume(*out);
    return true;
  }

  /// Finds the earliest posted receive that accepts `stag`, leaving it posted; false when none
  /// does. consume() it before any callback runs, or leave it.
  bool peek(tag_t stag, tag_match* out) {
    if (head_ == none) return false;  // the common case of a transport without posted receives
    return find_posted(stag, out);
  }

  /// Takes the receive found by peek() off the list.
  void consume(const tag_match& match) {
    unlink(match.index);
    ++matched_;
  }

  /// Ends a taken receive: tag_consumed, then completed with `length` (the message's) and
  /// `result`, or message_truncated when `result` is ok and `length` exceeds the iov.
  void finish(const tag_match& match, tag_t stag, uint64_t imm, size_t length, status result);

  /// Ends a taken receive with a whole eager message at `data`: copies it, then finish().
  void deliver(const tag_match& match, tag_t stag, uint64_t imm, const void* data, size_t length);

  /// Ends a taken receive with a software rendezvous request: tag_consumed, then rndv.
  void deliver_request(const tag_match& match, tag_t stag, const void* header, size_t length);

  /// Receives posted now.
  size_t posted() const { return posted_; }

  /// Most receives posted at once.
  size_t max_outstanding() const { return entries_.size(); }

  // -- unexpected messages --

  /// iface::set_tag_handlers.
  void set_handlers(tag_unexp_eager_fn eager, void* eager_arg, tag_unexp_rndv_fn rndv,
                    void* rndv_arg);

  /// Hands a fragment of an unexpected eager message to its handler (or counts it dropped: ok).
  /// Counts a message on its first fragment. Returns what the handler returned.
  status unexpected_eager(void* data, size_t length, unsigned flags, tag_t stag, uint64_t imm,
                          void** context);

  /// Hands an unexpected rendezvous (or, with remote_address 0, length 0 and no key, a software
  /// rendezvous request) to its handler, or counts it dropped.
  void unexpected_rndv(tag_t stag, const void* header, size_t header_length,
                       uint64_t remote_address, size_t length, const void* rkey,
                       size_t rkey_length);

  /// True when an unexpected eager handler is installed.
  bool has_eager_handler() const { return eager_fn_ != nullptr; }

  /// One line for iface::info(), prefixed with "<transport>: tag: ".
  std::string info(std::string_view transport) const;

private:
  static constexpr uint32_t none = UINT32_MAX;

  /// One posted receive, linked in post order.
  struct entry {
    tag_context* ctx = nullptr;  ///< null while free
    tag_t tag = 0;               ///< already masked
    tag_t mask = 0;
    uint32_t generation = 0;     ///< bumped at every post
    uint32_t prev = none;
    uint32_t next = none;        ///< also the free list's link
    tag_match match;             ///< the iov (match.ctx unused)
  };

  bool find_posted(tag_t stag, tag_match* out) const;
  /// The entry `ctx` is posted in, or none.
  uint32_t find(const tag_context* ctx) const;
  void unlink(uint32_t index);

  std::vector<entry> entries_;
  uint32_t head_ = none;   ///< oldest posted
  uint32_t tail_ = none;   ///< newest posted
  uint32_t free_ = none;   ///< free entries, linked by next
  size_t posted_ = 0;

  tag_unexp_eager_fn eager_fn_ = nullptr;
  void* eager_arg_ = nullptr;
  tag_unexp_rndv_fn rndv_fn_ = nullptr;
  void* rndv_arg_ = nullptr;

  uint64_t matched_ = 0;
  uint64_t truncated_ = 0;
  uint64_t unexpected_eager_ = 0;
  uint64_t unexpected_rndv_ = 0;
  uint64_t canceled_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace comm::tl
