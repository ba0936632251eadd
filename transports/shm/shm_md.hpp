// The shm memory domain and RMA by cross-memory attach (CMA: process_vm_readv/process_vm_writev).
//
// Registration writes the region into a slot of the region table at the end of the interface's
// own receive segment (shm_segment.hpp: region_entry, a per-slot generation), which every peer
// already maps. The packed rkey (base/rkey.hpp) names {pid, iface id, slot, generation, base,
// length}. Before every get/put a peer checks, in its mapping of our segment, that the slot still
// holds that generation and that the access lies inside [base, base + length); then it moves the
// bytes with one CMA call per batch of local iov entries.
//
// CMA works on virtual addresses in the owner's address space: nothing is pinned and nothing is
// mapped for the peer, so registering costs no syscall. Memory unmapped (freed to the kernel) under
// a registration is not a crash on either side: the kernel reports EFAULT and the operation fails
// with status::io_error. Because a registration names virtual addresses, a buffer freed and
// reallocated at the same address without deregistration is still described correctly; what the
// cache must never do -- hand out a registration the user deregistered -- cannot happen, since the
// last deregistration removes the cache entry and invalidates the slot (bumping its generation on
// reuse) before anything else can see it.
//
// Error mapping of get_zcopy/put_zcopy:
//   invalid_param     no key, a key of another transport, an iov that is null or overflows, or a
//                     key whose pid/iface is not this endpoint's peer
//   protection_error  the slot no longer holds the key's registration (deregistered: stale key),
//                     the key's base/length do not match it, or the access starts outside it
//   privileges_violation  a put into a region registered read-only (mem_reg_read_only)
//   length_error      the access starts inside the region but runs past its end
//   connection_reset  the peer is gone (ESRCH, its pidfd, or its interface closed); the endpoint
//                     also takes the normal peer-failure path (error handler on progress)
//   io_error          EFAULT (memory unmapped under a registration, or a bad local buffer),
//                     EPERM and other kernel refusals; no_memory for ENOMEM
// Partial transfers never report ok: a short CMA call is continued, and the call that hits the
// fault returns the error.
//
// Mapped segments: when a registered region lies in this process's shared heap (shm_heap.hpp,
// comm::mem_alloc), rkey_pack appends the segment's identity (segment_ref, 40 bytes) to the key.
// A peer that can map that segment (shm_mapped.hpp) moves the bytes with memcpy instead of CMA,
// after the same region-table check; a segment its owner released gives io_error, as EFAULT does
// with CMA. On that path a bad local buffer is the caller's fault as with memcpy (CMA would report
// io_error). Keys without the extension, and segments that cannot be mapped, use CMA.
//
// Read-only regions (mem_reg_read_only, UCT's remote-get-only access): the slot's `rights` word
// says so, and the peer's check refuses a put into it (privileges_violation) whatever its key
// says.
// A peer reads them, and rkey_local_address hands them out, through a mapping made with
// PROT_READ only, so a stray write through a borrowed pointer faults in the borrower instead of
// changing the owner's bytes. What this does not stop: a process of the same user that wants to
// write can reopen the memfd itself (/proc/<pid>/fd) or use CMA; the boundary against a hostile
// process is the user id, as for any shared memory.
#pragma once

#include "base/region_cache.hpp"
#include "base/rkey.hpp"
#include "shm/shm_heap.hpp"
#include "shm/shm_segment.hpp"

#include <comm/transport/transport.hpp>

#include <sys/types.h>

#include <mutex>
#include <string>
#include <vector>

namespace comm::tl::shm {

/// The memory domain of one shm interface: registrations live in its segment's region table.
class shm_md final : public md {
public:
  /// The md of the interface that owns segment `own` (already created) with id `iface_id`.
  shm_md(const segment& own, uint64_t iface_id);
  /// Frees the cached regions. Does not touch the table: close() does, in the owner only.
  ~shm_md() override;

  status mem_reg(void* address, size_t length, mem_handle** out) override;
  status mem_reg_read_only(void* address, size_t length, mem_handle** out) override;
  status mem_dereg(mem_handle* handle) override;
  status rkey_pack(const mem_handle* handle, std::vector<uint8_t>& out) override;
  status rkey_unpack(const void* data, size_t length, remote_key* out) override;
  void rkey_release(remote_key* key) override;
  /// True for memory of this process's shared heap (comm::mem_alloc): a peer maps its segment.
  bool maps_for_peers(const void* address, size_t length) const override;

  /// Invalidates every registered slot (the owner's interface is closing), so peers still holding
  /// keys get errors rather than access to memory that may be reused.
  void close();

  /// Lines for iface::info(): regions registered, registrations, cache hits.
  std::string info() const;

private:
  /// Registers the range with peers' `rights` (0 or region_read_only).
  status reg(void* address, size_t length, uint64_t rights, mem_handle** out);
  /// Writes [base, base + length) and `rights` into free slot `index`; returns the slot's new
  /// generation.
  uint64_t publish(uint32_t index, uint64_t base, uint64_t length, uint64_t rights);
  /// Invalidates slot `index` and returns it to the free list.
  void retire(uint32_t index);

  mutable std::mutex mutex_;  ///< registrations may come from any thread
  const segment& own_;
  const uint64_t iface_id_;
  const int32_t pid_;
  region_cache cache_;
  std::vector<uint32_t> free_;  ///< free slots, the next one at the back
  uint64_t deregistrations_ = 0;
};

/// For a peer: whether `key` still grants [address, address + bytes) in the region table of its
/// owner's segment `owner`, for a put when `write`. ok, protection_error, length_error or
/// privileges_violation (see the mapping above). Sets `*read_only` (when not null) to whether
/// the region is read-only.
status check_access(const segment_view& owner, const packed_rkey& key, uint64_t address,
                    uint64_t bytes, bool write, bool* read_only = nullptr);

/// True when `key` (unpacked by an shm md) carries a shared-heap segment; copies it to `*out`.
bool segment_of(const remote_key& key, segment_ref* out);

/// Copies between the local iov (filled, or read, in order) and `remote` in this process (a peer's
/// segment mapped here): reads from it when `write` is false, writes to it when true.
void mapped_transfer(const iov* entries, size_t count, uint8_t* remote, bool write);

/// Copies between the local iov (filled, or read, in order) and [remote, remote + total) of
/// process `pid`: CMA reads when `write` is false, writes when true. `total` is the iov's sum.
status cma_transfer(pid_t pid, const iov* entries, size_t count, uint64_t remote, size_t total,
                    bool write);

}  // namespace comm::tl::shm
