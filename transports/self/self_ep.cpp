#include "self/self_iface.hpp"

#include <comm/log.hpp>

#include <cstring>
#include <thread>

namespace comm::tl::self {

self_ep::self_ep(self_iface& owner, std::shared_ptr<mailbox> target, uint64_t target_id)
    : owner_(owner),
      target_(std::move(target)),
      target_id_(target_id),
      state_(std::make_shared<ep_state>()) {
  state_->home = owner.own_mailbox();
}

self_ep::~self_ep() {
  // Rendezvous still outstanding are canceled (their buffers released, receivers skip them).
  while (!state_->rndv_ops.empty()) {
    std::shared_ptr<rndv_op> op = state_->rndv_ops.back();
    cancel_rndv(*op);
    owner_.release_rndv(*state_, *op);
  }
  // Zcopy operations still in flight are dropped without calling their completions.
  state_->alive = false;
  state_->flushes.clear();
  owner_.forget(this);
}

status self_ep::reserve(size_t* index) {
  if (pending_.blocks_sends()) return status::no_resource;
  mailbox& mb = *target_;
  std::lock_guard lock(mb.mutex);
  if (mb.closed) return status::connection_reset;
  if (mb.count == mb.capacity) return status::no_resource;
  *index = (mb.tail + mb.count) % mb.capacity;
  ++mb.count;
  mb.note_activity();
  return status::ok;
}

void self_ep::commit(size_t index, slot_fields fields, size_t length, completion* comp,
                     std::shared_ptr<ep_state> origin) {
  mailbox& mb = *target_;
  bool wake = false;
  {
    std::lock_guard lock(mb.mutex);
    if (mb.closed) return;
    mailbox::slot& s = mb.slots[index];
    s.id = fields.id;
    s.kind = fields.kind;
    s.length = static_cast<uint32_t>(length);
    s.comp = comp;
    s.origin = std::move(origin);
    s.tag = fields.tag;
    s.imm = fields.imm;
    s.aux = fields.aux;
    s.rndv = std::move(fields.rndv);
    s.ready = true;
    wake = mb.take_armed();
  }
  if (wake) mb.wake();
}

status self_ep::am_short(am_id id, const void* header, size_t header_length, const void* payload,
                         size_t payload_length) {
  if (id >= am_id_count || header_length + payload_length > owner_.attr().max_short) {
    return status::invalid_param;
  }
  size_t index;
  const status st = reserve(&index);
  if (st != status::ok) return st;
  uint8_t* dest = target_->slot_data(index);
  if (header_length != 0) std::memcpy(dest, header, header_length);
  if (payload_length != 0) std::memcpy(dest + header_length, payload, payload_length);
  commit(index, {.id = id}, header_length + payload_length, nullptr, nullptr);
  return status::ok;
}

ssize_t self_ep::am_bcopy(am_id id, pack_fn pack, void* arg) {
  if (id >= am_id_count) return static_cast<ssize_t>(status::invalid_param);
  size_t index;
  const status st = reserve(&index);
  if (st != status::ok) return static_cast<ssize_t>(st);
  const size_t length = pack(target_->slot_data(index), arg);
  if (length > owner_.attr().max_bcopy) {
    COMM_LOG(error, "self", "am_bcopy: pack wrote %zu bytes, more than max_bcopy %zu", length,
             owner_.attr().max_bcopy);
    commit(index, {.id = am_id_count}, 0, nullptr, nullptr);  // an empty slot the target skips
    return static_cast<ssize_t>(status::invalid_param);
  }
  commit(index, {.id = id}, length, nullptr, nullptr);
  return static_cast<ssize_t>(length);
}

status self_ep::am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                         size_t count, completion* comp) {
  const iface_attr& attr = owner_.attr();
  if (id >= am_id_count || header_length > attr.max_hdr || count > attr.max_iov) {
    return status::invalid_param;
  }
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += entries[i].length;
  if (total > attr.max_zcopy) return status::invalid_param;
  size_t index;
  const status st = reserve(&index);
  if (st != status::ok) return st;
  uint8_t* dest = target_->slot_data(index);
  if (header_length != 0) std::memcpy(dest, header, header_length);
  size_t offset = header_length;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length != 0) std::memcpy(dest + offset, entries[i].buffer, entries[i].length);
    offset += entries[i].length;
  }
  ++state_->zcopy_issued;
  commit(index, {.id = id}, offset, comp, state_);
  return status::in_progress;
}

status self_ep::put_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                          const remote_key& key, completion* comp) {
  return rma(entries, count, remote_address, key, true);
}

status self_ep::get_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                          const remote_key& key, completion* comp) {
  return rma(entries, count, remote_address, key, false);
}

status self_ep::rkey_local_address(uint64_t remote_address, size_t length,
                                   const remote_key& key, local_bytes* out) {
  const packed_rkey* k = rkey_of(key, rkey_magic_self);
  if (k == nullptr || out == nullptr) return status::invalid_param;
  status st = k->iface_id != target_id_ ? status::invalid_param
                                        : check_self_access(*k, target_id_, remote_address, length);
  if (is_error(st) && st != status::invalid_param && target_closed()) {
    st = status::connection_reset;
  }
  if (st != status::ok) return st;
  out->data = reinterpret_cast<const void*>(remote_address);
  out->mapping = nullptr;
  return status::ok;
}

bool self_ep::target_closed() const {
  std::lock_guard lock(target_->mutex);
  return target_->closed;
}

status self_ep::rma(const iov* entries, size_t count, uint64_t remote_address,
                    const remote_key& key, bool write) {
  const packed_rkey* k = rkey_of(key, rkey_magic_self);
  size_t total = 0;
  if (k == nullptr || !sum_iov(entries, count, &total)) return status::invalid_param;
  // A key of another interface is refused before the table is consulted.
  status st = k->iface_id != target_id_ ? status::invalid_param
                                        : check_self_access(*k, target_id_, remote_address, total);
  if (is_error(st) && st != status::invalid_param && target_closed()) {
    st = status::connection_reset;
  }
  if (st == status::ok && total != 0) {
    copy_local(entries, count, reinterpret_cast<uint8_t*>(remote_address), write);
  }
  owner_.count_rma(write, total, st);
  return st;
}

// -- tag matching ---------------------------------------------------------------------------------

namespace {

/// False when an entry has a length but no buffer (the receiver reads the entries themselves).
bool buffers_present(const iov* entries, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].buffer == nullptr && entries[i].length != 0) return false;
  }
  return true;
}

}  // namespace

status self_ep::tag_eager_short(tag_t tag, const void* data, size_t length) {
  if (length > owner_.attr().tag.eager.max_short || (data == nullptr && length != 0)) {
    return status::invalid_param;
  }
  size_t index;
  const status st = reserve(&index);
  if (st != status::ok) return st;
  if (length != 0) std::memcpy(target_->slot_data(index), data, length);
  commit(index, {.kind = slot_kind::tag_eager, .tag = tag}, length, nullptr, nullptr);
  return status::ok;
}

ssize_t self_ep::tag_eager_bcopy(tag_t tag, uint64_t imm, pack_fn pack, void* arg) {
  size_t index;
  const status st = reserve(&index);
  if (st != status::ok) return static_cast<ssize_t>(st);
  const size_t length = pack(target_->slot_data(index), arg);
  if (length > owner_.attr().tag.eager.max_bcopy) {
    COMM_LOG(error, "self", "tag_eager_bcopy: pack wrote %zu bytes, more than max_bcopy %zu",
             length, owner_.attr().tag.eager.max_bcopy);
    commit(index, {.id = am_id_count}, 0, nullptr, nullptr);  // an empty slot the target skips
    return static_cast<ssize_t>(status::invalid_param);
  }
  commit(index, {.kind = slot_kind::tag_eager, .tag = tag, .imm = imm}, length, nullptr,
         nullptr);
  return static_cast<ssize_t>(length);
}

status self_ep::tag_eager_zcopy(tag_t tag, uint64_t imm, const iov* entries, size_t count,
                                completion* comp) {
  const tag_limits& limits = owner_.attr().tag;
  size_t total = 0;
  if (count > limits.eager.max_iov || !sum_iov(entries, count, &total) ||
      total > limits.eager.max_zcopy || !buffers_present(entries, count)) {
    return status::invalid_param;
  }
  size_t index;
  const status st = reserve(&index);
  if (st != status::ok) return st;
  // The receiver copies straight from these entries, which stay valid until the completion.
  if (count != 0) std::memcpy(target_->slot_data(index), entries, count * sizeof(iov));
  ++state_->zcopy_issued;
  const slot_fields fields{
      .kind = slot_kind::tag_zcopy, .tag = tag, .imm = imm, .aux = static_cast<uint32_t>(count)};
  commit(index, fields, total, comp, state_);
  return status::in_progress;
}

status self_ep::tag_rndv_zcopy(tag_t tag, const void* header, size_t header_length,
                               const iov* entries, size_t count, completion* comp,
                               uint64_t* handle) {
  const tag_limits& limits = owner_.attr().tag;
  size_t total = 0;
  if (handle == nullptr || header_length > limits.rndv.max_hdr || count > limits.rndv.max_iov ||
      (header == nullptr && header_length != 0) || !sum_iov(entries, count, &total) ||
      total > limits.rndv.max_zcopy || !buffers_present(entries, count)) {
    return status::invalid_param;
  }
  if (pending_.blocks_sends()) return status::no_resource;
  auto op = std::make_shared<rndv_op>();
  if (total != 0) {
    md& domain = *owner_.memory_domain();
    void* buffer = const_cast<void*>(entries[0].buffer);
    if (const status st = domain.mem_reg(buffer, total, &op->memh); st != status::ok) return st;
    op->address = reinterpret_cast<uintptr_t>(buffer);
    op->length = total;
    if (const status st = domain.rkey_pack(op->memh, op->rkey); st != status::ok) {
      domain.mem_dereg(op->memh);
      return st;
    }
  }
  size_t index;
  if (const status st = reserve(&index); st != status::ok) {
    if (op->memh != nullptr) owner_.memory_domain()->mem_dereg(op->memh);
    return st;
  }
  if (header_length != 0) std::memcpy(target_->slot_data(index), header, header_length);
  op->handle = next_rndv_handle_++;
  state_->rndv_ops.push_back(op);
  ++state_->zcopy_issued;
  *handle = op->handle;
  commit(index, {.kind = slot_kind::tag_rndv, .tag = tag, .rndv = std::move(op)}, header_length,
         comp, state_);
  return status::in_progress;
}

bool self_ep::cancel_rndv(rndv_op& op) {
  int seen = op.state.load(std::memory_order_acquire);
  for (;;) {
    if (seen == rndv_op::taken) {
      // The receiver is copying from the buffer right now (no user code runs meanwhile): wait.
      std::this_thread::yield();
      seen = op.state.load(std::memory_order_acquire);
      continue;
    }
    if (seen == rndv_op::done || seen == rndv_op::canceled) break;
    if (op.state.compare_exchange_weak(seen, rndv_op::canceled, std::memory_order_acq_rel)) {
      seen = rndv_op::canceled;
      op.canceled_by_sender = true;
      return false;  // nobody will hand it back
    }
  }
  op.canceled_by_sender = true;
  return seen == rndv_op::done;
}

status self_ep::tag_rndv_cancel(uint64_t handle) {
  std::shared_ptr<rndv_op> op;
  for (const std::shared_ptr<rndv_op>& candidate : state_->rndv_ops) {
    if (candidate->handle == handle) op = candidate;
  }
  if (!op) return status::no_elem;
  const bool handed_back = cancel_rndv(*op);
  owner_.release_rndv(*state_, *op);
  if (!handed_back) {
    // Counts it done (and completes waiting flushes) on our own progress, without its completion.
    state_->home->hand_back({state_, nullptr, status::ok, op});
  }
  return status::ok;
}

status self_ep::tag_rndv_request(tag_t tag, const void* header, size_t header_length) {
  if (header_length > owner_.attr().tag.rndv.max_hdr || (header == nullptr && header_length != 0)) {
    return status::invalid_param;
  }
  size_t index;
  const status st = reserve(&index);
  if (st != status::ok) return st;
  if (header_length != 0) std::memcpy(target_->slot_data(index), header, header_length);
  commit(index, {.kind = slot_kind::tag_request, .tag = tag}, header_length, nullptr, nullptr);
  return status::ok;
}

// -- pending and flush ----------------------------------------------------------------------------

status self_ep::pending_add(pending_req* req) {
  if (pending_.empty() && !pending_.dispatching()) {
    mailbox& mb = *target_;
    std::lock_guard lock(mb.mutex);
    if (mb.closed) return status::connection_reset;
    if (mb.count < mb.capacity) return status::busy;
  }
  pending_.push_back(req);
  owner_.schedule_pending(this);
  return status::ok;
}

void self_ep::pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) {
  pending_.purge(cb, arg);
}

status self_ep::flush(completion* comp) {
  if (state_->zcopy_done == state_->zcopy_issued) return status::ok;
  if (comp != nullptr) state_->flushes.emplace_back(state_->zcopy_issued, comp);
  return status::in_progress;
}

}  // namespace comm::tl::self
