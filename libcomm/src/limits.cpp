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
#include "send.hpp"
#include "worker_impl.hpp"

#include <comm/log.hpp>

namespace comm::detail {
namespace {

/// The first limit errors, then every power of two: a hostile peer must not flood the log.
bool worth_logging(uint64_t count) { return count <= 16 || (count & (count - 1)) == 0; }

}  // namespace

// -- failing an endpoint -------------------------------------------------------------------------

bool worker_impl::count_limit_error() {
  ++limit_errors;
  return worth_logging(limit_errors);
}

void worker_impl::exceed_limit(endpoint_impl* ep, const char* variable, size_t limit) {
  const bool log = count_limit_error();
  ++ep->counters_.errors;
  if (log) {
    COMM_LOG(warn, "limits",
             "%s: endpoint to %s passed %s=%zu: failed with EXCEEDS_LIMIT (%llu so far)",
             params.name.c_str(), ep->peer_name_.c_str(), variable, limit,
             static_cast<unsigned long long>(limit_errors));
  }
  // Best effort: the peer's endpoint fails with NOT_CONNECTED instead of sending into the void.
  if (ep->state == endpoint_impl::phase::connected) (void)send_close_notice(ep);
  // Before fail(): its error handler may close the endpoint, which would keep the messages.
  forget_peer(*ep, held_fate::drop);
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

void worker_impl::detach_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs) {
  ep->unexpected_bytes -= bytes;
  ep->unexpected_msgs -= msgs;
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

}  // namespace comm::detail
