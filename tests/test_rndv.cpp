// Rendezvous: large tagged messages and active messages, expected and unexpected, across the
// eager/rendezvous threshold up to 64 MiB, truncation, iov receives, probe, cancel at each stage,
// and the threshold knob. Runs over every transport present.
#define BOOST_TEST_MODULE rndv
#include "fixture.hpp"

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
  const size_t size = rndv_thresh(p) * 4;
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
  const size_t size = rndv_thresh(p) * 2;
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
  const size_t size = rndv_thresh(p) * 2;
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
  const size_t size = rndv_thresh(p) * 2;
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
  const size_t size = rndv_thresh(p) * 2;
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
  const size_t size = rndv_thresh(p) * 4;
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
  const size_t size = rndv_thresh(p) * 2;
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
