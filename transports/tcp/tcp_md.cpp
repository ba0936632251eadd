#include "tcp/tcp_md.hpp"

#include "tcp/tcp_iface.hpp"

#include <comm/log.hpp>

#include <unistd.h>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";

}  // namespace

tcp_md::tcp_md(tcp_iface& owner, uint64_t iface_id)
    : owner_(owner), iface_id_(iface_id), pid_(static_cast<int32_t>(::getpid())) {}

tcp_md::~tcp_md() {
  if (cache_.size() != 0) {
    COMM_LOG(warn, log_name, "interface closed with %zu regions still registered; released",
             cache_.size());
  }
  cache_.clear([](const region&) {});
}

status tcp_md::mem_reg(void* address, size_t length, mem_handle** out) {
  const auto base = reinterpret_cast<uintptr_t>(address);
  if (out == nullptr || base + length < base) return status::invalid_param;
  if (region* hit = cache_.acquire(address, length)) {
    *out = &hit->handle;
    return status::ok;
  }
  if (free_.empty()) {
    if (table_.size() >= max_tcp_regions) {
      COMM_LOG(warn, log_name, "mem_reg: region table full (%u slots)", max_tcp_regions);
      return status::exceeds_limit;
    }
    free_.push_back(static_cast<uint32_t>(table_.size()));
    table_.emplace_back();
  }
  const uint32_t index = free_.back();
  entry& e = table_[index];
  region* r = cache_.insert(address, length, index, e.generation + 1);
  if (r == nullptr) return status::no_memory;
  free_.pop_back();
  e = {e.generation + 1, base, length, true};
  *out = &r->handle;
  return status::ok;
}

status tcp_md::mem_dereg(mem_handle* handle) {
  region* r = cache_.find(handle);
  if (r == nullptr) return status::invalid_param;
  ++deregistrations_;
  cache_.release(r, [&](const region& last) {
    table_[last.index].valid = false;
    free_.push_back(last.index);
    owner_.region_gone(last.index, last.generation);
  });
  return status::ok;
}

status tcp_md::rkey_pack(const mem_handle* handle, std::vector<uint8_t>& out) {
  const region* r = cache_.find(handle);
  if (r == nullptr) return status::invalid_param;
  append_rkey(packed_key_of(*r, rkey_magic_tcp, pid_, iface_id_, r->index), out);
  return status::ok;
}

status tcp_md::rkey_unpack(const void* data, size_t length, remote_key* out) {
  if (out == nullptr) return status::invalid_param;
  packed_rkey key;
  const status st = parse_rkey(data, length, rkey_magic_tcp, max_tcp_regions, &key);
  if (st != status::ok) return st;
  return make_remote_key(key, out);
}

void tcp_md::rkey_release(remote_key* key) { release_rkey(key, rkey_magic_tcp); }

status tcp_md::check(uint32_t slot, uint64_t generation, uint64_t address, uint64_t bytes) const {
  if (slot >= table_.size()) return status::protection_error;
  const entry& e = table_[slot];
  if (!e.valid || e.generation != generation) return status::protection_error;
  return check_range(e.base, e.length, address, bytes);
}

void tcp_md::count_access(bool write, status result) {
  if (result != status::ok) {
    ++accesses_refused_;
  } else if (write) {
    ++puts_taken_;
  } else {
    ++gets_served_;
  }
}

std::string tcp_md::info() const {
  std::string text;
  text += "tcp: md: " + std::to_string(cache_.size()) + " regions registered (up to " +
          std::to_string(max_tcp_regions) + "), " + std::to_string(cache_.misses()) +
          " registrations, " + std::to_string(cache_.hits()) + " cache hits, " +
          std::to_string(deregistrations_) + " deregistrations\n";
  text += "tcp: md: peers' gets served " + std::to_string(gets_served_) + ", puts taken " +
          std::to_string(puts_taken_) + ", accesses refused " + std::to_string(accesses_refused_) +
          "\n";
  return text;
}

const packed_rkey* tcp_rkey_of(const remote_key& key) { return rkey_of(key, rkey_magic_tcp); }

}  // namespace comm::tl::tcp
