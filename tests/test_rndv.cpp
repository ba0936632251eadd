// Rendezvous: large tagged messages and active messages, expected and unexpected, across the
// eager/rendezvous threshold up to 64 MiB, truncation, iov receives, probe, cancel at each stage,
// and the threshold knob. Runs over every transport present.
#define BOOST_TEST_MODULE rndv
#include "fixture.hpp"

#include <comm/memory.hpp>

#include <algorithm>

using namespace comm;
using namespace comm::test;

namespace {

/// The unexpected message matching `tag`, if it is a rendezvous announcement.
bool unexpected_is_rndv(worker& w, tag_t tag) {
  auto& wi = detail::impl(w);
  bool rndv = false;
  wi.matcher.for_each_unexpected([&](detail::tag_unexpected* u) {
    auto* msg = static_cast<detail::unexpected_msg*>(u);
    if (msg->tag == tag) rndv = msg->rndv;
  });
  return rndv;
}

size_t rndv_thresh(worker_pair& p) { return detail::impl(*p.ab).rndv_thresh; }

/// At least `n` bytes, and enough for a message from heap memory to go by rendezvous (a lane that
/// prefers copies sends shorter ones by copies).
size_t rndv_size(worker_pair& p, size_t n) { return std::max(n, detail::impl(*p.ab).copies_below); }

/// Rendezvous sends of `w` still waiting for their peer's answer.
size_t sends_awaiting_peer(worker& w) {
  return detail::module_of<detail::rndv_protocol>(detail::impl(w)).sends().size();
}

/// True when the lane of `ep` fetches rendezvous data with get (else the sender pushes it).
bool fetches_by_get(endpoint* ep) {
  return (detail::impl(*ep).lane_attr->caps & tl::cap_get_zcopy) != 0;
}

/// Feeds `w` the close notice a peer would send for `w`'s endpoint `ep_id`.
void feed_close_notice(worker& w, uint32_t ep_id) {
  std::vector<uint64_t> words(4, 0);
  wire::header_writer<wire::schema::EndpointClose> close;
  close.fields().setDstEp(ep_id);
  std::memcpy(words.data(), close.bytes(), close.size());
  feed(w, proto_id::ep_close, reinterpret_cast<uint8_t*>(words.data()), close.size());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sizes)

BOOST_DATA_TEST_CASE(across_the_threshold_expected_and_unexpected, each_transport(), transport) {
  worker_pair p(transport);
  const size_t t = rndv_thresh(p);
  BOOST_REQUIRE(t > 0 && t < (16u << 20));
  const size_t sizes[] = {0, 1, t - 1, t, t + 1, 3 * t + 7, 1u << 20, (4u << 20) + 3};
  uint32_t seed = 1;
  for (size_t size : sizes) {
    BOOST_TEST_CONTEXT("size " << size) {
      BOOST_CHECK(tag_roundtrip(p, size, seed++, true));
      BOOST_CHECK(tag_roundtrip(p, size, seed++, false));
    }
  }
}

BOOST_DATA_TEST_CASE(sixty_four_mebibytes, each_transport(), transport) {
  worker_pair p(transport);
  BOOST_CHECK(tag_roundtrip(p, 64u << 20, 77, true));
  BOOST_CHECK(tag_roundtrip(p, 64u << 20, 78, false));
}

BOOST_DATA_TEST_CASE(forced_rendezvous_of_a_small_message, each_transport(), transport) {
  worker_pair p(transport);
  request_params sp;
  sp.flags = request_force_rndv;
  BOOST_CHECK(tag_roundtrip(p, 100, 5, true, sp));
  BOOST_CHECK(tag_roundtrip(p, 100, 6, false, sp));
}

BOOST_DATA_TEST_CASE(threshold_follows_the_configuration, each_transport(), transport) {
  worker_pair p(transport, [](config& c) { c.rndv_thresh = 3000; });
  BOOST_CHECK_EQUAL(rndv_thresh(p), 3000u);
  const auto below = pattern(2999, 1), at = pattern(3000, 2);
  BOOST_CHECK(p.ab->tag_send(1, below.data(), below.size()).failed() == false);
  op big = p.ab->tag_send(2, at.data(), at.size());
  BOOST_REQUIRE(!big.failed());
  tag_recv_info info;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(2, tag_mask_full, &info); }));
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(1, tag_mask_full, &info); }));
  BOOST_CHECK(!unexpected_is_rndv(*p.b, 1));
  BOOST_CHECK(unexpected_is_rndv(*p.b, 2));
  std::vector<uint8_t> buf(3000);
  BOOST_CHECK(p.finish(p.b->tag_recv(buf.data(), 2999, 1, tag_mask_full)) == status::ok);
  BOOST_CHECK(p.finish(p.b->tag_recv(buf.data(), 3000, 2, tag_mask_full)) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(buf.data(), 3000, 2), -1);
  BOOST_CHECK(p.finish(big) == status::ok);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(semantics)

BOOST_DATA_TEST_CASE(send_completes_only_after_the_receiver_took_the_data, each_transport(),
                     transport) {
  worker_pair p(transport);
  const size_t size = rndv_size(p, rndv_thresh(p) * 4);
  const auto data = pattern(size, 9);
  send_tracker st;
  op s = p.ab->tag_send(44, data.data(), size, send_params(st));
  BOOST_REQUIRE(s.pending());
  tag_recv_info info;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(44, tag_mask_full, &info); }));
  BOOST_CHECK_EQUAL(info.length, size);
  p.spin(200);
  BOOST_CHECK_EQUAL(st.calls, 0);  // announced, not fetched: the buffer is still in use
  std::vector<uint8_t> buf(size);
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), size, 44, tag_mask_full, recv_params(rt));
  BOOST_CHECK(p.finish(r) == status::ok);
  BOOST_REQUIRE(p.until([&] { return st.calls == 1; }));
  BOOST_CHECK(st.st == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(buf.data(), size, 9), -1);
  p.a->release(s.req);
}

BOOST_DATA_TEST_CASE(truncation_delivers_the_front, each_transport(), transport) {
  worker_pair p(transport);
  const size_t size = rndv_thresh(p) * 3;
  const auto data = pattern(size, 3);
  std::vector<uint8_t> buf(size, 0xEE);
  const size_t room = size / 2 + 5;
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), room, 3, tag_mask_full, recv_params(rt));
  op s = p.ab->tag_send(3, data.data(), size);
  BOOST_REQUIRE(p.until([&] { return rt.calls == 1; }));
  BOOST_CHECK(rt.st == status::message_truncated);
  BOOST_CHECK_EQUAL(rt.info.length, room);
  BOOST_CHECK_EQUAL(first_mismatch(buf.data(), room, 3), -1);
  BOOST_CHECK(buf[room] == 0xEE);
  p.b->release(r.req);
  BOOST_CHECK(p.finish(s) == status::ok);
}

BOOST_DATA_TEST_CASE(misaligned_multi_entry_receive_filled_in_order, each_transport(),
                     transport) {
  worker_pair p(transport);
  const size_t size = rndv_thresh(p) * 2 + 13;
  const auto data = pattern(size, 12);
  std::vector<uint8_t> storage(size + 64, 0xEE);
  const size_t first = 1001, second = 77;
  iov_entry entries[] = {{storage.data() + 3, first},
                         {storage.data() + 3 + first + 5, second},
                         {storage.data() + 3 + first + 5 + second + 9, size - first - second}};
  recv_tracker rt;
  op r = p.b->tag_recv_iov(entries, 3, 8, tag_mask_full, recv_params(rt));
  op s = p.ab->tag_send(8, data.data(), size);
  BOOST_REQUIRE(p.until([&] { return rt.calls == 1; }));
  BOOST_CHECK(rt.st == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(entries[0].buffer, first, 12, 0), -1);
  BOOST_CHECK_EQUAL(first_mismatch(entries[1].buffer, second, 12, first), -1);
  BOOST_CHECK_EQUAL(first_mismatch(entries[2].buffer, size - first - second, 12, first + second),
                    -1);
  BOOST_CHECK(storage[3 + first] == 0xEE && storage[2] == 0xEE);
  p.b->release(r.req);
  BOOST_CHECK(p.finish(s) == status::ok);
}

BOOST_DATA_TEST_CASE(probe_remove_then_receive_message, each_transport(), transport) {
  worker_pair p(transport);
  const size_t size = rndv_thresh(p) + 500;
  const auto data = pattern(size, 21);
  op s = p.ab->tag_send(0x77, data.data(), size);
  message* msg = nullptr;
  tag_recv_info info;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(0x70, 0xf0, &info, &msg); }));
  BOOST_CHECK_EQUAL(info.sender_tag, 0x77u);
  BOOST_CHECK_EQUAL(info.length, size);
  BOOST_CHECK(!p.b->tag_probe(0x70, 0xf0, &info));  // removed from the queue
  std::vector<uint8_t> buf(size);
  BOOST_CHECK(p.finish(p.b->tag_recv_message(msg, buf.data(), size)) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(buf.data(), size, 21), -1);
  BOOST_CHECK(p.finish(s) == status::ok);
}

BOOST_DATA_TEST_CASE(cancel_before_match_reports_and_withdraws, each_transport(), transport) {
  worker_pair p(transport);
  const size_t size = rndv_size(p, rndv_thresh(p) * 2);
  const auto data = pattern(size, 30);
  send_tracker st;
  op s = p.ab->tag_send(5, data.data(), size, send_params(st));
  BOOST_REQUIRE(s.pending());
  tag_recv_info info;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(5, tag_mask_full, &info); }));
  BOOST_CHECK(p.a->cancel(s.req, cancel_mode::report) == status::ok);
  BOOST_REQUIRE(p.until([&] { return st.calls == 1; }));
  BOOST_CHECK(st.st == status::canceled);
  p.a->release(s.req);
  // The receiver drops the announcement once the cancel arrives.
  BOOST_CHECK(p.until([&] { return !p.b->tag_probe(5, tag_mask_full, &info); }));
  // The endpoint keeps working.
  BOOST_CHECK(tag_roundtrip(p, size, 31, true));
}

BOOST_DATA_TEST_CASE(cancel_after_the_receiver_matched, each_transport(), transport) {
  // The receive is posted (and asks for the data, or fetches it) before the sender cancels. Where
  // the lane has get the data may already be taken; otherwise the sender refuses the request for
  // data. Either way both sides end, nothing hangs, and the endpoint keeps working.
  worker_pair p(transport);
  const size_t size = rndv_size(p, rndv_thresh(p) * 2);
  const auto data = pattern(size, 35);
  send_tracker st;
  op s = p.ab->tag_send(7, data.data(), size, send_params(st));
  BOOST_REQUIRE(s.pending());
  tag_recv_info info;
  BOOST_REQUIRE(worker_pair::until_on(*p.b, [&] { return p.b->tag_probe(7, tag_mask_full, &info); }));
  std::vector<uint8_t> buf(size);
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), size, 7, tag_mask_full,
                       recv_params(rt, request_no_immediate_completion));
  BOOST_CHECK(p.a->cancel(s.req, cancel_mode::report) == status::ok);
  BOOST_REQUIRE(p.until([&] { return st.calls == 1 && rt.calls == 1; }));
  BOOST_CHECK(st.st == status::canceled);
  BOOST_CHECK_MESSAGE(rt.st == status::ok || rt.st == status::canceled,
                      "receive ended with " << to_string(rt.st));
  BOOST_TEST_MESSAGE(transport << ": the receive ended with " << to_string(rt.st));
  if (rt.st == status::ok) BOOST_CHECK_EQUAL(first_mismatch(buf.data(), size, 35), -1);
  p.a->release(s.req);
  p.b->release(r.req);
  BOOST_CHECK(tag_roundtrip(p, size, 36, true));
}

BOOST_DATA_TEST_CASE(a_cancelled_send_keeps_its_buffer_until_the_receiver_answers,
                     each_transport(), transport) {
  // The receiver matched (and fetches, or asked for the data) before the cancel reaches it. The
  // cancel is accepted, but the send stays open, its buffer registered, until the receiver says
  // its fetch is over: a fetch under way completes with the data; a receiver that asked for a push
  // is refused.
  worker_pair p(transport);
  const size_t size = rndv_size(p, rndv_thresh(p) * 2);
  const auto data = pattern(size, 37);
  send_tracker st;
  op s = p.ab->tag_send(8, data.data(), size, send_params(st));
  BOOST_REQUIRE(s.pending());
  tag_recv_info info;
  BOOST_REQUIRE(
      worker_pair::until_on(*p.b, [&] { return p.b->tag_probe(8, tag_mask_full, &info); }));
  std::vector<uint8_t> buf(size);
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), size, 8, tag_mask_full,
                       recv_params(rt, request_no_immediate_completion));
  BOOST_REQUIRE(r.pending());
  BOOST_CHECK(p.a->cancel(s.req, cancel_mode::report) == status::ok);
  // Nothing came back from the receiver yet: the send is still open.
  BOOST_CHECK_EQUAL(st.calls, 0);
  BOOST_CHECK(p.a->request_status(s.req) == status::in_progress);
  BOOST_CHECK_EQUAL(sends_awaiting_peer(*p.a), 1u);
  BOOST_CHECK(p.a->cancel(s.req, cancel_mode::report) == status::ok);  // again: no change
  BOOST_REQUIRE(p.until([&] { return st.calls == 1 && rt.calls == 1; }));
  BOOST_CHECK(st.st == status::canceled);
  BOOST_CHECK_EQUAL(sends_awaiting_peer(*p.a), 0u);
  if (fetches_by_get(p.ab)) {
    BOOST_CHECK_MESSAGE(rt.st == status::ok, "receive ended with " << to_string(rt.st));
    BOOST_CHECK_EQUAL(first_mismatch(buf.data(), size, 37), -1);
  } else {
    BOOST_CHECK_MESSAGE(rt.st == status::canceled, "receive ended with " << to_string(rt.st));
  }
  p.a->release(s.req);
  p.b->release(r.req);
  BOOST_CHECK(p.ab->state() == status::ok);
  BOOST_CHECK(tag_roundtrip(p, size, 38, true));
}

BOOST_DATA_TEST_CASE(a_cancelled_send_the_peer_never_answers_ends_with_its_endpoint,
                     each_transport(), transport) {
  // A peer that never answers (b is never progressed) holds the cancelled send open; the send
  // ends, cancelled and released, once its endpoint fails (here the peer's close notice).
  worker_pair p(transport);
  const size_t size = rndv_size(p, rndv_thresh(p) * 2);
  const auto data = pattern(size, 39);
  send_tracker st;
  op s = p.ab->tag_send(9, data.data(), size, send_params(st));
  BOOST_REQUIRE(s.pending());
  BOOST_CHECK(p.a->cancel(s.req, cancel_mode::report) == status::ok);
  for (int i = 0; i < 2000; ++i) p.a->progress();
  BOOST_CHECK_EQUAL(st.calls, 0);
  BOOST_CHECK_EQUAL(sends_awaiting_peer(*p.a), 1u);
  error_log errors;
  p.ab->set_error_handler(record_error, &errors);
  feed_close_notice(*p.a, detail::impl(*p.ab).id);
  BOOST_CHECK_EQUAL(errors.calls, 1);
  BOOST_CHECK_EQUAL(st.calls, 1);
  BOOST_CHECK(st.st == status::canceled);
  BOOST_CHECK_EQUAL(sends_awaiting_peer(*p.a), 0u);
  p.a->release(s.req);
  BOOST_CHECK(p.a->wait(p.ab->close(), 5000) == status::ok);
  p.ab = nullptr;
}

BOOST_DATA_TEST_CASE(a_close_notice_during_a_fetch_ends_the_receive, each_transport(), transport) {
  // A hostile sender announces, lets the receive match, and tells the receiver it closed while
  // the fetch may be in flight. The receiving endpoint goes; the receive ends (nothing writes into
  // its buffer afterwards, nothing is left registered or tied to the endpoint).
  worker_pair p(transport);
  const size_t size = rndv_size(p, rndv_thresh(p) * 4);
  const auto data = pattern(size, 41);
  send_tracker st;
  op s = p.ab->tag_send(10, data.data(), size, send_params(st));
  BOOST_REQUIRE(s.pending());
  tag_recv_info info;
  BOOST_REQUIRE(
      worker_pair::until_on(*p.b, [&] { return p.b->tag_probe(10, tag_mask_full, &info); }));
  detail::endpoint_impl* peer = worker_pair::receiving_ep(*p.b, p.ab);
  BOOST_REQUIRE(peer != nullptr);
  const uint32_t peer_id = peer->id;
  std::vector<uint8_t> buf(size);
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), size, 10, tag_mask_full,
                       recv_params(rt, request_no_immediate_completion));
  BOOST_REQUIRE(r.pending());
  auto& rndv = detail::module_of<detail::rndv_protocol>(detail::impl(*p.b));
  const bool fetching = rndv.busy_on(*peer);  // not where the lane's get is a local copy
  feed_close_notice(*p.b, peer_id);
  BOOST_REQUIRE(worker_pair::until_on(*p.b, [&] { return rt.calls == 1; }));
  BOOST_TEST_MESSAGE(transport << ": the fetch was " << (fetching ? "" : "not ")
                               << "in flight at the notice; the receive ended with "
                               << to_string(rt.st));
  if (rt.st == status::ok) BOOST_CHECK_EQUAL(first_mismatch(buf.data(), size, 41), -1);
  p.b->release(r.req);
  // From here on nothing may write into the buffer: the sender's progress below would complete
  // a fetch left behind.
  std::fill(buf.begin(), buf.end(), uint8_t{0xEE});
  p.b->progress();
  BOOST_CHECK(detail::impl(*p.b).find_ep(peer_id) == nullptr);
  BOOST_CHECK(rndv.receives().empty());
  // The sender never hears from the receive: its send ends when its own endpoint goes.
  p.spin(100);
  BOOST_CHECK_MESSAGE(std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == 0xEE; }),
                      "the buffer of the ended receive was written");
  if (st.calls == 0) BOOST_CHECK(p.a->cancel(s.req, cancel_mode::force) == status::ok);
  else p.a->release(s.req);
  BOOST_CHECK_EQUAL(sends_awaiting_peer(*p.a), 0u);
}

BOOST_DATA_TEST_CASE(forced_cancel_calls_no_callback, each_transport(), transport) {
  worker_pair p(transport);
  const size_t size = rndv_size(p, rndv_thresh(p) * 2);
  const auto data = pattern(size, 32);
  send_tracker st;
  op s = p.ab->tag_send(6, data.data(), size, send_params(st));
  BOOST_REQUIRE(s.pending());
  BOOST_CHECK(p.a->cancel(s.req, cancel_mode::force) == status::ok);
  p.spin(500);
  BOOST_CHECK_EQUAL(st.calls, 0);
  tag_recv_info info;
  BOOST_CHECK(!p.b->tag_probe(6, tag_mask_full, &info));
  BOOST_CHECK(tag_roundtrip(p, size, 33, false));
}

BOOST_DATA_TEST_CASE(cancel_of_a_posted_large_receive, each_transport(), transport) {
  worker_pair p(transport);
  const size_t size = rndv_thresh(p) * 2;
  std::vector<uint8_t> buf(size);
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), size, 9, tag_mask_full, recv_params(rt));
  BOOST_CHECK(p.b->cancel(r.req, cancel_mode::report) == status::ok);
  BOOST_CHECK_EQUAL(rt.calls, 1);
  BOOST_CHECK(rt.st == status::canceled);
  p.b->release(r.req);
  BOOST_CHECK(tag_roundtrip(p, size, 34, true, {}, 9));
}

BOOST_DATA_TEST_CASE(sends_complete_in_order_across_protocols, each_transport(), transport) {
  worker_pair p(transport);
  const size_t big = rndv_thresh(p) * 2;
  const auto data = pattern(big, 40);
  std::vector<int> order;
  send_tracker t[4];
  op ops[4];
  const size_t sizes[] = {big, 16, big, 16};
  for (int i = 0; i < 4; ++i) {
    t[i].id = i;
    t[i].order = &order;
    ops[i] = p.ab->tag_send(100 + i, data.data(), sizes[i],
                            send_params(t[i], request_no_immediate_completion));
  }
  std::vector<uint8_t> buf(big);
  for (int i = 3; i >= 0; --i) {  // receive in reverse: completions still come in send order
    BOOST_CHECK(p.finish(p.b->tag_recv(buf.data(), big, 100 + i, tag_mask_full)) == status::ok);
  }
  BOOST_REQUIRE(p.until([&] { return order.size() == 4; }));
  BOOST_CHECK((order == std::vector<int>{0, 1, 2, 3}));
  for (auto& o : ops) p.a->release(o.req);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(active_messages)

struct am_sink {
  std::vector<uint8_t> header;
  std::vector<uint8_t> data;
  unsigned attr = 0;
  int calls = 0;
  void* kept = nullptr;
  bool keep = false;
};

status on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
             const am_recv_params& params) {
  auto* sink = static_cast<am_sink*>(arg);
  ++sink->calls;
  sink->attr = params.attr;
  sink->header.assign(static_cast<const uint8_t*>(header),
                      static_cast<const uint8_t*>(header) + header_length);
  sink->data.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + length);
  if (sink->keep && (params.attr & am_recv_data_persistent)) {
    sink->kept = data;
    return status::in_progress;
  }
  return status::ok;
}

BOOST_DATA_TEST_CASE(large_am_travels_by_rendezvous, each_transport(), transport) {
  worker_pair p(transport);
  const size_t size = rndv_thresh(p) * 8 + 3;
  const auto data = pattern(size, 50);
  const char header[] = "rendezvous-header";
  am_sink sink;
  sink.keep = true;
  BOOST_REQUIRE(p.b->set_am_handler(12, on_am, &sink, am_flag_whole_msg | am_flag_fetch_rndv) ==
                status::ok);
  send_tracker st;
  op s = p.ab->am_send(12, header, sizeof(header), data.data(), size, send_params(st));
  BOOST_REQUIRE(!s.failed());
  BOOST_REQUIRE(p.until([&] { return sink.calls == 1; }));
  BOOST_CHECK_EQUAL(sink.data.size(), size);
  BOOST_CHECK_EQUAL(first_mismatch(sink.data.data(), size, 50), -1);
  BOOST_CHECK_EQUAL(std::string(reinterpret_cast<char*>(sink.header.data())), header);
  BOOST_CHECK(sink.attr & am_recv_data_persistent);
  BOOST_REQUIRE(sink.kept != nullptr);
  BOOST_CHECK_EQUAL(first_mismatch(sink.kept, size, 50), -1);  // still valid after the call
  p.b->am_data_release(sink.kept);
  BOOST_CHECK(p.finish(s) == status::ok);
}

BOOST_DATA_TEST_CASE(large_am_without_handler_fails_the_send, each_transport(), transport) {
  worker_pair p(transport);
  const size_t size = rndv_thresh(p) * 2;
  const auto data = pattern(size, 51);
  op s = p.ab->am_send(99, nullptr, 0, data.data(), size);
  BOOST_REQUIRE(s.pending());
  BOOST_CHECK(p.finish(s) == status::no_elem);
  BOOST_CHECK(tag_roundtrip(p, 64, 52, true));  // the endpoint still works
}

BOOST_AUTO_TEST_SUITE_END()

// -- large eager copies: heap memory by copies, mapped memory by rendezvous, the eager window -----

BOOST_AUTO_TEST_SUITE(copies)

namespace {

/// Gets of the worker's shm interfaces that took the mapped path ("shm: rma mapped: N gets").
long mapped_gets(worker& w) {
  const std::string info = w.info();
  const size_t at = info.find("shm: rma mapped: ");
  if (at == std::string::npos) return 0;
  return std::strtol(info.c_str() + at + 17, nullptr, 10);
}

/// Bytes of its peers' large eager copies `w` holds (every endpoint's).
size_t window_held(worker& w) {
  size_t held = 0;
  for (const detail::endpoint_impl* ep : detail::impl(w).ep_table) {
    if (ep != nullptr) held += ep->eager_held;
  }
  return held;
}

/// Unexpected messages of `w` that are rendezvous announcements, and all of them.
std::pair<size_t, size_t> unexpected_kinds(worker& w) {
  size_t rndv = 0, all = 0;
  detail::impl(w).matcher.for_each_unexpected([&](detail::tag_unexpected* u) {
    rndv += static_cast<detail::unexpected_msg*>(u)->rndv ? 1 : 0;
    ++all;
  });
  return {rndv, all};
}

/// Receives tag `tag` into a buffer of `size` and checks it against pattern `seed`.
void receive_pattern(worker_pair& p, tag_t tag, size_t size, uint32_t seed) {
  std::vector<uint8_t> buf(size);
  BOOST_CHECK(p.finish(p.b->tag_recv(buf.data(), buf.size(), tag, tag_mask_full)) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(buf.data(), buf.size(), seed), -1);
}

/// True when a tagged send of `n` bytes from heap memory goes by copies on `p`'s lane: the lane
/// prefers copies beyond `n`, and the send is matched in software (below COMM_TM_THRESH: a send
/// through the transport's tag matching keeps the transport's tag operations).
bool heap_copies(worker_pair& p, size_t n) {
  return detail::impl(*p.ab).copies_below > n && n < p.cfg.tm_thresh;
}

/// A block of comm::mem_alloc memory (shareable: shm's peers map it), filled with pattern `seed`.
struct shared_block {
  shared_block(size_t n, uint32_t seed) : size(n), data(static_cast<uint8_t*>(mem_alloc(n))) {
    const auto bytes = pattern(n, seed);
    std::memcpy(data, bytes.data(), n);
  }
  ~shared_block() { mem_free(data); }
  shared_block(const shared_block&) = delete;
  shared_block& operator=(const shared_block&) = delete;
  size_t size;
  uint8_t* data;
};

}  // namespace

// The choice is per buffer: on a lane that prefers copies (shm), heap memory in the rendezvous
// range goes by copies (and in the zcopy range by bcopy, complete at once), memory the peer maps
// (comm::mem_alloc) keeps the rendezvous through the mapping, and messages from the lane's bound
// on go by rendezvous from any memory. Elsewhere every one of them goes by rendezvous.
BOOST_DATA_TEST_CASE(heap_memory_by_copies_mapped_memory_by_rendezvous, each_transport(),
                     transport) {
  worker_pair p(transport);
  const detail::endpoint_impl& ep = detail::impl(*p.ab);
  const size_t mid = rndv_thresh(p) * 4;
  const bool copies = heap_copies(p, mid);
  BOOST_CHECK_EQUAL(ep.copies_below, p.attr().copies_preferred_below);
  const auto heap = pattern(mid, 31);
  shared_block mapped(mid, 32);
  const long mapped_before = mapped_gets(*p.b);
  op h = p.ab->tag_send(1, heap.data(), heap.size());
  op m = p.ab->tag_send(2, mapped.data, mapped.size);
  BOOST_REQUIRE(!h.failed() && !m.failed());
  BOOST_CHECK_EQUAL(h.done(), copies);  // copies complete at once, a rendezvous on its answer
  BOOST_CHECK(m.pending());
  tag_recv_info info;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(1, tag_mask_full, &info) &&
                                     p.b->tag_probe(2, tag_mask_full, &info); }));
  BOOST_CHECK_EQUAL(unexpected_is_rndv(*p.b, 1), !copies);
  BOOST_CHECK(unexpected_is_rndv(*p.b, 2));
  BOOST_CHECK_EQUAL(ep.eager_copies, copies ? 1u : 0u);
  receive_pattern(p, 1, mid, 31);
  receive_pattern(p, 2, mid, 32);
  BOOST_CHECK(p.finish(m) == status::ok);
  if (transport == "shm") BOOST_CHECK_EQUAL(mapped_gets(*p.b), mapped_before + 1);
  if (!copies) return;
  // From the bound on, heap memory goes by rendezvous too.
  const auto large = pattern(ep.copies_below, 33);
  op l = p.ab->tag_send(3, large.data(), large.size());
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(3, tag_mask_full, &info); }));
  BOOST_CHECK(unexpected_is_rndv(*p.b, 3));
  receive_pattern(p, 3, large.size(), 33);
  BOOST_CHECK(p.finish(l) == status::ok);
  // In the zcopy range, heap memory goes bcopy: complete at once.
  const size_t small = (p.cfg.zcopy_thresh + rndv_thresh(p)) / 2;
  if (!heap_copies(p, small)) return;
  const auto bcopy = pattern(small, 34);
  op z = p.ab->tag_send(4, bcopy.data(), bcopy.size());
  BOOST_CHECK(z.done());
  receive_pattern(p, 4, small, 34);
  BOOST_CHECK_EQUAL(ep.eager_copies, 1u);  // only the rendezvous range counts in the window
}

// Configured thresholds are the user's: COMM_RNDV_THRESH or COMM_ZCOPY_THRESH set turns the
// copies off, and heap memory goes by rendezvous from the threshold as before.
BOOST_DATA_TEST_CASE(configured_thresholds_turn_the_copies_off, each_transport(), transport) {
  worker_pair p(transport, [](config& c) { c.rndv_thresh = 32768; });
  BOOST_CHECK_EQUAL(detail::impl(*p.ab).copies_below, 0u);
  worker_pair q(transport, [](config& c) { c.zcopy_thresh = 20000; });
  BOOST_CHECK_EQUAL(detail::impl(*q.ab).copies_below, 0u);
  const auto data = pattern(rndv_thresh(p) * 2, 35);
  op s = p.ab->tag_send(5, data.data(), data.size());
  tag_recv_info info;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(5, tag_mask_full, &info); }));
  BOOST_CHECK(unexpected_is_rndv(*p.b, 5));
  receive_pattern(p, 5, data.size(), 35);
  BOOST_CHECK(p.finish(s) == status::ok);
}

// A sender that floods large heap messages before any receive is posted leaves at most the
// receiver's eager window of copies unexpected there; the rest go by rendezvous (only their
// announcements wait). Receives give the window back, and copies resume.
BOOST_DATA_TEST_CASE(the_eager_window_bounds_what_a_flood_leaves_unexpected, each_transport(),
                     transport) {
  constexpr size_t window = size_t{1} << 20;
  worker_pair p(transport, [](config& c) { c.limits.eager_window_ep_bytes = window; });
  const detail::endpoint_impl& ep = detail::impl(*p.ab);
  const size_t size = rndv_thresh(p) * 4;
  const bool copies = heap_copies(p, size);
  BOOST_CHECK_EQUAL(ep.eager_window, ep.copies_below != 0 ? window : 0u);
  constexpr int count = 24;
  std::vector<std::vector<uint8_t>> data;
  std::vector<op> sends;
  for (int i = 0; i < count; ++i) {
    data.push_back(pattern(size, 40 + i));
    sends.push_back(p.ab->tag_send(100 + i, data.back().data(), size));
    BOOST_REQUIRE(!sends.back().failed());
  }
  BOOST_REQUIRE(p.until([&] { return unexpected_kinds(*p.b).second == count; }));
  p.spin(200);
  const size_t fit = copies ? window / size : 0;
  BOOST_CHECK_EQUAL(ep.eager_copies, fit);
  BOOST_CHECK_EQUAL(ep.eager_window_full, copies ? count - fit : 0u);
  BOOST_CHECK_EQUAL(unexpected_kinds(*p.b).first, count - fit);
  BOOST_CHECK_EQUAL(window_held(*p.b), fit * size);
  // What b holds for them: the copies plus one descriptor per message.
  BOOST_CHECK_LE(detail::impl(*p.b).unexpected_bytes, window + count * size_t{8192});
  for (int i = 0; i < count; ++i) receive_pattern(p, 100 + i, size, 40 + i);
  for (op& s : sends) BOOST_CHECK(p.finish(s) == status::ok);
  BOOST_CHECK_EQUAL(window_held(*p.b), 0u);
  if (!copies) return;
  // b gave the window back (half a window at a time): copies resume.
  BOOST_REQUIRE(p.until([&] { return ep.eager_credit == window; }));
  const auto again = pattern(size, 70);
  op s = p.ab->tag_send(200, again.data(), size);
  BOOST_CHECK(s.done());
  BOOST_CHECK_EQUAL(ep.eager_copies, fit + 1);
  receive_pattern(p, 200, size, 70);
}

// A peer that ignores the window (here: a sender told a larger one than the receiver's) fails its
// endpoint at the receiver with EXCEEDS_LIMIT once it passes it; the receiver never holds more.
BOOST_DATA_TEST_CASE(a_peer_beyond_the_eager_window_fails_its_endpoint, each_transport(),
                     transport) {
  constexpr size_t window = size_t{1} << 20;
  worker_pair p(transport, [](config& c) { c.limits.eager_window_ep_bytes = window; });
  detail::endpoint_impl& ep = detail::impl(*p.ab);
  const size_t size = rndv_thresh(p) * 4;
  if (!heap_copies(p, size)) return;  // no copies in the rendezvous range on this lane
  ep.eager_window = ep.eager_credit = 64 * window;
  std::vector<std::vector<uint8_t>> data;
  std::vector<op> sends;
  for (size_t i = 0; i < 2 * window / size; ++i) {
    data.push_back(pattern(size, 50));
    sends.push_back(p.ab->tag_send(300, data.back().data(), size));
  }
  BOOST_REQUIRE(p.until([&] { return detail::impl(*p.b).limit_errors == 1; }));
  BOOST_CHECK_LE(window_held(*p.b), window);
  BOOST_CHECK_EQUAL(unexpected_kinds(*p.b).second, 0u);  // dropped with the endpoint
  BOOST_CHECK(p.until([&] { return ep.state == detail::endpoint_impl::phase::failed; }));
  for (op& s : sends) (void)p.finish(s);  // each completes, failed or not
  // b's own endpoint to a is another endpoint: it still works.
  BOOST_CHECK(detail::impl(*p.ba).state == detail::endpoint_impl::phase::connected);
}

BOOST_AUTO_TEST_SUITE_END()
