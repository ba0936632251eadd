// An endpoint of the verbs transport: the sending side of one RC connection (verbs_conn.hpp).
// am_short is an inline SEND, am_bcopy a SEND from a registered send buffer, am_zcopy a SEND
// with a gather list (the header from a send buffer, then the user's iov), put/get_zcopy RDMA
// WRITE/READ. Each SEND needs a send slot and a credit; without them the answer is no_resource.
#pragma once

#include "verbs/verbs_conn.hpp"

#include <comm/transport/transport.hpp>

#include <unordered_map>
#include <vector>

namespace comm::verbs {

class verbs_iface;

/// One endpoint. Destroying it leaves its connection (verbs_iface::release_conn): the connection
/// closes, or stays for the peer's endpoint that shares it until that one leaves it too.
class verbs_ep final : public tl::ep {
public:
  /// An endpoint using `conn` of `owner`.
  verbs_ep(verbs_iface& owner, verbs_conn& conn);
  ~verbs_ep() override;
  verbs_ep(const verbs_ep&) = delete;
  verbs_ep& operator=(const verbs_ep&) = delete;

  status am_short(tl::am_id id, const void* header, size_t header_length, const void* payload,
                  size_t payload_length) override;
  ssize_t am_bcopy(tl::am_id id, tl::pack_fn pack, void* arg) override;
  status am_zcopy(tl::am_id id, const void* header, size_t header_length, const tl::iov* entries,
                  size_t count, tl::completion* comp) override;
  status put_zcopy(const tl::iov* entries, size_t count, uint64_t remote_address,
                   const tl::remote_key& key, tl::completion* comp) override;
  status get_zcopy(const tl::iov* entries, size_t count, uint64_t remote_address,
                   const tl::remote_key& key, tl::completion* comp) override;
  status pending_add(tl::pending_req* req) override;
  void pending_purge(void (*cb)(tl::pending_req* req, void* arg), void* arg) override;
  status flush(tl::completion* comp) override;
  status fence() override;
  status tag_eager_short(tl::tag_t tag, const void* data, size_t length) override;
  ssize_t tag_eager_bcopy(tl::tag_t tag, uint64_t imm, tl::pack_fn pack, void* arg) override;
  status tag_eager_zcopy(tl::tag_t tag, uint64_t imm, const tl::iov* entries, size_t count,
                         tl::completion* comp) override;
  status tag_rndv_zcopy(tl::tag_t tag, const void* header, size_t header_length,
                        const tl::iov* entries, size_t count, tl::completion* comp,
                        uint64_t* handle) override;
  status tag_rndv_cancel(uint64_t handle) override;
  status tag_rndv_request(tl::tag_t tag, const void* header, size_t header_length) override;

  /// The peer fetched rendezvous `op_id` (its device's FIN, or its software's rndv_fin): its
  /// completion is told `st` and its registration released. Unknown ids (canceled) are ignored.
  void rndv_finished(uint32_t op_id, status st);
  /// The connection failed: every rendezvous completes with `reason`.
  void fail_rendezvous(status reason);

  /// The connection (for tests and the interface).
  verbs_conn* conn() const { return conn_; }
  /// The interface drops the connection (it was closed under the endpoint).
  void detach() { conn_ = nullptr; }

private:
  status ready_to_send(bool needs_credit) const;
  /// Takes a send buffer for a zcopy's header and the local keys of `entries` (into sges[1..]),
  /// pinning what they need; no_resource without a buffer, io_error (buffer returned) when the
  /// memory cannot be registered.
  status take_zcopy_resources(const tl::iov* entries, size_t count, ibv_sge* sges, pin_set& pins,
                              int32_t* buffer);
  status post_am(ibv_sge* sges, int count, int32_t buffer, unsigned flags,
                 tl::completion* comp, pin_set* pins, uint64_t imm = 0, bool signal = false);
  status tag_ready(bool* ok_to_send) const;
  status post_tagged_copy(ibv_tmh_op opcode, uint32_t app_ctx, tl::tag_t tag, uint64_t imm,
                          const void* data, size_t length, const void* more = nullptr,
                          size_t more_length = 0, bool signal = false);
  void release_rendezvous(uint32_t op_id);
  void rendezvous_ended();

  /// A rendezvous announced and not yet fetched or canceled.
  struct rendezvous {
    tl::completion* comp = nullptr;  ///< told when the peer fetched it
    ibv_mr* mr = nullptr;            ///< the registration of its buffer (null when empty)
  };
  status rdma(ibv_wr_opcode opcode, const tl::iov* entries, size_t count, uint64_t remote_address,
              const tl::remote_key& key, tl::completion* comp);

  verbs_iface& owner_;
  verbs_conn* conn_;
  std::unordered_map<uint32_t, rendezvous> rendezvous_;  ///< by operation id (the handle)
  std::vector<tl::completion*> flush_waiters_;  ///< flushes waiting for the rendezvous
};

}  // namespace comm::verbs
