// The registration cache of a memory domain: registrations by exact [address, length), with a
// reference count, so registering the same buffer again is a hash lookup (no syscall, no table
// write) that returns the same handle. The last deregistration removes the entry, and only then
// does the transport release its table slot, so the cache never hands out a registration the user
// has fully deregistered. Handles are validated by pointer before they are dereferenced, so
// deregistering a handle twice, or one from another memory domain, is an error and not a use after
// free. Not thread safe: the memory domain serialises calls.
#pragma once

#include <comm/transport/transport.hpp>

#include "base/rkey.hpp"

#include <cstddef>
#include <cstdint>
#include <new>
#include <unordered_map>
#include <unordered_set>

namespace comm::tl {

/// A registration handed out by a memory domain.
struct region {
  mem_handle handle;        ///< what the user holds; handle.transport points back here
  uint32_t index = 0;       ///< slot in the transport's region table
  uint64_t generation = 0;  ///< generation of that slot for this registration
  uint32_t refs = 0;        ///< registrations not yet deregistered
  bool read_only = false;   ///< peers may only read it (md::mem_reg_read_only)
};

/// The key a peer presents to reach `r`, a region of the memory domain with `magic` on interface
/// `iface_id` of process `pid`; `index` is the slot the key names (r.index, or the device's own
/// key where the device checks accesses).
inline packed_rkey packed_key_of(const region& r, uint32_t magic, int32_t pid, uint64_t iface_id,
                                 uint32_t index) {
  packed_rkey key;
  key.magic = magic;
  key.pid = pid;
  key.index = index;
  key.iface_id = iface_id;
  key.generation = r.generation;
  key.base = reinterpret_cast<uintptr_t>(r.handle.address);
  key.length = r.handle.length;
  return key;
}

/// Registrations of one memory domain by exact range, with reference counts.
class region_cache {
public:
  region_cache() = default;
  region_cache(const region_cache&) = delete;
  region_cache& operator=(const region_cache&) = delete;
  /// Frees every region still cached (the transport releases their slots first, with clear()).
  ~region_cache() {
    clear([](const region&) {});
  }

  /// The registration of exactly [address, address + length) with the same rights (`read_only`)
  /// with one more reference, or null.
  region* acquire(void* address, size_t length, bool read_only = false) {
    const auto found =
        by_range_.find(range{reinterpret_cast<uintptr_t>(address), length, read_only});
    if (found == by_range_.end()) return nullptr;
    ++found->second->refs;
    ++hits_;
    return found->second;
  }

  /// Records a new registration with one reference (read-only for peers with `read_only`); null
  /// when out of memory.
  region* insert(void* address, size_t length, uint32_t index, uint64_t generation,
                 bool read_only = false);

  /// The region behind `handle` when this cache handed it out and it is still registered.
  region* find(const mem_handle* handle) const {
    if (handle == nullptr || live_.count(handle) == 0) return nullptr;
    return static_cast<region*>(handle->transport);
  }

  /// Drops one reference of `r`. At the last one, calls `on_last(r)` (release the slot there),
  /// removes and frees it, and returns true.
  template <class F>
  bool release(region* r, F on_last) {
    if (--r->refs != 0) return false;
    on_last(*r);
    erase(r);
    return true;
  }

  /// Calls `on_each` for every cached region, then frees them all.
  template <class F>
  void clear(F on_each) {
    for (auto& [key, r] : by_range_) on_each(*r);
    for (auto& [key, r] : by_range_) delete r;
    by_range_.clear();
    live_.clear();
  }

  /// Regions currently registered.
  size_t size() const { return by_range_.size(); }
  /// Registrations answered from the cache.
  uint64_t hits() const { return hits_; }
  /// Registrations that created a region.
  uint64_t misses() const { return misses_; }

private:
  struct range {
    uintptr_t address;
    size_t length;
    bool read_only;
    bool operator==(const range&) const = default;
  };
  struct range_hash {
    size_t operator()(const range& r) const {
      return (r.address * 0x9e3779b97f4a7c15ull) ^ (r.length + (r.address >> 17)) ^
             static_cast<size_t>(r.read_only);
    }
  };

  void erase(region* r);

  std::unordered_map<range, region*, range_hash> by_range_;
  std::unordered_set<const mem_handle*> live_;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

inline region* region_cache::insert(void* address, size_t length, uint32_t index,
                                    uint64_t generation, bool read_only) {
  auto* r = new (std::nothrow) region;
  if (r == nullptr) return nullptr;
  r->handle = {address, length, r};
  r->index = index;
  r->generation = generation;
  r->refs = 1;
  r->read_only = read_only;
  by_range_.emplace(range{reinterpret_cast<uintptr_t>(address), length, read_only}, r);
  live_.insert(&r->handle);
  ++misses_;
  return r;
}

inline void region_cache::erase(region* r) {
  by_range_.erase(
      range{reinterpret_cast<uintptr_t>(r->handle.address), r->handle.length, r->read_only});
  live_.erase(&r->handle);
  delete r;
}

}  // namespace comm::tl
