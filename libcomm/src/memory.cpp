// Host-shareable memory blocks (comm::mem_alloc, comm::mem_free, worker::mem_alloc): the
// transports' shared heap.
#include "worker_impl.hpp"

#include <comm/memory.hpp>
#include <comm/transport/shared_heap.hpp>
#include <comm/worker.hpp>

namespace comm {

void* mem_alloc(size_t length) noexcept { return tl::shared_alloc(length); }

void mem_free(void* block) noexcept { tl::shared_free(block); }

void* worker::mem_alloc(size_t length) const noexcept {
  return tl::shared_alloc(length, detail::impl(*this).placement.numa_nodes);
}

}  // namespace comm
