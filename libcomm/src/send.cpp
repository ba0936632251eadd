// The send engine: eager short, bcopy and zcopy, single or fragmented, for tagged messages and
// active messages alike, plus control messages, flush and close. progress_send() issues as much of
// a request as the transport accepts and remembers where it stopped, so the pending queue can
// resume it.
#include "iov.hpp"
#include "worker_impl.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstring>

namespace comm::detail {
namespace {

/// Largest encoded protocol header of any data message.
constexpr size_t max_proto_header = 64;

/// Largest AM user header sent eager short (it is joined to the protocol header on the stack).
constexpr size_t max_short_user_header = 1024;

/// Copies bytes [offset, offset + length) of a send's data into `dest`.
void gather(const request* req, size_t offset, uint8_t* dest, size_t length) {
  if (length == 0) return;
  if (req->params.pack != nullptr) {
    size_t done = 0;
    while (done < length) {
      size_t n = req->params.pack(dest + done, offset + done, length - done, req->params.pack_arg);
      if (n == 0) break;
      done += n;
    }
    return;
  }
  iov_gather(req->iov, offset, dest, length);
}


/// What one bcopy fragment carries: protocol header, user header, then a slice of the data.
struct fragment {
  const request* req;
  const void* header;
  size_t header_length;
  const uint8_t* user_header;
  size_t user_header_length;
  size_t data_offset;
  size_t data_length;
};

size_t pack_fragment(void* dest, void* arg) {
  auto* f = static_cast<fragment*>(arg);
  auto* out = static_cast<uint8_t*>(dest);
  std::memcpy(out, f->header, f->header_length);
  out += f->header_length;
  if (f->user_header_length != 0) {
    std::memcpy(out, f->user_header, f->user_header_length);
    out += f->user_header_length;
  }
  gather(f->req, f->data_offset, out, f->data_length);
  return f->header_length + f->user_header_length + f->data_length;
}

size_t pack_control(void* dest, void* arg) {
  auto* req = static_cast<request*>(arg);
  std::memcpy(dest, req->control.data(), req->control.size());
  return req->control.size();
}

/// Encodes the protocol header of the next fragment of `req` into `out`; returns its length and
/// the protocol id to send it with.
size_t encode_header(request* req, bool first, bool whole, uint8_t* out, tl::am_id* id) {
  worker_impl& w = req->ep->owner;
  const uint32_t dst = req->ep->remote_id;
  if (!first) {
    auto& h = w.hdr_fragment.fields();
    h.setDstEp(dst);
    h.setMsgId(req->msg_id);
    h.setOffset(req->offset);
    *id = static_cast<tl::am_id>(req->type == request::kind::tag_send ? proto_id::tag_fragment
                                                                      : proto_id::am_fragment);
    return w.hdr_fragment.copy_to(out);
  }
  if (req->type == request::kind::tag_send) {
    const bool with_imm = req->params.flags & request_immediate_value;
    if (!whole) {
      auto& h = w.hdr_tag_first.fields();
      h.setDstEp(dst);
      h.setTag(req->tag);
      h.setMsgId(req->msg_id);
      h.setTotalLength(req->length);
      h.setImm(with_imm ? req->params.imm : 0);
      *id = static_cast<tl::am_id>(proto_id::tag_eager_first);
      return w.hdr_tag_first.copy_to(out);
    }
    if (with_imm) {
      auto& h = w.hdr_tag_imm.fields();
      h.setDstEp(dst);
      h.setTag(req->tag);
      h.setImm(req->params.imm);
      *id = static_cast<tl::am_id>(proto_id::tag_eager_imm);
      return w.hdr_tag_imm.copy_to(out);
    }
    auto& h = w.hdr_tag.fields();
    h.setDstEp(dst);
    h.setTag(req->tag);
    *id = static_cast<tl::am_id>(proto_id::tag_eager);
    return w.hdr_tag.copy_to(out);
  }
  if (!whole) {
    auto& h = w.hdr_am_first.fields();
    h.setDstEp(dst);
    h.setAmId(req->am_id);
    h.setFlags(req->am_flags);
    h.setHeaderLength(static_cast<uint32_t>(req->control.size()));
    h.setMsgId(req->msg_id);
    h.setTotalLength(req->control.size() + req->length);
    *id = static_cast<tl::am_id>(proto_id::am_first);
    return w.hdr_am_first.copy_to(out);
  }
  auto& h = w.hdr_am.fields();
  h.setDstEp(dst);
  h.setAmId(req->am_id);
  h.setFlags(req->am_flags);
  h.setHeaderLength(static_cast<uint32_t>(req->control.size()));
  *id = static_cast<tl::am_id>(proto_id::am_single);
  return w.hdr_am.copy_to(out);
}

/// Encoded size of the protocol header of a whole (single-message) send.
size_t whole_header_size(const request* req) {
  if (req->type == request::kind::am_send) return wire::header_size<wire::schema::ActiveMessage>();
  if (req->params.flags & request_immediate_value) {
    return wire::header_size<wire::schema::TagEagerImm>();
  }
  return wire::header_size<wire::schema::TagEager>();
}

/// Picks short, bcopy or zcopy for a new data request.
void choose_protocol(request* req) {
  const worker_impl& w = req->ep->owner;
  const tl::iface_attr& a = *req->ep->lane_attr;
  const size_t user = req->control.size();
  const uint32_t flags = req->params.flags;
  if (!(flags & (request_force_bcopy | request_force_zcopy)) && req->params.pack == nullptr &&
      req->iov.size() == 1 &&
      ((flags & request_force_rndv) || req->length >= req->ep->rndv_thresh)) {
    req->proto = request::protocol::rndv;
    return;
  }
  const bool can_zcopy = (a.caps & tl::cap_am_zcopy) && req->params.pack == nullptr &&
                         user + max_proto_header <= a.max_hdr;
  if (can_zcopy && ((flags & request_force_zcopy) ||
                    (!(flags & request_force_bcopy) && req->length >= w.zcopy_thresh))) {
    req->proto = request::protocol::zcopy;
    return;
  }
  const size_t short_limit = req->ep->short_limit;
  if (!(flags & (request_force_bcopy | request_force_zcopy)) &&
      req->params.pack == nullptr && req->iov.size() <= 1 && user <= max_short_user_header &&
      whole_header_size(req) + user + req->length <= short_limit) {
    req->proto = request::protocol::short_;
    return;
  }
  req->proto = request::protocol::bcopy;
}

/// Sends the next fragment of a data request. Returns ok (it went), no_resource, or an error.
status send_fragment(request* req) {
  endpoint_impl& ep = *req->ep;
  const tl::iface_attr& a = *ep.lane_attr;
  const bool first = !req->has_started;
  const size_t user = first ? req->control.size() : 0;
  const size_t remaining = req->length - req->offset;
  alignas(8) uint8_t header[max_proto_header + 8];
  tl::am_id id;

  if (req->proto == request::protocol::zcopy) {
    tl::iov entries[16];
    size_t chunk = std::min(remaining, a.max_zcopy);
    const size_t count = iov_slice(req->iov, req->offset, &chunk, entries, std::min<size_t>(16, a.max_iov));
    // What one zcopy cannot take (too long, or more entries than max_iov) goes in fragments.
    const bool whole = first && chunk == remaining;
    if (first && !whole && req->msg_id == 0) req->msg_id = ep.next_msg_id++;
    size_t header_length = encode_header(req, first, whole, header, &id);
    std::vector<uint8_t> joined;
    const void* header_bytes = header;
    if (user != 0) {
      joined.assign(header, header + header_length);
      joined.insert(joined.end(), req->control.begin(), req->control.end());
      header_bytes = joined.data();
      header_length = joined.size();
    }
    if (req->zcopy_done.count == 0) {
      req->zcopy_done = tl::completion{on_zcopy_done, 1, status::ok};
    }
    ++req->zcopy_done.count;
    status st = ep.lane->am_zcopy(id, header_bytes, header_length, entries, count, &req->zcopy_done);
    if (st != status::in_progress) --req->zcopy_done.count;
    if (st == status::in_progress) ++req->zcopy_outstanding;
    if (st != status::ok && st != status::in_progress) return st;
    req->offset += chunk;
    return status::ok;
  }

  const size_t room = a.max_bcopy - max_proto_header - user;
  const bool whole = first && remaining <= room;
  if (first && !whole && req->msg_id == 0) req->msg_id = ep.next_msg_id++;
  const size_t header_length = encode_header(req, first, whole, header, &id);
  const size_t chunk = std::min(remaining, room);
  if (req->proto == request::protocol::short_) {
    if (user == 0) {
      const void* data = req->iov.empty() ? nullptr : req->iov[0].buffer;
      status st = ep.lane->am_short(id, header, header_length, data, chunk);
      if (st != status::ok) return st;
    } else {
      alignas(8) uint8_t joined[max_proto_header + max_short_user_header];
      if (header_length + user > sizeof(joined)) return status::invalid_param;
      std::memcpy(joined, header, header_length);
      std::memcpy(joined + header_length, req->control.data(), user);
      const void* data = req->iov.empty() ? nullptr : req->iov[0].buffer;
      status st = ep.lane->am_short(id, joined, header_length + user, data, chunk);
      if (st != status::ok) return st;
    }
    req->offset += chunk;
    return status::ok;
  }
  fragment f{req, header, header_length, req->control.data(), user, req->offset, chunk};
  ssize_t n = ep.lane->am_bcopy(id, pack_fragment, &f);
  if (n < 0) return static_cast<status>(n);
  req->offset += chunk;
  return status::ok;
}

/// Issues a data request until it is all out or the transport says no.
status send_data(request* req) {
  if (!req->has_started && req->offset == 0 && req->zcopy_done.count == 0) choose_protocol(req);
  if (req->proto == request::protocol::rndv) return send_rndv(req);
  req->issuing = true;
  status st = status::ok;
  while (!req->has_started || req->offset < req->length) {
    st = send_fragment(req);
    if (st != status::ok) break;
    req->has_started = true;
  }
  if (st == status::ok) {
    endpoint_counters& c = req->ep->counters_;
    ++c.messages_sent;
    c.bytes_sent += req->length;
    if (req->zcopy_done.count > 0) {
      tl::complete(&req->zcopy_done, status::ok);  // drops the guard taken by the first fragment
    } else {
      req->st = status::ok;
    }
  } else if (is_error(st) && st != status::no_resource && req->zcopy_done.count > 0) {
    tl::complete(&req->zcopy_done, st);
  }
  req->issuing = false;
  return st;
}

/// Asks the transport to flush the endpoint; the request completes when it has.
status send_flush(request* req) {
  req->zcopy_done = tl::completion{on_zcopy_done, 1, status::ok};
  req->issuing = true;
  status st = req->ep->lane->flush(&req->zcopy_done);
  req->issuing = false;
  if (st == status::ok) {
    req->zcopy_done.count = 0;
    req->st = status::ok;
    return status::ok;
  }
  if (st == status::in_progress) {
    req->zcopy_outstanding = 1;
    return status::ok;
  }
  return st;
}

status send_control(request* req) {
  ssize_t n = req->ep->lane->am_bcopy(req->control_id, pack_control, req);
  return n < 0 ? static_cast<status>(n) : status::ok;
}

}  // namespace

void on_zcopy_done(tl::completion* comp) {
  auto* req = request::of_completion(comp);
  endpoint_impl* ep = req->ep;
  req->zcopy_outstanding = 0;
  if (req->reads != 0) {
    ep->reads_in_flight -= req->reads;
    req->reads = 0;
  }
  if (req->type == request::kind::tag_recv) {
    // A rendezvous fetch: the receive completes once the sender has its acknowledgement.
    if (is_error(comp->result) && req->st == status::in_progress) req->st = comp->result;
    if (!req->issuing) ep->owner.finish_fetch(req);
    return;
  }
  req->st = comp->result;
  if (req->issuing) return;
  ep->complete_in_order();
  if (req->type == request::kind::get && ep->pending_head != nullptr &&
      ep->state == endpoint_impl::phase::connected && !ep->tl_pending_queued) {
    if (!ep->dispatch_pending()) ep->wait_for_resources();
  }
}

status send_close_notice(endpoint_impl* ep) {
  auto& writer = ep->owner.hdr_close;
  writer.fields().setDstEp(ep->remote_id);
  status st = ep->lane->am_short(static_cast<tl::am_id>(proto_id::ep_close), writer.bytes(),
                                 writer.size(), nullptr, 0);
  if (st == status::unsupported) {
    alignas(8) uint8_t bytes[max_proto_header];
    writer.copy_to(bytes);
    fragment f{nullptr, bytes, writer.size(), nullptr, 0, 0, 0};
    ssize_t n = ep->lane->am_bcopy(static_cast<tl::am_id>(proto_id::ep_close), pack_fragment, &f);
    st = n < 0 ? static_cast<status>(n) : status::ok;
  }
  return st;
}

status progress_send(request* req) {
  switch (req->type) {
    case request::kind::tag_send:
    case request::kind::am_send:
      return send_data(req);
    case request::kind::control:
      return send_control(req);
    case request::kind::flush:
      return send_flush(req);
    case request::kind::close:
      if (!req->has_started) {
        status st = send_close_notice(req->ep);
        if (st != status::ok) return st;
        req->has_started = true;
      }
      return send_flush(req);
    case request::kind::get:
    case request::kind::put:
      return send_rma(req);
    case request::kind::tag_recv:
      break;
  }
  return status::invalid_param;
}

}  // namespace comm::detail
