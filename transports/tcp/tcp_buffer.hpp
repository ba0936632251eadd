// A bounded byte queue with 8-byte aligned storage: the send buffer of a tcp endpoint and the
// receive buffer of a tcp connection. Bytes are appended at the tail and consumed at the head; the
// queue moves its contents to the front only when the tail has no room, so its offsets stay
// multiples of 8 whenever everything appended is (as frames are).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace comm::tl::tcp {

class byte_queue {
public:
  byte_queue() = default;

  /// A queue of `capacity` bytes (rounded up to a multiple of 8); its memory is not touched yet.
  explicit byte_queue(size_t capacity)
      : words_(new uint64_t[(capacity + 7) / 8]), capacity_((capacity + 7) & ~size_t{7}) {}

  /// First queued byte (8-byte aligned when everything consumed so far was a multiple of 8).
  uint8_t* data() { return base() + head_; }
  const uint8_t* data() const { return base() + head_; }

  /// Queued bytes.
  size_t size() const { return tail_ - head_; }

  /// True when nothing is queued.
  bool empty() const { return head_ == tail_; }

  /// Total room.
  size_t capacity() const { return capacity_; }

  /// True when `length` more bytes fit (possibly after moving the contents to the front).
  bool fits(size_t length) const { return size() + length <= capacity_; }

  /// Room for `length` bytes at the tail, moving the contents to the front if needed; null when
  /// they do not fit. commit() what was written.
  uint8_t* reserve(size_t length) {
    if (!fits(length)) return nullptr;
    if (capacity_ - tail_ < length) compact();
    return base() + tail_;
  }

  /// Free bytes after the tail, moving the contents to the front first when less than
  /// `at_least` are free.
  size_t tail_room(size_t at_least) {
    if (capacity_ - tail_ < at_least && head_ != 0) compact();
    return capacity_ - tail_;
  }

  /// The tail, where reserve()d or tail_room() bytes are written.
  uint8_t* tail() { return base() + tail_; }

  /// Appends `length` bytes written at tail().
  void commit(size_t length) { tail_ += length; }

  /// Drops `length` bytes from the head.
  void consume(size_t length) {
    head_ += length;
    if (head_ == tail_) head_ = tail_ = 0;
  }

  /// Drops everything.
  void clear() { head_ = tail_ = 0; }

  /// Moves the queued bytes to the front of `fresh` (capacity() bytes) and keeps it as storage;
  /// returns the old storage (for a receive buffer holding a descriptor an am handler kept).
  std::unique_ptr<uint64_t[]> replace_storage(std::unique_ptr<uint64_t[]> fresh) {
    if (size() != 0) std::memcpy(fresh.get(), data(), size());
    tail_ -= head_;
    head_ = 0;
    words_.swap(fresh);
    return fresh;
  }

  /// Moves the queued bytes to the front.
  void compact() {
    if (head_ == 0) return;
    std::memmove(base(), base() + head_, size());
    tail_ -= head_;
    head_ = 0;
  }

private:
  uint8_t* base() { return reinterpret_cast<uint8_t*>(words_.get()); }
  const uint8_t* base() const { return reinterpret_cast<const uint8_t*>(words_.get()); }

  std::unique_ptr<uint64_t[]> words_;
  size_t capacity_ = 0;
  size_t head_ = 0;
  size_t tail_ = 0;
};

}  // namespace comm::tl::tcp
