#include "self/self_md.hpp"

#include <comm/log.hpp>

#include <unistd.h>

#include <cstring>
#include <vector>

namespace comm::tl::self {
namespace {

constexpr const char* log_name = "self";

/// The process-wide region table of every self interface.
class region_table {
public:
  /// The table; leaked on purpose so interfaces destroyed during static destruction find it.
  static region_table& get() {
    static region_table* instance = new region_table;
    return *instance;
  }

  /// Records [base, base + length) of interface `owner` in a free slot.
  status add(uint64_t owner, uint64_t base, uint64_t length, uint32_t* index,
             uint64_t* generation) {
    std::lock_guard lock(mutex_);
    if (free_.empty()) {
      if (entries_.size() >= max_self_regions) return status::exceeds_limit;
      free_.push_back(static_cast<uint32_t>(entries_.size()));
      entries_.emplace_back();
    }
    *index = free_.back();
    free_.pop_back();
    entry& e = entries_[*index];
    e = {e.generation + 1, owner, base, length, true};
    *generation = e.generation;
    return status::ok;
  }

  /// Invalidates slot `index`; keys naming it go stale.
  void remove(uint32_t index) {
    std::lock_guard lock(mutex_);
    entries_[index].valid = false;
    free_.push_back(index);
  }

  /// See check_self_access.
  status check(const packed_rkey& key, uint64_t target, uint64_t address, uint64_t bytes) const {
    std::lock_guard lock(mutex_);
    if (key.index >= entries_.size()) return status::protection_error;
    const entry& e = entries_[key.index];
    if (!e.valid || e.generation != key.generation) return status::protection_error;
    if (e.base != key.base || e.length != key.length) return status::protection_error;
    if (e.owner != target) return status::invalid_param;  // a live key of another interface
    return check_range(e.base, e.length, address, bytes);
  }

private:
  struct entry {
    uint64_t generation = 0;
    uint64_t owner = 0;
    uint64_t base = 0;
    uint64_t length = 0;
    bool valid = false;
  };

  mutable std::mutex mutex_;
  std::vector<entry> entries_;
  std::vector<uint32_t> free_;
};

}  // namespace

status check_self_access(const packed_rkey& key, uint64_t target, uint64_t address,
                         uint64_t bytes) {
  return region_table::get().check(key, target, address, bytes);
}

void copy_local(const iov* entries, size_t count, uint8_t* remote, bool write) {
  for (size_t i = 0; i < count; ++i) {
    const size_t length = entries[i].length;
    if (length == 0) continue;
    auto* local = const_cast<void*>(entries[i].buffer);
    // memmove: a loopback put or get may overlap its own source.
    if (write) {
      std::memmove(remote, local, length);
    } else {
      std::memmove(local, remote, length);
    }
    remote += length;
  }
}

// -- self_md --------------------------------------------------------------------------------------

self_md::self_md(uint64_t iface_id) : iface_id_(iface_id) {}

self_md::~self_md() {
  std::lock_guard lock(mutex_);
  if (cache_.size() != 0) {
    COMM_LOG(warn, log_name, "interface closed with %zu regions still registered; released",
             cache_.size());
  }
  cache_.clear([](const region& r) { region_table::get().remove(r.index); });
}

status self_md::mem_reg(void* address, size_t length, mem_handle** out) {
  const auto base = reinterpret_cast<uintptr_t>(address);
  if (out == nullptr || base + length < base) return status::invalid_param;
  std::lock_guard lock(mutex_);
  if (region* hit = cache_.acquire(address, length)) {
    *out = &hit->handle;
    return status::ok;
  }
  uint32_t index = 0;
  uint64_t generation = 0;
  if (const status st = region_table::get().add(iface_id_, base, length, &index, &generation);
      st != status::ok) {
    COMM_LOG(warn, log_name, "mem_reg: region table full (%u slots)", max_self_regions);
    return st;
  }
  region* r = cache_.insert(address, length, index, generation);
  if (r == nullptr) {
    region_table::get().remove(index);
    return status::no_memory;
  }
  *out = &r->handle;
  return status::ok;
}

status self_md::mem_dereg(mem_handle* handle) {
  std::lock_guard lock(mutex_);
  region* r = cache_.find(handle);
  if (r == nullptr) return status::invalid_param;
  ++deregistrations_;
  cache_.release(r, [](const region& last) { region_table::get().remove(last.index); });
  return status::ok;
}

status self_md::rkey_pack(const mem_handle* handle, std::vector<uint8_t>& out) {
  std::lock_guard lock(mutex_);
  const region* r = cache_.find(handle);
  if (r == nullptr) return status::invalid_param;
  append_rkey(packed_key_of(*r, rkey_magic_self, static_cast<int32_t>(::getpid()), iface_id_,
                            r->index),
              out);
  return status::ok;
}

status self_md::rkey_unpack(const void* data, size_t length, remote_key* out) {
  packed_rkey key;
  if (out == nullptr) return status::invalid_param;
  if (const status st = parse_rkey(data, length, rkey_magic_self, max_self_regions, &key);
      st != status::ok) {
    return st;
  }
  if (key.pid != static_cast<int32_t>(::getpid())) return status::invalid_param;
  return make_remote_key(key, out);
}

void self_md::rkey_release(remote_key* key) { release_rkey(key, rkey_magic_self); }

std::string self_md::info() const {
  std::lock_guard lock(mutex_);
  std::string text;
  text += "self: md: " + std::to_string(cache_.size()) +
          " regions registered (process-wide table, up to " + std::to_string(max_self_regions) +
          " slots)\n";
  text += "self: md: " + std::to_string(cache_.misses()) + " registrations, " +
          std::to_string(cache_.hits()) + " cache hits, " + std::to_string(deregistrations_) +
          " deregistrations\n";
  return text;
}

}  // namespace comm::tl::self
