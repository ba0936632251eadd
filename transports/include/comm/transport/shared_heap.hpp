// The process-wide shared heap: memory that peers on this host can map. Blocks live in memfd
// segments (transports/shm/shm_heap.hpp); when the remote buffer of an shm get/put lies in one,
// the peer maps the segment once and copies with memcpy instead of cross-memory attach.
// libcomm's comm::mem_alloc and comm::mem_free are these two functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace comm::tl {

/// Allocates `length` bytes (0 counts as 1), page aligned, in a shared segment, populated so its
/// first use takes no page faults. Falls back to plain page-aligned heap memory when no segment
/// can be made (no memfd, out of file descriptors). Thread-safe; null without memory.
void* shared_alloc(size_t length) noexcept;

/// Frees a block of shared_alloc, or any block of malloc/posix_memalign (handed to std::free).
/// Thread-safe, valid at any time (also after every interface is closed). Null is ignored.
void shared_free(void* block) noexcept;

/// What the shared heap of this process holds, for tests and info.
struct shared_heap_stats {
  size_t segments = 0;        ///< memfd segments mapped (live, cached and slabs)
  size_t live_blocks = 0;     ///< blocks handed out and not yet freed
  size_t cached_segments = 0; ///< freed large blocks kept for reuse
  size_t cached_bytes = 0;    ///< bytes of those
  uint64_t fallbacks = 0;     ///< allocations served by the plain heap instead
};

/// A snapshot of the shared heap's counters.
shared_heap_stats shared_heap_snapshot() noexcept;

}  // namespace comm::tl
