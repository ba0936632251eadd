// An endpoint of the verbs transport: the sending side of one RC connection (verbs_conn.hpp).
// am_short is an inline SEND, am_bcopy a SEND from a registered send buffer, am_zcopy a SEND
// with a gather list (the header from a send buffer, then the user's iov), put/get_zcopy RDMA
// WRITE/READ. Each SEND needs a send slot and a credit; without them the answer is no_resource.
#pragma once

#include "verbs/verbs_conn.hpp"

#include <comm/transport/transport.hpp>

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

  /// The connection (for tests and the interface).
  verbs_conn* conn() const { return conn_; }
  /// The interface drops the connection (it was closed under the endpoint).
  void detach() { conn_ = nullptr; }

private:
  status ready_to_send(bool needs_credit) const;
  status post_am(ibv_sge* sges, int count, int32_t buffer, unsigned flags,
                 tl::completion* comp, pin_set* pins);
  status rdma(ibv_wr_opcode opcode, const tl::iov* entries, size_t count, uint64_t remote_address,
              const tl::remote_key& key, tl::completion* comp);

  verbs_iface& owner_;
  verbs_conn* conn_;
};

}  // namespace comm::verbs
