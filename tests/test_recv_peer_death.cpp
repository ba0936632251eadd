// Posted tag receives belong to the worker, not to an endpoint (as in UCX): a peer process killed
// with SIGKILL while receives wait for its tags fails its endpoint, and the receives stay posted,
// matched later by another peer's message or cancelled by tag and mask (cancel_tag_recvs). Over
// every transport that reaches another process (shm, tcp).
#define BOOST_TEST_MODULE recv_peer_death
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "fixture.hpp"
#include "process_harness.hpp"
#include "test_util.hpp"

#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace comm;
using namespace comm::test;

// A named namespace: the data test case's lambdas capture these types (-Wsubobject-linkage).
namespace recv_peer_death_test {

constexpr tag_t hello_tag = 1;

/// A context and worker on `transport` only.
struct peer {
  explicit peer(const std::string& transport) : ctx(only(transport)) {
    w = worker::create(ctx).value();
  }
  static config only(const std::string& transport) {
    config cfg = config::from_environment();
    cfg.transports = {transport};
    return cfg;
  }
  context ctx;
  std::unique_ptr<worker> w;
};

/// The child: connects to the parent, says hello, and waits (at most a minute) to be killed.
int doomed_child(const std::string& transport, const channel& up, const channel& down) {
  peer me(transport);
  up.send(me.w->address());
  std::vector<uint8_t> parent_address;
  CHILD_CHECK(down.receive(&parent_address));
  endpoint* ep = nullptr;
  CHILD_CHECK(me.w->connect(parent_address, &ep) == status::ok);
  const uint64_t word = 42;
  CHILD_CHECK(me.w->wait(ep->tag_send(hello_tag, &word, sizeof word), 20000) == status::ok);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end) {
    me.w->progress();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return 3;
}

/// What an endpoint's error handler was told.
struct failure {
  int calls = 0;
  status reason = status::ok;
};

void on_failure(void* arg, endpoint*, status reason) {
  auto* f = static_cast<failure*>(arg);
  ++f->calls;
  f->reason = reason;
}

/// A receive posted with its own buffer and tracker.
struct posted {
  std::vector<uint8_t> buffer = std::vector<uint8_t>(64);
  recv_tracker t;
  op o;
};

}  // namespace recv_peer_death_test

using namespace recv_peer_death_test;

BOOST_DATA_TEST_CASE(posted_receives_survive_a_killed_peer_and_cancel_by_tag_and_mask,
                     boost::unit_test::data::make({"shm", "tcp"}), transport_name) {
  const std::string transport = transport_name;
  channel up, down;
  const pid_t child = fork_child([&] { return doomed_child(transport, up, down); });
  peer me(transport);
  std::vector<uint8_t> child_address;
  BOOST_REQUIRE(up.receive(&child_address));
  down.send(me.w->address());
  endpoint* to_child = nullptr;
  BOOST_REQUIRE(me.w->connect(child_address, &to_child) == status::ok);
  failure failed;
  to_child->set_error_handler(on_failure, &failed);
  uint64_t hello = 0;
  BOOST_REQUIRE(me.w->wait(me.w->tag_recv(&hello, sizeof hello, hello_tag, tag_mask_full), 20000) ==
                status::ok);
  BOOST_REQUIRE(hello == 42u);

  // Receives waiting for the child's tags: one exact, one wildcard, one exact on another tag.
  posted exact, wildcard, other;
  exact.o = me.w->tag_recv(exact.buffer.data(), exact.buffer.size(), 100, tag_mask_full,
                           recv_params(exact.t));
  wildcard.o = me.w->tag_recv(wildcard.buffer.data(), wildcard.buffer.size(), 0x200, 0xf00,
                              recv_params(wildcard.t));
  other.o = me.w->tag_recv(other.buffer.data(), other.buffer.size(), 300, tag_mask_full,
                           recv_params(other.t));
  for (posted* p : {&exact, &wildcard, &other}) BOOST_REQUIRE(p->o.req != nullptr);

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  BOOST_REQUIRE(spin_until([&] { me.w->progress(); }, [&] { return failed.calls == 1; }, 30));
  BOOST_TEST_MESSAGE(transport << ": the endpoint to the killed peer failed with "
                               << to_string(failed.reason));
  BOOST_TEST(to_child->state() == failed.reason);
  const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < settle) me.w->progress();
  for (posted* p : {&exact, &wildcard, &other}) {
    BOOST_TEST(p->t.calls == 0);
    BOOST_TEST(me.w->request_status(p->o.req) == status::in_progress);
  }

  // Another peer's message matches a receive the dead one left.
  peer next(transport);
  endpoint* to_me = nullptr;
  BOOST_REQUIRE(next.w->connect(me.w->address(), &to_me) == status::ok);
  const std::vector<uint8_t> data = pattern(48, 7);
  send_tracker sent;
  op s = to_me->tag_send(100, data.data(), data.size(), send_params(sent));
  BOOST_REQUIRE(spin_until([&] { me.w->progress(); next.w->progress(); },
                           [&] { return exact.t.calls == 1 && (s.req == nullptr || sent.calls); }));
  BOOST_TEST(exact.t.st == status::ok);
  BOOST_TEST(exact.t.info.length == data.size());
  BOOST_TEST(first_mismatch(exact.buffer.data(), data.size(), 7) == -1);
  if (s.req != nullptr) next.w->release(s.req);

  // Cancel by tag and mask: only the receives whose posted tag matches.
  BOOST_TEST(me.w->cancel_tag_recvs(0x200, 0xf00) == 1u);
  BOOST_TEST(wildcard.t.calls == 1);
  BOOST_TEST(wildcard.t.st == status::canceled);
  BOOST_TEST(other.t.calls == 0);
  BOOST_TEST(me.w->cancel_tag_recvs(0, 0) == 1u);  // every posted receive left
  BOOST_TEST(other.t.calls == 1);
  BOOST_TEST(other.t.st == status::canceled);
  BOOST_TEST(me.w->cancel_tag_recvs(0, 0) == 0u);
  for (posted* p : {&exact, &wildcard, &other}) me.w->release(p->o.req);
  BOOST_TEST(me.w->wait(to_me->close(), 20000) == status::ok);
  (void)me.w->wait(to_child->close(), 20000);
}

BOOST_AUTO_TEST_CASE(cancel_tag_recvs_selects_by_the_posted_tag_in_posting_order) {
  peer me("self");
  std::vector<int> order;
  std::vector<recv_tracker> t(4);
  std::vector<op> ops;
  uint64_t sink[4];
  // Tags carry a sender in bits 32..63: cancel those waiting for sender 5, wildcards included.
  const tag_t from5 = tag_t{5} << 32, from6 = tag_t{6} << 32;
  const std::pair<tag_t, tag_t> posts[] = {{from5 | 1, tag_mask_full},
                                           {from6 | 1, tag_mask_full},
                                           {from5, 0xffffffff00000000ull},
                                           {from5 | 2, tag_mask_full}};
  for (size_t i = 0; i < 4; ++i) {
    t[i].id = static_cast<int>(i);
    t[i].order = &order;
    ops.push_back(me.w->tag_recv(&sink[i], sizeof sink[i], posts[i].first, posts[i].second,
                                 recv_params(t[i])));
  }
  BOOST_TEST(me.w->cancel_tag_recvs(from5, 0xffffffff00000000ull) == 3u);
  BOOST_TEST(order == (std::vector<int>{0, 2, 3}));
  BOOST_TEST(t[1].calls == 0);
  BOOST_TEST(me.w->cancel(ops[1].req) == status::ok);
  for (op& o : ops) me.w->release(o.req);
}
