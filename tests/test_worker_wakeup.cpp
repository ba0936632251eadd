// Worker wakeup and fence (seed 003, UCP worker): signal from another thread while one is blocked
// in wait or polling the event fd, a signal before wait, an external epoll set, the events mask,
// user_data, default names, network-only addresses, request_info, thread modes (SERIALIZED from
// two threads under the user's mutex), the warning for requests the user leaked, and
// worker::fence on every lane. Runs over every transport present (verbs on the verbs test
// device, a software stand-in).
#define BOOST_TEST_MODULE worker_wakeup
#include "fixture.hpp"
#include "rkey_edit.hpp"
#include "test_util.hpp"

#include "verbs/testdev/testdev.hpp"

#include <comm/worker.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

using namespace comm;
using namespace comm::test;

namespace {

using clock_type = std::chrono::steady_clock;

/// Seconds since `start`.
double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// Progresses `w` until arm() says it may sleep (bounded); true once it did.
bool arm_when_idle(worker& w) {
  status st = status::busy;
  spin_until([&] { w.progress(); }, [&] { return (st = w.arm()) == status::ok; }, 10.0);
  return st == status::ok;
}

/// File descriptors registered in the epoll set `epfd` (from /proc/self/fdinfo).
size_t fds_in_epoll_set(int epfd) {
  std::ifstream in("/proc/self/fdinfo/" + std::to_string(epfd));
  size_t count = 0;
  for (std::string line; std::getline(in, line);) count += line.rfind("tfd:", 0) == 0;
  return count;
}

/// An AM handler that counts its calls in the int at `arg`.
status count_am(void* arg, const void*, size_t, void*, size_t, const am_recv_params&) {
  ++*static_cast<int*>(arg);
  return status::ok;
}

/// Calls a's wait(0) until the operation reporting to `t` completes (bounded) while another
/// thread progresses b (which answers software RMA); returns a's last wait's answer. Both threads
/// touch both workers: they take turns under one mutex, as the user serialises.
status wait_while_b_answers(worker_pair& p, const send_tracker& t) {
  std::atomic<bool> stop{false};
  std::mutex serialise;
  std::thread peer([&] {
    for (int i = 0; i < 200000 && !stop.load(); ++i) {
      std::lock_guard<std::mutex> g(serialise);
      p.b->progress();
    }
  });
  status last = status::timed_out;
  const auto start = clock_type::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> g(serialise);
      if (t.calls != 0 || seconds_since(start) > 20.0) break;
      last = p.a->wait(0);
    }
    std::this_thread::yield();
  }
  stop = true;
  peer.join();
  return last;
}

/// True when every byte of `bytes` is still 0.
bool untouched(const std::vector<uint8_t>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

/// Worker parameters whose wait() ends only for tagged receives (and signals, failures).
worker_params waits_for_tag_recv() {
  worker_params wp;
  wp.events = wakeup_tag_recv;
  return wp;
}

}  // namespace

// -- signal -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(signals)

BOOST_DATA_TEST_CASE(signal_wakes_a_thread_blocked_in_wait, each_transport(), transport) {
  worker_pair p(transport, {}, waits_for_tag_recv());
  std::atomic<bool> returned{false};
  status result = status::in_progress;
  double waited = 0;
  std::thread sleeper([&] {
    const auto start = clock_type::now();
    result = p.a->wait(20000);
    waited = seconds_since(start);
    returned = true;
  });
  // Nothing but a signal can end that wait: it must still be blocked after a while.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  BOOST_CHECK(!returned.load());
  const auto signalled = clock_type::now();
  BOOST_CHECK(p.a->signal() == status::ok);
  for (int i = 0; i < 1000 && !returned.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double after_signal = seconds_since(signalled);
  sleeper.join();
  BOOST_CHECK(result == status::ok);
  BOOST_CHECK_MESSAGE(after_signal < 10.0, "wait returned " << after_signal << " s after signal");
  BOOST_CHECK_MESSAGE(waited < 15.0, "wait took " << waited << " s (its limit is 20)");
}

BOOST_DATA_TEST_CASE(signal_before_wait_makes_it_return_at_once, each_transport(), transport) {
  worker_pair p(transport, {}, waits_for_tag_recv());
  BOOST_CHECK(p.a->signal() == status::ok);
  BOOST_CHECK(p.a->signal() == status::ok);
  const auto start = clock_type::now();
  BOOST_CHECK(p.a->wait(20000) == status::ok);
  BOOST_CHECK_MESSAGE(seconds_since(start) < 10.0, "a signalled wait slept");
  // Both signals were consumed by that wait: the next one sleeps its time.
  BOOST_CHECK(p.a->wait(100) == status::timed_out);
}

BOOST_DATA_TEST_CASE(signal_wakes_a_thread_polling_the_event_fd, each_transport(), transport) {
  worker_pair p(transport);
  const int fd = p.a->event_fd();
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(arm_when_idle(*p.a));
  pollfd pfd{fd, POLLIN, 0};
  BOOST_CHECK_EQUAL(poll(&pfd, 1, 0), 0);  // idle and armed: nothing to report
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)p.a->signal();
  });
  pfd.revents = 0;
  const int ready = poll(&pfd, 1, 20000);
  signaller.join();
  BOOST_CHECK_EQUAL(ready, 1);
  BOOST_CHECK(pfd.revents & POLLIN);
  BOOST_CHECK(p.a->arm() == status::busy);  // the signal, consumed here
  BOOST_CHECK(arm_when_idle(*p.a));
  pfd.revents = 0;
  BOOST_CHECK_EQUAL(poll(&pfd, 1, 0), 0);
}

BOOST_AUTO_TEST_CASE(signal_without_wakeup_is_unsupported) {
  context ctx(config_for(transports_under_test().front()));
  worker_params wp;
  wp.wakeup = false;
  auto w = worker::create(ctx, wp).value();
  BOOST_REQUIRE(w);
  BOOST_CHECK(w->signal() == status::unsupported);
  BOOST_CHECK(w->arm() == status::unsupported);
  BOOST_CHECK(w->wait(0) == status::unsupported);
  BOOST_CHECK_EQUAL(w->event_fd(), -1);
}

BOOST_AUTO_TEST_SUITE_END()

// -- external event fd ----------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(external_event_fd)

BOOST_DATA_TEST_CASE(worker_reports_on_the_users_epoll_set, each_transport(), transport) {
  const int epfd = epoll_create1(EPOLL_CLOEXEC);
  BOOST_REQUIRE(epfd >= 0);
  const int mine = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 7;
  BOOST_REQUIRE(epoll_ctl(epfd, EPOLL_CTL_ADD, mine, &ev) == 0);
  int marker = 0;
  worker_params wb;
  wb.event_fd = epfd;
  wb.user_data = &marker;
  {
    worker_pair p(transport, {}, {}, wb);
    BOOST_CHECK_EQUAL(p.b->event_fd(), -1);
    BOOST_CHECK(p.b->user_data() == &marker);
    BOOST_CHECK_GE(fds_in_epoll_set(epfd), 3u);  // ours, b's signal, b's interface

    // A tagged message to b wakes the user's set with b's user_data.
    std::vector<uint8_t> in(64, 0), out = pattern(64, 3);
    recv_tracker rt;
    op r = p.b->tag_recv(in.data(), in.size(), 9, tag_mask_full, recv_params(rt));
    BOOST_REQUIRE(r.pending());
    BOOST_REQUIRE(arm_when_idle(*p.b));
    op s = p.ab->tag_send(9, out.data(), out.size());
    BOOST_REQUIRE(!s.failed());
    bool woke = false;
    const auto start = clock_type::now();
    while (!woke && seconds_since(start) < 20.0) {
      p.a->progress();
      epoll_event got[4];
      const int n = epoll_wait(epfd, got, 4, 50);
      for (int i = 0; i < n; ++i) woke = woke || got[i].data.ptr == &marker;
    }
    BOOST_CHECK(woke);
    BOOST_CHECK(p.until([&] { return rt.calls == 1; }));
    BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 3), -1);
    p.b->release(r.req);
    BOOST_CHECK(p.finish(s) == status::ok);

    // The user's own source keeps its own data.
    const uint64_t one = 1;
    BOOST_REQUIRE(write(mine, &one, sizeof(one)) == sizeof(one));
    epoll_event got[8];
    int n = epoll_wait(epfd, got, 8, 5000);
    bool saw_mine = false;
    for (int i = 0; i < n; ++i) saw_mine = saw_mine || got[i].data.u64 == 7;
    BOOST_CHECK(saw_mine);
    uint64_t drained = 0;
    BOOST_CHECK(read(mine, &drained, sizeof(drained)) == sizeof(drained));

    // b's signal shows on the user's set, and b's wait sleeps on it.
    BOOST_REQUIRE(arm_when_idle(*p.b));
    BOOST_CHECK(p.b->signal() == status::ok);
    n = epoll_wait(epfd, got, 8, 5000);
    bool saw_signal = false;
    for (int i = 0; i < n; ++i) saw_signal = saw_signal || got[i].data.ptr == &marker;
    BOOST_CHECK(saw_signal);
    BOOST_CHECK(p.b->wait(20000) == status::ok);

    // Destroyed, b leaves only the user's own source in the set.
    p.b.reset();
    BOOST_CHECK_EQUAL(fds_in_epoll_set(epfd), 1u);
  }
  close(mine);
  close(epfd);
}

BOOST_AUTO_TEST_CASE(wait_leaves_the_events_of_the_users_sources_to_the_user) {
  const int epfd = epoll_create1(EPOLL_CLOEXEC);
  BOOST_REQUIRE(epfd >= 0);
  const int mine = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;  // reported once per write: an event taken by wait() is lost
  ev.data.u64 = 7;
  BOOST_REQUIRE(epoll_ctl(epfd, EPOLL_CTL_ADD, mine, &ev) == 0);
  context ctx(config_for(transports_under_test().front()));
  worker_params wp;
  wp.event_fd = epfd;
  auto w = worker::create(ctx, wp).value();
  BOOST_REQUIRE(w);
  BOOST_REQUIRE(arm_when_idle(*w));
  // The user's source is ready: the set is readable, so wait() wakes (and must leave the event).
  const uint64_t one = 1;
  BOOST_REQUIRE(write(mine, &one, sizeof(one)) == sizeof(one));
  BOOST_CHECK(w->wait(20000) == status::ok);
  epoll_event got[8];
  const int n = epoll_wait(epfd, got, 8, 1000);
  bool saw_mine = false;
  for (int i = 0; i < n; ++i) saw_mine = saw_mine || got[i].data.u64 == 7;
  BOOST_CHECK(saw_mine);
  w.reset();
  close(mine);
  close(epfd);
}

BOOST_AUTO_TEST_CASE(wait_returns_when_the_users_own_source_makes_the_set_readable) {
  // A level-triggered source of the user's stays readable, and with a narrowed mask nothing of
  // the worker's ends the wait: wait() must hand the readable set back, not poll it until its
  // deadline (timed_out).
  const int epfd = epoll_create1(EPOLL_CLOEXEC);
  BOOST_REQUIRE(epfd >= 0);
  const int mine = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);  // readable from the start
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 7;
  BOOST_REQUIRE(epoll_ctl(epfd, EPOLL_CTL_ADD, mine, &ev) == 0);
  context ctx(config_for(transports_under_test().front()));
  worker_params wp;
  wp.event_fd = epfd;
  wp.events = wakeup_tag_recv;
  auto w = worker::create(ctx, wp).value();
  BOOST_REQUIRE(w);
  BOOST_REQUIRE(arm_when_idle(*w));
  BOOST_CHECK(w->wait(20000) == status::ok);
  w.reset();
  close(mine);
  close(epfd);
}

BOOST_AUTO_TEST_CASE(an_event_fd_that_is_not_an_epoll_set_is_refused) {
  context ctx(config_for(transports_under_test().front()));
  int pipe_fds[2];
  BOOST_REQUIRE(pipe2(pipe_fds, O_CLOEXEC) == 0);
  const size_t fds_before = open_fds();
  for (int bad : {pipe_fds[0], -7}) {
    worker_params wp;
    wp.event_fd = bad;
    std::unique_ptr<worker> w;
    BOOST_CHECK(worker::create(ctx, wp, &w) == status::invalid_param);
    BOOST_CHECK(!w);
    auto made = worker::create(ctx, wp);
    BOOST_CHECK(!made);
    BOOST_CHECK(made.error() == status::invalid_param);
  }
  BOOST_CHECK_EQUAL(open_fds(), fds_before);  // nothing left open
  BOOST_CHECK(fcntl(pipe_fds[0], F_GETFD) != -1);  // the user's fd is still the user's
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

BOOST_AUTO_TEST_SUITE_END()

// -- events mask ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(events_mask)

BOOST_DATA_TEST_CASE(only_the_kinds_in_the_mask_end_wait, each_transport(), transport) {
  worker_pair p(transport, {}, {}, waits_for_tag_recv());
  BOOST_CHECK_EQUAL(p.b->wakeup_events(), unsigned{wakeup_tag_recv});
  BOOST_CHECK_EQUAL(p.a->wakeup_events(), unsigned{wakeup_all});
  int delivered = 0;
  BOOST_REQUIRE(p.b->set_am_handler(3, count_am, &delivered) == status::ok);
  const uint8_t payload[32] = {};
  op am = p.ab->am_send(3, nullptr, 0, payload, sizeof(payload));
  BOOST_REQUIRE(!am.failed());
  // The active message wakes b and is delivered by its wait, which goes on sleeping.
  int waits = 0;
  bool all_timed_out = true;
  const auto start = clock_type::now();
  while (delivered == 0 && seconds_since(start) < 20.0) {
    p.a->progress();
    all_timed_out = all_timed_out && p.b->wait(100) == status::timed_out;
    ++waits;
  }
  BOOST_CHECK_EQUAL(delivered, 1);
  BOOST_CHECK_MESSAGE(all_timed_out, "an active message ended a wait for tagged receives");
  BOOST_CHECK(p.finish(am) == status::ok);

  // A tagged receive completing ends it.
  std::vector<uint8_t> in(100, 0), out = pattern(100, 5);
  recv_tracker rt;
  op r = p.b->tag_recv(in.data(), in.size(), 11, tag_mask_full, recv_params(rt));
  BOOST_REQUIRE(r.pending());
  op s = p.ab->tag_send(11, out.data(), out.size());
  BOOST_REQUIRE(!s.failed());
  status last = status::timed_out;
  const auto second = clock_type::now();
  while (rt.calls == 0 && seconds_since(second) < 20.0) {
    p.a->progress();
    last = p.b->wait(100);
  }
  BOOST_CHECK_EQUAL(rt.calls, 1);
  BOOST_CHECK_MESSAGE(last == status::ok, "the wait that completed the receive: "
                                              << to_string(last));
  p.b->release(r.req);
  BOOST_CHECK(p.finish(s) == status::ok);
}

BOOST_DATA_TEST_CASE(an_active_message_ends_a_wait_for_am, each_transport(), transport) {
  worker_params wb;
  wb.events = wakeup_am;
  worker_pair p(transport, {}, {}, wb);
  int delivered = 0;
  BOOST_REQUIRE(p.b->set_am_handler(4, count_am, &delivered) == status::ok);
  const uint8_t payload[8] = {};
  op am = p.ab->am_send(4, nullptr, 0, payload, sizeof(payload));
  BOOST_REQUIRE(!am.failed());
  status last = status::timed_out;
  const auto start = clock_type::now();
  while (delivered == 0 && seconds_since(start) < 20.0) {
    p.a->progress();
    last = p.b->wait(100);
  }
  BOOST_CHECK_EQUAL(delivered, 1);
  BOOST_CHECK(last == status::ok);
  BOOST_CHECK(p.finish(am) == status::ok);
}

BOOST_DATA_TEST_CASE(a_completed_get_ends_a_wait_for_rma, each_transport(), transport) {
  worker_params wa;
  wa.events = wakeup_rma;
  worker_pair p(transport, {}, wa);
  // A get through the lane (on self and shm a local copy), then one through a key without the
  // transports' entries: b's worker serves the read (software RMA), so that get is in flight on
  // every lane until b answers.
  for (const bool served_by_b : {false, true}) {
    const uint32_t seed = served_by_b ? 14 : 13;
    remote_region region(p, 4096, seed);
    rkey* key = served_by_b ? key_served_by_owner(p, region.handle) : region.key;
    std::vector<uint8_t> local(4096, 0);
    iov_entry entry{local.data(), local.size()};
    send_tracker t;
    op g = p.ab->get(&entry, 1, region.address(), key,
                     send_params(t, request_no_immediate_completion));
    BOOST_REQUIRE(g.pending());
    if (t.calls == 1) {
      // A lane whose get is a local copy completed it in the call: that happened before any
      // wait, so a wait does not end for it.
      BOOST_TEST_MESSAGE(transport << ": the get completed in the call");
      BOOST_CHECK_MESSAGE(!served_by_b, "a get that b serves completed before b progressed");
      BOOST_CHECK(t.st == status::ok);
      BOOST_CHECK(p.a->wait(100) == status::timed_out);
    } else {
      BOOST_CHECK(wait_while_b_answers(p, t) == status::ok);  // the wait that saw it complete
      BOOST_CHECK_EQUAL(t.calls, 1);
      BOOST_CHECK(t.st == status::ok);
    }
    p.a->release(g.req);
    if (served_by_b) p.ab->rkey_destroy(key);
    BOOST_CHECK_EQUAL(first_mismatch(local.data(), local.size(), seed), -1);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// -- names, user data, thread modes -------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(identity)

BOOST_AUTO_TEST_CASE(default_names_are_unique_and_shown_in_info) {
  context ctx(config_for(transports_under_test().front()));
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string prefix = std::string(host) + ":" + std::to_string(getpid()) + ":";
  std::vector<std::unique_ptr<worker>> workers;
  std::set<std::string> names;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(worker::create(ctx).value());
    const std::string& name = workers.back()->name();
    BOOST_CHECK_MESSAGE(name.rfind(prefix, 0) == 0, name << " does not start with " << prefix);
    names.insert(name);
    BOOST_CHECK(workers.back()->info().find("# worker " + name + " ") != std::string::npos);
    worker_address_attr attr;
    const std::vector<uint8_t> address = workers.back()->address();
    BOOST_REQUIRE(worker::query_address(address.data(), address.size(), &attr) == status::ok);
    BOOST_CHECK_EQUAL(attr.name, name);
  }
  BOOST_CHECK_EQUAL(names.size(), workers.size());
  worker_params named;
  named.name = "given";
  BOOST_CHECK_EQUAL(worker::create(ctx, named).value()->name(), "given");
}

BOOST_AUTO_TEST_CASE(user_data_and_thread_mode_are_readable) {
  context ctx(config_for(transports_under_test().front()));
  int mine = 0;
  for (thread_mode mode : {thread_mode::single, thread_mode::serialized, thread_mode::multi}) {
    worker_params wp;
    wp.mode = mode;
    wp.user_data = &mine;
    auto w = worker::create(ctx, wp).value();
    BOOST_CHECK(w->user_data() == &mine);
    BOOST_CHECK(w->mode() == mode);
    BOOST_CHECK(w->info().find(std::string("thread_mode ") + detail::mode_name(mode)) !=
                std::string::npos);
  }
  BOOST_CHECK(worker::create(ctx).value()->user_data() == nullptr);
}

BOOST_AUTO_TEST_CASE(a_network_only_address_leaves_out_the_transports_of_this_machine) {
  config cfg = config::from_environment();
  cfg.transports = transports_under_test();
  context ctx(cfg);
  auto a = worker::create(ctx).value();
  auto b = worker::create(ctx).value();
  worker_address_attr full, net;
  const std::vector<uint8_t> full_bytes = b->address(), net_bytes = b->address(address_net_only);
  BOOST_REQUIRE(worker::query_address(full_bytes.data(), full_bytes.size(), &full) == status::ok);
  BOOST_REQUIRE(worker::query_address(net_bytes.data(), net_bytes.size(), &net) == status::ok);
  BOOST_TEST(net.uid == full.uid);
  BOOST_TEST(net.name == full.name);
  const auto has = [](const worker_address_attr& attr, const std::string& name) {
    return std::find(attr.transports.begin(), attr.transports.end(), name) != attr.transports.end();
  };
  for (const std::string& name : full.transports) {
    const bool local = name == "self" || name == "shm";
    BOOST_TEST(has(net, name) == !local, name);
  }
  for (const std::string& name : net.transports) BOOST_TEST(has(full, name), name);
  if (!has(full, "tcp")) return;  // the network lane below needs tcp
  // Between two workers of one process, the full address picks a machine-local lane (self
  // first); the network-only one a network lane.
  endpoint *local = nullptr, *remote = nullptr;
  BOOST_REQUIRE(a->connect(full_bytes, &local) == status::ok);
  BOOST_REQUIRE(a->connect(net_bytes, &remote) == status::ok);
  const std::string local_lane(local->transport()), remote_lane(remote->transport());
  BOOST_TEST((local_lane == "self" || local_lane == "shm"), local_lane);
  BOOST_TEST((remote_lane != "self" && remote_lane != "shm"), remote_lane);
  std::vector<uint8_t> got(5);
  op recv = b->tag_recv(got.data(), got.size(), 9, ~tag_t{0});
  const char text[] = "hello";
  op sent = remote->tag_send(9, text, 5);
  BOOST_TEST(spin_until([&] { a->progress(); b->progress(); },
                        [&] { return b->request_status(recv.req) != status::in_progress; }));
  BOOST_TEST(b->request_status(recv.req) == status::ok);
  BOOST_TEST(std::memcmp(got.data(), text, 5) == 0);
  b->release(recv.req);
  if (sent.req != nullptr) a->release(sent.req);
}

BOOST_DATA_TEST_CASE(request_info_names_the_kind_endpoint_bytes_and_status, each_transport(),
                     transport) {
  worker_pair p(transport);
  BOOST_TEST(p.a->request_info(nullptr) == "null request");
  std::vector<uint8_t> in(100), out(100, 7);
  op recv = p.b->tag_recv(in.data(), in.size(), 5, ~tag_t{0});
  BOOST_REQUIRE(recv.req != nullptr);
  const std::string waiting = p.b->request_info(recv.req);
  BOOST_TEST(waiting.rfind("tag_recv", 0) == 0u, waiting);
  BOOST_TEST(waiting.find("100 B in 1 entry") != std::string::npos, waiting);
  BOOST_TEST(waiting.find("in progress") != std::string::npos, waiting);
  request_params params;
  params.flags = request_no_immediate_completion;
  iov_entry entries[] = {{out.data(), 60}, {out.data() + 60, 40}};
  op send = p.ab->tag_send_iov(5, entries, 2, params);
  BOOST_REQUIRE(send.req != nullptr);
  const std::string sending = p.a->request_info(send.req);
  BOOST_TEST(sending.rfind("tag_send on ep ", 0) == 0u, sending);
  BOOST_TEST(sending.find("-> b via " + transport) != std::string::npos, sending);
  BOOST_TEST(sending.find("100 B in 2 entries") != std::string::npos, sending);
  BOOST_TEST(p.until([&] {
    return p.a->request_status(send.req) != status::in_progress &&
           p.b->request_status(recv.req) != status::in_progress;
  }));
  const std::string ok = std::string(", ") + to_string(status::ok);
  BOOST_TEST(p.b->request_info(recv.req).find(ok) != std::string::npos,
             p.b->request_info(recv.req));
  BOOST_TEST(p.a->request_info(send.req).find(ok) != std::string::npos,
             p.a->request_info(send.req));
  // A canceled receive says so.
  op lost = p.b->tag_recv(in.data(), in.size(), 6, ~tag_t{0});
  BOOST_REQUIRE(p.b->cancel(lost.req) == status::ok);
  BOOST_TEST(p.b->request_info(lost.req).find(to_string(status::canceled)) != std::string::npos,
             p.b->request_info(lost.req));
  p.a->release(send.req);
  p.b->release(recv.req);
  p.b->release(lost.req);
}

BOOST_DATA_TEST_CASE(serialized_worker_used_from_two_threads, each_transport(), transport) {
  worker_params ws;
  ws.mode = thread_mode::serialized;
  worker_pair p(transport, {}, ws, ws);
  std::mutex user_lock;  // the user's serialisation: the worker takes no lock of its own
  constexpr int rounds = 100;
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  auto run = [&](uint32_t thread_id) {
    for (int i = 0; i < rounds; ++i) {
      std::lock_guard<std::mutex> g(user_lock);
      const tag_t tag = (tag_t{thread_id} << 32) | static_cast<tag_t>(i);
      const uint32_t seed = thread_id * 1000 + static_cast<uint32_t>(i);
      std::vector<uint8_t> in(200, 0), out = pattern(200, seed);
      recv_tracker rt;
      op r = p.b->tag_recv(in.data(), in.size(), tag, tag_mask_full, recv_params(rt));
      op s = p.ab->tag_send(tag, out.data(), out.size());
      const bool received = p.until([&] { return rt.calls == 1; });
      if (!received || rt.st != status::ok || first_mismatch(in.data(), 200, seed) >= 0 ||
          p.finish(s) != status::ok) {
        ++failures;
      }
      if (r.pending()) p.b->release(r.req);
    }
  };
  // signal() needs no serialisation: a third thread calls it throughout.
  std::thread signaller([&] {
    while (!done.load()) {
      (void)p.a->signal();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::thread one(run, 1), two(run, 2);
  one.join();
  two.join();
  done = true;
  signaller.join();
  BOOST_CHECK_EQUAL(failures.load(), 0);
  BOOST_CHECK(p.a->mode() == thread_mode::serialized);
}

BOOST_AUTO_TEST_SUITE_END()

// -- leaked requests ------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(leaks)

BOOST_DATA_TEST_CASE(leaked_requests_are_reported_at_destruction, each_transport(), transport) {
  for (bool ignore : {false, true}) {
    BOOST_TEST_CONTEXT("worker_ignore_request_leak " << ignore) {
      worker_params wa, wb;
      wa.name = "leaker-a";
      wb.name = "leaker-b";
      if (ignore) wa.flags = wb.flags = worker_ignore_request_leak;
      auto p = std::make_unique<worker_pair>(transport, std::function<void(config&)>{}, wa, wb);
      std::vector<uint8_t> local(256, 0), in(64, 0);
      {
        remote_region region(*p, 256, 17);
        iov_entry entry{local.data(), local.size()};
        request_params keep;
        keep.flags = request_no_immediate_completion;
        op g = p->ab->get(&entry, 1, region.address(), region.key, keep);
        BOOST_REQUIRE(g.pending());
        BOOST_REQUIRE(p->until([&] { return p->a->request_status(g.req) != status::in_progress; }));
        // ... and never released. b posts two receives it never releases either.
      }
      op r1 = p->b->tag_recv(in.data(), 32, 100, tag_mask_full);
      op r2 = p->b->tag_recv(in.data() + 32, 32, 101, tag_mask_full);
      BOOST_REQUIRE(r1.pending() && r2.pending());
      // A released request is not a leak.
      op r3 = p->b->tag_recv(in.data(), 32, 102, tag_mask_full);
      p->b->release(r3.req);
      const std::string text = capture_stderr([&] { p.reset(); });
      if (ignore) {
        BOOST_CHECK_EQUAL(lines_with(text, "never released"), 0u);
      } else {
        BOOST_CHECK_MESSAGE(lines_with(text, "leaker-a: 1 request was never released by the "
                                             "user (1 get)") == 1, text);
        BOOST_CHECK_MESSAGE(lines_with(text, "leaker-b: 2 requests were never released by the "
                                             "user (2 tag_recv)") == 1, text);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(leak_warnings_are_rate_limited) {
  context ctx(config_for(transports_under_test().front()));
  constexpr int workers = 40;
  const std::string text = capture_stderr([&] {
    for (int i = 0; i < workers; ++i) {
      auto w = worker::create(ctx).value();
      uint8_t in[8];
      op r = w->tag_recv(in, sizeof(in), 1, tag_mask_full);
      BOOST_REQUIRE(r.pending());
    }
  });
  const size_t lines = lines_with(text, "never released");
  BOOST_CHECK_GE(lines, 1u);
  BOOST_CHECK_MESSAGE(lines <= 8 + 6, lines << " warnings for " << workers << " workers");
}

BOOST_AUTO_TEST_SUITE_END()

// -- fence ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(fences)

BOOST_DATA_TEST_CASE(a_put_after_the_fence_sends_what_the_get_before_it_read, each_transport(),
                     transport) {
  worker_pair p(transport);
  constexpr size_t length = 48 * 1024;
  remote_region source(p, length, 0), target(p, length, 0);
  std::vector<uint8_t> local(length, 0);
  iov_entry entry{local.data(), length};
  for (uint32_t round = 1; round <= 6; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      const std::vector<uint8_t> expected = pattern(length, 40 + round);
      std::memcpy(source.bytes.data(), expected.data(), length);
      op g = p.ab->get(&entry, 1, source.address(), source.key);
      BOOST_REQUIRE(!g.failed());
      BOOST_REQUIRE(p.a->fence() == status::ok);
      op put = p.ab->put(&entry, 1, target.address(), target.key);
      BOOST_REQUIRE(!put.failed());
      BOOST_CHECK(p.finish(g) == status::ok);
      BOOST_CHECK(p.finish(put) == status::ok);
      BOOST_CHECK(p.finish(p.a->flush()) == status::ok);
      BOOST_CHECK_EQUAL(first_mismatch(target.bytes.data(), length, 40 + round), -1);
    }
  }
}

BOOST_DATA_TEST_CASE(a_get_after_the_fence_reads_what_the_put_before_it_wrote, each_transport(),
                     transport) {
  worker_pair p(transport);
  constexpr size_t length = 100 * 1024;
  remote_region region(p, length, 0);
  for (uint32_t round = 1; round <= 4; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      std::vector<uint8_t> out = pattern(length, 60 + round), in(length, 0);
      iov_entry src{out.data(), length}, dst{in.data(), length};
      op put = p.ab->put(&src, 1, region.address(), region.key);
      BOOST_REQUIRE(!put.failed());
      BOOST_REQUIRE(p.a->fence() == status::ok);
      op g = p.ab->get(&dst, 1, region.address(), region.key);
      BOOST_REQUIRE(!g.failed());
      BOOST_CHECK(p.finish(put) == status::ok);
      BOOST_CHECK(p.finish(g) == status::ok);
      BOOST_CHECK_EQUAL(first_mismatch(in.data(), length, 60 + round), -1);
    }
  }
}

/// Starts a rendezvous tagged send from a that stays outstanding until b posts its receive.
op outstanding_rndv_send(worker_pair& p, const std::vector<uint8_t>& data, tag_t tag) {
  request_params sp;
  sp.flags = request_force_rndv;
  op s = p.ab->tag_send(tag, data.data(), data.size(), sp);
  BOOST_REQUIRE(s.pending());
  p.spin(2000);
  BOOST_REQUIRE(p.a->request_status(s.req) == status::in_progress);
  return s;
}

BOOST_DATA_TEST_CASE(operations_after_the_fence_wait_for_those_before, each_transport(),
                     transport) {
  worker_pair p(transport);
  const std::vector<uint8_t> message = pattern(256 * 1024, 70);
  remote_region target(p, 4096, 0);
  std::vector<uint8_t> local = pattern(4096, 71);
  iov_entry entry{local.data(), local.size()};
  op s = outstanding_rndv_send(p, message, 0x70);
  BOOST_REQUIRE(p.a->fence() == status::ok);
  op put = p.ab->put(&entry, 1, target.address(), target.key);
  BOOST_REQUIRE(put.pending());  // held behind the fence
  const uint8_t note[4] = {1, 2, 3, 4};
  int delivered = 0;
  BOOST_REQUIRE(p.b->set_am_handler(5, count_am, &delivered) == status::ok);
  op am = p.ab->am_send(5, nullptr, 0, note, sizeof(note));
  // Small tagged and stream sends, which otherwise go straight to the transport, are held too.
  op tag = p.ab->tag_send(0x71, note, sizeof(note));
  BOOST_CHECK(tag.pending());
  op stream = p.ab->stream_send(note, sizeof(note));
  BOOST_CHECK(stream.pending());
  p.spin(5000);
  // Not performed while the send before the fence is outstanding.
  BOOST_CHECK(p.a->request_status(put.req) == status::in_progress);
  BOOST_CHECK(untouched(target.bytes));
  BOOST_CHECK_EQUAL(delivered, 0);
  BOOST_CHECK(!p.b->tag_probe(0x71, tag_mask_full, nullptr));
  stream_poll_entry ready[1];
  BOOST_CHECK_EQUAL(p.b->stream_poll(ready, 1), 0u);
  // The receive lets the send complete; then the put and the AM go.
  std::vector<uint8_t> in(message.size(), 0);
  op r = p.b->tag_recv(in.data(), in.size(), 0x70, tag_mask_full);
  BOOST_CHECK(p.finish(r) == status::ok);
  BOOST_CHECK(p.finish(s) == status::ok);
  BOOST_CHECK(p.finish(put) == status::ok);
  BOOST_CHECK(p.finish(am) == status::ok);
  BOOST_CHECK(p.finish(tag) == status::ok);
  BOOST_CHECK(p.finish(stream) == status::ok);
  BOOST_CHECK(p.until([&] { return delivered == 1; }));
  BOOST_CHECK_EQUAL(first_mismatch(target.bytes.data(), target.bytes.size(), 71), -1);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 70), -1);
  uint8_t tagged[sizeof(note)] = {}, streamed[sizeof(note)] = {};
  BOOST_CHECK(p.finish(p.b->tag_recv(tagged, sizeof(tagged), 0x71, tag_mask_full)) == status::ok);
  endpoint* from_a = worker_pair::receiving_ep(*p.b, p.ab);
  BOOST_REQUIRE(from_a != nullptr);
  request_params all;
  all.flags = request_stream_waitall;
  BOOST_CHECK(p.finish(from_a->stream_recv(streamed, sizeof(streamed), nullptr, all)) ==
              status::ok);
  BOOST_CHECK(std::equal(note, note + sizeof(note), tagged));
  BOOST_CHECK(std::equal(note, note + sizeof(note), streamed));
}

BOOST_DATA_TEST_CASE(operations_behind_a_fence_fail_with_their_endpoint, each_transport(),
                     transport) {
  worker_pair p(transport);
  const std::vector<uint8_t> message = pattern(256 * 1024, 80);
  std::vector<uint8_t> local(4096, 1);
  iov_entry entry{local.data(), local.size()};
  auto target = std::make_unique<remote_region>(p, 4096, 0);
  op s = outstanding_rndv_send(p, message, 0x80);
  BOOST_REQUIRE(p.a->fence() == status::ok);
  send_tracker t;
  op put = p.ab->put(&entry, 1, target->address(), target->key, send_params(t));
  BOOST_REQUIRE(put.pending());
  target->release();
  p.b.reset();  // the peer goes: what waits behind the fence fails, nothing hangs
  BOOST_CHECK(worker_pair::until_on(*p.a, [&] { return t.calls == 1; }));
  BOOST_CHECK(is_error(t.st));
  BOOST_CHECK(worker_pair::until_on(*p.a, [&] {
    return p.a->request_status(s.req) != status::in_progress;
  }));
  BOOST_CHECK(is_error(p.a->request_status(s.req)));
  p.a->release(s.req);
  p.a->release(put.req);
}

BOOST_DATA_TEST_CASE(a_fence_with_nothing_outstanding_returns_at_once, each_transport(),
                     transport) {
  worker_pair p(transport);
  BOOST_CHECK(p.a->fence() == status::ok);
  BOOST_CHECK(tag_roundtrip(p, 1000, 90, true));
  BOOST_CHECK_EQUAL(detail::impl(*p.ab).pending_head, nullptr);
}

BOOST_AUTO_TEST_CASE(on_verbs_a_put_after_the_fence_waits_for_held_read_responses) {
  const auto list = transports_under_test();
  if (std::find(list.begin(), list.end(), "verbs") == list.end()) {
    BOOST_TEST_MESSAGE("verbs is not under test here (COMM_TEST_TLS)");
    return;
  }
  worker_pair p("verbs");
  constexpr size_t length = 8192;
  remote_region source(p, length, 95), target(p, length, 0);
  std::vector<uint8_t> local(length, 0);
  iov_entry entry{local.data(), length};
  verbs::testdev::hold_read_responses(true);
  op g = p.ab->get(&entry, 1, source.address(), source.key);
  BOOST_REQUIRE(g.pending());
  BOOST_REQUIRE(p.a->fence() == status::ok);
  op put = p.ab->put(&entry, 1, target.address(), target.key);
  BOOST_REQUIRE(put.pending());
  p.spin(5000);
  BOOST_CHECK(p.a->request_status(put.req) == status::in_progress);
  BOOST_CHECK(untouched(target.bytes));
  verbs::testdev::hold_read_responses(false);
  BOOST_CHECK(p.finish(g) == status::ok);
  BOOST_CHECK(p.finish(put) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(target.bytes.data(), length, 95), -1);
}

BOOST_AUTO_TEST_SUITE_END()
