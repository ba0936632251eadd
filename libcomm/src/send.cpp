// The send engine: eager short, bcopy and zcopy, single or fragmented, for any module's messages,
// plus control messages, flush and close. send_message() issues as much of a request as the
// transport accepts and remembers where it stopped, so the pending queue can resume it.
#include "send.hpp"

#include "iov.hpp"
#include "wireup.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstring>

namespace comm::detail {
namespace {

/// Largest user header sent eager short (it is joined to the protocol header on the stack).
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

size_t pack_wire(void* dest, void* arg) {
  auto* req = static_cast<request*>(arg);
  std::memcpy(dest, req->wire.data(), req->wire.size());
  return req->wire.size();
}

/// Encodes the protocol header of the next fragment of `req` into `out`; returns its length and
/// the wire id to send it with.
size_t encode_header(request* req, const send_progress& s, const message_framing& f, bool first,
                     bool whole, uint8_t* out, tl::am_id* id) {
  if (first) return f.encode_first(req, s, whole, out, id);
  worker_impl& w = req->ep->owner;
  auto& h = w.hdr_fragment.fields();
  h.setDstEp(req->ep->remote_id);
  h.setMsgId(s.msg_id);
  h.setOffset(s.offset);
  *id = f.fragment_id;
  return w.hdr_fragment.copy_to(out);
}

/// True when the peer of `req`'s endpoint reads the data of `req` through a mapping (the md says
/// so for every entry): its zero-copy paths then beat copies.
bool peer_maps_data(const request* req) {
  const tl::md* md = req->ep->lane_iface->memory_domain();
  if (md == nullptr || req->iov.empty()) return false;
  return std::all_of(req->iov.begin(), req->iov.end(), [md](const iov_entry& e) {
    return md->maps_for_peers(e.buffer, e.length);
  });
}

/// True when a message of `req` that the zcopy or rendezvous threshold claims goes by copies
/// instead: a module that allows it, a lane whose transport prefers copies up to beyond its
/// length, nothing forced, and data the peer cannot map.
bool prefers_copies(const request* req, const send_progress& s, const message_framing& f) {
  const endpoint_impl& ep = *req->ep;
  const uint32_t forced = request_force_bcopy | request_force_zcopy | request_force_rndv;
  if (!f.copies_preferred || s.length >= ep.copies_below || (req->params.flags & forced) ||
      req->params.pack != nullptr) {
    return false;
  }
  return s.length >= std::min(ep.owner.zcopy_thresh, ep.rndv_thresh) && !peer_maps_data(req);
}

/// Takes room for a large eager copy of `s` in the peer's eager window; false (counted) when
/// what is left of it is too small, or the message would not go in fragments (only a first
/// fragment says that it is windowed).
bool take_window(endpoint_impl& ep, send_progress& s, size_t user) {
  const size_t one_fragment = ep.lane_attr->max_bcopy - max_proto_header - user;
  if (s.length <= one_fragment || s.length > ep.eager_credit) {
    ++ep.eager_window_full;
    return false;
  }
  ep.eager_credit -= s.length;
  ++ep.eager_copies;
  s.windowed = true;
  return true;
}

/// Picks short, bcopy, zcopy or rendezvous for a new message.
void choose_protocol(request* req, send_progress& s, const message_framing& f) {
  const worker_impl& w = req->ep->owner;
  const tl::iface_attr& a = *req->ep->lane_attr;
  const size_t user = req->header.size();
  const uint32_t flags = req->params.flags;
  bool copies = prefers_copies(req, s, f);
  if (copies && s.length >= req->ep->rndv_thresh) {
    if (take_window(*req->ep, s, user)) {
      s.proto = send_protocol::bcopy;
      return;
    }
    copies = false;  // beyond the window: as any message of the rendezvous range
  }
  if (f.send_rndv != nullptr && !(flags & (request_force_bcopy | request_force_zcopy)) &&
      req->params.pack == nullptr && req->iov.size() == 1 &&
      ((flags & request_force_rndv) || s.length >= req->ep->rndv_thresh)) {
    s.proto = send_protocol::rndv;
    return;
  }
  const bool can_zcopy = (a.caps & tl::cap_am_zcopy) && req->params.pack == nullptr &&
                         user + max_proto_header <= a.max_hdr && !copies;
  if (can_zcopy && ((flags & request_force_zcopy) ||
                    (!(flags & request_force_bcopy) && s.length >= w.zcopy_thresh))) {
    s.proto = send_protocol::zcopy;
    return;
  }
  const size_t short_limit = req->ep->short_limit;
  if (!(flags & (request_force_bcopy | request_force_zcopy)) &&
      req->params.pack == nullptr && req->iov.size() <= 1 && user <= max_short_user_header &&
      f.whole_header_size(req) + user + s.length <= short_limit) {
    s.proto = send_protocol::short_;
    return;
  }
  s.proto = send_protocol::bcopy;
}

/// Sends the next zcopy fragment of a message. Returns ok (it went), no_resource, or an error.
status send_zcopy_fragment(request* req, send_progress& s, const message_framing& f) {
  endpoint_impl& ep = *req->ep;
  const tl::iface_attr& a = *ep.lane_attr;
  const bool first = !req->has_started;
  const size_t user = first ? req->header.size() : 0;
  const size_t remaining = s.length - s.offset;
  alignas(8) uint8_t header[max_proto_header + 8];
  tl::am_id id;
  tl::iov entries[16];
  size_t chunk = std::min(remaining, a.max_zcopy);
  const size_t count =
      iov_slice(req->iov, s.offset, &chunk, entries, std::min<size_t>(16, a.max_iov));
  // What one zcopy cannot take (too long, or more entries than max_iov) goes in fragments.
  const bool whole = first && chunk == remaining;
  if (first && !whole && s.msg_id == 0) s.msg_id = ep.next_msg_id++;
  size_t header_length = encode_header(req, s, f, first, whole, header, &id);
  std::vector<uint8_t> joined;
  const void* header_bytes = header;
  if (user != 0) {
    joined.assign(header, header + header_length);
    joined.insert(joined.end(), req->header.begin(), req->header.end());
    header_bytes = joined.data();
    header_length = joined.size();
  }
  if (req->tl_completion.count == 0) {
    req->tl_completion = tl::completion{on_send_done, 1, status::ok};
  }
  ++req->tl_completion.count;
  status st =
      ep.lane->am_zcopy(id, header_bytes, header_length, entries, count, &req->tl_completion);
  if (st != status::in_progress) --req->tl_completion.count;
  if (st == status::in_progress) ++req->tl_in_flight;
  if (st != status::ok && st != status::in_progress) return st;
  s.offset += chunk;
  return status::ok;
}

/// Sends the next short or bcopy fragment of a message. Returns ok (it went), no_resource, or an
/// error.
status send_copy_fragment(request* req, send_progress& s, const message_framing& f) {
  endpoint_impl& ep = *req->ep;
  const tl::iface_attr& a = *ep.lane_attr;
  const bool first = !req->has_started;
  const size_t user = first ? req->header.size() : 0;
  const size_t remaining = s.length - s.offset;
  alignas(8) uint8_t header[max_proto_header + 8];
  tl::am_id id;
  // Eager short was chosen because the whole message fits one am_short (choose_protocol), which
  // may take more than a bcopy fragment: it goes whole, never cut at the bcopy size.
  const size_t room = s.proto == send_protocol::short_ ? remaining
                                                        : a.max_bcopy - max_proto_header - user;
  const bool whole = first && remaining <= room;
  if (first && !whole && s.msg_id == 0) s.msg_id = ep.next_msg_id++;
  const size_t header_length = encode_header(req, s, f, first, whole, header, &id);
  const size_t chunk = std::min(remaining, room);
  if (s.proto == send_protocol::short_) {
    const void* data = req->iov.empty() ? nullptr : req->iov[0].buffer;
    if (user == 0) {
      status st = ep.lane->am_short(id, header, header_length, data, chunk);
      if (st != status::ok) return st;
    } else {
      alignas(8) uint8_t joined[max_proto_header + max_short_user_header];
      if (header_length + user > sizeof(joined)) return status::invalid_param;
      std::memcpy(joined, header, header_length);
      std::memcpy(joined + header_length, req->header.data(), user);
      status st = ep.lane->am_short(id, joined, header_length + user, data, chunk);
      if (st != status::ok) return st;
    }
    s.offset += chunk;
    return status::ok;
  }
  fragment frag{req, header, header_length, req->header.data(), user, s.offset, chunk};
  ssize_t n = ep.lane->am_bcopy(id, pack_fragment, &frag);
  if (n < 0) return static_cast<status>(n);
  s.offset += chunk;
  return status::ok;
}

/// Asks the transport to flush the endpoint; the request completes when it has.
status send_flush(request* req) {
  req->tl_completion = tl::completion{on_send_done, 1, status::ok};
  req->issuing = true;
  status st = req->ep->lane->flush(&req->tl_completion);
  req->issuing = false;
  if (st == status::ok) {
    req->tl_completion.count = 0;
    req->st = status::ok;
    return status::ok;
  }
  if (st == status::in_progress) {
    req->tl_in_flight = 1;
    return status::ok;
  }
  return st;
}

/// A close first flushes what went before it. Once that and every request before it completed,
/// and no module has an operation in flight on the endpoint (endpoint_impl::complete_in_order),
/// it comes back here with has_started set: it sends the close notice, then flushes that.
status send_close(request* req) {
  endpoint_impl* ep = req->ep;
  if (req->has_started && !ep->close_notice_sent) {
    status st = send_close_notice(ep);
    if (st != status::ok) return st;
    ep->close_notice_sent = true;
  }
  return send_flush(req);
}

/// Cancels a close (worker::cancel, and so worker::wait's timeout), which may wait without a bound
/// for a peer that never answers a rendezvous or never frees the transport: the peer is told if it
/// still knows us, the endpoint fails with canceled, and the close completes with it (forced:
/// silently) and releases the endpoint. A close whose flush the transport still holds completes
/// once the endpoint is deleted, which drops that flush.
status cancel_close(request* req, cancel_mode mode) {
  endpoint_impl* ep = req->ep;
  if (mode == cancel_mode::force) {
    req->params.send_cb = nullptr;
    req->released = true;
  }
  if (ep->state == endpoint_impl::phase::closing && ep->lane && !ep->close_notice_sent) {
    (void)send_close_notice(ep);  // best effort: the endpoint fails whatever it returns
  }
  worker_impl& w = ep->owner;
  ep->fail(status::canceled);  // completes the close unless the transport holds its flush
  w.destroy_ep(ep);            // no-op if the close completed (and released it) already
  return status::ok;
}

status send_control(request* req) {
  ssize_t n = req->ep->lane->am_bcopy(req->as<control_state>().id, pack_wire, req);
  return n < 0 ? static_cast<status>(n) : status::ok;
}

}  // namespace

const request_ops flush_ops{.name = "flush", .progress = send_flush, .events = wakeup_tx};
const request_ops close_ops{
    .name = "close", .progress = send_close, .cancel = cancel_close, .events = wakeup_tx};
const request_ops control_ops{.name = "control", .progress = send_control};

status send_message(request* req, send_progress& s, const message_framing& f) {
  if (!s.preset && !req->has_started && s.offset == 0 && req->tl_completion.count == 0) {
    choose_protocol(req, s, f);
  }
  if (s.proto == send_protocol::rndv) return f.send_rndv(req);
  req->issuing = true;
  status st = status::ok;
  while (!req->has_started || s.offset < s.length) {
    st = s.proto == send_protocol::zcopy ? send_zcopy_fragment(req, s, f)
                                         : send_copy_fragment(req, s, f);
    if (st != status::ok) break;
    req->has_started = true;
  }
  if (st == status::ok) {
    endpoint_counters& c = req->ep->counters_;
    ++c.messages_sent;
    c.bytes_sent += s.length;
    if (req->tl_completion.count > 0) {
      tl::complete(&req->tl_completion, status::ok);  // drops the first fragment's guard
    } else {
      req->st = status::ok;
    }
  } else if (is_error(st) && st != status::no_resource && req->tl_completion.count > 0) {
    tl::complete(&req->tl_completion, st);
  }
  req->issuing = false;
  return st;
}

bool try_send_bcopy(endpoint_impl& ep, tl::am_id id, const void* header, size_t header_length,
                    const void* data, size_t length, uint32_t flags, op* result) {
  struct whole {
    const void* header;
    size_t header_length;
    const void* data;
    size_t length;
  } message{header, header_length, data, length};
  const ssize_t n = ep.lane->am_bcopy(
      id,
      [](void* dest, void* arg) -> size_t {
        const auto* m = static_cast<const whole*>(arg);
        auto* out = static_cast<uint8_t*>(dest);
        std::memcpy(out, m->header, m->header_length);
        std::memcpy(out + m->header_length, m->data, m->length);
        return m->header_length + m->length;
      },
      &message);
  if (n >= 0) {
    ++ep.counters_.messages_sent;
    ep.counters_.bytes_sent += length;
    *result = op{};
    return true;
  }
  const auto st = static_cast<status>(n);
  if (st == status::no_resource && !(flags & request_force_immediate)) return false;
  *result = op{st, nullptr};
  return true;
}

endpoint_impl* accept_fragment(worker_impl& w, const protocol& owner, const uint8_t* data,
                               size_t length, const uint8_t** payload, size_t* payload_length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::FragmentMiddle>(data, length, &used);
  if (!h) {
    w.protocol_error(nullptr, "truncated fragment header");
    return nullptr;
  }
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "fragment for an unknown endpoint");
  if (ep == nullptr) return nullptr;
  const rx_message& rx = ep->rx;
  const size_t bytes = length - used;
  if (rx.owner != &owner || rx.msg_id != h->getMsgId() || h->getOffset() != rx.received ||
      bytes > rx.total - rx.received) {
    w.protocol_error(ep, "fragment out of sequence or beyond the message");
    return nullptr;
  }
  ep->counters_.bytes_received += bytes;
  *payload = data + used;
  *payload_length = bytes;
  return ep;
}

void on_send_done(tl::completion* comp) {
  auto* req = request::of_completion(comp);
  req->tl_in_flight = 0;
  req->st = comp->result;
  endpoint_impl* ep = req->ep;
  if (req->type == request::role::close && ep->state == endpoint_impl::phase::failed &&
      !ep->peer_closed_too && !is_error(req->st)) {
    // The endpoint failed while the transport flushed (it finished what the failure withdrew,
    // such as a rendezvous through tag matching): the close ends as the failure says.
    req->st = ep->failure;
  }
  if (req->issuing) return;
  req->ep->complete_in_order();
}

status send_close_notice(endpoint_impl* ep) {
  auto& writer = ep->owner.hdr_close;
  writer.fields().setDstEp(ep->remote_id);
  const tl::am_id id = wire_id(wireup_msg::close);
  status st = ep->lane->am_short(id, writer.bytes(), writer.size(), nullptr, 0);
  if (st == status::unsupported) {
    alignas(8) uint8_t bytes[max_proto_header];
    writer.copy_to(bytes);
    fragment frag{nullptr, bytes, writer.size(), nullptr, 0, 0, 0};
    ssize_t n = ep->lane->am_bcopy(id, pack_fragment, &frag);
    st = n < 0 ? static_cast<status>(n) : status::ok;
  }
  return st;
}

void worker_impl::send_control(endpoint_impl* ep, tl::am_id id, const void* bytes,
                               size_t length) {
  if (short_path_open(*ep, length) &&
      ep->lane->am_short(id, bytes, length, nullptr, 0) == status::ok) {
    return;
  }
  const auto* first = static_cast<const uint8_t*>(bytes);
  queue_control(ep, id, std::vector<uint8_t>(first, first + length));
}

void worker_impl::queue_control(endpoint_impl* ep, tl::am_id id, std::vector<uint8_t> bytes) {
  // After our close notice the peer has forgotten the endpoint: nothing more goes to it.
  if (ep->state == endpoint_impl::phase::failed || ep->close_notice_sent) return;
  if (!reply_fits(ep, sizeof(request) + bytes.size())) return;
  request* req = alloc_request(control_ops, request_params{}, request::role::control);
  req->ep = ep;
  req->init<control_state>().id = id;
  req->wire = std::move(bytes);
  const bool idle = ep->pending_head == nullptr;
  ep->push_pending(req);
  const bool open = ep->state == endpoint_impl::phase::connected ||
                    ep->state == endpoint_impl::phase::closing;
  if (idle && open && !ep->dispatch_pending()) {
    ep->wait_for_resources();
  }
}

}  // namespace comm::detail
