// The memory domain of the verbs transport: registrations through ibv_reg_mr, rkeys in the common
// format (base/rkey.hpp, magic rkey_magic_verbs, the MR's rkey as the index), and local keys for
// the iov of zero-copy operations: from a region the user registered, else from a bounded cache of
// implicit registrations (least recently used first out, never one an operation in flight uses).
#pragma once

#include "base/region_cache.hpp"
#include "verbs/verbs_api.hpp"

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <unordered_map>
#include <vector>

namespace comm::verbs {

/// Magic of keys packed by the verbs memory domain ("vbrk").
inline constexpr uint32_t rkey_magic_verbs = 0x6b726276;

/// Most iov entries of one zero-copy operation.
inline constexpr size_t max_zcopy_iov = 8;

/// An implicit registration of the cache.
struct cached_mr {
  uintptr_t address = 0;   ///< start of the range
  size_t length = 0;       ///< bytes in the range
  ibv_mr* mr = nullptr;    ///< the registration
  uint32_t in_flight = 0;  ///< operations using it now
};

/// The implicit registrations one operation holds until it completes.
struct pin_set {
  cached_mr* entries[max_zcopy_iov] = {};  ///< the pinned registrations
  uint8_t count = 0;                       ///< how many
};

/// Registrations and remote keys on one protection domain. Not thread safe (the iface's owner
/// serialises calls).
class verbs_md final : public tl::md {
public:
  /// A domain on `pd` keeping at most `cache_limit` idle implicit registrations.
  verbs_md(const api& table, ibv_pd* pd, uint64_t id, size_t cache_limit);
  ~verbs_md() override;
  verbs_md(const verbs_md&) = delete;
  verbs_md& operator=(const verbs_md&) = delete;

  status mem_reg(void* address, size_t length, tl::mem_handle** out) override;
  status mem_dereg(tl::mem_handle* handle) override;
  status rkey_pack(const tl::mem_handle* handle, std::vector<uint8_t>& out) override;
  status rkey_unpack(const void* data, size_t length, tl::remote_key* out) override;
  void rkey_release(tl::remote_key* key) override;

  /// Fills `sges` with the local keys of `count` entries (count <= max_zcopy_iov), pinning the
  /// implicit registrations it uses in `pins`. Returns ok, or io_error when registration fails.
  status local_sges(const tl::iov* entries, size_t count, ibv_sge* sges, pin_set& pins);
  /// Releases what local_sges pinned.
  void unpin(pin_set& pins);

  /// Regions the user registered and has not deregistered.
  size_t user_regions() const { return user_.size(); }
  /// Implicit registrations cached now.
  size_t cached() const { return implicit_index_.size(); }
  /// Implicit registrations made so far (cache misses).
  uint64_t implicit_misses() const { return implicit_misses_; }

private:
  struct range {
    uintptr_t address;
    size_t length;
    bool operator==(const range&) const = default;
  };
  struct range_hash {
    size_t operator()(const range& r) const { return r.address * 31 + r.length; }
  };
  using lru_list = std::list<cached_mr>;

  static constexpr int access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

  bool user_lkey(uintptr_t address, size_t length, uint32_t* lkey) const;
  cached_mr* implicit_mr(uintptr_t address, size_t length);
  void evict_idle();
  void forget_user_region(const tl::region& r);

  const api& t_;
  ibv_pd* pd_;
  uint64_t id_;
  size_t cache_limit_;
  tl::region_cache user_;
  std::vector<ibv_mr*> slots_;
  std::vector<uint32_t> free_slots_;
  std::map<uintptr_t, const tl::region*> by_base_;
  lru_list implicit_;
  std::unordered_map<range, lru_list::iterator, range_hash> implicit_index_;
  uint64_t implicit_misses_ = 0;
};

}  // namespace comm::verbs
