// Host-shareable memory blocks (comm::mem_alloc, comm::mem_free): the transports' shared heap.
#include <comm/memory.hpp>

#include <comm/transport/shared_heap.hpp>

namespace comm {

void* mem_alloc(size_t length) noexcept { return tl::shared_alloc(length); }

void mem_free(void* block) noexcept { tl::shared_free(block); }

}  // namespace comm
