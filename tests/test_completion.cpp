// Send completion semantics over every transport: immediate completion, requests on demand,
// NO_RESOURCE parking on the pending queue and resuming in order, force-immediate, flush of an
// endpoint and of a worker, ordered callbacks, blocking helpers, request status, release before
// completion, cancel of queued sends and endpoint close.
#define BOOST_TEST_MODULE completion
#include "fixture.hpp"

#include <algorithm>
#include <deque>

using namespace comm;
using namespace comm::test;

namespace completion_test {

/// A receive buffer and its tracker, kept alive in a deque.
struct posted_recv {
  std::vector<uint8_t> buffer;
  recv_tracker tracker;
  op o;
};

/// A pair whose receive FIFOs hold only a few messages, so senders run out of resources.
std::unique_ptr<worker_pair> small_fifo_pair(const std::string& tl_name) {
  return std::make_unique<worker_pair>(tl_name, [](config& c) {
    c.transport_options = {
        {"COMM_SELF_FIFO_SIZE", "4"}, {"COMM_SHM_FIFO_SIZE", "4"}, {"COMM_TCP_WINDOW", "4"}};
  });
}

/// Sends 8-byte messages with force_immediate from ab until the transport refuses one; returns
/// how many went (bounded).
int fill_until_no_resource(worker_pair& p, tag_t tag) {
  request_params fi;
  fi.flags = request_force_immediate;
  for (int i = 0; i < 100000; ++i) {
    const uint64_t v = static_cast<uint64_t>(i);
    op o = p.ab->tag_send(tag, &v, sizeof(v), fi);
    if (o.st == status::no_resource) {
      BOOST_CHECK(o.req == nullptr);
      return i;
    }
    BOOST_REQUIRE_MESSAGE(o.done(), "force_immediate send: " << to_string(o.st));
  }
  BOOST_FAIL("the transport never ran out of resources");
  return -1;
}

/// Receives `count` 8-byte messages tagged `tag` on b (progressing both); returns their values.
std::vector<uint64_t> drain(worker_pair& p, tag_t tag, int count) {
  std::vector<uint64_t> values;
  for (int i = 0; i < count; ++i) {
    uint64_t v = ~0ull;
    op r = p.b->tag_recv(&v, sizeof(v), tag, tag_mask_full);
    const status st = p.finish(r);
    BOOST_CHECK_MESSAGE(st == status::ok, "receive " << i << ": " << to_string(st));
    if (st != status::ok) break;
    values.push_back(v);
  }
  return values;
}

}  // namespace completion_test

using namespace completion_test;

BOOST_AUTO_TEST_SUITE(immediate)

BOOST_DATA_TEST_CASE(short_and_bcopy_are_done_at_once, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const std::vector<uint8_t> d = pattern(3000, 1);
  send_tracker t;
  BOOST_CHECK(p.ab->tag_send(1, d.data(), 8, send_params(t)).done());
  request_params bc = send_params(t, request_force_bcopy);
  BOOST_CHECK(p.ab->tag_send(1, d.data(), d.size(), bc).done());
  BOOST_CHECK(p.ab->am_send(1, d.data(), 8, d.data(), 100, send_params(t)).done());
  BOOST_CHECK_EQUAL(t.calls, 0);  // no callback for what completed in the call
  std::vector<uint8_t> in(d.size());
  for (size_t n : {size_t{8}, d.size()}) {
    recv_tracker rt;
    request_params rp = recv_params(rt);
    rp.recv_info = &rt.info;  // filled when it completes in the call, else by the callback
    BOOST_CHECK(p.finish(p.b->tag_recv(in.data(), in.size(), 1, tag_mask_full, rp)) == status::ok);
    BOOST_CHECK_EQUAL(rt.info.length, n);
  }
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 1), -1);
}

BOOST_DATA_TEST_CASE(no_immediate_completion_gives_a_request, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const uint64_t v = 42;
  for (uint32_t extra : {0u, uint32_t{request_force_bcopy}}) {
    send_tracker t;
    op o = p.ab->tag_send(2, &v, sizeof(v), send_params(t, request_no_immediate_completion | extra));
    BOOST_REQUIRE(o.pending());
    BOOST_CHECK(o.st == status::in_progress);
    BOOST_REQUIRE(p.until([&] { return t.calls > 0; }));
    BOOST_CHECK_EQUAL(t.calls, 1);
    BOOST_CHECK(t.st == status::ok);
    BOOST_CHECK(p.a->request_status(o.req) == status::ok);
    p.a->release(o.req);
  }
  send_tracker am;
  op o = p.ab->am_send(3, nullptr, 0, &v, sizeof(v), send_params(am, request_no_immediate_completion));
  BOOST_REQUIRE(o.pending());
  BOOST_CHECK(p.finish(o) == status::ok);
  BOOST_CHECK_EQUAL(am.calls, 1);
  // An endpoint flush with nothing outstanding, asked for a request.
  send_tracker fl;
  op f = p.ab->flush(send_params(fl, request_no_immediate_completion));
  BOOST_REQUIRE(f.pending());
  BOOST_CHECK(p.finish(f) == status::ok);
  BOOST_CHECK_EQUAL(fl.calls, 1);
  BOOST_CHECK_EQUAL(drain(p, 2, 2).size(), 2u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pending_queue)

BOOST_DATA_TEST_CASE(no_resource_parks_and_resumes_in_order, each_transport(), tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  constexpr int count = 300;
  const size_t sizes[] = {8, 500, p.bcopy_payload() + 10};  // short, bcopy, two fragments
  std::vector<std::vector<uint8_t>> data(count);
  std::vector<send_tracker> trackers(count);
  std::vector<op> ops(count);
  std::vector<int> order;
  for (int i = 0; i < count; ++i) {
    data[i] = pattern(sizes[i % 3], i);
    std::memcpy(data[i].data(), &i, sizeof(i));
    trackers[i].id = i;
    trackers[i].order = &order;
    request_params sp = send_params(trackers[i]);
    sp.flags = request_force_bcopy * (i % 3 != 0);
    ops[i] = p.ab->tag_send(7, data[i].data(), data[i].size(), sp);
    BOOST_REQUIRE_MESSAGE(!ops[i].failed(), "send " << i << ": " << to_string(ops[i].st));
  }
  int queued = 0;
  for (const op& o : ops) queued += o.pending();
  BOOST_CHECK_GT(queued, count / 2);  // the receiver never progressed: most of them wait
  BOOST_CHECK_GT(p.ab->counters().retries, 0u);
  // Once a send is queued every later one is: a done send never follows a queued one.
  const auto first_queued =
      std::find_if(ops.begin(), ops.end(), [](const op& o) { return o.pending(); });
  BOOST_CHECK(std::all_of(first_queued, ops.end(), [](const op& o) { return o.pending(); }));
  // The sender alone cannot finish them.
  for (int i = 0; i < 2000; ++i) p.a->progress();
  BOOST_CHECK(ops.back().pending() && p.a->request_status(ops.back().req) == status::in_progress);
  BOOST_CHECK(order.empty() || order.size() < static_cast<size_t>(queued));

  // Once the receiver progresses, everything completes, callbacks in send order.
  std::vector<uint64_t> seen;
  std::vector<uint8_t> in(sizes[2]);
  int received = 0;
  BOOST_REQUIRE(p.until([&] {
    while (received < count) {
      tag_recv_info info{};
      request_params rp;
      rp.recv_info = &info;
      op r = p.b->tag_recv(in.data(), in.size(), 7, tag_mask_full, rp);
      if (r.pending()) {
        (void)p.b->cancel(r.req, cancel_mode::force);
        break;
      }
      BOOST_CHECK(r.st == status::ok);
      int seq = -1;
      std::memcpy(&seq, in.data(), sizeof(seq));
      seen.push_back(static_cast<uint64_t>(seq));
      BOOST_CHECK_EQUAL(info.length, sizes[seq % 3]);
      ++received;
    }
    return received == count && order.size() == static_cast<size_t>(queued);
  }));
  for (int i = 0; i < count; ++i) BOOST_CHECK_EQUAL(seen[i], static_cast<uint64_t>(i));
  std::vector<int> expected_order;
  for (int i = 0; i < count; ++i) {
    if (ops[i].pending()) expected_order.push_back(i);
  }
  BOOST_CHECK(order == expected_order);
  for (int i = 0; i < count; ++i) {
    if (ops[i].pending()) {
      BOOST_CHECK(p.a->request_status(ops[i].req) == status::ok);
      BOOST_CHECK_EQUAL(trackers[i].calls, 1);
      p.a->release(ops[i].req);
    }
  }
}

BOOST_DATA_TEST_CASE(am_sends_park_too, each_transport(), tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  std::vector<uint64_t> got;
  BOOST_REQUIRE(p.b->set_am_handler(
                    5,
                    [](void* arg, const void*, size_t, void* data, size_t length,
                       const am_recv_params&) {
                      uint64_t v = 0;
                      std::memcpy(&v, data, std::min(length, sizeof(v)));
                      static_cast<std::vector<uint64_t>*>(arg)->push_back(v);
                      return status::ok;
                    },
                    &got) == status::ok);
  constexpr int count = 100;
  std::vector<uint64_t> values(count);
  std::vector<op> ops(count);
  for (int i = 0; i < count; ++i) {
    values[i] = static_cast<uint64_t>(i);
    ops[i] = p.ab->am_send(5, nullptr, 0, &values[i], sizeof(uint64_t));
    BOOST_REQUIRE(!ops[i].failed());
  }
  BOOST_CHECK(ops.back().pending());
  BOOST_REQUIRE(p.until([&] { return got.size() == static_cast<size_t>(count); }));
  for (int i = 0; i < count; ++i) {
    BOOST_CHECK_EQUAL(got[i], static_cast<uint64_t>(i));
    BOOST_CHECK(p.finish(ops[i]) == status::ok);
  }
}

BOOST_DATA_TEST_CASE(force_immediate_returns_no_resource, each_transport(), tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  const int went = fill_until_no_resource(p, 8);
  BOOST_CHECK_GT(went, 0);
  request_params fi;
  fi.flags = request_force_immediate;
  const uint64_t v = 1;
  BOOST_CHECK(p.ab->tag_send(8, &v, sizeof(v), fi).st == status::no_resource);
  BOOST_CHECK(p.ab->am_send(8, nullptr, 0, &v, sizeof(v), fi).st == status::no_resource);
  const std::vector<uint8_t> big = pattern(3 * p.bcopy_payload(), 1);
  request_params fib = fi;
  fib.flags |= request_force_bcopy;
  BOOST_CHECK(p.ab->tag_send(8, big.data(), big.size(), fib).st == status::no_resource);
  // Without the flag the same send is queued; with the flag behind a queued send: no_resource.
  op queued = p.ab->tag_send(8, &v, sizeof(v));
  BOOST_CHECK(queued.pending());
  for (int i = 0; i < 100; ++i) p.b->progress();  // room again in the FIFO, the queue is not empty
  BOOST_CHECK(p.ab->tag_send(8, &v, sizeof(v), fi).st == status::no_resource);
  BOOST_CHECK(p.finish(queued) == status::ok);
  BOOST_CHECK_EQUAL(drain(p, 8, went + 1).size(), static_cast<size_t>(went + 1));
  // Room again: force_immediate sends go.
  BOOST_CHECK(p.ab->tag_send(8, &v, sizeof(v), fi).done());
  BOOST_CHECK_EQUAL(drain(p, 8, 1).size(), 1u);
  BOOST_CHECK_EQUAL(detail::impl(*p.a).matcher.expected_count(), 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(flush)

BOOST_DATA_TEST_CASE(flush_endpoint_and_worker, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const bool device_ack = acknowledged_by_device(tl_name);
  // Idle: both complete at once, or with a request when asked. A transport acknowledged by the
  // peer's device may still wait for the acknowledgement of the wireup's unsignaled sends: the
  // sender alone finishes that flush.
  op idle = p.ab->flush();
  if (device_ack && idle.pending()) {
    BOOST_CHECK(worker_pair::until_on(
        *p.a, [&] { return p.a->request_status(idle.req) != status::in_progress; }));
    BOOST_CHECK(p.finish(idle) == status::ok);
  } else {
    BOOST_CHECK(idle.done());
  }
  op wf = p.a->flush();
  BOOST_CHECK_MESSAGE(p.finish(wf, 5) == status::ok, "worker flush of idle endpoints");
  send_tracker wt;
  op wf2 = p.a->flush(send_params(wt, request_no_immediate_completion));
  BOOST_CHECK(wf2.pending());
  BOOST_CHECK(p.finish(wf2, 5) == status::ok);
  BOOST_CHECK_EQUAL(wt.calls, 1);

  // Two zcopy sends outstanding on ab, then an endpoint flush and a worker flush: neither
  // completes before the sends, and all four complete in that order (on a transport acknowledged
  // by the peer's device, possibly before b took the data).
  const std::vector<uint8_t> big = pattern(100000, 3);
  std::vector<int> order;
  send_tracker z1, z2, f_ep, f_w;
  z1.id = 1, z2.id = 2, f_ep.id = 3, f_w.id = 4;
  for (send_tracker* t : {&z1, &z2, &f_ep, &f_w}) t->order = &order;
  op s1 = p.ab->tag_send(9, big.data(), big.size(), send_params(z1, request_force_zcopy));
  op s2 = p.ab->tag_send(9, big.data(), big.size(), send_params(z2, request_force_zcopy));
  op fe = p.ab->flush(send_params(f_ep));
  op fw = p.a->flush(send_params(f_w));
  const bool zcopy = p.attr().caps & tl::cap_am_zcopy;
  if (zcopy) {
    BOOST_CHECK(s1.pending() && s2.pending());
    BOOST_CHECK(fe.pending());
    BOOST_CHECK(fw.pending());
    if (!device_ack) {
      for (int i = 0; i < 1000; ++i) p.a->progress();  // b holds nothing yet: nothing completes
      BOOST_CHECK(order.empty());
    }
  }
  std::vector<uint8_t> in(big.size());
  for (int i = 0; i < 2; ++i) {
    op r = p.b->tag_recv(in.data(), in.size(), 9, tag_mask_full);
    BOOST_CHECK(p.finish(r) == status::ok);
  }
  for (op o : {s1, s2, fe, fw}) BOOST_CHECK(p.finish(o, 10) == status::ok);
  if (zcopy) {
    BOOST_CHECK((order == std::vector<int>{1, 2, 3, 4}));
  }
}

BOOST_DATA_TEST_CASE(flush_waits_for_the_pending_queue, each_transport(), tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  const int went = fill_until_no_resource(p, 10);
  std::vector<int> order;
  send_tracker s, f, w;
  s.id = 1, f.id = 2, w.id = 3;
  s.order = f.order = w.order = &order;
  const uint64_t v = 99;
  op queued = p.ab->tag_send(10, &v, sizeof(v), send_params(s));
  BOOST_REQUIRE(queued.pending());
  op fe = p.ab->flush(send_params(f));
  op fw = p.a->flush(send_params(w));
  BOOST_CHECK(fe.pending());
  BOOST_CHECK(fw.pending());
  for (int i = 0; i < 1000; ++i) p.a->progress();
  BOOST_CHECK(order.empty());
  const auto values = drain(p, 10, went + 1);
  BOOST_CHECK_EQUAL(values.size(), static_cast<size_t>(went + 1));
  if (!values.empty()) BOOST_CHECK_EQUAL(values.back(), 99u);
  for (op o : {queued, fe, fw}) BOOST_CHECK(p.finish(o, 10) == status::ok);
  BOOST_CHECK((order == std::vector<int>{1, 2, 3}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(ordering)

BOOST_DATA_TEST_CASE(callbacks_in_send_order, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const std::vector<uint8_t> big = pattern(300000, 4);
  const uint64_t v = 7;
  std::vector<int> order;
  std::deque<send_tracker> t(6);
  for (int i = 0; i < 6; ++i) {
    t[i].id = i;
    t[i].order = &order;
  }
  std::vector<op> ops;
  // zcopy or rendezvous (forced zcopy where the lane sends heap memory of this size by copies)
  const uint32_t first =
      detail::impl(*p.ab).copies_below > big.size() ? uint32_t{request_force_zcopy} : 0u;
  ops.push_back(p.ab->tag_send(11, big.data(), big.size(), send_params(t[0], first)));
  ops.push_back(p.ab->tag_send(11, &v, 8, send_params(t[1], request_no_immediate_completion)));
  ops.push_back(p.ab->tag_send(11, big.data(), 1000,
                               send_params(t[2], request_no_immediate_completion |
                                                     request_force_bcopy)));
  ops.push_back(p.ab->am_send(11, nullptr, 0, &v, 8,
                              send_params(t[3], request_no_immediate_completion)));
  ops.push_back(p.ab->tag_send(11, big.data(), 5000, send_params(t[4], request_force_zcopy)));
  ops.push_back(p.ab->flush(send_params(t[5], request_no_immediate_completion)));
  for (const op& o : ops) BOOST_CHECK(o.pending());
  std::vector<uint8_t> in(big.size());
  for (int i = 0; i < 4; ++i) {
    op r = p.b->tag_recv(in.data(), in.size(), 11, tag_mask_full);
    BOOST_CHECK(p.finish(r) == status::ok);
  }
  for (const op& o : ops) BOOST_CHECK(p.finish(o) == status::ok);
  BOOST_CHECK((order == std::vector<int>{0, 1, 2, 3, 4, 5}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(helpers)

BOOST_DATA_TEST_CASE(worker_wait_for_an_operation, each_transport(), tl_name) {
  worker_pair p(tl_name);
  // A receive that a message satisfies: wait progresses until it is done and releases it.
  uint64_t got = 0;
  op r = p.b->tag_recv(&got, 8, 12, tag_mask_full);
  const uint64_t v = 12345;
  BOOST_CHECK(p.ab->tag_send(12, &v, 8).done());
  // b's wait progresses only b; self and shm deliver without the sender progressing.
  BOOST_CHECK(p.b->wait(r, 10000) == status::ok);
  BOOST_CHECK_EQUAL(got, 12345u);
  // A receive nothing satisfies: timed_out, and it is canceled (a later message is unexpected).
  op never = p.b->tag_recv(&got, 8, 13, tag_mask_full);
  BOOST_CHECK(p.b->wait(never, 20) == status::timed_out);
  BOOST_CHECK_EQUAL(detail::impl(*p.b).matcher.expected_count(), 0u);
  // Done and failed operations are returned as they are.
  BOOST_CHECK(p.b->wait(op{}, 0) == status::ok);
  BOOST_CHECK(p.b->wait(op{status::no_resource, nullptr}, 0) == status::no_resource);
  // A zcopy send waited for by its sender (the receiver is progressed meanwhile by b's wait
  // below, then a's wait sees the completion).
  const std::vector<uint8_t> big = pattern(100000, 5);
  std::vector<uint8_t> in(big.size());
  op s = p.ab->tag_send(14, big.data(), big.size());
  op rr = p.b->tag_recv(in.data(), in.size(), 14, tag_mask_full);
  BOOST_CHECK(p.b->wait(rr, 10000) == status::ok);
  BOOST_CHECK(p.a->wait(s, 10000) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 5), -1);
}

BOOST_DATA_TEST_CASE(blocking_wait_on_the_event_fd, each_transport(), tl_name) {
  worker_pair p(tl_name);
  BOOST_REQUIRE_GE(p.b->event_fd(), 0);
  p.spin(10);
  // Nothing to do: wait sleeps, then times out.
  BOOST_CHECK(p.b->wait(20) == status::timed_out);
  // A message arrives: wait returns ok (possibly after a few rounds), and the receive is done.
  uint64_t got = 0;
  recv_tracker rt;
  op r = p.b->tag_recv(&got, 8, 15, tag_mask_full, recv_params(rt));
  const uint64_t v = 777;
  BOOST_CHECK(p.ab->tag_send(15, &v, 8).done());
  for (int i = 0; i < 100 && rt.calls == 0; ++i) {
    const status st = p.b->wait(1000);
    BOOST_CHECK(st == status::ok || st == status::timed_out);
  }
  BOOST_CHECK_EQUAL(rt.calls, 1);
  BOOST_CHECK_EQUAL(got, 777u);
  p.b->release(r.req);
  // arm() says busy while something is pending.
  BOOST_CHECK(p.ab->tag_send(15, &v, 8).done());
  status armed = status::ok;
  for (int i = 0; i < 1000 && armed != status::busy; ++i) armed = p.b->arm();
  BOOST_CHECK(armed == status::busy);
  BOOST_CHECK_EQUAL(drain(p, 15, 1).size(), 1u);
  // A worker without wakeup has no event fd.
  worker_params nw;
  nw.wakeup = false;
  auto w = worker::create(*p.ctx, nw).value();
  BOOST_CHECK_EQUAL(w->event_fd(), -1);
  BOOST_CHECK(w->wait(0) == status::unsupported);
}

BOOST_DATA_TEST_CASE(request_status_and_release_before_completion, each_transport(), tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  BOOST_CHECK(p.a->request_status(nullptr) == status::invalid_param);
  const int went = fill_until_no_resource(p, 16);
  // A queued send: in progress; released before it completes, its callback still runs once.
  send_tracker t;
  const uint64_t v = 5;
  op s = p.ab->tag_send(16, &v, 8, send_params(t));
  BOOST_REQUIRE(s.pending());
  BOOST_CHECK(p.a->request_status(s.req) == status::in_progress);
  p.a->release(s.req);
  // A posted receive released before its message arrives: its callback still runs once.
  uint64_t got = 0;
  recv_tracker rt;
  op r = p.b->tag_recv(&got, 8, 17, tag_mask_full, recv_params(rt));
  BOOST_REQUIRE(r.pending());
  BOOST_CHECK(p.b->request_status(r.req) == status::in_progress);
  p.b->release(r.req);
  BOOST_CHECK_EQUAL(drain(p, 16, went + 1).size(), static_cast<size_t>(went + 1));
  BOOST_REQUIRE(p.until([&] { return t.calls > 0; }));
  BOOST_CHECK(t.st == status::ok);
  BOOST_CHECK(p.ab->tag_send(17, &v, 8).done());
  BOOST_REQUIRE(p.until([&] { return rt.calls > 0; }));
  BOOST_CHECK(rt.st == status::ok);
  BOOST_CHECK_EQUAL(got, 5u);
  p.spin(100);
  BOOST_CHECK_EQUAL(t.calls, 1);
  BOOST_CHECK_EQUAL(rt.calls, 1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cancel_send)

BOOST_DATA_TEST_CASE(cancel_queued_sends, each_transport(), tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  const int went = fill_until_no_resource(p, 18);
  std::vector<int> order;
  send_tracker t0, t1, t2, t3;
  t0.id = 0, t1.id = 1, t2.id = 2, t3.id = 3;
  for (send_tracker* t : {&t0, &t1, &t2, &t3}) t->order = &order;
  const uint64_t v[4] = {1000, 1001, 1002, 1003};
  op s0 = p.ab->tag_send(18, &v[0], 8, send_params(t0));
  op s1 = p.ab->tag_send(18, &v[1], 8, send_params(t1));
  op s2 = p.ab->tag_send(18, &v[2], 8, send_params(t2));
  op s3 = p.ab->tag_send(18, &v[3], 8, send_params(t3));
  for (op o : {s0, s1, s2, s3}) BOOST_REQUIRE(o.pending());
  // Reported: CANCELED through the callback (in order, after the sends before it completed).
  BOOST_CHECK(p.a->cancel(s1.req, cancel_mode::report) == status::ok);
  // Forced: no callback at all.
  BOOST_CHECK(p.a->cancel(s2.req, cancel_mode::force) == status::ok);
  const auto values = drain(p, 18, went + 2);
  BOOST_CHECK_EQUAL(values.size(), static_cast<size_t>(went + 2));
  if (values.size() >= 2) {
    BOOST_CHECK_EQUAL(values[values.size() - 2], 1000u);
    BOOST_CHECK_EQUAL(values.back(), 1003u);
  }
  BOOST_CHECK(p.finish(s0) == status::ok);
  BOOST_CHECK(p.finish(s3) == status::ok);
  BOOST_REQUIRE(p.until([&] { return t1.calls > 0; }));
  BOOST_CHECK(t1.st == status::canceled);
  BOOST_CHECK(p.a->request_status(s1.req) == status::canceled);
  p.a->release(s1.req);
  p.spin(200);
  BOOST_CHECK_EQUAL(t0.calls, 1);
  BOOST_CHECK_EQUAL(t1.calls, 1);
  BOOST_CHECK_EQUAL(t2.calls, 0);
  BOOST_CHECK_EQUAL(t3.calls, 1);
  BOOST_CHECK((order == std::vector<int>{0, 1, 3}));
  // Nothing else arrives, and the endpoint keeps working.
  BOOST_CHECK(!p.b->tag_probe(18, tag_mask_full, nullptr));
  BOOST_CHECK(tag_roundtrip(p, 64, 1, true));

  // A send already handed to the transport cannot be canceled.
  const std::vector<uint8_t> big = pattern(100000, 6);
  send_tracker z;
  op zs = p.ab->tag_send(19, big.data(), big.size(), send_params(z, request_force_zcopy));
  if (zs.pending()) {
    BOOST_CHECK(p.a->cancel(zs.req) == status::busy);
    std::vector<uint8_t> in(big.size());
    BOOST_CHECK(p.finish(p.b->tag_recv(in.data(), in.size(), 19, tag_mask_full)) == status::ok);
    BOOST_CHECK(p.finish(zs) == status::ok);
    BOOST_CHECK_EQUAL(z.calls, 1);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(endpoint_close)

BOOST_DATA_TEST_CASE(close_flushes_then_releases, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const std::vector<uint8_t> big = pattern(100000, 7);
  send_tracker z, c;
  std::vector<int> order;
  z.id = 1, c.id = 2;
  z.order = c.order = &order;
  op zs = p.ab->tag_send(20, big.data(), big.size(), send_params(z));
  detail::endpoint_impl* peer = worker_pair::receiving_ep(*p.b, p.ab);
  BOOST_REQUIRE(peer != nullptr);
  const uint32_t peer_id = peer->id;
  error_log peer_errors;
  peer->set_error_handler(record_error, &peer_errors);
  op closing = p.ab->close(send_params(c));
  // A closing endpoint takes no new sends.
  const uint64_t v = 1;
  if (closing.pending()) {
    BOOST_CHECK(p.ab->tag_send(20, &v, 8).st == status::not_connected);
  }
  std::vector<uint8_t> in(big.size());
  BOOST_CHECK(p.finish(p.b->tag_recv(in.data(), in.size(), 20, tag_mask_full)) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 7), -1);
  BOOST_CHECK(p.finish(zs) == status::ok);
  BOOST_CHECK(p.finish(closing) == status::ok);
  if (zs.pending() && closing.pending()) BOOST_CHECK((order == std::vector<int>{1, 2}));
  // The peer learns of the close: its endpoint for ours fails with NOT_CONNECTED and is released.
  BOOST_REQUIRE(p.until([&] { return peer_errors.calls > 0; }));
  BOOST_CHECK(peer_errors.reason == status::not_connected);
  p.spin(10);
  BOOST_CHECK(detail::impl(*p.b).find_ep(peer_id) == nullptr);  // released by b
  p.ab = nullptr;                                              // released by a
  // The other direction still works.
  uint64_t got = 0;
  op r = p.a->tag_recv(&got, 8, 21, tag_mask_full);
  BOOST_CHECK(p.ba->tag_send(21, &v, 8).done());
  BOOST_CHECK(p.finish(r) == status::ok);
  BOOST_CHECK_EQUAL(got, 1u);
  // Reconnecting works.
  endpoint* again = nullptr;
  BOOST_REQUIRE(p.a->connect(p.b->address(), &again) == status::ok);
  BOOST_REQUIRE(p.until([&] { return worker_pair::wired(again); }));
  op r2 = p.b->tag_recv(&got, 8, 22, tag_mask_full);
  const uint64_t w = 2;
  BOOST_CHECK(again->tag_send(22, &w, 8).done());
  BOOST_CHECK(p.finish(r2) == status::ok);
  BOOST_CHECK_EQUAL(got, 2u);
}

BOOST_DATA_TEST_CASE(close_waits_for_the_fetch_it_receives, each_transport(), tl_name) {
  // b matched a's rendezvous message (its fetch is under way, or it asked for the data) and then
  // closes the endpoint the message came on: the close waits for the fetch, so the data arrives
  // whole, a's send completes, and only then does a learn of the close.
  worker_pair p(tl_name);
  // Large enough for rendezvous from heap memory (a lane may send shorter ones by copies).
  const size_t size =
      std::max(detail::impl(*p.ab).rndv_thresh * 4, detail::impl(*p.ab).copies_below);
  const std::vector<uint8_t> data = pattern(size, 9);
  send_tracker z;
  op zs = p.ab->tag_send(23, data.data(), data.size(), send_params(z));
  BOOST_REQUIRE(zs.pending());
  detail::endpoint_impl* peer = worker_pair::receiving_ep(*p.b, p.ab);
  BOOST_REQUIRE(peer != nullptr);
  tag_recv_info info;
  BOOST_REQUIRE(
      worker_pair::until_on(*p.b, [&] { return p.b->tag_probe(23, tag_mask_full, &info); }));
  error_log a_errors;
  p.ab->set_error_handler(record_error, &a_errors);
  std::vector<uint8_t> in(size);
  recv_tracker rt;
  op r = p.b->tag_recv(in.data(), in.size(), 23, tag_mask_full,
                       recv_params(rt, request_no_immediate_completion));
  send_tracker c;
  op closing = peer->close(send_params(c));
  BOOST_CHECK(p.finish(r) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 9), -1);
  BOOST_CHECK(p.finish(zs) == status::ok);
  BOOST_CHECK(p.finish(closing) == status::ok);
  BOOST_REQUIRE(p.until([&] { return a_errors.calls > 0; }));
  BOOST_CHECK(a_errors.reason == status::not_connected);
  BOOST_CHECK(p.a->wait(p.ab->close(), 5000) == status::ok);
  p.ab = nullptr;
}

BOOST_DATA_TEST_CASE(a_bounded_wait_ends_a_close_the_peer_holds_up, each_transport(), tl_name) {
  // b never receives a's rendezvous message, so a's close would wait for it without a bound. A
  // wait with a timeout cancels the close: the endpoint fails, the send ends canceled, the
  // endpoint is released, and b learns of the close.
  worker_pair p(tl_name);
  // Large enough for rendezvous from heap memory (a lane may send shorter ones by copies).
  const size_t size =
      std::max(detail::impl(*p.ab).rndv_thresh * 4, detail::impl(*p.ab).copies_below);
  const std::vector<uint8_t> data = pattern(size, 10);
  send_tracker z, c;
  op zs = p.ab->tag_send(24, data.data(), data.size(), send_params(z));
  BOOST_REQUIRE(zs.pending());
  detail::endpoint_impl* peer = worker_pair::receiving_ep(*p.b, p.ab);
  BOOST_REQUIRE(peer != nullptr);
  const uint32_t peer_id = peer->id;
  error_log peer_errors;
  peer->set_error_handler(record_error, &peer_errors);
  const uint32_t ab_id = detail::impl(*p.ab).id;
  op closing = p.ab->close(send_params(c));
  BOOST_REQUIRE(closing.pending());
  p.spin(2000);  // b reads the announcement and never answers it
  BOOST_CHECK(p.a->request_status(closing.req) == status::in_progress);
  BOOST_CHECK(p.a->wait(closing, 100) == status::timed_out);
  p.ab = nullptr;
  BOOST_CHECK(p.finish(zs) == status::canceled);
  BOOST_CHECK_EQUAL(z.calls, 1);
  p.spin(10);
  BOOST_CHECK_EQUAL(c.calls, 0);  // cancelled by force: released without its callback
  BOOST_CHECK(detail::impl(*p.a).find_ep(ab_id) == nullptr);
  BOOST_REQUIRE(p.until([&] { return peer_errors.calls > 0; }));
  BOOST_CHECK(peer_errors.reason == status::not_connected);
  p.spin(10);
  BOOST_CHECK(detail::impl(*p.b).find_ep(peer_id) == nullptr);
}

BOOST_DATA_TEST_CASE(a_cancelled_close_reports_canceled, each_transport(), tl_name) {
  worker_pair p(tl_name);
  // Large enough for rendezvous from heap memory (a lane may send shorter ones by copies).
  const size_t size =
      std::max(detail::impl(*p.ab).rndv_thresh * 4, detail::impl(*p.ab).copies_below);
  const std::vector<uint8_t> data = pattern(size, 11);
  op zs = p.ab->tag_send(25, data.data(), data.size());
  BOOST_REQUIRE(zs.pending());
  send_tracker c;
  op closing = p.ab->close(send_params(c));
  BOOST_REQUIRE(closing.pending());
  p.spin(100);
  BOOST_CHECK(p.a->cancel(closing.req) == status::ok);
  BOOST_CHECK(p.finish(closing) == status::canceled);
  BOOST_CHECK_EQUAL(c.calls, 1);
  BOOST_CHECK(c.st == status::canceled);
  BOOST_CHECK(p.finish(zs) == status::canceled);
  p.ab = nullptr;
}

BOOST_DATA_TEST_CASE(both_sides_close_at_once, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const std::vector<uint8_t> data = pattern(50000, 8);
  // Traffic in both directions, then both endpoints close while it is in flight.
  op s1 = p.ab->tag_send(30, data.data(), data.size());
  op s2 = p.ba->tag_send(31, data.data(), data.size());
  send_tracker ca, cb;
  op c1 = p.ab->close(send_params(ca));
  op c2 = p.ba->close(send_params(cb));
  std::vector<uint8_t> in1(data.size()), in2(data.size());
  op r1 = p.b->tag_recv(in1.data(), in1.size(), 30, tag_mask_full);
  op r2 = p.a->tag_recv(in2.data(), in2.size(), 31, tag_mask_full);
  for (op o : {r1, r2, s1, s2, c1, c2}) {
    const status st = p.finish(o, 10);
    BOOST_CHECK_MESSAGE(st == status::ok, to_string(st));
  }
  BOOST_CHECK_EQUAL(first_mismatch(in1.data(), in1.size(), 8), -1);
  BOOST_CHECK_EQUAL(first_mismatch(in2.data(), in2.size(), 8), -1);
  p.ab = p.ba = nullptr;
  p.spin(100);
  // Every endpoint is gone on both sides (the peer-created ones with the peer's close).
  for (worker* w : {p.a.get(), p.b.get()}) {
    size_t live = 0;
    for (detail::endpoint_impl* e : detail::impl(*w).ep_table) live += e != nullptr;
    BOOST_CHECK_EQUAL(live, 0u);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(endpoint_failure)

namespace failure_test {
/// Makes a's endpoint `ab` fail with PROTOCOL_ERROR: a malformed fragment header names it.
void fail_with_protocol_error(worker_pair& p) {
  std::vector<uint64_t> words(8, 0);
  wire::header_writer<wire::schema::FragmentMiddle> w;
  w.fields().setDstEp(detail::impl(*p.ab).id);
  w.fields().setMsgId(12345);
  w.fields().setOffset(99);
  std::memcpy(words.data(), w.bytes(), w.size());
  feed(*p.a, proto_id::tag_fragment, reinterpret_cast<uint8_t*>(words.data()), w.size() + 8);
}
}  // namespace failure_test
using namespace failure_test;

BOOST_DATA_TEST_CASE(failure_completes_every_outstanding_send, each_transport(), tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  error_log errors;
  p.ab->set_error_handler(record_error, &errors);
  // A long zcopy that is half issued (its first fragments in flight, the rest queued), a
  // fragmented bcopy and a short send behind it, and flushes.
  const size_t big_size = std::max<size_t>(1u << 20, 16 * p.attr().max_zcopy);
  const std::vector<uint8_t> big = pattern(big_size, 1), mid = pattern(3 * p.bcopy_payload(), 2);
  const uint64_t v = 3;
  std::vector<int> order;
  std::deque<send_tracker> t(6);
  for (int i = 0; i < 6; ++i) {
    t[i].id = i;
    t[i].order = &order;
  }
  std::vector<op> ops;
  ops.push_back(p.ab->tag_send(1, big.data(), big.size(), send_params(t[0], request_force_zcopy)));
  ops.push_back(p.ab->tag_send(1, mid.data(), mid.size(), send_params(t[1], request_force_bcopy)));
  ops.push_back(p.ab->tag_send(1, &v, 8, send_params(t[2])));
  ops.push_back(p.ab->am_send(1, nullptr, 0, &v, 8, send_params(t[3])));
  ops.push_back(p.ab->flush(send_params(t[4])));
  ops.push_back(p.a->flush(send_params(t[5])));
  for (const op& o : ops) BOOST_REQUIRE(o.pending());
  BOOST_REQUIRE(ops[0].req->has_started);  // some fragments went,
  const auto& sent = ops[0].req->as<detail::tag_send_state>().send;
  BOOST_REQUIRE(sent.offset < big.size());  // not all of them

  // The endpoint fails (here: a's endpoint is named by a malformed header).
  fail_with_protocol_error(p);
  BOOST_CHECK_EQUAL(errors.calls, 1);
  BOOST_CHECK(errors.reason == status::protocol_error);
  BOOST_CHECK(p.ab->state() == status::protocol_error);
  // Everything completes, with an error, in order; nothing hangs (b may even consume what was
  // in flight meanwhile).
  BOOST_REQUIRE_MESSAGE(p.until([&] { return order.size() == ops.size(); }, 10),
                        "completed " << order.size() << " of " << ops.size() << "\n"
                                     << p.a->info());
  BOOST_CHECK((order == std::vector<int>{0, 1, 2, 3, 4, 5}));
  for (int i = 0; i < 5; ++i) {
    BOOST_CHECK_MESSAGE(t[i].st == status::protocol_error, i << ": " << to_string(t[i].st));
  }
  BOOST_CHECK(is_error(t[5].st));  // the worker flush reports the endpoint's failure
  for (const op& o : ops) p.a->release(o.req);
  // New operations on the failed endpoint fail at once.
  BOOST_CHECK(p.ab->tag_send(1, &v, 8).st == status::protocol_error);
  BOOST_CHECK(p.ab->flush().st == status::protocol_error);
  // The worker goes on: its other endpoints work.
  uint64_t got = 0;
  op r = p.a->tag_recv(&got, 8, 2, tag_mask_full);
  BOOST_CHECK(p.ba->tag_send(2, &v, 8).done());
  BOOST_CHECK(p.finish(r) == status::ok);
  op wf = p.a->flush();
  BOOST_CHECK(p.finish(wf) == status::ok);
}

BOOST_DATA_TEST_CASE(closing_a_failed_endpoint_finishes_what_it_had_in_flight, each_transport(),
                     tl_name) {
  auto pp = small_fifo_pair(tl_name);
  worker_pair& p = *pp;
  // Zcopy fragments in flight to a peer that never takes them, a send queued behind.
  const size_t big_size = std::max<size_t>(1u << 20, 16 * p.attr().max_zcopy);
  const std::vector<uint8_t> big = pattern(big_size, 1);
  const uint64_t v = 3;
  std::vector<int> order;
  std::deque<send_tracker> t(3);
  for (int i = 0; i < 3; ++i) {
    t[i].id = i;
    t[i].order = &order;
  }
  op z = p.ab->tag_send(1, big.data(), big.size(), send_params(t[0], request_force_zcopy));
  op z2 = p.ab->tag_send(1, big.data(), 5000, send_params(t[1], request_force_zcopy));
  op s = p.ab->tag_send(1, &v, 8, send_params(t[2]));
  BOOST_REQUIRE(z.pending() && z2.pending() && s.pending());
  BOOST_REQUIRE(z.req->has_started);
  fail_with_protocol_error(p);
  // b never progresses. Closing the failed endpoint releases it, and with it the transport's
  // record of the fragments in flight: the sends must complete now, not never.
  op c = p.ab->close();
  BOOST_CHECK(!c.failed());
  BOOST_REQUIRE_MESSAGE(worker_pair::until_on(*p.a, [&] { return order.size() == 3; }, 10),
                        "completed " << order.size() << " of 3 after closing the failed endpoint");
  BOOST_CHECK((order == std::vector<int>{0, 1, 2}));
  for (int i = 0; i < 3; ++i) BOOST_CHECK(is_error(t[i].st));
  for (op o : {z, z2, s}) p.a->release(o.req);
  if (c.pending()) p.a->release(c.req);
  p.ab = nullptr;
  p.spin(100);  // b may now read what was in flight: it is a half message from a closed peer
}

BOOST_AUTO_TEST_SUITE_END()
