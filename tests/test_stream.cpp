// Streams over every transport (the verbs test device included, a software stand-in): the bytes
// of stream sends arrive in order on the peer's paired endpoint whatever the send and receive
// sizes (fragmented sends included), at-least and wait-all receives, worker::stream_poll, zero-copy
// receive of buffered blocks, cancel, receives pending at close and at failure, and a peer that
// passes the stream buffer limit or sends forged stream frames.
#define BOOST_TEST_MODULE stream
#include "fixture.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>

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
                                          "fragment_out_of_sequence", "data_inside_fragments",
                                          "announcement_with_a_forged_key"};
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
      } else if (what == "data_inside_fragments") {
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
      } else {
        // A rendezvous of stream bytes whose key names nothing: the read fails (where the lane
        // has no get, the sender refuses the request for a send it never made).
        capnp::MallocMessageBuilder message;
        auto rts = message.initRoot<wire::schema::RndvRts>();
        rts.setDstEp(dst);
        rts.setIsStream(true);
        rts.setSreqId(77);
        rts.setLength(100000);
        rts.setAddress(0x10000);
        const std::vector<uint8_t> key = pattern(48, 9);
        rts.setRkey(kj::arrayPtr(key.data(), key.size()));
        auto words = capnp::messageToFlatArray(message);
        feed(*p.b, proto_id::rndv_rts, words.asBytes().begin(), words.asBytes().size());
        BOOST_REQUIRE(p.until([&] { return errors.calls == 1; }));
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

// -- large sends: rendezvous reads straight into posted receives ---------------------------------

namespace stream_test {

/// How b's stream module moved bytes so far.
const detail::stream_counters& counts(worker& w) {
  return detail::module_of<detail::stream_protocol>(detail::impl(w)).counters();
}

/// Transport descriptors b's stream module keeps now.
size_t kept(worker& w) {
  return detail::module_of<detail::stream_protocol>(detail::impl(w)).kept_descs();
}

/// True when a rendezvous read on the lane of `ab` needs the sender's progress: a software
/// rendezvous (no get: the sender pushes) or a get its owner answers (tcp).
bool read_needs_sender(worker_pair& p) {
  const detail::endpoint_impl& ep = detail::impl(*p.ab);
  const uint64_t caps = ep.lane_attr->caps;
  return !(caps & tl::cap_get_zcopy) || (caps & tl::cap_get_needs_peer) ||
         ep.lane_iface->memory_domain() == nullptr;
}

/// Parameters of a send forced to go by rendezvous (the software one where the lane has no get).
request_params forced_rndv() {
  request_params p;
  p.flags = request_force_rndv;
  return p;
}

/// Posts a receive of `length` bytes at `buffer` that completes with at least `min_length`.
op post(endpoint* ep, uint8_t* buffer, size_t length, size_t min_length, stream_tracker& t) {
  op r = ep->stream_recv(buffer, length, min_length, nullptr, stream_params(t));
  BOOST_REQUIRE_MESSAGE(r.pending(), "a receive of " << length << " did not wait");
  return r;
}

}  // namespace stream_test

BOOST_AUTO_TEST_SUITE(large_sends)

// Receives posted first: every byte lands in them, none passes through the stream's buffer:
// eager, copied from the transport's buffers straight into the receive; by rendezvous (asked
// for), read there from the sender's memory (one read per send where the lane has get).
BOOST_DATA_TEST_CASE(land_in_posted_receives, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const std::vector<size_t> sizes = {65536, 300000, (size_t{1} << 20) + 17};
  for (const bool forced : {false, true}) {
    for (size_t size : sizes) {
      BOOST_TEST_CONTEXT("send of " << size << (forced ? " by rendezvous" : " eager")) {
        const auto seed = static_cast<uint32_t>(size + forced);
        const std::vector<uint8_t> data = pattern(size, seed);
        std::vector<uint8_t> got(size, 0);
        const detail::stream_counters before = counts(*p.b);
        stream_tracker t;
        op r = post(rx, got.data(), size, size, t);
        op s = p.ab->stream_send(data.data(), size, forced ? forced_rndv() : request_params{});
        BOOST_REQUIRE(!s.failed());
        BOOST_CHECK(p.finish(s) == status::ok);
        BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
        BOOST_CHECK(t.st == status::ok);
        BOOST_CHECK_EQUAL(t.length, size);
        p.b->release(r.req);
        BOOST_CHECK_EQUAL(first_mismatch(got.data(), size, seed), -1);
        const detail::stream_counters& after = counts(*p.b);
        BOOST_CHECK_EQUAL(after.copied_bytes, before.copied_bytes);
        BOOST_CHECK_EQUAL(after.kept_bytes, before.kept_bytes);
        BOOST_CHECK_EQUAL(after.drained_bytes, before.drained_bytes);
        if (forced) {
          BOOST_CHECK_EQUAL(after.fetches, before.fetches + 1);
          BOOST_CHECK_EQUAL(after.fetched_direct, before.fetched_direct + size);
        } else {
          BOOST_CHECK_EQUAL(after.fetches, before.fetches);
          BOOST_CHECK_EQUAL(after.direct_bytes, before.direct_bytes + size);
        }
      }
    }
  }
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
}

// Sent before any receive: the sends complete anyway (the bytes wait in the stream's buffer, by
// rendezvous read there ahead of the receives), and receives of any size take them in order.
BOOST_DATA_TEST_CASE(complete_before_their_receives, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  for (const bool forced : {false, true}) {
    BOOST_TEST_CONTEXT((forced ? "by rendezvous" : "eager")) {
      const size_t total = 300000 + 70000 + 100;
      const auto seed = static_cast<uint32_t>(21 + forced);
      const std::vector<uint8_t> data = pattern(total, seed);
      const detail::stream_counters before = counts(*p.b);
      const request_params large = forced ? forced_rndv() : request_params{};
      std::vector<op> pending;
      for (auto [offset, length] : {std::pair<size_t, size_t>{0, 300000}, {300000, 100},
                                    {300100, 70000}}) {
        const request_params params = length > 100 ? large : request_params{};
        op o = p.ab->stream_send(data.data() + offset, length, params);
        BOOST_REQUIRE(!o.failed());
        if (o.pending()) pending.push_back(o);
      }
      finish_sends(p, pending);
      BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == total; }));
      if (forced) {
        BOOST_CHECK_EQUAL(counts(*p.b).fetches, before.fetches + 2);
        BOOST_CHECK_EQUAL(counts(*p.b).fetched_buffered, before.fetched_buffered + 370000);
      }
      std::vector<uint8_t> got(total, 0);
      std::mt19937 rng(seed);
      BOOST_REQUIRE(receive_all(p, *p.b, rx, got, 0, total, rng));
      BOOST_CHECK_EQUAL(first_mismatch(got.data(), total, seed), -1);
      BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
    }
  }
}

// One large send split among the receives posted: each takes its part in posting order and
// completes (at-least ones with what they hold when a transport message's bytes end in them: the
// whole send's by rendezvous); the rest is buffered for later receives. A wait-all receive the
// send only half fills waits for more.
BOOST_DATA_TEST_CASE(receives_split_a_large_send, each_transport(), tl_name) {
  for (const bool forced : {false, true}) {
    BOOST_TEST_CONTEXT((forced ? "by rendezvous" : "eager")) {
      worker_pair p(tl_name);
      endpoint* rx = receiver(p);
      const request_params large = forced ? forced_rndv() : request_params{};
      auto send = [&](const uint8_t* bytes, size_t length) {
        op o = p.ab->stream_send(bytes, length, large);
        BOOST_REQUIRE(!o.failed());
        BOOST_REQUIRE(p.finish(o) == status::ok);
      };
      const size_t total = 300000 + 151100 + 300000;
      const std::vector<uint8_t> data = pattern(total, 22);
      std::vector<uint8_t> got(total + 400000, 0);
      stream_tracker t1, t2, t3, t4;
      op r1 = post(rx, got.data(), 1000, 1, t1);
      op r2 = post(rx, got.data() + 1000, 50000, 50000, t2);
      op r3 = post(rx, got.data() + 51000, 100, 100, t3);
      op r4 = post(rx, got.data() + 51100, 400000, 400000, t4);
      send(data.data(), 300000);
      BOOST_REQUIRE(p.until([&] { return t1.calls + t2.calls + t3.calls == 3; }));
      BOOST_CHECK_EQUAL(t1.length, 1000u);
      BOOST_CHECK_EQUAL(t2.length, 50000u);
      BOOST_CHECK_EQUAL(t3.length, 100u);
      p.spin(10);
      BOOST_CHECK_EQUAL(t4.calls, 0);  // 248900 of its 400000
      BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
      send(data.data() + 300000, 151100);
      BOOST_REQUIRE(p.until([&] { return t4.calls == 1; }));
      BOOST_CHECK(t4.st == status::ok);
      BOOST_CHECK_EQUAL(t4.length, 400000u);
      BOOST_CHECK_EQUAL(first_mismatch(got.data(), 451100, 22), -1);
      // An at-least receive larger than the send completes with the bytes of the send's first
      // transport message (all of them by rendezvous); the rest is buffered.
      stream_tracker t5;
      op r5 = post(rx, got.data() + 451100, 400000, 1, t5);
      send(data.data() + 451100, 300000);
      BOOST_REQUIRE(p.until([&] { return t5.calls == 1; }));
      BOOST_CHECK(t5.st == status::ok);
      if (forced) BOOST_CHECK_EQUAL(t5.length, 300000u);
      BOOST_REQUIRE(t5.length >= 1 && t5.length <= 300000);
      const size_t rest = 300000 - t5.length;
      BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == rest; }));
      if (rest != 0) {
        size_t taken = 0;
        BOOST_CHECK(rx->stream_recv(got.data() + 451100 + t5.length, rest, rest, &taken).done());
      }
      BOOST_CHECK_EQUAL(first_mismatch(got.data(), total, 22), -1);
      for (op r : {r1, r2, r3, r4, r5}) p.b->release(r.req);
      // More than the receives take: the rest is buffered, then received.
      stream_tracker t6;
      std::vector<uint8_t> more(200000, 0);
      op r6 = post(rx, more.data(), 1000, 1000, t6);
      send(data.data(), 200000);
      BOOST_REQUIRE(p.until([&] { return t6.calls == 1 && buffered_total(*p.b) == 199000; }));
      p.b->release(r6.req);
      size_t n = 0;
      BOOST_CHECK(rx->stream_recv(more.data() + 1000, 199000, 199000, &n).done());
      BOOST_CHECK_EQUAL(first_mismatch(more.data(), more.size(), 22), -1);
    }
  }
}

// Rendezvous sends (forced; on tcp the read needs the sender's progress, so its data comes
// later) mixed with eager ones: what arrives while a read is under way waits behind it, and the
// stream keeps its order whether the receives were posted before or after.
/// Sends eager and rendezvous pieces from a to b and receives them, some receives posted before,
/// the rest after; checks the order, and that what arrived during a read waited behind it where
/// the read needs the sender.
void rendezvous_order(worker_pair& p) {
  endpoint* rx = receiver(p);
  const std::vector<std::pair<size_t, bool>> sends = {
      {5000, false}, {100000, true}, {3000, false}, {70000, true}, {10, false}, {20000, false},
      {90000, true}};
  size_t total = 0;
  for (auto [size, forced] : sends) total += size;
  const std::vector<uint8_t> data = pattern(total, 23);
  std::vector<uint8_t> got(total, 0);
  // Receives for the first 50000 bytes are posted before anything is sent.
  std::vector<stream_tracker> early(5);
  std::vector<op> early_ops;
  for (size_t i = 0; i < early.size(); ++i) {
    early_ops.push_back(post(rx, got.data() + 10000 * i, 10000, 10000, early[i]));
  }
  const uint64_t held_before = counts(*p.b).held;
  std::vector<op> pending;
  size_t offset = 0;
  for (auto [size, forced] : sends) {
    op o = p.ab->stream_send(data.data() + offset, size, forced ? forced_rndv() : request_params{});
    BOOST_REQUIRE(!o.failed());
    if (o.pending()) pending.push_back(o);
    offset += size;
  }
  // Only b progresses: what a sent reaches b, while a read that needs a's progress waits.
  for (int i = 0; i < 200; ++i) p.b->progress();
  std::mt19937 rng(23);
  BOOST_REQUIRE(receive_all(p, *p.b, rx, got, 50000, total - 50000, rng));
  BOOST_REQUIRE(p.until([&] {
    return std::all_of(early.begin(), early.end(), [](auto& t) { return t.calls == 1; });
  }));
  for (op r : early_ops) p.b->release(r.req);
  finish_sends(p, pending);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), total, 23), -1);
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 0u);
  if (read_needs_sender(p)) {
    // The read's data came after the eager messages behind it: they waited.
    BOOST_CHECK_GT(counts(*p.b).held, held_before);
  }
}

BOOST_DATA_TEST_CASE(forced_rendezvous_keeps_the_order, each_transport(), tl_name) {
  worker_pair p(tl_name);
  rendezvous_order(p);
}

// tcp without put and get (COMM_TCP_RMA=0): the software rendezvous, whose sender pushes the data
// into the stream's read.
BOOST_AUTO_TEST_CASE(software_rendezvous_keeps_the_order) {
  worker_pair p("tcp", [](config& cfg) { cfg.transport_options["COMM_TCP_RMA"] = "0"; });
  BOOST_REQUIRE(!(p.attr().caps & tl::cap_get_zcopy));
  rendezvous_order(p);
  BOOST_CHECK_GT(counts(*p.b).fetches, 0u);
}

// A receive a read is writing into cannot be canceled; the read completes it.
BOOST_DATA_TEST_CASE(a_receive_being_read_into_cannot_be_canceled, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const std::vector<uint8_t> data = pattern(100000, 24);
  std::vector<uint8_t> got(100000, 0);
  stream_tracker t;
  op r = post(rx, got.data(), got.size(), got.size(), t);
  op s = p.ab->stream_send(data.data(), data.size(), forced_rndv());
  BOOST_REQUIRE(!s.failed());
  // b takes the announcement; a has not answered its read yet (tcp), or b read it already.
  for (int i = 0; i < 200; ++i) p.b->progress();
  if (t.calls == 0) {
    BOOST_CHECK(p.b->cancel(r.req) == status::busy);
  } else {
    BOOST_CHECK(!read_needs_sender(p));  // only a read b completes alone gets here
  }
  BOOST_CHECK(p.finish(s) == status::ok);
  BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
  BOOST_CHECK(t.st == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), got.size(), 24), -1);
  p.b->release(r.req);
}

// The sender goes away while b waits for the data of its rendezvous read: the receive it was
// writing into and the one behind it complete with the failure; nothing leaks.
BOOST_DATA_TEST_CASE(peer_gone_during_a_rendezvous, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const std::vector<uint8_t> data = pattern(100000, 25);
  std::vector<uint8_t> got(200000, 0);
  stream_tracker t1, t2;
  op r1 = post(rx, got.data(), 100000, 100000, t1);
  op r2 = post(rx, got.data() + 100000, 100000, 1, t2);
  op s = p.ab->stream_send(data.data(), data.size(), forced_rndv());
  BOOST_REQUIRE(!s.failed());
  for (int i = 0; i < 200; ++i) p.b->progress();
  const bool read_done = t1.calls == 1;
  if (s.pending()) p.a->release(s.req);
  p.a.reset();  // its close notice reaches b
  BOOST_REQUIRE(p.until_on(*p.b, [&] { return t1.calls == 1 && t2.calls == 1; }));
  if (read_done) {
    BOOST_CHECK(t1.st == status::ok);
  } else {
    BOOST_CHECK(t1.st != status::ok);
  }
  BOOST_CHECK(t2.st != status::ok);
  p.b->release(r1.req);
  p.b->release(r2.req);
}

// Past the read-ahead (here half of a 400000-byte endpoint limit), a rendezvous announcement
// waits for a receive, and so does its send and what was sent after it: stream_poll reports its
// bytes, a receive posted takes them straight from the sender, stream_recv_data reads them.
BOOST_DATA_TEST_CASE(announcements_past_the_read_ahead_wait_for_a_receive, each_transport(),
                     tl_name) {
  worker_pair p(tl_name, [](config& cfg) { cfg.limits.stream_rx_ep_max_bytes = 400000; });
  endpoint* rx = receiver(p);
  const size_t big = 150000;
  const std::vector<uint8_t> data = pattern(3 * big + 1000, 28);
  op s1 = p.ab->stream_send(data.data(), big, forced_rndv());
  BOOST_REQUIRE(!s1.failed());
  BOOST_CHECK(p.finish(s1) == status::ok);  // read ahead into b's buffer
  op s2 = p.ab->stream_send(data.data() + big, big, forced_rndv());
  op s3 = p.ab->stream_send(data.data() + 2 * big, 1000);
  op s4 = p.ab->stream_send(data.data() + 2 * big + 1000, big, forced_rndv());
  BOOST_REQUIRE(!s2.failed() && !s3.failed() && !s4.failed());
  stream_poll_entry e;
  BOOST_REQUIRE(p.until([&] { return p.b->stream_poll(&e, 1) == 1 && e.length == 2 * big; }));
  p.spin(50);
  BOOST_REQUIRE(s2.pending());
  BOOST_CHECK(p.a->request_status(s2.req) == status::in_progress);  // parked at b
  BOOST_CHECK_EQUAL(buffered_total(*p.b), 2 * big);
  std::vector<uint8_t> got(data.size(), 0);
  size_t n = 0;
  BOOST_CHECK(rx->stream_recv(got.data(), big, big, &n).done());  // the buffered one
  // A receive posted takes the parked one; what was sent after it follows.
  stream_tracker t;
  op r = rx->stream_recv(got.data() + big, big + 1000, big + 1000, nullptr,
                         stream_params(t, request_stream_waitall));
  BOOST_REQUIRE(!r.failed());
  BOOST_CHECK(p.finish(s2) == status::ok);
  if (r.pending()) {
    BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
    BOOST_CHECK(t.st == status::ok);
    p.b->release(r.req);
  }
  BOOST_CHECK(p.finish(s3) == status::ok);
  // The last one parked too (nothing buffered): stream_recv_data reads it to lend it.
  BOOST_REQUIRE(p.until([&] { return p.b->stream_poll(&e, 1) == 1 && e.length == big; }));
  size_t taken = 0;
  std::vector<void*> lent;
  BOOST_REQUIRE(p.until([&] {
    size_t length = 0;
    if (void* block = rx->stream_recv_data(&length)) {
      std::memcpy(got.data() + 2 * big + 1000 + taken, block, length);
      taken += length;
      lent.push_back(block);
    }
    return taken == big;
  }));
  for (void* block : lent) BOOST_CHECK(rx->stream_data_release(block) == status::ok);
  BOOST_CHECK(p.finish(s4) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), got.size(), 28), -1);
}

// An endpoint released with an announcement parked on it: the sender's send fails (its peer is
// gone), nothing leaks.
BOOST_DATA_TEST_CASE(closing_drops_a_parked_announcement, each_transport(), tl_name) {
  worker_pair p(tl_name, [](config& cfg) { cfg.limits.stream_rx_ep_max_bytes = 200000; });
  endpoint* rx = receiver(p);
  const std::vector<uint8_t> data = pattern(150000, 29);
  op s = p.ab->stream_send(data.data(), data.size(), forced_rndv());  // past 100000: parked
  BOOST_REQUIRE(s.pending());
  stream_poll_entry e;
  BOOST_REQUIRE(p.until([&] { return p.b->stream_poll(&e, 1) == 1; }));
  BOOST_CHECK(p.finish(rx->close()) == status::ok);
  const status st = p.finish(s);
  BOOST_CHECK(st != status::ok && st != status::timed_out);
  BOOST_CHECK_EQUAL(p.b->stream_poll(&e, 1), 0u);
}

BOOST_AUTO_TEST_SUITE_END()

// -- kept transport descriptors ------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(kept_descriptors)

// Bytes no receive waits for keep the transport's descriptor when it lends one (no copy);
// stream_recv_data lends that descriptor to the user, stream_data_release gives it back.
BOOST_DATA_TEST_CASE(recv_data_lends_a_kept_descriptor, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const size_t size = p.bcopy_payload();
  const bool keepable = size * 2 >= p.attr().max_bcopy && p.attr().max_bcopy <= 65536 &&
                        p.attr().max_am_descs > 0;
  const std::vector<uint8_t> data = pattern(2 * size, 26);
  const detail::stream_counters before = counts(*p.b);
  send_sync(p, p.ab, data.data(), size);
  send_sync(p, p.ab, data.data() + size, size);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == 2 * size; }));
  BOOST_CHECK_EQUAL(kept(*p.b), keepable ? 2u : 0u);
  BOOST_CHECK_EQUAL(counts(*p.b).kept_descs, before.kept_descs + (keepable ? 2 : 0));
  BOOST_CHECK_EQUAL(counts(*p.b).copied_bytes, before.copied_bytes + (keepable ? 0 : 2 * size));
  // The first one, lent: its bytes are the first send's.
  size_t length = 0;
  void* first = rx->stream_recv_data(&length);
  BOOST_REQUIRE(first != nullptr);
  BOOST_REQUIRE(length > 0 && length <= size);
  BOOST_CHECK_EQUAL(first_mismatch(first, length, 26), -1);
  BOOST_CHECK_EQUAL(kept(*p.b), keepable ? 2u : 0u);  // lent, still the transport's
  // The rest received with a copy: a descriptor emptied goes back at once.
  std::vector<uint8_t> got(2 * size - length, 0);
  size_t n = 0;
  BOOST_CHECK(rx->stream_recv(got.data(), got.size(), got.size(), &n).done());
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), got.size(), 26, length), -1);
  BOOST_CHECK_EQUAL(kept(*p.b), keepable ? 1u : 0u);
  BOOST_CHECK(rx->stream_data_release(first) == status::ok);
  BOOST_CHECK_EQUAL(kept(*p.b), 0u);
  BOOST_CHECK(rx->stream_data_release(first) == status::invalid_param);
  // The transport lends again after the releases: a third send is kept as well.
  send_sync(p, p.ab, data.data(), size);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.b) == size; }));
  BOOST_CHECK_EQUAL(kept(*p.b), keepable ? 1u : 0u);
  const std::string info = p.b->info();
  BOOST_CHECK_MESSAGE(info.find("transport descriptors kept") != std::string::npos, info);
}

// Descriptors kept in the buffer go back when the endpoint is released; one lent to the user
// stays valid until released, and one never released goes with the worker (LeakSanitizer checks).
// b streams to a's own endpoint (which a peer's close fails but does not release).
BOOST_DATA_TEST_CASE(close_and_failure_release_kept_descriptors, each_transport(), tl_name) {
  worker_pair p(tl_name);
  endpoint* rx = receiver(p);
  const size_t size = p.bcopy_payload();
  const std::vector<uint8_t> data = pattern(size, 27);
  for (int i = 0; i < 3; ++i) send_sync(p, rx, data.data(), size);
  BOOST_REQUIRE(p.until([&] { return buffered_total(*p.a) == 3 * size; }));
  size_t length = 0;
  void* lent = p.ab->stream_recv_data(&length);
  BOOST_REQUIRE(lent != nullptr);
  const size_t lent_kept = kept(*p.a) == 0 ? 0 : 1;
  // The peer closes: the buffered bytes stay receivable on the failed endpoint...
  BOOST_CHECK(p.finish(rx->close()) == status::ok);
  BOOST_REQUIRE(p.until([&] { return p.ab->state() != status::ok; }));
  BOOST_CHECK_EQUAL(buffered_total(*p.a), 3 * size - length);
  std::vector<uint8_t> got(size, 0);
  size_t n = 0;
  BOOST_CHECK(p.ab->stream_recv(got.data(), size, size, &n).done());
  BOOST_CHECK_EQUAL(first_mismatch(got.data(), size, 27, length % size), -1);
  // ...until the endpoint is released: what it still buffers goes back to the transport.
  BOOST_CHECK(p.finish(p.ab->close()) == status::ok);
  p.spin(4);
  BOOST_CHECK_EQUAL(kept(*p.a), lent_kept);
  BOOST_CHECK_EQUAL(first_mismatch(lent, length, 27), -1);  // still the user's
  // Given back through another endpoint of the worker: release names only the data.
  endpoint* other = worker_pair::receiving_ep(*p.a, p.ba);
  BOOST_REQUIRE(other != nullptr);
  BOOST_CHECK(other->stream_data_release(lent) == status::ok);
  BOOST_CHECK_EQUAL(kept(*p.a), 0u);
  // A lent descriptor kept past the worker's end goes with it.
  send_sync(p, p.ba, data.data(), size);
  stream_poll_entry e;
  BOOST_REQUIRE(p.until([&] { return p.a->stream_poll(&e, 1) == 1 && e.length == size; }));
  BOOST_CHECK(e.ep->stream_recv_data(&length) != nullptr);
}

BOOST_AUTO_TEST_SUITE_END()
