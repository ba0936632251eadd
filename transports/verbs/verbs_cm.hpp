// The rdmacm connection manager behind tl::cm: listen on "ip:port" of an RDMA device, connect
// with private data, accept or reject, and the outcome on both sides, with tcp_cm's semantics.
// rdmacm pads private data with zeros to its field size (56 bytes in a connect, 196 in an
// accept), so the data travels behind a small header that carries its own length. The
// connections exchange private data only (no QP rides on them); once a side is told
// on_established, its connection is disconnected and released.
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
