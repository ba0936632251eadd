// The self memory domain: the shm md's semantics within one process.
//
// Registrations of every self interface live in one process-wide region table (a slot per region:
// owner interface, generation, base, length, valid) behind a mutex. The packed rkey is the one of
// base/rkey.hpp with rkey_magic_self: {pid, owner interface id, slot, generation, base, length}.
// get_zcopy/put_zcopy check, under the table's lock, that the slot still holds the key's
// registration of the endpoint's target interface and that the access lies inside it, then copy
// with memmove outside the lock (synchronous: ok or an error, `comp` is never used).
//
// Errors: invalid_param (no key, another transport's key, a key of another process -- refused at
// unpack -- or of an interface other than the endpoint's target, a bad iov); protection_error
// (stale key after deregistration, or an access starting outside the region); length_error
// (starting inside, running past the end); connection_reset (the target interface is closed).
// Unlike shm's CMA, a plain copy cannot turn memory unmapped under a registration into an error:
// within one process that is the user's bug, as for any pointer it frees and then uses.
#pragma once

#include "base/region_cache.hpp"
#include "base/rkey.hpp"

#include <comm/transport/transport.hpp>

#include <mutex>
#include <string>

namespace comm::tl::self {

/// Most slots of the process-wide region table.
inline constexpr uint32_t max_self_regions = 1u << 20;

/// Whether `key` (unpacked by a self md) still grants [address, address + bytes) of memory
/// registered by the interface with id `target`: ok, invalid_param, protection_error or
/// length_error.
status check_self_access(const packed_rkey& key, uint64_t target, uint64_t address,
                         uint64_t bytes);

/// The memory domain of one self interface.
class self_md final : public md {
public:
  /// The md of the self interface with registry id `iface_id`.
  explicit self_md(uint64_t iface_id);
  /// Releases every registration still held (the interface is closing).
  ~self_md() override;
  self_md(const self_md&) = delete;
  self_md& operator=(const self_md&) = delete;

  status mem_reg(void* address, size_t length, mem_handle** out) override;
  status mem_dereg(mem_handle* handle) override;
  status rkey_pack(const mem_handle* handle, std::vector<uint8_t>& out) override;
  status rkey_unpack(const void* data, size_t length, remote_key* out) override;
  void rkey_release(remote_key* key) override;

  /// Lines for iface::info(): regions registered, registrations, cache hits.
  std::string info() const;

private:
  mutable std::mutex mutex_;
  const uint64_t iface_id_;
  region_cache cache_;
  uint64_t deregistrations_ = 0;
};

/// Copies between the local iov (in order) and `bytes` at `remote` in this process: into the iov
/// when `write` is false, from it when true.
void copy_local(const iov* entries, size_t count, uint8_t* remote, bool write);

}  // namespace comm::tl::self
