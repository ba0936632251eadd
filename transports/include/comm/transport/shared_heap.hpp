// The process-wide shared heap: memory that peers on this host can map. Blocks live in memfd
// segments (transports/shm/shm_heap.hpp); when the remote buffer of an shm get/put lies in one,
// the peer maps the segment once and copies with memcpy instead of cross-memory attach.
// libcomm's comm::mem_alloc and comm::mem_free are these two functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace comm::tl {

/// Allocates `length` bytes (0 counts as 1), page aligned, in a shared segment, populated so its
/// first use takes no page faults. Falls back to plain page-aligned heap memory when no segment
/// can be made (no memfd, out of file descriptors). Thread-safe; null without memory.
void* shared_alloc(size_t length) noexcept;

/// Allocates as shared_alloc(length), in a segment whose pages are bound to the NUMA nodes
/// `numa_nodes` (OS indices, as iface_params::numa_nodes) before they are allocated. Empty
/// `numa_nodes` is shared_alloc(length): the pages go where the kernel's default policy puts
/// them. Blocks for different node sets never share a segment. When the kernel refuses the
/// placement (a node this machine lacks), the block is still made, unbound, and the refusal is
/// counted (shared_heap_stats::placement_failures) and logged.
void* shared_alloc(size_t length, std::span<const unsigned> numa_nodes) noexcept;

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
  size_t bound_segments = 0;  ///< segments (live, cached and slabs) bound to NUMA nodes
  uint64_t placement_failures = 0;  ///< segments asked for NUMA nodes that the kernel refused
};

/// A snapshot of the shared heap's counters.
shared_heap_stats shared_heap_snapshot() noexcept;

}  // namespace comm::tl
