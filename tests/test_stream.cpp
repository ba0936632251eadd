// Streams over every transport (the verbs test device included, a software stand-in): the bytes
// of stream sends arrive in order on the peer's paired endpoint whatever the send and receive
// sizes (fragmented sends included), at-least and wait-all receives, worker::stream_poll, zero-copy
// receive of buffered blocks, cancel, receives pending at close and at failure, and a peer that
// passes the stream buffer limit or sends forged stream frames.
#define BOOST_TEST_MODULE stream
#include "fixture.hpp"

#include <algorithm>
#include <random>

using namespace comm;
using namespace comm::test;

namespace stream_test {

/// What a stream receive callback was told.
struct stream_tracker {
  int calls = 0;
  status st = status::in_progress;
  size_t length = 0;
};

void on_stream_recv(request*, status st, size_t length, void* user) {
  auto* t = static_cast<stream_tracker*>(user);
  ++t->calls;
  t->st = st;
  t->length = length;
}

/// Parameters with the stream receive callback reporting to `t`.
request_params stream_params(stream_tracker& t, uint32_t flags = 0) {
  request_params p;
  p.flags = flags;
  p.stream_recv_cb = on_stream_recv;
  p.user_data = &t;
  return p;
}

/// The endpoint of b that receives what `ab` sends (found by stream_poll in real code).
endpoint* receiver(worker_pair& p) { return worker_pair::receiving_ep(*p.b, p.ab); }

/// Stream bytes b buffers on every endpoint.
size_t buffered_total(worker& w) {
  size_t n = 0;
  stream_poll_entry entries[16];
  const size_t count = w.stream_poll(entries, 16);
  for (size_t i = 0; i < count; ++i) n += entries[i].length;
  return n;
}

/// Sends the stream bytes [offset, offset + length) of pattern `seed` from `ep`; keeps the send
/// (which may still need the buffer) in `pending`.
void send_piece(endpoint* ep, const std::vector<uint8_t>& data, size_t offset, size_t length,
                std::vector<op>& pending) {
  op o = ep->stream_send(data.data() + offset, length);
  BOOST_REQUIRE_MESSAGE(!o.failed(), "stream_send of " << length << ": " << to_string(o.st));
  if (o.pending()) pending.push_back(o);
}

/// Sends `length` bytes at `data` on `ep` and waits until the send completed.
void send_sync(worker_pair& p, endpoint* ep, const void* data, size_t length) {
  op o = ep->stream_send(data, length);
  BOOST_REQUIRE_MESSAGE(!o.failed(), "stream_send of " << length << ": " << to_string(o.st));
  BOOST_REQUIRE(p.finish(o) == status::ok);
}

/// Waits until `ep` (of the worker pair `p`) received `bytes` stream bytes in all.
bool arrived(worker_pair& p, endpoint* ep, uint64_t bytes) {
  return p.until([&] { return ep->counters().bytes_received >= bytes; });
}

/// Worker parameters with a name.
worker_params named(const char* name) {
  worker_params params;
  params.name = name;
  return params;
}

/// Waits for every send in `pending`.
void finish_sends(worker_pair& p, std::vector<op>& pending) {
  for (op o : pending) BOOST_CHECK(p.finish(o) == status::ok);
  pending.clear();
}

/// Receives `length` bytes from `ep` (of `owner`) into `out` at `offset` with receives of random
/// sizes (some at-least, some wait-all), progressing both workers; false on a failure.
bool receive_all(worker_pair& p, worker& owner, endpoint* ep, std::vector<uint8_t>& out,
                 size_t offset, size_t length, std::mt19937& rng) {
  size_t done = 0;
  while (done < length) {
    const size_t room = length - done;
    const size_t want = std::min<size_t>(room, 1 + rng() % 70000);
    const bool waitall = rng() % 3 == 0;
    stream_tracker t;
    size_t got = 0;
    op r = ep->stream_recv(out.data() + offset + done, want, &got,
                           stream_params(t, waitall ? uint32_t{request_stream_waitall} : 0u));
    if (r.failed()) {
      BOOST_ERROR("stream_recv: " << to_string(r.st));
      return false;
    }
    if (r.pending()) {
      if (!p.until([&] { return t.calls > 0; })) {
        BOOST_ERROR("a receive of " << want << " never completed");
        (void)owner.cancel(r.req, cancel_mode::force);
        return false;
      }
      owner.release(r.req);
      BOOST_REQUIRE(t.st == status::ok);
      got = t.length;
    }
    BOOST_REQUIRE(got >= 1 && got <= want);
    if (waitall) BOOST_REQUIRE_EQUAL(got, want);
    done += got;
  }
  return true;
}

}  // namespace stream_test

using namespace stream_test;

BOOST_AUTO_TEST_SUITE(ordering)

// Sizes from empty to fragmented (several bcopy fragments, zcopy), sent back to back and received
// with receives of random sizes, posted before or after the data arrived.
BOOST_DATA_TEST_CASE(bytes_arrive_in_order_across_sizes_and_splits, each_transport(), tl_name) {
  worker_pair p(tl_name);
  std::mt19937 rng(1234);
  const size_t bcopy = p.bcopy_payload();
  const std::vector<size_t> sizes = {0,         1,         7,         8,     63,     64,
                                     100,       4095,      4096,      bcopy, bcopy + 1,
                                     2 * bcopy + 17,       16384,     65536, 300000};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  const std::vector<uint8_t> data = pattern(total, 7);
  std::vector<uint8_t> got(total, 0);
  endpoint* rx = receiver(p);
  BOOST_REQUIRE(rx != nullptr);
  std::vector<op> pending;
  size_t offset = 0;
  for (size_t s : sizes) {
    send_piece(p.ab, data, offset, s, pending);
    offset += s;
  }
  BOOST_REQUIRE(receive_all(p, *p.b, rx, got, 0, total, rng));
  finish_sends(p, pending);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), total, 7), -1);
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
}

BOOST_DATA_TEST_CASE(random_split_points_both_ways, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  BOOST_REQUIRE(rx != nullptr);
  for (uint32_t round = 0; round < 4; ++round) {
    std::mt19937 rng(round + 99);
    const size_t total = 200000 + rng() % 200000;
    const std::vector<uint8_t> data = pattern(total, round);
    std::vector<uint8_t> got(total, 0);
    std::vector<op> pending;
    size_t sent = 0, received = 0;
    // Interleaves sends of random lengths with receives of random lengths.
    while (received < total) {
      if (sent < total) {
        const size_t n = std::min<size_t>(total - sent, rng() % 40000);
        send_piece(p.ab, data, sent, n, pending);
        sent += n;
      }
      const size_t upto = std::min(sent, received + 1 + rng() % 50000);
      if (upto > received) {
        BOOST_REQUIRE(receive_all(p, *p.b, rx, got, received, upto - received, rng));
        received = upto;
      }
    }
    finish_sends(p, pending);
    BOOST_CHECK_EQUAL(first_mismatch(got.data(), total, round), -1);
  }
  // The reverse direction on the same pair: b's endpoint sends, a's `ab` receives.
  std::mt19937 rng(5);
  const std::vector<uint8_t> back = pattern(150000, 42);
  std::vector<uint8_t> got(back.size(), 0);
  std::vector<op> pending;
  send_piece(rx, back, 0, 100000, pending);
  send_piece(rx, back, 100000, 50000, pending);
  BOOST_REQUIRE(receive_all(p, *p.a, p.ab, got, 0, back.size(), rng));
  finish_sends(p, pending);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), got.size(), 42), -1);
}

BOOST_DATA_TEST_CASE(iov_send_is_its_concatenation, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const std::vector<uint8_t> data = pattern(5000, 3);
  std::vector<uint8_t> copy = data;
  iov_entry entries[3] = {{copy.data(), 10}, {copy.data() + 10, 0}, {copy.data() + 10, 4990}};
  op s = p.ab->stream_send_iov(entries, 3);
  BOOST_REQUIRE(!s.failed());
  std::vector<uint8_t> got(5000);
  stream_tracker t;
  op r = rx->stream_recv(got.data(), got.size(), nullptr,
                         stream_params(t, request_stream_waitall));
  BOOST_CHECK(p.finish(s) == status::ok);
  BOOST_REQUIRE(p.finish(r) == status::ok);
  BOOST_CHECK_EQUAL(t.length, 5000u);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), got.size(), 3), -1);
  BOOST_CHECK(p.ab->stream_send_iov(nullptr, 2).st == status::invalid_param);
  iov_entry bad{nullptr, 4};
  BOOST_CHECK(p.ab->stream_send_iov(&bad, 1).st == status::invalid_param);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(receives)

BOOST_DATA_TEST_CASE(at_least_receives, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const std::vector<uint8_t> data = pattern(200, 11);
  std::vector<uint8_t> got(200, 0);
  // Posted first: 30 bytes are not enough for 50, 60 are (it takes all that came, up to 100).
  stream_tracker t;
  op r = rx->stream_recv(got.data(), 100, 50, nullptr, stream_params(t));
  BOOST_REQUIRE(r.pending());
  send_sync(p, p.ab, data.data(), 30);
  BOOST_REQUIRE(arrived(p, rx, 30));
  BOOST_CHECK_EQUAL(t.calls, 0);
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);  // the bytes went into the receive
  send_sync(p, p.ab, data.data() + 30, 30);
  BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
  BOOST_CHECK(t.st == status::ok);
  BOOST_CHECK_EQUAL(t.length, 60u);
  p.b->release(r.req);
  // Buffered first: a receive asking for at least what is there completes at once.
  send_sync(p, p.ab, data.data() + 60, 40);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == 40; }));
  size_t n = 0;
  op now = rx->stream_recv(got.data() + 60, 140, 40, &n);
  BOOST_CHECK(now.done());
  BOOST_CHECK_EQUAL(n, 40u);
  // Asking for more than is buffered takes it and waits for the rest.
  send_sync(p, p.ab, data.data() + 100, 20);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == 20; }));
  stream_tracker t2;
  op later = rx->stream_recv(got.data() + 100, 100, 100, nullptr, stream_params(t2));
  BOOST_REQUIRE(later.pending());
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
  send_sync(p, p.ab, data.data() + 120, 80);
  BOOST_REQUIRE(p.until([&] { return t2.calls == 1; }));
  BOOST_CHECK_EQUAL(t2.length, 100u);
  p.b->release(later.req);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), 200, 11), -1);
  // Bad arguments.
  BOOST_CHECK(rx->stream_recv(got.data(), 10, 0, nullptr).st == status::invalid_param);
  BOOST_CHECK(rx->stream_recv(got.data(), 10, 11, nullptr).st == status::invalid_param);
  BOOST_CHECK(rx->stream_recv(nullptr, 10, nullptr).st == status::invalid_param);
}

BOOST_DATA_TEST_CASE(waitall_and_posting_order, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const std::vector<uint8_t> data = pattern(1100, 12);
  std::vector<uint8_t> got(1100, 0);
  stream_tracker whole, first_bytes;
  op r1 = rx->stream_recv(got.data(), 1000, nullptr, stream_params(whole, request_stream_waitall));
  op r2 = rx->stream_recv(got.data() + 1000, 100, nullptr, stream_params(first_bytes));
  BOOST_REQUIRE(r1.pending() && r2.pending());
  for (int i = 0; i < 9; ++i) send_sync(p, p.ab, data.data() + 100 * i, 100);
  BOOST_REQUIRE(arrived(p, rx, 900));
  BOOST_CHECK_EQUAL(whole.calls, 0);
  BOOST_CHECK_EQUAL(first_bytes.calls, 0);
  // The tenth piece fills the first receive; five bytes more go to the second, which needs one.
  send_sync(p, p.ab, data.data() + 900, 105);
  BOOST_REQUIRE(p.until([&] { return whole.calls == 1 && first_bytes.calls == 1; }));
  BOOST_CHECK(whole.st == status::ok);
  BOOST_CHECK_EQUAL(whole.length, 1000u);
  BOOST_CHECK_EQUAL(first_bytes.length, 5u);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), 1005, 12), -1);
  p.b->release(r1.req);
  p.b->release(r2.req);
  // A wait-all receive of what is buffered completes at once; of more, it waits.
  send_sync(p, p.ab, data.data() + 1005, 95);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == 95; }));
  size_t n = 0;
  const request_params all = stream_params(whole, request_stream_waitall);
  BOOST_CHECK(rx->stream_recv(got.data() + 1005, 95, &n, all).done());
  BOOST_CHECK_EQUAL(n, 95u);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), 1100, 12), -1);
}

BOOST_DATA_TEST_CASE(recv_data_lends_buffered_blocks, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const std::vector<uint8_t> data = pattern(20000, 13);
  size_t length = 99;
  BOOST_CHECK(rx->stream_recv_data(&length) == nullptr);
  BOOST_CHECK_EQUAL(length, 0u);
  std::vector<op> pending;
  send_piece(p.ab, data, 0, 10, pending);
  send_piece(p.ab, data, 10, 19990, pending);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == 20000; }));
  finish_sends(p, pending);
  std::vector<uint8_t> got;
  std::vector<void*> held;
  while (void* block = rx->stream_recv_data(&length)) {
    BOOST_REQUIRE(length > 0);
    const auto* bytes = static_cast<const uint8_t*>(block);
    got.insert(got.end(), bytes, bytes + length);
    held.push_back(block);
  }
  BOOST_CHECK_EQUAL(got.size(), 20000u);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), got.size(), 13), -1);
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
  for (void* block : held) BOOST_CHECK(rx->stream_data_release(block) == status::ok);
  BOOST_CHECK(rx->stream_data_release(held.front()) == status::invalid_param);
  int local = 0;
  BOOST_CHECK(rx->stream_data_release(&local) == status::invalid_param);
  // One kept past the worker's end is freed with it (LeakSanitizer checks).
  send_piece(p.ab, data, 0, 100, pending);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == 100; }));
  BOOST_CHECK(rx->stream_recv_data(&length) != nullptr);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(data_ready)

BOOST_DATA_TEST_CASE(poll_reports_endpoints_with_data, each_transport(), tl_name) {
  worker_pair p(tl_name);
  auto c = worker::create(*p.ctx, named("c")).value();
  endpoint* cb = nullptr;
  BOOST_REQUIRE(c->connect(p.b->address(), &cb) == status::ok);
  auto both = [&] {
    p.progress();
    c->progress();
  };
  stream_poll_entry out[4];
  BOOST_CHECK_EQUAL(p.b->stream_poll(out, 4), 0u);
  send_sync(p, p.ab, "abc", 3);
  BOOST_REQUIRE(spin_until(both, [&] { return p.b->stream_poll(out, 4) == 1; }));
  BOOST_CHECK(out[0].ep == receiver(p));
  BOOST_CHECK_EQUAL(out[0].length, 3u);
  op sc = cb->stream_send("defgh", 5);
  BOOST_REQUIRE(!sc.failed());
  BOOST_REQUIRE(spin_until(both, [&] { return p.b->stream_poll(out, 4) == 2; }));
  endpoint* from_c = out[0].ep == receiver(p) ? out[1].ep : out[0].ep;
  BOOST_CHECK(from_c != receiver(p));
  BOOST_CHECK_EQUAL(out[0].length + out[1].length, 8u);
  // A bounded poll takes turns.
  stream_poll_entry one;
  BOOST_REQUIRE_EQUAL(p.b->stream_poll(&one, 1), 1u);
  endpoint* first = one.ep;
  BOOST_REQUIRE_EQUAL(p.b->stream_poll(&one, 1), 1u);
  BOOST_CHECK(one.ep != first);
  BOOST_CHECK_EQUAL(p.b->stream_poll(nullptr, 4), 0u);
  // Received: no longer reported; a posted receive that waits is not data ready either.
  char buf[8];
  size_t n = 0;
  BOOST_CHECK(from_c->stream_recv(buf, sizeof buf, &n).done());
  BOOST_CHECK_EQUAL(n, 5u);
  BOOST_CHECK_EQUAL(std::string(buf, 5), "defgh");
  BOOST_REQUIRE_EQUAL(p.b->stream_poll(out, 4), 1u);
  BOOST_CHECK(out[0].ep == receiver(p));
  BOOST_CHECK(receiver(p)->stream_recv(buf, sizeof buf, &n).done());
  BOOST_CHECK_EQUAL(p.b->stream_poll(out, 4), 0u);
  stream_tracker t;
  op r = from_c->stream_recv(buf, sizeof buf, nullptr, stream_params(t));
  BOOST_REQUIRE(r.pending());
  op sc2 = cb->stream_send("x", 1);
  BOOST_REQUIRE(spin_until(both, [&] { return t.calls == 1; }));
  BOOST_CHECK_EQUAL(p.b->stream_poll(out, 4), 0u);
  p.b->release(r.req);
  BOOST_CHECK(spin_until(both, [&] {
    return (!sc.pending() || c->request_status(sc.req) != status::in_progress) &&
           (!sc2.pending() || c->request_status(sc2.req) != status::in_progress);
  }));
  if (sc.pending()) c->release(sc.req);
  if (sc2.pending()) c->release(sc2.req);
  c.reset();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cancel_and_close)

BOOST_DATA_TEST_CASE(cancel_pending_receives, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  std::vector<uint8_t> got(100, 0);
  stream_tracker t1, t2, t3;
  op r1 = rx->stream_recv(got.data(), 50, 50, nullptr, stream_params(t1));
  op r2 = rx->stream_recv(got.data() + 50, 10, nullptr, stream_params(t2));
  op r3 = rx->stream_recv(got.data() + 60, 10, nullptr, stream_params(t3));
  BOOST_REQUIRE(r1.pending() && r2.pending() && r3.pending());
  // r1 gets 20 of its 50, then is canceled: it reports them.
  const std::vector<uint8_t> data = pattern(40, 14);
  send_sync(p, p.ab, data.data(), 20);
  BOOST_REQUIRE(arrived(p, rx, 20));
  BOOST_CHECK_EQUAL(t1.calls, 0);
  BOOST_CHECK(p.b->cancel(r1.req) == status::ok);
  BOOST_CHECK_EQUAL(t1.calls, 1);
  BOOST_CHECK(t1.st == status::canceled);
  BOOST_CHECK_EQUAL(t1.length, 20u);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), 20, 14), -1);
  BOOST_CHECK(p.b->cancel(r1.req) == status::invalid_param);  // already over
  p.b->release(r1.req);
  // r3 canceled silently: the next bytes go to r2, then to the buffer.
  BOOST_CHECK(p.b->cancel(r3.req, cancel_mode::force) == status::ok);
  BOOST_CHECK_EQUAL(t3.calls, 0);
  send_sync(p, p.ab, data.data() + 20, 20);
  BOOST_REQUIRE(p.until([&] { return t2.calls == 1 && buffered_total(*p.b) == 10; }));
  BOOST_CHECK(t2.st == status::ok);
  BOOST_CHECK_EQUAL(t2.length, 10u);
  BOOST_CHECK_EQUAL(first_mismatch(got.data() + 50, 10, 14, 20), -1);
  p.b->release(r2.req);
}

BOOST_DATA_TEST_CASE(close_completes_pending_receives, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  char buf[16];
  stream_tracker t;
  op r = rx->stream_recv(buf, sizeof buf, 4, nullptr, stream_params(t));
  BOOST_REQUIRE(r.pending());
  send_sync(p, p.ab, "ab", 2);
  BOOST_REQUIRE(arrived(p, rx, 2));
  BOOST_CHECK_EQUAL(t.calls, 0);
  op closing = rx->close();
  BOOST_CHECK(p.finish(closing) == status::ok);
  BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
  BOOST_CHECK(t.st == status::canceled);
  BOOST_CHECK_EQUAL(t.length, 2u);
  p.b->release(r.req);
  // The sender learns its peer closed: its sends fail from then on.
  BOOST_REQUIRE(p.until([&] { return p.ab->state() != status::ok; }));
  BOOST_CHECK(p.ab->stream_send("x", 1).failed());
}

// The endpoint a peer's close fails (one we created) keeps the bytes that arrived before it.
BOOST_DATA_TEST_CASE(peer_close_fails_receives_after_the_buffered_bytes, each_transport(),
                     tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  error_log errors;
  p.ab->set_error_handler(record_error, &errors);
  send_sync(p, rx, "hello", 5);
  BOOST_REQUIRE(arrived(p, p.ab, 5));
  // b's side posts a receive, then closes: it completes with canceled.
  char buf[16];
  stream_tracker t;
  op waiting = rx->stream_recv(buf, sizeof buf, nullptr, stream_params(t));
  BOOST_REQUIRE(waiting.pending());
  BOOST_CHECK(p.finish(rx->close()) == status::ok);
  BOOST_REQUIRE(p.until([&] { return t.calls == 1 && errors.calls == 1; }));
  BOOST_CHECK(t.st == status::canceled);
  p.b->release(waiting.req);
  BOOST_CHECK(errors.reason == status::not_connected);
  // a's endpoint failed; what arrived before is still there, then receives fail.
  stream_poll_entry e;
  BOOST_REQUIRE_EQUAL(p.a->stream_poll(&e, 1), 1u);
  BOOST_CHECK(e.ep == p.ab);
  size_t n = 0;
  BOOST_CHECK(p.ab->stream_recv(buf, 3, 3, &n).done());
  BOOST_CHECK_EQUAL(std::string(buf, 3), "hel");
  // Asking for more than is left fails without taking anything; asking for less still works.
  BOOST_CHECK(p.ab->stream_recv(buf, 16, 3, &n).st == status::not_connected);
  BOOST_CHECK(p.ab->stream_recv(buf, 16, &n).done());
  BOOST_CHECK_EQUAL(std::string(buf, n), "lo");
  BOOST_CHECK(p.ab->stream_recv(buf, 16, &n).st == status::not_connected);
  BOOST_CHECK(p.ab->stream_send("x", 1).failed());
  BOOST_CHECK_EQUAL(p.a->stream_poll(&e, 1), 0u);
}

// A peer-created endpoint (the partner of a peer's connect) is released when the peer closes:
// its waiting receives complete with not_connected.
BOOST_DATA_TEST_CASE(peer_close_releases_a_peer_created_endpoint, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const uint32_t rx_id = detail::impl(*rx).id;
  char buf[16];
  stream_tracker t;
  op waiting = rx->stream_recv(buf, sizeof buf, 8, nullptr, stream_params(t));
  BOOST_REQUIRE(waiting.pending());
  send_sync(p, p.ab, "abc", 3);
  BOOST_CHECK(p.finish(p.ab->close()) == status::ok);
  BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
  BOOST_CHECK(t.st == status::not_connected);
  BOOST_CHECK_EQUAL(t.length, 3u);
  BOOST_CHECK_EQUAL(std::string(buf, 3), "abc");
  p.b->release(waiting.req);
  BOOST_CHECK(detail::impl(*p.b).find_ep(rx_id) == nullptr);
}

BOOST_DATA_TEST_CASE(worker_teardown_cancels_pending_receives, each_transport(), tl_name) {
  auto p = std::make_unique<worker_pair>(tl_name);
  char buf[4];
  stream_tracker t;
  op r = p->ab->stream_recv(buf, sizeof buf, nullptr, stream_params(t));
  BOOST_REQUIRE(r.pending());
  p->a->release(r.req);
  // b buffers bytes nobody receives; both go with their workers (LeakSanitizer checks).
  send_sync(*p, p->ab, "abcdef", 6);
  BOOST_REQUIRE(p->until([&] { return buffered_total(*p->b) == 6; }));
  p.reset();
  BOOST_CHECK_EQUAL(t.calls, 1);
  BOOST_CHECK(t.st == status::canceled || t.st == status::not_connected ||
              t.st == status::connection_reset);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hostile_peer)

// A peer that streams more than the receiver buffers fails its endpoint there, and only that one.
BOOST_DATA_TEST_CASE(buffer_limit_fails_the_endpoint, each_transport(), tl_name) {
  constexpr size_t limit = 256 * 1024;
  worker_pair p(tl_name, [](config& cfg) { cfg.limits.stream_rx_ep_max_bytes = limit; });
  endpoint* rx = receiver(p);
  error_log errors;
  rx->set_error_handler(record_error, &errors);
  auto c = worker::create(*p.ctx, named("c")).value();
  endpoint* cb = nullptr;
  BOOST_REQUIRE(c->connect(p.b->address(), &cb) == status::ok);
  const std::vector<uint8_t> chunk = pattern(16384, 15);
  std::vector<op> pending;
  size_t sent = 0;
  // Bounded: four times the limit is far more than enough to pass it.
  for (; sent < 4 * limit && errors.calls == 0; sent += chunk.size()) {
    op o = p.ab->stream_send(chunk.data(), chunk.size());
    if (o.failed()) break;
    if (o.pending()) pending.push_back(o);
    p.spin(4);
    c->progress();
  }
  BOOST_REQUIRE(p.until([&] { return errors.calls == 1; }));
  BOOST_CHECK(errors.reason == status::exceeds_limit);
  BOOST_CHECK(rx->state() == status::exceeds_limit);
  BOOST_CHECK(detail::impl(*p.b).limit_errors >= 1);
  // Nothing stays buffered for it; its sends end (failed or done).
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
  for (op o : pending) {
    const status st = p.finish(o);
    BOOST_CHECK(st != status::timed_out);
  }
  // The worker serves its other peers.
  op from_c = cb->stream_send("still", 5);
  BOOST_REQUIRE(!from_c.failed());
  stream_poll_entry e;
  BOOST_REQUIRE(spin_until([&] { p.progress(); c->progress(); },
                           [&] { return p.b->stream_poll(&e, 1) == 1; }));
  char buf[8];
  size_t n = 0;
  BOOST_CHECK(e.ep->stream_recv(buf, 5, 5, &n).done());
  BOOST_CHECK_EQUAL(std::string(buf, 5), "still");
  BOOST_CHECK(spin_until([&] { p.progress(); c->progress(); }, [&] {
    return !from_c.pending() || c->request_status(from_c.req) != status::in_progress;
  }));
  if (from_c.pending()) c->release(from_c.req);
  c.reset();
}

BOOST_AUTO_TEST_CASE(limits_have_variables_and_show_in_info) {
  setenv("COMM_STREAM_RX_MAX_BYTES", "3m", 1);
  setenv("COMM_STREAM_RX_EP_MAX_BYTES", "0", 1);  // refused: the default stays
  const config cfg = config::from_environment();
  unsetenv("COMM_STREAM_RX_MAX_BYTES");
  unsetenv("COMM_STREAM_RX_EP_MAX_BYTES");
  BOOST_CHECK_EQUAL(cfg.limits.stream_rx_max_bytes, 3u << 20);
  BOOST_CHECK_EQUAL(cfg.limits.stream_rx_ep_max_bytes, config{}.limits.stream_rx_ep_max_bytes);
  const std::string info = context(cfg).info();
  BOOST_CHECK_MESSAGE(info.find("stream_rx=3145728") != std::string::npos, info);
}

/// A forged message: header of type Struct filled by `fill`, then `payload`, 8-byte aligned.
template <class Struct, class Fill>
std::vector<uint64_t> forged(Fill&& fill, size_t payload, size_t* length) {
  wire::header_writer<Struct> w;
  fill(w.fields());
  *length = w.size() + payload;
  std::vector<uint64_t> words(*length / 8 + 1, 0);
  std::memcpy(words.data(), w.bytes(), w.size());
  std::memset(reinterpret_cast<uint8_t*>(words.data()) + w.size(), 'z', payload);
  return words;
}

void feed_words(worker& w, proto_id id, const std::vector<uint64_t>& words, size_t length) {
  feed(w, id, reinterpret_cast<const uint8_t*>(words.data()), length);
}

BOOST_DATA_TEST_CASE(forged_frames_fail_only_their_endpoint, each_transport(), tl_name) {
  const std::vector<std::string> cases = {"unknown_ep", "truncated", "first_without_fragments",
                                          "fragment_out_of_sequence", "data_inside_fragments"};
  for (const std::string& what : cases) {
    BOOST_TEST_CONTEXT("forged " << what) {
      worker_pair p(tl_name);
      auto* victim = detail::impl(*p.b).find_ep(detail::impl(*p.ab).remote_id);
      BOOST_REQUIRE(victim != nullptr);
      error_log errors;
      victim->set_error_handler(record_error, &errors);
      const uint32_t dst = victim->id;
      const uint64_t before = detail::impl(*p.b).protocol_errors;
      size_t length = 0;
      if (what == "unknown_ep") {
        auto m = forged<wire::schema::StreamData>([&](auto& h) { h.setDstEp(dst + 7); }, 9,
                                                  &length);
        feed_words(*p.b, proto_id::stream_data, m, length);
      } else if (what == "truncated") {
        auto m = forged<wire::schema::StreamFirst>([&](auto& h) { h.setDstEp(dst); }, 0, &length);
        feed_words(*p.b, proto_id::stream_first, m, 12);
        feed_words(*p.b, proto_id::stream_data, m, 7);
      } else if (what == "first_without_fragments") {
        auto m = forged<wire::schema::StreamFirst>(
            [&](auto& h) {
              h.setDstEp(dst);
              h.setMsgId(1);
              h.setTotalLength(5);
            },
            5, &length);
        feed_words(*p.b, proto_id::stream_first, m, length);
      } else if (what == "fragment_out_of_sequence") {
        auto first = forged<wire::schema::StreamFirst>(
            [&](auto& h) {
              h.setDstEp(dst);
              h.setMsgId(9);
              h.setTotalLength(uint64_t{1} << 62);  // announced only: nothing is allocated ahead
            },
            100, &length);
        feed_words(*p.b, proto_id::stream_first, first, length);
        BOOST_CHECK_EQUAL(errors.calls, 0);
        auto frag = forged<wire::schema::FragmentMiddle>(
            [&](auto& h) {
              h.setDstEp(dst);
              h.setMsgId(9);
              h.setOffset(50);
            },
            10, &length);
        feed_words(*p.b, proto_id::stream_fragment, frag, length);
      } else {
        auto first = forged<wire::schema::StreamFirst>(
            [&](auto& h) {
              h.setDstEp(dst);
              h.setMsgId(3);
              h.setTotalLength(1000);
            },
            100, &length);
        feed_words(*p.b, proto_id::stream_first, first, length);
        auto data = forged<wire::schema::StreamData>([&](auto& h) { h.setDstEp(dst); }, 4,
                                                     &length);
        feed_words(*p.b, proto_id::stream_data, data, length);
      }
      BOOST_CHECK_GT(detail::impl(*p.b).protocol_errors, before);
      if (what == "unknown_ep" || what == "truncated") {
        BOOST_CHECK_EQUAL(errors.calls, 0);
      } else {
        BOOST_CHECK_EQUAL(errors.calls, 1);
        BOOST_CHECK(errors.reason == status::protocol_error);
      }
      // The bytes of a valid first fragment stay readable on the failed endpoint; nothing else.
      const bool first_was_valid =
          what == "fragment_out_of_sequence" || what == "data_inside_fragments";
      BOOST_CHECK_EQUAL(buffered_total(*p.b), first_was_valid ? 100u : 0u);
      // The worker still streams with its peers (a fresh pair of endpoints for the victim's).
      endpoint* again = nullptr;
      BOOST_REQUIRE(p.a->connect(p.b->address(), &again) == status::ok);
      BOOST_REQUIRE(p.until([&] { return worker_pair::wired(again); }));
      send_sync(p, again, "ok", 2);
      endpoint* fresh = nullptr;
      BOOST_REQUIRE(p.until([&] {
        stream_poll_entry e[4];
        const size_t count = p.b->stream_poll(e, 4);
        for (size_t i = 0; i < count; ++i) {
          if (e[i].ep != victim) fresh = e[i].ep;
        }
        return fresh != nullptr;
      }));
      char buf[2];
      size_t n = 0;
      BOOST_CHECK(fresh->stream_recv(buf, 2, 2, &n).done());
      BOOST_CHECK_EQUAL(std::string(buf, 2), "ok");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
