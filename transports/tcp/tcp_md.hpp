// The tcp memory domain: registrations the interface's peers may read (get) and write (put).
//
// Nothing is pinned or mapped: a registration is a slot of the interface's region table {base,
// length, generation, valid} and the packed rkey (base/rkey.hpp's packed_rkey with
// rkey_magic_tcp) names {pid, interface id, slot, generation, base, length}. A peer's put or get
// travels as a frame naming the slot, generation, address and length (tcp_wire.hpp); the owner's
// interface checks it against its table when the frame arrives: a slot that no longer holds that
// generation (deregistered) or an access starting outside the region is a protection error, one
// starting inside and running past its end a length error; the answer carries the error and no
// memory is touched. Registering again the exact same range is a cache hit (base/region_cache.hpp).
//
// Deregistration while the peer's operation is under way: a get answer whose data the kernel has
// not taken completely is copied first (the caller may free the memory at once); answers not yet
// started say protection_error; a put still arriving into the region is read and dropped, and
// answered protection_error.
//
// Memory unmapped under a registration (freed without deregistering it), or a bad local iov, is
// refused by the kernel (EFAULT) when the data is written to or read from the socket: the
// connection fails and its endpoints with it, as with a bad am_zcopy iov.
//
// One thread uses an interface and its memory domain (libcomm calls both under its worker's lock).
#pragma once

#include "base/region_cache.hpp"
#include "base/rkey.hpp"

#include <comm/transport/transport.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace comm::tl::tcp {

class tcp_iface;

/// Magic of keys packed by the tcp memory domain ("tcrk").
inline constexpr uint32_t rkey_magic_tcp = 0x6b726374;
/// Most slots of an interface's region table.
inline constexpr uint32_t max_tcp_regions = 1u << 20;

/// The memory domain of one tcp interface.
class tcp_md final : public md {
public:
  /// The md of `owner`, whose interface id is `iface_id`.
  tcp_md(tcp_iface& owner, uint64_t iface_id);
  /// Releases every registration still held (the interface is closing).
  ~tcp_md() override;
  tcp_md(const tcp_md&) = delete;
  tcp_md& operator=(const tcp_md&) = delete;

  status mem_reg(void* address, size_t length, mem_handle** out) override;
  status mem_dereg(mem_handle* handle) override;
  status rkey_pack(const mem_handle* handle, std::vector<uint8_t>& out) override;
  status rkey_unpack(const void* data, size_t length, remote_key* out) override;
  void rkey_release(remote_key* key) override;

  /// Whether slot `slot` holds the registration of `generation` and [address, address + bytes)
  /// lies inside it: ok, protection_error or length_error.
  status check(uint32_t slot, uint64_t generation, uint64_t address, uint64_t bytes) const;

  /// Lines for iface::info(): regions registered, registrations, cache hits, peers' accesses.
  std::string info() const;

  /// Counts a peer's access checked by the owner (for info()).
  void count_access(bool write, status result);

private:
  struct entry {
    uint64_t generation = 0;
    uint64_t base = 0;
    uint64_t length = 0;
    bool valid = false;
  };

  tcp_iface& owner_;
  const uint64_t iface_id_;
  const int32_t pid_;  ///< in every key (a system call per rendezvous otherwise)
  region_cache cache_;
  std::vector<entry> table_;
  std::vector<uint32_t> free_;  ///< free slots, the next one at the back
  uint64_t deregistrations_ = 0;
  uint64_t gets_served_ = 0;
  uint64_t puts_taken_ = 0;
  uint64_t accesses_refused_ = 0;
};

/// The tcp key behind `key`, or null (no key, or another transport's).
const packed_rkey* tcp_rkey_of(const remote_key& key);

}  // namespace comm::tl::tcp
