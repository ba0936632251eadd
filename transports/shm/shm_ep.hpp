// An shm endpoint: sends into a peer interface's receive segment, mapped into this process once
// per peer interface (shm_peer.hpp) and shared with the other endpoints to that peer.
// Completion and pending callbacks must not destroy the endpoint that runs them; the error handler
// may. Destroying an endpoint drops its in-flight zcopy completions without calling them, and an
// endpoint must be destroyed before its interface.
// RMA (get_zcopy/put_zcopy) is synchronous: checked against the peer's region table in its mapped
// segment, then moved with memcpy when the key names a shared-heap segment the interface can map
// (shm_mapped.hpp), else with CMA; it returns ok or an error and never uses `comp` (see shm_md.hpp
// for the checks and the error mapping).
#pragma once

#include "base/pending_queue.hpp"
#include "base/rkey.hpp"
#include "shm/shm_heap.hpp"
#include "shm/shm_peer.hpp"
#include "shm/shm_segment.hpp"

#include <comm/transport/transport.hpp>

#include <capnp/common.h>
#include <kj/common.h>

#include <memory>
#include <utility>
#include <vector>

namespace comm::tl::shm {

class shm_iface;

class shm_ep final : public ep {
public:
  /// An endpoint of `owner` to `peer`, which `owner` keeps while the endpoint lives.
  shm_ep(shm_iface& owner, shm_peer& peer);
  ~shm_ep() override;

  // -- ep --

  status am_short(am_id id, const void* header, size_t header_length, const void* payload,
                  size_t payload_length) override;
  ssize_t am_bcopy(am_id id, pack_fn pack, void* arg) override;
  status am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                  size_t count, completion* comp) override;
  /// Writes the local iov to [remote_address, + its length) of the peer, complete on return.
  status put_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                   const remote_key& key, completion* comp) override;
  /// Reads [remote_address, + the iov's length) of the peer into the local iov, filled in order;
  /// complete on return.
  status get_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                   const remote_key& key, completion* comp) override;
  /// The peer's bytes in our mapping of its heap segment (checked as get_zcopy checks);
  /// unsupported when the key names no heap segment or it cannot be mapped.
  status rkey_local_address(uint64_t remote_address, size_t length, const remote_key& key,
                            local_bytes* out) override;
  /// The pidfd this endpoint opened of the peer (before it trusted the peer's pid).
  int peer_process_fd() const override { return remote_.pidfd; }
  status pending_add(pending_req* req) override;
  void pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) override;
  status flush(completion* comp) override;
  status tag_eager_short(tag_t tag, const void* data, size_t length) override;
  ssize_t tag_eager_bcopy(tag_t tag, uint64_t imm, pack_fn pack, void* arg) override;
  status tag_eager_zcopy(tag_t tag, uint64_t imm, const iov* entries, size_t count,
                         completion* comp) override;
  status tag_rndv_zcopy(tag_t tag, const void* header, size_t header_length, const iov* entries,
                        size_t count, completion* comp, uint64_t* handle) override;
  status tag_rndv_cancel(uint64_t handle) override;
  status tag_rndv_request(tag_t tag, const void* header, size_t header_length) override;

  // -- used by shm_iface --

  /// Completes acknowledged zcopy operations and retries parked requests; returns the count.
  unsigned progress();

  /// True while zcopy operations or rendezvous are in flight, flushes wait or requests are parked.
  bool has_work() const {
    return ztail_ != zhead_ || !pending_.empty() || !rndv_ops_.empty() || !flushes_.empty();
  }

  /// Prepares for the interface's sleep: asks the receiver to wake us when the oldest zcopy is
  /// acked. Returns busy when progress() has something to do now (an ack, parked requests).
  status arm();

  /// Marks the endpoint failed: outstanding zcopy and flush completions finish with `reason`,
  /// later sends return connection_reset. Parked requests stay for pending_purge.
  void fail(status reason);

  /// The peer interface this endpoint sends to.
  shm_peer& peer() const { return remote_; }
  pid_t peer_pid() const { return remote_.address.pid; }
  bool failed() const { return failed_; }

  /// Wakes the peer interface's owner if it sleeps.
  void wake_peer() const;

  /// Set by the interface: on its list of endpoints with work / its failure list.
  bool scheduled = false;
  bool failure_noticed = false;
  /// Made by the interface for its own use (fetching rendezvous): never given to the error
  /// handler.
  bool internal = false;

private:
  struct zcopy_slot {
    uint64_t index = 0;           ///< FIFO position of the cell
    completion* comp = nullptr;   ///< the caller's completion, may be null
  };

  /// A rendezvous this endpoint announced, not yet completed or canceled.
  struct rndv_entry {
    uint64_t handle = 0;          ///< generation << 16 | slot
    uint32_t slot = 0;            ///< its word in our segment
    uint64_t generation = 0;
    completion* comp = nullptr;   ///< the caller's completion, may be null
    mem_handle* memh = nullptr;   ///< the buffer's registration, or null (empty buffer)
    uint64_t seq = 0;             ///< issue order, for flush
  };

  /// A flush waiting for the zcopy operations and rendezvous issued before it.
  struct flush_entry {
    uint64_t zhead = 0;           ///< zhead_ at the flush
    uint64_t rndv_seq = 0;        ///< rndv_issued_ at the flush
    completion* comp = nullptr;
  };

  /// Claims the next cell; no_resource when the FIFO is full. `*wake`: the receiver sleeps.
  status claim(uint64_t* index, bool* wake);
  /// Publishes the filled cell at `index` and wakes the receiver if it asked for it.
  void publish(cell_header* cell, uint64_t index, cell_meta meta, bool wake);
  /// Error for a send refused before touching the FIFO, or ok.
  status refusal() const;
  /// True when the FIFO may have room (cheap: cached tail first).
  bool fifo_may_have_room();
  /// Makes room for the zcopy operations in flight (at first use: most endpoints never zcopy).
  bool reserve_zring();
  void complete_flushes(status result);
  /// refusal(), or no_resource when the ring of zcopy operations in flight is full, or no_memory
  /// when it cannot be made.
  status zcopy_refusal();
  /// Claims a cell and publishes a zcopy of `kind` in it: the descriptor (whose completionSeq it
  /// sets to the cell's index + 1 in `words`) and `header` in the cell's buffer; `comp` completes
  /// with the receiver's ack.
  template <class Descriptor>
  status publish_zcopy(Descriptor descriptor, kj::ArrayPtr<const capnp::word> words, am_id id,
                       cell_kind kind, const void* header, size_t header_length,
                       completion* comp);
  /// Builds and publishes the announcement of a rendezvous in slot `op` (registered already).
  status announce_rndv(const rndv_entry& op, tag_t tag, const void* header, size_t header_length,
                       uint64_t address, uint64_t length, const std::vector<uint8_t>& rkey);
  /// Completes the rendezvous whose words say they are done; returns how many.
  unsigned progress_rndv();
  /// Releases `op`: its registration and its slot (the word says canceled unless `finished`).
  void release_rndv(const rndv_entry& op, bool finished);
  /// Sets the wake bit of every outstanding rendezvous; busy when one is done already.
  status arm_rndv();
  /// get (write false) or put (write true): validates, counts, reports a dead peer.
  status rma(const iov* entries, size_t count, uint64_t remote_address, const remote_key& key,
             bool write);
  /// The peer, region and liveness checks of an RMA of `total` bytes, then the transfer.
  status checked_rma(const packed_rkey& key, const remote_key& unpacked, const iov* entries,
                     size_t count, uint64_t remote_address, size_t total, bool write);
  /// The transfer through the peer's heap segment `segment`, mapped here (`writable` unless the
  /// region is read-only); unsupported when it cannot be mapped (the caller uses CMA).
  status mapped_rma(const packed_rkey& key, const segment_ref& segment, const iov* entries,
                    size_t count, uint64_t remote_address, bool write, bool writable);
  /// False when the peer's pidfd says it exited (checked before a put: its pid could be reused).
  bool peer_alive() const;

  shm_iface& owner_;
  shm_peer& remote_;
  const segment_view peer_;        ///< remote_'s segment, kept here for the hot path
  const uint64_t fifo_size_;
  const size_t max_short_;
  uint64_t cached_tail_ = 0;      ///< last published tail of the peer we read
  bool failed_ = false;
  pending_queue pending_;

  // zcopy operations in flight, in order: ring of zcopy_slot (fifo_size_ of them, allocated at
  // the first zcopy), zhead_ issued, ztail_ completed
  std::unique_ptr<zcopy_slot[]> zring_;
  uint64_t zmask_ = 0;
  uint64_t zhead_ = 0;
  uint64_t ztail_ = 0;
  std::vector<flush_entry> flushes_;

  std::vector<rndv_entry> rndv_ops_;  ///< rendezvous outstanding, in issue order
  uint64_t rndv_issued_ = 0;          ///< rendezvous issued so far

  const int32_t own_pid_;          ///< written into zcopy descriptors
};

}  // namespace comm::tl::shm
