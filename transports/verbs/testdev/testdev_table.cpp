// The verbs test device's table: each part of the device fills its entries; the readable names
// come from rdma-core itself (they only map numbers to strings).
#include "verbs/testdev/fabric.hpp"

namespace comm::verbs::testdev {
namespace {

api make_table() {
  api t{};
  t.size = sizeof(api);
  t.backend = detail::log_name;
  detail::fill_resources(t);
  detail::fill_qp(t);
  detail::fill_wire(t);
  detail::fill_cm(t);
  detail::fill_tm(t);
  t.wc_status_str = ibv_wc_status_str;
  t.event_type_str = ibv_event_type_str;
  t.cm_event_str = rdma_event_str;
  return t;
}

}  // namespace

const api& table() noexcept {
  static const api filled = make_table();
  return filled;
}

}  // namespace comm::verbs::testdev
