// The shared heap behind tl::shared_alloc (comm::mem_alloc): blocks in memfd segments that a peer
// can map (taking the descriptor as shm_peer_fd.hpp says), so that an shm get/put whose remote
// buffer lies in one is a memcpy through a cached mapping (shm_mapped.hpp) rather than
// cross-memory attach.
//
// Segments are sealed against resizing (a peer's mapping can never fault past the end) and start
// with one header page (heap_header); blocks start at page boundaries after it.
//   small blocks  (up to max_small_block) come from slabs: one segment per size class (powers of
//                 two from a page) cut into equal slots; freed slots go back to their class.
//   large blocks  get a segment each; freed ones are cached for reuse by size (bounded by bytes
//                 and count), the oldest released first.
// Placement: a segment asked for NUMA nodes (shared_alloc's numa_nodes, a worker's cpus) is bound
// to them before its pages are allocated. Each node set has its own slabs, and a cached large
// segment is reused only for the node set it was made for.
// Releasing a segment (unmap and close) first sets `released` in its header, so a peer still
// holding a mapping finds out at its next access and fails it (io_error, as CMA's EFAULT would).
//
// fork(): the child keeps the blocks it inherited (shared with the parent, as any MAP_SHARED
// memory is), but never reuses the parent's cached segments or free slots, and never marks a
// segment it did not create as released.
#pragma once

#include <cstddef>
#include <cstdint>

namespace comm::tl::shm {

/// Bytes of a heap segment's header; blocks start after it, page aligned.
inline constexpr size_t heap_header_bytes = 4096;
/// Magic at the start of every heap segment ("commheap").
inline constexpr uint64_t heap_magic = 0x706165686d6d6f63ull;
/// Largest segment a peer accepts to map (and the largest block the heap makes a segment for).
inline constexpr uint64_t max_heap_segment = uint64_t{1} << 40;

/// The first bytes of every heap segment.
struct heap_header {
  uint64_t magic;      ///< heap_magic
  uint64_t id;         ///< random per segment; a peer's mapping cache key, checked after mapping
  uint64_t size;       ///< bytes of the segment, header included
  int32_t owner_pid;   ///< the process that created it
  uint32_t released;   ///< set (release store) before the owner unmaps and closes it
};

/// What a peer needs to map the heap segment a registered region lies in; travels after the
/// packed rkey (shm_md.hpp).
struct [[gnu::packed]] segment_ref {
  int32_t fd = -1;         ///< the segment's memfd in the owner
  uint32_t reserved = 0;   ///< zero
  uint64_t inode = 0;      ///< the memfd's inode (fd numbers get reused)
  uint64_t id = 0;         ///< heap_header::id
  uint64_t offset = 0;     ///< where the region starts in the segment
  uint64_t size = 0;       ///< bytes of the segment, header included
};
static_assert(sizeof(segment_ref) == 40);

/// True when [address, address + length) lies inside one segment of this process's shared heap
/// (after its header); fills `*out` with the segment and the offset of `address` in it.
bool heap_find(const void* address, size_t length, segment_ref* out);

}  // namespace comm::tl::shm
