// The verbs test device (transports/verbs/testdev), through the verbs table only, the way the
// verbs transport uses it: discovery, memory registration, the RC state machine, SEND/RECV with
// immediates, gather lists and inline data, ordering, SRQ consumption, RNR, RDMA WRITE/READ with
// their protection checks, reads in flight, completion channels, CQ overrun, flushes, async events
// and injected faults, and the test device's model of tag-matching SRQs and extended CQs. Every
// wait is bounded; nothing asserts on timing.
#define BOOST_TEST_MODULE verbs_test_device
#include <boost/test/unit_test.hpp>

#include "verbs/testdev/testdev.hpp"
#include "verbs_util.hpp"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <infiniband/tm_types.h>

#include <cstring>

#include <atomic>
#include <functional>
#include <thread>

namespace td = comm::verbs::testdev;
namespace tt = boost::test_tools;
using namespace comm::test::verbs;

namespace {

const comm::verbs::api& T = td::table();

/// The next async event of `ctx` (waits on its fd, bounded); fails the test when none comes.
ibv_async_event next_async_event(ibv_context* ctx) {
  BOOST_REQUIRE_MESSAGE(readable(ctx->async_fd, 10000), "no async event");
  ibv_async_event event{};
  BOOST_REQUIRE_EQUAL(T.get_async_event(ctx, &event), 0);
  return event;
}

/// Two RoCE devices, each opened once; leaks are checked when the test ends.
struct two_devices {
  td::fabric_scope scope;
  ibv_context* c0;
  ibv_context* c1;
  explicit two_devices(
      std::vector<td::device_spec> specs = {td::roce_device("testdev0", "10.0.0.1"),
                                            td::roce_device("testdev1", "10.0.0.2")})
      : scope(specs), c0(open_device(T, specs[0].name)), c1(open_device(T, specs[1].name)) {}
  ~two_devices() {
    T.close_device(c0);
    T.close_device(c1);
    BOOST_CHECK_EQUAL(scope.finish(), 0u);
  }
};

/// Two connected RC endpoints: a on testdev0, b on testdev1.
struct connected_pair : two_devices {
  endpoint a, b;
  explicit connected_pair(const qp_options& ao = {}, const qp_options& bo = {}) {
    build(T, a, c0, ao);
    build(T, b, c1, bo);
    BOOST_REQUIRE_EQUAL(connect(T, a, b), 0);
  }
};

qp_options with(std::function<void(qp_options&)> change) {
  qp_options o;
  change(o);
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(discovery)

BOOST_AUTO_TEST_CASE(lists_opens_and_queries_devices_and_gids) {
  td::fabric_scope scope(
      {td::roce_device("testdev0", "10.0.0.1"), td::ib_device("testdev1", "10.1.0.2")});
  const comm::verbs::device_probe probe = comm::verbs::probe_devices(T);
  BOOST_TEST(probe.devices == (std::vector<std::string>{"testdev0", "testdev1"}),
             tt::per_element());
  BOOST_TEST(probe.reason.empty());
  BOOST_TEST(std::string(T.backend) == "verbs test device");

  ibv_context* roce = open_device(T, "testdev0");
  ibv_device_attr attr{};
  BOOST_TEST(T.query_device(roce, &attr) == 0);
  BOOST_TEST(attr.max_qp_wr == 4096);
  BOOST_TEST(attr.max_qp_rd_atom == 16);
  BOOST_TEST(attr.phys_port_cnt == 1);
  ibv_port_attr port{};
  BOOST_TEST(T.query_port(roce, 1, &port) == 0);
  BOOST_TEST(port.link_layer == IBV_LINK_LAYER_ETHERNET);
  BOOST_TEST(port.state == IBV_PORT_ACTIVE);
  BOOST_TEST(port.gid_tbl_len == 4);
  BOOST_TEST(T.query_port(roce, 2, &port) == EINVAL);

  ibv_gid_entry entry{};
  BOOST_TEST(T.query_gid_ex(roce, 1, 3, &entry, 0) == 0);
  BOOST_TEST(entry.gid_type == IBV_GID_TYPE_ROCE_V2);
  const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
  BOOST_TEST(std::memcmp(entry.gid.raw, mapped, 16) == 0);
  BOOST_TEST(T.query_gid_ex(roce, 1, 2, &entry, 0) == 0);
  BOOST_TEST(entry.gid_type == IBV_GID_TYPE_ROCE_V1);
  ibv_gid gid{};
  errno = 0;
  BOOST_TEST(T.query_gid(roce, 1, 4, &gid) == -1);
  BOOST_TEST(errno == EINVAL);
  BOOST_TEST(port_address(T, roce, 1).gid_index == 3);  // RoCE v2, IPv4-mapped

  ibv_context* ib = open_device(T, "testdev1");
  BOOST_TEST(T.query_port(ib, 1, &port) == 0);
  BOOST_TEST(port.link_layer == IBV_LINK_LAYER_INFINIBAND);
  BOOST_TEST(port.lid != 0);
  BOOST_TEST(T.query_gid_ex(ib, 1, 0, &entry, 0) == 0);
  BOOST_TEST(entry.gid_type == IBV_GID_TYPE_IB);
  BOOST_TEST(T.close_device(roce) == 0);
  BOOST_TEST(T.close_device(ib) == 0);
  BOOST_TEST(scope.finish() == 0u);
}

BOOST_AUTO_TEST_CASE(without_a_fabric_there_is_no_device) {
  int n = -1;
  errno = 0;
  BOOST_TEST(T.get_device_list(&n) == nullptr);
  BOOST_TEST(errno == ENOSYS);
  const comm::verbs::device_probe none = comm::verbs::probe_devices(T);
  BOOST_TEST(none.devices.empty());
  BOOST_TEST(none.reason.find("no RDMA device") == 0u);
  BOOST_TEST(none.reason.find("Function not implemented") != std::string::npos);
  errno = 0;
  BOOST_TEST(T.create_event_channel() == nullptr);
  BOOST_TEST(errno == ENODEV);

  td::fabric_scope empty({});
  const comm::verbs::device_probe found = comm::verbs::probe_devices(T);
  BOOST_TEST(found.devices.empty());
  BOOST_TEST(found.reason == "no RDMA device: ibv_get_device_list found none");
}

BOOST_AUTO_TEST_CASE(a_loopback_exchange_on_one_device_works_on_roce_and_infiniband) {
  td::fabric_scope scope(
      {td::roce_device("testdev0", "10.0.0.1"), td::ib_device("testdev1", "10.1.0.1")});
  BOOST_TEST(loopback_exchange(T, "testdev0") == "");
  BOOST_TEST(loopback_exchange(T, "testdev1") == "");
  BOOST_TEST(scope.finish() == 0u);
}

BOOST_AUTO_TEST_CASE(infiniband_qps_on_two_devices_connect_by_lid) {
  two_devices f({td::ib_device("testdev0", "10.1.0.1"), td::ib_device("testdev1", "10.1.0.2")});
  endpoint a, b;
  build(T, a, f.c0);
  build(T, b, f.c1);
  BOOST_REQUIRE_EQUAL(connect(T, a, b), 0);
  BOOST_REQUIRE_EQUAL(post_receive(T, b, 0, 64, 1), 0);
  fill(a.buf.bytes.data(), 64, 9);
  BOOST_REQUIRE_EQUAL(post(T, a.qp, IBV_WR_SEND, {a.buf.sge(0, 64)}, 2), 0);
  const auto got = poll_n(T, b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(got.size(), 1u);
  BOOST_TEST(got[0].status == IBV_WC_SUCCESS);
  BOOST_TEST(got[0].slid != 0);
  BOOST_TEST(holds(b.buf.bytes.data(), 64, 9));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(memory)

BOOST_AUTO_TEST_CASE(registration_checks_flags_limits_and_ownership) {
  td::device_spec spec = td::roce_device("testdev0", "10.0.0.1");
  spec.limits.max_mr = 2;
  spec.limits.max_pd = 1;
  td::fabric_scope scope({spec});
  ibv_context* ctx = open_device(T, "testdev0");
  ibv_pd* pd = T.alloc_pd(ctx);
  BOOST_REQUIRE(pd != nullptr);
  errno = 0;
  BOOST_TEST(T.alloc_pd(ctx) == nullptr);
  BOOST_TEST(errno == ENOMEM);

  std::vector<uint8_t> bytes(4096);
  errno = 0;
  BOOST_TEST(T.reg_mr(pd, bytes.data(), bytes.size(), IBV_ACCESS_REMOTE_WRITE) == nullptr);
  BOOST_TEST(errno == EINVAL);  // remote write needs local write
  ibv_mr* a = T.reg_mr(pd, bytes.data(), 1024, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr* b = T.reg_mr(pd, bytes.data() + 1024, 1024, IBV_ACCESS_REMOTE_READ);
  BOOST_REQUIRE(a != nullptr);
  BOOST_REQUIRE(b != nullptr);
  BOOST_TEST(a->lkey == a->rkey);
  BOOST_TEST(a->lkey != b->lkey);
  BOOST_TEST(a->addr == bytes.data());
  BOOST_TEST(a->length == 1024u);
  errno = 0;
  BOOST_TEST(T.reg_mr(pd, bytes.data(), 16, IBV_ACCESS_LOCAL_WRITE) == nullptr);
  BOOST_TEST(errno == ENOMEM);  // max_mr

  BOOST_TEST(T.dealloc_pd(pd) == EBUSY);
  errno = 0;
  BOOST_TEST(T.close_device(ctx) == -1);
  BOOST_TEST(errno == EBUSY);
  BOOST_TEST(td::live_objects() == 4u);  // context, PD, two MRs
  BOOST_TEST(T.dereg_mr(a) == 0);
  BOOST_TEST(T.dereg_mr(b) == 0);
  BOOST_TEST(T.dealloc_pd(pd) == 0);
  BOOST_TEST(T.close_device(ctx) == 0);
  BOOST_TEST(scope.finish() == 0u);
}

BOOST_AUTO_TEST_CASE(uninstall_counts_what_was_left_behind) {
  td::fabric_scope scope({td::roce_device("testdev0", "10.0.0.1")});
  ibv_context* ctx = open_device(T, "testdev0");
  T.alloc_pd(ctx);
  BOOST_TEST(scope.finish() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(queue_pair)

BOOST_AUTO_TEST_CASE(creation_checks_capacities_and_type) {
  two_devices f;
  ibv_pd* pd = T.alloc_pd(f.c0);
  ibv_cq* cq = T.create_cq(f.c0, 16, nullptr, nullptr, 0);
  ibv_cq* other = T.create_cq(f.c1, 16, nullptr, nullptr, 0);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {16, 16, 2, 2, 32};
  const auto refused = [&](ibv_qp_init_attr attr, int error) {
    errno = 0;
    ibv_qp* qp = T.create_qp(pd, &attr);
    return qp == nullptr && errno == error;
  };
  ibv_qp_init_attr too_deep = init;
  too_deep.cap.max_send_wr = 5000;
  BOOST_TEST(refused(too_deep, EINVAL));
  ibv_qp_init_attr too_inline = init;
  too_inline.cap.max_inline_data = 257;
  BOOST_TEST(refused(too_inline, EINVAL));
  ibv_qp_init_attr uc = init;
  uc.qp_type = IBV_QPT_UC;
  BOOST_TEST(refused(uc, EOPNOTSUPP));
  ibv_qp_init_attr foreign = init;
  foreign.recv_cq = other;
  BOOST_TEST(refused(foreign, EINVAL));
  ibv_qp* qp = T.create_qp(pd, &init);
  BOOST_REQUIRE(qp != nullptr);
  BOOST_TEST(qp->state == IBV_QPS_RESET);
  BOOST_TEST(init.cap.max_inline_data == 32u);
  BOOST_TEST(T.destroy_cq(cq) == EBUSY);
  BOOST_TEST(T.destroy_qp(qp) == 0);
  BOOST_TEST(T.destroy_cq(cq) == 0);
  BOOST_TEST(T.destroy_cq(other) == 0);
  BOOST_TEST(T.dealloc_pd(pd) == 0);
}

BOOST_AUTO_TEST_CASE(state_machine_needs_each_transitions_attributes) {
  two_devices f;
  endpoint a, b;
  build(T, a, f.c0);
  build(T, b, f.c1);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  BOOST_TEST(T.modify_qp(a.qp, &attr, IBV_QP_STATE) == EINVAL);  // RESET -> RTR
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  BOOST_TEST(T.modify_qp(a.qp, &attr, IBV_QP_STATE | IBV_QP_PORT) == EINVAL);  // missing flags
  BOOST_TEST(T.modify_qp(a.qp, &attr,
                         IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS |
                             IBV_QP_TIMEOUT) == EINVAL);
  attr.port_num = 2;
  BOOST_TEST(T.modify_qp(a.qp, &attr,
                         IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS) ==
             EINVAL);  // no port 2
  BOOST_REQUIRE_EQUAL(to_init(T, a), 0);
  BOOST_REQUIRE_EQUAL(to_init(T, b), 0);
  BOOST_TEST(a.qp->state == IBV_QPS_INIT);

  ibv_sge sge = a.buf.sge(0, 8);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_send_wr* bad = nullptr;
  BOOST_TEST(T.post_send(a.qp, &wr, &bad) == EINVAL);  // not RTS
  BOOST_TEST(bad == &wr);
  BOOST_TEST(post_receive(T, a, 0, 8, 1) == 0);  // receives may be posted from INIT

  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  BOOST_TEST(T.modify_qp(a.qp, &attr, IBV_QP_STATE) == EINVAL);  // INIT -> RTS
  qp_options deep = a.options;
  deep.max_dest_rd_atomic = 17;
  std::swap(a.options, deep);
  BOOST_TEST(to_rtr(T, a, b) == EINVAL);  // above max_qp_rd_atom
  std::swap(a.options, deep);
  attr.qp_state = IBV_QPS_RTR;
  attr.dest_qp_num = b.qp->qp_num;
  attr.path_mtu = IBV_MTU_1024;
  const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  BOOST_TEST(T.modify_qp(a.qp, &attr, rtr_mask) == EINVAL);  // RoCE needs a GRH
  BOOST_REQUIRE_EQUAL(to_rtr(T, a, b), 0);
  BOOST_TEST(T.post_send(a.qp, &wr, &bad) == EINVAL);  // RTR cannot send
  a.options.max_rd_atomic = 17;
  BOOST_TEST(to_rts(T, a) == EINVAL);  // above max_qp_init_rd_atom
  a.options.max_rd_atomic = 4;
  BOOST_REQUIRE_EQUAL(to_rts(T, a), 0);

  ibv_qp_attr now{};
  ibv_qp_init_attr init{};
  BOOST_TEST(T.query_qp(a.qp, &now, IBV_QP_STATE, &init) == 0);
  BOOST_TEST(now.qp_state == IBV_QPS_RTS);
  BOOST_TEST(now.dest_qp_num == b.qp->qp_num);
  BOOST_TEST(now.timeout == 14);
  BOOST_TEST(now.max_rd_atomic == 4);
  BOOST_TEST(init.send_cq == a.send_cq);
  attr = ibv_qp_attr{};
  attr.min_rnr_timer = 12;
  BOOST_TEST(T.modify_qp(a.qp, &attr, IBV_QP_MIN_RNR_TIMER) == 0);  // RTS -> RTS
  attr.cur_qp_state = IBV_QPS_RTR;
  BOOST_TEST(T.modify_qp(a.qp, &attr, IBV_QP_CUR_STATE) == EINVAL);

  attr.qp_state = IBV_QPS_RESET;
  BOOST_TEST(T.modify_qp(a.qp, &attr, IBV_QP_STATE) == 0);
  BOOST_TEST(state_of(T, a.qp) == IBV_QPS_RESET);
  BOOST_TEST(poll_for(T, a.recv_cq, 5ms).empty());  // the receive went without a completion
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(send_receive)

BOOST_AUTO_TEST_CASE(send_with_immediate_fills_both_completions) {
  connected_pair p;
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 4096, 11), 0);
  fill(p.a.buf.bytes.data(), 100, 4);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND_WITH_IMM, {p.a.buf.sge(0, 100)}, 21,
                           IBV_SEND_SOLICITED, 0, 0, htonl(0x1234)),
                      0);
  const auto recv = poll_n(T, p.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(recv.size(), 1u);
  BOOST_TEST(recv[0].status == IBV_WC_SUCCESS);
  BOOST_TEST(recv[0].opcode == IBV_WC_RECV);
  BOOST_TEST(recv[0].wr_id == 11u);
  BOOST_TEST(recv[0].byte_len == 100u);
  BOOST_TEST((recv[0].wc_flags & IBV_WC_WITH_IMM) != 0);
  BOOST_TEST(ntohl(recv[0].imm_data) == 0x1234u);
  BOOST_TEST(recv[0].qp_num == p.b.qp->qp_num);
  BOOST_TEST(recv[0].src_qp == p.a.qp->qp_num);
  BOOST_TEST(holds(p.b.buf.bytes.data(), 100, 4));
  const auto sent = poll_n(T, p.a.send_cq, 1);
  BOOST_REQUIRE_EQUAL(sent.size(), 1u);
  BOOST_TEST(sent[0].opcode == IBV_WC_SEND);
  BOOST_TEST(sent[0].wr_id == 21u);
}

BOOST_AUTO_TEST_CASE(gather_list_lands_in_scatter_list_in_order) {
  connected_pair p;
  ibv_sge scatter[2] = {p.b.buf.sge(1000, 25), p.b.buf.sge(5000, 100)};
  ibv_recv_wr rwr{};
  rwr.wr_id = 1;
  rwr.sg_list = scatter;
  rwr.num_sge = 2;
  ibv_recv_wr* rbad = nullptr;
  BOOST_REQUIRE_EQUAL(T.post_recv(p.b.qp, &rwr, &rbad), 0);
  std::vector<uint8_t> expected;
  for (size_t off : {0, 300, 700}) fill(p.a.buf.bytes.data() + off, 20, static_cast<uint8_t>(off));
  for (size_t off : {0, 300, 700}) {
    expected.insert(expected.end(), p.a.buf.bytes.begin() + off, p.a.buf.bytes.begin() + off + 20);
  }
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND,
                           {p.a.buf.sge(0, 20), p.a.buf.sge(300, 20), p.a.buf.sge(700, 20)}, 2),
                      0);
  const auto recv = poll_n(T, p.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(recv.size(), 1u);
  BOOST_TEST(recv[0].byte_len == 60u);
  std::vector<uint8_t> got(p.b.buf.bytes.begin() + 1000, p.b.buf.bytes.begin() + 1025);
  got.insert(got.end(), p.b.buf.bytes.begin() + 5000, p.b.buf.bytes.begin() + 5035);
  BOOST_TEST(got == expected, tt::per_element());
}

BOOST_AUTO_TEST_CASE(inline_data_is_copied_when_posted_without_a_key) {
  connected_pair p(with([](qp_options& o) { o.max_inline = 64; }));
  fill(p.a.buf.bytes.data(), 48, 5);
  ibv_sge sge{p.a.buf.addr(), 48, 0};  // no lkey: inline data is not read through an MR
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {sge}, 1, IBV_SEND_INLINE), 0);
  std::memset(p.a.buf.bytes.data(), 0, 48);  // while the SEND waits for a receive (RNR)
  BOOST_REQUIRE(eventually([] { return td::stats().rnr_naks >= 1; }));
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 64, 2), 0);
  BOOST_REQUIRE_EQUAL(poll_n(T, p.b.recv_cq, 1).size(), 1u);
  BOOST_TEST(holds(p.b.buf.bytes.data(), 48, 5));
  ibv_sge big{p.a.buf.addr(), 65, 0};
  BOOST_TEST(post(T, p.a.qp, IBV_WR_SEND, {big}, 3, IBV_SEND_INLINE) == EINVAL);
}

BOOST_AUTO_TEST_CASE(a_zero_length_send_consumes_a_receive) {
  connected_pair p;
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 64, 5), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {}, 1), 0);
  const auto recv = poll_n(T, p.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(recv.size(), 1u);
  BOOST_TEST(recv[0].byte_len == 0u);
  BOOST_TEST(recv[0].wr_id == 5u);
}

BOOST_AUTO_TEST_CASE(messages_and_completions_keep_posting_order) {
  connected_pair p(with([](qp_options& o) { o.max_send_wr = 256; }),
                   with([](qp_options& o) { o.max_recv_wr = 256; }));
  constexpr uint32_t n = 256;
  for (uint32_t i = 0; i < n; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, p.b, i * 4, 4, i), 0);
  for (uint32_t i = 0; i < n; ++i) {
    std::memcpy(p.a.buf.bytes.data() + 2048 + i * 4, &i, 4);
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(2048 + i * 4, 4)}, 1000 + i), 0);
  }
  const auto recv = poll_n(T, p.b.recv_cq, n);
  const auto sent = poll_n(T, p.a.send_cq, n);
  BOOST_REQUIRE_EQUAL(recv.size(), n);
  BOOST_REQUIRE_EQUAL(sent.size(), n);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t value = 0;
    std::memcpy(&value, p.b.buf.bytes.data() + i * 4, 4);
    BOOST_TEST(recv[i].wr_id == i);
    BOOST_TEST(value == i);
    BOOST_TEST(sent[i].wr_id == 1000 + i);
  }
}

BOOST_AUTO_TEST_CASE(unsignaled_sends_hold_their_slots_until_a_signaled_one_is_polled) {
  connected_pair p(with([](qp_options& o) {
    o.sig_all = false;
    o.max_send_wr = 4;
  }));
  for (int i = 0; i < 8; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, p.b, i * 8, 8, i), 0);
  for (int i = 0; i < 3; ++i)
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, i), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 3, IBV_SEND_SIGNALED), 0);
  BOOST_TEST(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 4) == ENOMEM);
  BOOST_REQUIRE_EQUAL(poll_n(T, p.b.recv_cq, 4).size(), 4u);
  BOOST_TEST(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 4) == ENOMEM);  // nothing polled
  const auto sent = poll_n(T, p.a.send_cq, 1);
  BOOST_REQUIRE_EQUAL(sent.size(), 1u);
  BOOST_TEST(sent[0].wr_id == 3u);  // one completion for four requests
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 10 + i, IBV_SEND_SIGNALED) == 0);
  }
  BOOST_REQUIRE_EQUAL(poll_n(T, p.a.send_cq, 4).size(), 4u);
}

BOOST_AUTO_TEST_CASE(post_time_errors_name_the_first_request_not_posted) {
  connected_pair p(with([](qp_options& o) { o.max_sge = 2; }));
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 64, 1), 0);
  ibv_sge one = p.a.buf.sge(0, 8);
  ibv_sge three[3] = {one, one, one};
  ibv_send_wr second{};
  second.opcode = IBV_WR_SEND;
  second.sg_list = three;
  second.num_sge = 3;
  ibv_send_wr first{};
  first.wr_id = 7;
  first.opcode = IBV_WR_SEND;
  first.sg_list = &one;
  first.num_sge = 1;
  first.next = &second;
  ibv_send_wr* bad = nullptr;
  BOOST_TEST(T.post_send(p.a.qp, &first, &bad) == EINVAL);
  BOOST_TEST(bad == &second);
  const auto sent = poll_n(T, p.a.send_cq, 1);  // the first one went
  BOOST_REQUIRE_EQUAL(sent.size(), 1u);
  BOOST_TEST(sent[0].wr_id == 7u);
  BOOST_TEST(post(T, p.a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, {one}, 8) == EINVAL);
  BOOST_TEST(post(T, p.a.qp, IBV_WR_RDMA_READ, {one}, 9, IBV_SEND_INLINE, p.b.buf.addr(),
                  p.b.buf.mr->rkey) == EINVAL);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(shared_receive_queue)

BOOST_AUTO_TEST_CASE(receives_are_taken_in_order_by_every_qp_on_it) {
  two_devices f;
  ibv_pd* pd = T.alloc_pd(f.c1);
  ibv_srq_init_attr sattr{};
  sattr.attr.max_wr = 8;
  sattr.attr.max_sge = 2;
  ibv_srq* srq = T.create_srq(pd, &sattr);
  BOOST_REQUIRE(srq != nullptr);
  endpoint a1, a2, b1, b2;
  build(T, a1, f.c0);
  build(T, a2, f.c0);
  build(T, b1, f.c1, {}, srq, pd);
  build(T, b2, f.c1, {}, srq, pd);
  BOOST_REQUIRE_EQUAL(connect(T, a1, b1), 0);
  BOOST_REQUIRE_EQUAL(connect(T, a2, b2), 0);
  for (int i = 0; i < 4; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, b1, i * 16, 16, 100 + i), 0);
  BOOST_TEST(T.post_recv(b1.qp, nullptr, nullptr) == EINVAL);  // a QP on an SRQ has no RQ
  ibv_srq_attr limit{};
  limit.srq_limit = 2;
  BOOST_REQUIRE_EQUAL(T.modify_srq(srq, &limit, IBV_SRQ_LIMIT), 0);

  fill(a1.buf.bytes.data(), 16, 1);
  fill(a2.buf.bytes.data(), 16, 2);
  BOOST_REQUIRE_EQUAL(post(T, a1.qp, IBV_WR_SEND, {a1.buf.sge(0, 16)}, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, a2.qp, IBV_WR_SEND, {a2.buf.sge(0, 16)}, 2), 0);
  BOOST_REQUIRE_EQUAL(post(T, a1.qp, IBV_WR_SEND, {a1.buf.sge(0, 16)}, 3), 0);
  auto got = poll_n(T, b1.recv_cq, 2);
  auto more = poll_n(T, b2.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(got.size(), 2u);
  BOOST_REQUIRE_EQUAL(more.size(), 1u);
  BOOST_TEST(got[0].wr_id == 100u);
  BOOST_TEST(more[0].wr_id == 101u);
  BOOST_TEST(more[0].qp_num == b2.qp->qp_num);
  BOOST_TEST(got[1].wr_id == 102u);
  BOOST_TEST(holds(b1.buf.bytes.data() + 16, 16, 2));  // a2's bytes in the second receive
  ibv_async_event low = next_async_event(f.c1);
  BOOST_TEST(low.event_type == IBV_EVENT_SRQ_LIMIT_REACHED);
  BOOST_TEST(low.element.srq == srq);
  T.ack_async_event(&low);

  for (int i = 0; i < 7; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, b1, 0, 16, 200 + i), 0);
  BOOST_TEST(post_receive(T, b1, 0, 16, 300) == ENOMEM);  // 8 slots in use
  BOOST_TEST(T.destroy_srq(srq) == EBUSY);

  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  BOOST_REQUIRE_EQUAL(T.modify_qp(b1.qp, &err, IBV_QP_STATE), 0);
  ibv_async_event last = next_async_event(f.c1);
  BOOST_TEST(last.event_type == IBV_EVENT_QP_LAST_WQE_REACHED);
  BOOST_TEST(last.element.qp == b1.qp);
  T.ack_async_event(&last);
  BOOST_TEST(poll_for(T, b1.recv_cq, 5ms).empty());  // SRQ receives are not flushed
  BOOST_REQUIRE_EQUAL(post(T, a2.qp, IBV_WR_SEND, {a2.buf.sge(0, 16)}, 4), 0);
  BOOST_TEST(poll_n(T, b2.recv_cq, 1).size() == 1u);  // b2 still takes them

  b1.release();
  b2.release();
  BOOST_TEST(T.destroy_srq(srq) == 0);
  BOOST_TEST(T.dealloc_pd(pd) == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(receiver_not_ready)

BOOST_AUTO_TEST_CASE(rnr_retries_run_out_and_the_qp_goes_to_error) {
  connected_pair p(with([](qp_options& o) { o.rnr_retry = 2; }));
  const uint64_t before = td::stats().rnr_naks;
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 2), 0);
  const auto sent = poll_n(T, p.a.send_cq, 2);
  BOOST_REQUIRE_EQUAL(sent.size(), 2u);
  BOOST_TEST(sent[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
  BOOST_TEST(sent[0].wr_id == 1u);
  BOOST_TEST(sent[1].status == IBV_WC_WR_FLUSH_ERR);
  BOOST_TEST(td::stats().rnr_naks - before == 3u);  // the first try and two retries
  BOOST_TEST(state_of(T, p.a.qp) == IBV_QPS_ERR);
  BOOST_TEST(state_of(T, p.b.qp) == IBV_QPS_RTS);  // RNR does not hurt the responder
}

BOOST_AUTO_TEST_CASE(with_rnr_retry_7_a_send_waits_until_a_receive_is_posted) {
  connected_pair p;
  const uint64_t before = td::stats().rnr_naks;
  fill(p.a.buf.bytes.data(), 32, 8);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 32)}, 1), 0);
  BOOST_REQUIRE(eventually([&] { return td::stats().rnr_naks - before >= 8; }));
  BOOST_TEST(poll_for(T, p.a.send_cq, 2ms).empty());
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 32, 9), 0);
  const auto sent = poll_n(T, p.a.send_cq, 1);
  BOOST_REQUIRE_EQUAL(sent.size(), 1u);
  BOOST_TEST(sent[0].status == IBV_WC_SUCCESS);
  BOOST_REQUIRE_EQUAL(poll_n(T, p.b.recv_cq, 1).size(), 1u);
  BOOST_TEST(holds(p.b.buf.bytes.data(), 32, 8));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rdma)

BOOST_AUTO_TEST_CASE(write_read_and_write_with_immediate_move_the_bytes) {
  connected_pair p;
  fill(p.a.buf.bytes.data(), 300, 1);
  BOOST_REQUIRE_EQUAL(
      post(T, p.a.qp, IBV_WR_RDMA_WRITE, {p.a.buf.sge(0, 100), p.a.buf.sge(100, 200)}, 1, 0,
           p.b.buf.addr(4096), p.b.buf.mr->rkey),
      0);
  auto sent = poll_n(T, p.a.send_cq, 1);
  BOOST_REQUIRE_EQUAL(sent.size(), 1u);
  BOOST_TEST(sent[0].opcode == IBV_WC_RDMA_WRITE);
  BOOST_TEST(holds(p.b.buf.bytes.data() + 4096, 300, 1));
  BOOST_TEST(poll_for(T, p.b.recv_cq, 2ms).empty());  // a plain WRITE consumes no receive

  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 77), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, {p.a.buf.sge(0, 50)}, 2, 0,
                           p.b.buf.addr(8192), p.b.buf.mr->rkey, htonl(99)),
                      0);
  const auto recv = poll_n(T, p.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(recv.size(), 1u);
  BOOST_TEST(recv[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  BOOST_TEST(recv[0].wr_id == 77u);
  BOOST_TEST(recv[0].byte_len == 50u);
  BOOST_TEST(ntohl(recv[0].imm_data) == 99u);
  BOOST_TEST(holds(p.b.buf.bytes.data() + 8192, 50, 1));

  fill(p.b.buf.bytes.data() + 20000, 500, 6);
  BOOST_REQUIRE_EQUAL(
      post(T, p.a.qp, IBV_WR_RDMA_READ, {p.a.buf.sge(30000, 200), p.a.buf.sge(31000, 300)}, 3, 0,
           p.b.buf.addr(20000), p.b.buf.mr->rkey),
      0);
  sent = poll_n(T, p.a.send_cq, 2);
  BOOST_REQUIRE_EQUAL(sent.size(), 2u);
  BOOST_TEST(sent[1].opcode == IBV_WC_RDMA_READ);
  BOOST_TEST(sent[1].byte_len == 500u);
  std::vector<uint8_t> read(p.a.buf.bytes.begin() + 30000, p.a.buf.bytes.begin() + 30200);
  read.insert(read.end(), p.a.buf.bytes.begin() + 31000, p.a.buf.bytes.begin() + 31300);
  BOOST_TEST(holds(read.data(), 500, 6));
  BOOST_TEST(post(T, p.a.qp, IBV_WR_RDMA_WRITE, {}, 4, 0, 0, 0xdead) == 0);  // zero length: no key
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_SUCCESS);
}

/// One remote access that must fail, what the requester sees, and the responder's async event.
struct bad_access {
  const char* name;
  ibv_wr_opcode opcode;
  ibv_wc_status status;
  ibv_event_type responder_event;
};

BOOST_AUTO_TEST_CASE(remote_access_errors_fail_both_sides) {
  const bad_access cases[] = {
      {"bad rkey", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR},
      {"one byte past the end", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR},
      {"MR without remote write", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR,
       IBV_EVENT_QP_ACCESS_ERR},
      {"MR in another PD", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR},
      {"stale rkey", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR},
      {"MR without remote read", IBV_WR_RDMA_READ, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR},
      {"QP without remote write", IBV_WR_RDMA_WRITE, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR},
      {"QP without remote read", IBV_WR_RDMA_READ, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR},
  };
  for (const bad_access& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      const std::string name = c.name;
      qp_options bo;
      if (name == "QP without remote write") bo.access = IBV_ACCESS_REMOTE_READ;
      if (name == "QP without remote read") bo.access = IBV_ACCESS_REMOTE_WRITE;
      connected_pair p({}, bo);
      uint64_t addr = p.b.buf.addr(1024);
      uint32_t rkey = p.b.buf.mr->rkey;
      ibv_pd* other_pd = nullptr;
      ibv_mr* extra = nullptr;
      if (name == "bad rkey") rkey ^= 0x5a5a;
      if (name == "one byte past the end") addr = p.b.buf.addr(p.b.buf.bytes.size() - 99);
      if (name == "MR without remote write" || name == "MR without remote read") {
        const int access = name == "MR without remote write"
                               ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
                               : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        extra = T.reg_mr(p.b.pd, p.b.buf.bytes.data(), 4096, access);
        addr = p.b.buf.addr(0);
        rkey = extra->rkey;
      }
      if (name == "MR in another PD") {
        other_pd = T.alloc_pd(p.c1);
        extra = T.reg_mr(other_pd, p.b.buf.bytes.data(), 4096,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        addr = p.b.buf.addr(0);
        rkey = extra->rkey;
      }
      if (name == "stale rkey") {
        extra = T.reg_mr(p.b.pd, p.b.buf.bytes.data(), 4096,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        rkey = extra->rkey;
        addr = p.b.buf.addr(0);
        T.dereg_mr(extra);
        extra = nullptr;
      }
      BOOST_REQUIRE_EQUAL(post(T, p.a.qp, c.opcode, {p.a.buf.sge(0, 100)}, 1, 0, addr, rkey), 0);
      BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 2), 0);
      const auto sent = poll_n(T, p.a.send_cq, 2);
      BOOST_REQUIRE_EQUAL(sent.size(), 2u);
      BOOST_TEST(sent[0].status == c.status);
      BOOST_TEST(sent[0].opcode == static_cast<ibv_wc_opcode>(0xff));  // undefined on error
      BOOST_TEST(sent[1].status == IBV_WC_WR_FLUSH_ERR);
      BOOST_TEST(state_of(T, p.a.qp) == IBV_QPS_ERR);
      BOOST_TEST(state_of(T, p.b.qp) == IBV_QPS_ERR);
      ibv_async_event event = next_async_event(p.c1);
      BOOST_TEST(event.event_type == c.responder_event);
      BOOST_TEST(event.element.qp == p.b.qp);
      T.ack_async_event(&event);
      if (extra != nullptr) T.dereg_mr(extra);
      if (other_pd != nullptr) T.dealloc_pd(other_pd);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(reads_in_flight)

/// Holds READ responses for the life of the guard.
struct held_reads {
  held_reads() { td::hold_read_responses(true); }
  ~held_reads() { td::hold_read_responses(false); }
};

BOOST_AUTO_TEST_CASE(a_read_beyond_max_rd_atomic_stalls_the_send_queue) {
  connected_pair p(with([](qp_options& o) { o.max_rd_atomic = 2; }),
                   with([](qp_options& o) { o.max_dest_rd_atomic = 2; }));
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 50), 0);
  {
    held_reads hold;
    for (int i = 0; i < 3; ++i) {
      BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_READ, {p.a.buf.sge(i * 64, 64)}, i, 0,
                               p.b.buf.addr(i * 64), p.b.buf.mr->rkey),
                          0);
    }
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 3), 0);
    BOOST_TEST(poll_for(T, p.b.recv_cq, 20ms).empty());  // the SEND waits behind the third READ
    BOOST_TEST(poll_for(T, p.a.send_cq, 2ms).empty());
  }
  const auto sent = poll_n(T, p.a.send_cq, 4);
  BOOST_REQUIRE_EQUAL(sent.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    BOOST_TEST(sent[i].wr_id == i);
    BOOST_TEST(sent[i].status == IBV_WC_SUCCESS);
  }
  BOOST_TEST(td::stats().read_responses == 3u);
  BOOST_TEST(poll_n(T, p.b.recv_cq, 1).size() == 1u);
}

BOOST_AUTO_TEST_CASE(within_the_limit_a_send_passes_reads_in_flight_but_completes_after_them) {
  connected_pair p(with([](qp_options& o) { o.max_rd_atomic = 2; }),
                   with([](qp_options& o) { o.max_dest_rd_atomic = 2; }));
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 50), 0);
  {
    held_reads hold;
    for (int i = 0; i < 2; ++i) {
      BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_READ, {p.a.buf.sge(i * 64, 64)}, i, 0,
                               p.b.buf.addr(i * 64), p.b.buf.mr->rkey),
                          0);
    }
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 2), 0);
    BOOST_TEST(poll_n(T, p.b.recv_cq, 1).size() == 1u);  // delivered while the READs fly
    BOOST_TEST(poll_for(T, p.a.send_cq, 5ms).empty());   // but not completed before them
  }
  const auto sent = poll_n(T, p.a.send_cq, 3);
  BOOST_REQUIRE_EQUAL(sent.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) BOOST_TEST(sent[i].wr_id == i);
}

BOOST_AUTO_TEST_CASE(a_fenced_send_waits_for_the_reads_before_it) {
  connected_pair p;
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 50), 0);
  {
    held_reads hold;
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_READ, {p.a.buf.sge(0, 64)}, 1, 0,
                             p.b.buf.addr(0), p.b.buf.mr->rkey),
                        0);
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 2, IBV_SEND_FENCE), 0);
    BOOST_TEST(poll_for(T, p.b.recv_cq, 20ms).empty());
  }
  BOOST_TEST(poll_n(T, p.b.recv_cq, 1).size() == 1u);
  BOOST_TEST(poll_n(T, p.a.send_cq, 2).size() == 2u);
}

BOOST_AUTO_TEST_CASE(more_reads_than_the_responder_takes_fail_after_the_earlier_ones) {
  connected_pair p(with([](qp_options& o) { o.max_rd_atomic = 4; }),
                   with([](qp_options& o) { o.max_dest_rd_atomic = 2; }));
  fill(p.b.buf.bytes.data(), 64, 3);
  {
    held_reads hold;
    for (int i = 0; i < 3; ++i) {
      BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_READ, {p.a.buf.sge(1024 + i * 64, 64)}, i, 0,
                               p.b.buf.addr(0), p.b.buf.mr->rkey),
                          0);
    }
    const auto sent = poll_n(T, p.a.send_cq, 3);
    BOOST_REQUIRE_EQUAL(sent.size(), 3u);
    BOOST_TEST(sent[0].status == IBV_WC_SUCCESS);
    BOOST_TEST(sent[1].status == IBV_WC_SUCCESS);
    BOOST_TEST(sent[2].status == IBV_WC_REM_INV_REQ_ERR);
    BOOST_TEST(holds(p.a.buf.bytes.data() + 1024, 64, 3));
    BOOST_TEST(holds(p.a.buf.bytes.data() + 1088, 64, 3));
  }
  ibv_async_event event = next_async_event(p.c1);
  BOOST_TEST(event.event_type == IBV_EVENT_QP_REQ_ERR);
  T.ack_async_event(&event);
  BOOST_TEST(state_of(T, p.b.qp) == IBV_QPS_ERR);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(local_errors)

BOOST_AUTO_TEST_CASE(a_bad_local_key_fails_only_the_requester) {
  connected_pair p;
  ibv_sge bad{p.a.buf.addr(), 8, 0xbad};
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {bad}, 1), 0);
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_LOC_PROT_ERR);
  BOOST_TEST(state_of(T, p.a.qp) == IBV_QPS_ERR);
  BOOST_TEST(state_of(T, p.b.qp) == IBV_QPS_RTS);
}

BOOST_AUTO_TEST_CASE(a_read_into_memory_without_local_write_is_a_protection_error) {
  connected_pair p;
  std::vector<uint8_t> target(64);
  ibv_mr* ro = T.reg_mr(p.a.pd, target.data(), target.size(), IBV_ACCESS_REMOTE_READ);
  BOOST_REQUIRE(ro != nullptr);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_READ,
                           {ibv_sge{reinterpret_cast<uint64_t>(target.data()), 64, ro->lkey}}, 1, 0,
                           p.b.buf.addr(), p.b.buf.mr->rkey),
                      0);
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_LOC_PROT_ERR);
  T.dereg_mr(ro);
}

BOOST_AUTO_TEST_CASE(a_send_longer_than_the_receive_fails_both_sides) {
  connected_pair p;
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 16, 5), 0);
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 16, 16, 6), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 17)}, 1), 0);
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_REM_INV_REQ_ERR);
  const auto recv = poll_n(T, p.b.recv_cq, 2);
  BOOST_REQUIRE_EQUAL(recv.size(), 2u);
  BOOST_TEST(recv[0].status == IBV_WC_LOC_LEN_ERR);
  BOOST_TEST(recv[0].wr_id == 5u);
  BOOST_TEST(recv[1].status == IBV_WC_WR_FLUSH_ERR);
  BOOST_TEST(recv[1].wr_id == 6u);
  BOOST_TEST(state_of(T, p.b.qp) == IBV_QPS_ERR);
}

BOOST_AUTO_TEST_CASE(a_receive_with_a_bad_key_is_the_responders_protection_error) {
  connected_pair p;
  ibv_sge bad{p.b.buf.addr(), 64, 0xbad};
  ibv_recv_wr wr{};
  wr.wr_id = 3;
  wr.sg_list = &bad;
  wr.num_sge = 1;
  ibv_recv_wr* bad_wr = nullptr;
  BOOST_REQUIRE_EQUAL(T.post_recv(p.b.qp, &wr, &bad_wr), 0);  // keys are checked on arrival
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_REM_OP_ERR);
  BOOST_TEST(poll_n(T, p.b.recv_cq, 1).at(0).status == IBV_WC_LOC_PROT_ERR);
}

BOOST_AUTO_TEST_CASE(a_message_over_max_msg_sz_is_a_local_length_error) {
  td::device_spec small0 = td::roce_device("testdev0", "10.0.0.1");
  small0.limits.max_msg_sz = 1024;
  two_devices f({small0, td::roce_device("testdev1", "10.0.0.2")});
  endpoint a, b;
  build(T, a, f.c0);
  build(T, b, f.c1);
  BOOST_REQUIRE_EQUAL(connect(T, a, b), 0);
  BOOST_REQUIRE_EQUAL(
      post(T, a.qp, IBV_WR_RDMA_WRITE, {a.buf.sge(0, 1025)}, 1, 0, b.buf.addr(), b.buf.mr->rkey),
      0);
  BOOST_TEST(poll_n(T, a.send_cq, 1).at(0).status == IBV_WC_LOC_LEN_ERR);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(completion)

BOOST_AUTO_TEST_CASE(an_armed_cq_raises_one_event_on_its_channel) {
  connected_pair p;
  const int fd = p.b.channel->fd;
  for (int i = 0; i < 4; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, p.b, i * 8, 8, i), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(!readable(fd));  // not armed
  BOOST_REQUIRE_EQUAL(T.req_notify_cq(p.b.recv_cq, 0), 0);
  BOOST_TEST(!readable(fd));  // an entry already there does not count
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 2), 0);
  BOOST_TEST(readable(fd));
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  BOOST_REQUIRE_EQUAL(T.get_cq_event(p.b.channel, &cq, &context), 0);
  BOOST_TEST(cq == p.b.recv_cq);
  BOOST_TEST(context == &p.b);
  BOOST_TEST(!readable(fd));
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 3), 0);
  BOOST_TEST(!readable(fd));  // one event per arming

  BOOST_REQUIRE_EQUAL(T.destroy_qp(p.b.qp), 0);
  p.b.qp = nullptr;
  BOOST_TEST(T.destroy_cq(p.b.recv_cq) == EBUSY);  // rdma-core would block: event not acked
  T.ack_cq_events(p.b.recv_cq, 1);
  BOOST_TEST(T.destroy_cq(p.b.recv_cq) == 0);
  p.b.recv_cq = nullptr;
}

BOOST_AUTO_TEST_CASE(solicited_only_waits_for_a_solicited_completion) {
  connected_pair p;
  for (int i = 0; i < 2; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, p.b, i * 8, 8, i), 0);
  BOOST_REQUIRE_EQUAL(T.req_notify_cq(p.b.recv_cq, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(!readable(p.b.channel->fd));
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 2, IBV_SEND_SOLICITED), 0);
  BOOST_TEST(readable(p.b.channel->fd));
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  BOOST_REQUIRE_EQUAL(T.get_cq_event(p.b.channel, &cq, &context), 0);
  T.ack_cq_events(cq, 1);
}

BOOST_AUTO_TEST_CASE(a_non_blocking_channel_says_eagain_and_a_blocking_one_wakes_a_waiter) {
  connected_pair p;
  const int fd = p.b.channel->fd;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  errno = 0;
  BOOST_TEST(T.get_cq_event(p.b.channel, &cq, &context) == -1);
  BOOST_TEST(errno == EAGAIN);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);

  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 1), 0);
  BOOST_REQUIRE_EQUAL(T.req_notify_cq(p.b.recv_cq, 0), 0);
  std::atomic<int> woke{-2};
  std::thread waiter([&] {
    ibv_cq* got = nullptr;
    void* ctx = nullptr;
    woke = T.get_cq_event(p.b.channel, &got, &ctx) == 0 && got == p.b.recv_cq ? 1 : -1;
  });
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  waiter.join();
  BOOST_TEST(woke.load() == 1);
  T.ack_cq_events(p.b.recv_cq, 1);
}

BOOST_AUTO_TEST_CASE(an_overrun_cq_raises_cq_err_and_fails_its_qps) {
  connected_pair p({}, with([](qp_options& o) { o.cqe = 2; }));
  for (int i = 0; i < 3; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, p.b, i * 8, 8, i), 0);
  for (int i = 0; i < 3; ++i)
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, i), 0);
  ibv_async_event overrun = next_async_event(p.c1);
  BOOST_TEST(overrun.event_type == IBV_EVENT_CQ_ERR);
  BOOST_TEST(overrun.element.cq == p.b.recv_cq);
  T.ack_async_event(&overrun);
  ibv_async_event fatal = next_async_event(p.c1);
  BOOST_TEST(fatal.event_type == IBV_EVENT_QP_FATAL);
  BOOST_TEST(fatal.element.qp == p.b.qp);
  T.ack_async_event(&fatal);
  BOOST_TEST(state_of(T, p.b.qp) == IBV_QPS_ERR);
  BOOST_TEST(poll_n(T, p.b.recv_cq, 3, 20ms).size() == 2u);  // the third was lost

  BOOST_REQUIRE_EQUAL(td::overrun_cq(p.a.send_cq), 0);  // and as an injected fault
  ibv_async_event injected = next_async_event(p.c0);
  BOOST_TEST(injected.event_type == IBV_EVENT_CQ_ERR);
  T.ack_async_event(&injected);
  ibv_async_event victim = next_async_event(p.c0);
  BOOST_TEST(victim.event_type == IBV_EVENT_QP_FATAL);
  T.ack_async_event(&victim);
  BOOST_TEST(state_of(T, p.a.qp) == IBV_QPS_ERR);
}

BOOST_AUTO_TEST_CASE(completions_of_a_destroyed_or_reset_qp_leave_its_cq) {
  connected_pair p;
  for (int i = 0; i < 4; ++i) BOOST_REQUIRE_EQUAL(post_receive(T, p.b, i * 8, 8, i), 0);
  for (int i = 0; i < 2; ++i)
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, i), 0);
  BOOST_TEST(poll_n(T, p.a.send_cq, 2).size() == 2u);  // completions are there to be polled...
  BOOST_TEST(poll_n(T, p.b.recv_cq, 2).size() == 2u);
  for (int i = 2; i < 4; ++i)
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, i), 0);
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  BOOST_REQUIRE_EQUAL(T.modify_qp(p.a.qp, &reset, IBV_QP_STATE), 0);
  BOOST_TEST(poll_for(T, p.a.send_cq, 2ms).empty());  // ...until their QP is reset
  BOOST_REQUIRE_EQUAL(T.destroy_qp(p.b.qp), 0);
  p.b.qp = nullptr;
  BOOST_TEST(poll_for(T, p.b.recv_cq, 2ms).empty());  // ...or destroyed
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(faults)

BOOST_AUTO_TEST_CASE(retry_exceeded_on_the_next_send_flushes_the_rest) {
  connected_pair p;
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 1), 0);
  BOOST_REQUIRE_EQUAL(td::fail_next_send(p.a.qp), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 2), 0);
  const auto sent = poll_n(T, p.a.send_cq, 2);
  BOOST_REQUIRE_EQUAL(sent.size(), 2u);
  BOOST_TEST(sent[0].status == IBV_WC_RETRY_EXC_ERR);
  BOOST_TEST(sent[1].status == IBV_WC_WR_FLUSH_ERR);
  BOOST_TEST(poll_for(T, p.b.recv_cq, 2ms).empty());
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 3), 0);  // posting in ERR
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_WR_FLUSH_ERR);
}

BOOST_AUTO_TEST_CASE(a_qp_failed_by_the_hardware_flushes_its_receives) {
  connected_pair p;
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 41), 0);
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 8, 8, 42), 0);
  BOOST_REQUIRE_EQUAL(td::fail_qp(p.b.qp), 0);
  const auto recv = poll_n(T, p.b.recv_cq, 2);
  BOOST_REQUIRE_EQUAL(recv.size(), 2u);
  BOOST_TEST(recv[0].wr_id == 41u);
  BOOST_TEST(recv[1].wr_id == 42u);
  BOOST_TEST(recv[0].status == IBV_WC_WR_FLUSH_ERR);
  BOOST_TEST(recv[0].qp_num == p.b.qp->qp_num);
  ibv_async_event fatal = next_async_event(p.c1);
  BOOST_TEST(fatal.event_type == IBV_EVENT_QP_FATAL);
  BOOST_TEST(T.destroy_qp(p.b.qp) == EBUSY);  // rdma-core would block: event not acked
  T.ack_async_event(&fatal);
  BOOST_TEST(T.destroy_qp(p.b.qp) == 0);
  p.b.qp = nullptr;
}

BOOST_AUTO_TEST_CASE(a_vanished_peer_shows_as_retry_exceeded_after_the_ack_timeouts) {
  connected_pair p(with([](qp_options& o) {
    o.timeout = 1;  // 8 us
    o.retry_cnt = 3;
  }));
  BOOST_REQUIRE_EQUAL(td::peer_gone("testdev1", td::peer_failure::host_lost), 0);
  const uint64_t before = td::stats().ack_timeouts;
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_WRITE, {p.a.buf.sge(0, 8)}, 2, 0, p.b.buf.addr(),
                           p.b.buf.mr->rkey),
                      0);
  const auto sent = poll_n(T, p.a.send_cq, 2);
  BOOST_REQUIRE_EQUAL(sent.size(), 2u);
  BOOST_TEST(sent[0].status == IBV_WC_RETRY_EXC_ERR);
  BOOST_TEST(sent[1].status == IBV_WC_WR_FLUSH_ERR);
  BOOST_TEST(td::stats().ack_timeouts - before == 4u);  // retry_cnt retries, then give up

  BOOST_TEST(post(T, p.b.qp, IBV_WR_SEND, {p.b.buf.sge(0, 8)}, 1) == EIO);
  errno = 0;
  BOOST_TEST(T.alloc_pd(p.c1) == nullptr);
  BOOST_TEST(errno == EIO);
  p.b.release();  // the vanished side's objects are still released
  ibv_context* again = open_device(T, "testdev1");  // a new process may open the device
  BOOST_TEST(loopback_exchange(T, "testdev1") == "");
  T.close_device(again);
}

BOOST_AUTO_TEST_CASE(a_read_in_flight_when_the_peer_vanishes_times_out) {
  connected_pair p(with([](qp_options& o) {
    o.timeout = 1;
    o.retry_cnt = 1;
  }));
  td::hold_read_responses(true);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_RDMA_READ, {p.a.buf.sge(0, 8)}, 1, 0, p.b.buf.addr(),
                           p.b.buf.mr->rkey),
                      0);
  BOOST_REQUIRE_EQUAL(td::peer_gone("testdev1", td::peer_failure::process_exit), 0);
  td::hold_read_responses(false);
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_RETRY_EXC_ERR);
}

BOOST_AUTO_TEST_CASE(with_timeout_0_a_lost_request_waits_for_ever) {
  connected_pair p(with([](qp_options& o) { o.timeout = 0; }));
  BOOST_REQUIRE_EQUAL(td::peer_gone("testdev1", td::peer_failure::host_lost), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(poll_for(T, p.a.send_cq, 30ms).empty());
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  BOOST_REQUIRE_EQUAL(T.modify_qp(p.a.qp, &err, IBV_QP_STATE), 0);
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_WR_FLUSH_ERR);  // still outstanding
}

BOOST_AUTO_TEST_CASE(a_port_going_down_raises_port_err_and_traffic_times_out) {
  connected_pair p(with([](qp_options& o) {
    o.timeout = 1;
    o.retry_cnt = 2;
  }));
  BOOST_REQUIRE_EQUAL(td::set_port_state("testdev1", 1, IBV_PORT_DOWN), 0);
  ibv_async_event down = next_async_event(p.c1);
  BOOST_TEST(down.event_type == IBV_EVENT_PORT_ERR);
  BOOST_TEST(down.element.port_num == 1);
  T.ack_async_event(&down);
  ibv_port_attr port{};
  BOOST_REQUIRE_EQUAL(T.query_port(p.c1, 1, &port), 0);
  BOOST_TEST(port.state == IBV_PORT_DOWN);
  BOOST_REQUIRE_EQUAL(post_receive(T, p.b, 0, 8, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(poll_n(T, p.a.send_cq, 1).at(0).status == IBV_WC_RETRY_EXC_ERR);
  BOOST_REQUIRE_EQUAL(td::set_port_state("testdev1", 1, IBV_PORT_ACTIVE), 0);
  ibv_async_event up = next_async_event(p.c1);
  BOOST_TEST(up.event_type == IBV_EVENT_PORT_ACTIVE);
  T.ack_async_event(&up);
}

BOOST_AUTO_TEST_CASE(requests_to_a_qp_that_is_not_listening_get_no_answer) {
  two_devices f;
  qp_options fast;
  fast.timeout = 1;
  fast.retry_cnt = 1;
  // the responder never leaves INIT
  endpoint a, b;
  build(T, a, f.c0, fast);
  build(T, b, f.c1, fast);
  BOOST_REQUIRE_EQUAL(to_init(T, a), 0);
  BOOST_REQUIRE_EQUAL(to_init(T, b), 0);
  BOOST_REQUIRE_EQUAL(to_rtr(T, a, b), 0);
  BOOST_REQUIRE_EQUAL(to_rts(T, a), 0);
  BOOST_REQUIRE_EQUAL(post_receive(T, b, 0, 8, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, a.qp, IBV_WR_SEND, {a.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(poll_n(T, a.send_cq, 1).at(0).status == IBV_WC_RETRY_EXC_ERR);

  // mismatched PSNs: the responder expects another sequence
  endpoint c, d;
  build(T, c, f.c0, fast);
  build(T, d, f.c1, fast);
  BOOST_REQUIRE_EQUAL(to_init(T, c), 0);
  BOOST_REQUIRE_EQUAL(to_init(T, d), 0);
  BOOST_REQUIRE_EQUAL(to_rtr(T, c, d, 0), 0);
  BOOST_REQUIRE_EQUAL(to_rtr(T, d, c, 500), 0);
  BOOST_REQUIRE_EQUAL(to_rts(T, c, 0), 0);
  BOOST_REQUIRE_EQUAL(to_rts(T, d, 0), 0);
  BOOST_REQUIRE_EQUAL(post_receive(T, d, 0, 8, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, c.qp, IBV_WR_SEND, {c.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(poll_n(T, c.send_cq, 1).at(0).status == IBV_WC_RETRY_EXC_ERR);
  BOOST_TEST(poll_for(T, d.recv_cq, 2ms).empty());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(threads)

BOOST_AUTO_TEST_CASE(a_blocking_receiver_and_a_sender_on_two_threads_see_every_message_in_order) {
  connected_pair p(with([](qp_options& o) { o.max_send_wr = 16; }),
                   with([](qp_options& o) { o.max_recv_wr = 16; }));
  constexpr uint32_t messages = 2000;
  std::vector<uint32_t> received;
  std::thread receiver([&] {
    for (uint32_t i = 0; i < 16; ++i) post_receive(T, p.b, i * 4, 4, i);
    while (received.size() < messages) {
      T.req_notify_cq(p.b.recv_cq, 0);
      ibv_wc wc[8];
      int n = T.poll_cq(p.b.recv_cq, 8, wc);
      if (n == 0) {
        ibv_cq* cq = nullptr;
        void* ctx = nullptr;
        if (T.get_cq_event(p.b.channel, &cq, &ctx) != 0) return;
        T.ack_cq_events(cq, 1);
        continue;
      }
      for (int k = 0; k < n && wc[k].status == IBV_WC_SUCCESS; ++k) {
        uint32_t value = 0;
        std::memcpy(&value, p.b.buf.bytes.data() + wc[k].wr_id * 4, 4);
        received.push_back(value);
        post_receive(T, p.b, wc[k].wr_id * 4, 4, wc[k].wr_id);
      }
      if (n < 0 || wc[0].status != IBV_WC_SUCCESS) return;
    }
  });
  uint32_t outstanding = 0;
  for (uint32_t i = 0; i < messages; ++i) {
    while (outstanding >= 16) {
      ibv_wc wc[16];
      const int n = T.poll_cq(p.a.send_cq, 16, wc);
      BOOST_REQUIRE(n >= 0);
      outstanding -= static_cast<uint32_t>(n);
    }
    std::memcpy(p.a.buf.bytes.data() + 4096 + (i % 16) * 4, &i, 4);
    BOOST_REQUIRE_EQUAL(post(T, p.a.qp, IBV_WR_SEND, {p.a.buf.sge(4096 + (i % 16) * 4, 4)}, i), 0);
    ++outstanding;
  }
  receiver.join();
  BOOST_REQUIRE_EQUAL(received.size(), messages);
  for (uint32_t i = 0; i < messages; ++i) BOOST_TEST_REQUIRE(received[i] == i);
  BOOST_TEST(poll_n(T, p.a.send_cq, outstanding).size() == outstanding);
}

BOOST_AUTO_TEST_SUITE_END()

// -- tag matching: the test device's model of TM-SRQs ---------------------------------------------

namespace {

/// One completion read from an extended CQ.
struct tm_completion {
  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  uint32_t byte_len = 0;
  unsigned flags = 0;
  ibv_wc_tm_info tm{};
};

/// Reads `n` completions from `cq` (bounded wait); returns what arrived.
std::vector<tm_completion> poll_ex(ibv_cq_ex* cq, size_t n) {
  std::vector<tm_completion> out;
  eventually([&] {
    ibv_poll_cq_attr attr{};
    int rc = T.start_poll(cq, &attr);
    if (rc != 0) return out.size() >= n;
    while (rc == 0) {
      tm_completion c;
      c.wr_id = cq->wr_id;
      c.status = cq->status;
      if (c.status == IBV_WC_SUCCESS) {
        c.opcode = T.wc_read_opcode(cq);
        c.byte_len = T.wc_read_byte_len(cq);
        c.flags = T.wc_read_wc_flags(cq);
        if (c.opcode == IBV_WC_TM_RECV) T.wc_read_tm_info(cq, &c.tm);
      }
      out.push_back(c);
      rc = T.next_poll(cq);
    }
    T.end_poll(cq);
    return out.size() >= n;
  }, 2s);
  return out;
}

/// A TMH with `opcode`, `app_ctx` and `tag`, then `rest`.
std::vector<uint8_t> tm_message(uint8_t opcode, uint32_t app_ctx, uint64_t tag,
                                const std::vector<uint8_t>& rest = {}) {
  ibv_tmh h{};
  h.opcode = opcode;
  h.app_ctx = htobe32(app_ctx);
  h.tag = htobe64(tag);
  std::vector<uint8_t> out(sizeof(h) + rest.size());
  std::memcpy(out.data(), &h, sizeof(h));
  if (!rest.empty()) std::memcpy(out.data() + sizeof(h), rest.data(), rest.size());
  return out;
}

/// An RVH for `length` bytes at `address` under `rkey`, then `header` bytes.
std::vector<uint8_t> rvh(uint64_t address, uint32_t rkey, uint32_t length, size_t header) {
  ibv_rvh r{};
  r.va = htobe64(address);
  r.rkey = htobe32(rkey);
  r.len = htobe32(length);
  std::vector<uint8_t> out(sizeof(r) + header, 0x5a);
  std::memcpy(out.data(), &r, sizeof(r));
  return out;
}

/// A TM-SRQ on testdev1 (4 tagged buffers, 2 SGEs, 64-byte rendezvous requests), its extended
/// CQ, and a connected pair: a on testdev0 (plain), b on testdev1 on the TM-SRQ.
struct tm_pair : two_devices {
  ibv_pd* pd = nullptr;
  ibv_cq_ex* cq = nullptr;
  ibv_srq* srq = nullptr;
  endpoint a, b;

  tm_pair()
      : two_devices({td::roce_device("testdev0", "10.0.0.1"),
                     td::with_tag_matching(td::roce_device("testdev1", "10.0.0.2"), 4, 2, 64)}) {
    pd = T.alloc_pd(c1);
    ibv_cq_init_attr_ex cq_attr{};
    cq_attr.cqe = 64;
    cq_attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_TM_INFO};
    cq = T.create_cq_ex(c1, &cq_attr);
    BOOST_REQUIRE(cq != nullptr);
    ibv_srq_init_attr_ex attr{};
    attr.attr.max_wr = 8;
    attr.attr.max_sge = 1;
    attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
                     IBV_SRQ_INIT_ATTR_TM;
    attr.srq_type = IBV_SRQT_TM;
    attr.pd = pd;
    attr.cq = ibv_cq_ex_to_cq(cq);
    attr.tm_cap.max_num_tags = 4;
    attr.tm_cap.max_ops = 8;
    srq = T.create_srq_ex(c1, &attr);
    BOOST_REQUIRE(srq != nullptr);
    build(T, a, c0);
    build(T, b, c1, {}, srq, pd);
    BOOST_REQUIRE_EQUAL(connect(T, a, b), 0);
  }
  ~tm_pair() {
    a.release();
    b.release();
    BOOST_CHECK_EQUAL(T.destroy_srq(srq), 0);
    BOOST_CHECK_EQUAL(T.destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
    BOOST_CHECK_EQUAL(T.dealloc_pd(pd), 0);
  }

  /// ADD of a tagged buffer over b's [offset, offset + length): the post's answer; `*handle`.
  int add(uint64_t tag, uint64_t mask, size_t offset, uint32_t length, uint64_t recv_wr_id,
          uint32_t unexpected, uint32_t* handle = nullptr) {
    ibv_sge sge = b.buf.sge(offset, length);
    ibv_ops_wr op{};
    op.wr_id = 1000 + recv_wr_id;
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
    op.tm.unexpected_cnt = unexpected;
    op.tm.add.recv_wr_id = recv_wr_id;
    op.tm.add.sg_list = &sge;
    op.tm.add.num_sge = 1;
    op.tm.add.tag = tag;
    op.tm.add.mask = mask;
    ibv_ops_wr* bad = nullptr;
    const int rc = T.post_srq_ops(srq, &op, &bad);
    if (handle != nullptr) *handle = op.tm.handle;
    return rc;
  }
  /// A DEL or SYNC (signaled).
  int op(ibv_ops_wr_opcode opcode, uint32_t handle, uint32_t unexpected, uint64_t wr_id) {
    ibv_ops_wr o{};
    o.wr_id = wr_id;
    o.opcode = opcode;
    o.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
    o.tm.handle = handle;
    o.tm.unexpected_cnt = unexpected;
    ibv_ops_wr* bad = nullptr;
    return T.post_srq_ops(srq, &o, &bad);
  }
  /// Sends `bytes` from a (inline when short).
  int send(const std::vector<uint8_t>& bytes, uint64_t wr_id) {
    std::memcpy(a.buf.bytes.data() + 32768, bytes.data(), bytes.size());
    return post(T, a.qp, IBV_WR_SEND,
                {a.buf.sge(32768, static_cast<uint32_t>(bytes.size()))}, wr_id);
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(tag_matching)

BOOST_AUTO_TEST_CASE(only_a_device_given_tag_matching_reports_it_and_makes_tm_srqs) {
  tm_pair f;
  ibv_device_attr_ex plain{}, tm{};
  BOOST_REQUIRE_EQUAL(T.query_device_ex(f.c0, nullptr, &plain), 0);
  BOOST_REQUIRE_EQUAL(T.query_device_ex(f.c1, nullptr, &tm), 0);
  BOOST_TEST(plain.tm_caps.max_num_tags == 0u);
  BOOST_TEST(tm.tm_caps.max_num_tags == 4u);
  BOOST_TEST(tm.tm_caps.max_sge == 2u);
  BOOST_TEST(tm.tm_caps.max_rndv_hdr_size == 64u);
  BOOST_TEST((tm.tm_caps.flags & IBV_TM_CAP_RC) != 0u);
  ibv_pd* pd = T.alloc_pd(f.c0);
  ibv_cq* cq = T.create_cq(f.c0, 8, nullptr, nullptr, 0);
  ibv_srq_init_attr_ex attr{};
  attr.attr.max_wr = 4;
  attr.attr.max_sge = 1;
  attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
                   IBV_SRQ_INIT_ATTR_TM;
  attr.srq_type = IBV_SRQT_TM;
  attr.pd = pd;
  attr.cq = cq;
  attr.tm_cap.max_num_tags = 2;
  attr.tm_cap.max_ops = 2;
  errno = 0;
  BOOST_TEST(T.create_srq_ex(f.c0, &attr) == nullptr);
  BOOST_TEST(errno == EOPNOTSUPP, "no tag matching on testdev0");
  T.destroy_cq(cq);
  T.dealloc_pd(pd);
  // Beyond the device's max_num_tags: refused.
  attr.pd = f.pd;
  attr.cq = ibv_cq_ex_to_cq(f.cq);
  attr.tm_cap.max_num_tags = 5;
  errno = 0;
  BOOST_TEST(T.create_srq_ex(f.c1, &attr) == nullptr);
  BOOST_TEST(errno == EINVAL);
  BOOST_TEST(T.destroy_cq(ibv_cq_ex_to_cq(f.cq)) == EBUSY, "its TM-SRQ completes into it");
}

BOOST_AUTO_TEST_CASE(tagged_buffers_match_in_the_order_added_and_the_list_is_bounded) {
  tm_pair f;
  uint32_t handles[4] = {};
  BOOST_REQUIRE_EQUAL(f.add(0x12, ~0ull, 0, 16, 10, 0, &handles[0]), 0);
  BOOST_REQUIRE_EQUAL(f.add(0x30, 0xf0, 16, 16, 11, 0, &handles[1]), 0);  // any 0x3?
  BOOST_REQUIRE_EQUAL(f.add(0x34, ~0ull, 32, 16, 12, 0, &handles[2]), 0);
  BOOST_REQUIRE_EQUAL(f.add(0, 0, 48, 4, 13, 0, &handles[3]), 0);  // anything, 4 bytes
  BOOST_TEST(f.add(0x99, ~0ull, 64, 16, 14, 0) == ENOMEM, "max_num_tags is 4");
  auto adds = poll_ex(f.cq, 4);
  BOOST_REQUIRE_EQUAL(adds.size(), 4u);
  for (const tm_completion& c : adds) BOOST_TEST(c.opcode == IBV_WC_TM_ADD);
  // 0x34 goes to the buffer added earlier whose mask takes it, not the exact one after it.
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_EAGER, 7, 0x34, {1, 2, 3}), 1), 0);
  auto m = poll_ex(f.cq, 1);
  BOOST_REQUIRE_EQUAL(m.size(), 1u);
  BOOST_TEST(m[0].opcode == IBV_WC_TM_RECV);
  BOOST_TEST(m[0].wr_id == 11u);
  BOOST_TEST(m[0].byte_len == 3u);
  BOOST_TEST(m[0].flags == unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  BOOST_TEST(m[0].tm.tag == 0x34u);
  BOOST_TEST(m[0].tm.priv == 7u);
  BOOST_TEST(f.b.buf.bytes[16] == 1);
  BOOST_TEST(f.b.buf.bytes[18] == 3);
  // Longer than the buffer: cut to it, byte_len the message's.
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_EAGER, 0, 0x77, std::vector<uint8_t>(10, 9)), 2),
                      0);
  m = poll_ex(f.cq, 1);
  BOOST_REQUIRE_EQUAL(m.size(), 1u);
  BOOST_TEST(m[0].wr_id == 13u);
  BOOST_TEST(m[0].byte_len == 10u);
  BOOST_TEST(f.b.buf.bytes[51] == 9);
  BOOST_TEST(f.b.buf.bytes[52] == 0, "nothing past the tagged buffer");
  // A matched buffer is gone: its DEL fails; a listed one's succeeds; the list has room again.
  BOOST_REQUIRE_EQUAL(f.op(IBV_WR_TAG_DEL, handles[1], 0, 21), 0);
  BOOST_REQUIRE_EQUAL(f.op(IBV_WR_TAG_DEL, handles[2], 0, 22), 0);
  auto dels = poll_ex(f.cq, 2);
  BOOST_REQUIRE_EQUAL(dels.size(), 2u);
  BOOST_TEST(dels[0].wr_id == 21u);
  BOOST_TEST(dels[0].status == IBV_WC_TM_ERR);
  BOOST_TEST(dels[1].status == IBV_WC_SUCCESS);
  BOOST_TEST(dels[1].opcode == IBV_WC_TM_DEL);
  BOOST_TEST(f.add(0x99, ~0ull, 64, 16, 14, 0) == 0);
  BOOST_TEST(poll_ex(f.cq, 1).size() == 1u);
  // At most max_ops operations whose completions are unread.
  int posted = 0;
  while (posted < 20 && f.op(IBV_WR_TAG_SYNC, 0, 0, 100 + posted) == 0) ++posted;
  BOOST_TEST(posted == 8, "max_ops of the SRQ");
  BOOST_TEST(poll_ex(f.cq, 8).size() == 8u);
}

BOOST_AUTO_TEST_CASE(an_unexpected_message_stops_matching_until_the_software_synchronises) {
  tm_pair f;
  for (int i = 0; i < 4; ++i) {
    BOOST_REQUIRE_EQUAL(post_receive(T, f.b, 4096 + i * 256, 256, 50 + i), 0);
  }
  // Nothing listed: the message lands whole, TMH included, in an ordinary buffer.
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_EAGER, 0, 5, {4, 5}), 1), 0);
  auto got = poll_n(T, f.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(got.size(), 1u);
  BOOST_TEST(got[0].opcode == IBV_WC_RECV);
  BOOST_TEST(got[0].byte_len == 18u);
  BOOST_TEST((got[0].wc_flags & IBV_WC_TM_SYNC_REQ) == 0u, "no tagged buffer was listed");
  // Added with the count the software had before it saw that message: out of synch, no match.
  BOOST_REQUIRE_EQUAL(f.add(5, ~0ull, 0, 16, 10, 0), 0);
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_EAGER, 0, 5, {6}), 2), 0);
  got = poll_n(T, f.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(got.size(), 1u);
  BOOST_TEST(got[0].byte_len == 17u);
  BOOST_TEST((got[0].wc_flags & IBV_WC_TM_SYNC_REQ) != 0u, "the device asks for a sync");
  // NO_TAG messages do not count; SYNC with the two unexpected ones: matching resumes.
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_NO_TAG, 0, 0, {1}), 3), 0);
  got = poll_n(T, f.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(got.size(), 1u);
  BOOST_TEST(got[0].opcode == IBV_WC_TM_NO_TAG);
  BOOST_REQUIRE_EQUAL(f.op(IBV_WR_TAG_SYNC, 0, 2, 30), 0);
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_EAGER, 0, 5, {7}), 4), 0);
  auto m = poll_ex(f.cq, 3);  // ADD, SYNC, the match
  BOOST_REQUIRE_EQUAL(m.size(), 3u);
  BOOST_TEST(m[1].opcode == IBV_WC_TM_SYNC);
  BOOST_TEST(m[2].opcode == IBV_WC_TM_RECV);
  BOOST_TEST(m[2].wr_id == 10u);
  BOOST_TEST(f.b.buf.bytes[0] == 7);
  // A TMH with a reserved byte set matches nothing and counts as nothing.
  BOOST_REQUIRE_EQUAL(f.add(5, ~0ull, 0, 16, 11, 2), 0);
  std::vector<uint8_t> bad = tm_message(IBV_TMH_EAGER, 0, 5, {8});
  bad[2] = 1;
  BOOST_REQUIRE_EQUAL(f.send(bad, 5), 0);
  BOOST_TEST(poll_n(T, f.b.recv_cq, 1).size() == 1u);
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_EAGER, 0, 5, {9}), 6), 0);
  m = poll_ex(f.cq, 2);
  BOOST_REQUIRE_EQUAL(m.size(), 2u);
  BOOST_TEST(m[1].wr_id == 11u, "still in synch: matched");
}

BOOST_AUTO_TEST_CASE(a_matched_rendezvous_is_read_from_the_sender_and_answered_with_a_fin) {
  tm_pair f;
  for (int i = 0; i < 2; ++i) {
    BOOST_REQUIRE_EQUAL(post_receive(T, f.b, 4096 + i * 256, 256, 50 + i), 0);
  }
  BOOST_REQUIRE_EQUAL(post_receive(T, f.a, 40000, 64, 70), 0);  // where the FIN lands
  fill(f.a.buf.bytes.data() + 8192, 3000, 3);
  BOOST_REQUIRE_EQUAL(f.add(9, ~0ull, 16384, 4096, 10, 0), 0);
  BOOST_REQUIRE_EQUAL(
      f.send(tm_message(IBV_TMH_RNDV, 55, 9, rvh(f.a.buf.addr(8192), f.a.buf.mr->rkey, 3000, 8)),
             1),
      0);
  auto m = poll_ex(f.cq, 2);
  BOOST_REQUIRE_EQUAL(m.size(), 2u);
  BOOST_TEST(m[1].opcode == IBV_WC_TM_RECV);
  BOOST_TEST(m[1].byte_len == 3000u);
  BOOST_TEST(m[1].tm.priv == 55u);
  BOOST_TEST(holds(f.b.buf.bytes.data() + 16384, 3000, 3));
  auto fin = poll_n(T, f.a.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(fin.size(), 1u);
  BOOST_TEST(fin[0].byte_len == 16u);
  BOOST_TEST(f.a.buf.bytes[40000] == IBV_TMH_FIN);
  uint32_t app_ctx = 0;
  std::memcpy(&app_ctx, f.a.buf.bytes.data() + 40004, 4);
  BOOST_TEST(be32toh(app_ctx) == 55u);
  BOOST_TEST(poll_n(T, f.a.send_cq, 1).size() == 1u, "the SEND itself completed");
  // A request longer than max_rndv_hdr_size (64) is not matched: it lands whole.
  BOOST_REQUIRE_EQUAL(f.add(9, ~0ull, 16384, 4096, 11, 0), 0);
  BOOST_REQUIRE_EQUAL(
      f.send(tm_message(IBV_TMH_RNDV, 56, 9, rvh(f.a.buf.addr(8192), f.a.buf.mr->rkey, 3000, 40)),
             2),
      0);
  auto landed = poll_n(T, f.b.recv_cq, 1);
  BOOST_REQUIRE_EQUAL(landed.size(), 1u);
  BOOST_TEST(landed[0].byte_len == 72u);
  // A key the sender's memory refuses: the SEND fails, both QPs to error, the buffer stays.
  BOOST_REQUIRE_EQUAL(f.op(IBV_WR_TAG_SYNC, 0, 1, 31), 0);
  BOOST_REQUIRE_EQUAL(f.send(tm_message(IBV_TMH_RNDV, 57, 9, rvh(f.a.buf.addr(8192), 0xdead, 100,
                                                                 0)),
                             3),
                      0);
  auto failed = poll_n(T, f.a.send_cq, 2);  // the long request's, then this one's
  BOOST_REQUIRE_EQUAL(failed.size(), 2u);
  BOOST_TEST(failed[0].status == IBV_WC_SUCCESS);
  BOOST_TEST(failed[1].status == IBV_WC_REM_OP_ERR);
  BOOST_TEST(state_of(T, f.b.qp) == IBV_QPS_ERR);
}

BOOST_AUTO_TEST_SUITE_END()
