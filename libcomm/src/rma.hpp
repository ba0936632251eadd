// The RMA module: memory registration, remote keys, and put/get with DAT's RDMA-read semantics.
// Lanes with get/put zcopy move the data directly; on the others each fragment is an RmaRequest
// that the owner checks against its registration and answers with an RmaReply (carrying the data
// of a get): software RMA.
#pragma once

#include "worker_impl.hpp"

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace comm {

/// A registration on every memory domain of a worker.
class memh {
public:
  void* address = nullptr;  ///< start of the region
  size_t length = 0;        ///< bytes in the region
  /// One registration per interface that has a memory domain.
  std::vector<std::pair<detail::worker_impl::lane_iface*, tl::mem_handle*>> regs;
  uint64_t token = 0;       ///< names it to software RMA from peers on lanes without get/put
  uint32_t access = mem_access_all;  ///< its rights (mem_access)
  detail::worker_impl* owner = nullptr; ///< the worker it is registered with
  memh_ptr* handle = nullptr;           ///< the user's owning handle, if any
};

/// A peer's region as seen through one endpoint.
class rkey {
public:
  detail::endpoint_impl* ep = nullptr;  ///< the endpoint it was unpacked for
  tl::remote_key key;                   ///< the transport's unpacked key
  uint64_t base = 0;                    ///< start of the remote region
  uint64_t length = 0;                  ///< bytes in the remote region
  bool software = false;                ///< the lane has no get/put: RMA by messages
  uint64_t token = 0;                   ///< the owner's software-RMA token
  uint32_t access = mem_access_all;     ///< the region's remote rights, as the owner packed them
  rkey_ptr* handle = nullptr;           ///< the user's owning handle, if any
};

}  // namespace comm

namespace comm::detail {

/// Wire ids of the RMA module.
enum class rma_msg : tl::am_id {
  request = 16,  ///< RmaRequest: a software put or get of one fragment
  reply = 17,    ///< RmaReply: its outcome (and a get's data)
};

/// State of a put or get.
struct rma_state {
  bool is_get = false;           ///< a get, else a put
  unsigned reads = 0;            ///< gets this request has in flight
  size_t length = 0;             ///< bytes to move
  size_t offset = 0;             ///< software RMA: bytes requested so far
  uint64_t remote_address = 0;   ///< where, at the peer
  rkey* key = nullptr;           ///< the peer's key
  uint64_t id = 0;               ///< software RMA: our id in the table of operations (0: none)
  unsigned replies_due = 0;      ///< software RMA: requests sent whose reply has not come
  bool counted = false;          ///< counts in the endpoint's RMA operations in flight
  send_callback user_cb = nullptr; ///< suppressed: the caller's callback, told of a failure only
};

/// The RMA module (see the top of this file).
class rma_protocol final : public protocol {
public:
  rma_protocol(worker_impl& w, unsigned index);
  std::string_view name() const noexcept override { return "rma"; }

  /// Starts a put or get (endpoint::put, endpoint::get) with DAT's completion flags.
  op start(endpoint_impl& ep, bool is_get, const iov_entry* local, size_t count,
           uint64_t remote_address, rkey* key, const request_params& params);
  /// Gives `handle` a token no other registration of the worker has, and records it.
  void add_region(memh* handle);
  /// Forgets the registration of `handle`; false if it is not one of ours.
  bool remove_region(memh* handle);
  /// Deregisters `handle` from every memory domain and frees it (its owning handle, if any,
  /// becomes empty); invalid_param if it is not one of ours.
  status unmap(memh* handle);
  /// Records `key`, unpacked for `ep`, so that it goes with the endpoint.
  void add_key(endpoint_impl& ep, rkey* key);
  /// Releases `key` at its transport and frees it (its owning handle, if any, becomes empty).
  void destroy_key(rkey* key);
  /// Our registrations by software-RMA token.
  const std::unordered_map<uint64_t, memh*>& regions() const noexcept { return regions_; }
  /// Reads (gets) outstanding on the lane of `ep`.
  unsigned& reads_in_flight(endpoint_impl& ep);
  /// Puts and gets of `ep` issued and not yet complete (what a fence waits for).
  unsigned& ops_in_flight(endpoint_impl& ep);
  /// Binds the outstanding-reads limit of `ep` when its lane is chosen: what the peer accepts
  /// (`peer_reads_in` from its address; 0 when it did not say) and what our lane allows.
  void bind_read_limit(endpoint_impl& ep, uint32_t peer_reads_in);
  /// Reads `ep` may have in flight (bind_read_limit).
  unsigned read_limit(endpoint_impl& ep);
  /// Most reads `ep` ever had in flight at once.
  unsigned peak_reads(endpoint_impl& ep);
  /// PRIVILEGES_VIOLATION when a local entry lies in one of our regions whose local rights
  /// exclude the access (a get writes the iov, a put reads it), else ok.
  status check_local_rights(bool is_get, const iov_entry* local, size_t count) const;
  /// Forgets `handle` in the local-rights checks.
  void forget_local_rights(memh* handle);
  /// Remembers `handle` for the local-rights checks when it withholds a local right.
  void note_local_rights(memh* handle);

  /// Issues what the transport takes of `req` (its request_ops progress).
  static status progress_op(request* req);
  /// Forgets the software operation `req`, if it is one.
  void release(rma_state& s);

  /// Destroys the keys unpacked for `ep`, which goes away.
  void endpoint_deleted(endpoint_impl& ep) override;
  /// Unmaps the registrations the user left.
  void teardown() override;
  void info(std::ostream& out) const override;

private:
  void on_request(const uint8_t* data, size_t length);
  void on_reply(const uint8_t* data, size_t length);
  /// Software RMA of `req`.
  status send_by_messages(request* req, rma_state& s);
  /// Forgets what issuing `req` recorded, when it did not start (it is retried or fails).
  void undo_issue(request* req, rma_state& s);
  /// A put or get posted on an endpoint that failed or is closing: completed as flushed.
  op flushed(endpoint_impl& ep, bool is_get, const request_params& params);
  /// Zero-copy RMA of `req` on the lane's get/put.
  status send_zcopy(request* req, rma_state& s);
  /// A fenced `req` must wait (earlier puts or gets still in flight), or a get waits for reads.
  bool must_wait(request* req, const rma_state& s, unsigned reads_needed);

  std::unordered_map<uint64_t, request*> ops_;  ///< software RMA awaiting the owner's reply
  std::unordered_map<uint64_t, memh*> regions_; ///< our registrations by software-RMA token
  std::vector<memh*> local_limited_;            ///< our registrations withholding a local right
  uint64_t next_id_ = 1;                        ///< next id in ops_
};

}  // namespace comm::detail
