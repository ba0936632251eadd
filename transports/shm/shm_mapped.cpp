#include "shm/shm_mapped.hpp"

#include "shm/shm_peer_fd.hpp"

#include <comm/log.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace comm::tl::shm {
namespace {

constexpr const char* log_name = "shm";
/// Failed (pid, id) pairs remembered before the memory of them is cleared.
constexpr size_t max_failures_remembered = 1024;

/// True when the header of the mapped segment names `ref`'s segment of `pid`, still allocated.
bool header_matches(const uint8_t* base, pid_t pid, const segment_ref& ref) {
  const auto& h = *reinterpret_cast<const heap_header*>(base);
  return h.magic == heap_magic && h.id == ref.id && h.size == ref.size && h.owner_pid == pid &&
         !mapped_segments::released(base);
}

}  // namespace

mapped_segments::mapped_segments(size_t budget) : budget_(budget) {}

mapped_segments::~mapped_segments() = default;

std::shared_ptr<const void> mapped_segments::last_mapping() const {
  return lru_.empty() ? nullptr : lru_.front().mapping;
}

bool mapped_segments::released(const uint8_t* base) {
  auto& word = const_cast<heap_header*>(reinterpret_cast<const heap_header*>(base))->released;
  return std::atomic_ref<uint32_t>(word).load(std::memory_order_acquire) != 0;
}

uint8_t* mapped_segments::map(pid_t pid, int pidfd, const segment_ref& ref, bool writable) {
  const key k{pid, ref.id, writable};
  // The segment used last is at the front: operations on one buffer skip the index.
  if (!lru_.empty() && lru_.front().k == k) {
    const entry& e = lru_.front();
    return (e.size == ref.size && e.inode == ref.inode) ? e.base : nullptr;
  }
  if (const auto found = index_.find(k); found != index_.end()) {
    const entry& e = *found->second;
    if (e.size != ref.size || e.inode != ref.inode) return nullptr;  // not the segment we mapped
    lru_.splice(lru_.begin(), lru_, found->second);
    return e.base;
  }
  if (failed_.count(failure{pid, ref}) != 0) return nullptr;
  sweep_released();
  uint8_t* base = attach(pid, pidfd, ref, writable);
  if (base == nullptr) {
    note_failure(pid, ref);
    return nullptr;
  }
  const size_t size = ref.size;
  std::shared_ptr<const void> mapping(base, [size](const void* p) {
    ::munmap(const_cast<void*>(p), size);
  });
  lru_.push_front({k, base, ref.size, ref.inode, std::move(mapping)});
  index_.emplace(k, lru_.begin());
  bytes_ += ref.size;
  ++maps_;
  evict_beyond_budget();
  return base;
}

uint8_t* mapped_segments::attach(pid_t pid, int pidfd, const segment_ref& ref, bool writable) {
  if (ref.size > budget_ || ref.size < heap_header_bytes) return nullptr;
  const taken_fd taken =
      take_peer_memfd(pidfd, pid, memfd_expectation{ref.fd, ref.size, ref.inode});
  if (taken.fd < 0) {
    COMM_LOG(debug, log_name, "mapped path: descriptor %d of pid %d is not the segment the key "
             "names: %s%s%s", static_cast<int>(ref.fd), static_cast<int>(pid), taken.refusal,
             taken.error != 0 ? ": " : "", taken.error != 0 ? std::strerror(taken.error) : "");
    return nullptr;
  }
  const int protection = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = ::mmap(nullptr, ref.size, protection, MAP_SHARED | MAP_POPULATE, taken.fd, 0);
  ::close(taken.fd);
  if (p == MAP_FAILED) {
    COMM_LOG(debug, log_name, "mapped path: mmap of descriptor %d of pid %d: %s",
             static_cast<int>(ref.fd), static_cast<int>(pid), std::strerror(errno));
    return nullptr;
  }
  auto* base = static_cast<uint8_t*>(p);
  // The pidfd predates taking the descriptor: alive now means the file was that process's.
  if (!header_matches(base, pid, ref) || process_exited(pidfd)) {
    COMM_LOG(debug, log_name, "mapped path: descriptor %d of pid %d is not a live heap segment",
             static_cast<int>(ref.fd), static_cast<int>(pid));
    ::munmap(p, ref.size);
    return nullptr;
  }
  return base;
}

void mapped_segments::note_failure(pid_t pid, const segment_ref& ref) {
  ++failures_;
  if (failed_.size() >= max_failures_remembered) failed_.clear();
  failed_.insert(failure{pid, ref});
}

void mapped_segments::erase(lru_list::iterator it) {
  // Unmapped now unless someone holds the mapping (last_mapping).
  bytes_ -= it->size;
  index_.erase(it->k);
  lru_.erase(it);
}

void mapped_segments::forget(pid_t pid, uint64_t id) {
  for (const bool writable : {false, true}) {
    if (const auto found = index_.find(key{pid, id, writable}); found != index_.end()) {
      erase(found->second);
    }
  }
}

void mapped_segments::forget_peer(pid_t pid) {
  for (auto it = lru_.begin(); it != lru_.end();) {
    const auto next = std::next(it);
    if (it->k.pid == pid) erase(it);
    it = next;
  }
  std::erase_if(failed_, [pid](const failure& f) { return f.pid == pid; });
}

void mapped_segments::sweep_released() {
  for (auto it = lru_.begin(); it != lru_.end();) {
    const auto next = std::next(it);
    if (released(it->base)) erase(it);
    it = next;
  }
}

void mapped_segments::evict_beyond_budget() {
  while (bytes_ > budget_ && lru_.size() > 1) erase(std::prev(lru_.end()));
}

}  // namespace comm::tl::shm
