#include "verbs/verbs_ep.hpp"

#include "base/rkey.hpp"
#include "verbs/verbs_iface.hpp"

#include <cstring>

namespace comm::verbs {
namespace {

/// Largest inline SEND an endpoint builds on its stack.
constexpr size_t inline_limit = 1024;

/// Writes the header of an active message for `id` on `c` to `dst`; returns its size.
size_t write_am_header(void* dst, tl::am_id id, verbs_iface& owner, verbs_conn& c) {
  return owner.write_header(dst, message_kind::am, static_cast<uint8_t>(id),
                            c.take_credits_to_return());
}

}  // namespace

verbs_ep::verbs_ep(verbs_iface& owner, verbs_conn& conn) : owner_(owner), conn_(&conn) {
  conn.ep = this;
}

verbs_ep::~verbs_ep() {
  if (conn_ == nullptr) return;
  owner_.release_conn(*conn_);
}

status verbs_ep::ready_to_send(bool needs_credit) const {
  if (conn_ == nullptr) return status::connection_reset;
  if (conn_->pending.blocks_sends()) return status::no_resource;
  return conn_->can_post(needs_credit);
}

status verbs_ep::post_am(ibv_sge* sges, int count, int32_t buffer, unsigned flags,
                         tl::completion* comp, pin_set* pins) {
  tx_request req;
  req.wr.opcode = IBV_WR_SEND;
  req.wr.sg_list = sges;
  req.wr.num_sge = count;
  req.wr.send_flags = flags;
  req.buffer = buffer;
  req.comp = comp;
  req.needs_credit = true;
  if (pins != nullptr) req.pins = *pins;
  return conn_->post(req);
}

status verbs_ep::am_short(tl::am_id id, const void* header, size_t header_length,
                          const void* payload, size_t payload_length) {
  const size_t total = message_header_size + header_length + payload_length;
  if (id >= tl::am_id_count || total > owner_.max_inline() || total > inline_limit) {
    return status::invalid_param;
  }
  const status st = ready_to_send(true);
  if (st != status::ok) return st;
  alignas(8) uint8_t bytes[inline_limit];
  const size_t h = write_am_header(bytes, id, owner_, *conn_);
  if (header_length != 0) std::memcpy(bytes + h, header, header_length);
  if (payload_length != 0) std::memcpy(bytes + h + header_length, payload, payload_length);
  ibv_sge sge{reinterpret_cast<uintptr_t>(bytes), static_cast<uint32_t>(total), 0};
  return post_am(&sge, 1, -1, IBV_SEND_INLINE, nullptr, nullptr);
}

ssize_t verbs_ep::am_bcopy(tl::am_id id, tl::pack_fn pack, void* arg) {
  if (id >= tl::am_id_count || pack == nullptr) return static_cast<ssize_t>(status::invalid_param);
  const status st = ready_to_send(true);
  if (st != status::ok) return static_cast<ssize_t>(st);
  const int32_t buffer = owner_.take_tx_buffer();
  if (buffer < 0) return static_cast<ssize_t>(status::no_resource);
  uint8_t* bytes = owner_.tx_buffer(buffer);
  const size_t length = pack(bytes + message_header_size, arg);
  if (length > owner_.attr().max_bcopy) {
    owner_.return_tx_buffer(buffer);
    return static_cast<ssize_t>(status::exceeds_limit);
  }
  const size_t h = write_am_header(bytes, id, owner_, *conn_);
  ibv_sge sge{reinterpret_cast<uintptr_t>(bytes), static_cast<uint32_t>(h + length),
              owner_.tx_lkey()};
  const status posted = post_am(&sge, 1, buffer, 0, nullptr, nullptr);
  return posted == status::ok ? static_cast<ssize_t>(length) : static_cast<ssize_t>(posted);
}

status verbs_ep::am_zcopy(tl::am_id id, const void* header, size_t header_length,
                          const tl::iov* entries, size_t count, tl::completion* comp) {
  const tl::iface_attr& a = owner_.attr();
  size_t total = 0;
  if (id >= tl::am_id_count || header_length > a.max_hdr || count > a.max_iov ||
      !tl::sum_iov(entries, count, &total) || total > a.max_zcopy) {
    return status::invalid_param;
  }
  const status st = ready_to_send(true);
  if (st != status::ok) return st;
  const int32_t buffer = owner_.take_tx_buffer();
  if (buffer < 0) return status::no_resource;
  ibv_sge sges[max_zcopy_iov + 1];
  pin_set pins;
  if (owner_.md().local_sges(entries, count, sges + 1, pins) != status::ok) {
    owner_.return_tx_buffer(buffer);
    return status::io_error;
  }
  uint8_t* bytes = owner_.tx_buffer(buffer);
  const size_t h = write_am_header(bytes, id, owner_, *conn_);
  if (header_length != 0) std::memcpy(bytes + h, header, header_length);
  sges[0] = ibv_sge{reinterpret_cast<uintptr_t>(bytes), static_cast<uint32_t>(h + header_length),
                    owner_.tx_lkey()};
  const status posted = post_am(sges, static_cast<int>(count + 1), buffer, 0, comp, &pins);
  return posted == status::ok ? status::in_progress : posted;
}

status verbs_ep::rdma(ibv_wr_opcode opcode, const tl::iov* entries, size_t count,
                      uint64_t remote_address, const tl::remote_key& key, tl::completion* comp) {
  const tl::iface_attr& a = owner_.attr();
  size_t total = 0;
  const size_t limit = opcode == IBV_WR_RDMA_READ ? a.max_get_zcopy : a.max_put_zcopy;
  if (count > a.max_iov || !tl::sum_iov(entries, count, &total) || total > limit) {
    return status::invalid_param;
  }
  const tl::packed_rkey* rkey = tl::rkey_of(key, rkey_magic_verbs);
  if (rkey == nullptr) return status::invalid_param;
  const status in_range = tl::check_range(rkey->base, rkey->length, remote_address, total);
  if (in_range != status::ok) return in_range;
  const status st = ready_to_send(false);
  if (st != status::ok) return st;
  if (opcode == IBV_WR_RDMA_READ && conn_->reads_in_flight() >= conn_->max_reads()) {
    return status::no_resource;
  }
  ibv_sge sges[max_zcopy_iov];
  tx_request req;
  if (owner_.md().local_sges(entries, count, sges, req.pins) != status::ok) {
    return status::io_error;
  }
  req.wr.opcode = opcode;
  req.wr.sg_list = sges;
  req.wr.num_sge = static_cast<int>(count);
  req.wr.wr.rdma.remote_addr = remote_address;
  req.wr.wr.rdma.rkey = rkey->index;
  req.comp = comp;
  req.signal = true;
  const status posted = conn_->post(req);
  return posted == status::ok ? status::in_progress : posted;
}

status verbs_ep::put_zcopy(const tl::iov* entries, size_t count, uint64_t remote_address,
                           const tl::remote_key& key, tl::completion* comp) {
  return rdma(IBV_WR_RDMA_WRITE, entries, count, remote_address, key, comp);
}

status verbs_ep::get_zcopy(const tl::iov* entries, size_t count, uint64_t remote_address,
                           const tl::remote_key& key, tl::completion* comp) {
  return rdma(IBV_WR_RDMA_READ, entries, count, remote_address, key, comp);
}

status verbs_ep::pending_add(tl::pending_req* req) {
  if (req == nullptr) return status::invalid_param;
  if (conn_ == nullptr) return status::connection_reset;
  if (conn_->state() == conn_state::failed) return conn_->failure();
  if (conn_->pending.empty() && conn_->can_post(true) == status::ok) return status::busy;
  conn_->pending.push_back(req);
  owner_.watch(*conn_);
  return status::ok;
}

void verbs_ep::pending_purge(void (*cb)(tl::pending_req* req, void* arg), void* arg) {
  if (conn_ != nullptr) conn_->pending.purge(cb, arg);
}

status verbs_ep::flush(tl::completion* comp) {
  if (conn_ == nullptr) return status::connection_reset;
  return conn_->flush(comp);
}

status verbs_ep::fence() {
  if (conn_ == nullptr) return status::connection_reset;
  conn_->fence();
  return status::ok;
}

}  // namespace comm::verbs
