#include "shm/shm_mapped.hpp"

#include <comm/log.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace comm::tl::shm {
namespace {

constexpr const char* log_name = "shm";
/// Failed (pid, id) pairs remembered before the memory of them is cleared.
constexpr size_t max_failures_remembered = 1024;

/// True when the file behind `fd` is what `ref` says: a regular file of that inode and size,
/// sealed against shrinking.
bool is_segment_file(int fd, const segment_ref& ref) {
  struct stat st;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
         static_cast<uint64_t>(st.st_ino) == ref.inode &&
         static_cast<uint64_t>(st.st_size) == ref.size && seals >= 0 &&
         (seals & F_SEAL_SHRINK) != 0;
}

/// True when the header of the mapped segment names `ref`'s segment of `pid`, still allocated.
bool header_matches(const uint8_t* base, pid_t pid, const segment_ref& ref) {
  const auto& h = *reinterpret_cast<const heap_header*>(base);
  return h.magic == heap_magic && h.id == ref.id && h.size == ref.size && h.owner_pid == pid &&
         !mapped_segments::released(base);
}

bool process_alive(int pidfd) {
  pollfd exited{pidfd, POLLIN, 0};
  return ::poll(&exited, 1, 0) == 0;
}

}  // namespace

mapped_segments::mapped_segments(size_t budget) : budget_(budget) {}

mapped_segments::~mapped_segments() {
  for (const entry& e : lru_) ::munmap(e.base, e.size);
}

bool mapped_segments::released(const uint8_t* base) {
  auto& word = const_cast<heap_header*>(reinterpret_cast<const heap_header*>(base))->released;
  return std::atomic_ref<uint32_t>(word).load(std::memory_order_acquire) != 0;
}

uint8_t* mapped_segments::map(pid_t pid, int pidfd, const segment_ref& ref) {
  const key k{pid, ref.id};
  if (const auto found = index_.find(k); found != index_.end()) {
    const entry& e = *found->second;
    if (e.size != ref.size || e.inode != ref.inode) return nullptr;  // not the segment we mapped
    lru_.splice(lru_.begin(), lru_, found->second);
    return e.base;
  }
  if (failed_.count(failure{pid, ref}) != 0) return nullptr;
  sweep_released();
  uint8_t* base = attach(pid, pidfd, ref);
  if (base == nullptr) {
    note_failure(pid, ref);
    return nullptr;
  }
  lru_.push_front({k, base, ref.size, ref.inode});
  index_.emplace(k, lru_.begin());
  bytes_ += ref.size;
  ++maps_;
  evict_beyond_budget();
  return base;
}

uint8_t* mapped_segments::attach(pid_t pid, int pidfd, const segment_ref& ref) {
  if (ref.size > budget_ || ref.size < heap_header_bytes) return nullptr;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", static_cast<int>(pid), ref.fd);
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    COMM_LOG(debug, log_name, "mapped path: cannot open %s: %s", path, std::strerror(errno));
    return nullptr;
  }
  if (!is_segment_file(fd, ref)) {
    COMM_LOG(debug, log_name, "mapped path: %s is not the segment the key names", path);
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, ref.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    COMM_LOG(debug, log_name, "mapped path: mmap of %s: %s", path, std::strerror(errno));
    return nullptr;
  }
  auto* base = static_cast<uint8_t*>(p);
  // The pidfd predates the open: if the process is still alive, the file was that process's.
  if (!header_matches(base, pid, ref) || !process_alive(pidfd)) {
    COMM_LOG(debug, log_name, "mapped path: %s is not a live heap segment of pid %d", path,
             static_cast<int>(pid));
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
  ::munmap(it->base, it->size);
  bytes_ -= it->size;
  index_.erase(it->k);
  lru_.erase(it);
}

void mapped_segments::forget(pid_t pid, uint64_t id) {
  if (const auto found = index_.find(key{pid, id}); found != index_.end()) erase(found->second);
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
