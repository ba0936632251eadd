// The verbs table's real backend (libibverbs and librdmacm). On a machine without an RDMA device
// (every machine here: the kernel has no RDMA support) it checks the clean "no RDMA device"
// outcome; the cases that need a device run the same loopback the verbs test device passes, and
// are skipped, with the reason printed, where there is none.
#define BOOST_TEST_MODULE verbs_real
#include <boost/test/unit_test.hpp>

#include "verbs_util.hpp"

namespace {

const comm::verbs::api& R = comm::verbs::rdma_core_api();

/// Boost.Test precondition: the machine has a real RDMA device.
boost::test_tools::assertion_result has_rdma_device(boost::unit_test::test_unit_id) {
  const comm::verbs::device_probe probe = comm::verbs::probe_devices(R);
  boost::test_tools::assertion_result found(!probe.devices.empty());
  found.message() << "needs a real RDMA device (" << probe.reason << ")";
  return found;
}

/// Every function pointer of the table, by name.
std::vector<std::pair<const char*, const void*>> members(const comm::verbs::api& t) {
  const auto p = [](auto f) { return reinterpret_cast<const void*>(f); };
  return {{"get_device_list", p(t.get_device_list)}, {"free_device_list", p(t.free_device_list)},
          {"get_device_name", p(t.get_device_name)}, {"open_device", p(t.open_device)},
          {"close_device", p(t.close_device)}, {"query_device", p(t.query_device)},
          {"query_port", p(t.query_port)}, {"query_gid", p(t.query_gid)},
          {"query_gid_ex", p(t.query_gid_ex)}, {"get_async_event", p(t.get_async_event)},
          {"ack_async_event", p(t.ack_async_event)}, {"alloc_pd", p(t.alloc_pd)},
          {"dealloc_pd", p(t.dealloc_pd)}, {"reg_mr", p(t.reg_mr)}, {"dereg_mr", p(t.dereg_mr)},
          {"create_comp_channel", p(t.create_comp_channel)},
          {"destroy_comp_channel", p(t.destroy_comp_channel)}, {"create_cq", p(t.create_cq)},
          {"destroy_cq", p(t.destroy_cq)}, {"req_notify_cq", p(t.req_notify_cq)},
          {"poll_cq", p(t.poll_cq)}, {"get_cq_event", p(t.get_cq_event)},
          {"ack_cq_events", p(t.ack_cq_events)}, {"create_srq", p(t.create_srq)},
          {"modify_srq", p(t.modify_srq)}, {"destroy_srq", p(t.destroy_srq)},
          {"post_srq_recv", p(t.post_srq_recv)}, {"create_qp", p(t.create_qp)},
          {"modify_qp", p(t.modify_qp)}, {"query_qp", p(t.query_qp)},
          {"destroy_qp", p(t.destroy_qp)}, {"post_send", p(t.post_send)},
          {"post_recv", p(t.post_recv)}, {"wc_status_str", p(t.wc_status_str)},
          {"event_type_str", p(t.event_type_str)}, {"cm_event_str", p(t.cm_event_str)},
          {"create_event_channel", p(t.create_event_channel)},
          {"destroy_event_channel", p(t.destroy_event_channel)}, {"create_id", p(t.create_id)},
          {"destroy_id", p(t.destroy_id)}, {"set_option", p(t.set_option)},
          {"bind_addr", p(t.bind_addr)}, {"listen", p(t.listen)},
          {"resolve_addr", p(t.resolve_addr)}, {"resolve_route", p(t.resolve_route)},
          {"get_src_port", p(t.get_src_port)}, {"get_dst_port", p(t.get_dst_port)},
          {"create_qp_on_id", p(t.create_qp_on_id)}, {"destroy_qp_on_id", p(t.destroy_qp_on_id)},
          {"init_qp_attr", p(t.init_qp_attr)}, {"connect", p(t.connect)},
          {"establish", p(t.establish)}, {"accept", p(t.accept)}, {"reject", p(t.reject)},
          {"disconnect", p(t.disconnect)}, {"get_cm_event", p(t.get_cm_event)},
          {"ack_cm_event", p(t.ack_cm_event)}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_rdma_core_table_is_filled_completely) {
  BOOST_TEST(R.size == sizeof(comm::verbs::api));
  BOOST_TEST(std::string(R.backend) == "rdma-core");
  BOOST_TEST(comm::verbs::provides(R, &comm::verbs::api::ack_cm_event));
  for (const auto& [name, pointer] : members(R)) {
    BOOST_TEST_CONTEXT(name) { BOOST_TEST(pointer != nullptr); }
  }
  BOOST_TEST(std::string(R.wc_status_str(IBV_WC_RETRY_EXC_ERR)) == "transport retry counter exceeded");
  BOOST_TEST(std::string(R.cm_event_str(RDMA_CM_EVENT_REJECTED)) == "RDMA_CM_EVENT_REJECTED");
}

BOOST_AUTO_TEST_CASE(a_missing_device_is_reported_plainly_and_nothing_breaks) {
  const comm::verbs::device_probe probe = comm::verbs::probe_devices(R);
  BOOST_TEST_MESSAGE("devices: " << probe.devices.size() << "; reason: '" << probe.reason << "'");
  if (!probe.devices.empty()) {
    BOOST_TEST(probe.reason.empty());
    for (const std::string& name : probe.devices) BOOST_TEST(!name.empty());
    return;
  }
  BOOST_TEST(probe.reason.rfind("no RDMA device: ", 0) == 0u);
  BOOST_TEST(comm::verbs::probe_devices(R).reason == probe.reason);  // asking again is harmless
  errno = 0;
  rdma_event_channel* channel = R.create_event_channel();
  if (channel != nullptr) {
    R.destroy_event_channel(channel);  // librdmacm may work without a device; it just finds none
  } else {
    BOOST_TEST(errno != 0);
  }
}

BOOST_AUTO_TEST_CASE(a_loopback_exchange_on_a_real_device,
                     *boost::unit_test::precondition(has_rdma_device)) {
  const comm::verbs::device_probe probe = comm::verbs::probe_devices(R);
  BOOST_TEST(comm::test::verbs::loopback_exchange(R, probe.devices.front()) == "");
}

BOOST_AUTO_TEST_CASE(every_real_port_reports_a_usable_address,
                     *boost::unit_test::precondition(has_rdma_device)) {
  for (const std::string& name : comm::verbs::probe_devices(R).devices) {
    ibv_context* ctx = comm::test::verbs::open_device(R, name);
    ibv_device_attr attr{};
    BOOST_REQUIRE_EQUAL(R.query_device(ctx, &attr), 0);
    for (uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
      const comm::test::verbs::address a = comm::test::verbs::port_address(R, ctx, port);
      BOOST_TEST_CONTEXT(name << " port " << int(port)) { BOOST_TEST(a.gid_index >= 0); }
    }
    BOOST_TEST(R.close_device(ctx) == 0);
  }
}
