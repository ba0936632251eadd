// The verbs transport (transports/verbs) on the verbs test device, an in-process software stand-in
// for RDMA hardware (transports/verbs/testdev): device and port discovery, honest iface_attr,
// active messages (inline short, bcopy, zcopy with a gather list), credit flow control under a
// burst (explicit grants and piggy-backed credits), the pending queue, RDMA WRITE/READ with rkeys,
// reads in flight, fence and flush, the completion channel as the event fd, the registration
// cache, the rdmacm connection manager, and injected faults (retry exceeded, QP to error, CQ
// overrun, a peer gone). Nothing here measures RDMA: the test device's timings mean nothing.
// Cases that need a real device skip with a message saying there is none here.
// Every wait is bounded in rounds and time; nothing asserts on timing.
#define BOOST_TEST_MODULE transport_verbs
#include "test_util.hpp"
#include <boost/test/unit_test.hpp>

#include "base/rkey.hpp"
#include "verbs/testdev/testdev.hpp"
#include "verbs/verbs_cm.hpp"
#include "verbs/verbs_component.hpp"
#include "verbs/verbs_config.hpp"
#include "verbs/verbs_ep.hpp"
#include "verbs/verbs_iface.hpp"
#include "verbs/verbs_wire.hpp"
#include "verbs_util.hpp"

#include <comm/transport/transport.hpp>

#include <poll.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

using namespace comm;
using namespace std::chrono_literals;
namespace td = comm::verbs::testdev;

namespace {

// -- helpers --------------------------------------------------------------------------------------

/// Small queues and short timers so tests reach the limits and see timeouts quickly.
verbs::verbs_config small_config() {
  verbs::verbs_config c;
  c.rx_buffers = 64;
  c.segment_size = 1024;
  c.tx_buffers = 32;
  c.tx_queue = 32;
  c.credits = 8;
  c.inline_size = 64;
  c.reg_cache = 4;
  c.ack_timeout = 8;   // 1 ms
  c.retry_count = 3;
  c.min_rnr_timer = 1;
  return c;
}

/// Calls progress on `ifaces` until `done()` holds, at most `limit` long.
bool progress_until(std::initializer_list<tl::iface*> ifaces, const std::function<bool()>& done,
                    std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (uint64_t round = 0; round < 20'000'000; ++round) {
    for (tl::iface* iface : ifaces) iface->progress();
    if (done()) return true;
    if ((round & 255) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}

/// Progresses `ifaces` for `duration`.
void progress_for(std::initializer_list<tl::iface*> ifaces, std::chrono::milliseconds duration) {
  progress_until(ifaces, [] { return false; }, duration);
}

std::vector<uint8_t> pattern(size_t length, uint8_t seed) {
  std::vector<uint8_t> bytes(length);
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return bytes;
}

/// Records every message delivered to the handlers it is installed on.
struct recorder {
  std::vector<std::vector<uint8_t>> messages;
  bool misaligned = false;
  std::vector<void*> kept;  ///< descriptors held (keep == true)
  bool keep = false;

  static status handler(void* arg, void* data, size_t length, unsigned flags) {
    auto* self = static_cast<recorder*>(arg);
    if (reinterpret_cast<uintptr_t>(data) % 8 != 0) self->misaligned = true;
    const auto* p = static_cast<const uint8_t*>(data);
    self->messages.emplace_back(p, p + length);
    if (self->keep && (flags & tl::am_flag_desc) != 0) {
      self->kept.push_back(data);
      return status::in_progress;
    }
    return status::ok;
  }
  void install(tl::iface& iface, tl::am_id id) { iface.set_am_handler(id, &handler, this); }
};

struct completion_probe : tl::completion {
  int calls = 0;
  completion_probe() { reset(); }
  void reset() {
    count = 1;
    result = status::ok;
    calls = 0;
    func = [](tl::completion* self) { ++static_cast<completion_probe*>(self)->calls; };
  }
};

struct bcopy_source {
  std::vector<uint8_t> bytes;
  static size_t pack(void* dest, void* arg) {
    const auto& b = static_cast<bcopy_source*>(arg)->bytes;
    if (!b.empty()) std::memcpy(dest, b.data(), b.size());
    return b.size();
  }
};

/// Records what the error handler was told.
struct failure_log {
  struct entry {
    tl::ep* ep;
    status reason;
  };
  std::vector<entry> entries;
  static void handler(void* arg, tl::ep* ep, status reason) {
    static_cast<failure_log*>(arg)->entries.push_back({ep, reason});
  }
  void install(tl::iface& iface) { iface.set_error_handler(&handler, this); }
};

verbs::verbs_conn& conn_of(tl::ep& ep) { return *static_cast<verbs::verbs_ep&>(ep).conn(); }

/// Two RoCE devices of the verbs test device.
std::vector<td::device_spec> two_roce_devices() {
  return {td::roce_device("testdev0", "10.0.0.1"), td::roce_device("testdev1", "10.0.0.2")};
}

/// Two RoCE test devices ("two processes"), the verbs component over the test device, one
/// interface on each, an endpoint from a to b; leaks are checked at the end.
struct two_sides {
  td::fabric_scope fabric;
  std::unique_ptr<tl::component> component;
  std::unique_ptr<tl::iface> a;
  std::unique_ptr<tl::iface> b;
  std::unique_ptr<tl::ep> ab;
  recorder at_b;
  recorder at_a;
  failure_log failures_a;
  failure_log failures_b;

  explicit two_sides(verbs::verbs_config config = small_config(),
                     std::vector<td::device_spec> devices = two_roce_devices())
      : fabric(devices), component(verbs::make_verbs_component(td::table(), config)) {
    a = open(devices[0].name + ":1");
    b = open(devices.size() > 1 ? devices[1].name + ":1" : devices[0].name + ":1");
    at_b.install(*b, 3);
    at_a.install(*a, 3);
    failures_a.install(*a);
    failures_b.install(*b);
    ab = connect(*a, *b);
  }

  ~two_sides() {
    ab.reset();
    a.reset();
    b.reset();
    component.reset();
    BOOST_TEST(fabric.finish() == 0u, "objects left on the verbs test device");
  }

  std::unique_ptr<tl::iface> open(const std::string& device) {
    tl::iface_params params;
    params.device = device;
    std::unique_ptr<tl::iface> iface;
    const status st = component->open(params, iface);
    BOOST_REQUIRE_MESSAGE(st == status::ok, "open " << device << " on the verbs test device: "
                                                    << to_string(st));
    return iface;
  }

  /// An endpoint from `from` to `to`, connected (its first message can go).
  std::unique_ptr<tl::ep> connect(tl::iface& from, tl::iface& to) {
    std::unique_ptr<tl::ep> ep;
    BOOST_REQUIRE(from.create_ep(to.device_address(), to.iface_address(), ep) == status::ok);
    const auto up = [&] { return conn_of(*ep).state() != verbs::conn_state::connecting; };
    BOOST_REQUIRE_MESSAGE(progress_until({&from, &to}, up),
                          "the connection on the verbs test device never came up");
    BOOST_REQUIRE(conn_of(*ep).state() == verbs::conn_state::ready);
    return ep;
  }

  bool deliver_to_b(size_t count) {
    return progress_until({a.get(), b.get()}, [&] { return at_b.messages.size() >= count; });
  }
};

}  // namespace

// -- discovery ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(real_backend_reports_no_rdma_device_here) {
  auto real = verbs::make_verbs_component(verbs::rdma_core_api());
  if (!real->devices().empty()) {
    BOOST_TEST_MESSAGE("a real RDMA device exists: " << real->devices().front());
    return;
  }
  BOOST_TEST(real->unavailable_reason().rfind("no RDMA device", 0) == 0,
             "reason: " << real->unavailable_reason());
  std::unique_ptr<tl::iface> iface;
  BOOST_TEST(real->open(tl::iface_params{}, iface) == status::no_elem);
}

BOOST_AUTO_TEST_CASE(real_device_exchange_skips_without_hardware) {
  auto real = verbs::make_verbs_component(verbs::rdma_core_api());
  if (real->devices().empty()) {
    BOOST_TEST_MESSAGE("skipped: no RDMA device exists on this machine ("
                       << real->unavailable_reason() << ")");
    return;
  }
  std::unique_ptr<tl::iface> iface;
  tl::iface_params params;
  params.device = real->devices().front();
  BOOST_TEST(real->open(params, iface) == status::ok);
}

BOOST_AUTO_TEST_CASE(test_device_ports_are_listed_and_attributes_are_honest) {
  td::device_spec roce = td::roce_device("testdev0", "10.0.0.1");
  roce.limits.max_qp_init_rd_atom = 5;
  td::fabric_scope fabric({roce, td::ib_device("testdev1", "10.1.0.2")});
  {
    auto component = verbs::make_verbs_component(td::table(), small_config());
    BOOST_TEST(component->name() == "verbs");
    const auto devices = component->devices();
    BOOST_TEST(devices == (std::vector<std::string>{"testdev0:1", "testdev1:1"}));
    BOOST_TEST(component->unavailable_reason().empty());
    std::unique_ptr<tl::iface> iface;
    tl::iface_params params;
    params.device = "testdev0:1";
    BOOST_REQUIRE(component->open(params, iface) == status::ok);
    const tl::iface_attr& attr = iface->attr();
    // Inline asked for, and one receive buffer, less the header.
    BOOST_TEST(attr.max_short == 64u - verbs::message_header_size);
    BOOST_TEST(attr.max_bcopy == 1024u - verbs::message_header_size);
    BOOST_TEST(attr.max_zcopy + attr.max_hdr + verbs::message_header_size == 1024u);
    BOOST_TEST(attr.max_outstanding_reads == 5u);  // the device's max_qp_init_rd_atom
    BOOST_TEST(attr.max_iov == verbs::max_zcopy_iov);
    BOOST_TEST((attr.caps & tl::cap_get_zcopy) != 0u);
    BOOST_TEST((attr.caps & tl::cap_peer_failure) != 0u);
    BOOST_TEST(iface->event_fd() >= 0);
    BOOST_TEST(iface->info().find("testdev0:1 (RoCE") != std::string::npos, iface->info());
    std::unique_ptr<tl::iface> unknown;
    params.device = "testdev9:1";
    BOOST_TEST(component->open(params, unknown) == status::no_elem);
    params.device = "testdev0:1";
    params.auth_key = "secret";
    BOOST_TEST(component->open(params, unknown) == status::unsupported,
               "a cluster secret it cannot enforce is refused, not ignored");
  }
  BOOST_TEST(fabric.finish() == 0u);
}

BOOST_AUTO_TEST_CASE(comm_verbs_knobs_choose_ports_and_refuse_bad_values_on_the_test_device) {
  td::fabric_scope fabric(two_roce_devices());
  auto component = verbs::make_verbs_component(td::table());
  BOOST_TEST(component->knobs().size() == verbs::verbs_knobs.size());
  const tl::options second_only{{"COMM_VERBS_DEVICE", "testdev1:1,nosuch:1"}};
  BOOST_TEST(component->devices(second_only) == (std::vector<std::string>{"testdev1:1"}));
  const tl::options none{{"COMM_VERBS_DEVICE", "nosuch:1"}};
  BOOST_TEST(component->devices(none).empty());
  BOOST_TEST(component->unavailable_reason(none).find("COMM_VERBS_DEVICE") != std::string::npos);
  std::string why;
  BOOST_TEST(component->check_options({{"COMM_VERBS_CREDITS", "8"}}, &why) == status::ok);
  for (const tl::options& bad : {tl::options{{"COMM_VERBS_CREDITS", "1"}},
                                 tl::options{{"COMM_VERBS_RX_BUFFERS", "40"}},
                                 tl::options{{"COMM_VERBS_SEG_SIZE", "12q"}},
                                 tl::options{{"COMM_VERBS_CREDIT", "8"}}}) {
    why.clear();
    BOOST_TEST(component->check_options(bad, &why) == status::invalid_param);
    BOOST_TEST(why.find(bad.begin()->first) != std::string::npos, why);
    tl::iface_params params;
    params.opts = bad;
    std::unique_ptr<tl::iface> iface;
    BOOST_TEST(component->open(params, iface) == status::invalid_param);
    BOOST_TEST(!iface);
  }
}

BOOST_AUTO_TEST_CASE(a_test_device_with_its_port_down_is_not_listed) {
  td::fabric_scope fabric({td::roce_device("testdev0", "10.0.0.1")});
  auto component = verbs::make_verbs_component(td::table(), small_config());
  BOOST_REQUIRE(td::set_port_state("testdev0", 1, IBV_PORT_DOWN) == 0);
  BOOST_TEST(component->devices().empty());
  BOOST_TEST(component->unavailable_reason().rfind("no RDMA device", 0) == 0u,
             component->unavailable_reason());
  BOOST_TEST(fabric.finish() == 0u);
}

// -- active messages ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(am_short_bcopy_and_zcopy_arrive_intact_over_the_test_device) {
  two_sides s;
  const auto header = pattern(16, 1);
  const auto payload = pattern(s.a->attr().max_short - header.size(), 2);  // inline, all of it
  BOOST_REQUIRE(s.ab->am_short(3, header.data(), header.size(), payload.data(), payload.size()) ==
                status::ok);
  bcopy_source source{pattern(s.a->attr().max_bcopy, 3)};
  BOOST_REQUIRE(s.ab->am_bcopy(3, &bcopy_source::pack, &source) ==
                static_cast<ssize_t>(source.bytes.size()));
  const auto zheader = pattern(s.a->attr().max_hdr, 4);
  const auto part1 = pattern(300, 5);
  const auto part2 = pattern(s.a->attr().max_zcopy - 300, 6);
  tl::iov iov[2] = {{part1.data(), part1.size()}, {part2.data(), part2.size()}};
  completion_probe done;
  BOOST_REQUIRE(s.ab->am_zcopy(3, zheader.data(), zheader.size(), iov, 2, &done) ==
                status::in_progress);
  BOOST_REQUIRE(s.deliver_to_b(3));
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST(done.result == status::ok);
  std::vector<uint8_t> expect_short = header;
  expect_short.insert(expect_short.end(), payload.begin(), payload.end());
  BOOST_TEST(s.at_b.messages[0] == expect_short);
  BOOST_TEST(s.at_b.messages[1] == source.bytes);
  std::vector<uint8_t> expect_zcopy = zheader;
  expect_zcopy.insert(expect_zcopy.end(), part1.begin(), part1.end());
  expect_zcopy.insert(expect_zcopy.end(), part2.begin(), part2.end());
  BOOST_TEST(s.at_b.messages[2] == expect_zcopy);
  BOOST_TEST(!s.at_b.misaligned);
}

BOOST_AUTO_TEST_CASE(oversized_and_invalid_sends_are_refused_on_the_test_device) {
  two_sides s;
  const auto big = pattern(s.a->attr().max_short + 1, 1);
  BOOST_TEST(s.ab->am_short(3, nullptr, 0, big.data(), big.size()) == status::invalid_param);
  BOOST_TEST(s.ab->am_short(tl::am_id_count, nullptr, 0, big.data(), 1) == status::invalid_param);
  bcopy_source source{pattern(s.a->attr().max_bcopy + 1, 2)};
  BOOST_TEST(s.ab->am_bcopy(3, &bcopy_source::pack, &source) ==
             static_cast<ssize_t>(status::exceeds_limit));
  const auto zbig = pattern(s.a->attr().max_zcopy + 1, 3);
  tl::iov iov{zbig.data(), zbig.size()};
  BOOST_TEST(s.ab->am_zcopy(3, nullptr, 0, &iov, 1, nullptr) == status::invalid_param);
  // Nothing went out, and the interface still works.
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, big.data(), 8) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(1));
  BOOST_TEST(s.at_b.messages.size() == 1u);
}

BOOST_AUTO_TEST_CASE(infiniband_ports_connect_by_lid_on_the_test_device) {
  // rdmacm reaches an InfiniBand port by its IPoIB address: the host's loopback address here.
  two_sides s(small_config(), {td::ib_device("testdev0", "127.0.0.1")});
  const uint64_t word = 0x1122334455667788ull;
  BOOST_REQUIRE(s.ab->am_short(3, &word, sizeof(word), nullptr, 0) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(1));
  BOOST_TEST(s.at_b.messages[0].size() == sizeof(word));
  BOOST_TEST(s.b->info().find("InfiniBand") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_reply_endpoint_shares_the_connection_both_ways) {
  two_sides s;
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "ping", 4) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(1));
  auto ba = s.connect(*s.b, *s.a);
  BOOST_TEST(conn_of(*ba).passive(), "b's endpoint reuses the connection a opened");
  BOOST_TEST(static_cast<verbs::verbs_iface&>(*s.b).connections() == 1u);
  BOOST_REQUIRE(ba->am_short(3, nullptr, 0, "pong", 4) == status::ok);
  BOOST_REQUIRE(
      progress_until({s.a.get(), s.b.get()}, [&] { return s.at_a.messages.size() == 1; }));
  BOOST_TEST(std::string(s.at_a.messages[0].begin(), s.at_a.messages[0].end()) == "pong");
  ba.reset();
}

BOOST_AUTO_TEST_CASE(the_opener_leaving_a_shared_connection_leaves_it_to_the_peer) {
  two_sides s;
  auto& a = static_cast<verbs::verbs_iface&>(*s.a);
  auto& b = static_cast<verbs::verbs_iface&>(*s.b);
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "ping", 4) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(1));
  auto ba = s.connect(*s.b, *s.a);
  BOOST_REQUIRE(conn_of(*ba).passive());
  // a's endpoint, which opened the connection, goes: b's endpoint on it is told nothing bad and
  // keeps sending, well past its credits (a, with no endpoint on it, grants them back).
  s.ab.reset();
  BOOST_REQUIRE(
      progress_until({s.a.get(), s.b.get()}, [&] { return conn_of(*ba).peer_released(); }));
  const unsigned total = 4 * small_config().credits;
  for (unsigned i = 0; i < total; ++i) {
    BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] {
      return ba->am_short(3, nullptr, 0, &i, sizeof(i)) == status::ok;
    }));
  }
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                               [&] { return s.at_a.messages.size() == total; }));
  BOOST_TEST(s.failures_b.entries.empty(), "b's endpoint did not fail");
  // a does not claim the connection again: a new endpoint of a opens its own.
  auto ab2 = s.connect(*s.a, *s.b);
  BOOST_TEST(!conn_of(*ab2).passive());
  // b's endpoint leaves too: the connection closes on both sides, and nobody is told of a failure.
  ba.reset();
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                               [&] { return a.connections() == 1 && b.connections() == 1; }));
  BOOST_TEST(s.failures_a.entries.empty());
  BOOST_TEST(s.failures_b.entries.empty());
  ab2.reset();
}

BOOST_AUTO_TEST_CASE(claiming_a_connection_whose_opener_is_leaving_is_safe) {
  two_sides s;
  auto c = s.open("testdev0:1");
  auto& b = static_cast<verbs::verbs_iface&>(*s.b);
  auto& cv = static_cast<verbs::verbs_iface&>(*c);
  recorder at_c;
  at_c.install(*c, 3);
  failure_log failures_c;
  failures_c.install(*c);
  auto cb = s.connect(*c, *s.b);
  const size_t before = b.connections();
  // c's endpoint leaves; its release message is on its way while b, not having read it, creates
  // an endpoint towards c and claims that very connection.
  cb.reset();
  c->progress();
  std::unique_ptr<tl::ep> bc;
  BOOST_REQUIRE(s.b->create_ep(c->device_address(), c->iface_address(), bc) == status::ok);
  BOOST_REQUIRE(conn_of(*bc).passive());
  BOOST_TEST(b.connections() == before, "b claimed the connection c opened");
  // The release reaches b, which keeps the connection for its endpoint: it works.
  for (unsigned i = 0; i < 3; ++i) {
    BOOST_REQUIRE(progress_until({s.b.get(), c.get()}, [&] {
      return bc->am_short(3, nullptr, 0, &i, sizeof(i)) == status::ok;
    }));
  }
  BOOST_REQUIRE(progress_until({s.b.get(), c.get()}, [&] { return at_c.messages.size() == 3; }));
  BOOST_TEST(conn_of(*bc).peer_released());
  BOOST_TEST(s.failures_b.entries.empty(), "b's endpoint did not fail");
  // b's endpoint leaves: now nobody uses the connection, and it closes on both sides.
  bc.reset();
  BOOST_REQUIRE(progress_until({s.b.get(), c.get()}, [&] {
    return cv.connections() == 0 && b.connections() == before - 1;
  }));
  BOOST_TEST(failures_c.entries.empty());
  c.reset();
}

// -- credits and the pending queue ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_burst_stops_at_the_credits_granted_and_resumes_on_grants) {
  two_sides s;
  const uint16_t credits = small_config().credits;
  // b does not progress: a may send exactly the receive buffers b granted, then no_resource.
  unsigned sent = 0;
  while (sent < 100 && s.ab->am_short(3, nullptr, 0, &sent, sizeof(sent)) == status::ok) ++sent;
  BOOST_TEST(sent == credits);
  BOOST_TEST(conn_of(*s.ab).tx_credits() == 0u);
  // b delivers them and, having nothing to piggy-back the credits on, sends an explicit grant.
  BOOST_REQUIRE(s.deliver_to_b(credits));
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                               [&] { return conn_of(*s.ab).tx_credits() == credits; }));
  BOOST_TEST(td::stats().rnr_naks == 0u, "the receiver was never overrun");
  // A long burst through the pending queue: every message arrives, in order.
  struct parked : tl::pending_req {
    tl::ep* ep = nullptr;
    unsigned next = 0;
    unsigned total = 0;
  } op;
  op.ep = s.ab.get();
  op.total = 500;
  op.func = [](tl::pending_req* self) {
    auto* p = static_cast<parked*>(self);
    while (p->next < p->total) {
      const status st = p->ep->am_short(3, nullptr, 0, &p->next, sizeof(p->next));
      if (st == status::no_resource) return status::no_resource;
      ++p->next;
    }
    return status::ok;
  };
  s.at_b.messages.clear();
  BOOST_TEST(s.ab->pending_add(&op) == status::busy);  // resources free now: the caller retries
  while (op.next < op.total && op.func(&op) == status::ok) {
  }
  BOOST_REQUIRE(s.ab->pending_add(&op) == status::ok);
  BOOST_TEST(s.ab->am_short(3, nullptr, 0, "x", 1) == status::no_resource,
             "a new send may not overtake the parked one");
  BOOST_REQUIRE(s.deliver_to_b(op.total));
  bool in_order = true;
  for (unsigned i = 0; i < op.total; ++i) {
    unsigned got = 0;
    std::memcpy(&got, s.at_b.messages[i].data(), sizeof(got));
    in_order = in_order && got == i;
  }
  BOOST_TEST(in_order);
  BOOST_TEST(td::stats().rnr_naks == 0u);
  BOOST_TEST(conn_of(*s.ab).grants_sent() == 0u, "a only sent");
  auto ba = s.connect(*s.b, *s.a);
  BOOST_TEST(conn_of(*ba).grants_sent() > 0u, "b returned credits by explicit grants");
}

BOOST_AUTO_TEST_CASE(credits_ride_back_piggy_backed_on_replies) {
  two_sides s;
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "hi", 2) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(1));
  auto ba = s.connect(*s.b, *s.a);
  // Ping-pong: each reply carries the credit of the ping it answers, so no grant is ever needed.
  for (unsigned round = 0; round < 100; ++round) {
    BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, &round, sizeof(round)) == status::ok);
    BOOST_REQUIRE(s.deliver_to_b(round + 2));
    BOOST_REQUIRE(ba->am_short(3, nullptr, 0, &round, sizeof(round)) == status::ok);
    BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                                 [&] { return s.at_a.messages.size() == round + 1; }));
  }
  BOOST_TEST(conn_of(*ba).grants_sent() == 0u);
  BOOST_TEST(conn_of(*s.ab).grants_sent() == 0u);
  BOOST_TEST(conn_of(*s.ab).tx_credits() >= small_config().credits - 1u);
}

BOOST_AUTO_TEST_CASE(kept_descriptors_hold_their_credits_until_released) {
  two_sides s;
  s.at_b.keep = true;
  const uint16_t credits = small_config().credits;
  // At most half of a peer's credits are lent, so keeping never stalls the peer on its own.
  const size_t lent = s.b->attr().max_am_descs;
  BOOST_TEST(lent == credits / 2u);
  for (unsigned i = 0; i < credits; ++i) {
    BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, &i, sizeof(i)) == status::ok);
  }
  BOOST_REQUIRE(s.deliver_to_b(credits));
  BOOST_TEST(s.at_b.kept.size() == lent);
  BOOST_TEST(progress_until({s.a.get(), s.b.get()},
                            [&] { return conn_of(*s.ab).tx_credits() == credits - lent; }));
  progress_for({s.a.get(), s.b.get()}, 50ms);
  BOOST_TEST(conn_of(*s.ab).tx_credits() == credits - lent, "buffers b keeps are not granted back");
  for (void* desc : s.at_b.kept) s.b->release_am_desc(desc);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                               [&] { return conn_of(*s.ab).tx_credits() == credits; }));
  BOOST_TEST(static_cast<verbs::verbs_iface&>(*s.b).rx_posted() == small_config().rx_buffers);
}

BOOST_AUTO_TEST_CASE(send_slots_run_out_before_credits_with_a_short_send_queue) {
  verbs::verbs_config config = small_config();
  config.tx_queue = 4;
  config.credits = 16;
  two_sides s(config);
  // Unsignaled inline sends hold their slots until a signaled completion frees them.
  unsigned sent = 0;
  while (sent < 100 && s.ab->am_short(3, nullptr, 0, &sent, sizeof(sent)) == status::ok) ++sent;
  BOOST_TEST(sent <= 4u);
  BOOST_TEST(conn_of(*s.ab).tx_credits() > 0u, "it was the send queue, not the credits");
  progress_for({s.a.get()}, 10ms);
  BOOST_TEST(s.ab->am_short(3, nullptr, 0, &sent, sizeof(sent)) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(sent + 1));
}

BOOST_AUTO_TEST_CASE(bcopy_bursts_on_many_connections_never_strand_every_send_buffer) {
  // bcopy sends go unsignaled (every 16th of a 32-entry queue is signaled): their send buffers come
  // back with a later signaled completion. Three connections could then hold 3 x 15 of the 32
  // buffers with no completion coming; once half are taken, a send holding one is signaled.
  two_sides s;
  std::unique_ptr<tl::ep> more[2] = {s.connect(*s.a, *s.b), s.connect(*s.a, *s.b)};
  tl::ep* eps[3] = {s.ab.get(), more[0].get(), more[1].get()};
  BOOST_REQUIRE(&conn_of(*eps[1]) != &conn_of(*eps[2]));
  constexpr unsigned per_ep = 200;
  unsigned sent[3] = {};
  bcopy_source source{pattern(64, 7)};
  const bool all_sent = progress_until({s.a.get(), s.b.get()}, [&] {
    for (int i = 0; i < 3; ++i) {
      if (sent[i] < per_ep && eps[i]->am_bcopy(3, &bcopy_source::pack, &source) > 0) ++sent[i];
    }
    return sent[0] == per_ep && sent[1] == per_ep && sent[2] == per_ep;
  });
  BOOST_TEST(all_sent, "sent " << sent[0] << ", " << sent[1] << ", " << sent[2] << " of " << per_ep);
  BOOST_REQUIRE(s.deliver_to_b(3 * per_ep));
  BOOST_TEST(s.at_b.messages.size() == 3 * per_ep);
  BOOST_TEST(s.at_b.messages.back() == source.bytes);
}

BOOST_AUTO_TEST_CASE(bcopy_sends_are_unsignaled_until_half_the_send_buffers_are_taken) {
  // A send queue long enough that its every-tx_queue/2-th signal never comes into play, and
  // credits for every send: only the send-buffer rule decides which bcopy sends are signaled.
  verbs::verbs_config config = small_config();
  config.tx_queue = 128;
  config.credits = 32;
  config.rx_buffers = 128;
  two_sides s(config);
  auto& a = static_cast<verbs::verbs_iface&>(*s.a);
  ibv_qp* const qp = conn_of(*s.ab).qp();
  const uint64_t before = td::send_completions(qp);
  bcopy_source source{pattern(64, 9)};
  // 24 sends take 24 of 32 buffers: the 17th and later find fewer than 16 free and are signaled.
  for (unsigned i = 0; i < 24; ++i) {
    BOOST_REQUIRE(s.ab->am_bcopy(3, &bcopy_source::pack, &source) > 0);
  }
  BOOST_REQUIRE(s.deliver_to_b(24));
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return a.tx_buffers_free() == 32; }));
  BOOST_TEST(td::send_completions(qp) - before == 8u, "one per signaled send on the device");
  // With most buffers free, sends stay unsignaled and keep their buffers until a flush.
  for (unsigned i = 0; i < 10; ++i) {
    BOOST_REQUIRE(s.ab->am_bcopy(3, &bcopy_source::pack, &source) > 0);
  }
  BOOST_REQUIRE(s.deliver_to_b(34));
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_TEST(td::send_completions(qp) - before == 8u, "no completion for unsignaled sends");
  BOOST_TEST(a.tx_buffers_free() == 22u, "held behind the unsignaled sends");
  BOOST_TEST(s.ab->flush(nullptr) == status::in_progress);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                               [&] { return s.ab->flush(nullptr) == status::ok; }));
  BOOST_TEST(td::send_completions(qp) - before == 9u, "the flush's one signaled request");
  BOOST_TEST(a.tx_buffers_free() == 32u);
}

namespace {

/// A parked am_short that counts its runs.
struct parked_short : tl::pending_req {
  tl::ep* ep = nullptr;
  int runs = 0;
  parked_short() {
    func = [](tl::pending_req* self) {
      auto* p = static_cast<parked_short*>(self);
      ++p->runs;
      return p->ep->am_short(3, nullptr, 0, "p", 1);
    };
  }
};

/// Sends on `ep` until it runs out of credits; true when it did within 100 sends.
bool use_every_credit(tl::ep& ep) {
  for (unsigned i = 0; i < 100; ++i) {
    if (ep.am_short(3, nullptr, 0, &i, sizeof(i)) == status::no_resource) return true;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(progress_watches_only_connections_with_a_grant_due_or_parked_operations) {
  two_sides s;
  auto& a = static_cast<verbs::verbs_iface&>(*s.a);
  auto& b = static_cast<verbs::verbs_iface&>(*s.b);
  std::unique_ptr<tl::ep> more[2] = {s.connect(*s.a, *s.b), s.connect(*s.a, *s.b)};
  for (auto& ep : more) BOOST_REQUIRE(ep->am_short(3, nullptr, 0, "m", 1) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(2));
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_TEST(a.watched_connections() == 0u, "idle connections are not looked at");
  BOOST_TEST(b.watched_connections() == 0u, "one credit each to return: no grant due");
  // A parked operation watches its connection alone, until it has run.
  BOOST_REQUIRE(use_every_credit(*s.ab));
  parked_short op;
  op.ep = s.ab.get();
  BOOST_REQUIRE(s.ab->pending_add(&op) == status::ok);
  BOOST_TEST(a.watched_connections() == 1u);
  progress_for({s.a.get()}, 20ms);
  BOOST_TEST(op.runs == 0, "no credits came back: nothing to run it for");
  BOOST_TEST(a.watched_connections() == 1u);
  const size_t delivered = s.at_b.messages.size();
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return op.runs == 1; }));
  BOOST_TEST(a.watched_connections() == 0u);
  BOOST_REQUIRE(s.deliver_to_b(delivered + 1));
  BOOST_TEST(b.watched_connections() == 0u, "its grants went out; one credit left to return");
  // A connection closed with an operation parked leaves the list.
  BOOST_REQUIRE(use_every_credit(*more[0]));
  parked_short orphan;
  orphan.ep = more[0].get();
  BOOST_REQUIRE(more[0]->pending_add(&orphan) == status::ok);
  BOOST_TEST(a.watched_connections() == 1u);
  more[0].reset();
  s.a->progress();
  BOOST_TEST(a.watched_connections() == 0u);
  BOOST_TEST(orphan.runs == 0);
}

// -- RDMA, fence, flush -------------------------------------------------------------------------

namespace {

/// A buffer of b's registered with b's memory domain, its key unpacked by a.
struct remote_buffer {
  tl::iface& owner;
  tl::iface& user;
  std::vector<uint8_t> bytes;
  tl::mem_handle* handle = nullptr;
  tl::remote_key key;

  remote_buffer(tl::iface& owner, tl::iface& user, size_t size)
      : owner(owner), user(user), bytes(pattern(size, 9)) {
    BOOST_REQUIRE(owner.memory_domain()->mem_reg(bytes.data(), bytes.size(), &handle) ==
                  status::ok);
    std::vector<uint8_t> packed;
    BOOST_REQUIRE(owner.memory_domain()->rkey_pack(handle, packed) == status::ok);
    BOOST_REQUIRE(packed.size() == sizeof(tl::packed_rkey));
    BOOST_REQUIRE(user.memory_domain()->rkey_unpack(packed.data(), packed.size(), &key) ==
                  status::ok);
  }
  ~remote_buffer() {
    user.memory_domain()->rkey_release(&key);
    owner.memory_domain()->mem_dereg(handle);
  }
  uint64_t address(size_t offset = 0) const {
    return reinterpret_cast<uint64_t>(bytes.data()) + offset;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(put_and_get_zcopy_move_registered_memory_on_the_test_device) {
  two_sides s;
  remote_buffer remote(*s.b, *s.a, 64 * 1024);
  // get: two local entries filled in order from one remote range.
  std::vector<uint8_t> first(1000), second(3000);
  tl::iov into[2] = {{first.data(), first.size()}, {second.data(), second.size()}};
  completion_probe got;
  BOOST_REQUIRE(s.ab->get_zcopy(into, 2, remote.address(100), remote.key, &got) ==
                status::in_progress);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return got.calls == 1; }));
  BOOST_TEST(got.result == status::ok);
  BOOST_TEST(std::memcmp(first.data(), remote.bytes.data() + 100, first.size()) == 0);
  BOOST_TEST(std::memcmp(second.data(), remote.bytes.data() + 1100, second.size()) == 0);
  // put: a registered local buffer (user region) and an unregistered one (implicit).
  tl::mem_handle* local_handle = nullptr;
  auto registered = pattern(2048, 20);
  BOOST_REQUIRE(s.a->memory_domain()->mem_reg(registered.data(), registered.size(),
                                              &local_handle) == status::ok);
  const auto loose = pattern(512, 21);
  tl::iov from[2] = {{registered.data(), registered.size()}, {loose.data(), loose.size()}};
  completion_probe put;
  BOOST_REQUIRE(s.ab->put_zcopy(from, 2, remote.address(8192), remote.key, &put) ==
                status::in_progress);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return put.calls == 1; }));
  BOOST_TEST(put.result == status::ok);
  BOOST_TEST(std::memcmp(remote.bytes.data() + 8192, registered.data(), registered.size()) == 0);
  BOOST_TEST(std::memcmp(remote.bytes.data() + 8192 + 2048, loose.data(), loose.size()) == 0);
  auto& md = static_cast<verbs::verbs_md&>(*s.a->memory_domain());
  BOOST_TEST(md.implicit_misses() == 3u, "first, second and loose were registered implicitly");
  BOOST_TEST(s.a->memory_domain()->mem_dereg(local_handle) == status::ok);
}

BOOST_AUTO_TEST_CASE(rdma_outside_the_key_is_refused_before_it_leaves) {
  two_sides s;
  remote_buffer remote(*s.b, *s.a, 4096);
  std::vector<uint8_t> local(100);
  tl::iov iov{local.data(), local.size()};
  BOOST_TEST(s.ab->get_zcopy(&iov, 1, remote.address(4000), remote.key, nullptr) ==
             status::length_error);
  BOOST_TEST(s.ab->put_zcopy(&iov, 1, remote.address() - 200, remote.key, nullptr) ==
             status::protection_error);
  tl::remote_key foreign;
  BOOST_TEST(s.ab->get_zcopy(&iov, 1, remote.address(), foreign, nullptr) == status::invalid_param);
  const uint8_t garbage[48] = {1, 2, 3};
  tl::remote_key bad;
  BOOST_TEST(s.a->memory_domain()->rkey_unpack(garbage, sizeof(garbage), &bad) ==
             status::invalid_param);
  BOOST_TEST((conn_of(*s.ab).state() == verbs::conn_state::ready));
}

BOOST_AUTO_TEST_CASE(a_stale_rkey_fails_the_operation_and_the_endpoint_once) {
  two_sides s;
  std::vector<uint8_t> packed;
  auto bytes = pattern(4096, 3);
  {
    tl::mem_handle* handle = nullptr;
    BOOST_REQUIRE(s.b->memory_domain()->mem_reg(bytes.data(), bytes.size(), &handle) == status::ok);
    BOOST_REQUIRE(s.b->memory_domain()->rkey_pack(handle, packed) == status::ok);
    BOOST_REQUIRE(s.b->memory_domain()->mem_dereg(handle) == status::ok);  // the MR is gone
  }
  tl::remote_key key;
  tl::md& md = *s.a->memory_domain();
  BOOST_REQUIRE(md.rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  std::vector<uint8_t> local(64);
  tl::iov iov{local.data(), local.size()};
  completion_probe got;
  BOOST_REQUIRE(s.ab->get_zcopy(&iov, 1, reinterpret_cast<uint64_t>(bytes.data()), key, &got) ==
                status::in_progress);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return got.calls == 1; }));
  BOOST_TEST(got.result == status::protection_error);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                               [&] { return !s.failures_a.entries.empty(); }));
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_REQUIRE(s.failures_a.entries.size() == 1u);
  BOOST_TEST(s.failures_a.entries[0].ep == s.ab.get());
  BOOST_TEST(s.failures_a.entries[0].reason == status::protection_error);
  BOOST_TEST(s.ab->am_short(3, nullptr, 0, "x", 1) == status::protection_error);
  s.a->memory_domain()->rkey_release(&key);
}

BOOST_AUTO_TEST_CASE(reads_in_flight_stay_within_both_sides_limits) {
  td::device_spec d0 = td::roce_device("testdev0", "10.0.0.1");
  td::device_spec d1 = td::roce_device("testdev1", "10.0.0.2");
  d0.limits.max_qp_init_rd_atom = 6;  // a may have 6 in flight...
  d1.limits.max_qp_rd_atom = 3;       // ...but b answers 3 at once
  two_sides s(small_config(), {d0, d1});
  BOOST_TEST(conn_of(*s.ab).max_reads() == 3u);
  remote_buffer remote(*s.b, *s.a, 4096);
  td::hold_read_responses(true);
  std::vector<uint8_t> local(8 * 64);
  completion_probe got;
  unsigned posted = 0;
  for (unsigned i = 0; i < 8; ++i) {
    tl::iov iov{local.data() + i * 64, 64};
    const status st = s.ab->get_zcopy(&iov, 1, remote.address(i * 64), remote.key, &got);
    if (st != status::in_progress) {
      BOOST_TEST(st == status::no_resource);
      break;
    }
    ++posted;
  }
  BOOST_TEST(posted == 3u);
  td::hold_read_responses(false);
  got.count = static_cast<int>(posted);  // one per read, none answered yet
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return got.calls == 1; }));
  BOOST_TEST(got.result == status::ok);
  BOOST_TEST(std::memcmp(local.data(), remote.bytes.data(), 3 * 64) == 0);
  BOOST_TEST(conn_of(*s.ab).reads_in_flight() == 0u);
  BOOST_TEST(s.failures_b.entries.empty(), "b never saw more reads than it answers");
}

BOOST_AUTO_TEST_CASE(a_fence_keeps_a_put_behind_an_earlier_get) {
  two_sides s;
  remote_buffer remote(*s.b, *s.a, 4096);
  const auto original = remote.bytes;
  std::vector<uint8_t> read_back(256);
  const auto overwrite = pattern(256, 77);
  td::hold_read_responses(true);
  tl::iov get_iov{read_back.data(), read_back.size()};
  completion_probe got;
  BOOST_REQUIRE(s.ab->get_zcopy(&get_iov, 1, remote.address(), remote.key, &got) ==
                status::in_progress);
  BOOST_REQUIRE(s.ab->fence() == status::ok);
  tl::iov put_iov{overwrite.data(), overwrite.size()};
  completion_probe put;
  BOOST_REQUIRE(s.ab->put_zcopy(&put_iov, 1, remote.address(), remote.key, &put) ==
                status::in_progress);
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_TEST(std::memcmp(remote.bytes.data(), original.data(), 256) == 0,
             "the fenced put waits for the read");
  td::hold_read_responses(false);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return got.calls + put.calls == 2; }));
  BOOST_TEST(std::memcmp(read_back.data(), original.data(), 256) == 0, "the read saw old bytes");
  BOOST_TEST(std::memcmp(remote.bytes.data(), overwrite.data(), 256) == 0);
}

BOOST_AUTO_TEST_CASE(flush_of_an_endpoint_still_connecting_is_done_at_once) {
  two_sides s;
  std::unique_ptr<tl::ep> fresh;
  BOOST_REQUIRE(s.a->create_ep(s.b->device_address(), s.b->iface_address(), fresh) == status::ok);
  BOOST_REQUIRE(conn_of(*fresh).state() == verbs::conn_state::connecting);
  // Nothing can have been started on it: there is nothing to wait for, and no completion comes.
  completion_probe untouched;
  BOOST_TEST(fresh->flush(&untouched) == status::ok);
  BOOST_TEST(fresh->flush(nullptr) == status::ok);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] {
    return conn_of(*fresh).state() != verbs::conn_state::connecting;
  }));
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_TEST(untouched.calls == 0);
  BOOST_TEST(fresh->flush(nullptr) == status::ok);
}

BOOST_AUTO_TEST_CASE(flush_completes_after_everything_before_it) {
  two_sides s;
  remote_buffer remote(*s.b, *s.a, 4096);
  BOOST_TEST(s.ab->flush(nullptr) == status::ok, "nothing outstanding");
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "a", 1) == status::ok);  // unsignaled
  td::hold_read_responses(true);
  std::vector<uint8_t> local(128);
  tl::iov iov{local.data(), local.size()};
  BOOST_REQUIRE(s.ab->get_zcopy(&iov, 1, remote.address(), remote.key, nullptr) ==
                status::in_progress);
  completion_probe flushed;
  BOOST_REQUIRE(s.ab->flush(&flushed) == status::in_progress);
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_TEST(flushed.calls == 0, "the read is still in flight");
  td::hold_read_responses(false);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return flushed.calls == 1; }));
  BOOST_TEST(flushed.result == status::ok);
  BOOST_TEST(std::memcmp(local.data(), remote.bytes.data(), local.size()) == 0);
  BOOST_TEST(s.ab->flush(nullptr) == status::ok);
}

// -- memory domain --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(registrations_are_cached_counted_and_bounded) {
  two_sides s;
  tl::md& md = *s.a->memory_domain();
  auto& vmd = static_cast<verbs::verbs_md&>(md);
  std::vector<uint8_t> buffer(8192);
  tl::mem_handle* h1 = nullptr;
  tl::mem_handle* h2 = nullptr;
  BOOST_REQUIRE(md.mem_reg(buffer.data(), buffer.size(), &h1) == status::ok);
  BOOST_REQUIRE(md.mem_reg(buffer.data(), buffer.size(), &h2) == status::ok);
  BOOST_TEST(h1 == h2, "the same range is one registration");
  BOOST_TEST(vmd.user_regions() == 1u);
  BOOST_TEST(md.mem_dereg(h1) == status::ok);
  BOOST_TEST(vmd.user_regions() == 1u, "one reference left");
  BOOST_TEST(md.mem_dereg(h2) == status::ok);
  BOOST_TEST(vmd.user_regions() == 0u);
  BOOST_TEST(md.mem_dereg(h2) == status::invalid_param, "a released handle is refused");
  // zcopy from many distinct unregistered buffers: the implicit cache stays within its bound.
  remote_buffer remote(*s.b, *s.a, 64 * 1024);
  std::vector<std::vector<uint8_t>> sources;
  for (int i = 0; i < 20; ++i) sources.push_back(pattern(100 + i, static_cast<uint8_t>(i)));
  for (auto& source : sources) {
    tl::iov iov{source.data(), source.size()};
    completion_probe put;
    BOOST_REQUIRE(s.ab->put_zcopy(&iov, 1, remote.address(), remote.key, &put) ==
                  status::in_progress);
    BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return put.calls == 1; }));
    BOOST_TEST(vmd.cached() <= small_config().reg_cache);
  }
  BOOST_TEST(vmd.implicit_misses() == 20u);
}

// -- the event fd ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_completion_channel_wakes_a_blocked_receiver) {
  two_sides s;
  progress_for({s.a.get(), s.b.get()}, 5ms);
  BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return s.b->event_arm() == status::ok; }));
  pollfd p{s.b->event_fd(), POLLIN, 0};
  BOOST_TEST(::poll(&p, 1, 0) == 0, "armed and idle: not readable");
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "wake", 4) == status::ok);
  BOOST_TEST(::poll(&p, 1, 5000) == 1, "the message made the event fd readable");
  BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return s.at_b.messages.size() == 1; }));
  // Arming with a completion already waiting says busy instead of sleeping.
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "more", 4) == status::ok);
  BOOST_TEST(s.b->event_arm() == status::busy);
  BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return s.at_b.messages.size() == 2; }));
}

// -- the rdmacm connection manager ----------------------------------------------------------------

namespace {

/// Records a connection manager's callbacks; keeps the requests handed over.
struct cm_recorder : tl::cm_handler {
  struct request {
    std::unique_ptr<tl::cm_conn> conn;
    std::vector<uint8_t> data;
  };
  std::vector<request> requests;
  std::vector<std::vector<uint8_t>> established;
  std::vector<status> failures;

  void on_request(tl::cm_listener*, std::unique_ptr<tl::cm_conn> conn, const uint8_t* data,
                  size_t length) override {
    requests.push_back({std::move(conn), std::vector<uint8_t>(data, data + length)});
  }
  void on_established(tl::cm_conn*, const uint8_t* data, size_t length) override {
    established.emplace_back(data, data + length);
  }
  void on_failed(tl::cm_conn*, status reason) override { failures.push_back(reason); }
};

/// A server and a client connection manager on the verbs test device.
struct cm_pair {
  td::fabric_scope fabric{{td::roce_device("testdev0", "10.0.0.1"),
                           td::roce_device("testdev1", "10.0.0.2")}};
  std::unique_ptr<tl::component> component = verbs::make_verbs_component(td::table());
  cm_recorder server_events;
  cm_recorder client_events;
  std::unique_ptr<tl::cm> server;
  std::unique_ptr<tl::cm> client;
  std::unique_ptr<tl::cm_listener> listener;

  cm_pair() {
    BOOST_REQUIRE(component->open_cm(tl::cm_params{tl::options{}, "", &server_events}, server) == status::ok);
    BOOST_REQUIRE(component->open_cm(tl::cm_params{tl::options{}, "", &client_events}, client) == status::ok);
    BOOST_REQUIRE(server->listen("10.0.0.2:0", 16, listener) == status::ok);
    BOOST_REQUIRE(listener->port() != 0);
  }
  ~cm_pair() {
    server_events.requests.clear();
    listener.reset();
    server.reset();
    client.reset();
    BOOST_TEST(fabric.finish() == 0u, "objects left on the verbs test device");
  }
  std::string address() const { return "10.0.0.2:" + std::to_string(listener->port()); }
  bool run_until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    for (int round = 0; round < 1'000'000; ++round) {
      server->progress();
      client->progress();
      if (done()) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    return false;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(cm_exchanges_private_data_of_its_own_length_both_ways) {
  cm_pair p;
  const std::vector<uint8_t> hello = {'h', 'e', 'y'};
  tl::cm_conn* out = nullptr;
  BOOST_REQUIRE(p.client->connect(p.address(), hello.data(), hello.size(), 5000, &out) ==
                status::ok);
  BOOST_REQUIRE(p.run_until([&] { return !p.server_events.requests.empty(); }));
  BOOST_TEST(p.server_events.requests[0].data == hello, "3 bytes, not the padded field");
  BOOST_TEST(p.listener->requests() == 1u);
  BOOST_TEST(!p.server_events.requests[0].conn->peer_address().empty());
  const auto reply = pattern(verbs::max_cm_accept_data, 5);
  BOOST_REQUIRE(p.server->accept(std::move(p.server_events.requests[0].conn), reply.data(),
                                 reply.size(), 5000, nullptr) == status::ok);
  BOOST_REQUIRE(p.run_until([&] {
    return p.client_events.established.size() == 1 && p.server_events.established.size() == 1;
  }));
  BOOST_TEST(p.client_events.established[0] == reply);
  BOOST_TEST(p.server_events.established[0].empty());
  BOOST_TEST(p.client_events.failures.empty());
  BOOST_TEST(p.server_events.failures.empty());
  BOOST_REQUIRE(p.run_until([&] { return !p.client->active(); }));
}

BOOST_AUTO_TEST_CASE(cm_reject_unanswered_request_and_nobody_listening) {
  cm_pair p;
  tl::cm_conn* out = nullptr;
  BOOST_REQUIRE(p.client->connect(p.address(), nullptr, 0, 5000, &out) == status::ok);
  BOOST_REQUIRE(p.run_until([&] { return p.server_events.requests.size() == 1; }));
  p.server_events.requests[0].conn->reject();
  BOOST_REQUIRE(p.run_until([&] { return p.client_events.failures.size() == 1; }));
  BOOST_TEST(p.client_events.failures[0] == status::rejected);
  // A request dropped unanswered is a reject too.
  BOOST_REQUIRE(p.client->connect(p.address(), nullptr, 0, 5000, &out) == status::ok);
  BOOST_REQUIRE(p.run_until([&] { return p.server_events.requests.size() == 2; }));
  p.server_events.requests[1].conn.reset();
  BOOST_REQUIRE(p.run_until([&] { return p.client_events.failures.size() == 2; }));
  BOOST_TEST(p.client_events.failures[1] == status::rejected);
  // Nobody on that port.
  BOOST_REQUIRE(p.client->connect("10.0.0.2:1", nullptr, 0, 5000, &out) == status::ok);
  BOOST_REQUIRE(p.run_until([&] { return p.client_events.failures.size() == 3; }));
  BOOST_TEST(p.client_events.failures[2] == status::unreachable);
}

BOOST_AUTO_TEST_CASE(cm_limits_and_timeouts) {
  cm_pair p;
  tl::cm_conn* out = nullptr;
  const auto too_long = pattern(verbs::max_cm_connect_data + 1, 1);
  BOOST_TEST(p.client->connect(p.address(), too_long.data(), too_long.size(), 5000, &out) ==
             status::exceeds_limit);
  BOOST_TEST(p.client->connect("not an address", nullptr, 0, 5000, &out) == status::invalid_addr);
  std::unique_ptr<tl::cm> keyed;
  cm_recorder ignored;
  BOOST_TEST(p.component->open_cm(tl::cm_params{tl::options{}, "secret", &ignored}, keyed) == status::unsupported);
  // The server holds the request without answering: the client times out.
  BOOST_REQUIRE(p.client->connect(p.address(), nullptr, 0, 100, &out) == status::ok);
  BOOST_REQUIRE(p.run_until([&] { return p.client_events.failures.size() == 1; }));
  BOOST_TEST(p.client_events.failures[0] == status::endpoint_timeout);
  BOOST_REQUIRE(p.server_events.requests.size() == 1u);
  const auto reply_too_long = pattern(verbs::max_cm_accept_data + 1, 2);
  BOOST_TEST(p.server->accept(std::move(p.server_events.requests[0].conn), reply_too_long.data(),
                              reply_too_long.size(), 5000, nullptr) == status::exceeds_limit);
}

BOOST_AUTO_TEST_CASE(cm_refuses_a_request_without_valid_private_data_and_keeps_serving) {
  cm_pair p;
  // A raw rdmacm client on the test device sends private data that is not ours.
  const comm::verbs::api& t = td::table();
  rdma_event_channel* channel = t.create_event_channel();
  rdma_cm_id* id = nullptr;
  BOOST_REQUIRE(t.create_id(channel, &id, nullptr, RDMA_PS_TCP) == 0);
  sockaddr_storage target{};
  BOOST_REQUIRE(verbs::parse_address(p.address(), &target));
  BOOST_REQUIRE(t.resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&target), 1000) == 0);
  auto next_event = [&]() {
    rdma_cm_event* event = nullptr;
    BOOST_REQUIRE(t.get_cm_event(channel, &event) == 0);
    const rdma_cm_event_type type = event->event;
    t.ack_cm_event(event);
    return type;
  };
  BOOST_REQUIRE(next_event() == RDMA_CM_EVENT_ADDR_RESOLVED);
  BOOST_REQUIRE(t.resolve_route(id, 1000) == 0);
  BOOST_REQUIRE(next_event() == RDMA_CM_EVENT_ROUTE_RESOLVED);
  const uint8_t garbage[20] = {0xde, 0xad, 0xbe, 0xef, 200};
  rdma_conn_param param{};
  param.private_data = garbage;
  param.private_data_len = sizeof(garbage);
  param.qp_num = 1;
  BOOST_REQUIRE(t.connect(id, &param) == 0);
  for (int i = 0; i < 100; ++i) p.server->progress();
  BOOST_TEST(next_event() == RDMA_CM_EVENT_REJECTED);
  BOOST_TEST(p.server_events.requests.empty(), "nothing reached the handler");
  t.destroy_id(id);
  t.destroy_event_channel(channel);
  // A good client still gets through.
  tl::cm_conn* out = nullptr;
  BOOST_REQUIRE(p.client->connect(p.address(), nullptr, 0, 5000, &out) == status::ok);
  BOOST_REQUIRE(p.run_until([&] { return p.server_events.requests.size() == 1; }));
}

// -- faults ---------------------------------------------------------------------------------------

namespace {

/// Waits until a's error handler was told once, then checks it stays once.
void expect_one_failure(two_sides& s, status reason) {
  BOOST_REQUIRE_MESSAGE(progress_until({s.a.get(), s.b.get()},
                                       [&] { return !s.failures_a.entries.empty(); }),
                        "the error handler was never called");
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_REQUIRE(s.failures_a.entries.size() == 1u);
  BOOST_TEST(s.failures_a.entries[0].ep == s.ab.get());
  BOOST_TEST(s.failures_a.entries[0].reason == reason);
}

/// Starts a read that stays in flight (responses held) and a zcopy behind it.
struct outstanding_ops {
  std::vector<uint8_t> local = std::vector<uint8_t>(256);
  std::vector<uint8_t> payload = pattern(200, 4);
  completion_probe read;
  completion_probe send;
  explicit outstanding_ops(two_sides& s, remote_buffer& remote) {
    td::hold_read_responses(true);
    tl::iov into{local.data(), local.size()};
    BOOST_REQUIRE(s.ab->get_zcopy(&into, 1, remote.address(), remote.key, &read) ==
                  status::in_progress);
    tl::iov from{payload.data(), payload.size()};
    BOOST_REQUIRE(s.ab->am_zcopy(3, nullptr, 0, &from, 1, &send) == status::in_progress);
  }
  ~outstanding_ops() { td::hold_read_responses(false); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(retry_exceeded_fails_the_operation_and_the_endpoint_with_a_timeout) {
  two_sides s;
  BOOST_REQUIRE(td::fail_next_send(conn_of(*s.ab).qp()) == 0);
  const auto payload = pattern(100, 1);
  tl::iov iov{payload.data(), payload.size()};
  completion_probe first;
  completion_probe second;
  BOOST_REQUIRE(s.ab->am_zcopy(3, nullptr, 0, &iov, 1, &first) == status::in_progress);
  BOOST_REQUIRE(s.ab->am_zcopy(3, nullptr, 0, &iov, 1, &second) == status::in_progress);
  expect_one_failure(s, status::endpoint_timeout);
  BOOST_TEST(first.calls == 1);
  BOOST_TEST(first.result == status::endpoint_timeout);
  BOOST_TEST(second.calls == 1);
  BOOST_TEST(second.result == status::endpoint_timeout);
  BOOST_TEST(s.ab->am_short(3, nullptr, 0, "x", 1) == status::endpoint_timeout);
  BOOST_TEST(s.ab->flush(nullptr) == status::endpoint_timeout);
  BOOST_TEST(s.at_b.messages.empty());
}

BOOST_AUTO_TEST_CASE(a_failed_unsignaled_bcopy_fails_the_endpoint_and_returns_its_buffers) {
  two_sides s;
  auto& a = static_cast<verbs::verbs_iface&>(*s.a);
  ibv_qp* const qp = conn_of(*s.ab).qp();
  BOOST_REQUIRE(td::fail_next_send(qp) == 0);
  bcopy_source source{pattern(64, 5)};
  // Two unsignaled sends: the first fails (retry exceeded), the second is flushed behind it.
  BOOST_REQUIRE(s.ab->am_bcopy(3, &bcopy_source::pack, &source) > 0);
  BOOST_REQUIRE(s.ab->am_bcopy(3, &bcopy_source::pack, &source) > 0);
  BOOST_TEST(a.tx_buffers_free() == small_config().tx_buffers - 2);
  expect_one_failure(s, status::endpoint_timeout);
  BOOST_TEST(td::send_completions(qp) == 2u, "error completions come signaled or not");
  BOOST_TEST(a.tx_buffers_free() == small_config().tx_buffers);
  BOOST_TEST(s.ab->am_bcopy(3, &bcopy_source::pack, &source) ==
             static_cast<ssize_t>(status::endpoint_timeout));
  BOOST_TEST(s.ab->flush(nullptr) == status::endpoint_timeout);
  BOOST_TEST(s.at_b.messages.empty());
}

BOOST_AUTO_TEST_CASE(a_qp_moved_to_error_fails_everything_outstanding) {
  two_sides s;
  remote_buffer remote(*s.b, *s.a, 4096);
  outstanding_ops ops(s, remote);
  completion_probe flushed;
  BOOST_REQUIRE(s.ab->flush(&flushed) == status::in_progress);
  BOOST_REQUIRE(td::fail_qp(conn_of(*s.ab).qp()) == 0);
  expect_one_failure(s, status::io_error);
  BOOST_TEST(ops.read.calls == 1);
  BOOST_TEST(ops.read.result == status::io_error);
  BOOST_TEST(ops.send.calls == 1);
  BOOST_TEST(flushed.calls == 1, "a flush under way does not hang");
  BOOST_TEST(flushed.result == status::io_error);
}

BOOST_AUTO_TEST_CASE(a_cq_overrun_fails_the_endpoints_on_it) {
  two_sides s;
  remote_buffer remote(*s.b, *s.a, 4096);
  outstanding_ops ops(s, remote);
  auto& a = static_cast<verbs::verbs_iface&>(*s.a);
  BOOST_REQUIRE(td::overrun_cq(a.completion_queue()) == 0);
  expect_one_failure(s, status::io_error);
  BOOST_TEST(ops.read.calls == 1);
  BOOST_TEST(ops.read.result == status::io_error);
  BOOST_TEST(ops.send.calls == 1);
}

BOOST_AUTO_TEST_CASE(a_peer_process_that_exits_resets_the_endpoint) {
  two_sides s;
  remote_buffer remote(*s.b, *s.a, 4096);
  outstanding_ops ops(s, remote);
  BOOST_REQUIRE(td::peer_gone("testdev1", td::peer_failure::process_exit) == 0);
  expect_one_failure(s, status::connection_reset);
  BOOST_TEST(ops.read.calls == 1);
  BOOST_TEST(ops.read.result == status::connection_reset);
  BOOST_TEST(ops.send.calls == 1);
  BOOST_TEST(s.ab->am_short(3, nullptr, 0, "x", 1) == status::connection_reset);
}

BOOST_AUTO_TEST_CASE(a_lost_peer_host_is_noticed_by_retries_on_the_next_send) {
  two_sides s;
  BOOST_REQUIRE(td::peer_gone("testdev1", td::peer_failure::host_lost) == 0);
  progress_for({s.a.get()}, 20ms);
  BOOST_TEST(s.failures_a.entries.empty(), "nothing announced the loss");
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "anyone?", 7) == status::ok);
  expect_one_failure(s, status::endpoint_timeout);
  BOOST_TEST(td::stats().ack_timeouts > 0u);
}

BOOST_AUTO_TEST_CASE(the_error_handler_may_destroy_the_endpoint) {
  two_sides s;
  struct destroyer {
    std::unique_ptr<tl::ep>* ep;
    int calls = 0;
  } d{&s.ab};
  s.a->set_error_handler(
      [](void* arg, tl::ep*, status) {
        auto* self = static_cast<destroyer*>(arg);
        ++self->calls;
        self->ep->reset();
      },
      &d);
  BOOST_REQUIRE(td::fail_qp(conn_of(*s.ab).qp()) == 0);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return d.calls == 1; }));
  progress_for({s.a.get(), s.b.get()}, 20ms);
  BOOST_TEST(d.calls == 1);
  BOOST_TEST(static_cast<verbs::verbs_iface&>(*s.a).connections() == 0u);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] {
    return static_cast<verbs::verbs_iface&>(*s.b).connections() == 0;
  }));
  // A new endpoint to the same peer works.
  s.ab = s.connect(*s.a, *s.b);
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "again", 5) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(1));
}

// -- hostile peers --------------------------------------------------------------------------------

namespace {

/// A peer written by hand against the test device's table: it connects to an interface's
/// listener with whatever handshake it likes, then posts whatever SENDs it likes.
struct raw_peer {
  const comm::verbs::api& t = td::table();
  ibv_context* ctx;
  comm::test::verbs::endpoint e;
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;

  explicit raw_peer(const std::string& device) : ctx(comm::test::verbs::open_device(t, device)) {
    comm::test::verbs::build(t, e, ctx);
    BOOST_REQUIRE(comm::test::verbs::to_init(t, e) == 0);
    channel = t.create_event_channel();
    BOOST_REQUIRE(t.create_id(channel, &id, nullptr, RDMA_PS_TCP) == 0);
  }
  ~raw_peer() {
    t.destroy_id(id);
    t.destroy_event_channel(channel);
    e.release();
    t.close_device(ctx);
  }

  /// The next rdmacm event (waits up to 5 s while `iface` progresses), with its private data.
  rdma_cm_event_type next_event(tl::iface& iface, std::vector<uint8_t>* data = nullptr) {
    rdma_cm_event_type type = RDMA_CM_EVENT_TIMEWAIT_EXIT;
    const bool got = progress_until({&iface}, [&] {
      if (!comm::test::verbs::readable(channel->fd)) return false;
      rdma_cm_event* event = nullptr;
      if (t.get_cm_event(channel, &event) != 0) return false;
      type = event->event;
      const auto* p = static_cast<const uint8_t*>(event->param.conn.private_data);
      if (data != nullptr && p != nullptr) data->assign(p, p + event->param.conn.private_data_len);
      t.ack_cm_event(event);
      return true;
    }, 5s);
    BOOST_REQUIRE_MESSAGE(got, "no rdmacm event");
    return type;
  }

  /// Resolves the listener of `iface` and connects with `handshake_bytes`.
  void connect(tl::iface& iface, const void* handshake_bytes, uint8_t length) {
    verbs::iface_address_record rec;
    BOOST_REQUIRE(verbs::parse_iface_address(iface.iface_address(), &rec));
    sockaddr_storage target{};
    std::memcpy(&target, &rec.listener, sizeof(rec.listener));
    BOOST_REQUIRE(t.resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&target), 1000) == 0);
    BOOST_REQUIRE(next_event(iface) == RDMA_CM_EVENT_ADDR_RESOLVED);
    BOOST_REQUIRE(t.resolve_route(id, 1000) == 0);
    BOOST_REQUIRE(next_event(iface) == RDMA_CM_EVENT_ROUTE_RESOLVED);
    rdma_conn_param param{};
    param.private_data = handshake_bytes;
    param.private_data_len = length;
    param.qp_num = e.qp->qp_num;
    param.responder_resources = 4;
    param.initiator_depth = 4;
    BOOST_REQUIRE(t.connect(id, &param) == 0);
  }

  /// A handshake as the transport would send it for this peer's QP.
  verbs::handshake good_handshake() {
    const auto address = comm::test::verbs::port_address(t, ctx, 1);
    verbs::handshake h;
    h.qp_num = e.qp->qp_num;
    h.psn = 0;
    h.rd_atom = 4;
    h.mtu = IBV_MTU_1024;
    std::memcpy(h.gid, address.gid.raw, sizeof(h.gid));
    h.iface_id = 42;
    h.credits = 8;
    h.link_layer = IBV_LINK_LAYER_ETHERNET;
    return h;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_handshake_that_is_not_one_is_rejected) {
  two_sides s(small_config(), {td::roce_device("testdev0", "10.0.0.1"),
                               td::roce_device("testdev1", "10.0.0.2"),
                               td::roce_device("testdev2", "10.0.0.3")});
  {
    raw_peer peer("testdev2");
    verbs::handshake h = peer.good_handshake();
    h.qp_num = 0x1000000;  // beyond 24 bits
    const verbs::encoded_handshake bytes = verbs::encode_handshake(h);
    peer.connect(*s.b, bytes.bytes, sizeof(bytes.bytes));
    BOOST_TEST(peer.next_event(*s.b) == RDMA_CM_EVENT_REJECTED);
  }
  // A good handshake behind a root pointer that claims a pointer, or a data section one word short.
  for (const uint64_t forged : {uint64_t{1} << 48, uint64_t{4} << 32}) {
    raw_peer peer("testdev2");
    verbs::encoded_handshake bytes = verbs::encode_handshake(peer.good_handshake());
    uint64_t root;
    std::memcpy(&root, bytes.bytes, sizeof(root));
    BOOST_REQUIRE(root == uint64_t{5} << 32);  // a struct pointer: 5 data words, no pointers
    root = forged == (uint64_t{1} << 48) ? root | forged : forged;
    std::memcpy(bytes.bytes, &root, sizeof(root));
    peer.connect(*s.b, bytes.bytes, sizeof(bytes.bytes));
    BOOST_TEST(peer.next_event(*s.b) == RDMA_CM_EVENT_REJECTED);
  }
  BOOST_TEST(static_cast<verbs::verbs_iface&>(*s.b).connections() == 1u);
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "still", 5) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(1));
}

namespace {

/// Connects `peer` to `s.b` with a good handshake and brings its QP to RTS towards b's.
void connect_raw(two_sides& s, raw_peer& peer) {
    const verbs::encoded_handshake h = verbs::encode_handshake(peer.good_handshake());
    peer.connect(*s.b, h.bytes, sizeof(h.bytes));
    std::vector<uint8_t> data;
    BOOST_REQUIRE(peer.next_event(*s.b, &data) == RDMA_CM_EVENT_CONNECT_RESPONSE);
    verbs::handshake reply;
    BOOST_REQUIRE(verbs::parse_handshake(data.data(), data.size(), &reply));
    BOOST_TEST(uint16_t{reply.credits} == small_config().credits);
    // Connect the raw QP to the interface's, as the handshake says.
    ibv_qp_attr rtr{};
    rtr.qp_state = IBV_QPS_RTR;
    rtr.path_mtu = IBV_MTU_1024;
    rtr.dest_qp_num = reply.qp_num;
    rtr.rq_psn = reply.psn;
    rtr.max_dest_rd_atomic = 4;
    rtr.min_rnr_timer = 1;
    rtr.ah_attr.port_num = 1;
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, reply.gid, 16);
    rtr.ah_attr.grh.sgid_index =
        static_cast<uint8_t>(comm::test::verbs::port_address(peer.t, peer.ctx, 1).gid_index);
    rtr.ah_attr.grh.hop_limit = 64;
    BOOST_REQUIRE(peer.t.modify_qp(peer.e.qp, &rtr,
                                   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                       IBV_QP_MIN_RNR_TIMER) == 0);
    BOOST_REQUIRE(comm::test::verbs::to_rts(peer.t, peer.e, 0) == 0);
    BOOST_REQUIRE(peer.t.establish(peer.id) == 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_peer_sending_garbage_loses_its_connection_and_nobody_else_does) {
  two_sides s(small_config(), {td::roce_device("testdev0", "10.0.0.1"),
                               td::roce_device("testdev1", "10.0.0.2"),
                               td::roce_device("testdev2", "10.0.0.3")});
  auto& b = static_cast<verbs::verbs_iface&>(*s.b);
  {
    raw_peer peer("testdev2");
    connect_raw(s, peer);
    BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return b.connections() == 2; }));
    // A valid message first: delivered.
    alignas(8) uint8_t bytes[verbs::message_header_size + 8] = {};
    verbs::message_header_writer writer;
    writer.write(bytes, verbs::message_kind::am, 3, 0);
    BOOST_REQUIRE(comm::test::verbs::post(peer.t, peer.e.qp, IBV_WR_SEND,
                                          {ibv_sge{reinterpret_cast<uintptr_t>(bytes),
                                                   sizeof(bytes), 0}},
                                          1, IBV_SEND_INLINE) == 0);
    BOOST_REQUIRE(s.deliver_to_b(1));
    // Then 4 bytes, shorter than any header: the connection is closed, b keeps running.
    BOOST_REQUIRE(comm::test::verbs::post(peer.t, peer.e.qp, IBV_WR_SEND,
                                          {ibv_sge{reinterpret_cast<uintptr_t>(bytes), 4, 0}}, 2,
                                          IBV_SEND_INLINE) == 0);
    BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return b.connections() == 1; }));
    BOOST_TEST(peer.next_event(*s.b) == RDMA_CM_EVENT_DISCONNECTED);
  }
  BOOST_TEST(s.failures_b.entries.empty(), "no endpoint of b was involved");
  BOOST_TEST(b.rx_posted() == small_config().rx_buffers, "every receive buffer went back");
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "still", 5) == status::ok);
  BOOST_REQUIRE(s.deliver_to_b(2));
}

BOOST_AUTO_TEST_CASE(a_connection_is_not_shared_before_both_sides_are_established) {
  two_sides s;
  auto c = s.open("testdev0:1");
  recorder at_c;
  at_c.install(*c, 3);
  std::unique_ptr<tl::ep> cb;
  BOOST_REQUIRE(c->create_ep(s.b->device_address(), s.b->iface_address(), cb) == status::ok);
  auto& b = static_cast<verbs::verbs_iface&>(*s.b);
  // c sends its request; b accepts it, but c has not read the answer yet.
  const size_t before = b.connections();
  for (int i = 0; i < 64; ++i) c->progress();
  BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return b.connections() == before + 1; }));
  // b's endpoint towards c must not use that connection yet: c's QP cannot answer.
  std::unique_ptr<tl::ep> bc;
  BOOST_REQUIRE(s.b->create_ep(c->device_address(), c->iface_address(), bc) == status::ok);
  BOOST_REQUIRE(progress_until({s.b.get(), c.get()}, [&] {
    return bc->am_short(3, nullptr, 0, "early", 5) == status::ok;
  }));
  BOOST_REQUIRE(progress_until({s.b.get(), c.get()}, [&] { return at_c.messages.size() == 1; }));
  BOOST_TEST(td::stats().ack_timeouts == 0u, "no request went to a QP that could not answer");
  bc.reset();
  cb.reset();
  c.reset();
}

// -- tag matching (the verbs test device's model of tag-matching SRQs) ----------------------------

namespace {

/// Two RoCE test devices with tag-matching SRQs.
std::vector<td::device_spec> two_tm_devices() {
  return {td::with_tag_matching(td::roce_device("testdev0", "10.0.0.1"), 16),
          td::with_tag_matching(td::roce_device("testdev1", "10.0.0.2"), 16)};
}

/// A posted receive that records its callbacks.
struct tm_receive : tl::tag_context {
  std::vector<uint8_t> buffer;
  tl::iov entry{};
  int consumed = 0;
  int completions = 0;
  status result = status::ok;
  uint64_t imm = 0;
  size_t length = 0;

  explicit tm_receive(size_t size) : buffer(size, 0xee), entry{buffer.data(), size} {
    tag_consumed = [](tl::tag_context* self) { ++static_cast<tm_receive*>(self)->consumed; };
    completed = [](tl::tag_context* self, tl::tag_t, uint64_t imm, size_t length, status st) {
      auto* r = static_cast<tm_receive*>(self);
      ++r->completions;
      r->result = st;
      r->imm = imm;
      r->length = length;
    };
  }
  status post(tl::iface& iface, tl::tag_t tag) {
    return iface.tag_recv_zcopy(tag, ~0ull, &entry, 1, this);
  }
};

/// Unexpected eager messages an interface handed over.
struct tm_unexpected {
  struct message {
    tl::tag_t tag;
    uint64_t imm;
    std::vector<uint8_t> bytes;
  };
  std::vector<message> messages;
  void install(tl::iface& iface) {
    const auto eager = [](void* arg, void* data, size_t length, unsigned, tl::tag_t tag,
                          uint64_t imm, void**) {
      const auto* p = static_cast<const uint8_t*>(data);
      static_cast<tm_unexpected*>(arg)->messages.push_back({tag, imm, {p, p + length}});
      return status::ok;
    };
    BOOST_REQUIRE(iface.set_tag_handlers(eager, this, nullptr, nullptr) == status::ok);
  }
};

size_t pack_bytes(void* dest, void* arg) {
  const auto* bytes = static_cast<const std::vector<uint8_t>*>(arg);
  std::memcpy(dest, bytes->data(), bytes->size());
  return bytes->size();
}

/// The number before `what` in `text` ("3 matched by the device"), or -1.
long count_before(const std::string& text, const std::string& what) {
  const size_t at = text.find(" " + what);
  if (at == std::string::npos) return -1;
  size_t start = at;
  while (start > 0 && std::isdigit(static_cast<unsigned char>(text[start - 1]))) --start;
  return start == at ? -1 : std::stol(text.substr(start, at - start));
}

}  // namespace

BOOST_AUTO_TEST_CASE(tag_matching_is_offered_only_over_a_device_with_tag_matching_srqs) {
  {
    two_sides plain;  // devices without tm_caps
    BOOST_TEST((plain.a->attr().caps & tl::cap_tag_any) == 0u);
    BOOST_TEST(plain.a->info().find("the device offers none") != std::string::npos);
  }
  {
    two_sides tm(small_config(), two_tm_devices());
    const tl::iface_attr& attr = tm.a->attr();
    BOOST_TEST((attr.caps & tl::cap_tag_any) == tl::cap_tag_any);
    BOOST_TEST(attr.tag.recv.max_outstanding == 16u, "the SRQ's max_num_tags");
    BOOST_TEST(attr.tag.rndv.max_hdr == 160u - 32u, "max_rndv_hdr_size less TMH and RVH");
    BOOST_TEST(attr.tag.eager.max_bcopy == small_config().segment_size - 16u);
    BOOST_TEST(attr.max_bcopy == small_config().segment_size - 32u, "AMs behind TMH and header");
    BOOST_TEST(tm.a->info().find("used: a tag-matching SRQ") != std::string::npos, tm.a->info());
    // The AM path still works behind the TMH.
    BOOST_REQUIRE(tm.ab->am_short(3, nullptr, 0, "hello", 5) == status::ok);
    BOOST_REQUIRE(tm.deliver_to_b(1));
  }
  {
    // COMM_VERBS_TM=0: the device's tag matching is left alone.
    verbs::verbs_config off = small_config();
    off.tag_matching = false;
    two_sides s(off, two_tm_devices());
    BOOST_TEST((s.a->attr().caps & tl::cap_tag_any) == 0u);
    BOOST_TEST(s.a->info().find("not used (COMM_VERBS_TM=0)") != std::string::npos, s.a->info());
  }
  {
    // One interface with tag matching and one without frame SENDs differently: unreachable.
    std::vector<td::device_spec> devices = two_tm_devices();
    devices.push_back(td::roce_device("testdev2", "10.0.0.3"));
    two_sides s(small_config(), devices);
    auto plain = s.open("testdev2:1");
    BOOST_TEST(!s.a->is_reachable(plain->device_address(), plain->iface_address()));
    std::unique_ptr<tl::ep> ep;
    BOOST_TEST(s.a->create_ep(plain->device_address(), plain->iface_address(), ep) ==
               status::unreachable);
    BOOST_TEST(plain->create_ep(s.a->device_address(), s.a->iface_address(), ep) ==
               status::unreachable);
  }
}

BOOST_AUTO_TEST_CASE(the_device_matches_posted_receives_and_software_takes_what_it_missed) {
  two_sides s(small_config(), two_tm_devices());
  tm_unexpected unexpected;
  unexpected.install(*s.b);
  const td::counters before = td::stats();
  // Posted first: the device matches it.
  tm_receive r1(64);
  BOOST_REQUIRE(r1.post(*s.b, 5) == status::ok);
  std::vector<uint8_t> data = pattern(40, 1);
  BOOST_REQUIRE(s.ab->tag_eager_bcopy(5, 0x0000000700000009ull, pack_bytes, &data) == 40);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return r1.completions == 1; }));
  BOOST_TEST(r1.consumed == 1);
  BOOST_TEST(r1.result == status::ok);
  BOOST_TEST(r1.imm == 0x0000000700000009ull, "imm_data and the TMH's app_ctx");
  BOOST_TEST((std::vector<uint8_t>(r1.buffer.begin(), r1.buffer.begin() + 40) == data));
  BOOST_TEST(td::stats().tm_matched == before.tm_matched + 1);
  BOOST_TEST(count_before(s.b->info(), "matched by the device") == 1, s.b->info());
  // Sent first, posted before b looked: the device put it in a receive buffer (unexpected) and
  // does not match the receive posted after it; b's software gives it to that receive.
  data = pattern(30, 2);
  BOOST_REQUIRE(s.ab->tag_eager_bcopy(6, 0, pack_bytes, &data) == 30);
  tm_receive r2(64), r3(64);
  BOOST_REQUIRE(r2.post(*s.b, 6) == status::ok);
  BOOST_REQUIRE(r3.post(*s.b, 6) == status::ok);
  std::vector<uint8_t> second = pattern(20, 3);
  BOOST_REQUIRE(s.ab->tag_eager_bcopy(6, 0, pack_bytes, &second) == 20);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return r3.completions == 1; }));
  BOOST_TEST(r2.completions == 1);
  BOOST_TEST((std::vector<uint8_t>(r2.buffer.begin(), r2.buffer.begin() + 30) == data),
             "the earlier message takes the earlier receive");
  BOOST_TEST((std::vector<uint8_t>(r3.buffer.begin(), r3.buffer.begin() + 20) == second));
  BOOST_TEST(td::stats().tm_unexpected >= before.tm_unexpected + 2,
             "out of synch until b reported the unexpected message");
  BOOST_TEST(count_before(s.b->info(), "in software") == 2, s.b->info());
  BOOST_TEST(unexpected.messages.empty());
  // An active message in between also counts as unexpected: the device stops matching until b
  // has seen it (a message behind it must not take a receive it could).
  tm_receive r4(64);
  BOOST_REQUIRE(r4.post(*s.b, 7) == status::ok);
  BOOST_REQUIRE(s.ab->am_short(3, nullptr, 0, "am", 2) == status::ok);
  BOOST_REQUIRE(s.ab->tag_eager_short(7, "x", 1) == status::ok);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return r4.completions == 1; }));
  BOOST_TEST(s.at_b.messages.size() == 1u);
  BOOST_TEST(count_before(s.b->info(), "in software") == 3, s.b->info());
  BOOST_TEST(s.b->info().find("tag: 0 of 16") != std::string::npos, s.b->info());
}

BOOST_AUTO_TEST_CASE(a_cancel_that_loses_to_the_device_hands_the_message_on_unexpected) {
  two_sides s(small_config(), two_tm_devices());
  tm_unexpected unexpected;
  unexpected.install(*s.b);
  for (const bool force : {true, false}) {
    BOOST_TEST_CONTEXT("force " << force) {
      unexpected.messages.clear();
      tm_receive r(64);
      BOOST_REQUIRE(r.post(*s.b, 9) == status::ok);
      // The device matches at once; b has not read the completion when it cancels.
      std::vector<uint8_t> data = pattern(24, 4);
      BOOST_REQUIRE(s.ab->tag_eager_bcopy(9, 0x1234, pack_bytes, &data) == 24);
      BOOST_TEST(s.b->tag_recv_cancel(&r, force) == status::ok);
      BOOST_TEST(r.consumed == 0);
      BOOST_TEST(r.completions == (force ? 0 : 1));
      if (!force) BOOST_TEST(r.result == status::canceled);
      // The message is handed on as unexpected, in its place.
      BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()},
                                   [&] { return unexpected.messages.size() == 1; }));
      BOOST_TEST(unexpected.messages[0].tag == 9u);
      BOOST_TEST(unexpected.messages[0].imm == 0x1234u);
      BOOST_TEST((unexpected.messages[0].bytes == data));
      BOOST_TEST(s.b->tag_recv_cancel(&r, force) == status::no_elem);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rendezvous_the_device_matched_is_read_and_finished_by_the_device) {
  two_sides s(small_config(), two_tm_devices());
  const td::counters before = td::stats();
  std::vector<uint8_t> data = pattern(100'000, 5);
  tm_receive r(data.size());
  BOOST_REQUIRE(r.post(*s.b, 11) == status::ok);
  completion_probe done;
  uint64_t handle = 0;
  const tl::iov entry{data.data(), data.size()};
  BOOST_REQUIRE(s.ab->tag_rndv_zcopy(11, "hdr", 3, &entry, 1, &done, &handle) ==
                status::in_progress);
  // The device reads and sends the FIN: the sender completes without b's progress.
  BOOST_REQUIRE(progress_until({s.a.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST(td::stats().tm_fins == before.tm_fins + 1);
  BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return r.completions == 1; }));
  BOOST_TEST(r.result == status::ok);
  BOOST_TEST(r.length == data.size());
  BOOST_TEST((r.buffer == data));
  BOOST_TEST(s.ab->tag_rndv_cancel(handle) == status::no_elem);
}

BOOST_AUTO_TEST_CASE(a_peer_sending_bad_tm_headers_loses_its_connection_and_nobody_else_does) {
  std::vector<td::device_spec> devices = two_tm_devices();
  devices.push_back(td::with_tag_matching(td::roce_device("testdev2", "10.0.0.3")));
  two_sides s(small_config(), devices);
  auto& b = static_cast<verbs::verbs_iface&>(*s.b);
  tm_unexpected unexpected;
  unexpected.install(*s.b);
  tm_receive posted(64);
  BOOST_REQUIRE(posted.post(*s.b, 0x77) == status::ok);
  /// A TMH with `opcode`, then `extra` bytes.
  const auto message = [](uint8_t opcode, uint32_t app_ctx, size_t extra, uint8_t reserved) {
    std::vector<uint8_t> bytes(verbs::tmh_size + extra, 0);
    verbs::write_tmh(bytes.data(), static_cast<ibv_tmh_op>(opcode), app_ctx, 0x77);
    bytes[1] = reserved;
    return bytes;
  };
  const std::vector<std::vector<uint8_t>> bad = {
      message(IBV_TMH_EAGER, 0, 8, 1),     // a reserved byte set
      message(9, 0, 8, 0),                 // an unknown opcode
      message(IBV_TMH_RNDV, 5, 8, 0),      // a rendezvous shorter than its RVH
      message(IBV_TMH_FIN, 5, 4, 0),       // a FIN with a payload
      message(IBV_TMH_FIN, 0, 0, 0),       // a FIN for no operation
      message(IBV_TMH_NO_TAG, 0, 4, 0),    // NO_TAG without a whole header behind it
      std::vector<uint8_t>(8, 0),          // shorter than a TMH
  };
  uint64_t id = 1;
  for (const std::vector<uint8_t>& bytes : bad) {
    BOOST_TEST_CONTEXT("message " << id) {
      raw_peer peer("testdev2");
      connect_raw(s, peer);
      BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return b.connections() == 2; }));
      BOOST_REQUIRE(comm::test::verbs::post(peer.t, peer.e.qp, IBV_WR_SEND,
                                            {ibv_sge{reinterpret_cast<uintptr_t>(bytes.data()),
                                                     static_cast<uint32_t>(bytes.size()), 0}},
                                            id++, IBV_SEND_INLINE) == 0);
      BOOST_REQUIRE(progress_until({s.b.get()}, [&] { return b.connections() == 1; }));
      BOOST_TEST(peer.next_event(*s.b) == RDMA_CM_EVENT_DISCONNECTED);
    }
  }
  BOOST_TEST(s.failures_b.entries.empty(), "no endpoint of b was involved");
  BOOST_TEST(posted.completions == 0, "no bad message took the posted receive");
  BOOST_TEST(unexpected.messages.empty());
  BOOST_TEST(b.rx_posted() == small_config().rx_buffers, "every receive buffer went back");
  // b keeps serving a good peer, with tag matching.
  BOOST_REQUIRE(s.ab->tag_eager_short(0x77, "ok", 2) == status::ok);
  BOOST_REQUIRE(progress_until({s.a.get(), s.b.get()}, [&] { return posted.completions == 1; }));
  BOOST_TEST(posted.result == status::ok);
}
