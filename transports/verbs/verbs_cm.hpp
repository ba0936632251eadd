// The rdmacm connection manager behind tl::cm: listen on "ip:port" of an RDMA device, connect
// with private data, accept or reject, and the outcome on both sides, with tcp_cm's semantics.
// rdmacm pads private data with zeros to its field size (56 bytes in a connect, 196 in an
// accept), so the data travels behind a small header that carries its own length. The
// connections exchange private data only (no QP rides on them); once a side of a short handshake
// is told on_established, its connection is disconnected and released.
//
// The client-server flow (cm::resolve, cm::accept_flow) maps onto rdmacm's own steps:
//   resolve         rdma_resolve_addr, then rdma_resolve_route; on_resolved names the device and
//                   port the id was bound to ("<device>:<port>", as the component's devices());
//                   ADDR_ERROR, ROUTE_ERROR or the timeout: on_resolved(unreachable)
//   connect         rdma_connect with the private data (given, or packed for that device)
//   on_connect      CONNECT_RESPONSE with the server's data; REJECTED (rejected, or unreachable
//                   when nobody listens), DISCONNECTED (connection_reset), the timeout
//   notify          rdma_establish: the server's ESTABLISHED is its on_notify(ok)
//   disconnect      rdma_disconnect; DISCONNECTED on either side is its on_disconnect. rdmacm
//                   completes the disconnect when the peer's CM answers it, so the side that
//                   disconnects first is told without waiting for the peer's owner.
// cm_attr: max_conn_priv 52, max_reply_priv 192. Addresses are numeric, "ip:port" or
// "[v6]:port" (rdma_resolve_addr takes socket addresses; names are invalid_addr here).
#pragma once

#include "verbs/verbs_api.hpp"

#include <comm/transport/transport.hpp>

#include <memory>

namespace comm::verbs {

/// Largest private data a client sends (a connect's 56 bytes less the header).
inline constexpr size_t max_cm_connect_data = 52;
/// Largest private data a server answers with (an accept's 196 bytes less the header).
inline constexpr size_t max_cm_accept_data = 192;

/// Opens an rdmacm connection manager over `table`. auth_key is not supported (the private data
/// is too small for a challenge): a non-empty key gives status::unsupported.
status open_verbs_cm(const api& table, const tl::cm_params& params, std::unique_ptr<tl::cm>& out);

}  // namespace comm::verbs
