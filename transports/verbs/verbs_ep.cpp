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
  while (!rendezvous_.empty()) release_rendezvous(rendezvous_.begin()->first);
  for (tl::completion* comp : flush_waiters_) tl::complete(comp, status::canceled);
  if (conn_ == nullptr) return;
  owner_.release_conn(*conn_);
}

status verbs_ep::ready_to_send(bool needs_credit) const {
  if (conn_ == nullptr) return status::connection_reset;
  if (conn_->pending.blocks_sends()) return status::no_resource;
  return conn_->can_post(needs_credit);
}

status verbs_ep::post_am(ibv_sge* sges, int count, int32_t buffer, unsigned flags,
                         tl::completion* comp, pin_set* pins, uint64_t imm, bool signal) {
  tx_request req;
  req.signal = signal;
  req.wr.opcode = IBV_WR_SEND;
  if (imm != 0) {
    // A tagged message's immediate value: the low half here, the high half in the TMH's app_ctx.
    req.wr.opcode = IBV_WR_SEND_WITH_IMM;
    req.wr.imm_data = htobe32(static_cast<uint32_t>(imm));
  }
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
  const size_t total = owner_.header_size() + header_length + payload_length;
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
  const size_t length = pack(bytes + owner_.header_size(), arg);
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
  ibv_sge sges[max_zcopy_iov + 1];
  pin_set pins;
  int32_t buffer = -1;
  const status taken = take_zcopy_resources(entries, count, sges, pins, &buffer);
  if (taken != status::ok) return taken;
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

status verbs_ep::take_zcopy_resources(const tl::iov* entries, size_t count, ibv_sge* sges,
                                      pin_set& pins, int32_t* buffer) {
  *buffer = owner_.take_tx_buffer();
  if (*buffer < 0) return status::no_resource;
  if (owner_.md().local_sges(entries, count, sges + 1, pins) != status::ok) {
    owner_.return_tx_buffer(*buffer);
    return status::io_error;
  }
  return status::ok;
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
  if (!rendezvous_.empty()) {
    // A rendezvous counts until it was fetched or canceled.
    if (conn_->state() == conn_state::failed) return conn_->failure();
    if (comp != nullptr) flush_waiters_.push_back(comp);
    return status::in_progress;
  }
  return conn_->flush(comp);
}

status verbs_ep::fence() {
  if (conn_ == nullptr) return status::connection_reset;
  conn_->fence();
  return status::ok;
}

}  // namespace comm::verbs

namespace comm::verbs {

// -- tag matching (the peer's SRQ matches tags: verbs_tag.hpp) ------------------------------------

status verbs_ep::tag_ready(bool* ok_to_send) const {
  *ok_to_send = false;
  if (!owner_.tag_matching()) return status::unsupported;
  const status st = ready_to_send(true);
  *ok_to_send = st == status::ok;
  return st;
}

status verbs_ep::post_tagged_copy(ibv_tmh_op opcode, uint32_t app_ctx, tl::tag_t tag,
                                  uint64_t imm, const void* data, size_t length, const void* more,
                                  size_t more_length, bool signal) {
  const size_t total = tmh_size + length + more_length;
  alignas(8) uint8_t inline_bytes[inline_limit];
  if (total <= owner_.max_inline() && total <= inline_limit) {
    write_tmh(inline_bytes, opcode, app_ctx, tag);
    if (length != 0) std::memcpy(inline_bytes + tmh_size, data, length);
    if (more_length != 0) std::memcpy(inline_bytes + tmh_size + length, more, more_length);
    ibv_sge sge{reinterpret_cast<uintptr_t>(inline_bytes), static_cast<uint32_t>(total), 0};
    return post_am(&sge, 1, -1, IBV_SEND_INLINE, nullptr, nullptr, imm, signal);
  }
  const int32_t buffer = owner_.take_tx_buffer();
  if (buffer < 0) return status::no_resource;
  uint8_t* bytes = owner_.tx_buffer(buffer);
  write_tmh(bytes, opcode, app_ctx, tag);
  if (length != 0) std::memcpy(bytes + tmh_size, data, length);
  if (more_length != 0) std::memcpy(bytes + tmh_size + length, more, more_length);
  ibv_sge sge{reinterpret_cast<uintptr_t>(bytes), static_cast<uint32_t>(total), owner_.tx_lkey()};
  return post_am(&sge, 1, buffer, 0, nullptr, nullptr, imm, signal);
}

status verbs_ep::tag_eager_short(tl::tag_t tag, const void* data, size_t length) {
  if (!owner_.tag_matching()) return status::unsupported;
  if (length > owner_.attr().tag.eager.max_short || (length != 0 && data == nullptr)) {
    return status::invalid_param;
  }
  bool ok = false;
  const status st = tag_ready(&ok);
  if (!ok) return st;
  return post_tagged_copy(IBV_TMH_EAGER, 0, tag, 0, data, length);
}

ssize_t verbs_ep::tag_eager_bcopy(tl::tag_t tag, uint64_t imm, tl::pack_fn pack, void* arg) {
  if (!owner_.tag_matching()) return static_cast<ssize_t>(status::unsupported);
  if (pack == nullptr) return static_cast<ssize_t>(status::invalid_param);
  bool ok = false;
  const status st = tag_ready(&ok);
  if (!ok) return static_cast<ssize_t>(st);
  const int32_t buffer = owner_.take_tx_buffer();
  if (buffer < 0) return static_cast<ssize_t>(status::no_resource);
  uint8_t* bytes = owner_.tx_buffer(buffer);
  const size_t length = pack(bytes + tmh_size, arg);
  if (length > owner_.attr().tag.eager.max_bcopy) {
    owner_.return_tx_buffer(buffer);
    return static_cast<ssize_t>(status::exceeds_limit);
  }
  write_tmh(bytes, IBV_TMH_EAGER, static_cast<uint32_t>(imm >> 32), tag);
  ibv_sge sge{reinterpret_cast<uintptr_t>(bytes), static_cast<uint32_t>(tmh_size + length),
              owner_.tx_lkey()};
  const status posted = post_am(&sge, 1, buffer, 0, nullptr, nullptr, imm);
  return posted == status::ok ? static_cast<ssize_t>(length) : static_cast<ssize_t>(posted);
}

status verbs_ep::tag_eager_zcopy(tl::tag_t tag, uint64_t imm, const tl::iov* entries,
                                 size_t count, tl::completion* comp) {
  if (!owner_.tag_matching()) return status::unsupported;
  const tl::tag_limits::eager_limits& limits = owner_.attr().tag.eager;
  size_t total = 0;
  if (count > limits.max_iov || !tl::sum_iov(entries, count, &total) ||
      total > limits.max_zcopy) {
    return status::invalid_param;
  }
  bool ok = false;
  const status st = tag_ready(&ok);
  if (!ok) return st;
  ibv_sge sges[max_zcopy_iov + 1];
  pin_set pins;
  int32_t buffer = -1;
  const status taken = take_zcopy_resources(entries, count, sges, pins, &buffer);
  if (taken != status::ok) return taken;
  uint8_t* bytes = owner_.tx_buffer(buffer);
  write_tmh(bytes, IBV_TMH_EAGER, static_cast<uint32_t>(imm >> 32), tag);
  sges[0] = ibv_sge{reinterpret_cast<uintptr_t>(bytes), tmh_size, owner_.tx_lkey()};
  const status posted =
      post_am(sges, static_cast<int>(count + 1), buffer, 0, comp, &pins, imm);
  if (posted != status::ok) return posted;
  return comp != nullptr ? status::in_progress : status::ok;
}

status verbs_ep::tag_rndv_zcopy(tl::tag_t tag, const void* header, size_t header_length,
                                const tl::iov* entries, size_t count, tl::completion* comp,
                                uint64_t* handle) {
  if (!owner_.tag_matching()) return status::unsupported;
  const tl::tag_limits::rndv_limits& limits = owner_.attr().tag.rndv;
  if (handle == nullptr || count != 1 || entries == nullptr ||
      header_length > limits.max_hdr || (header_length != 0 && header == nullptr) ||
      entries[0].length > limits.max_zcopy ||
      (entries[0].length != 0 && entries[0].buffer == nullptr)) {
    return status::invalid_param;
  }
  bool ok = false;
  const status st = tag_ready(&ok);
  if (!ok) return st;
  rendezvous r{comp, nullptr};
  if (entries[0].length != 0) {
    // The sender's buffer is only read (REMOTE_READ); ibv_reg_mr takes it as void*.
    r.mr = owner_.table().reg_mr(owner_.pd(), const_cast<void*>(entries[0].buffer),
                                 entries[0].length,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    if (r.mr == nullptr) return status::io_error;
  }
  const uint32_t id = owner_.next_rndv_id();
  uint8_t rvh[rvh_size];
  write_rvh(rvh, reinterpret_cast<uintptr_t>(entries[0].buffer), r.mr ? r.mr->rkey : 0,
            static_cast<uint32_t>(entries[0].length));
  // Signaled: the SEND is off the queue by the time the peer's FIN comes back, so a flush after
  // the rendezvous completed has nothing left to wait for.
  const status posted = post_tagged_copy(IBV_TMH_RNDV, id, tag, 0, rvh, rvh_size, header,
                                         header_length, true);
  if (posted != status::ok) {
    if (r.mr != nullptr) owner_.table().dereg_mr(r.mr);
    return posted;
  }
  rendezvous_[id] = r;
  *handle = id;
  return status::in_progress;
}

void verbs_ep::release_rendezvous(uint32_t op_id) {
  const auto found = rendezvous_.find(op_id);
  if (found == rendezvous_.end()) return;
  if (found->second.mr != nullptr) owner_.table().dereg_mr(found->second.mr);
  rendezvous_.erase(found);
}

void verbs_ep::rendezvous_ended() {
  if (!rendezvous_.empty() || flush_waiters_.empty()) return;
  std::vector<tl::completion*> waiters;
  waiters.swap(flush_waiters_);
  for (tl::completion* comp : waiters) {
    const status st = conn_ != nullptr ? conn_->flush(comp) : status::connection_reset;
    if (st != status::in_progress) tl::complete(comp, st);
  }
}

status verbs_ep::tag_rndv_cancel(uint64_t handle) {
  if (!owner_.tag_matching()) return status::unsupported;
  if (handle > UINT32_MAX || rendezvous_.count(static_cast<uint32_t>(handle)) == 0) {
    return status::no_elem;
  }
  release_rendezvous(static_cast<uint32_t>(handle));
  rendezvous_ended();
  return status::ok;
}

void verbs_ep::rndv_finished(uint32_t op_id, status st) {
  const auto found = rendezvous_.find(op_id);
  if (found == rendezvous_.end()) return;
  tl::completion* comp = found->second.comp;
  release_rendezvous(op_id);
  if (comp != nullptr) tl::complete(comp, st);
  rendezvous_ended();
}

void verbs_ep::fail_rendezvous(status reason) {
  while (!rendezvous_.empty()) rndv_finished(rendezvous_.begin()->first, reason);
}

status verbs_ep::tag_rndv_request(tl::tag_t tag, const void* header, size_t header_length) {
  if (!owner_.tag_matching()) return status::unsupported;
  if (header_length > owner_.attr().tag.rndv.max_hdr ||
      (header_length != 0 && header == nullptr)) {
    return status::invalid_param;
  }
  bool ok = false;
  const status st = tag_ready(&ok);
  if (!ok) return st;
  return post_tagged_copy(IBV_TMH_EAGER, sw_rndv_app_ctx, tag, 0, header, header_length);
}

}  // namespace comm::verbs
