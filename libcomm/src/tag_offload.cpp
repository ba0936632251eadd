// Tag matching in the transport: posting and taking back receives, the transport's callbacks, its
// unexpected handlers, and sends through the lane's tag operations (rules: tag_offload.hpp).
#include "tag_offload.hpp"

#include "iov.hpp"
#include "protocols.hpp"
#include "tag.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstring>

namespace comm::detail {
namespace {

/// Wire header of a rendezvous through tag matching, as the transport carries it.
using rndv_header = wire::schema::TagOffloadRndv;

/// Most iov entries of a send or receive through tag matching (a stack array).
constexpr size_t max_iov_entries = 16;

/// The interface of `w` that gets receives: one that matches tags and reaches other processes
/// (it can lose peers: cap_peer_failure) before one that only reaches its own process; null
/// when none matches tags.
tl::iface* pick_receiving_iface(worker_impl& w) {
  tl::iface* chosen = nullptr;
  for (auto& li : w.ifaces) {
    const uint64_t caps = li.iface->attr().caps;
    if (!(caps & tl::cap_tag_any)) continue;
    if (chosen == nullptr) chosen = li.iface.get();
    if ((caps & tl::cap_peer_failure) && !(chosen->attr().caps & tl::cap_peer_failure)) {
      chosen = li.iface.get();
    }
  }
  return chosen;
}

/// Packs a whole tagged send (request::iov) for tag_eager_bcopy.
size_t pack_send(void* dest, void* arg) {
  auto* req = static_cast<request*>(arg);
  const size_t length = req->as<tag_send_state>().send.length;
  iov_gather(req->iov, 0, static_cast<uint8_t*>(dest), length);
  return length;
}

/// Counts a send that went out whole.
void count_sent(endpoint_impl& ep, size_t length) {
  ++ep.counters_.messages_sent;
  ep.counters_.bytes_sent += length;
}

}  // namespace

tag_offload::tag_offload(worker_impl& w, tag_protocol& t) : w_(w), t_(t) {
  thresh_ = w.ctx.cfg().tm_thresh;
  for (auto& li : w.ifaces) {
    if (!(li.iface->attr().caps & tl::cap_tag_any)) continue;
    // Whatever a peer sends through tag operations must be received, offload here or not.
    (void)li.iface->set_tag_handlers(on_unexpected_eager, this, on_unexpected_rndv, this);
  }
  if (thresh_ != SIZE_MAX) iface_ = pick_receiving_iface(w);
}

tag_offload::~tag_offload() {
  for (auto& li : w_.ifaces) {
    if (li.iface->attr().caps & tl::cap_tag_any) {
      (void)li.iface->set_tag_handlers(nullptr, nullptr, nullptr, nullptr);
    }
  }
}

// -- receives ------------------------------------------------------------------------------------

void tag_offload::try_post(request* req, tag_recv_state& s) {
  s.expected.offloaded = false;
  if (iface_ == nullptr || s.length < thresh_ || s.expected.mask != tag_mask_full) return;
  const tl::tag_limits::recv_limits& limits = iface_->attr().tag.recv;
  if (s.length > limits.max_zcopy || req->iov.size() > limits.max_iov) return;
  if (w_.matcher.software_may_take(s.expected.tag)) return;  // rule 2
  tl::iov entries[max_iov_entries];
  const size_t count = std::min(req->iov.size(), max_iov_entries);
  if (count != req->iov.size()) return;
  for (size_t i = 0; i < count; ++i) entries[i] = {req->iov[i].buffer, req->iov[i].length};
  s.tl_ctx = tl::tag_context{};
  s.tl_ctx.tag_consumed = on_consumed;
  s.tl_ctx.completed = on_completed;
  s.tl_ctx.rndv = on_rndv_request;
  const status st = iface_->tag_recv_zcopy(s.expected.tag, tag_mask_full, entries, count,
                                           &s.tl_ctx);
  if (st != status::ok) return;  // its list is full (exceeds_limit): matched in software
  s.expected.offloaded = true;
  ++posted_;
}

void tag_offload::reclaim(tag_recv_state& s) {
  if (!s.expected.offloaded) return;
  s.expected.offloaded = false;
  ++reclaimed_;
  const status st = iface_->tag_recv_cancel(&s.tl_ctx, true);
  if (st != status::ok) {
    // The transport matched it without telling (tag_consumed) first: a transport bug. Its
    // completion is ignored now (offloaded is clear), the software match stands.
    COMM_LOG(error, "tag", "%s: a receive taken back from the transport was not posted there: %s",
             w_.params.name.c_str(), to_string(st));
  }
}

void tag_offload::on_consumed(tl::tag_context* ctx) {
  request* req = tag_protocol::recv_of(ctx);
  auto& s = req->as<tag_recv_state>();
  if (!s.expected.offloaded) return;
  req->owner->matcher.remove_expected(&s.expected);  // rule 4: out before anything else matches
  s.matched = true;
}

void tag_offload::on_completed(tl::tag_context* ctx, tag_t stag, uint64_t imm, size_t length,
                               status result) {
  request* req = tag_protocol::recv_of(ctx);
  auto& s = req->as<tag_recv_state>();
  if (!s.expected.offloaded) return;  // taken back already: software ends it
  worker_impl& w = *req->owner;
  tag_offload& self = module_of<tag_protocol>(w).offload;
  w.matcher.remove_expected(&s.expected);  // when the transport skipped tag_consumed
  s.expected.offloaded = false;  // after: the matcher counts software receives by the flag
  ++self.matched_;
  tag_protocol::match(req, stag, 0);
  s.received = length;
  s.info.length = std::min(length, s.length);
  uint32_t dst = 0;
  if (tm_sender_of(imm, &dst)) {
    if (endpoint_impl* ep = w.find_ep(dst)) {
      ++ep->counters_.messages_received;
      ep->counters_.bytes_received += s.info.length;
    }
  }
  w.complete(req, result);
}

void tag_offload::on_rndv_request(tl::tag_context* ctx, tag_t stag, const void*, size_t,
                                  status) {
  // libcomm sends no software rendezvous requests through tag operations (its rendezvous carry
  // their data: tag_rndv_zcopy), so a peer that does is not speaking our protocol.
  request* req = tag_protocol::recv_of(ctx);
  auto& s = req->as<tag_recv_state>();
  if (!s.expected.offloaded) return;
  worker_impl& w = *req->owner;
  w.matcher.remove_expected(&s.expected);
  s.expected.offloaded = false;
  tag_protocol::match(req, stag, 0);
  w.protocol_error(nullptr, "software rendezvous request through tag matching");
  w.complete(req, status::protocol_error);
}

// -- unexpected messages -------------------------------------------------------------------------

endpoint_impl* tag_offload::sender_of(uint64_t imm) {
  uint32_t dst = 0;
  if (!tm_sender_of(imm, &dst)) {
    w_.protocol_error(nullptr, "tagged message through tag matching names no sender");
    return nullptr;
  }
  return w_.receiving_ep(dst, "tagged message through tag matching for an unknown endpoint");
}

status tag_offload::on_unexpected_eager(void* arg, void* data, size_t length, unsigned flags,
                                        tag_t stag, uint64_t imm, void** context) {
  auto* self = static_cast<tag_offload*>(arg);
  const bool whole = (flags & tl::tag_flag_first) && !(flags & tl::tag_flag_more);
  if ((flags & tl::tag_flag_first) || *context == nullptr) {
    endpoint_impl* ep = self->sender_of(imm);
    if (ep == nullptr) return status::ok;  // dropped (a failed endpoint), or malformed (counted)
    if (flags & tl::tag_flag_first) ++self->unexpected_;
    if (whole) {
      ++ep->counters_.messages_received;
      ep->counters_.bytes_received += length;
      self->t_.deliver(ep, stag, 0, static_cast<const uint8_t*>(data), length);
      return status::ok;
    }
    self->t_.unexpected_fragment(ep, stag, static_cast<const uint8_t*>(data), length, flags,
                                 context);
    return status::ok;
  }
  // A later fragment: its context names the message (and its endpoint).
  self->t_.unexpected_fragment(nullptr, stag, static_cast<const uint8_t*>(data), length, flags,
                               context);
  return status::ok;
}

status tag_offload::on_unexpected_rndv(void* arg, unsigned, tag_t stag, const void* header,
                                       size_t header_length, uint64_t remote_address,
                                       size_t length, const void* rkey, size_t rkey_length) {
  auto* self = static_cast<tag_offload*>(arg);
  worker_impl& w = self->w_;
  // The transport's copy of the header need not be aligned for the reader: copy it.
  alignas(8) uint8_t words[wire::header_size<rndv_header>()];
  if (header_length < sizeof(words)) {
    w.protocol_error(nullptr, "rendezvous through tag matching with a short header");
    return status::ok;
  }
  std::memcpy(words, header, sizeof(words));
  auto h = wire::read_header<rndv_header>(words, sizeof(words));
  if (!h) {
    w.protocol_error(nullptr, "rendezvous through tag matching with a malformed header");
    return status::ok;
  }
  endpoint_impl* ep =
      w.receiving_ep(h->getDstEp(), "rendezvous through tag matching for an unknown endpoint");
  if (ep == nullptr) return status::ok;
  ++self->unexpected_;
  ++ep->counters_.messages_received;
  rndv_announcement a;
  a.sreq = h->getSreqId();
  a.address = remote_address;
  a.length = length;
  const auto* key = static_cast<const uint8_t*>(rkey);
  if (rkey_length != 0) a.rkey.assign(key, key + rkey_length);
  self->t_.on_announcement(*ep, stag, 0, std::move(a));
  return status::ok;
}

// -- sends ---------------------------------------------------------------------------------------

tm_send tag_offload::choose(const request* req, const tag_send_state& s) const {
  const endpoint_impl& ep = *req->ep;
  const tl::iface_attr& a = *ep.lane_attr;
  constexpr uint32_t software_flags = request_immediate_value | request_force_bcopy |
                                      request_force_zcopy | request_force_rndv;
  const size_t length = s.send.length;
  if (!(a.caps & tl::cap_tag_any) || length < thresh_ || (req->params.flags & software_flags) ||
      req->params.pack != nullptr) {
    return tm_send::software;
  }
  const size_t count = req->iov.size();
  if (length >= ep.rndv_thresh) {
    const bool fits = (a.caps & tl::cap_tag_rndv_zcopy) && count >= 1 &&
                      count <= std::min(a.tag.rndv.max_iov, max_iov_entries) &&
                      length <= a.tag.rndv.max_zcopy &&
                      wire::header_size<rndv_header>() <= a.tag.rndv.max_hdr;
    return fits ? tm_send::rndv : tm_send::software;
  }
  if ((a.caps & tl::cap_tag_eager_zcopy) && length >= w_.zcopy_thresh &&
      length <= a.tag.eager.max_zcopy && count <= std::min(a.tag.eager.max_iov, max_iov_entries)) {
    return tm_send::zcopy;
  }
  if ((a.caps & tl::cap_tag_eager_bcopy) && length <= a.tag.eager.max_bcopy) return tm_send::bcopy;
  return tm_send::software;
}

status tag_offload::send(request* req, tag_send_state& s) {
  switch (s.tm) {
    case tm_send::bcopy:
      return send_bcopy(req, s);
    case tm_send::zcopy:
      return send_zcopy(req, s);
    case tm_send::rndv:
      return send_rndv(req, s);
    default:
      return status::invalid_param;
  }
}

status tag_offload::send_bcopy(request* req, tag_send_state& s) {
  endpoint_impl& ep = *req->ep;
  const ssize_t n = ep.lane->tag_eager_bcopy(s.tag, tm_sender_word(ep.remote_id), pack_send, req);
  if (n < 0) return static_cast<status>(n);
  req->has_started = true;
  req->st = status::ok;
  count_sent(ep, s.send.length);
  ++sent_;
  return status::ok;
}

status tag_offload::send_zcopy(request* req, tag_send_state& s) {
  endpoint_impl& ep = *req->ep;
  tl::iov entries[max_iov_entries];
  size_t covered = s.send.length;
  const size_t count = iov_slice(req->iov, 0, &covered, entries, max_iov_entries);
  req->tl_completion = tl::completion{on_send_done, 1, status::ok};
  req->issuing = true;
  const status st = ep.lane->tag_eager_zcopy(s.tag, tm_sender_word(ep.remote_id), entries, count,
                                             &req->tl_completion);
  req->issuing = false;
  if (st == status::ok) {
    req->tl_completion.count = 0;
    req->st = status::ok;
  } else if (st == status::in_progress) {
    req->tl_in_flight = 1;
  } else {
    req->tl_completion.count = 0;
    return st;
  }
  req->has_started = true;
  count_sent(ep, s.send.length);
  ++sent_;
  return status::ok;
}

status tag_offload::send_rndv(request* req, tag_send_state& s) {
  rndv_protocol& rndv = module_of<rndv_protocol>(w_);
  rndv_send& r = s.rndv;
  if (r.phase == rndv_phase::pushing) {
    // The receiver took the announcement unmatched and asked for the data (RndvRtr).
    return rndv.send(req, r, s.send.length, rts_fields{.is_am = false, .tag = s.tag});
  }
  endpoint_impl& ep = *req->ep;
  if (r.id == 0) rndv.enter_offloaded(req, r, s.send.length);
  rndv_header_.fields().setDstEp(ep.remote_id);
  rndv_header_.fields().setSreqId(r.id);
  tl::iov entries[max_iov_entries];
  size_t covered = s.send.length;
  const size_t count = iov_slice(req->iov, 0, &covered, entries, max_iov_entries);
  req->tl_completion = tl::completion{on_rndv_sent, 1, status::ok};
  const status st = ep.lane->tag_rndv_zcopy(s.tag, rndv_header_.bytes(), rndv_header_.size(),
                                            entries, count, &req->tl_completion, &r.tl_handle);
  if (st != status::in_progress) {
    req->tl_completion.count = 0;
    r.tl_handle = 0;
    if (st != status::no_resource) rndv.release_send(r);
    return st == status::ok ? status::invalid_param : st;
  }
  req->tl_in_flight = 1;
  req->has_started = true;
  r.phase = rndv_phase::announced;
  ++sent_;
  return status::ok;
}

void tag_offload::on_rndv_sent(tl::completion* comp) {
  // The receiver's transport matched the announcement and fetched the data (or failed to).
  request* req = request::of_completion(comp);
  auto& s = req->as<tag_send_state>();
  s.rndv.tl_handle = 0;
  if (s.rndv.cancelled) {
    comp->result = status::canceled;
  } else if (comp->result == status::ok) {
    count_sent(*req->ep, s.send.length);
  }
  module_of<rndv_protocol>(*req->owner).release_send(s.rndv);
  on_send_done(comp);
}

void tag_offload::info(std::ostream& out) const {
  out << "tag matching in the transport: ";
  if (iface_ == nullptr) {
    out << (thresh_ == SIZE_MAX ? "off" : "no interface offers it");
  } else {
    out << "on " << iface_->transport_name() << " from " << thresh_ << " bytes";
  }
  out << "; receives posted " << posted_ << ", matched there " << matched_ << ", taken back "
      << reclaimed_ << "; sends " << sent_ << "; unexpected " << unexpected_ << '\n';
}

}  // namespace comm::detail
