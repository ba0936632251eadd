// The rendezvous module: announcements, gets or pushed data, acknowledgements, cancel and refusal.
#include "rndv.hpp"

#include "iov.hpp"
#include "protocols.hpp"
#include "send.hpp"

#include <comm/log.hpp>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>

namespace comm::detail {
namespace {

constexpr uint64_t max_rndv_message = 1ull << 40;

/// A closing endpoint waits for its fetches: tell it when one ended.
void resume_close(endpoint_impl* ep) {
  if (ep->state == endpoint_impl::phase::closing && ep->lane) ep->complete_in_order();
}

/// Encodes a Cap'n Proto message into `out` (flat array format), with no copy in between.
void encode(capnp::MessageBuilder& message, std::vector<uint8_t>& out) {
  out.resize(capnp::computeSerializedSizeInWords(message) * sizeof(capnp::word));
  kj::ArrayOutputStream stream(kj::arrayPtr(out.data(), out.size()));
  capnp::writeMessage(stream, message);
}

size_t pack_wire(void* dest, void* arg) {
  auto* bytes = static_cast<std::vector<uint8_t>*>(arg);
  std::memcpy(dest, bytes->data(), bytes->size());
  return bytes->size();
}

/// Sends a data-only header as a control message on `ep` (queued behind earlier sends).
template <class Struct, class Fill>
void send_control(endpoint_impl* ep, rndv_msg id, Fill&& fill) {
  wire::header_writer<Struct> writer;
  fill(writer.fields());
  auto bytes = static_cast<const uint8_t*>(writer.bytes());
  ep->owner.queue_control(ep, wire_id(id), std::vector<uint8_t>(bytes, bytes + writer.size()));
}

}  // namespace

rndv_protocol::rndv_protocol(worker_impl& owner, unsigned index) : protocol(owner, index) {
  receive<&rndv_protocol::on_rts>(rndv_msg::rts);
  receive<&rndv_protocol::on_ats>(rndv_msg::ats);
  receive<&rndv_protocol::on_rtr>(rndv_msg::rtr);
  receive<&rndv_protocol::on_data>(rndv_msg::data);
  receive<&rndv_protocol::on_cancel>(rndv_msg::cancel);
  receive<&rndv_protocol::on_refuse>(rndv_msg::refuse);
}

// -- sender --------------------------------------------------------------------------------------

status rndv_protocol::encode_rts(request* req, rndv_send& r, const rts_fields& fields) {
  endpoint_impl& ep = *req->ep;
  std::vector<uint8_t>& packed = packed_key_;
  packed.clear();
  if (tl::md* md = ep.lane_iface->memory_domain()) {
    if (ep.lane_attr->caps & tl::cap_get_zcopy) {
      status st = md->mem_reg(req->iov[0].buffer, r.length, &r.reg);
      if (st != status::ok) return st;
      r.md = md;
      st = md->rkey_pack(r.reg, packed);
      if (st != status::ok) return st;
    }
  }
  capnp::MallocMessageBuilder message(kj::arrayPtr(rts_scratch_, rts_scratch_words));
  auto rts = message.initRoot<wire::schema::RndvRts>();
  rts.setDstEp(ep.remote_id);
  rts.setIsAm(fields.is_am);
  rts.setIsStream(fields.is_stream);
  rts.setTag(fields.tag);
  rts.setImm((req->params.flags & request_immediate_value) ? req->params.imm : 0);
  rts.setSreqId(r.id);
  rts.setLength(r.length);
  rts.setAddress(reinterpret_cast<uintptr_t>(req->iov[0].buffer));
  rts.setAmId(fields.am_id);
  rts.setAmFlags(fields.am_flags);
  rts.setRkey(kj::arrayPtr(packed.data(), packed.size()));
  rts.setHeader(kj::arrayPtr(req->header.data(), req->header.size()));
  encode(message, req->wire);
  if (req->wire.size() > ep.lane_attr->max_bcopy) return status::exceeds_limit;
  return status::ok;
}

status rndv_protocol::push(request* req, rndv_send& r) {
  endpoint_impl& ep = *req->ep;
  const size_t header = wire::header_size<wire::schema::RndvData>();
  const size_t room = ep.lane_attr->max_bcopy - header;
  while (r.pushed < r.limit) {
    const size_t chunk = std::min(room, r.limit - r.pushed);
    struct piece {
      const void* header;
      const uint8_t* data;
      size_t chunk;
    };
    auto& h = hdr_data_.fields();
    h.setDstEp(ep.remote_id);
    h.setRreqId(r.peer_id);
    h.setOffset(r.pushed);
    piece p{hdr_data_.bytes(), static_cast<const uint8_t*>(req->iov[0].buffer) + r.pushed, chunk};
    ssize_t n = ep.lane->am_bcopy(
        wire_id(rndv_msg::data),
        [](void* dest, void* arg) -> size_t {
          auto* pc = static_cast<piece*>(arg);
          const size_t hl = wire::header_size<wire::schema::RndvData>();
          std::memcpy(dest, pc->header, hl);
          std::memcpy(static_cast<uint8_t*>(dest) + hl, pc->data, pc->chunk);
          return hl + pc->chunk;
        },
        &p);
    if (n < 0) return static_cast<status>(n);
    r.pushed += chunk;
  }
  ++ep.counters_.messages_sent;
  ep.counters_.bytes_sent += r.limit;
  release_send(r);
  req->st = status::ok;
  return status::ok;
}

status rndv_protocol::send(request* req, rndv_send& r, size_t length, const rts_fields& fields) {
  if (r.phase == rndv_phase::pushing) return push(req, r);
  if (req->wire.empty()) {
    r.req = req;
    r.length = length;
    r.id = next_id_++;
    req->holds = true;
    status st = encode_rts(req, r, fields);
    if (st != status::ok) {
      release_send(r);
      return st;
    }
    sends_[r.id] = &r;
  }
  ssize_t n = req->ep->lane->am_bcopy(wire_id(rndv_msg::rts), pack_wire, &req->wire);
  if (n < 0) return static_cast<status>(n);
  req->has_started = true;
  r.phase = rndv_phase::announced;
  return status::ok;  // issued; the request completes on RndvAts or after pushing the data
}

void rndv_protocol::enter_offloaded(request* req, rndv_send& r, size_t length) {
  r.req = req;
  r.length = length;
  r.id = next_id_++;
  req->holds = true;
  sends_[r.id] = &r;
}

void rndv_protocol::release_send(rndv_send& r) {
  if (r.tl_handle != 0) {
    // The transport still holds the announcement (its receiver took it unmatched): withdraw it.
    // An endpoint whose lane is gone dropped it already.
    endpoint_impl* ep = r.req != nullptr ? r.req->ep : nullptr;
    if (ep != nullptr && ep->lane) (void)ep->lane->tag_rndv_cancel(r.tl_handle);
    r.tl_handle = 0;
  }
  if (r.id != 0) {
    sends_.erase(r.id);
    r.id = 0;
  }
  if (r.reg != nullptr) {
    r.md->mem_dereg(r.reg);
    r.reg = nullptr;
  }
}

status rndv_protocol::cancel_send(request* req, rndv_send& r, cancel_mode mode) {
  endpoint_impl* ep = req->ep;
  if (r.cancelled && mode == cancel_mode::report) return status::ok;  // answer awaited already
  if (!r.cancelled) {
    const uint64_t sreq = r.id;
    const uint32_t remote = ep->remote_id;
    send_control<wire::schema::RndvCancel>(ep, rndv_msg::cancel, [&](auto h) {
      h.setDstEp(remote);
      h.setSreqId(sreq);
    });
    r.cancelled = true;
  }
  if (mode == cancel_mode::report) return status::ok;  // completes once the peer answered
  // Forced: the caller may reuse the buffer at once. Deregistering makes a fetch that races with
  // the cancel fail at our device instead of reading that memory; the peer's answer is ignored.
  release_send(r);
  req->params.send_cb = nullptr;
  req->released = true;
  req->st = status::canceled;
  ep->complete_in_order();
  return status::ok;
}

rndv_send* rndv_protocol::answered_send(endpoint_impl* ep, uint64_t sreq) {
  auto it = sends_.find(sreq);
  if (it == sends_.end()) return nullptr;  // cancelled by force, or ended with its endpoint
  if (it->second->req->ep != ep) {
    w.protocol_error(ep, "rendezvous answer for another endpoint's send");
    return nullptr;
  }
  // Only an announcement is answered: a send whose announcement waits in the pending queue, or
  // whose data is being pushed, is still there and must not complete under it.
  if (it->second->phase != rndv_phase::announced) {
    w.protocol_error(ep, "rendezvous answer for a send that is not announced");
    return nullptr;
  }
  return it->second;
}

void rndv_protocol::end_send(rndv_send& r, status st) {
  request* req = r.req;
  release_send(r);
  req->st = st;
  req->ep->complete_in_order();
}

void rndv_protocol::on_ats(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvAts>(data, length);
  if (!h) return w.protocol_error(nullptr, "truncated rendezvous acknowledgement");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "ack for unknown endpoint");
  if (ep == nullptr) return;
  rndv_send* r = answered_send(ep, h->getSreqId());
  if (r == nullptr) return;
  const status st = static_cast<status>(h->getStatus());
  if (r->cancelled) return end_send(*r, status::canceled);
  if (!is_error(st)) {
    ++ep->counters_.messages_sent;
    ep->counters_.bytes_sent += r->length;
  }
  end_send(*r, is_error(st) ? st : status::ok);
}

void rndv_protocol::on_rtr(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvRtr>(data, length);
  if (!h) return w.protocol_error(nullptr, "truncated rendezvous request");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "rendezvous request for unknown endpoint");
  if (ep == nullptr) return;
  auto it = sends_.find(h->getSreqId());
  rndv_send* found = it == sends_.end() ? nullptr : it->second;
  if (found != nullptr && found->req->ep != ep) {
    return w.protocol_error(ep, "rendezvous request for another endpoint's send");
  }
  if (found == nullptr || found->cancelled) {
    // Cancelled (or never ours): tell the receiver, which would otherwise wait for data. A
    // cancelled send ends here: the receiver asked instead of reading, and reads nothing now.
    const uint32_t remote = ep->remote_id;
    const uint64_t rreq = h->getRreqId();
    send_control<wire::schema::RndvRefuse>(ep, rndv_msg::refuse, [&](auto r) {
      r.setDstEp(remote);
      r.setRreqId(rreq);
      r.setStatus(static_cast<int16_t>(status::canceled));
    });
    if (found != nullptr) end_send(*found, status::canceled);
    return;
  }
  rndv_send& r = *found;
  if (r.phase != rndv_phase::announced || h->getLength() > r.length) {
    return w.protocol_error(ep, "rendezvous request out of order or too long");
  }
  r.phase = rndv_phase::pushing;
  r.peer_id = h->getRreqId();
  r.limit = h->getLength();
  r.pushed = 0;
  endpoint_impl* sender = r.req->ep;
  const bool idle = sender->pending_head == nullptr;
  sender->push_pending(r.req);
  if (idle && !sender->dispatch_pending()) sender->wait_for_resources();
}

// -- receiver ------------------------------------------------------------------------------------

void rndv_protocol::on_rts(const uint8_t* data, size_t length) {
  uint32_t dst = 0;
  rts_fields fields;
  uint64_t imm = 0;
  rndv_announcement announced;
  announced.rkey.swap(rts_rkey_);
  std::vector<uint8_t> header;
  const bool valid = wire::read_checked_message<wire::schema::RndvRts>(
      data, length, [&](wire::schema::RndvRts::Reader rts) {
        dst = rts.getDstEp();
        fields.is_am = rts.getIsAm();
        fields.is_stream = rts.getIsStream();
        fields.tag = rts.getTag();
        imm = rts.getImm();
        announced.sreq = rts.getSreqId();
        announced.length = rts.getLength();
        announced.address = rts.getAddress();
        fields.am_id = rts.getAmId();
        fields.am_flags = rts.getAmFlags();
        auto key = rts.getRkey();
        announced.rkey.assign(key.begin(), key.end());
        auto user = rts.getHeader();
        header.assign(user.begin(), user.end());
      });
  if (!valid) {
    return w.protocol_error(nullptr, "rendezvous announcement is not a valid message");
  }
  endpoint_impl* ep = w.receiving_ep(dst, "rendezvous for an unknown endpoint");
  if (ep == nullptr) return;
  if (announced.length > max_rndv_message) {
    return w.protocol_error(ep, "rendezvous length beyond any buffer");
  }
  ++ep->counters_.messages_received;
  if (fields.is_stream) {
    module_of<stream_protocol>(w).on_announcement(*ep, std::move(announced));
  } else if (fields.is_am) {
    module_of<am_protocol>(w).on_announcement(*ep, fields.am_id, fields.am_flags,
                                              std::move(header), std::move(announced));
  } else {
    module_of<tag_protocol>(w).on_announcement(*ep, fields.tag, imm, std::move(announced));
  }
  // The key's bytes, unless the module kept them (an unexpected announcement), serve the next.
  if (announced.rkey.capacity() > rts_rkey_.capacity()) rts_rkey_.swap(announced.rkey);
}

void rndv_protocol::start_fetch(request* req, rndv_fetch& f, endpoint_impl* ep, uint64_t sreq,
                                uint64_t address, size_t take, const uint8_t* rkey,
                                size_t rkey_length, void (*done)(request*, status)) {
  f.req = req;
  f.ep = ep;
  f.done = done;
  f.sreq = sreq;
  f.address = address;
  f.take = take;
  f.comp = tl::completion{on_fetched, 1, status::ok};
  req->ep = ep;
  // After our close notice the sender has forgotten the endpoint: nothing is fetched.
  if (ep->close_notice_sent && req->st == status::in_progress) req->st = status::not_connected;
  if (req->st != status::in_progress || take == 0) return finish_fetch(f);
  const bool can_get = (ep->lane_attr->caps & tl::cap_get_zcopy) && rkey_length != 0 &&
                       ep->lane_iface->memory_domain() != nullptr;
  if (!can_get) {
    // Software rendezvous: ask the sender to push `take` bytes.
    f.id = next_id_++;
    recvs_[f.id] = &f;
    req->holds = true;
    f.comp.count = 0;
    const uint32_t remote = ep->remote_id;
    const uint64_t rreq = f.id;
    send_control<wire::schema::RndvRtr>(ep, rndv_msg::rtr, [&](auto h) {
      h.setDstEp(remote);
      h.setSreqId(sreq);
      h.setRreqId(rreq);
      h.setLength(take);
    });
    return;
  }
  tl::md* md = ep->lane_iface->memory_domain();
  status st = md->rkey_unpack(rkey, rkey_length, &f.remote);
  if (st != status::ok) {
    req->st = st;
    return finish_fetch(f);
  }
  f.remote_valid = true;
  req->holds = true;
  req->issuing = true;
  join_getting(f);
  size_t offset = 0;
  const size_t max_get = std::max<size_t>(ep->lane_attr->max_get_zcopy, 1);
  while (offset < take) {
    size_t chunk = std::min(max_get, take - offset);
    tl::iov entries[16];
    size_t covered = chunk;
    const size_t count = iov_slice(req->iov, offset, &covered, entries,
                                   std::min<size_t>(16, ep->lane_attr->max_iov));
    ++f.comp.count;
    st = ep->lane->get_zcopy(entries, count, address + offset, f.remote, &f.comp);
    if (st != status::in_progress) --f.comp.count;
    if (is_error(st)) {
      req->st = st;
      break;
    }
    offset += covered;
  }
  req->issuing = false;
  tl::complete(&f.comp, status::ok);  // drops the issuing guard; may finish the fetch
}

void rndv_protocol::join_getting(rndv_fetch& f) {
  f.getting_at = static_cast<uint32_t>(getting_.size());  // start_fetch is the only caller
  getting_.push_back(&f);
}

void rndv_protocol::leave_getting(rndv_fetch& f) {
  if (f.getting_at == rndv_fetch::not_getting) return;
  rndv_fetch* last = getting_.back();
  getting_[f.getting_at] = last;
  last->getting_at = f.getting_at;
  getting_.pop_back();
  f.getting_at = rndv_fetch::not_getting;
}

void rndv_protocol::on_fetched(tl::completion* comp) {
  auto* f = reinterpret_cast<rndv_fetch*>(reinterpret_cast<char*>(comp) -
                                          offsetof(rndv_fetch, comp));
  request* req = f->req;
  if (is_error(comp->result) && req->st == status::in_progress) req->st = comp->result;
  if (!req->issuing) module_of<rndv_protocol>(*req->owner).finish_fetch(*f);
}

void rndv_protocol::release_fetch(rndv_fetch& f) {
  if (f.id != 0) {
    recvs_.erase(f.id);
    f.id = 0;
  }
  leave_getting(f);
  if (f.remote_valid) {
    f.ep->lane_iface->memory_domain()->rkey_release(&f.remote);
    f.remote_valid = false;
  }
}

void rndv_protocol::acknowledge(endpoint_impl* ep, uint64_t sreq, status outcome) {
  auto& h = hdr_ats_.fields();
  h.setDstEp(ep->remote_id);
  h.setSreqId(sreq);
  h.setStatus(static_cast<int16_t>(outcome));
  // Counted as the queued control messages are: not at all.
  w.send_control(ep, wire_id(rndv_msg::ats), hdr_ats_.bytes(), hdr_ats_.size());
}

void rndv_protocol::finish_fetch(rndv_fetch& f) {
  endpoint_impl* ep = f.ep;
  request* req = f.req;
  leave_getting(f);
  if (f.remote_valid) {
    ep->lane_iface->memory_domain()->rkey_release(&f.remote);
    f.remote_valid = false;
  }
  if (req->st == status::in_progress && f.comp.result != status::ok) req->st = f.comp.result;
  const status outcome = req->st == status::in_progress ? status::ok : req->st;
  if (ep->state != endpoint_impl::phase::failed) {
    acknowledge(ep, f.sreq, outcome);
  }
  ep->counters_.bytes_received += f.take;
  f.done(req, outcome);
  resume_close(ep);
}

void rndv_protocol::on_data(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::RndvData>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated rendezvous data header");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "rendezvous data for an unknown endpoint");
  if (ep == nullptr) return;
  auto it = recvs_.find(h->getRreqId());
  if (it == recvs_.end() || it->second->ep != ep) {
    return w.protocol_error(ep, "rendezvous data for no receive");
  }
  rndv_fetch& f = *it->second;
  const size_t payload = length - used;
  if (h->getOffset() != f.pushed || payload > f.take - f.pushed) {
    return w.protocol_error(ep, "rendezvous data out of sequence");
  }
  iov_scatter(f.req->iov, f.pushed, data + used, payload);
  f.pushed += payload;
  if (f.pushed < f.take) return;
  recvs_.erase(it);
  f.id = 0;
  // The sender completes once it pushed everything; no acknowledgement is needed.
  ep->counters_.bytes_received += f.take;
  f.done(f.req, status::ok);
  resume_close(ep);
}

void rndv_protocol::on_cancel(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvCancel>(data, length);
  if (!h) return w.protocol_error(nullptr, "truncated rendezvous cancel");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "rendezvous cancel for unknown endpoint");
  if (ep == nullptr) return;
  // The announcement waits as an unexpected tagged message or as a deferred AM. Dropped, it is
  // answered here; matched, the fetch answers (RndvAts) or the receive asked (RndvRtr).
  const uint64_t sreq = h->getSreqId();
  const bool dropped = module_of<tag_protocol>(w).drop_announcement(*ep, sreq) ||
                       module_of<am_protocol>(w).drop_announcement(*ep, sreq);
  if (!dropped) return;
  acknowledge(ep, sreq, status::canceled);
}

void rndv_protocol::on_refuse(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvRefuse>(data, length);
  if (!h) return w.protocol_error(nullptr, "truncated rendezvous refusal");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "rendezvous refusal for unknown endpoint");
  if (ep == nullptr) return;
  auto it = recvs_.find(h->getRreqId());
  if (it == recvs_.end() || it->second->ep != ep) {
    return w.protocol_error(ep, "rendezvous refusal for no receive");
  }
  rndv_fetch& f = *it->second;
  recvs_.erase(it);
  f.id = 0;
  const status st = static_cast<status>(h->getStatus());
  f.done(f.req, is_error(st) ? st : status::canceled);
  resume_close(ep);
}

// -- hooks ---------------------------------------------------------------------------------------

void rndv_protocol::endpoint_failed(endpoint_impl& ep, status reason) {
  // Receives that wait for data the peer will never push.
  std::vector<rndv_fetch*> starved;
  for (auto& [id, f] : recvs_) {
    if (f->ep == &ep) starved.push_back(f);
  }
  for (rndv_fetch* f : starved) {
    recvs_.erase(f->id);
    f->id = 0;
    f->done(f->req, reason);
  }
  // A send through the transport's tag matching waits for the transport, which may never finish
  // it now: withdrawn, it ends with the endpoint.
  for (auto& [id, r] : sends_) {
    if (r->req->ep != &ep || r->tl_handle == 0) continue;
    if (ep.lane) (void)ep.lane->tag_rndv_cancel(r->tl_handle);
    r->tl_handle = 0;
    r->req->tl_in_flight = 0;
    if (r->req->st == status::in_progress) r->req->st = reason;
  }
  // A send the user cancelled ends as cancelled, whatever ended the endpoint.
  for (auto& [id, r] : sends_) {
    if (r->req->ep == &ep && r->cancelled && r->req->st != status::in_progress) {
      r->req->st = status::canceled;
    }
  }
}

void rndv_protocol::endpoint_deleted(endpoint_impl& ep) {
  // The lane went first, and with it the transport's operations: whatever still waits on the
  // endpoint (a get whose completion the transport dropped, data the peer never pushed) ends.
  std::vector<rndv_fetch*> orphans;
  for (rndv_fetch* f : getting_) {
    if (f->ep == &ep) orphans.push_back(f);
  }
  for (auto& [id, f] : recvs_) {
    if (f->ep == &ep) orphans.push_back(f);
  }
  for (rndv_fetch* f : orphans) {
    release_fetch(*f);
    f->done(f->req, status::canceled);
  }
}

bool rndv_protocol::busy_on(const endpoint_impl& ep) const {
  for (const rndv_fetch* f : getting_) {
    if (f->ep == &ep) return true;
  }
  for (const auto& [id, f] : recvs_) {
    if (f->ep == &ep) return true;
  }
  return false;
}

void rndv_protocol::info(std::ostream& out) const {
  out << "rendezvous: sends awaiting the peer " << sends_.size() << ", receives awaiting data "
      << recvs_.size() << '\n';
}

}  // namespace comm::detail
