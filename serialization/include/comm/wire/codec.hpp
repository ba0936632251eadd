// Codec helpers for libcomm's Cap'n Proto wire headers.
//
// Hot-path headers are data-only Cap'n Proto structs. A sender keeps one header_writer per header
// type alive and only calls setters per message, then copies the few words into the transport
// buffer; a receiver validates the root pointer word (struct pointer, offset 0, no pointers, data
// section inside the received bytes) and reads the fields in place. No builder or reader is
// constructed per message, and nothing a peer sent is read unchecked.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "schema/wire.capnp.h"

namespace comm::wire {

/// Size in bytes of a data-only header struct on the wire: its root pointer plus data section.
template <class Struct>
constexpr size_t header_size() {
  static_assert(Struct::_capnpPrivate::pointerCount == 0, "hot-path headers must be data-only");
  return (1 + Struct::_capnpPrivate::dataWordSize) * sizeof(capnp::word);
}

/// The root pointer word a data-only struct of `data_words` words is encoded with.
constexpr uint64_t root_pointer_word(uint16_t data_words) {
  return static_cast<uint64_t>(data_words) << 32;
}

/// A long-lived builder for one data-only header type. Set the fields through `fields()` and copy
/// `bytes()`/`size()` onto the wire. Every field keeps its last value, so set all of them.
template <class Struct>
class header_writer {
public:
  header_writer() : root_(message_.initRoot<Struct>()) {
    auto segments = message_.getSegmentsForOutput();
    words_ = segments[0].begin();
  }
  header_writer(const header_writer&) = delete;
  header_writer& operator=(const header_writer&) = delete;

  /// The header's fields.
  typename Struct::Builder& fields() { return root_; }

  /// The encoded header, valid until the next setter call.
  const void* bytes() const { return words_; }

  /// Encoded length in bytes.
  static constexpr size_t size() { return header_size<Struct>(); }

  /// Copies the encoded header to `dst` (which must have size() bytes) and returns size().
  size_t copy_to(void* dst) const {
    std::memcpy(dst, words_, size());
    return size();
  }

private:
  capnp::MallocMessageBuilder message_{2 + Struct::_capnpPrivate::dataWordSize};
  typename Struct::Builder root_;
  const capnp::word* words_ = nullptr;
};

/// Reads a data-only header in place from `data` (8-byte aligned, `length` bytes available).
/// Returns nothing when the bytes are not a well-formed header of this type: too short, not a
/// struct pointer, a non-zero offset, pointers where none belong, or a data section that runs past
/// the received bytes. A data section larger than ours (a newer peer) is accepted; extra words are
/// ignored. The header occupies `consumed` bytes on success.
template <class Struct>
std::optional<typename Struct::Reader> read_header(const void* data, size_t length,
                                                   size_t* consumed = nullptr) {
  if (length < sizeof(uint64_t) || (reinterpret_cast<uintptr_t>(data) & 7u) != 0) {
    return std::nullopt;
  }
  uint64_t root;
  std::memcpy(&root, data, sizeof(root));
  const uint32_t low = static_cast<uint32_t>(root);
  const uint16_t data_words = static_cast<uint16_t>(root >> 32);
  const uint16_t pointer_words = static_cast<uint16_t>(root >> 48);
  if (low != 0 || pointer_words != 0 || data_words < Struct::_capnpPrivate::dataWordSize) {
    return std::nullopt;
  }
  const size_t bytes = (1 + static_cast<size_t>(data_words)) * sizeof(capnp::word);
  if (bytes > length) {
    return std::nullopt;
  }
  if (consumed != nullptr) {
    *consumed = bytes;
  }
  // The root pointer is checked: the data section follows it and lies inside the bytes, so it is
  // read in place as a data-only struct (inline, bounded by data_words, no library call).
  const auto* words = static_cast<const capnp::word*>(data) + 1;
  return capnp::readDataStruct<Struct>(kj::arrayPtr(words, data_words));
}

/// Limits for checked readers of headers that carry pointers (addresses, keys).
inline capnp::ReaderOptions checked_reader_options() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 1u << 16;
  options.nestingLimit = 8;
  return options;
}

/// Messages of at most this many words are copied to the stack by read_checked_message, larger
/// ones to the heap.
inline constexpr size_t checked_message_stack_words = 64;

/// Reads a message with pointers (an address, a key, an announcement) as a peer sent it: copies
/// the `length` bytes at `data` (any alignment) into word-aligned memory of its own (the sender
/// cannot change what is read while it is checked) and calls `read` with its root of type
/// `Struct`, read under checked_reader_options(). Returns false, having caught what the reader
/// threw, for bytes that are not such a message: null, shorter than two words, not a whole
/// number of words, or malformed anywhere `read` looks.
template <class Struct, class Read>
bool read_checked_message(const void* data, size_t length, Read&& read) {
  if (data == nullptr || length < 2 * sizeof(capnp::word) || length % sizeof(capnp::word) != 0) {
    return false;
  }
  const size_t count = length / sizeof(capnp::word);
  capnp::word stack[checked_message_stack_words];
  kj::Array<capnp::word> heap;
  kj::ArrayPtr<capnp::word> words;
  if (count <= checked_message_stack_words) {
    words = kj::arrayPtr(stack, count);
  } else {
    heap = kj::heapArray<capnp::word>(count);
    words = heap.asPtr();
  }
  std::memcpy(words.begin(), data, length);
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(words, checked_reader_options());
    read(reader.getRoot<Struct>());
  });
  return failure == nullptr;
}

}  // namespace comm::wire
