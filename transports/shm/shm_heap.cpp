#include "shm/shm_heap.hpp"
#include "base/membind.hpp"

#include <comm/log.hpp>
#include <comm/transport/shared_heap.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace comm::tl::shm {
namespace {

constexpr const char* log_name = "shm";
constexpr size_t page_size = 4096;
/// Slab size classes: page_size << 0 .. page_size << (class_count - 1).
constexpr unsigned class_count = 5;
constexpr size_t max_small_block = page_size << (class_count - 1);
/// Data bytes of one slab segment.
constexpr size_t slab_bytes = 256 * 1024;
/// Bounds of the cache of freed large blocks.
constexpr size_t max_cached_bytes = size_t{64} << 20;
constexpr size_t max_cached_segments = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/// The slab class of a small block of `length` bytes (1 .. max_small_block).
unsigned class_of(size_t length) {
  unsigned c = 0;
  while ((page_size << c) < length) ++c;
  return c;
}

uint64_t random_salt() {
  uint64_t salt = 0;
  if (::getrandom(&salt, sizeof(salt), 0) != sizeof(salt)) {
    salt = static_cast<uint64_t>(::getpid()) << 40 ^ reinterpret_cast<uintptr_t>(&salt);
  }
  return salt;
}

/// One memfd segment of the heap.
struct heap_segment {
  uint8_t* base = nullptr;  ///< the header; blocks follow it
  size_t size = 0;          ///< bytes mapped, header included
  int fd = -1;
  uint64_t inode = 0;
  uint64_t id = 0;
  pid_t owner = 0;          ///< the process that created it
  size_t live = 0;          ///< blocks handed out from it
  int size_class = -1;      ///< slab class, or -1: one large block
  size_t arena = 0;         ///< index of the node set it was made for (heap::arenas_)
  bool bound = false;       ///< its pages are bound to that node set

  uint8_t* data() const { return base + heap_header_bytes; }
  size_t data_bytes() const { return size - heap_header_bytes; }
  heap_header& header() const { return *reinterpret_cast<heap_header*>(base); }
};

/// Sizes `fd` to `size` bytes with every page allocated (out of memory is an error now, never a
/// SIGBUS in a peer later) and seals it against resizing; fills `*inode`.
bool size_and_seal(int fd, size_t size, uint64_t* inode) {
  struct stat st;
  if (::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      ::fstat(fd, &st) != 0) {
    COMM_LOG(debug, log_name, "heap: sizing a %zu-byte segment: %s", size, std::strerror(errno));
    return false;
  }
  *inode = static_cast<uint64_t>(st.st_ino);
  return true;
}

/// Maps the allocated and sealed `fd` with its page tables filled (no page fault on first use).
void* map_populated(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    COMM_LOG(debug, log_name, "heap: mmap of %zu bytes: %s", size, std::strerror(errno));
    return nullptr;
  }
  return p;
}

/// Counts a placement the kernel refused; the first is a warning, the rest go to debug.
void report_refused_placement(const placement_outcome& out, std::atomic<uint64_t>& failures) {
  if (failures.fetch_add(1, std::memory_order_relaxed) == 0) {
    COMM_LOG(warn, log_name, "heap: segment not placed: %s", out.text.c_str());
  } else {
    COMM_LOG(debug, log_name, "heap: segment not placed: %s", out.text.c_str());
  }
}

/// Maps `fd` (`size` bytes, still empty) with its pages bound to `nodes` before any exists: the
/// policy set on a shared mapping stays with the file, so the pages fallocate allocates follow
/// it. Then seals it and fills the page tables. Null when it cannot; `*bound` says whether the
/// kernel took the placement (a refused one is counted in `failures`, the memory stays usable).
void* map_bound(int fd, size_t size, std::span<const unsigned> nodes, uint64_t* inode,
                bool* bound, std::atomic<uint64_t>& failures) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    COMM_LOG(debug, log_name, "heap: ftruncate to %zu bytes: %s", size, std::strerror(errno));
    return nullptr;
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    COMM_LOG(debug, log_name, "heap: mmap of %zu bytes: %s", size, std::strerror(errno));
    return nullptr;
  }
  const placement_outcome out = bind_to_numa_nodes(p, size, nodes);
  *bound = out.bound;
  if (out.st != status::ok) report_refused_placement(out, failures);
  if (!size_and_seal(fd, size, inode)) {
    ::munmap(p, size);
    return nullptr;
  }
  if (::madvise(p, size, MADV_POPULATE_WRITE) != 0) {
    // Kernels before 5.14: touch every page (they are allocated and zero already).
    auto* bytes = static_cast<volatile uint8_t*>(p);
    for (size_t offset = 0; offset < size; offset += page_size) bytes[offset] = 0;
  }
  return p;
}

/// Creates, sizes (pages allocated up front, on `nodes` when given), seals and maps a segment with
/// `data_bytes` after its header; null (logged at debug) when it cannot.
heap_segment* create_segment(size_t data_bytes, uint64_t id, pid_t owner,
                             std::span<const unsigned> nodes, std::atomic<uint64_t>& failures) {
  const size_t size = heap_header_bytes + data_bytes;
  const int fd = ::memfd_create("comm-heap", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    COMM_LOG(debug, log_name, "heap: memfd_create: %s", std::strerror(errno));
    return nullptr;
  }
  uint64_t inode = 0;
  bool bound = false;
  void* p = nodes.empty()
                ? (size_and_seal(fd, size, &inode) ? map_populated(fd, size) : nullptr)
                : map_bound(fd, size, nodes, &inode, &bound, failures);
  if (p == nullptr) {
    ::close(fd);
    return nullptr;
  }
  auto* s = new (std::nothrow) heap_segment{static_cast<uint8_t*>(p), size, fd, inode, id, owner};
  if (s == nullptr) {
    ::munmap(p, size);
    ::close(fd);
    return nullptr;
  }
  s->bound = bound;
  heap_header& h = s->header();
  h.magic = heap_magic;
  h.id = id;
  h.size = size;
  h.owner_pid = static_cast<int32_t>(owner);
  return s;
}

/// Unmaps, closes and frees `s`. Its creator (`self`) first tells peers it is gone.
void release_segment(heap_segment* s, pid_t self) {
  if (s->owner == self) {
    std::atomic_ref<uint32_t>(s->header().released).store(1, std::memory_order_release);
  }
  ::munmap(s->base, s->size);
  ::close(s->fd);
  delete s;
}

/// The process-wide heap. Never destroyed, so blocks can be freed at any time.
class heap {
public:
  /// The heap of this process (created, with its fork handlers, on first use).
  static heap& instance();

  /// A block of `length` bytes in a segment bound to `nodes` (sorted, unique; empty: unbound).
  void* alloc(size_t length, const std::vector<unsigned>& nodes);
  /// Frees a block of ours and returns true; false for a block that is not.
  bool free(void* block);
  bool find(const void* address, size_t length, segment_ref* out);
  shared_heap_stats stats();
  void count_fallback() { fallbacks_.fetch_add(1, std::memory_order_relaxed); }

private:
  heap() : pid_(::getpid()), salt_(random_salt()) { arenas_.push_back({}); }

  struct slot {
    void* block;
    heap_segment* segment;
  };
  /// The segments made for one set of NUMA nodes: its free slab slots per class (arena 0: no
  /// nodes). Arenas are only added, so their indices stay valid.
  struct arena {
    std::vector<unsigned> nodes;
    std::vector<slot> free_slots[class_count];
  };

  size_t arena_of(const std::vector<unsigned>& nodes);
  void* alloc_small(unsigned size_class, const std::vector<unsigned>& nodes);
  void* alloc_large(size_t data_bytes, const std::vector<unsigned>& nodes);
  /// A segment of `data_bytes` for arena `arena`, whose node set is `nodes`.
  heap_segment* make_segment(size_t data_bytes, uint64_t id, pid_t owner, size_t arena,
                             std::span<const unsigned> nodes);
  heap_segment* take_cached(size_t data_bytes, size_t arena);
  void cache_or_drop(heap_segment* s, std::vector<heap_segment*>& doomed);
  void drop(heap_segment* s, std::vector<heap_segment*>& doomed);
  void* hand_out(void* block, heap_segment* s);
  void forked_child();
  uint64_t next_id() { return salt_ + ++counter_; }

  static heap* the_heap;
  static void lock_for_fork() { the_heap->mutex_.lock(); }
  static void unlock_after_fork() { the_heap->mutex_.unlock(); }
  static void reset_in_child() { the_heap->forked_child(); }

  std::mutex mutex_;
  std::map<uintptr_t, heap_segment*> segments_;        ///< every segment, by base address
  std::unordered_map<void*, heap_segment*> blocks_;    ///< blocks handed out
  std::vector<arena> arenas_;                          ///< per node set, [0]: unbound
  std::vector<heap_segment*> cached_;                  ///< freed large blocks, oldest first
  size_t cached_bytes_ = 0;
  pid_t pid_;
  uint64_t salt_;
  uint64_t counter_ = 0;
  std::atomic<uint64_t> fallbacks_{0};
  std::atomic<uint64_t> placement_failures_{0};
};

heap* heap::the_heap = nullptr;

heap& heap::instance() {
  static heap* const created = [] {
    the_heap = new heap();
    ::pthread_atfork(lock_for_fork, unlock_after_fork, reset_in_child);
    return the_heap;
  }();
  return *created;
}

void* heap::hand_out(void* block, heap_segment* s) {
  blocks_.emplace(block, s);
  ++s->live;
  return block;
}

void* heap::alloc(size_t length, const std::vector<unsigned>& nodes) {
  if (length > max_heap_segment - heap_header_bytes) return nullptr;
  const size_t need = std::max<size_t>(length, 1);
  if (need <= max_small_block) return alloc_small(class_of(need), nodes);
  return alloc_large(round_up(need, page_size), nodes);
}

size_t heap::arena_of(const std::vector<unsigned>& nodes) {
  for (size_t i = 0; i < arenas_.size(); ++i) {
    if (arenas_[i].nodes == nodes) return i;
  }
  arenas_.push_back({nodes, {}});
  return arenas_.size() - 1;
}

heap_segment* heap::make_segment(size_t data_bytes, uint64_t id, pid_t owner, size_t arena,
                                 std::span<const unsigned> nodes) {
  heap_segment* s = create_segment(data_bytes, id, owner, nodes, placement_failures_);
  if (s != nullptr) s->arena = arena;
  return s;
}

void* heap::alloc_small(unsigned size_class, const std::vector<unsigned>& nodes) {
  std::lock_guard lock(mutex_);
  const size_t arena = arena_of(nodes);
  std::vector<slot>& slots = arenas_[arena].free_slots[size_class];
  if (slots.empty()) {
    // Slabs are small: made under the lock, so two threads never make one each.
    heap_segment* s = make_segment(slab_bytes, next_id(), pid_, arena, nodes);
    if (s == nullptr) return nullptr;
    s->size_class = static_cast<int>(size_class);
    segments_.emplace(reinterpret_cast<uintptr_t>(s->base), s);
    const size_t block = page_size << size_class;
    for (size_t offset = slab_bytes; offset >= block; offset -= block) {
      slots.push_back({s->data() + offset - block, s});
    }
  }
  const slot taken = slots.back();
  slots.pop_back();
  return hand_out(taken.block, taken.segment);
}

void* heap::alloc_large(size_t data_bytes, const std::vector<unsigned>& nodes) {
  uint64_t id;
  pid_t owner;
  size_t arena;
  {
    std::lock_guard lock(mutex_);
    arena = arena_of(nodes);
    if (heap_segment* s = take_cached(data_bytes, arena)) return hand_out(s->data(), s);
    id = next_id();
    owner = pid_;
  }
  // A fresh large segment costs its page allocation: made outside the lock.
  heap_segment* s = make_segment(data_bytes, id, owner, arena, nodes);
  if (s == nullptr) return nullptr;
  std::lock_guard lock(mutex_);
  segments_.emplace(reinterpret_cast<uintptr_t>(s->base), s);
  return hand_out(s->data(), s);
}

heap_segment* heap::take_cached(size_t data_bytes, size_t arena) {
  auto best = cached_.end();
  for (auto it = cached_.begin(); it != cached_.end(); ++it) {
    if ((*it)->arena != arena) continue;
    const size_t have = (*it)->data_bytes();
    if (have < data_bytes || have / 2 > data_bytes) continue;
    if (best == cached_.end() || have < (*best)->data_bytes()) best = it;
  }
  if (best == cached_.end()) return nullptr;
  heap_segment* s = *best;
  cached_.erase(best);
  cached_bytes_ -= s->data_bytes();
  return s;
}

bool heap::free(void* block) {
  std::vector<heap_segment*> doomed;
  pid_t self;
  {
    std::lock_guard lock(mutex_);
    const auto it = blocks_.find(block);
    if (it == blocks_.end()) return false;
    heap_segment* s = it->second;
    blocks_.erase(it);
    --s->live;
    self = pid_;
    if (s->size_class < 0) {
      cache_or_drop(s, doomed);
    } else if (s->owner == pid_) {
      arenas_[s->arena].free_slots[s->size_class].push_back({block, s});
    } else if (s->live == 0) {
      drop(s, doomed);  // a slab inherited through fork(): never reused here
    }
  }
  for (heap_segment* s : doomed) release_segment(s, self);
  return true;
}

void heap::cache_or_drop(heap_segment* s, std::vector<heap_segment*>& doomed) {
  if (s->owner != pid_ || s->data_bytes() > max_cached_bytes) return drop(s, doomed);
  cached_.push_back(s);
  cached_bytes_ += s->data_bytes();
  while (cached_bytes_ > max_cached_bytes || cached_.size() > max_cached_segments) {
    heap_segment* oldest = cached_.front();
    cached_.erase(cached_.begin());
    cached_bytes_ -= oldest->data_bytes();
    drop(oldest, doomed);
  }
}

void heap::drop(heap_segment* s, std::vector<heap_segment*>& doomed) {
  segments_.erase(reinterpret_cast<uintptr_t>(s->base));
  doomed.push_back(s);
}

bool heap::find(const void* address, size_t length, segment_ref* out) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  std::lock_guard lock(mutex_);
  auto it = segments_.upper_bound(a);
  if (it == segments_.begin()) return false;
  const heap_segment* s = (--it)->second;
  const auto data = reinterpret_cast<uintptr_t>(s->data());
  const uintptr_t end = reinterpret_cast<uintptr_t>(s->base) + s->size;
  if (a < data || a > end || length > end - a) return false;
  out->fd = s->fd;
  out->reserved = 0;
  out->inode = s->inode;
  out->id = s->id;
  out->offset = a - reinterpret_cast<uintptr_t>(s->base);
  out->size = s->size;
  return true;
}

shared_heap_stats heap::stats() {
  std::lock_guard lock(mutex_);
  shared_heap_stats st;
  st.segments = segments_.size();
  st.live_blocks = blocks_.size();
  st.cached_segments = cached_.size();
  st.cached_bytes = cached_bytes_;
  st.fallbacks = fallbacks_.load(std::memory_order_relaxed);
  for (const auto& [base, s] : segments_) st.bound_segments += s->bound;
  st.placement_failures = placement_failures_.load(std::memory_order_relaxed);
  return st;
}

void heap::forked_child() {
  // Runs in the child with mutex_ held (lock_for_fork). The parent's cached segments and free
  // slots are the parent's to reuse: the child drops them, and unused slabs with them.
  pid_ = ::getpid();
  salt_ = random_salt();
  std::vector<heap_segment*> doomed;
  for (arena& a : arenas_) {
    for (std::vector<slot>& slots : a.free_slots) slots.clear();
  }
  for (heap_segment* s : cached_) drop(s, doomed);
  cached_.clear();
  cached_bytes_ = 0;
  std::vector<heap_segment*> idle_slabs;
  for (const auto& [base, s] : segments_) {
    if (s->size_class >= 0 && s->live == 0) idle_slabs.push_back(s);
  }
  for (heap_segment* s : idle_slabs) drop(s, doomed);
  mutex_.unlock();
  for (heap_segment* s : doomed) release_segment(s, pid_);  // not ours: no `released` mark
}

}  // namespace

bool heap_find(const void* address, size_t length, segment_ref* out) {
  return heap::instance().find(address, length, out);
}

}  // namespace comm::tl::shm

namespace comm::tl {

void* shared_alloc(size_t length) noexcept { return shared_alloc(length, {}); }

void* shared_alloc(size_t length, std::span<const unsigned> numa_nodes) noexcept {
  shm::heap& h = shm::heap::instance();
  try {
    std::vector<unsigned> nodes(numa_nodes.begin(), numa_nodes.end());
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    if (void* block = h.alloc(length, nodes)) return block;
  } catch (const std::bad_alloc&) {
  }
  // No segment (no memfd, no fds, no memory for one): plain page-aligned memory, freed by
  // shared_free's std::free path.
  void* block = nullptr;
  if (::posix_memalign(&block, shm::page_size, std::max<size_t>(length, 1)) != 0) return nullptr;
  h.count_fallback();
  return block;
}

void shared_free(void* block) noexcept {
  if (block == nullptr) return;
  bool ours = false;
  try {
    ours = shm::heap::instance().free(block);
  } catch (const std::bad_alloc&) {
    ours = true;  // found and erased; only the reuse bookkeeping failed
  }
  if (!ours) std::free(block);
}

shared_heap_stats shared_heap_snapshot() noexcept { return shm::heap::instance().stats(); }

}  // namespace comm::tl
