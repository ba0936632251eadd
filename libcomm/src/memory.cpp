// Host-shareable memory blocks (comm::mem_alloc, comm::mem_free).
#include <comm/memory.hpp>

#include <unistd.h>

#include <cstdlib>

namespace comm {

void* mem_alloc(size_t length) noexcept {
  void* block = nullptr;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (posix_memalign(&block, page, length == 0 ? 1 : length) != 0) return nullptr;
  return block;
}

void mem_free(void* block) noexcept { std::free(block); }

}  // namespace comm
