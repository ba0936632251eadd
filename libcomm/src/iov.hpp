// Walking a request's scatter/gather list: the concatenation of its entries as one byte range.
#pragma once

#include <comm/transport/transport.hpp>
#include <comm/types.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>

namespace comm::detail {

/// Calls `visit(entry_pointer, bytes)` for each piece of [offset, offset + length) of the
/// concatenated entries, in order; stops at the end of the entries.
template <class Visit>
void for_each_piece(std::span<const iov_entry> entries, size_t offset, size_t length,
                    Visit&& visit) {
  for (const iov_entry& e : entries) {
    if (length == 0) return;
    if (offset >= e.length) {
      offset -= e.length;
      continue;
    }
    const size_t n = std::min(e.length - offset, length);
    visit(static_cast<uint8_t*>(e.buffer) + offset, n);
    length -= n;
    offset = 0;
  }
}

/// Copies bytes [offset, offset + length) of the entries into `dest`.
inline void iov_gather(std::span<const iov_entry> entries, size_t offset, uint8_t* dest,
                       size_t length) {
  for_each_piece(entries, offset, length, [&](const uint8_t* piece, size_t n) {
    std::memcpy(dest, piece, n);
    dest += n;
  });
}

/// Copies `length` bytes from `src` into the entries at `offset` (what lies past them is dropped).
inline void iov_scatter(std::span<const iov_entry> entries, size_t offset, const uint8_t* src,
                        size_t length) {
  for_each_piece(entries, offset, length, [&](uint8_t* piece, size_t n) {
    std::memcpy(piece, src, n);
    src += n;
  });
}

/// Fills `out` with at most `max` transport entries covering [offset, offset + *length) of the
/// entries; shortens *length to what they cover and returns their count.
inline size_t iov_slice(std::span<const iov_entry> entries, size_t offset, size_t* length,
                        tl::iov* out, size_t max) {
  size_t count = 0, covered = 0;
  for (const iov_entry& e : entries) {
    if (covered == *length || count == max) break;
    if (offset >= e.length) {
      offset -= e.length;
      continue;
    }
    const size_t n = std::min(e.length - offset, *length - covered);
    out[count++] = tl::iov{static_cast<uint8_t*>(e.buffer) + offset, n};
    covered += n;
    offset = 0;
  }
  *length = covered;
  return count;
}

}  // namespace comm::detail
