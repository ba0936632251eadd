// The verbs transport's component: its devices ("<device>:<port>" for every active InfiniBand or
// RoCE port), why there are none ("no RDMA device: ..."), and interfaces and connection managers
// opened on them. It calls RDMA only through a verbs table, so the same component runs over
// rdma-core and over the verbs test device.
#pragma once

#include "verbs/verbs_api.hpp"
#include "verbs/verbs_iface.hpp"

#include <comm/transport/transport.hpp>

#include <memory>

namespace comm::verbs {

/// The verbs transport over `table`, with `config` (iface_params' fifo_size and segment_size,
/// when set, override rx_buffers and segment_size).
std::unique_ptr<tl::component> make_verbs_component(const api& table,
                                                    const verbs_config& config = {});

/// The verbs transport over rdma-core: the one libcomm's registry lists.
tl::component& verbs_component();

/// Makes the registered verbs_component() call `table` from now on. For tests that run the
/// registered transport over the verbs test device; call it before any interface is opened.
void use_verbs_table(const api& table);

}  // namespace comm::verbs

namespace comm::tl::verbs {

/// The registered verbs transport (the name the generated registry calls).
tl::component& verbs_component();

}  // namespace comm::tl::verbs
