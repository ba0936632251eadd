// Tagged messages over every transport: exact, masked and wildcard matching; order per endpoint;
// expected and unexpected arrival; probe; truncation; cancel; every protocol size class (short,
// bcopy, multi-fragment bcopy, zcopy); iov sends and receives; immediate values; generic pack.
#define BOOST_TEST_MODULE tag
#include "fixture.hpp"

// These suites test the eager protocols: rendezvous is kept out of their way (see test_rndv).
using comm::test::eager_only_suite;
BOOST_TEST_GLOBAL_FIXTURE(eager_only_suite);

#include <algorithm>
#include <array>
#include <deque>
#include <map>

using namespace comm;
using namespace comm::test;
namespace tag_test {}
using namespace tag_test;
namespace bdata = boost::unit_test::data;

BOOST_AUTO_TEST_SUITE(matching)

BOOST_DATA_TEST_CASE(exact_masked_and_wildcard, each_transport(), tl_name) {
  worker_pair p(tl_name);
  uint64_t got[4] = {};
  recv_tracker exact, masked, wildcard, other;
  op r_exact = p.b->tag_recv(&got[0], 8, 0x1234, tag_mask_full, recv_params(exact));
  op r_masked = p.b->tag_recv(&got[1], 8, 0xAB00, 0xFF00, recv_params(masked));
  op r_wild = p.b->tag_recv(&got[2], 8, 0, 0, recv_params(wildcard));
  op r_other = p.b->tag_recv(&got[3], 8, 0x55, tag_mask_full, recv_params(other));
  BOOST_REQUIRE(r_exact.pending() && r_masked.pending() && r_wild.pending() && r_other.pending());

  // Only the wildcard accepts 0x9999. 0xAB77: the masked receive (posted before the wildcard).
  // 0x1234: the exact receive (the wildcard is taken by then). 0x56: nothing left accepts it.
  const uint64_t v1 = 1, v2 = 2, v3 = 3, v4 = 4;
  BOOST_CHECK(p.ab->tag_send(0x9999, &v1, 8).done());
  BOOST_CHECK(p.ab->tag_send(0xAB77, &v2, 8).done());
  BOOST_CHECK(p.ab->tag_send(0x1234, &v3, 8).done());
  BOOST_CHECK(p.ab->tag_send(0x56, &v4, 8).done());  // matches nothing still posted
  BOOST_REQUIRE(p.until([&] { return exact.calls && masked.calls && wildcard.calls; }));
  BOOST_CHECK_EQUAL(wildcard.info.sender_tag, 0x9999u);
  BOOST_CHECK_EQUAL(got[2], 1u);
  BOOST_CHECK_EQUAL(masked.info.sender_tag, 0xAB77u);
  BOOST_CHECK_EQUAL(got[1], 2u);
  BOOST_CHECK_EQUAL(exact.info.sender_tag, 0x1234u);
  BOOST_CHECK_EQUAL(got[0], 3u);
  // 0x56 arrived unexpected: the receive for 0x55 stays posted.
  tag_recv_info info{};
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(0x56, tag_mask_full, &info); }));
  BOOST_CHECK_EQUAL(other.calls, 0);
  BOOST_CHECK(p.b->request_status(r_other.req) == status::in_progress);
  const uint64_t v5 = 5;
  BOOST_CHECK(p.ab->tag_send(0x55, &v5, 8).done());
  BOOST_REQUIRE(p.until([&] { return other.calls > 0; }));
  BOOST_CHECK_EQUAL(got[3], 5u);
  uint64_t last = 0;
  BOOST_CHECK(p.b->tag_recv(&last, 8, 0x56, tag_mask_full).done());
  BOOST_CHECK_EQUAL(last, 4u);
  for (op o : {r_exact, r_masked, r_wild, r_other}) p.b->release(o.req);
}

BOOST_DATA_TEST_CASE(earliest_posted_receive_wins, each_transport(), tl_name) {
  worker_pair p(tl_name);
  // A wildcard posted before an exact receive takes the first message; the exact one the next.
  uint64_t w = 0, e = 0;
  recv_tracker wt, et;
  op rw = p.b->tag_recv(&w, 8, 0x7000, 0xF000, recv_params(wt));
  op re = p.b->tag_recv(&e, 8, 0x7001, tag_mask_full, recv_params(et));
  const uint64_t one = 1, two = 2;
  BOOST_CHECK(p.ab->tag_send(0x7001, &one, 8).done());
  BOOST_CHECK(p.ab->tag_send(0x7001, &two, 8).done());
  BOOST_REQUIRE(p.until([&] { return wt.calls && et.calls; }));
  BOOST_CHECK_EQUAL(w, 1u);
  BOOST_CHECK_EQUAL(e, 2u);
  p.b->release(rw.req);
  p.b->release(re.req);

  // Unexpected messages: a masked receive takes the earliest arrived message it accepts.
  const uint64_t a = 10, b = 11, c = 12;
  BOOST_CHECK(p.ab->tag_send(0x100, &a, 8).done());
  BOOST_CHECK(p.ab->tag_send(0x201, &b, 8).done());
  BOOST_CHECK(p.ab->tag_send(0x202, &c, 8).done());
  BOOST_REQUIRE(p.until([&] { return detail::impl(*p.b).matcher.unexpected_count() == 3; }));
  uint64_t out = 0;
  tag_recv_info info{};
  request_params rp;
  rp.recv_info = &info;
  BOOST_CHECK(p.b->tag_recv(&out, 8, 0x200, 0xF00, rp).done());
  BOOST_CHECK_EQUAL(out, 11u);
  BOOST_CHECK_EQUAL(info.sender_tag, 0x201u);
  BOOST_CHECK(p.b->tag_recv(&out, 8, 0, 0, rp).done());
  BOOST_CHECK_EQUAL(out, 10u);
  BOOST_CHECK(p.b->tag_recv(&out, 8, 0x202, tag_mask_full, rp).done());
  BOOST_CHECK_EQUAL(out, 12u);
}

BOOST_AUTO_TEST_SUITE_END()

// -- ordering ------------------------------------------------------------------------------------

namespace tag_test {

/// Sends 1000 messages of mixed sizes (short, bcopy, two fragments, zcopy) tagged alike from ab and
/// checks b receives them in send order, posting receives before (expected) or after (unexpected).
void check_order(const std::string& tl_name, bool expected) {
  worker_pair p(tl_name);
  constexpr int count = 1000;
  const size_t sizes[] = {8, 300, p.bcopy_payload() + 100, 20000, 0};
  std::vector<std::vector<uint8_t>> out(count), in(count);
  std::vector<int> recv_order;
  std::vector<recv_tracker> rt(count);
  std::vector<send_tracker> st(count);
  std::vector<op> recvs(count), sends(count);
  for (int i = 0; i < count; ++i) {
    const size_t n = std::max<size_t>(sizes[i % 5], 4);
    out[i] = pattern(n, i);
    std::memcpy(out[i].data(), &i, sizeof(i));
    in[i].assign(n, 0);
    rt[i].id = i;
    rt[i].order = &recv_order;
  }
  auto post = [&](int i) {
    request_params rp = recv_params(rt[i]);
    rp.recv_info = &rt[i].info;
    recvs[i] = p.b->tag_recv(in[i].data(), in[i].size(), 42, tag_mask_full, rp);
    if (!recvs[i].pending()) {  // matched an unexpected message: completed in the call
      on_recv(nullptr, recvs[i].st, rt[i].info, &rt[i]);
    }
  };
  if (expected) {
    for (int i = 0; i < count; ++i) post(i);
  }
  std::vector<int> send_order;
  for (int i = 0; i < count; ++i) {
    st[i].id = i;
    st[i].order = &send_order;
    sends[i] = p.ab->tag_send(42, out[i].data(), out[i].size(), send_params(st[i]));
    BOOST_REQUIRE_MESSAGE(!sends[i].failed(), "send " << i << ": " << to_string(sends[i].st));
    if (sends[i].done()) send_order.push_back(i);
    if (!expected && (i % 7) == 0) p.progress();  // some arrive before their receive is posted
  }
  if (!expected) {
    int posted = 0;
    BOOST_REQUIRE(p.until([&] {
      while (posted < count && detail::impl(*p.b).matcher.unexpected_count() > 0) {
        post(posted);
        ++posted;
      }
      return posted == count;
    }));
    BOOST_REQUIRE_MESSAGE(
        p.until([&] { return static_cast<int>(recv_order.size()) == count; }),
        "received " << recv_order.size() << " of " << count << "; " << p.b->info() << p.a->info());
  }
  BOOST_REQUIRE(p.until([&] {
    return static_cast<int>(recv_order.size()) == count &&
           static_cast<int>(send_order.size()) == count;
  }));
  int misplaced = 0;
  for (int i = 0; i < count; ++i) {
    if (recv_order[i] != i) ++misplaced;
    int seq = -1;
    std::memcpy(&seq, in[i].data(), sizeof(seq));
    if (seq != i || rt[i].st != status::ok) ++misplaced;
  }
  BOOST_CHECK_EQUAL(misplaced, 0);
  // Send completions: a send that returned done completed in the call; the callbacks of the
  // others run in send order, each after every earlier send completed.
  int send_misplaced = 0;
  std::vector<int> callbacks;
  for (int i = 0; i < count; ++i) {
    if (sends[i].pending()) callbacks.push_back(i);
    send_misplaced += st[i].calls != (sends[i].pending() ? 1 : 0);
  }
  std::vector<int> callback_order;
  for (int id : send_order) {
    if (sends[id].pending()) callback_order.push_back(id);
  }
  BOOST_CHECK(callback_order == callbacks);
  BOOST_CHECK_EQUAL(send_misplaced, 0);
  for (int i = 0; i < count; ++i) {
    if (sends[i].req) p.a->release(sends[i].req);
    if (recvs[i].req) p.b->release(recvs[i].req);
  }
}

}  // namespace tag_test

BOOST_AUTO_TEST_SUITE(ordering)

BOOST_DATA_TEST_CASE(thousand_expected_messages_in_order, each_transport(), tl_name) {
  check_order(tl_name, true);
}

BOOST_DATA_TEST_CASE(thousand_unexpected_messages_in_order, each_transport(), tl_name) {
  check_order(tl_name, false);
}

BOOST_AUTO_TEST_SUITE_END()

// -- sizes and protocols -------------------------------------------------------------------------

namespace tag_test {

std::vector<size_t> interesting_sizes(const worker_pair& p) {
  const size_t s = p.max_short_payload();
  const size_t b = p.bcopy_payload();
  std::vector<size_t> sizes = {0, 1, 7, 8, 9, 64, 1000};
  for (size_t base : {s, b, 2 * b, p.attr().max_bcopy}) {
    for (long d : {-1L, 0L, 1L}) {
      if (base + d > 0) sizes.push_back(base + d);
    }
  }
  sizes.push_back(16383);
  sizes.push_back(16384);
  sizes.push_back(100000);
  sizes.push_back(1u << 20);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace tag_test

BOOST_AUTO_TEST_SUITE(sizes)

BOOST_DATA_TEST_CASE(every_size_expected_and_unexpected, each_transport(), tl_name) {
  worker_pair p(tl_name);
  uint32_t seed = 1;
  for (size_t n : interesting_sizes(p)) {
    BOOST_TEST_CONTEXT("size " << n) {
      BOOST_CHECK(tag_roundtrip(p, n, seed++, true));
      BOOST_CHECK(tag_roundtrip(p, n, seed++, false));
    }
  }
}

BOOST_DATA_TEST_CASE(forced_bcopy_and_zcopy, each_transport(), tl_name) {
  worker_pair p(tl_name);
  uint32_t seed = 100;
  for (size_t n : interesting_sizes(p)) {
    for (uint32_t flag : {uint32_t{request_force_bcopy}, uint32_t{request_force_zcopy}}) {
      BOOST_TEST_CONTEXT("size " << n << (flag == request_force_zcopy ? " zcopy" : " bcopy")) {
        request_params extra;
        extra.flags = flag;
        BOOST_CHECK(tag_roundtrip(p, n, seed++, true, extra));
        BOOST_CHECK(tag_roundtrip(p, n, seed++, false, extra));
      }
    }
  }
}

BOOST_DATA_TEST_CASE(short_and_bcopy_complete_at_once, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const std::vector<uint8_t> small = pattern(8, 1);
  BOOST_CHECK(p.ab->tag_send(1, small.data(), small.size()).done());
  const std::vector<uint8_t> edge = pattern(p.max_short_payload(), 2);
  BOOST_CHECK(p.ab->tag_send(1, edge.data(), edge.size()).done());
  const std::vector<uint8_t> bcopy = pattern(p.bcopy_payload() * 3, 3);
  request_params force;
  force.flags = request_force_bcopy;
  BOOST_CHECK(p.ab->tag_send(1, bcopy.data(), bcopy.size(), force).done());
  std::vector<uint8_t> in(bcopy.size());
  for (int i = 0; i < 3; ++i) {
    op r = p.b->tag_recv(in.data(), in.size(), 1, tag_mask_full);
    BOOST_CHECK(p.finish(r) == status::ok);
  }
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 3), -1);
}

BOOST_AUTO_TEST_SUITE_END()

// -- zero copy -----------------------------------------------------------------------------------

namespace tag_test {

/// Sends `length` bytes with `flags` (zcopy expected) and checks the send completes only once b
/// holds the data: not while only the sender progresses, and its callback sees the receive done.
/// On a transport whose peer device acknowledges the data (acknowledged_by_device), b's device
/// holding it is enough: the send may complete before b's receive does. On every transport the
/// sender reuses its buffer as soon as the send completes (the callback overwrites it), and b
/// must still receive what was sent.
void check_zcopy_completion(worker_pair& p, size_t length, uint32_t flags, bool expect_request) {
  const bool device_ack = acknowledged_by_device(std::string(p.ab->transport()));
  std::vector<uint8_t> data = pattern(length, 77);
  std::vector<uint8_t> in(length);
  recv_tracker rt;
  op r = p.b->tag_recv(in.data(), in.size(), 9, tag_mask_full, recv_params(rt));
  send_tracker st;
  bool receiver_had_data = false;
  st.check = [&](status) {
    receiver_had_data = rt.calls > 0;
    std::fill(data.begin(), data.end(), 0);  // complete: the buffer is the sender's again
  };
  op s = p.ab->tag_send(9, data.data(), data.size(), send_params(st, flags));
  BOOST_REQUIRE(!s.failed());
  if (!expect_request) {
    BOOST_CHECK(s.done());
  } else {
    BOOST_REQUIRE_MESSAGE(s.pending(), "a zcopy send of " << length << " completed at once");
    if (!device_ack) {
      // Only the sender progresses: the peer does not hold the data, so the send cannot complete.
      for (int i = 0; i < 2000; ++i) p.a->progress();
      BOOST_CHECK(p.a->request_status(s.req) == status::in_progress);
      BOOST_CHECK_EQUAL(st.calls, 0);
    } else if (length <= p.attr().max_zcopy) {
      // One zcopy: b's device takes it, so the sender alone completes the send.
      BOOST_CHECK(worker_pair::until_on(*p.a, [&] { return st.calls > 0; }));
    }
  }
  BOOST_REQUIRE(p.until([&] { return rt.calls > 0 && (!s.pending() || st.calls > 0); }));
  BOOST_CHECK(rt.st == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 77), -1);
  if (s.pending()) {
    BOOST_CHECK_EQUAL(st.calls, 1);
    BOOST_CHECK(st.st == status::ok);
    if (!device_ack) {
      BOOST_CHECK_MESSAGE(receiver_had_data,
                          "zcopy send completed before the receiver had the data");
    }
    BOOST_CHECK(p.a->request_status(s.req) == status::ok);
    p.a->release(s.req);
  }
  p.b->release(r.req);
}

}  // namespace tag_test

BOOST_AUTO_TEST_SUITE(zcopy)

BOOST_DATA_TEST_CASE(forced_zcopy_completes_after_the_peer_has_the_data, each_transport(),
                     tl_name) {
  worker_pair p(tl_name);
  const bool zcopy = p.attr().caps & tl::cap_am_zcopy;
  for (size_t n : {size_t{8}, size_t{4096}, p.attr().max_zcopy, size_t{1} << 20}) {
    BOOST_TEST_CONTEXT("size " << n) { check_zcopy_completion(p, n, request_force_zcopy, zcopy); }
  }
}

BOOST_DATA_TEST_CASE(above_zcopy_threshold, each_transport(), tl_name) {
  worker_pair p(tl_name, [](config& c) { c.zcopy_thresh = 5000; });
  const bool zcopy = p.attr().caps & tl::cap_am_zcopy;
  check_zcopy_completion(p, 4999, 0, false);
  check_zcopy_completion(p, 5000, 0, zcopy);
  check_zcopy_completion(p, 300000, 0, zcopy);
}

BOOST_DATA_TEST_CASE(default_zcopy_threshold, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const bool zcopy = p.attr().caps & tl::cap_am_zcopy;
  check_zcopy_completion(p, p.cfg.zcopy_thresh, 0, zcopy);
}

BOOST_AUTO_TEST_SUITE_END()

// -- probe, truncation, cancel -------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(probe)

BOOST_DATA_TEST_CASE(probe_without_and_with_remove, each_transport(), tl_name) {
  worker_pair p(tl_name);
  tag_recv_info info{};
  BOOST_CHECK(!p.b->tag_probe(0, 0, &info));
  const std::vector<uint8_t> small = pattern(100, 5);
  const std::vector<uint8_t> big = pattern(3 * p.bcopy_payload() + 11, 6);
  request_params imm;
  imm.flags = request_immediate_value;
  imm.imm = 0xFEED;
  BOOST_CHECK(p.ab->tag_send(0x10, small.data(), small.size(), imm).done());
  BOOST_CHECK(p.finish(p.ab->tag_send(0x20, big.data(), big.size())) == status::ok);
  BOOST_REQUIRE(p.until([&] { return detail::impl(*p.b).matcher.unexpected_count() == 2; }));

  // Without remove: the message stays and is found again.
  BOOST_CHECK(p.b->tag_probe(0x10, tag_mask_full, &info));
  BOOST_CHECK_EQUAL(info.length, small.size());
  BOOST_CHECK_EQUAL(info.sender_tag, 0x10u);
  BOOST_CHECK_EQUAL(info.imm, 0xFEEDu);
  BOOST_CHECK(p.b->tag_probe(0, 0, &info));
  BOOST_CHECK_EQUAL(info.sender_tag, 0x10u);  // the earliest arrived
  BOOST_CHECK_EQUAL(detail::impl(*p.b).matcher.unexpected_count(), 2u);

  // With remove: taken off the queue, received with tag_recv_message.
  message* msg = nullptr;
  BOOST_REQUIRE(p.b->tag_probe(0x20, tag_mask_full, &info, &msg));
  BOOST_REQUIRE(msg != nullptr);
  BOOST_CHECK_EQUAL(info.length, big.size());
  BOOST_CHECK(!p.b->tag_probe(0x20, tag_mask_full, &info));
  std::vector<uint8_t> in(big.size());
  tag_recv_info got{};
  request_params rp;
  rp.recv_info = &got;
  BOOST_CHECK(p.b->tag_recv_message(msg, in.data(), in.size(), rp).done());
  BOOST_CHECK_EQUAL(got.length, big.size());
  BOOST_CHECK_EQUAL(got.sender_tag, 0x20u);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 6), -1);

  // tag_recv_message with a request and a callback, and into a short buffer.
  BOOST_REQUIRE(p.b->tag_probe(0x10, tag_mask_full, &info, &msg));
  std::vector<uint8_t> part(40);
  recv_tracker rt;
  op r = p.b->tag_recv_message(msg, part.data(), part.size(),
                               recv_params(rt, request_no_immediate_completion));
  BOOST_REQUIRE(r.pending());
  BOOST_CHECK_EQUAL(rt.calls, 1);
  BOOST_CHECK(rt.st == status::message_truncated);
  BOOST_CHECK_EQUAL(rt.info.length, part.size());
  BOOST_CHECK_EQUAL(rt.info.imm, 0xFEEDu);
  BOOST_CHECK(p.b->request_status(r.req) == status::message_truncated);
  p.b->release(r.req);
  BOOST_CHECK_EQUAL(first_mismatch(part.data(), part.size(), 5), -1);
  BOOST_CHECK_EQUAL(detail::impl(*p.b).matcher.unexpected_count(), 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(truncation)

BOOST_DATA_TEST_CASE(short_buffer_gets_the_first_bytes, each_transport(), tl_name) {
  worker_pair p(tl_name);
  for (size_t n : {size_t{64}, p.max_short_payload(), 3 * p.bcopy_payload() + 5, size_t{1} << 20}) {
    for (bool expected : {true, false}) {
      BOOST_TEST_CONTEXT("size " << n << (expected ? " expected" : " unexpected")) {
        const size_t room = n / 2 + 3;
        const std::vector<uint8_t> data = pattern(n, static_cast<uint32_t>(n));
        std::vector<uint8_t> in(room + 64, 0xEE);
        recv_tracker rt;
        op r{};
        if (expected) r = p.b->tag_recv(in.data(), room, 3, tag_mask_full, recv_params(rt));
        op s = p.ab->tag_send(3, data.data(), data.size());
        if (!expected) {
          BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(3, tag_mask_full, nullptr); }));
          tag_recv_info info{};
          request_params rp;
          rp.recv_info = &info;
          r = p.b->tag_recv(in.data(), room, 3, tag_mask_full, rp);
          BOOST_CHECK(!r.pending());
          BOOST_CHECK(r.st == status::message_truncated);
          BOOST_CHECK_EQUAL(info.length, room);
        } else {
          BOOST_REQUIRE(p.until([&] { return rt.calls > 0; }));
          BOOST_CHECK(rt.st == status::message_truncated);
          BOOST_CHECK_EQUAL(rt.info.length, room);
          BOOST_CHECK(p.b->request_status(r.req) == status::message_truncated);
          p.b->release(r.req);
        }
        BOOST_CHECK(p.finish(s) == status::ok);
        BOOST_CHECK_EQUAL(first_mismatch(in.data(), room, static_cast<uint32_t>(n)), -1);
        BOOST_CHECK(std::all_of(in.begin() + room, in.end(), [](uint8_t c) { return c == 0xEE; }));
      }
    }
  }
  // The worker keeps matching afterwards.
  BOOST_CHECK(tag_roundtrip(p, 100, 1, true));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cancel)

BOOST_DATA_TEST_CASE(cancel_posted_receive, each_transport(), tl_name) {
  worker_pair p(tl_name);
  uint64_t buf = 0;
  // Reported: CANCELED through the callback, status readable until release.
  recv_tracker reported;
  op r1 = p.b->tag_recv(&buf, 8, 0xC1, tag_mask_full, recv_params(reported));
  BOOST_REQUIRE(r1.pending());
  BOOST_CHECK(p.b->cancel(r1.req, cancel_mode::report) == status::ok);
  BOOST_CHECK_EQUAL(reported.calls, 1);
  BOOST_CHECK(reported.st == status::canceled);
  BOOST_CHECK(p.b->request_status(r1.req) == status::canceled);
  BOOST_CHECK(p.b->cancel(r1.req, cancel_mode::report) != status::ok);  // already over
  p.b->release(r1.req);

  // Forced: no callback, the request is gone at once.
  recv_tracker forced;
  op r2 = p.b->tag_recv(&buf, 8, 0xC2, tag_mask_full, recv_params(forced));
  BOOST_REQUIRE(r2.pending());
  BOOST_CHECK(p.b->cancel(r2.req, cancel_mode::force) == status::ok);
  BOOST_CHECK_EQUAL(forced.calls, 0);

  // Neither receive matches later messages: they arrive unexpected.
  const uint64_t one = 1, two = 2;
  BOOST_CHECK(p.ab->tag_send(0xC1, &one, 8).done());
  BOOST_CHECK(p.ab->tag_send(0xC2, &two, 8).done());
  BOOST_REQUIRE(p.until([&] { return detail::impl(*p.b).matcher.unexpected_count() == 2; }));
  BOOST_CHECK_EQUAL(reported.calls, 1);
  BOOST_CHECK_EQUAL(forced.calls, 0);
  BOOST_CHECK_EQUAL(detail::impl(*p.b).matcher.expected_count(), 0u);
  BOOST_CHECK(p.b->tag_recv(&buf, 8, 0xC2, tag_mask_full).done());
  BOOST_CHECK_EQUAL(buf, 2u);
  BOOST_CHECK(p.b->tag_recv(&buf, 8, 0xC1, tag_mask_full).done());
  BOOST_CHECK_EQUAL(buf, 1u);

  // A receive that already completed cannot be canceled.
  recv_tracker done;
  op r3 = p.b->tag_recv(&buf, 8, 0xC3, tag_mask_full, recv_params(done));
  const uint64_t three = 3;
  BOOST_CHECK(p.ab->tag_send(0xC3, &three, 8).done());
  BOOST_REQUIRE(p.until([&] { return done.calls > 0; }));
  BOOST_CHECK(p.b->cancel(r3.req) != status::ok);
  BOOST_CHECK_EQUAL(done.calls, 1);
  BOOST_CHECK(done.st == status::ok);
  p.b->release(r3.req);
}

BOOST_DATA_TEST_CASE(cancel_receive_matched_mid_message, each_transport(), tl_name) {
  worker_pair p(tl_name);
  // A receive matched by the first fragment of a long message is past cancelling.
  const std::vector<uint8_t> data = pattern(1u << 20, 8);
  std::vector<uint8_t> in(data.size());
  recv_tracker rt;
  op r = p.b->tag_recv(in.data(), in.size(), 0xC4, tag_mask_full, recv_params(rt));
  request_params bc;
  bc.flags = request_force_bcopy;
  op s = p.ab->tag_send(0xC4, data.data(), data.size(), bc);
  auto matched = [&] { return r.req->as<detail::tag_recv_state>().matched; };
  BOOST_REQUIRE(p.until([&] { return matched() || rt.calls > 0; }));
  if (rt.calls == 0) {
    BOOST_CHECK(p.b->cancel(r.req) == status::busy);
  }
  BOOST_REQUIRE(p.until([&] { return rt.calls > 0; }));
  BOOST_CHECK(rt.st == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 8), -1);
  p.b->release(r.req);
  BOOST_CHECK(p.finish(s) == status::ok);
}

BOOST_AUTO_TEST_SUITE_END()

// -- unexpected fragmented messages -------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(fragments)

BOOST_DATA_TEST_CASE(receive_posted_while_an_unexpected_message_arrives, each_transport(),
                     tl_name) {
  worker_pair p(tl_name);
  // The first fragments arrive before the receive is posted, the last ones after: the message
  // must still go to that receive, and the next one with the same tag to the next receive.
  const size_t n = 600 * p.bcopy_payload();
  const std::vector<uint8_t> first = pattern(n, 21), second = pattern(64, 22);
  request_params bc;
  bc.flags = request_force_bcopy;
  op s1 = p.ab->tag_send(0xF0, first.data(), first.size(), bc);
  op s2 = p.ab->tag_send(0xF0, second.data(), second.size(), bc);
  BOOST_REQUIRE(!s1.failed() && !s2.failed());
  detail::endpoint_impl* rx_ep = worker_pair::receiving_ep(*p.b, p.ab);
  BOOST_REQUIRE(rx_ep != nullptr);
  // Progress the receiver alone until part of the first message is in.
  BOOST_REQUIRE(worker_pair::until_on(*p.b, [&] { return rx_ep->rx.owner != nullptr; }));
  std::vector<uint8_t> in1(n), in2(64);
  recv_tracker r1t, r2t;
  op r1 = p.b->tag_recv(in1.data(), in1.size(), 0xF0, tag_mask_full, recv_params(r1t));
  op r2{};
  if (r1.pending()) {
    r2 = p.b->tag_recv(in2.data(), in2.size(), 0xF0, tag_mask_full, recv_params(r2t));
  }
  BOOST_REQUIRE(p.until([&] { return r1t.calls > 0 && r2t.calls > 0; }, 10));
  BOOST_CHECK(r1t.st == status::ok);
  BOOST_CHECK_EQUAL(r1t.info.length, n);
  BOOST_CHECK_EQUAL(first_mismatch(in1.data(), n, 21), -1);
  BOOST_CHECK(r2t.st == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in2.data(), 64, 22), -1);
  p.b->release(r1.req);
  p.b->release(r2.req);
  BOOST_CHECK(p.finish(s1) == status::ok);
  BOOST_CHECK(p.finish(s2) == status::ok);
}

BOOST_AUTO_TEST_SUITE_END()

// -- iov ------------------------------------------------------------------------------------------

namespace tag_test {

/// Splits `total` bytes into pieces of the given lengths (the last piece takes the rest).
std::vector<size_t> split(size_t total, std::vector<size_t> lengths) {
  size_t used = 0;
  for (size_t& l : lengths) {
    l = std::min(l, total - used);
    used += l;
  }
  lengths.back() += total - used;
  return lengths;
}

void check_iov(worker_pair& p, size_t total, const std::vector<size_t>& send_split,
               const std::vector<size_t>& recv_split, uint32_t flags, bool expected) {
  const std::vector<uint8_t> data = pattern(total, static_cast<uint32_t>(total + flags));
  // Misaligned copies of the pieces: each starts at an odd offset of its own allocation.
  std::vector<std::vector<uint8_t>> send_store, recv_store;
  std::vector<iov_entry> send_iov, recv_iov;
  const auto sends = split(total, send_split);
  const auto recvs = split(total, recv_split);
  size_t offset = 0;
  for (size_t i = 0; i < sends.size(); ++i) {
    send_store.emplace_back(sends[i] + 8);
    const size_t skew = 1 + i % 7;
    if (sends[i] != 0) {
      std::memcpy(send_store.back().data() + skew, data.data() + offset, sends[i]);
    }
    send_iov.push_back({send_store.back().data() + skew, sends[i]});
    offset += sends[i];
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    recv_store.emplace_back(recvs[i] + 8, 0);
    const size_t skew = 3 + i % 5;
    recv_iov.push_back({recv_store.back().data() + skew, recvs[i]});
  }
  recv_tracker rt;
  op r{};
  if (expected) {
    r = p.b->tag_recv_iov(recv_iov.data(), recv_iov.size(), 0x10F, tag_mask_full,
                          recv_params(rt));
  }
  request_params sp;
  sp.flags = flags;
  op s = p.ab->tag_send_iov(0x10F, send_iov.data(), send_iov.size(), sp);
  BOOST_REQUIRE_MESSAGE(!s.failed(), "tag_send_iov: " << to_string(s.st));
  if (!expected) {
    BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(0x10F, tag_mask_full, nullptr); }));
    r = p.b->tag_recv_iov(recv_iov.data(), recv_iov.size(), 0x10F, tag_mask_full,
                          recv_params(rt, request_no_immediate_completion));
  }
  BOOST_REQUIRE(p.until([&] { return rt.calls > 0; }));
  BOOST_CHECK(rt.st == status::ok);
  BOOST_CHECK_EQUAL(rt.info.length, total);
  p.b->release(r.req);
  BOOST_CHECK(p.finish(s) == status::ok);
  offset = 0;
  for (const iov_entry& e : recv_iov) {
    BOOST_CHECK_EQUAL(first_mismatch(e.buffer, e.length, static_cast<uint32_t>(total + flags),
                                     offset),
                      -1);
    offset += e.length;
  }
}

}  // namespace tag_test

BOOST_AUTO_TEST_SUITE(iov)

BOOST_DATA_TEST_CASE(multi_entry_misaligned, each_transport(), tl_name) {
  worker_pair p(tl_name);
  const size_t b = p.bcopy_payload();
  struct shape {
    size_t total;
    std::vector<size_t> send, recv;
  };
  const std::vector<shape> shapes = {
      {0, {0, 0}, {0}},
      {19, {5, 1, 13}, {4, 4, 4, 7}},
      {1000, {1, 998, 1}, {333, 333, 334}},
      {3 * b + 77, {b - 3, b + 9, 5, 100}, {7, 2 * b, 11}},
      {300000, {1, 65536, 3, 100000}, {150000, 1, 150000}},
      // More entries than a zcopy takes at once.
      {4000, std::vector<size_t>(20, 200), std::vector<size_t>(25, 160)},
      {40000, std::vector<size_t>(20, 2000), {40000}},
  };
  for (const shape& s : shapes) {
    for (uint32_t flags : {0u, uint32_t{request_force_bcopy}, uint32_t{request_force_zcopy}}) {
      for (bool expected : {true, false}) {
        BOOST_TEST_CONTEXT("total " << s.total << " entries " << s.send.size() << " flags "
                                    << flags << (expected ? " expected" : " unexpected")) {
          check_iov(p, s.total, s.send, s.recv, flags, expected);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// -- immediate value and generic pack ------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(immediate_value)

BOOST_DATA_TEST_CASE(imm_reaches_tag_recv_info, each_transport(), tl_name) {
  worker_pair p(tl_name);
  uint64_t imm = 0x1000;
  for (size_t n : {size_t{0}, size_t{8}, 3 * p.bcopy_payload(), size_t{100000}}) {
    for (uint32_t extra : {0u, uint32_t{request_force_bcopy}, uint32_t{request_force_zcopy}}) {
      for (bool expected : {true, false}) {
        BOOST_TEST_CONTEXT("size " << n << " flags " << extra << (expected ? " expected" : "")) {
          ++imm;
          const std::vector<uint8_t> data = pattern(n, static_cast<uint32_t>(imm));
          std::vector<uint8_t> in(n);
          recv_tracker rt;
          op r{};
          if (expected) r = p.b->tag_recv(in.data(), n, 0x1AA, tag_mask_full, recv_params(rt));
          request_params sp;
          sp.flags = request_immediate_value | extra;
          sp.imm = imm;
          op s = p.ab->tag_send(0x1AA, data.data(), n, sp);
          BOOST_REQUIRE(!s.failed());
          if (!expected) {
            tag_recv_info info{};
            BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(0x1AA, tag_mask_full, &info); }));
            BOOST_CHECK_EQUAL(info.imm, imm);
            r = p.b->tag_recv(in.data(), n, 0x1AA, tag_mask_full,
                              recv_params(rt, request_no_immediate_completion));
          }
          BOOST_REQUIRE(p.until([&] { return rt.calls > 0; }));
          BOOST_CHECK_EQUAL(rt.info.imm, imm);
          BOOST_CHECK(rt.st == status::ok);
          BOOST_CHECK_EQUAL(first_mismatch(in.data(), n, static_cast<uint32_t>(imm)), -1);
          p.b->release(r.req);
          BOOST_CHECK(p.finish(s) == status::ok);
        }
      }
    }
  }
  // Without the flag the receiver sees 0.
  uint64_t v = 5, out = 0;
  request_params sp;
  sp.imm = 77;  // ignored without request_immediate_value
  BOOST_CHECK(p.ab->tag_send(0x1AB, &v, 8, sp).done());
  tag_recv_info info{};
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(0x1AB, tag_mask_full, &info); }));
  BOOST_CHECK_EQUAL(info.imm, 0u);
  BOOST_CHECK(p.b->tag_recv(&out, 8, 0x1AB, tag_mask_full).done());
}

BOOST_AUTO_TEST_SUITE_END()

namespace tag_test {

struct generator {
  uint32_t seed;
  size_t max_per_call;  ///< pack writes at most this much per call (exercises partial packs)
  int calls = 0;
};

size_t pack_pattern(void* dest, size_t offset, size_t max, void* arg) {
  auto* g = static_cast<generator*>(arg);
  ++g->calls;
  const size_t n = std::min(max, g->max_per_call);
  auto* out = static_cast<uint8_t*>(dest);
  for (size_t i = 0; i < n; ++i) out[i] = pattern_byte(offset + i, g->seed);
  return n;
}

}  // namespace tag_test

BOOST_AUTO_TEST_SUITE(generic_pack)

BOOST_DATA_TEST_CASE(pack_callback_fills_the_message, each_transport(), tl_name) {
  worker_pair p(tl_name);
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, 2 * p.bcopy_payload() + 3, size_t{200000}}) {
    for (size_t per_call : {size_t{1} << 30, size_t{97}}) {
      BOOST_TEST_CONTEXT("size " << n << " per call " << per_call) {
        generator g{static_cast<uint32_t>(n + per_call), per_call};
        std::vector<uint8_t> in(n);
        recv_tracker rt;
        op r = p.b->tag_recv(in.data(), n, 0x9AC, tag_mask_full, recv_params(rt));
        request_params sp;
        sp.pack = pack_pattern;
        sp.pack_arg = &g;
        op s = p.ab->tag_send(0x9AC, nullptr, n, sp);
        BOOST_REQUIRE(!s.failed());
        BOOST_REQUIRE(p.until([&] { return rt.calls > 0; }));
        BOOST_CHECK(rt.st == status::ok);
        BOOST_CHECK_EQUAL(rt.info.length, n);
        BOOST_CHECK_EQUAL(first_mismatch(in.data(), n, g.seed), -1);
        if (n > 0) BOOST_CHECK_GT(g.calls, 0);
        p.b->release(r.req);
        BOOST_CHECK(p.finish(s) == status::ok);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// -- several senders -----------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(senders)

BOOST_DATA_TEST_CASE(fragments_of_two_senders_interleave, each_transport(), tl_name) {
  // a and a third worker c both stream fragmented messages with the same tag into b; their
  // fragments interleave in b's receive queue, the messages must not.
  worker_pair p(tl_name);
  auto c = worker::create(*p.ctx).value();
  endpoint* cb = nullptr;
  BOOST_REQUIRE(c->connect(p.b->address(), &cb) == status::ok);
  auto all = [&] {
    p.progress();
    c->progress();
  };
  BOOST_REQUIRE(spin_until(all, [&] { return worker_pair::wired(cb); }));
  constexpr int per_sender = 20;
  const size_t n = 5 * p.bcopy_payload() + 3;
  std::vector<std::vector<uint8_t>> out;
  std::vector<op> sends;
  request_params bc;
  bc.flags = request_force_bcopy;
  for (int i = 0; i < per_sender; ++i) {
    for (int s = 0; s < 2; ++s) {
      out.push_back(pattern(n, 1000 * s + i));
      std::memcpy(out.back().data(), &s, sizeof(s));
      std::memcpy(out.back().data() + sizeof(s), &i, sizeof(i));
      endpoint* ep = s == 0 ? p.ab : cb;
      sends.push_back(ep->tag_send(0xBB, out.back().data(), n, bc));
      BOOST_REQUIRE(!sends.back().failed());
    }
  }
  int next[2] = {0, 0};
  int received = 0;
  std::vector<uint8_t> in(n);
  BOOST_REQUIRE(spin_until(all, [&] {
    while (received < 2 * per_sender) {
      tag_recv_info info{};
      request_params rp;
      rp.recv_info = &info;
      op r = p.b->tag_recv(in.data(), in.size(), 0xBB, tag_mask_full, rp);
      if (r.pending()) {
        (void)p.b->cancel(r.req, cancel_mode::force);
        return false;
      }
      int s = -1, i = -1;
      std::memcpy(&s, in.data(), sizeof(s));
      std::memcpy(&i, in.data() + sizeof(s), sizeof(i));
      BOOST_REQUIRE(s == 0 || s == 1);
      BOOST_CHECK_EQUAL(i, next[s]);  // in order per sender
      ++next[s];
      BOOST_CHECK_EQUAL(first_mismatch(in.data() + 8, n - 8, 1000 * s + i, 8), -1);
      ++received;
    }
    return true;
  }));
  for (op o : sends) {
    if (o.pending()) {
      worker& owner = o.req->owner == &detail::impl(*c) ? *c : *p.a;
      BOOST_CHECK(spin_until(all, [&] { return owner.request_status(o.req) != status::in_progress; }));
      BOOST_CHECK(owner.request_status(o.req) == status::ok);
      owner.release(o.req);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
