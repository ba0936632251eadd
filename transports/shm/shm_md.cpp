#include "shm/shm_md.hpp"

#include <comm/log.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace comm::tl::shm {
namespace {

constexpr const char* log_name = "shm";
/// Local iov entries per CMA call (the kernel's limit is IOV_MAX, 1024; 64 keeps it on our stack).
constexpr size_t cma_batch = 64;

std::atomic_ref<uint64_t> entry_word(uint64_t& word) { return std::atomic_ref<uint64_t>(word); }

/// The status of a failed CMA call with `error` (errno).
status cma_error(int error) {
  switch (error) {
    case ESRCH: return status::connection_reset;
    case ENOMEM: return status::no_memory;
    case EINVAL: return status::invalid_param;
    default: return status::io_error;  // EFAULT, EPERM, ...
  }
}

/// Walks an iov from a position: the next up-to-cma_batch non-empty pieces as iovecs.
struct iov_cursor {
  const iov* entries;
  size_t count;
  size_t entry = 0;   ///< current entry
  size_t offset = 0;  ///< bytes of it already moved

  /// Fills `out` with the next pieces; returns how many, and their bytes in `*bytes`.
  size_t next_batch(iovec* out, size_t* bytes) const {
    size_t n = 0;
    *bytes = 0;
    for (size_t e = entry, skip = offset; e < count && n < cma_batch; ++e, skip = 0) {
      const size_t length = entries[e].length - skip;
      if (length == 0) continue;
      out[n].iov_base = const_cast<uint8_t*>(static_cast<const uint8_t*>(entries[e].buffer) + skip);
      out[n].iov_len = length;
      *bytes += length;
      ++n;
    }
    return n;
  }

  /// Moves the position `moved` bytes on.
  void advance(size_t moved) {
    while (moved > 0 && entry < count) {
      const size_t left = entries[entry].length - offset;
      if (moved < left) {
        offset += moved;
        return;
      }
      moved -= left;
      ++entry;
      offset = 0;
    }
  }
};

/// True when `s` can describe a heap segment holding a region of `length` bytes at its offset.
bool plausible_segment(const segment_ref& s, uint64_t length) {
  return s.fd >= 0 && s.reserved == 0 && s.inode != 0 && s.id != 0 && s.size % 4096 == 0 &&
         s.size <= max_heap_segment && s.offset >= heap_header_bytes && s.offset <= s.size &&
         length <= s.size - s.offset;
}

}  // namespace

// -- the memory domain ----------------------------------------------------------------------------

shm_md::shm_md(const segment& own, uint64_t iface_id)
    : own_(own), iface_id_(iface_id), pid_(static_cast<int32_t>(::getpid())) {
  free_.reserve(region_table_size);
  for (uint32_t i = region_table_size; i > 0; --i) free_.push_back(i - 1);
}

shm_md::~shm_md() {
  if (cache_.size() != 0) {
    COMM_LOG(warn, log_name, "md destroyed with %zu regions still registered; released",
             cache_.size());
  }
}

status shm_md::mem_reg(void* address, size_t length, mem_handle** out) {
  return reg(address, length, 0, out);
}

status shm_md::mem_reg_read_only(void* address, size_t length, mem_handle** out) {
  return reg(address, length, region_read_only, out);
}

status shm_md::reg(void* address, size_t length, uint64_t rights, mem_handle** out) {
  const auto base = reinterpret_cast<uintptr_t>(address);
  if (out == nullptr || base + length < base) return status::invalid_param;
  const bool read_only = rights == region_read_only;
  std::lock_guard lock(mutex_);
  if (region* hit = cache_.acquire(address, length, read_only)) {
    *out = &hit->handle;
    return status::ok;
  }
  if (free_.empty()) {
    COMM_LOG(warn, log_name, "mem_reg: all %u region table slots in use", region_table_size);
    return status::exceeds_limit;
  }
  const uint32_t index = free_.back();
  region* r = cache_.insert(address, length, index, 0, read_only);
  if (r == nullptr) return status::no_memory;
  free_.pop_back();
  r->generation = publish(index, base, length, rights);
  *out = &r->handle;
  return status::ok;
}

status shm_md::mem_dereg(mem_handle* handle) {
  std::lock_guard lock(mutex_);
  region* r = cache_.find(handle);
  if (r == nullptr) return status::invalid_param;
  ++deregistrations_;
  cache_.release(r, [this](const region& last) { retire(last.index); });
  return status::ok;
}

uint64_t shm_md::publish(uint32_t index, uint64_t base, uint64_t length, uint64_t rights) {
  region_entry& e = own_.region(index);
  auto state = entry_word(e.state);
  const uint64_t generation = (state.load(std::memory_order_relaxed) >> 1) + 1;
  // The slot is invalid now; readers that see the new base/length also see that (seqlock).
  std::atomic_thread_fence(std::memory_order_release);
  entry_word(e.base).store(base, std::memory_order_relaxed);
  entry_word(e.length).store(length, std::memory_order_relaxed);
  entry_word(e.rights).store(rights, std::memory_order_relaxed);
  state.store(generation << 1 | region_valid, std::memory_order_release);
  return generation;
}

void shm_md::retire(uint32_t index) {
  auto state = entry_word(own_.region(index).state);
  state.store(state.load(std::memory_order_relaxed) & ~region_valid, std::memory_order_release);
  free_.push_back(index);
}

status shm_md::rkey_pack(const mem_handle* handle, std::vector<uint8_t>& out) {
  std::lock_guard lock(mutex_);
  const region* r = cache_.find(handle);
  if (r == nullptr) return status::invalid_param;
  append_rkey(packed_key_of(*r, rkey_magic_shm, pid_, iface_id_, r->index), out);
  segment_ref segment;
  if (heap_find(r->handle.address, r->handle.length, &segment)) {
    const auto* p = reinterpret_cast<const uint8_t*>(&segment);
    out.insert(out.end(), p, p + sizeof(segment));
  }
  return status::ok;
}

status shm_md::rkey_unpack(const void* data, size_t length, remote_key* out) {
  packed_rkey key;
  if (out == nullptr) return status::invalid_param;
  const bool with_segment = length == sizeof(packed_rkey) + sizeof(segment_ref);
  const size_t key_length = with_segment ? sizeof(packed_rkey) : length;
  if (const status st = parse_rkey(data, key_length, rkey_magic_shm, region_table_size, &key);
      st != status::ok) {
    return st;
  }
  if (!with_segment) return make_remote_key(key, out);
  segment_ref segment;
  std::memcpy(&segment, static_cast<const uint8_t*>(data) + sizeof(packed_rkey), sizeof(segment));
  if (!plausible_segment(segment, key.length)) return status::invalid_param;
  return make_remote_key(key, out, &segment, sizeof(segment));
}

void shm_md::rkey_release(remote_key* key) { release_rkey(key, rkey_magic_shm); }

bool shm_md::maps_for_peers(const void* address, size_t length) const {
  segment_ref segment;
  return heap_find(address, length, &segment);
}

void shm_md::close() {
  std::lock_guard lock(mutex_);
  if (cache_.size() != 0) {
    COMM_LOG(warn, log_name, "interface closed with %zu regions still registered; released",
             cache_.size());
  }
  cache_.clear([this](const region& r) { retire(r.index); });
}

std::string shm_md::info() const {
  std::lock_guard lock(mutex_);
  std::string text;
  text += "shm: md: " + std::to_string(cache_.size()) + " regions registered (table of " +
          std::to_string(region_table_size) + " slots in the segment)\n";
  text += "shm: md: " + std::to_string(cache_.misses()) + " registrations, " +
          std::to_string(cache_.hits()) + " cache hits, " + std::to_string(deregistrations_) +
          " deregistrations\n";
  return text;
}

// -- access checks and CMA ------------------------------------------------------------------------

status check_access(const segment_view& owner, const packed_rkey& key, uint64_t address,
                    uint64_t bytes, bool write, bool* read_only) {
  region_entry& e = owner.region(key.index);  // index < region_table_size: checked at unpack
  const uint64_t expected = key.generation << 1 | region_valid;
  auto state = entry_word(e.state);
  if (state.load(std::memory_order_acquire) != expected) return status::protection_error;
  const uint64_t base = entry_word(e.base).load(std::memory_order_relaxed);
  const uint64_t length = entry_word(e.length).load(std::memory_order_relaxed);
  const uint64_t rights = entry_word(e.rights).load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (state.load(std::memory_order_relaxed) != expected) return status::protection_error;
  if (base != key.base || length != key.length) return status::protection_error;
  if (write && rights != 0) {
    COMM_LOG(debug, log_name, "put into the read-only region at 0x%llx of pid %d refused",
             static_cast<unsigned long long>(base), static_cast<int>(key.pid));
    return status::privileges_violation;
  }
  if (read_only != nullptr) *read_only = rights != 0;
  return check_range(base, length, address, bytes);
}

bool segment_of(const remote_key& key, segment_ref* out) {
  size_t length = 0;
  const void* extension = rkey_extension(key, rkey_magic_shm, &length);
  if (extension == nullptr || length != sizeof(segment_ref)) return false;
  std::memcpy(out, extension, sizeof(segment_ref));
  return true;
}

void mapped_transfer(const iov* entries, size_t count, uint8_t* remote, bool write) {
  for (size_t i = 0; i < count; ++i) {
    const size_t length = entries[i].length;
    if (length == 0) continue;
    auto* local = const_cast<void*>(entries[i].buffer);
    if (write) {
      std::memcpy(remote, local, length);
    } else {
      std::memcpy(local, remote, length);
    }
    remote += length;
  }
}

status cma_transfer(pid_t pid, const iov* entries, size_t count, uint64_t remote, size_t total,
                    bool write) {
  iov_cursor cursor{entries, count};
  size_t left = total;
  while (left > 0) {  // every round moves at least one byte or returns
    iovec local[cma_batch];
    size_t batch = 0;
    const size_t n = cursor.next_batch(local, &batch);
    iovec far{reinterpret_cast<void*>(remote), batch};
    const ssize_t moved = write ? ::process_vm_writev(pid, local, n, &far, 1, 0)
                                : ::process_vm_readv(pid, local, n, &far, 1, 0);
    if (moved <= 0) {
      const int error = moved < 0 ? errno : EFAULT;
      COMM_LOG(debug, log_name, "%s of %zu bytes at 0x%llx in pid %d: %s",
               write ? "put" : "get", left, static_cast<unsigned long long>(remote),
               static_cast<int>(pid), std::strerror(error));
      return cma_error(error);
    }
    cursor.advance(static_cast<size_t>(moved));
    remote += static_cast<uint64_t>(moved);
    left -= static_cast<size_t>(moved);
  }
  return status::ok;
}

}  // namespace comm::tl::shm
