// Endpoints: the pending queue, ordered completion, fences, flush, close and failure.
#include "send.hpp"
#include "worker_impl.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <sstream>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::worker_impl;

namespace detail {
namespace {

/// Rendezvous thresholds when COMM_RNDV_THRESH is not set: lanes whose get the reader completes
/// alone (one copy) switch early; where the sender's progress is needed anyway (a software
/// rendezvous, where the sender pushes, or an emulated get its owner answers) a rendezvous only
/// pays off for messages large enough that the sender's copy into the wire costs more.
constexpr size_t default_get_rndv_thresh = 32 * 1024;
constexpr size_t default_sw_rndv_thresh = 256 * 1024;

/// A fence's request (endpoint_impl::push_fence): it only holds its place in the completion queue.
const request_ops fence_ops{.name = "fence"};

/// The transport calls this when our endpoint may send again.
status resume_from_transport(tl::pending_req* self) {
  endpoint_impl* ep = static_cast<endpoint_impl::resume_entry*>(self)->ep;
  ep->tl_pending_queued = false;
  if (ep->state == endpoint_impl::phase::failed) return status::ok;
  if (ep->dispatch_pending()) return status::ok;
  // Still blocked: stay at the head of the transport's queue (no_resource), unless a completion
  // callback run by dispatch_pending already parked us again (in_progress).
  if (ep->tl_pending_queued) return status::in_progress;
  ep->tl_pending_queued = true;
  return status::no_resource;
}

}  // namespace

endpoint_impl::endpoint_impl(worker_impl& w, uint32_t ep_id, bool by_peer)
    : owner(w), id(ep_id), created_by_peer(by_peer) {
  tl_pending.func = resume_from_transport;
  tl_pending.ep = this;
}

void endpoint_impl::attach_lane(std::unique_ptr<tl::ep> l, tl::iface* li) {
  worker_impl& w = owner;
  if (lane_iface != nullptr) w.count_lane(lane_iface, -1);
  lane = std::move(l);
  lane_iface = li;
  w.count_lane(li, +1);
  lane_attr = &li->attr();
  lane->user_data = this;
  const size_t configured_rndv = w.ctx.cfg().rndv_thresh;
  if (configured_rndv != 0) {
    rndv_thresh = configured_rndv;
  } else if ((lane_attr->caps & tl::cap_get_zcopy) &&
             !(lane_attr->caps & tl::cap_get_needs_peer)) {
    rndv_thresh = default_get_rndv_thresh;
  } else {
    rndv_thresh = default_sw_rndv_thresh;
  }
  const bool thresholds_default =
      configured_rndv == 0 && w.ctx.cfg().zcopy_thresh == config{}.zcopy_thresh;
  copies_below = thresholds_default ? lane_attr->copies_preferred_below : 0;
  if (lane_attr->caps & tl::cap_am_short) {
    short_limit = w.short_thresh != 0 ? std::min(w.short_thresh, lane_attr->max_short)
                                      : lane_attr->max_short;
    // Eager short never takes a message that the zcopy or rendezvous threshold claims.
    size_t payload_cap = rndv_thresh;
    if (lane_attr->caps & tl::cap_am_zcopy) payload_cap = std::min(payload_cap, w.zcopy_thresh);
    const size_t header = wire::header_size<wire::schema::TagEager>();
    if (payload_cap != 0) short_limit = std::min(short_limit, header + payload_cap - 1);
  }
}

endpoint_impl::~endpoint_impl() {
  if (handle != nullptr) handle_access::empty(*handle);
  if (cm_conn != nullptr && owner.cm) owner.cm->close(cm_conn);
  if (lane && tl_pending_queued) {
    lane->pending_purge([](tl::pending_req*, void*) {}, nullptr);
  }
  // A transport endpoint drops the completions of zcopy operations still in flight when it
  // goes. Finish the sends that waited for them (a failed endpoint released early) so that no
  // request outlives its endpoint.
  lane.reset();
  if (lane_iface != nullptr) owner.count_lane(lane_iface, -1);
  const status reason = failure != status::ok ? failure : status::canceled;
  for (request* req = pending_head, *next; req != nullptr; req = next) {
    next = req->next_pending;
    if (req->type == request::role::control) drop_control(req);
  }
  pending_head = pending_tail = nullptr;
  drop_fence();
  for (request* req = outstanding_head; req != nullptr; req = req->next_outstanding) {
    if (req->st == status::in_progress) req->st = reason;
  }
  complete_in_order();
  for (size_t i = 0; i < owner.protocol_count; ++i) owner.protocols[i]->endpoint_deleted(*this);
}

void endpoint_impl::push_pending(request* req) {
  if (req->type == request::role::control) control_bytes += sizeof(request) + req->wire.size();
  req->next_pending = nullptr;
  if (pending_tail != nullptr) {
    pending_tail->next_pending = req;
  } else {
    pending_head = req;
  }
  pending_tail = req;
}

void endpoint_impl::drop_control(request* req) {
  control_bytes -= sizeof(request) + req->wire.size();
  owner.free_request(req);
}

void endpoint_impl::push_outstanding(request* req) {
  req->next_outstanding = nullptr;
  if (outstanding_tail != nullptr) {
    outstanding_tail->next_outstanding = req;
  } else {
    outstanding_head = req;
  }
  outstanding_tail = req;
}

void endpoint_impl::remove_outstanding(request* req) {
  request* prev = nullptr;
  for (request* r = outstanding_head; r != nullptr; prev = r, r = r->next_outstanding) {
    if (r != req) continue;
    (prev != nullptr ? prev->next_outstanding : outstanding_head) = r->next_outstanding;
    if (outstanding_tail == r) outstanding_tail = prev;
    r->next_outstanding = nullptr;
    return;
  }
}

void endpoint_impl::complete_in_order() {
  while (outstanding_head != nullptr && outstanding_head->st != status::in_progress) {
    request* req = outstanding_head;
    if (req->type == request::role::close && req->st == status::ok && !req->has_started &&
        state == phase::closing && lane) {
      // Everything before the close completed and the transport flushed it; once no module has
      // an operation in flight here either, the peer may forget the endpoint.
      if (!modules_busy()) send_close_notice_of(req);
      return;
    }
    outstanding_head = req->next_outstanding;
    if (outstanding_head == nullptr) outstanding_tail = nullptr;
    // A close releases the endpoint whatever its outcome: the user is done with it.
    const bool closing = req->type == request::role::close;
    owner.complete(req, req->st);
    if (closing) {
      if (lane) owner.destroy_ep(this);  // (no lane: we are being destroyed already)
      return;
    }
  }
  if (fence_req != nullptr && outstanding_head == fence_req) pass_fence();
}

bool endpoint_impl::modules_busy() const {
  for (size_t i = 0; i < owner.protocol_count; ++i) {
    if (owner.protocols[i]->busy_on(*this)) return true;
  }
  return false;
}

void endpoint_impl::send_close_notice_of(request* close) {
  close->has_started = true;
  close->st = status::in_progress;
  // Behind the control messages queued before it (acknowledgements the peer waits for).
  push_pending(close);
  if (!tl_pending_queued && !dispatch_pending()) wait_for_resources();
}

bool endpoint_impl::dispatch_pending() {
  bool drained = true;
  while (pending_head != nullptr) {
    request* req = pending_head;
    if (state == phase::wireup && req->type != request::role::control) break;
    status st = req->ops->progress(req);
    if (st == status::no_resource) {
      ++counters_.retries;
      drained = false;
      break;
    }
    pending_head = req->next_pending;
    if (pending_head == nullptr) pending_tail = nullptr;
    if (req->type == request::role::control) {
      drop_control(req);
    } else if (is_error(st)) {
      req->st = st;
    }
  }
  complete_in_order();
  return drained;
}

void endpoint_impl::wait_for_resources() {
  if (!lane) return;  // no lane yet: the handshake's end dispatches the queue
  for (int attempt = 0; attempt < 16 && !tl_pending_queued; ++attempt) {
    status st = lane->pending_add(&tl_pending);
    if (st == status::ok) {
      tl_pending_queued = true;
      return;
    }
    if (st != status::busy) {
      fail(st);
      return;
    }
    if (dispatch_pending()) return;
  }
}

void endpoint_impl::fail(status reason) {
  if (state == phase::failed) return;
  state = phase::failed;
  failure = reason;
  if (cm_conn != nullptr) {
    owner.cm->close(cm_conn);
    cm_conn = nullptr;
  }
  if (tl_pending_queued) {
    lane->pending_purge([](tl::pending_req*, void*) {}, nullptr);
    tl_pending_queued = false;
  }
  drop_fence();  // what it held completes with `reason` from the completion queue, below
  // A close of ours that crossed the peer's ends well: both sides closed.
  const status close_outcome = peer_closed_too ? status::ok : reason;
  for (request* req = pending_head, *next; req != nullptr; req = next) {
    next = req->next_pending;
    if (req->type == request::role::control) {
      drop_control(req);
    } else if (req->type == request::role::close && req->tl_in_flight == 0) {
      req->st = close_outcome;
    } else if (req->tl_completion.count > 0) {
      // A zcopy stopped part-way: drop the guard its first fragment took, so it completes with
      // `reason` once the fragments in flight are over (ordered completion runs below).
      req->issuing = true;
      tl::complete(&req->tl_completion, reason);
      req->issuing = false;
    } else if (req->st == status::in_progress && req->tl_in_flight == 0) {
      req->st = reason;
    }
  }
  pending_head = pending_tail = nullptr;
  for (request* req = outstanding_head; req != nullptr; req = req->next_outstanding) {
    if (req->tl_in_flight != 0) continue;
    if (req->type == request::role::close) {
      req->st = close_outcome;
    } else if (req->st == status::in_progress) {
      req->st = reason;
    }
  }
  // What the peer sent first (nothing is completed), then what waits for it (receives complete).
  owner.forget_peer(*this, held_fate::keep);
  for (size_t i = 0; i < owner.protocol_count; ++i) {
    owner.protocols[i]->endpoint_failed(*this, reason);
  }
  COMM_LOG(info, "endpoint", "%s: endpoint to %s failed: %s", owner.params.name.c_str(),
           peer_name_.c_str(), to_string(reason));
  complete_in_order();
  owner.note_events(~0u);  // a failure ends any wait
  if (error_cb != nullptr) error_cb(error_arg, this, reason);
}

void endpoint_impl::peer_closed() {
  if (state == phase::closing) peer_closed_too = true;
  fail(status::not_connected);
}

void endpoint_impl::resume_pending() {
  if (pending_head != nullptr && state == phase::connected && !tl_pending_queued &&
      !dispatch_pending()) {
    wait_for_resources();
  }
}

status endpoint_impl::cancel_pending(request* req, cancel_mode mode) {
  if (req->has_started) return status::busy;
  request** link = &pending_head;
  request* prev = nullptr;
  while (*link != nullptr && *link != req) {
    prev = *link;
    link = &(*link)->next_pending;
  }
  if (*link != nullptr) {
    *link = req->next_pending;
    if (pending_tail == req) pending_tail = prev;
  } else if (!unhold(req)) {
    return status::busy;
  }
  // The send also sits in the ordered completion queue: forced, it leaves it; reported, it
  // completes from there, after the sends issued before it.
  if (mode == cancel_mode::force) {
    remove_outstanding(req);
    req->finished = true;
    req->st = status::canceled;
    owner.free_request(req);
  } else {
    req->st = status::canceled;
  }
  complete_in_order();
  return status::ok;
}

// -- fence ----------------------------------------------------------------------------------------

void endpoint_impl::push_fence() {
  if (fence_req != nullptr && held_head == nullptr) return;  // nothing issued since the last
  request* req = owner.alloc_request(fence_ops, request_params{}, request::role::fence);
  req->ep = this;
  push_outstanding(req);
  if (fence_req != nullptr) {
    static_cast<void>(hold_behind_fence(req));  // passes after the first, and what it holds
    return;
  }
  fence_req = req;
  if (outstanding_head == req) pass_fence();
}

op endpoint_impl::hold_behind_fence(request* req) {
  if (req->params.flags & request_force_immediate) {
    owner.free_request(req);
    return op{status::no_resource, nullptr};
  }
  op result = req->type == request::role::fence ? op{} : owner.in_progress(req);
  if (req->type != request::role::fence) push_outstanding(req);
  req->next_pending = nullptr;
  (held_tail != nullptr ? held_tail->next_pending : held_head) = req;
  held_tail = req;
  return result;
}

void endpoint_impl::pass_fence() {
  request* passed = fence_req;
  fence_req = nullptr;
  passed->st = status::ok;
  // What it held goes to the pending queue, up to the next fence, which takes its place.
  bool released = false;
  while (held_head != nullptr && fence_req == nullptr) {
    request* req = held_head;
    held_head = req->next_pending;
    if (held_head == nullptr) held_tail = nullptr;
    if (req->type == request::role::fence) {
      fence_req = req;
    } else {
      push_pending(req);
      released = true;
    }
  }
  complete_in_order();  // completes `passed` (and passes the next fence if nothing is before it)
  if (released && state == phase::connected && !tl_pending_queued && !dispatch_pending()) {
    wait_for_resources();
  }
}

bool endpoint_impl::unhold(request* req) {
  request* prev = nullptr;
  for (request* r = held_head; r != nullptr; prev = r, r = r->next_pending) {
    if (r != req) continue;
    (prev != nullptr ? prev->next_pending : held_head) = r->next_pending;
    if (held_tail == r) held_tail = prev;
    return true;
  }
  return false;
}

// -- starting sends ------------------------------------------------------------------------------

op start_send(endpoint_impl& ep, request* req) {
  worker_impl& w = ep.owner;
  req->ep = &ep;
  if (ep.state == endpoint_impl::phase::failed) {
    w.free_request(req);
    return op{ep.failure, nullptr};
  }
  if (ep.fence_req != nullptr) return ep.hold_behind_fence(req);
  const bool queue_busy = ep.pending_head != nullptr || ep.state == endpoint_impl::phase::wireup;
  status st = queue_busy ? status::no_resource : req->ops->progress(req);
  if (st == status::no_resource && (req->params.flags & request_force_immediate) &&
      !req->has_started) {
    w.free_request(req);
    return op{status::no_resource, nullptr};
  }
  if (is_error(st) && st != status::no_resource) {
    w.free_request(req);
    return op{st, nullptr};
  }
  // A flush or close is done at once only when nothing before it is still outstanding.
  const bool waits_for_others = (req->type == request::role::flush ||
                                 req->type == request::role::close) &&
                                ep.outstanding_head != nullptr;
  if (st == status::ok && !(req->params.flags & request_no_immediate_completion) &&
      req->st == status::ok && !waits_for_others) {
    w.free_request(req);
    return op{};
  }
  // Visible to the caller before anything below can complete (and so free) it.
  op result = w.in_progress(req);
  ep.push_outstanding(req);
  if (st == status::no_resource) {
    ++ep.counters_.retries;
    ep.push_pending(req);
    if (!queue_busy) ep.wait_for_resources();
  }
  ep.complete_in_order();
  return result;
}

}  // namespace detail

// -- public endpoint API -------------------------------------------------------------------------

op endpoint::flush(const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  if (ep.state == endpoint_impl::phase::failed) return op{ep.failure, nullptr};
  request* req = ep.owner.alloc_request(detail::flush_ops, params, request::role::flush);
  return detail::start_send(ep, req);
}

op endpoint::close(const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  if (ep.state == endpoint_impl::phase::wireup) {
    // A server endpoint accepted but not yet confirmed already knows the client's endpoint:
    // tell it, or the client (which may have its answer already) would never learn.
    if (ep.lane && ep.remote_id != 0) (void)detail::send_close_notice(&ep);
    ep.fail(status::canceled);
  }
  if (ep.state == endpoint_impl::phase::failed) {
    ep.owner.destroy_ep(&ep);
    return ep.owner.immediate(params, status::ok);
  }
  ep.state = endpoint_impl::phase::closing;
  request* req = ep.owner.alloc_request(detail::close_ops, params, request::role::close);
  req->params.flags |= request_no_immediate_completion;
  op o = detail::start_send(ep, req);
  if (o.req != nullptr && o.req->finished && !(params.flags & request_no_immediate_completion)) {
    const status st = o.req->st;
    ep.owner.free_request(o.req);
    return op{st, nullptr};
  }
  return o;
}

void endpoint::set_error_handler(endpoint_error_callback cb, void* arg) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  ep.error_cb = cb;
  ep.error_arg = arg;
}

status endpoint::state() const noexcept {
  const endpoint_impl& ep = impl(*this);
  return ep.state == endpoint_impl::phase::failed ? ep.failure : status::ok;
}

uint64_t endpoint::peer_uid() const noexcept { return impl(*this).peer_uid_; }
const std::string& endpoint::peer_name() const noexcept { return impl(*this).peer_name_; }
std::string_view endpoint::transport() const noexcept {
  const endpoint_impl& ep = impl(*this);
  return ep.lane_iface != nullptr ? ep.lane_iface->transport_name() : std::string_view("none");
}
const endpoint_counters& endpoint::counters() const noexcept { return impl(*this).counters_; }

std::string endpoint::info() const {
  const endpoint_impl& ep = impl(*this);
  static const char* const phases[] = {"wireup", "connected", "closing", "failed"};
  std::ostringstream out;
  const auto& c = ep.counters_;
  out << "ep " << ep.id << " -> " << ep.peer_name_ << " (remote ep " << ep.remote_id << ") via "
      << ep.transport() << ' ' << phases[static_cast<int>(ep.state)]
      << (ep.created_by_peer ? " [peer-created]" : "") << ": sent " << c.messages_sent << " msgs "
      << c.bytes_sent << " B, received " << c.messages_received << " msgs " << c.bytes_received
      << " B, retries " << c.retries << ", errors " << c.errors;
  if (ep.state == endpoint_impl::phase::failed) out << " (" << to_string(ep.failure) << ')';
  if (ep.unexpected_msgs + ep.am_rx_bytes + ep.control_bytes != 0) {
    out << "; holds unexpected " << ep.unexpected_bytes << " B in " << ep.unexpected_msgs
        << " msgs, AMs " << ep.am_rx_bytes << " B, replies " << ep.control_bytes << " B";
  }
  if (!ep.lane_choice.empty()) out << "; " << ep.lane_choice;
  return out.str();
}

}  // namespace comm
