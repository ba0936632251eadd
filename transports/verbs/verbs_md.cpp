#include "verbs/verbs_md.hpp"

#include "base/rkey.hpp"

#include <comm/log.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace comm::verbs {
namespace {
constexpr const char* log_name = "verbs";
}

verbs_md::verbs_md(const api& table, ibv_pd* pd, uint64_t id, size_t cache_limit)
    : t_(table), pd_(pd), id_(id), cache_limit_(cache_limit) {}

verbs_md::~verbs_md() {
  user_.clear([this](const tl::region& r) { t_.dereg_mr(slots_[r.index]); });
  for (cached_mr& e : implicit_) t_.dereg_mr(e.mr);
}

status verbs_md::mem_reg(void* address, size_t length, tl::mem_handle** out) {
  if (out == nullptr || (address == nullptr && length != 0)) return status::invalid_param;
  if (tl::region* r = user_.acquire(address, length)) {
    *out = &r->handle;
    return status::ok;
  }
  ibv_mr* mr = t_.reg_mr(pd_, address, length, access_flags);
  if (mr == nullptr) {
    COMM_LOG(warn, log_name, "reg_mr(%zu bytes): %s", length, std::strerror(errno));
    return errno == ENOMEM ? status::no_memory : status::io_error;
  }
  uint32_t slot = static_cast<uint32_t>(slots_.size());
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = mr;
  } else {
    slots_.push_back(mr);
  }
  tl::region* r = user_.insert(address, length, slot, 1);
  if (r == nullptr) {
    t_.dereg_mr(mr);
    free_slots_.push_back(slot);
    return status::no_memory;
  }
  by_base_[reinterpret_cast<uintptr_t>(address)] = r;
  *out = &r->handle;
  return status::ok;
}

void verbs_md::forget_user_region(const tl::region& r) {
  const auto found = by_base_.find(reinterpret_cast<uintptr_t>(r.handle.address));
  if (found != by_base_.end() && found->second == &r) by_base_.erase(found);
  t_.dereg_mr(slots_[r.index]);
  slots_[r.index] = nullptr;
  free_slots_.push_back(r.index);
}

status verbs_md::mem_dereg(tl::mem_handle* handle) {
  tl::region* r = user_.find(handle);
  if (r == nullptr) return status::invalid_param;
  user_.release(r, [this](const tl::region& last) { forget_user_region(last); });
  return status::ok;
}

status verbs_md::rkey_pack(const tl::mem_handle* handle, std::vector<uint8_t>& out) {
  const tl::region* r = user_.find(handle);
  if (r == nullptr) return status::invalid_param;
  tl::append_rkey(tl::packed_key_of(*r, rkey_magic_verbs, static_cast<int32_t>(::getpid()), id_,
                                    slots_[r->index]->rkey),
                  out);
  return status::ok;
}

status verbs_md::rkey_unpack(const void* data, size_t length, tl::remote_key* out) {
  if (out == nullptr) return status::invalid_param;
  tl::packed_rkey key;
  const status st = tl::parse_rkey(data, length, rkey_magic_verbs, UINT32_MAX, &key);
  if (st != status::ok) return st;
  return tl::make_remote_key(key, out);
}

void verbs_md::rkey_release(tl::remote_key* key) { tl::release_rkey(key, rkey_magic_verbs); }

bool verbs_md::user_lkey(uintptr_t address, size_t length, uint32_t* lkey) const {
  auto found = by_base_.upper_bound(address);
  if (found == by_base_.begin()) return false;
  --found;
  const tl::region& r = *found->second;
  const auto base = reinterpret_cast<uintptr_t>(r.handle.address);
  if (address + length > base + r.handle.length) return false;
  *lkey = slots_[r.index]->lkey;
  return true;
}

void verbs_md::evict_idle() {
  auto it = implicit_.end();
  while (implicit_index_.size() >= cache_limit_ && it != implicit_.begin()) {
    --it;
    if (it->in_flight != 0) continue;
    t_.dereg_mr(it->mr);
    implicit_index_.erase(range{it->address, it->length});
    it = implicit_.erase(it);
  }
}

cached_mr* verbs_md::implicit_mr(uintptr_t address, size_t length) {
  const auto found = implicit_index_.find(range{address, length});
  if (found != implicit_index_.end()) {
    implicit_.splice(implicit_.begin(), implicit_, found->second);
    return &*found->second;
  }
  evict_idle();
  // Local access only: an implicit registration's key is never given to a peer.
  ibv_mr* mr = t_.reg_mr(pd_, reinterpret_cast<void*>(address), length, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    COMM_LOG(warn, log_name, "reg_mr(%zu bytes) for zcopy: %s", length, std::strerror(errno));
    return nullptr;
  }
  ++implicit_misses_;
  implicit_.push_front(cached_mr{address, length, mr, 0});
  implicit_index_[range{address, length}] = implicit_.begin();
  return &implicit_.front();
}

status verbs_md::local_sges(const tl::iov* entries, size_t count, ibv_sge* sges, pin_set& pins) {
  pins.count = 0;
  for (size_t i = 0; i < count; ++i) {
    const auto address = reinterpret_cast<uintptr_t>(entries[i].buffer);
    const size_t length = entries[i].length;
    sges[i] = ibv_sge{address, static_cast<uint32_t>(length), 0};
    if (length == 0) continue;
    if (user_lkey(address, length, &sges[i].lkey)) continue;
    cached_mr* e = implicit_mr(address, length);
    if (e == nullptr) {
      unpin(pins);
      return status::io_error;
    }
    ++e->in_flight;
    pins.entries[pins.count++] = e;
    sges[i].lkey = e->mr->lkey;
  }
  return status::ok;
}

void verbs_md::unpin(pin_set& pins) {
  for (uint8_t i = 0; i < pins.count; ++i) --pins.entries[i]->in_flight;
  pins.count = 0;
}

}  // namespace comm::verbs
