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
#define COMM_MEMBER(name) {#name, reinterpret_cast<const void*>(t.name)}
  return {COMM_MEMBER(get_device_list),      COMM_MEMBER(free_device_list),
          COMM_MEMBER(get_device_name),      COMM_MEMBER(open_device),
          COMM_MEMBER(close_device),         COMM_MEMBER(query_device),
          COMM_MEMBER(query_port),           COMM_MEMBER(query_gid),
          COMM_MEMBER(query_gid_ex),         COMM_MEMBER(get_async_event),
          COMM_MEMBER(ack_async_event),      COMM_MEMBER(alloc_pd),
          COMM_MEMBER(dealloc_pd),           COMM_MEMBER(reg_mr),
          COMM_MEMBER(dereg_mr),             COMM_MEMBER(create_comp_channel),
          COMM_MEMBER(destroy_comp_channel), COMM_MEMBER(create_cq),
          COMM_MEMBER(destroy_cq),           COMM_MEMBER(req_notify_cq),
          COMM_MEMBER(poll_cq),              COMM_MEMBER(get_cq_event),
          COMM_MEMBER(ack_cq_events),        COMM_MEMBER(create_srq),
          COMM_MEMBER(modify_srq),           COMM_MEMBER(destroy_srq),
          COMM_MEMBER(post_srq_recv),        COMM_MEMBER(create_qp),
          COMM_MEMBER(modify_qp),            COMM_MEMBER(query_qp),
          COMM_MEMBER(destroy_qp),           COMM_MEMBER(post_send),
          COMM_MEMBER(post_recv),            COMM_MEMBER(wc_status_str),
          COMM_MEMBER(event_type_str),       COMM_MEMBER(cm_event_str),
          COMM_MEMBER(create_event_channel), COMM_MEMBER(destroy_event_channel),
          COMM_MEMBER(create_id),            COMM_MEMBER(destroy_id),
          COMM_MEMBER(set_option),           COMM_MEMBER(bind_addr),
          COMM_MEMBER(listen),               COMM_MEMBER(resolve_addr),
          COMM_MEMBER(resolve_route),        COMM_MEMBER(get_src_port),
          COMM_MEMBER(get_dst_port),         COMM_MEMBER(create_qp_on_id),
          COMM_MEMBER(destroy_qp_on_id),     COMM_MEMBER(init_qp_attr),
          COMM_MEMBER(connect),              COMM_MEMBER(establish),
          COMM_MEMBER(accept),               COMM_MEMBER(reject),
          COMM_MEMBER(disconnect),           COMM_MEMBER(get_cm_event),
          COMM_MEMBER(ack_cm_event),         COMM_MEMBER(query_device_ex),
          COMM_MEMBER(create_cq_ex),         COMM_MEMBER(start_poll),
          COMM_MEMBER(next_poll),            COMM_MEMBER(end_poll),
          COMM_MEMBER(wc_read_opcode),       COMM_MEMBER(wc_read_byte_len),
          COMM_MEMBER(wc_read_imm_data),     COMM_MEMBER(wc_read_qp_num),
          COMM_MEMBER(wc_read_wc_flags),     COMM_MEMBER(wc_read_tm_info),
          COMM_MEMBER(create_srq_ex),        COMM_MEMBER(post_srq_ops)};
#undef COMM_MEMBER
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_rdma_core_table_is_filled_completely) {
  BOOST_TEST(R.size == sizeof(comm::verbs::api));
  BOOST_TEST(std::string(R.backend) == "rdma-core");
  BOOST_TEST(comm::verbs::provides(R, &comm::verbs::api::query_device_ex));
  BOOST_TEST(comm::verbs::provides(R, &comm::verbs::api::post_srq_ops));
  for (const auto& [name, pointer] : members(R)) {
    BOOST_TEST_CONTEXT(name) { BOOST_TEST(pointer != nullptr); }
  }
  BOOST_TEST(std::string(R.wc_status_str(IBV_WC_RETRY_EXC_ERR)) ==
             "transport retry counter exceeded");
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
