// Tag matching in the transport (COMM_TM_THRESH, libcomm/src/tag_offload.hpp): which receives
// the worker hands to its interface's tag matching, and that a mix of software and transport
// matching gives the results software matching alone gives: the earliest posted receive takes a
// message, one sender's messages are received in send order, wildcard receives stay in software,
// unexpected messages (whole, in fragments, rendezvous) reach probes and later receives, cancel,
// truncation, endpoint close and worker destruction with receives still in the transport.
// Runs over every transport whose interface matches tags (cap_tag_*: self, shm, and verbs on the
// verbs test device's model of tag-matching SRQs); the others are named and left out.
#define BOOST_TEST_MODULE tag_offload
#include "fixture.hpp"
#include "tag.hpp"

#include <comm/endpoint.hpp>

#include <algorithm>
#include <random>

using namespace comm;
using namespace comm::test;

namespace tm_test {

/// The threshold the suite runs with: receives and sends from 1 KiB use tag matching.
constexpr size_t tm_bytes = 1024;
constexpr tag_t tag_a = 0x77;

/// A worker pair whose workers use tag matching from `thresh` bytes.
struct tm_pair : worker_pair {
  explicit tm_pair(const std::string& tl, size_t thresh = tm_bytes)
      : worker_pair(tl, [thresh](config& c) { c.tm_thresh = thresh; }) {}

  /// True when the lane matches tags; otherwise says that the transport is left out.
  bool matches_tags() const {
    if (attr().caps & tl::cap_tag_any) return true;
    BOOST_TEST_MESSAGE(ab->transport() << " has no tag matching (no cap_tag_*): left out");
    return false;
  }

  /// The offload of worker `w`.
  static detail::tag_offload& offload(worker& w) {
    return detail::module_of<detail::tag_protocol>(detail::impl(w)).offload;
  }
  /// True when the receive `o` (in progress) sits in the transport's tag matching.
  static bool offloaded(const op& o) {
    return o.req != nullptr && o.req->as<detail::tag_recv_state>().expected.offloaded;
  }
  /// Receives `b` holds in its interface's tag matching, read from the interface's info line.
  size_t posted_in_transport() const {
    const tl::iface* iface = offload(*b).receiving_iface();
    const std::string text = iface->info();
    const size_t at = text.find("tag: ");
    BOOST_REQUIRE(at != std::string::npos);
    return std::stoul(text.substr(at + 5));
  }
};

/// Sends `data` tagged `tag` from a to b and returns the op.
op send(tm_pair& p, tag_t tag, const std::vector<uint8_t>& data, send_tracker* t = nullptr) {
  return p.ab->tag_send(tag, data.data(), data.size(), t ? send_params(*t) : request_params{});
}

}  // namespace tm_test

using namespace tm_test;

BOOST_AUTO_TEST_SUITE(posting)

BOOST_DATA_TEST_CASE(a_large_exact_receive_goes_to_the_transport_and_is_matched_there,
                     each_transport(), tl_name) {
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  BOOST_REQUIRE(tm_pair::offload(*p.b).receiving_iface() != nullptr);
  std::vector<uint8_t> in(4096);
  recv_tracker r;
  op ro = p.b->tag_recv(in.data(), in.size(), tag_a, tag_mask_full, recv_params(r));
  BOOST_REQUIRE(ro.pending());
  BOOST_CHECK(tm_pair::offloaded(ro));
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 1u);
  const auto data = pattern(3000, 1);
  BOOST_CHECK(p.finish(send(p, tag_a, data)) == status::ok);
  BOOST_REQUIRE(p.finish(ro) == status::ok);
  BOOST_CHECK_EQUAL(r.info.length, data.size());
  BOOST_CHECK_EQUAL(r.info.sender_tag, tag_a);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), data.size(), 1), -1);
  BOOST_CHECK_EQUAL(tm_pair::offload(*p.b).matched(), 1u);
  BOOST_CHECK_EQUAL(tm_pair::offload(*p.a).sent(), 1u);
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 0u);
  // The receiver's endpoint counted it, named by the message's sender word.
  BOOST_CHECK_EQUAL(worker_pair::receiving_ep(*p.b, p.ab)->counters_.messages_received, 1u);
}

BOOST_DATA_TEST_CASE(small_wildcard_and_iov_receives_stay_in_software, each_transport(),
                     tl_name) {
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  std::vector<uint8_t> small(tm_bytes - 1), large(4 * tm_bytes);
  op s = p.b->tag_recv(small.data(), small.size(), tag_a, tag_mask_full);
  BOOST_CHECK(s.pending() && !tm_pair::offloaded(s));
  op w = p.b->tag_recv(large.data(), large.size(), 0x100, 0xff00);
  BOOST_CHECK(w.pending() && !tm_pair::offloaded(w));
  // More entries than a posted receive of the transport takes.
  std::vector<std::vector<uint8_t>> pieces(p.attr().tag.recv.max_iov + 1,
                                           std::vector<uint8_t>(tm_bytes));
  std::vector<iov_entry> entries;
  for (auto& piece : pieces) entries.push_back({piece.data(), piece.size()});
  op v = p.b->tag_recv_iov(entries.data(), entries.size(), 0x999, tag_mask_full);
  BOOST_CHECK(v.pending() && !tm_pair::offloaded(v));
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 0u);
  BOOST_CHECK_EQUAL(p.b->cancel_tag_recvs(0, 0), 3u);
  for (op* o : {&s, &w, &v}) BOOST_CHECK(p.finish(*o) == status::canceled);
}

BOOST_DATA_TEST_CASE(offload_off_keeps_every_receive_in_software, each_transport(), tl_name) {
  tm_pair p(tl_name, SIZE_MAX);
  if (!p.matches_tags()) return;
  BOOST_CHECK(tm_pair::offload(*p.b).receiving_iface() == nullptr);
  std::vector<uint8_t> in(1 << 20);
  op ro = p.b->tag_recv(in.data(), in.size(), tag_a, tag_mask_full);
  BOOST_CHECK(!tm_pair::offloaded(ro));
  const auto data = pattern(100000, 2);
  BOOST_CHECK(p.finish(send(p, tag_a, data)) == status::ok);
  BOOST_CHECK(p.finish(ro) == status::ok);
  BOOST_CHECK_EQUAL(tm_pair::offload(*p.a).sent(), 0u);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), data.size(), 2), -1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(ordering)

BOOST_DATA_TEST_CASE(a_software_receive_posted_first_keeps_later_ones_out_of_the_transport,
                     each_transport(), tl_name) {
  // R1 (software: small) then R2 (large) for one tag: R2 must not go to the transport, which
  // would let the first message match it ahead of R1.
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  std::vector<uint8_t> small(100), large(8192);
  recv_tracker r1, r2;
  op o1 = p.b->tag_recv(small.data(), small.size(), tag_a, tag_mask_full, recv_params(r1));
  op o2 = p.b->tag_recv(large.data(), large.size(), tag_a, tag_mask_full, recv_params(r2));
  BOOST_CHECK(!tm_pair::offloaded(o1));
  BOOST_CHECK(!tm_pair::offloaded(o2));
  const auto m1 = pattern(3000, 11), m2 = pattern(5000, 12);
  BOOST_CHECK(p.finish(send(p, tag_a, m1)) == status::ok);
  BOOST_CHECK(p.finish(send(p, tag_a, m2)) == status::ok);
  BOOST_CHECK(p.finish(o1) == status::message_truncated);  // the first message, cut to R1
  BOOST_CHECK_EQUAL(r1.info.length, small.size());
  BOOST_CHECK_EQUAL(first_mismatch(small.data(), small.size(), 11), -1);
  BOOST_CHECK(p.finish(o2) == status::ok);
  BOOST_CHECK_EQUAL(r2.info.length, m2.size());
  BOOST_CHECK_EQUAL(first_mismatch(large.data(), m2.size(), 12), -1);
}

BOOST_DATA_TEST_CASE(a_software_message_takes_an_earlier_offloaded_receive_back,
                     each_transport(), tl_name) {
  // R1 offloaded, then R2 in software, same tag; a small (software) message must go to R1.
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  std::vector<uint8_t> large(8192), small(200);
  recv_tracker r1, r2;
  op o1 = p.b->tag_recv(large.data(), large.size(), tag_a, tag_mask_full, recv_params(r1));
  op o2 = p.b->tag_recv(small.data(), small.size(), tag_a, tag_mask_full, recv_params(r2));
  BOOST_REQUIRE(tm_pair::offloaded(o1));
  BOOST_CHECK(!tm_pair::offloaded(o2));
  const auto m1 = pattern(150, 21), m2 = pattern(160, 22);
  BOOST_CHECK(p.finish(send(p, tag_a, m1)) == status::ok);
  BOOST_CHECK(p.finish(send(p, tag_a, m2)) == status::ok);
  BOOST_CHECK(p.finish(o1) == status::ok);
  BOOST_CHECK(p.finish(o2) == status::ok);
  BOOST_CHECK_EQUAL(r1.info.length, m1.size());
  BOOST_CHECK_EQUAL(first_mismatch(large.data(), m1.size(), 21), -1);
  BOOST_CHECK_EQUAL(r2.info.length, m2.size());
  BOOST_CHECK_EQUAL(first_mismatch(small.data(), m2.size(), 22), -1);
  BOOST_CHECK_EQUAL(tm_pair::offload(*p.b).reclaimed(), 1u);
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 0u);
}

BOOST_DATA_TEST_CASE(a_wildcard_receive_stays_in_software_and_keeps_its_place,
                     each_transport(), tl_name) {
  // W (wildcard, accepts tag_a) then E (exact tag_a, large): E stays in software because W could
  // take its messages; an exact receive of a tag W does not accept may go to the transport.
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  std::vector<uint8_t> wbuf(8192), ebuf(8192), obuf(8192);
  recv_tracker rw, re, ro;
  op w = p.b->tag_recv(wbuf.data(), wbuf.size(), tag_a & 0xf0, 0xf0, recv_params(rw));
  op e = p.b->tag_recv(ebuf.data(), ebuf.size(), tag_a, tag_mask_full, recv_params(re));
  op other = p.b->tag_recv(obuf.data(), obuf.size(), 0x1234500, tag_mask_full, recv_params(ro));
  BOOST_CHECK(!tm_pair::offloaded(w));
  BOOST_CHECK(!tm_pair::offloaded(e));
  BOOST_CHECK(tm_pair::offloaded(other));
  const auto m1 = pattern(4000, 31), m2 = pattern(4001, 32), m3 = pattern(4002, 33);
  BOOST_CHECK(p.finish(send(p, 0x1234500, m3)) == status::ok);
  BOOST_CHECK(p.finish(send(p, tag_a, m1)) == status::ok);
  BOOST_CHECK(p.finish(send(p, tag_a, m2)) == status::ok);
  BOOST_CHECK(p.finish(w) == status::ok);
  BOOST_CHECK(p.finish(e) == status::ok);
  BOOST_CHECK(p.finish(other) == status::ok);
  BOOST_CHECK_EQUAL(rw.info.length, m1.size());
  BOOST_CHECK_EQUAL(re.info.length, m2.size());
  BOOST_CHECK_EQUAL(ro.info.length, m3.size());
  BOOST_CHECK_EQUAL(first_mismatch(wbuf.data(), m1.size(), 31), -1);
  BOOST_CHECK_EQUAL(first_mismatch(ebuf.data(), m2.size(), 32), -1);
  BOOST_CHECK_EQUAL(first_mismatch(obuf.data(), m3.size(), 33), -1);
}

BOOST_DATA_TEST_CASE(a_mix_of_software_and_transport_matching_keeps_send_order,
                     each_transport(), tl_name) {
  // One tag, random sizes on both sides of the threshold (so sends go AM-framed or through tag
  // operations, eager or rendezvous), receives in software (an iov the transport cannot take) or
  // in the transport, posted before or after their messages arrive: receive i gets message i.
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  std::mt19937 rng(7);
  const size_t rndv = detail::impl(*p.ab).rndv_thresh;
  const size_t max_message = rndv * 3;
  const size_t max_iov = p.attr().tag.recv.max_iov;
  constexpr int messages = 300;
  std::vector<std::vector<uint8_t>> buffers(messages);
  std::vector<std::vector<iov_entry>> iovs(messages);
  std::vector<recv_tracker> trackers(messages);
  std::vector<op> recvs(messages), sends(messages);
  std::vector<std::vector<uint8_t>> data(messages);
  int posted = 0, sent = 0, offloaded = 0;
  auto post = [&] {
    const int i = posted++;
    buffers[i].assign(max_message, 0);
    if (rng() % 6 != 0) {
      iovs[i].push_back({buffers[i].data(), buffers[i].size()});
    } else {  // more entries than the transport takes: matched in software
      const size_t piece = max_message / (max_iov + 1);
      for (size_t k = 0; k <= max_iov; ++k) {
        const size_t len = k == max_iov ? max_message - piece * max_iov : piece;
        iovs[i].push_back({buffers[i].data() + k * piece, len});
      }
    }
    trackers[i].id = i;
    recvs[i] = p.b->tag_recv_iov(iovs[i].data(), iovs[i].size(), tag_a, tag_mask_full,
                                 recv_params(trackers[i], request_no_immediate_completion));
    if (tm_pair::offloaded(recvs[i])) ++offloaded;
  };
  auto send_one = [&] {
    const int i = sent++;
    const size_t choice = rng() % 4;
    const size_t size = choice == 0   ? rng() % tm_bytes
                        : choice == 1 ? tm_bytes + rng() % (rndv - tm_bytes)
                        : choice == 2 ? rndv + rng() % (max_message - rndv)
                                      : rng() % max_message;
    data[i] = pattern(size, 1000 + i);
    sends[i] = send(p, tag_a, data[i]);
  };
  while (posted < messages || sent < messages) {
    const unsigned pick = rng() % 3;
    if (pick == 0 && posted < messages) post();
    else if (pick == 1 && sent < messages) send_one();
    else p.spin(1 + rng() % 20);
  }
  for (int i = 0; i < messages; ++i) {
    BOOST_REQUIRE_MESSAGE(p.finish(recvs[i]) == status::ok, "receive " << i);
    BOOST_REQUIRE(p.finish(sends[i]) == status::ok);
    BOOST_CHECK_EQUAL(trackers[i].info.length, data[i].size());
    BOOST_CHECK_MESSAGE(first_mismatch(buffers[i].data(), data[i].size(), 1000 + i) == -1,
                        "receive " << i << " holds another message");
  }
  BOOST_TEST_MESSAGE(tl_name << ": " << offloaded << " of " << messages
                             << " receives went to the transport, which matched "
                             << tm_pair::offload(*p.b).matched());
  BOOST_CHECK_GT(offloaded, 0);
  BOOST_CHECK_GT(tm_pair::offload(*p.b).matched(), 0u);
  BOOST_CHECK_GT(tm_pair::offload(*p.a).sent(), 0u);
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(unexpected)

BOOST_DATA_TEST_CASE(messages_before_their_receives_reach_probes_and_receives_in_order,
                     each_transport(), tl_name) {
  // Through tag operations with no receive posted: a bcopy, a zcopy delivered in fragments, and a
  // rendezvous, all unexpected; probes see them; receives posted afterwards get them in order
  // without going to the transport.
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  const size_t rndv = detail::impl(*p.ab).rndv_thresh;
  const std::vector<size_t> sizes = {2000, std::min(rndv - 1, p.attr().tag.eager.max_zcopy),
                                     rndv * 2};
  // On self and shm the zcopy is longer than a bcopy buffer: the transport hands it over in
  // fragments. Verbs takes zcopy sends only as large as one receive buffer: it arrives whole.
  if (sizes[1] <= p.attr().tag.eager.max_bcopy) {
    BOOST_TEST_MESSAGE(tl_name << ": eager zcopy fits one receive buffer, no fragments");
  }
  std::vector<std::vector<uint8_t>> data;  // zcopy and rendezvous read them until they complete
  std::vector<op> sends;
  for (size_t i = 0; i < sizes.size(); ++i) {
    data.push_back(pattern(sizes[i], 40 + i));
    sends.push_back(send(p, tag_a, data.back()));
  }
  BOOST_REQUIRE(p.until([&] { return tm_pair::offload(*p.b).unexpected() == sizes.size(); }));
  BOOST_CHECK_EQUAL(tm_pair::offload(*p.a).sent(), sizes.size());
  tag_recv_info info;
  BOOST_REQUIRE(p.b->tag_probe(tag_a, tag_mask_full, &info, nullptr));
  BOOST_CHECK_EQUAL(info.length, sizes[0]);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> in(sizes[i]);
    recv_tracker r;
    op ro = p.b->tag_recv(in.data(), in.size(), tag_a, tag_mask_full,
                          recv_params(r, request_no_immediate_completion));
    BOOST_CHECK(!tm_pair::offloaded(ro));
    BOOST_REQUIRE(p.finish(ro) == status::ok);
    BOOST_CHECK_EQUAL(r.info.length, sizes[i]);
    BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 40 + i), -1);
  }
  for (op& o : sends) BOOST_CHECK(p.finish(o) == status::ok);
  BOOST_CHECK(!p.b->tag_probe(tag_a, tag_mask_full, nullptr, nullptr));
}

BOOST_DATA_TEST_CASE(a_probed_message_from_tag_matching_is_received_with_tag_recv_message,
                     each_transport(), tl_name) {
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  const auto data = pattern(5000, 50);
  BOOST_CHECK(p.finish(send(p, 0x55, data)) == status::ok);
  message* msg = nullptr;
  tag_recv_info info;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(0x50, 0xf0, &info, &msg); }));
  BOOST_CHECK_EQUAL(info.length, data.size());
  std::vector<uint8_t> in(data.size());
  BOOST_CHECK(p.finish(p.b->tag_recv_message(msg, in.data(), in.size())) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 50), -1);
}

BOOST_DATA_TEST_CASE(a_cancelled_rendezvous_leaves_the_unexpected_queue, each_transport(),
                     tl_name) {
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  const auto data = pattern(detail::impl(*p.ab).rndv_thresh * 2, 51);
  send_tracker t;
  op so = send(p, tag_a, data, &t);
  BOOST_REQUIRE(so.pending());
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(tag_a, tag_mask_full, nullptr, nullptr); }));
  BOOST_CHECK(p.a->cancel(so.req) == status::ok);
  BOOST_CHECK(p.finish(so) == status::canceled);
  BOOST_CHECK(!p.b->tag_probe(tag_a, tag_mask_full, nullptr, nullptr));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(ending)

BOOST_DATA_TEST_CASE(a_cancelled_offloaded_receive_leaves_the_transport, each_transport(),
                     tl_name) {
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  std::vector<uint8_t> first(4096), second(4096);
  recv_tracker r1;
  op o1 = p.b->tag_recv(first.data(), first.size(), tag_a, tag_mask_full, recv_params(r1));
  op o2 = p.b->tag_recv(second.data(), second.size(), tag_a + 1, tag_mask_full);
  BOOST_REQUIRE(tm_pair::offloaded(o1) && tm_pair::offloaded(o2));
  BOOST_CHECK(p.b->cancel(o1.req) == status::ok);
  BOOST_CHECK(p.finish(o1) == status::canceled);
  BOOST_CHECK_EQUAL(r1.calls, 1);
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 1u);
  // What is sent now is unexpected, not written into the cancelled buffer.
  BOOST_CHECK(p.finish(send(p, tag_a, pattern(3000, 60))) == status::ok);
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(tag_a, tag_mask_full, nullptr, nullptr); }));
  BOOST_CHECK(std::all_of(first.begin(), first.end(), [](uint8_t x) { return x == 0; }));
  BOOST_CHECK_EQUAL(p.b->cancel_tag_recvs(tag_a + 1, tag_mask_full), 1u);
  BOOST_CHECK(p.finish(o2) == status::canceled);
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 0u);
  BOOST_CHECK_EQUAL(tm_pair::offload(*p.b).reclaimed(), 2u);
}

BOOST_DATA_TEST_CASE(a_message_longer_than_an_offloaded_receive_is_truncated, each_transport(),
                     tl_name) {
  // Eager (bcopy and zcopy) and rendezvous, each into a receive the transport matched.
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  const size_t rndv = detail::impl(*p.ab).rndv_thresh;
  for (const size_t size : {size_t{3000}, std::min(rndv - 1, p.attr().tag.eager.max_zcopy),
                            rndv * 4}) {
    std::vector<uint8_t> in(size / 2);
    recv_tracker r;
    op ro = p.b->tag_recv(in.data(), in.size(), tag_a, tag_mask_full, recv_params(r));
    BOOST_REQUIRE(tm_pair::offloaded(ro));
    const auto data = pattern(size, 70);
    BOOST_CHECK(p.finish(send(p, tag_a, data)) == status::ok);
    BOOST_CHECK(p.finish(ro) == status::message_truncated);
    BOOST_CHECK_EQUAL(r.info.length, in.size());
    BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 70), -1);
  }
  BOOST_CHECK_EQUAL(tm_pair::offload(*p.b).matched(), 3u);
}

BOOST_DATA_TEST_CASE(offloaded_receives_outlive_the_sender_s_endpoint, each_transport(),
                     tl_name) {
  // A receive is the worker's, not an endpoint's: closing the sender's endpoint leaves it posted
  // in the transport, and another sender's message still lands in it.
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  std::vector<uint8_t> in(4096);
  op ro = p.b->tag_recv(in.data(), in.size(), tag_a, tag_mask_full);
  BOOST_REQUIRE(tm_pair::offloaded(ro));
  BOOST_CHECK(p.finish(p.ab->close()) == status::ok);
  p.ab = nullptr;
  p.spin(100);
  BOOST_CHECK_EQUAL(p.posted_in_transport(), 1u);
  auto c = worker::create(*p.ctx, worker_params{}).value();
  endpoint* cb = nullptr;
  BOOST_REQUIRE(c->connect(p.b->address(), &cb) == status::ok);
  const auto data = pattern(2048, 80);
  op so = cb->tag_send(tag_a, data.data(), data.size());
  BOOST_REQUIRE(spin_until([&] { c->progress(); p.progress(); },
                           [&] { return p.b->request_status(ro.req) != status::in_progress; }));
  BOOST_CHECK(p.finish(ro) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), data.size(), 80), -1);
  if (so.req != nullptr) {
    BOOST_REQUIRE(spin_until([&] { c->progress(); p.progress(); },
                             [&] { return c->request_status(so.req) != status::in_progress; }));
    c->release(so.req);
  }
}

BOOST_DATA_TEST_CASE(destroying_a_worker_cancels_its_offloaded_receives, each_transport(),
                     tl_name) {
  tm_pair p(tl_name);
  if (!p.matches_tags()) return;
  constexpr int count = 5;
  std::vector<std::vector<uint8_t>> bufs(count, std::vector<uint8_t>(4096));
  std::vector<recv_tracker> r(count);
  for (int i = 0; i < count; ++i) {
    op o = p.b->tag_recv(bufs[i].data(), bufs[i].size(), tag_a + i, tag_mask_full,
                         recv_params(r[i]));
    BOOST_REQUIRE(tm_pair::offloaded(o));
    p.b->release(o.req);  // the worker completes it at destruction
  }
  BOOST_CHECK_EQUAL(p.posted_in_transport(), size_t{count});
  p.b.reset();
  for (int i = 0; i < count; ++i) {
    BOOST_CHECK_EQUAL(r[i].calls, 1);
    BOOST_CHECK(r[i].st == status::canceled);
  }
}

BOOST_AUTO_TEST_SUITE_END()
