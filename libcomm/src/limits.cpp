// Limits on what a peer can make a worker hold without the local user asking for it (the limits
// of comm::config::limits; README "Reliability and limits"):
//   - unexpected tagged messages and rendezvous announcements, per endpoint (bytes and count) and
//     per worker (bytes: a peer that reconnects leaves its messages behind);
//   - active messages before their handler runs (reassembly and rendezvous receive buffers), per
//     endpoint and per worker; a rendezvous AM that does not fit waits, since the receiver decides
//     when to fetch it;
//   - control messages queued for a peer that does not take them (acknowledgements, RMA replies);
//   - endpoints created by peers' wireup requests.
// A peer that passes a limit fails the endpoint it came through with EXCEEDS_LIMIT; the worker's
// other endpoints keep working.
#include "worker_impl.hpp"

#include <comm/log.hpp>

namespace comm::detail {
namespace {

/// Refusals of wireup requests answered beyond COMM_PEER_EP_MAX at once (each needs a short-lived
/// endpoint to carry the answer); later ones are dropped unanswered.
constexpr size_t max_refusals_in_flight = 64;

/// The first limit errors, then every power of two: a hostile peer must not flood the log.
bool worth_logging(uint64_t count) { return count <= 16 || (count & (count - 1)) == 0; }

}  // namespace

// -- failing an endpoint -------------------------------------------------------------------------

void worker_impl::exceed_limit(endpoint_impl* ep, const char* variable, size_t limit) {
  ++limit_errors;
  ++ep->counters_.errors;
  if (worth_logging(limit_errors)) {
    COMM_LOG(warn, "limits",
             "%s: endpoint to %s passed %s=%zu: failed with EXCEEDS_LIMIT (%llu so far)",
             params.name.c_str(), ep->peer_name_.c_str(), variable, limit,
             static_cast<unsigned long long>(limit_errors));
  }
  // Best effort: the peer's endpoint fails with NOT_CONNECTED instead of sending into the void.
  if (ep->state == endpoint_impl::phase::connected) (void)send_close_notice(ep);
  // Before fail(): its error handler may close the endpoint, which would keep the messages.
  forget_unexpected_from(ep, eager_fate::drop);
  ep->fail(status::exceeds_limit);
}

// -- unexpected messages -------------------------------------------------------------------------

bool worker_impl::charge_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs) {
  const peer_limits& c = ctx.cfg().limits;
  if (ep->unexpected_msgs + msgs > c.unexpected_ep_max_msgs) {
    exceed_limit(ep, "COMM_UNEXPECTED_EP_MAX_MSGS", c.unexpected_ep_max_msgs);
    return false;
  }
  if (ep->unexpected_bytes + bytes > c.unexpected_ep_max_bytes) {
    exceed_limit(ep, "COMM_UNEXPECTED_EP_MAX_BYTES", c.unexpected_ep_max_bytes);
    return false;
  }
  if (unexpected_bytes + bytes > c.unexpected_max_bytes) {
    exceed_limit(ep, "COMM_UNEXPECTED_MAX_BYTES", c.unexpected_max_bytes);
    return false;
  }
  ep->unexpected_bytes += bytes;
  ep->unexpected_msgs += msgs;
  unexpected_bytes += bytes;
  return true;
}

void worker_impl::uncharge_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs) {
  unexpected_bytes -= bytes;
  if (ep == nullptr) return;
  ep->unexpected_bytes -= bytes;
  ep->unexpected_msgs -= msgs;
}

void worker_impl::detach_unexpected(unexpected_msg* msg) {
  if (msg->from == nullptr) return;
  msg->from->unexpected_bytes -= msg->charged;
  --msg->from->unexpected_msgs;
  msg->from = nullptr;
}

void worker_impl::forget_unexpected_from(endpoint_impl* ep, eager_fate eager) {
  std::vector<unexpected_msg*> doomed_msgs;
  matcher.for_each_unexpected([&](tag_unexpected* u) {
    auto* msg = static_cast<unexpected_msg*>(u);
    if (msg->rndv ? msg->ep != ep : msg->from != ep) return;
    if (msg->rndv || eager == eager_fate::drop) {
      doomed_msgs.push_back(msg);
    } else if (eager == eager_fate::detach) {
      detach_unexpected(msg);  // still receivable, held by the worker alone
    }
  });
  for (unexpected_msg* msg : doomed_msgs) {
    matcher.remove_unexpected(msg);
    free_unexpected(msg);
  }
  for (const deferred_am& am : ep->deferred_ams) uncharge_unexpected(ep, am.charged, 1);
  deferred_ams -= ep->deferred_ams.size();
  ep->deferred_ams.clear();
}

void worker_impl::drop_announcement(endpoint_impl* ep, uint64_t sreq) {
  std::vector<unexpected_msg*> doomed_msgs;
  matcher.for_each_unexpected([&](tag_unexpected* u) {
    auto* msg = static_cast<unexpected_msg*>(u);
    if (msg->rndv && msg->ep == ep && msg->sreq == sreq) doomed_msgs.push_back(msg);
  });
  for (unexpected_msg* msg : doomed_msgs) {
    matcher.remove_unexpected(msg);
    free_unexpected(msg);
  }
  for (auto it = ep->deferred_ams.begin(); it != ep->deferred_ams.end(); ++it) {
    if (it->sreq != sreq) continue;
    uncharge_unexpected(ep, it->charged, 1);
    ep->deferred_ams.erase(it);
    --deferred_ams;
    return;
  }
}

// -- active messages before delivery -------------------------------------------------------------

const char* worker_impl::am_rx_limit(const endpoint_impl* ep, size_t bytes, size_t* limit) const {
  const peer_limits& c = ctx.cfg().limits;
  if (ep->am_rx_bytes + bytes > c.am_rx_ep_max_bytes) {
    *limit = c.am_rx_ep_max_bytes;
    return "COMM_AM_RX_EP_MAX_BYTES";
  }
  if (am_rx_bytes + bytes > c.am_rx_max_bytes) {
    *limit = c.am_rx_max_bytes;
    return "COMM_AM_RX_MAX_BYTES";
  }
  return nullptr;
}

bool worker_impl::charge_am_rx(endpoint_impl* ep, size_t bytes) {
  size_t limit = 0;
  if (const char* variable = am_rx_limit(ep, bytes, &limit)) {
    exceed_limit(ep, variable, limit);
    return false;
  }
  ep->am_rx_bytes += bytes;
  am_rx_bytes += bytes;
  return true;
}

void worker_impl::release_am_rx(endpoint_impl* ep, size_t bytes) {
  ep->am_rx_bytes -= bytes;
  am_rx_bytes -= bytes;
}

void worker_impl::refuse_am(endpoint_impl* ep, const deferred_am& am, const char* variable,
                            size_t limit) {
  ++limit_errors;
  ++ep->counters_.errors;
  if (worth_logging(limit_errors)) {
    COMM_LOG(warn, "limits", "%s: refused rendezvous AM %u of %zu bytes from %s: beyond %s=%zu",
             params.name.c_str(), am.am_id, am.length, ep->peer_name_.c_str(), variable, limit);
  }
  // A fetch of nothing that fails at once: the sender's request completes with EXCEEDS_LIMIT.
  request* req = alloc_request(request::kind::tag_recv, request_params{});
  req->am_rndv = true;
  req->matched = true;
  req->st = status::exceeds_limit;
  start_fetch(req, ep, am.sreq, am.address, am.length, nullptr, 0);
}

void worker_impl::on_rndv_am(endpoint_impl* ep, deferred_am&& am) {
  const peer_limits& c = ctx.cfg().limits;
  if (am.length > c.am_rx_ep_max_bytes) {
    return refuse_am(ep, am, "COMM_AM_RX_EP_MAX_BYTES", c.am_rx_ep_max_bytes);
  }
  if (am.length > c.am_rx_max_bytes) {
    return refuse_am(ep, am, "COMM_AM_RX_MAX_BYTES", c.am_rx_max_bytes);
  }
  size_t limit = 0;
  if (ep->deferred_ams.empty() && am_rx_limit(ep, am.length, &limit) == nullptr) {
    fetch_am(ep, am);
    return;
  }
  am.charged = sizeof(deferred_am) + am.rkey.size() + am.header.size();
  if (!charge_unexpected(ep, am.charged, 1)) return;
  ep->deferred_ams.push_back(std::move(am));
  ++deferred_ams;
}

void worker_impl::start_deferred_ams() {
  if (starting_deferred) return;
  starting_deferred = true;
  size_t limit = 0;
  for (size_t i = 0; i < ep_table.size() && deferred_ams != 0; ++i) {
    // Re-read after each fetch: a handler run by it may close the endpoint.
    for (endpoint_impl* ep; (ep = ep_table[i]) != nullptr && !ep->deferred_ams.empty();) {
      if (am_rx_limit(ep, ep->deferred_ams.front().length, &limit) != nullptr) break;
      deferred_am am = std::move(ep->deferred_ams.front());
      ep->deferred_ams.pop_front();
      --deferred_ams;
      uncharge_unexpected(ep, am.charged, 1);
      fetch_am(ep, am);
    }
  }
  starting_deferred = false;
}

// -- replies queued for the peer -----------------------------------------------------------------

bool worker_impl::reply_fits(endpoint_impl* ep, size_t cost) {
  const size_t limit = ctx.cfg().limits.reply_ep_max_bytes;
  if (ep->control_bytes + cost <= limit) return true;
  exceed_limit(ep, "COMM_REPLY_EP_MAX_BYTES", limit);
  return false;
}

// -- endpoints created by peers ------------------------------------------------------------------

bool worker_impl::make_room_for_peer_ep() {
  for (endpoint_impl* ep : ep_table) {
    if (ep != nullptr && ep->created_by_peer && ep->state == endpoint_impl::phase::failed) {
      destroy_ep(ep);
    }
  }
  return peer_eps < ctx.cfg().limits.peer_ep_max;
}

void worker_impl::refuse_wireup(const std::vector<uint8_t>& address, uint32_t src_ep) {
  const size_t limit = ctx.cfg().limits.peer_ep_max;
  ++limit_errors;
  const bool answer = peer_eps < limit + max_refusals_in_flight;
  if (worth_logging(limit_errors)) {
    COMM_LOG(warn, "limits", "%s: refused a peer's wireup request: COMM_PEER_EP_MAX=%zu endpoints "
             "created by peers%s (%llu so far)", params.name.c_str(), limit,
             answer ? "" : ", too many refusals under way to answer it",
             static_cast<unsigned long long>(limit_errors));
  }
  endpoint_impl* ep = nullptr;
  if (!answer || create_ep(address.data(), address.size(), true, &ep) != status::ok) return;
  // A short-lived endpoint carries the refusal, then closes (and is freed) behind it.
  ep->remote_id = src_ep;
  ep->state = endpoint_impl::phase::connected;
  wire::header_writer<wire::schema::WireupReply> reply;
  reply.fields().setDstEp(src_ep);
  reply.fields().setSrcEp(0);
  reply.fields().setStatus(static_cast<int16_t>(status::exceeds_limit));
  auto bytes = static_cast<const uint8_t*>(reply.bytes());
  queue_control(ep, proto_id::wireup_reply, std::vector<uint8_t>(bytes, bytes + reply.size()));
  op closing = ep->close();
  if (closing.pending()) release(closing.req);
}

}  // namespace comm::detail
