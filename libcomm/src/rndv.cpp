// Rendezvous: large tagged messages and active messages move with one copy (zero on the sender).
//
// The sender registers its buffer and announces it (RndvRts: tag or AM id, length, address, packed
// key). The matched receiver reads the data straight into its buffer with the transport's
// get_zcopy (iov filled in order) and acknowledges (RndvAts); the sender's request completes on
// that acknowledgement. Where the lane has no get, the receiver asks (RndvRtr) and the sender
// pushes RndvData fragments (software rendezvous). An announcement that arrives before its receive
// waits in the unexpected queue with its header; nothing is fetched before a match.
#include "iov.hpp"
#include "worker_impl.hpp"

#include <comm/log.hpp>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>

namespace comm::detail {
namespace {

constexpr uint64_t max_rndv_message = 1ull << 40;

kj::Array<capnp::word> aligned_copy(const uint8_t* data, size_t length) {
  auto words = kj::heapArray<capnp::word>((length + 7) / 8);
  std::memset(words.begin(), 0, words.size() * sizeof(capnp::word));
  std::memcpy(words.begin(), data, length);
  return words;
}

/// Encodes a Cap'n Proto message into `out`.
void encode(capnp::MessageBuilder& message, std::vector<uint8_t>& out) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  out.assign(bytes.begin(), bytes.end());
}

size_t pack_wire(void* dest, void* arg) {
  auto* bytes = static_cast<std::vector<uint8_t>*>(arg);
  std::memcpy(dest, bytes->data(), bytes->size());
  return bytes->size();
}

/// Sends a data-only header as a control message on `ep` (queued behind earlier sends).
template <class Struct, class Fill>
void send_control(endpoint_impl* ep, proto_id id, Fill&& fill) {
  wire::header_writer<Struct> writer;
  fill(writer.fields());
  auto bytes = static_cast<const uint8_t*>(writer.bytes());
  ep->owner.queue_control(ep, id, std::vector<uint8_t>(bytes, bytes + writer.size()));
}

request* request_of(tag_expected* e) {
  return request::of_expected(e);
}

/// Builds the announcement of a rendezvous send into req->wire.
status encode_rts(request* req) {
  endpoint_impl& ep = *req->ep;
  std::vector<uint8_t> packed;
  if (tl::md* md = ep.lane_iface->memory_domain()) {
    if (ep.lane_attr->caps & tl::cap_get_zcopy) {
      status st = md->mem_reg(req->iov[0].buffer, req->length, &req->rndv_reg);
      if (st != status::ok) return st;
      req->rndv_md = md;
      st = md->rkey_pack(req->rndv_reg, packed);
      if (st != status::ok) return st;
    }
  }
  capnp::MallocMessageBuilder message;
  auto rts = message.initRoot<wire::schema::RndvRts>();
  rts.setDstEp(ep.remote_id);
  rts.setIsAm(req->type == request::kind::am_send);
  rts.setTag(req->tag);
  rts.setImm((req->params.flags & request_immediate_value) ? req->params.imm : 0);
  rts.setSreqId(req->rndv_id);
  rts.setLength(req->length);
  rts.setAddress(reinterpret_cast<uintptr_t>(req->iov[0].buffer));
  rts.setAmId(req->am_id);
  rts.setAmFlags(req->am_flags);
  rts.setRkey(kj::arrayPtr(packed.data(), packed.size()));
  rts.setHeader(kj::arrayPtr(req->control.data(), req->control.size()));
  encode(message, req->wire);
  if (req->wire.size() > ep.lane_attr->max_bcopy) return status::exceeds_limit;
  return status::ok;
}

/// Pushes the next fragments of a software rendezvous.
status push_data(request* req) {
  endpoint_impl& ep = *req->ep;
  worker_impl& w = ep.owner;
  const size_t header = wire::header_size<wire::schema::RndvData>();
  const size_t room = ep.lane_attr->max_bcopy - header;
  while (req->offset < req->rndv_limit) {
    const size_t chunk = std::min(room, req->rndv_limit - req->offset);
    struct piece {
      request* req;
      const void* header;
      size_t chunk;
    };
    auto& h = w.hdr_rndv_data.fields();
    h.setDstEp(ep.remote_id);
    h.setRreqId(req->rndv_peer_id);
    h.setOffset(req->offset);
    piece p{req, w.hdr_rndv_data.bytes(), chunk};
    ssize_t n = ep.lane->am_bcopy(
        static_cast<tl::am_id>(proto_id::rndv_data),
        [](void* dest, void* arg) -> size_t {
          auto* pc = static_cast<piece*>(arg);
          const size_t hl = wire::header_size<wire::schema::RndvData>();
          std::memcpy(dest, pc->header, hl);
          std::memcpy(static_cast<uint8_t*>(dest) + hl,
                      static_cast<const uint8_t*>(pc->req->iov[0].buffer) + pc->req->offset,
                      pc->chunk);
          return hl + pc->chunk;
        },
        &p);
    if (n < 0) return static_cast<status>(n);
    req->offset += chunk;
  }
  ++ep.counters_.messages_sent;
  ep.counters_.bytes_sent += req->rndv_limit;
  w.release_rndv_send(req);
  req->st = status::ok;
  return status::ok;
}

}  // namespace

// -- sender --------------------------------------------------------------------------------------

status send_rndv(request* req) {
  worker_impl& w = req->ep->owner;
  if (req->phase == request::rndv_phase::pushing) return push_data(req);
  if (req->wire.empty()) {
    req->rndv_id = w.next_rndv_id++;
    status st = encode_rts(req);
    if (st != status::ok) {
      w.release_rndv_send(req);
      return st;
    }
    w.rndv_sends[req->rndv_id] = req;
  }
  ssize_t n = req->ep->lane->am_bcopy(static_cast<tl::am_id>(proto_id::rndv_rts), pack_wire,
                                      &req->wire);
  if (n < 0) return static_cast<status>(n);
  req->has_started = true;
  req->phase = request::rndv_phase::announced;
  return status::ok;  // issued; the request completes on RndvAts or after pushing the data
}

void worker_impl::release_rndv_send(request* req) {
  if (req->rndv_id != 0) {
    rndv_sends.erase(req->rndv_id);
    req->rndv_id = 0;
  }
  if (req->rndv_reg != nullptr) {
    req->rndv_md->mem_dereg(req->rndv_reg);
    req->rndv_reg = nullptr;
  }
}

void worker_impl::on_rndv_ats(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvAts>(data, length);
  if (!h) return protocol_error(nullptr, "truncated rendezvous acknowledgement");
  if (receiving_ep(h->getDstEp(), "ack for unknown endpoint") == nullptr) return;
  auto it = rndv_sends.find(h->getSreqId());
  if (it == rndv_sends.end()) return;  // cancelled meanwhile
  request* req = it->second;
  release_rndv_send(req);
  const status st = static_cast<status>(h->getStatus());
  if (!is_error(st)) {
    ++req->ep->counters_.messages_sent;
    req->ep->counters_.bytes_sent += req->length;
  }
  req->st = is_error(st) ? st : status::ok;
  req->ep->complete_in_order();
}

void worker_impl::on_rndv_rtr(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvRtr>(data, length);
  if (!h) return protocol_error(nullptr, "truncated rendezvous request");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "rendezvous request for unknown endpoint");
  if (ep == nullptr) return;
  auto it = rndv_sends.find(h->getSreqId());
  if (it == rndv_sends.end()) {
    // Cancelled (or never ours): tell the receiver, which would otherwise wait for data.
    const uint32_t remote = ep->remote_id;
    const uint64_t rreq = h->getRreqId();
    send_control<wire::schema::RndvRefuse>(ep, proto_id::rndv_refuse, [&](auto r) {
      r.setDstEp(remote);
      r.setRreqId(rreq);
      r.setStatus(static_cast<int16_t>(status::canceled));
    });
    return;
  }
  request* req = it->second;
  if (req->phase != request::rndv_phase::announced || h->getLength() > req->length) {
    return protocol_error(ep, "rendezvous request out of order or too long");
  }
  req->phase = request::rndv_phase::pushing;
  req->rndv_peer_id = h->getRreqId();
  req->rndv_limit = h->getLength();
  req->offset = 0;
  endpoint_impl* sender = req->ep;
  const bool idle = sender->pending_head == nullptr;
  sender->push_pending(req);
  if (idle && !sender->dispatch_pending()) sender->wait_for_resources();
}

// -- receiver ------------------------------------------------------------------------------------

void worker_impl::on_rndv_rts(const uint8_t* data, size_t length) {
  auto words = aligned_copy(data, length);
  uint32_t dst = 0;
  bool is_am = false;
  uint64_t tag = 0, imm = 0;
  deferred_am rts_fields;  // what an announcement of either kind carries
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(words, wire::checked_reader_options());
    auto rts = reader.getRoot<wire::schema::RndvRts>();
    dst = rts.getDstEp();
    is_am = rts.getIsAm();
    tag = rts.getTag();
    imm = rts.getImm();
    rts_fields.sreq = rts.getSreqId();
    rts_fields.length = rts.getLength();
    rts_fields.address = rts.getAddress();
    rts_fields.am_id = rts.getAmId();
    rts_fields.am_flags = rts.getAmFlags();
    auto key = rts.getRkey();
    rts_fields.rkey.assign(key.begin(), key.end());
    auto user = rts.getHeader();
    rts_fields.header.assign(user.begin(), user.end());
  });
  if (failure != nullptr || length % 8 != 0) {
    return protocol_error(nullptr, "rendezvous announcement is not a valid message");
  }
  endpoint_impl* ep = receiving_ep(dst, "rendezvous for an unknown endpoint");
  if (ep == nullptr) return;
  if (rts_fields.length > max_rndv_message) {
    return protocol_error(ep, "rendezvous length beyond any buffer");
  }
  ++ep->counters_.messages_received;
  if (is_am) return on_rndv_am(ep, std::move(rts_fields));
  std::vector<uint8_t>& rkey = rts_fields.rkey;
  tag_expected* e = matcher.match_expected(tag);
  if (e != nullptr) {
    request* req = request_of(e);
    req->matched = true;
    req->info.sender_tag = tag;
    req->info.imm = imm;
    start_fetch(req, ep, rts_fields.sreq, rts_fields.address, rts_fields.length, rkey.data(),
                rkey.size());
    return;
  }
  unexpected_msg* msg = new_unexpected(ep, tag, imm, 0, rkey.size());
  if (msg == nullptr) return;  // a limit failed the endpoint, or no memory (logged)
  msg->rndv = true;
  msg->ep = ep;
  msg->sreq = rts_fields.sreq;
  msg->address = rts_fields.address;
  msg->length = rts_fields.length;
  msg->rkey = std::move(rkey);
  matcher.add_unexpected(msg);
}

void worker_impl::fetch_am(endpoint_impl* ep, deferred_am& am) {
  const am_handler* handler = find_am_handler(am.am_id);
  uint8_t* buffer = handler != nullptr ? take_large(am.length) : nullptr;
  request* req = alloc_request(request::kind::tag_recv, request_params{});
  req->am_rndv = true;
  req->am_id = am.am_id;
  req->am_flags = am.am_flags;
  req->control = std::move(am.header);
  req->iov.assign(1, iov_entry{buffer, buffer != nullptr ? am.length : 0});
  req->length = buffer != nullptr ? am.length : 0;
  req->matched = true;
  if (buffer == nullptr) {
    ++ep->counters_.errors;
    COMM_LOG(error, "rndv", "%s: cannot take rendezvous AM %u (%s); refused",
             params.name.c_str(), am.am_id, handler == nullptr ? "no handler" : "no memory");
    req->st = status::no_elem;
  } else {
    // Counted until the handler has it (on_rndv_am checked that it fits).
    ep->am_rx_bytes += req->length;
    am_rx_bytes += req->length;
  }
  start_fetch(req, ep, am.sreq, am.address, am.length, am.rkey.data(), am.rkey.size());
}

void worker_impl::start_fetch(request* req, endpoint_impl* ep, uint64_t sreq, uint64_t address,
                              size_t length, const uint8_t* rkey, size_t rkey_length) {
  req->rndv_ep = ep;
  req->rndv_peer_id = sreq;
  req->remote_address = address;
  req->received = length;
  const size_t take = std::min(length, req->length);
  req->info.length = take;
  req->zcopy_done = tl::completion{on_zcopy_done, 1, status::ok};
  req->ep = ep;
  if (req->st != status::in_progress || take == 0) return finish_fetch(req);
  const bool can_get = (ep->lane_attr->caps & tl::cap_get_zcopy) && rkey_length != 0 &&
                       ep->lane_iface->memory_domain() != nullptr;
  if (!can_get) {
    // Software rendezvous: ask the sender to push `take` bytes.
    req->rndv_id = next_rndv_id++;
    rndv_recvs[req->rndv_id] = req;
    req->zcopy_done.count = 0;
    const uint32_t remote = ep->remote_id;
    const uint64_t rreq = req->rndv_id;
    send_control<wire::schema::RndvRtr>(ep, proto_id::rndv_rtr, [&](auto h) {
      h.setDstEp(remote);
      h.setSreqId(sreq);
      h.setRreqId(rreq);
      h.setLength(take);
    });
    return;
  }
  tl::md* md = ep->lane_iface->memory_domain();
  status st = md->rkey_unpack(rkey, rkey_length, &req->remote);
  if (st != status::ok) {
    req->st = st;
    return finish_fetch(req);
  }
  req->remote_valid = true;
  req->issuing = true;
  size_t offset = 0;
  const size_t max_get = std::max<size_t>(ep->lane_attr->max_get_zcopy, 1);
  while (offset < take) {
    size_t chunk = std::min(max_get, take - offset);
    tl::iov entries[16];
    size_t covered = chunk;
    const size_t count =
        iov_slice(req->iov, offset, &covered, entries, std::min<size_t>(16, ep->lane_attr->max_iov));
    ++req->zcopy_done.count;
    st = ep->lane->get_zcopy(entries, count, address + offset, req->remote, &req->zcopy_done);
    if (st != status::in_progress) --req->zcopy_done.count;
    if (is_error(st)) {
      req->st = st;
      break;
    }
    offset += covered;
  }
  req->issuing = false;
  tl::complete(&req->zcopy_done, status::ok);  // drops the issuing guard; may finish the fetch
}

void worker_impl::finish_fetch(request* req) {
  endpoint_impl* ep = req->rndv_ep;
  if (req->remote_valid) {
    ep->lane_iface->memory_domain()->rkey_release(&req->remote);
    req->remote_valid = false;
  }
  if (req->st == status::in_progress && req->zcopy_done.result != status::ok) {
    req->st = req->zcopy_done.result;
  }
  const status outcome = req->st == status::in_progress ? status::ok : req->st;
  if (ep->state != endpoint_impl::phase::failed) {
    const uint32_t remote = ep->remote_id;
    const uint64_t sreq = req->rndv_peer_id;
    send_control<wire::schema::RndvAts>(ep, proto_id::rndv_ats, [&](auto h) {
      h.setDstEp(remote);
      h.setSreqId(sreq);
      h.setStatus(static_cast<int16_t>(outcome));
    });
  }
  ep->counters_.bytes_received += req->info.length;
  if (req->am_rndv) {
    uint8_t* data = req->iov.empty() ? nullptr : static_cast<uint8_t*>(req->iov[0].buffer);
    const size_t length = req->length;
    const uint16_t id = req->am_id;
    const uint16_t flags = req->am_flags;
    std::vector<uint8_t> header = std::move(req->control);
    free_request(req);
    if (data == nullptr) return;
    release_am_rx(ep, length);
    if (outcome != status::ok) {
      release_large(data);
      return;
    }
    deliver_am(ep, id, flags, header.data(), header.size(), data, length, am_recv_first, 0,
               length, 0, true);
    return;
  }
  status final_status = outcome;
  if (final_status == status::ok && req->received > req->length) {
    final_status = status::message_truncated;
  }
  complete(req, final_status);
}

void worker_impl::on_rndv_data(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::RndvData>(data, length, &used);
  if (!h) return protocol_error(nullptr, "truncated rendezvous data header");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "rendezvous data for an unknown endpoint");
  if (ep == nullptr) return;
  auto it = rndv_recvs.find(h->getRreqId());
  if (it == rndv_recvs.end() || it->second->rndv_ep != ep) {
    return protocol_error(ep, "rendezvous data for no receive");
  }
  request* req = it->second;
  const size_t payload = length - used;
  const size_t take = req->info.length;
  if (h->getOffset() != req->offset || payload > take - req->offset) {
    return protocol_error(ep, "rendezvous data out of sequence");
  }
  const size_t saved = req->info.length;
  copy_to_recv(req, req->offset, data + used, payload);
  req->info.length = saved;
  req->offset += payload;
  if (req->offset < take) return;
  rndv_recvs.erase(it);
  req->rndv_id = 0;
  // The sender completes once it pushed everything; no acknowledgement is needed.
  ep->counters_.bytes_received += take;
  status final_status = req->received > req->length ? status::message_truncated : status::ok;
  if (req->am_rndv) {
    uint8_t* buffer = static_cast<uint8_t*>(req->iov[0].buffer);
    const uint16_t id = req->am_id, flags = req->am_flags;
    std::vector<uint8_t> header = std::move(req->control);
    const size_t total = req->length;
    free_request(req);
    release_am_rx(ep, total);
    deliver_am(ep, id, flags, header.data(), header.size(), buffer, total, am_recv_first, 0,
               total, 0, true);
    return;
  }
  complete(req, final_status);
}

void worker_impl::on_rndv_cancel(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvCancel>(data, length);
  if (!h) return protocol_error(nullptr, "truncated rendezvous cancel");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "rendezvous cancel for unknown endpoint");
  if (ep == nullptr) return;
  drop_announcement(ep, h->getSreqId());
}

void worker_impl::on_rndv_refuse(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::RndvRefuse>(data, length);
  if (!h) return protocol_error(nullptr, "truncated rendezvous refusal");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "rendezvous refusal for unknown endpoint");
  if (ep == nullptr) return;
  auto it = rndv_recvs.find(h->getRreqId());
  if (it == rndv_recvs.end() || it->second->rndv_ep != ep) {
    return protocol_error(ep, "rendezvous refusal for no receive");
  }
  request* req = it->second;
  rndv_recvs.erase(it);
  req->rndv_id = 0;
  const status st = static_cast<status>(h->getStatus());
  if (req->am_rndv) {
    release_am_rx(ep, req->length);
    release_large(req->iov.empty() ? nullptr : req->iov[0].buffer);
    free_request(req);
    return;
  }
  complete(req, is_error(st) ? st : status::canceled);
}

void worker_impl::queue_control(endpoint_impl* ep, proto_id id, std::vector<uint8_t> bytes) {
  if (ep->state == endpoint_impl::phase::failed) return;
  if (!reply_fits(ep, sizeof(request) + bytes.size())) return;
  request* req = alloc_request(request::kind::control, request_params{});
  req->ep = ep;
  req->control_id = static_cast<tl::am_id>(id);
  req->control = std::move(bytes);
  const bool idle = ep->pending_head == nullptr;
  ep->push_pending(req);
  if (idle && ep->state == endpoint_impl::phase::connected && !ep->dispatch_pending()) {
    ep->wait_for_resources();
  }
}

}  // namespace comm::detail
