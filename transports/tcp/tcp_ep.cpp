#include "tcp/tcp_ep.hpp"

#include "tcp/tcp_conn.hpp"
#include "tcp/tcp_iface.hpp"

#include <comm/log.hpp>

#include <cstring>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";

}  // namespace

tcp_ep::tcp_ep(tcp_iface& owner, tcp_conn& conn, const ip_address& peer_ip,
               const iface_addr& peer)
    : owner_(owner),
      conn_(&conn),
      zring_(new zcopy_slot[max_unacked_zcopy]),
      peer_ip_(peer_ip),
      peer_(peer) {
  conn_->attach(this);
}

tcp_ep::~tcp_ep() {
  // Zcopy operations still in flight are dropped without calling their completions; what the
  // connection accepted from us still goes out (it copies a half-written zcopy frame of ours).
  owner_.forget(this);
  if (conn_ != nullptr) conn_->detach(this);
}

// -- sends ----------------------------------------------------------------------------------------

status tcp_ep::refuse_no_resource() {
  ++owner_.counters().no_resource;
  return status::no_resource;
}

status tcp_ep::am_short(am_id id, const void* header, size_t header_length, const void* payload,
                        size_t payload_length) {
  const size_t length = header_length + payload_length;
  if (length > max_short || id >= am_id_count) [[unlikely]] return status::invalid_param;
  if (broken()) [[unlikely]] return failure_;
  if (pending_.blocks_sends()) [[unlikely]] return refuse_no_resource();
  uint8_t* dest = conn_->reserve_message(frame_size(length));
  if (dest == nullptr) [[unlikely]] return refuse_no_resource();
  const size_t offset = conn_->put_header(id, length, false, dest);
  if (header_length != 0) std::memcpy(dest + offset, header, header_length);
  if (payload_length != 0) std::memcpy(dest + offset + header_length, payload, payload_length);
  conn_->commit_message(dest, length);
  return status::ok;
}

ssize_t tcp_ep::am_bcopy(am_id id, pack_fn pack, void* arg) {
  if (id >= am_id_count) [[unlikely]] return static_cast<ssize_t>(status::invalid_param);
  if (broken()) [[unlikely]] return static_cast<ssize_t>(failure_);
  if (pending_.blocks_sends()) [[unlikely]] return static_cast<ssize_t>(refuse_no_resource());
  uint8_t* dest = conn_->reserve_message(frame_size(max_bcopy));
  if (dest == nullptr) return static_cast<ssize_t>(refuse_no_resource());
  const size_t length = pack(dest + frame_header_size, arg);
  if (length > max_bcopy) [[unlikely]] {
    COMM_LOG(error, log_name, "am_bcopy: pack wrote %zu bytes, more than max_bcopy %zu", length,
             max_bcopy);
    return static_cast<ssize_t>(status::invalid_param);
  }
  conn_->put_header(id, length, false, dest);
  conn_->commit_message(dest, length);
  return static_cast<ssize_t>(length);
}

status tcp_ep::am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                        size_t count, completion* comp) {
  if (id >= am_id_count || header_length > max_hdr || count > max_iov) [[unlikely]] {
    return status::invalid_param;
  }
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length > max_zcopy - total) return status::invalid_param;
    total += entries[i].length;
  }
  if (broken()) [[unlikely]] return failure_;
  if (pending_.blocks_sends() || zissued_ - zacked_ >= max_unacked_zcopy || !conn_->zcopy_room()) {
    return refuse_no_resource();
  }
  // Even when the write fails at once (the endpoint is then broken), fail() completes it.
  const uint64_t frame = conn_->queue_zcopy(this, id, header, header_length, entries, count, total);
  zring_[zissued_ & (max_unacked_zcopy - 1)] = {frame, comp};
  ++zissued_;
  return status::in_progress;  // completed by the peer's ack, or with the failure
}

// -- acknowledgements, pending, flush -------------------------------------------------------------

unsigned tcp_ep::complete_delivered(uint64_t delivered) {
  unsigned completed = 0;
  while (zacked_ < zissued_) {
    const zcopy_slot slot = zring_[zacked_ & (max_unacked_zcopy - 1)];
    if (slot.frame > delivered) break;
    ++zacked_;
    ++completed;
    if (slot.comp != nullptr) complete(slot.comp, status::ok);  // may send on this endpoint
  }
  return completed;
}

bool tcp_ep::has_room() const { return conn_ != nullptr && conn_->has_room(); }

bool tcp_ep::idle() const {
  return conn_ != nullptr && conn_->all_written() && zacked_ == zissued_;
}

bool tcp_ep::parked_and_ready() const { return !pending_.empty() && !broken() && has_room(); }

unsigned tcp_ep::after_progress() {
  unsigned events = 0;
  if (!flushes_.empty() && idle()) {
    std::vector<completion*> done;
    done.swap(flushes_);
    for (completion* comp : done) complete(comp, status::ok);
    events += static_cast<unsigned>(done.size());
  }
  if (!pending_.empty() && !broken() && has_room()) {
    events += pending_.dispatch();
    // Requests that re-parked during the dispatch with room left get another turn next time.
    if (!pending_.empty() && !broken() && has_room()) owner_.redispatch(this);
  }
  return events;
}

status tcp_ep::pending_add(pending_req* req) {
  if (broken()) return failure_;
  if (pending_.empty() && !pending_.dispatching() && has_room()) return status::busy;
  pending_.push_back(req);
  return status::ok;
}

void tcp_ep::pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) {
  pending_.purge(cb, arg);
}

status tcp_ep::flush(completion* comp) {
  if (broken()) return failure_;
  if (idle()) return status::ok;
  if (comp != nullptr) flushes_.push_back(comp);
  return status::in_progress;
}

// -- failure --------------------------------------------------------------------------------------

void tcp_ep::conn_failed(status reason) {
  if (failure_ == status::ok) failure_ = reason;
  conn_ = nullptr;
  owner_.notice_failure(this);
}

void tcp_ep::fail(status reason) {
  while (zacked_ < zissued_) {
    completion* comp = zring_[zacked_ & (max_unacked_zcopy - 1)].comp;
    ++zacked_;
    if (comp != nullptr) complete(comp, reason);
  }
  std::vector<completion*> flushes;
  flushes.swap(flushes_);
  for (completion* comp : flushes) complete(comp, reason);
}

std::string tcp_ep::describe() const {
  std::string text = address_text(peer_ip_, peer_.port);
  if (broken()) return text + " failed (" + to_string(failure_) + ")";
  switch (conn_->state()) {
    case tcp_conn::phase::connecting:
      text += " connecting";
      break;
    case tcp_conn::phase::handshake:
      text += " handshake";
      break;
    case tcp_conn::phase::awaiting:
      text += " awaiting the peer's connection";
      break;
    default:
      text += " connected";
      break;
  }
  if (zissued_ != zacked_) {
    text += ", " + std::to_string(zissued_ - zacked_) + " zcopy unacknowledged";
  }
  if (!pending_.empty()) text += ", requests parked";
  return text;
}

}  // namespace comm::tl::tcp
