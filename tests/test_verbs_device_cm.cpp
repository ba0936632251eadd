// The verbs test device's rdmacm, through the verbs table only, the way the verbs transport's
// connection manager uses it: listen, resolve, connect with private data, accept or reject,
// establish without a QP on the id, disconnect, the events in order on the channel's fd, the
// outcomes of a missing listener, a full backlog, a client that gives up and a peer that vanishes.
// Every wait is bounded; nothing asserts on timing.
#define BOOST_TEST_MODULE verbs_test_device_cm
#include <boost/test/unit_test.hpp>

#include "verbs/testdev/testdev.hpp"
#include "verbs_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>

#include <atomic>
#include <thread>

namespace td = comm::verbs::testdev;
using namespace comm::test::verbs;

namespace {

const comm::verbs::api& T = td::table();

sockaddr_storage ip(const char* text, uint16_t port = 0) {
  sockaddr_storage s{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&s);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&s);
  if (::inet_pton(AF_INET, text, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
  } else {
    BOOST_REQUIRE(::inet_pton(AF_INET6, text, &v6->sin6_addr) == 1);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
  }
  return s;
}

sockaddr* sa(sockaddr_storage& s) { return reinterpret_cast<sockaddr*>(&s); }

/// What an rdmacm event said, copied before it was acknowledged.
struct event_copy {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
  rdma_cm_id* listen_id = nullptr;
  rdma_conn_param conn{};
  std::vector<uint8_t> data;
};

/// Waits for the channel's next event (bounded), copies it and acknowledges it.
event_copy take_event(rdma_event_channel* channel) {
  BOOST_REQUIRE_MESSAGE(readable(channel->fd, 10000), "no rdmacm event");
  rdma_cm_event* event = nullptr;
  BOOST_REQUIRE_EQUAL(T.get_cm_event(channel, &event), 0);
  event_copy copy;
  copy.type = event->event;
  copy.status = event->status;
  copy.id = event->id;
  copy.listen_id = event->listen_id;
  copy.conn = event->param.conn;
  const auto* data = static_cast<const uint8_t*>(event->param.conn.private_data);
  if (data != nullptr) copy.data.assign(data, data + event->param.conn.private_data_len);
  copy.conn.private_data = nullptr;
  BOOST_REQUIRE_EQUAL(T.ack_cm_event(event), 0);
  return copy;
}

/// Takes the next event and requires its type.
event_copy expect(rdma_event_channel* channel, rdma_cm_event_type type) {
  event_copy e = take_event(channel);
  BOOST_REQUIRE_MESSAGE(e.type == type, "got " << T.cm_event_str(e.type) << " (status " << e.status
                                               << "), expected " << T.cm_event_str(type));
  return e;
}

/// `text` followed by zeros up to `size` bytes (the private data field a receiver sees).
std::vector<uint8_t> padded(const std::string& text, size_t size) {
  std::vector<uint8_t> v(size, 0);
  std::memcpy(v.data(), text.data(), text.size());
  return v;
}

/// A QP created on an rdmacm id, with its PD, CQ and a registered buffer.
struct id_qp {
  rdma_cm_id* id = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  buffer buf;
  id_qp() = default;
  id_qp(const id_qp&) = delete;
  id_qp& operator=(const id_qp&) = delete;
  ~id_qp() { release(); }
  void release() {
    if (id == nullptr) return;
    T.destroy_qp_on_id(id);
    if (buf.mr != nullptr) T.dereg_mr(buf.mr);
    if (cq != nullptr) T.destroy_cq(cq);
    if (pd != nullptr) T.dealloc_pd(pd);
    id = nullptr;
  }
};

/// Creates a QP on `id` (on the device rdmacm chose for it).
void make_qp(id_qp& q, rdma_cm_id* id) {
  q.id = id;
  q.pd = T.alloc_pd(id->verbs);
  q.cq = T.create_cq(id->verbs, 64, nullptr, nullptr, 0);
  q.buf = make_buffer(T, q.pd, 8192,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = q.cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 1;
  init.cap = {16, 16, 2, 2, 0};
  BOOST_REQUIRE_EQUAL(T.create_qp_on_id(id, q.pd, &init), 0);
}

/// An event channel and ids on it, destroyed at the end.
struct cm_side {
  rdma_event_channel* channel = T.create_event_channel();
  std::vector<rdma_cm_id*> ids;
  cm_side() { BOOST_REQUIRE(channel != nullptr); }
  ~cm_side() {
    for (rdma_cm_id* id : ids) T.destroy_id(id);
    T.destroy_event_channel(channel);
  }
  rdma_cm_id* new_id() {
    rdma_cm_id* id = nullptr;
    BOOST_REQUIRE_EQUAL(T.create_id(channel, &id, this, RDMA_PS_TCP), 0);
    ids.push_back(id);
    return id;
  }
  void forget(rdma_cm_id* id) { ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end()); }
};

/// Two RoCE devices; leaks are checked when the test ends.
struct fabric_fixture {
  td::fabric_scope scope;
  explicit fabric_fixture(
      std::vector<td::device_spec> specs = {td::roce_device("testdev0", "10.0.0.1"),
                                            td::roce_device("testdev1", "10.0.0.2")})
      : scope(specs) {}
  ~fabric_fixture() { BOOST_CHECK_EQUAL(scope.finish(), 0u); }
};

/// A listener on `address` (port 0: any); returns its port.
uint16_t listen_on(cm_side& server, rdma_cm_id*& listener, sockaddr_storage address,
                   int backlog = 8) {
  listener = server.new_id();
  BOOST_REQUIRE_EQUAL(T.bind_addr(listener, sa(address)), 0);
  BOOST_REQUIRE_EQUAL(T.listen(listener, backlog), 0);
  const uint16_t port = ntohs(T.get_src_port(listener));
  BOOST_REQUIRE(port != 0);
  return port;
}

/// Resolves address and route from `src` to `dst` for a new client id.
rdma_cm_id* resolved_client(cm_side& client, sockaddr_storage src, sockaddr_storage dst) {
  rdma_cm_id* id = client.new_id();
  BOOST_REQUIRE_EQUAL(T.resolve_addr(id, sa(src), sa(dst), 1000), 0);
  BOOST_REQUIRE(expect(client.channel, RDMA_CM_EVENT_ADDR_RESOLVED).id == id);
  BOOST_REQUIRE_EQUAL(T.resolve_route(id, 1000), 0);
  expect(client.channel, RDMA_CM_EVENT_ROUTE_RESOLVED);
  return id;
}

/// Connection parameters with `length` bytes of private data at `data` (which must outlive the
/// call they are given to).
rdma_conn_param with_data(const char* data, size_t length, uint8_t resources, uint8_t depth) {
  rdma_conn_param p{};
  p.private_data = length != 0 ? data : nullptr;
  p.private_data_len = static_cast<uint8_t>(length);
  p.responder_resources = resources;
  p.initiator_depth = depth;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  return p;
}

/// With a string literal's bytes.
rdma_conn_param params(const char* literal, uint8_t resources = 4, uint8_t depth = 4) {
  return with_data(literal, std::strlen(literal), resources, depth);
}

/// With a string's bytes (the string must outlive the call).
rdma_conn_param params(const std::string& data, uint8_t resources = 4, uint8_t depth = 4) {
  return with_data(data.data(), data.size(), resources, depth);
}

rdma_conn_param params(std::string&&, uint8_t = 4, uint8_t = 4) = delete;

ibv_qp_attr qp_attributes(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  T.query_qp(qp, &a, IBV_QP_STATE, &init);
  return a;
}

std::string device_of(rdma_cm_id* id) { return T.get_device_name(id->verbs->device); }

/// Posts a receive of [offset, offset + length) of `q`'s buffer.
int receive(id_qp& q, size_t offset, uint32_t length, uint64_t wr_id) {
  ibv_sge sge = q.buf.sge(offset, length);
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return T.post_recv(q.id->qp, &wr, &bad);
}

/// Client and server connected through rdmacm with QPs on their ids: the client on testdev0
/// (10.0.0.1), the server on testdev1 (10.0.0.2).
struct connection {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  rdma_cm_id* cid = nullptr;
  rdma_cm_id* sid = nullptr;
  id_qp cq, sq;
  explicit connection(uint8_t client_ack_timeout = 19, uint8_t server_resources = 4) {
    const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
    cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
    BOOST_REQUIRE_EQUAL(T.set_option(cid, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT,
                                     &client_ack_timeout, sizeof(client_ack_timeout)),
                        0);
    make_qp(cq, cid);
    rdma_conn_param cp = params("", 4, 4);
    cp.retry_count = 2;
    BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
    sid = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST).id;
    server.ids.push_back(sid);
    make_qp(sq, sid);
    rdma_conn_param ap = params("", server_resources, 4);
    BOOST_REQUIRE_EQUAL(T.accept(sid, &ap), 0);
    expect(client.channel, RDMA_CM_EVENT_ESTABLISHED);
    expect(server.channel, RDMA_CM_EVENT_ESTABLISHED);
  }
  ~connection() {
    cq.release();
    sq.release();
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(handshake, fabric_fixture)

BOOST_AUTO_TEST_CASE(connect_accept_move_data_and_disconnect) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  BOOST_TEST(device_of(cid) == "testdev0");
  BOOST_TEST(cid->port_num == 1);
  BOOST_TEST(cid->route.num_paths == 1);
  BOOST_TEST(ntohs(T.get_dst_port(cid)) == port);
  id_qp cq;
  make_qp(cq, cid);
  BOOST_TEST(qp_attributes(cid->qp).qp_state == IBV_QPS_INIT);

  const std::string hello = "hello";
  rdma_conn_param cp = params(hello, 5, 4);
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  const event_copy request = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  BOOST_TEST(request.listen_id == listener);
  BOOST_REQUIRE(request.id != listener);
  server.ids.push_back(request.id);
  BOOST_TEST(request.data == padded(hello, 56), boost::test_tools::per_element());
  BOOST_TEST(request.conn.responder_resources == 4);  // the server's view of the client's offer
  BOOST_TEST(request.conn.initiator_depth == 5);
  BOOST_TEST(device_of(request.id) == "testdev1");
  char peer[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &request.id->route.addr.dst_sin.sin_addr, peer, sizeof(peer));
  BOOST_TEST(std::string(peer) == "10.0.0.1");

  id_qp sq;
  make_qp(sq, request.id);
  const std::string world = "world";
  rdma_conn_param ap = params(world, 2, 3);
  BOOST_REQUIRE_EQUAL(T.accept(request.id, &ap), 0);
  const event_copy established = expect(client.channel, RDMA_CM_EVENT_ESTABLISHED);
  BOOST_TEST(established.data == padded(world, 196), boost::test_tools::per_element());
  BOOST_TEST(established.conn.responder_resources == 3);  // the client's view of the answer
  BOOST_TEST(established.conn.initiator_depth == 2);
  BOOST_TEST(expect(server.channel, RDMA_CM_EVENT_ESTABLISHED).id == request.id);

  const ibv_qp_attr ca = qp_attributes(cid->qp);
  BOOST_TEST(ca.qp_state == IBV_QPS_RTS);
  BOOST_TEST(ca.max_rd_atomic == 2);       // the server's responder resources
  BOOST_TEST(ca.max_dest_rd_atomic == 3);  // the server's initiator depth
  BOOST_TEST(ca.min_rnr_timer == 0);
  BOOST_TEST(ca.timeout == 19);
  BOOST_TEST((ca.qp_access_flags & IBV_ACCESS_REMOTE_READ) != 0);
  const ibv_qp_attr server_attr = qp_attributes(request.id->qp);
  BOOST_TEST(server_attr.qp_state == IBV_QPS_RTS);
  BOOST_TEST(server_attr.max_dest_rd_atomic == 2);
  BOOST_TEST(server_attr.max_rd_atomic == 3);

  fill(cq.buf.bytes.data(), 64, 3);
  BOOST_REQUIRE_EQUAL(receive(sq, 0, 64, 9), 0);
  BOOST_REQUIRE_EQUAL(post(T, cid->qp, IBV_WR_SEND, {cq.buf.sge(0, 64)}, 1), 0);
  BOOST_TEST(poll_n(T, sq.cq, 1).at(0).status == IBV_WC_SUCCESS);
  BOOST_TEST(holds(sq.buf.bytes.data(), 64, 3));
  fill(sq.buf.bytes.data() + 4096, 128, 4);
  BOOST_REQUIRE_EQUAL(post(T, cid->qp, IBV_WR_RDMA_READ, {cq.buf.sge(1024, 128)}, 2, 0,
                           sq.buf.addr(4096), sq.buf.mr->rkey),
                      0);
  BOOST_REQUIRE_EQUAL(post(T, cid->qp, IBV_WR_RDMA_WRITE, {cq.buf.sge(0, 64)}, 3, 0,
                           sq.buf.addr(6000), sq.buf.mr->rkey),
                      0);
  const auto done = poll_n(T, cq.cq, 3);
  BOOST_REQUIRE_EQUAL(done.size(), 3u);
  for (const ibv_wc& wc : done) BOOST_TEST(wc.status == IBV_WC_SUCCESS);
  BOOST_TEST(holds(cq.buf.bytes.data() + 1024, 128, 4));
  BOOST_TEST(holds(sq.buf.bytes.data() + 6000, 64, 3));

  BOOST_REQUIRE_EQUAL(T.disconnect(cid), 0);
  expect(client.channel, RDMA_CM_EVENT_DISCONNECTED);
  expect(server.channel, RDMA_CM_EVENT_DISCONNECTED);
  BOOST_TEST(qp_attributes(cid->qp).qp_state == IBV_QPS_ERR);
  BOOST_TEST(qp_attributes(request.id->qp).qp_state ==
             IBV_QPS_RTS);  // until the server disconnects
  BOOST_REQUIRE_EQUAL(T.disconnect(request.id), 0);
  BOOST_TEST(qp_attributes(request.id->qp).qp_state == IBV_QPS_ERR);
  BOOST_TEST(!readable(client.channel->fd, 5));  // one DISCONNECTED per side
  BOOST_TEST(!readable(server.channel->fd, 5));
  errno = 0;
  BOOST_TEST(T.disconnect(listener) == -1);
  BOOST_TEST(errno == EINVAL);
  cq.release();
  sq.release();
}

BOOST_AUTO_TEST_CASE(a_reject_carries_private_data_and_fails_the_clients_qp) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  id_qp cq;
  make_qp(cq, cid);
  rdma_conn_param cp = params("please");
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  const event_copy request = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(request.id);
  const std::string no = "go away";
  errno = 0;
  std::vector<uint8_t> too_long(149, 1);
  BOOST_TEST(T.reject(request.id, too_long.data(), 149) == -1);
  BOOST_TEST(errno == EINVAL);
  BOOST_REQUIRE_EQUAL(T.reject(request.id, no.data(), static_cast<uint8_t>(no.size())), 0);
  const event_copy rejected = expect(client.channel, RDMA_CM_EVENT_REJECTED);
  BOOST_TEST(rejected.status == 28);  // consumer defined
  BOOST_TEST(rejected.data == padded(no, 148), boost::test_tools::per_element());
  BOOST_TEST(qp_attributes(cid->qp).qp_state == IBV_QPS_ERR);
  errno = 0;
  BOOST_TEST(T.accept(request.id, nullptr) == -1);  // answered already
  BOOST_TEST(errno == EINVAL);
}

BOOST_AUTO_TEST_CASE(nobody_listening_is_rejected_with_invalid_service_id) {
  cm_side client;
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", 7471));
  id_qp cq;
  make_qp(cq, cid);
  rdma_conn_param cp = params("x");
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  const event_copy rejected = expect(client.channel, RDMA_CM_EVENT_REJECTED);
  BOOST_TEST(rejected.status == 8);
  BOOST_TEST(qp_attributes(cid->qp).qp_state == IBV_QPS_ERR);
}

BOOST_AUTO_TEST_CASE(a_full_backlog_rejects_until_a_request_is_answered) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"), 1);
  rdma_conn_param cp = params("");
  rdma_cm_id* first = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  BOOST_REQUIRE_EQUAL(T.connect(first, &cp), 0);
  const event_copy request = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(request.id);
  rdma_cm_id* second = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  BOOST_REQUIRE_EQUAL(T.connect(second, &cp), 0);
  const event_copy refused = expect(client.channel, RDMA_CM_EVENT_REJECTED);
  BOOST_TEST(refused.id == second);
  BOOST_TEST(refused.status == 28);
  BOOST_TEST(refused.data == std::vector<uint8_t>(148, 0), boost::test_tools::per_element());
  BOOST_TEST(!readable(server.channel->fd, 5));
  BOOST_REQUIRE_EQUAL(T.reject(request.id, nullptr, 0), 0);
  BOOST_TEST(expect(client.channel, RDMA_CM_EVENT_REJECTED).id == first);
  rdma_cm_id* third = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  BOOST_REQUIRE_EQUAL(T.connect(third, &cp), 0);
  server.ids.push_back(expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST).id);
}

BOOST_AUTO_TEST_CASE(private_data_longer_than_the_message_allows_is_refused) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  const std::string long_request(57, 'r');
  rdma_conn_param cp = params(long_request);
  errno = 0;
  BOOST_TEST(T.connect(cid, &cp) == -1);
  BOOST_TEST(errno == EINVAL);
  const std::string longest_request(56, 'r');
  cp = params(longest_request);
  cp.responder_resources = 17;  // above the device's max_qp_rd_atom
  BOOST_TEST(T.connect(cid, &cp) == -1);
  cp = params(longest_request);
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  const event_copy request = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(request.id);
  BOOST_TEST(request.data == std::vector<uint8_t>(56, 'r'), boost::test_tools::per_element());
  const std::string long_reply(197, 'a');
  rdma_conn_param ap = params(long_reply);
  errno = 0;
  BOOST_TEST(T.accept(request.id, &ap) == -1);
  BOOST_TEST(errno == EINVAL);
  const std::string longest_reply(196, 'a');
  ap = params(longest_reply);
  BOOST_REQUIRE_EQUAL(T.accept(request.id, &ap), 0);
  BOOST_TEST(
      expect(client.channel, RDMA_CM_EVENT_CONNECT_RESPONSE).data == std::vector<uint8_t>(196, 'a'),
      boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(without_a_qp_on_the_id_the_client_establishes_itself) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_RTR;
  errno = 0;
  BOOST_TEST(T.init_qp_attr(cid, &attr, &mask) == -1);  // no peer yet
  BOOST_TEST(errno == EINVAL);
  rdma_conn_param cp = params("c");
  cp.qp_num = 0x1111;
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  const event_copy request = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(request.id);
  BOOST_TEST(request.conn.qp_num == 0x1111u);
  rdma_conn_param ap = params("s");
  ap.qp_num = 0x2222;
  BOOST_REQUIRE_EQUAL(T.accept(request.id, &ap), 0);
  const event_copy response = expect(client.channel, RDMA_CM_EVENT_CONNECT_RESPONSE);
  BOOST_TEST(response.conn.qp_num == 0x2222u);
  BOOST_TEST(response.data == padded("s", 196), boost::test_tools::per_element());
  BOOST_TEST(!readable(server.channel->fd, 5));  // the server waits for the client's RTU
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTR;
  BOOST_REQUIRE_EQUAL(T.init_qp_attr(cid, &attr, &mask), 0);
  BOOST_TEST(attr.dest_qp_num == 0x2222u);
  BOOST_TEST((mask & IBV_QP_AV) != 0);
  BOOST_TEST(attr.ah_attr.is_global == 1);
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  BOOST_REQUIRE_EQUAL(T.init_qp_attr(cid, &attr, &mask), 0);
  BOOST_TEST(attr.timeout == 19);
  BOOST_REQUIRE_EQUAL(T.establish(cid), 0);
  expect(server.channel, RDMA_CM_EVENT_ESTABLISHED);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(addresses_and_events, fabric_fixture)

BOOST_AUTO_TEST_CASE(binding_and_resolving_check_the_fabrics_addresses) {
  cm_side side;
  rdma_cm_id* a = side.new_id();
  sockaddr_storage foreign = ip("10.9.9.9");
  errno = 0;
  BOOST_TEST(T.bind_addr(a, sa(foreign)) == -1);
  BOOST_TEST(errno == EADDRNOTAVAIL);
  sockaddr_storage here = ip("10.0.0.1", 7000);
  BOOST_REQUIRE_EQUAL(T.bind_addr(a, sa(here)), 0);
  BOOST_TEST(device_of(a) == "testdev0");
  rdma_cm_id* b = side.new_id();
  errno = 0;
  BOOST_TEST(T.bind_addr(b, sa(here)) == -1);
  BOOST_TEST(errno == EADDRINUSE);
  sockaddr_storage any = ip("0.0.0.0", 7000);
  BOOST_TEST(T.bind_addr(b, sa(any)) == -1);

  rdma_cm_id* c = side.new_id();
  sockaddr_storage nowhere = ip("10.9.9.9", 1);
  BOOST_REQUIRE_EQUAL(T.resolve_addr(c, nullptr, sa(nowhere), 1000), 0);
  const event_copy error = expect(side.channel, RDMA_CM_EVENT_ADDR_ERROR);
  BOOST_TEST(error.status == -EHOSTUNREACH);
  errno = 0;
  BOOST_TEST(T.resolve_route(c, 1000) == -1);  // the address never resolved
  BOOST_TEST(errno == EINVAL);
}

BOOST_AUTO_TEST_CASE(a_wildcard_listener_takes_connections_to_any_device) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("0.0.0.0"));
  BOOST_TEST(listener->verbs == nullptr);  // a wildcard is on no device
  rdma_conn_param cp = params("");
  rdma_cm_id* to1 = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  BOOST_REQUIRE_EQUAL(T.connect(to1, &cp), 0);
  const event_copy r1 = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(r1.id);
  BOOST_TEST(device_of(r1.id) == "testdev1");
  rdma_cm_id* to0 = client.new_id();
  sockaddr_storage dst = ip("10.0.0.1", port);
  BOOST_REQUIRE_EQUAL(T.resolve_addr(to0, nullptr, sa(dst), 1000), 0);  // loopback on testdev0
  expect(client.channel, RDMA_CM_EVENT_ADDR_RESOLVED);
  BOOST_TEST(device_of(to0) == "testdev0");
  BOOST_REQUIRE_EQUAL(T.resolve_route(to0, 1000), 0);
  expect(client.channel, RDMA_CM_EVENT_ROUTE_RESOLVED);
  BOOST_REQUIRE_EQUAL(T.connect(to0, &cp), 0);
  const event_copy r0 = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(r0.id);
  BOOST_TEST(device_of(r0.id) == "testdev0");
}

BOOST_AUTO_TEST_CASE(the_channel_fd_is_readable_exactly_while_events_wait) {
  cm_side side;
  BOOST_TEST(!readable(side.channel->fd));
  const int flags = ::fcntl(side.channel->fd, F_GETFL);
  ::fcntl(side.channel->fd, F_SETFL, flags | O_NONBLOCK);
  rdma_cm_event* event = nullptr;
  errno = 0;
  BOOST_TEST(T.get_cm_event(side.channel, &event) == -1);
  BOOST_TEST(errno == EAGAIN);
  ::fcntl(side.channel->fd, F_SETFL, flags);

  rdma_cm_id* id = side.new_id();
  std::atomic<int> got{-1};
  std::thread waiter([&] {
    rdma_cm_event* e = nullptr;
    got = T.get_cm_event(side.channel, &e) == 0 ? e->event : -2;
    if (got >= 0) T.ack_cm_event(e);
  });
  sockaddr_storage dst = ip("10.0.0.2", 1);
  BOOST_REQUIRE_EQUAL(T.resolve_addr(id, nullptr, sa(dst), 1000), 0);
  waiter.join();
  BOOST_TEST(got.load() == RDMA_CM_EVENT_ADDR_RESOLVED);
  BOOST_TEST(!readable(side.channel->fd));
  BOOST_REQUIRE_EQUAL(T.resolve_route(id, 1000), 0);
  BOOST_REQUIRE_EQUAL(T.get_cm_event(side.channel, &event), 0);
  errno = 0;
  BOOST_TEST(T.destroy_id(id) == -1);  // librdmacm would block: the event is not acknowledged
  BOOST_TEST(errno == EBUSY);
  BOOST_REQUIRE_EQUAL(T.ack_cm_event(event), 0);
  BOOST_TEST(T.ack_cm_event(event) == -1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(ipv6_addresses_resolve_listen_and_connect) {
  fabric_fixture f(
      {td::roce_device("testdev0", "fd00::1"), td::roce_device("testdev1", "fd00::2")});
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("::"));
  rdma_cm_id* cid = resolved_client(client, ip("fd00::1"), ip("fd00::2", port));
  id_qp cq;
  make_qp(cq, cid);
  rdma_conn_param cp = params("v6");
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  const event_copy request = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(request.id);
  BOOST_TEST(request.id->route.addr.dst_addr.sa_family == AF_INET6);
  id_qp sq;
  make_qp(sq, request.id);
  rdma_conn_param ap = params("");
  BOOST_REQUIRE_EQUAL(T.accept(request.id, &ap), 0);
  expect(client.channel, RDMA_CM_EVENT_ESTABLISHED);
  expect(server.channel, RDMA_CM_EVENT_ESTABLISHED);
  BOOST_REQUIRE_EQUAL(receive(sq, 0, 16, 1), 0);
  BOOST_REQUIRE_EQUAL(post(T, cid->qp, IBV_WR_SEND, {cq.buf.sge(0, 16)}, 1), 0);
  BOOST_TEST(poll_n(T, sq.cq, 1).at(0).status == IBV_WC_SUCCESS);
}

BOOST_FIXTURE_TEST_SUITE(departures, fabric_fixture)

BOOST_AUTO_TEST_CASE(a_request_may_be_acknowledged_after_its_id_is_destroyed) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  rdma_conn_param cp = params("");
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  BOOST_REQUIRE(readable(server.channel->fd, 10000));
  rdma_cm_event* request = nullptr;
  BOOST_REQUIRE_EQUAL(T.get_cm_event(server.channel, &request), 0);
  BOOST_REQUIRE_EQUAL(request->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  BOOST_REQUIRE_EQUAL(T.reject(request->id, nullptr, 0), 0);  // UCX's order: reject, destroy, ack
  BOOST_REQUIRE_EQUAL(T.destroy_id(request->id), 0);
  errno = 0;
  BOOST_TEST(T.destroy_id(listener) == -1);  // the request counts as the listener's event
  BOOST_TEST(errno == EBUSY);
  BOOST_REQUIRE_EQUAL(T.ack_cm_event(request), 0);
  BOOST_TEST(expect(client.channel, RDMA_CM_EVENT_REJECTED).status == 28);
}

BOOST_AUTO_TEST_CASE(a_client_that_gives_up_leaves_the_server_rejected_with_timeout) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  rdma_conn_param cp = params("");
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  const event_copy request = expect(server.channel, RDMA_CM_EVENT_CONNECT_REQUEST);
  server.ids.push_back(request.id);
  BOOST_REQUIRE_EQUAL(T.destroy_id(cid), 0);
  client.forget(cid);
  const event_copy gone = expect(server.channel, RDMA_CM_EVENT_REJECTED);
  BOOST_TEST(gone.id == request.id);
  BOOST_TEST(gone.status == 4);
  errno = 0;
  BOOST_TEST(T.accept(request.id, nullptr) == -1);
  BOOST_TEST(errno == EINVAL);
}

BOOST_AUTO_TEST_CASE(a_listener_destroyed_with_requests_queued_rejects_their_clients) {
  cm_side server, client;
  rdma_cm_id* listener = nullptr;
  const uint16_t port = listen_on(server, listener, ip("10.0.0.2"));
  rdma_cm_id* cid = resolved_client(client, ip("10.0.0.1"), ip("10.0.0.2", port));
  rdma_conn_param cp = params("");
  BOOST_REQUIRE_EQUAL(T.connect(cid, &cp), 0);
  BOOST_REQUIRE_EQUAL(T.destroy_id(listener), 0);
  server.forget(listener);
  BOOST_TEST(!readable(server.channel->fd));  // the request went with its listener
  BOOST_TEST(expect(client.channel, RDMA_CM_EVENT_REJECTED).status == 28);
}

BOOST_AUTO_TEST_CASE(a_peer_process_exit_disconnects_and_its_qp_stops_answering) {
  connection c(1);  // ACK timeout 1: 8 us
  BOOST_REQUIRE_EQUAL(td::peer_gone("testdev1", td::peer_failure::process_exit), 0);
  expect(c.client.channel, RDMA_CM_EVENT_DISCONNECTED);
  BOOST_TEST(qp_attributes(c.cid->qp).qp_state == IBV_QPS_RTS);  // DISCONNECTED moves no QP
  BOOST_REQUIRE_EQUAL(post(T, c.cid->qp, IBV_WR_SEND, {c.cq.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(poll_n(T, c.cq.cq, 1).at(0).status == IBV_WC_RETRY_EXC_ERR);
  BOOST_REQUIRE_EQUAL(T.disconnect(c.cid), 0);
  BOOST_TEST(!readable(c.client.channel->fd, 5));
  errno = 0;
  BOOST_TEST(T.disconnect(c.sid) == -1);  // the vanished side's calls fail
  BOOST_TEST(errno == EIO);
}

BOOST_AUTO_TEST_CASE(a_lost_host_announces_nothing_but_traffic_times_out) {
  connection c(1);
  cm_side late;
  rdma_cm_id* pending =
      resolved_client(late, ip("10.0.0.1"), ip("10.0.0.2", ntohs(T.get_src_port(c.listener))));
  rdma_conn_param cp = params("");
  BOOST_REQUIRE_EQUAL(T.connect(pending, &cp), 0);
  c.server.ids.push_back(expect(c.server.channel, RDMA_CM_EVENT_CONNECT_REQUEST).id);
  BOOST_REQUIRE_EQUAL(td::peer_gone("testdev1", td::peer_failure::host_lost), 0);
  BOOST_TEST(!readable(c.client.channel->fd, 20));
  BOOST_TEST(expect(late.channel, RDMA_CM_EVENT_UNREACHABLE).status == -ETIMEDOUT);
  BOOST_REQUIRE_EQUAL(post(T, c.cid->qp, IBV_WR_SEND, {c.cq.buf.sge(0, 8)}, 1), 0);
  BOOST_TEST(poll_n(T, c.cq.cq, 1).at(0).status == IBV_WC_RETRY_EXC_ERR);
  BOOST_REQUIRE_EQUAL(T.disconnect(c.cid), 0);
  expect(c.client.channel, RDMA_CM_EVENT_DISCONNECTED);  // its own, once it gives up
}

BOOST_AUTO_TEST_CASE(a_server_granting_no_responder_resources_refuses_reads) {
  connection c(19, 0);
  BOOST_REQUIRE_EQUAL(post(T, c.cid->qp, IBV_WR_RDMA_READ, {c.cq.buf.sge(0, 8)}, 1, 0,
                           c.sq.buf.addr(), c.sq.buf.mr->rkey),
                      0);
  BOOST_TEST(poll_n(T, c.cq.cq, 1).at(0).status == IBV_WC_REM_INV_REQ_ERR);
  ibv_async_event event{};
  BOOST_REQUIRE(readable(c.sid->verbs->async_fd, 10000));
  BOOST_REQUIRE_EQUAL(T.get_async_event(c.sid->verbs, &event), 0);
  BOOST_TEST(event.event_type == IBV_EVENT_QP_REQ_ERR);
  T.ack_async_event(&event);
}

BOOST_AUTO_TEST_SUITE_END()
