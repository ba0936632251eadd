// Memory registration and remote keys, for RMA and rendezvous.
//
// Register a buffer with worker::mem_map, pack its key with worker::rkey_pack, send the bytes to a
// peer, which unpacks them with endpoint::rkey_unpack and reads or writes the buffer with
// endpoint::get / endpoint::put.
#pragma once

#include <comm/types.hpp>

#include <cstddef>

namespace comm {

/// Allocates `length` bytes, page aligned, that peers on this host can reach without a system
/// call: a rendezvous or RMA over shm whose remote buffer lies in such a block is a plain copy
/// through a shared mapping instead of cross-memory attach. The block lives in a memfd segment of
/// a process-wide heap (pages allocated up front; freed blocks are reused), so it is shared
/// memory: a child forked after the allocation shares it with the parent instead of getting a
/// copy. Where no segment can be made it is plain heap memory (still valid, reached by CMA).
/// Thread-safe; null without memory.
void* mem_alloc(size_t length) noexcept;

/// Frees a block of mem_alloc, or data taken over with worker::am_data_detach (whichever
/// allocator it came from; anything else must be a malloc'd block, which goes to std::free).
/// Thread-safe, and valid after every context and worker is gone. Null is ignored.
void mem_free(void* block) noexcept;

/// A registered memory region (ucp_mem_h): created by worker::mem_map, released by
/// worker::mem_unmap. Registrations of the same range share transport state (a registration
/// cache).
class memh;

/// An unpacked remote key (ucp_rkey_h): access to a peer's registered region through one
/// endpoint. Created by endpoint::rkey_unpack, released by endpoint::rkey_destroy.
class rkey;

}  // namespace comm
