// Malformed input from the wire: garbage, truncated headers, malformed root pointers, oversized
// lengths, unknown endpoint ids and out-of-sequence fragments, fed straight into the worker's
// receive handlers (8-byte aligned, as transports deliver them) and through a real transport.
// Nothing may crash; every malformed message is counted; an endpoint named by a hostile header
// fails with PROTOCOL_ERROR (its error handler told); the worker keeps serving its other
// endpoints and new ones. Also worker::query_address and connect on bad addresses.
#define BOOST_TEST_MODULE wire_validation
#include "fixture.hpp"

#include <algorithm>
#include <random>

using namespace comm;
using namespace comm::test;

namespace wire_test {

using test::proto_id;

/// A message as a transport hands it over: 8-byte aligned bytes.
struct wire_msg {
  std::vector<uint64_t> words;
  size_t length = 0;
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
};

/// Raw bytes as a message.
wire_msg raw(const std::vector<uint8_t>& bytes) {
  wire_msg m;
  m.length = bytes.size();
  m.words.assign(bytes.size() / 8 + 1, 0);
  if (!bytes.empty()) std::memcpy(m.data(), bytes.data(), bytes.size());
  return m;
}

/// A header of type Struct filled by `fill`, followed by `payload`.
template <class Struct, class Fill>
wire_msg header(Fill&& fill, const std::vector<uint8_t>& payload = {}) {
  wire::header_writer<Struct> w;
  fill(w.fields());
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(w.bytes()),
                             static_cast<const uint8_t*>(w.bytes()) + w.size());
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return raw(bytes);
}

/// Every wire id the worker's protocol modules registered a receive handler for.
std::vector<proto_id> all_ids(worker& w) {
  std::vector<proto_id> ids;
  for (tl::am_id id : detail::impl(w).wire_ids()) ids.push_back(static_cast<proto_id>(id));
  return ids;
}

void feed(worker& w, proto_id id, const wire_msg& m) { test::feed(w, id, m.data(), m.length); }

size_t pack_bytes(void* dest, void* arg) {
  const auto* m = static_cast<const wire_msg*>(arg);
  std::memcpy(dest, m->data(), m->length);
  return m->length;
}

/// Sends `m` as transport AM `id` on the lane of `ep`: the peer's real receive path gets it.
void send_raw(endpoint* ep, proto_id id, const wire_msg& m) {
  tl::ep& lane = *detail::impl(*ep).lane;
  const ssize_t n = lane.am_bcopy(static_cast<tl::am_id>(id), pack_bytes,
                                  const_cast<wire_msg*>(&m));
  BOOST_REQUIRE_MESSAGE(n >= 0, "raw send: " << to_string(static_cast<status>(n)));
}

uint64_t protocol_errors(worker& w) { return detail::impl(w).protocol_errors; }

/// A worker pair plus the endpoint of b that receives what ab sends (the victim of hostile
/// headers), with an error handler installed.
struct victim_pair {
  explicit victim_pair(const std::string& tl_name) : p(tl_name) {
    victim = worker_pair::receiving_ep(*p.b, p.ab);
    BOOST_REQUIRE(victim != nullptr);
    victim->set_error_handler(record_error, &errors);
    dst = victim->id;
  }
  worker_pair p;
  detail::endpoint_impl* victim = nullptr;
  uint32_t dst = 0;
  error_log errors;
};

/// Counts AM handler calls.
status count_am(void* arg, const void*, size_t, void*, size_t, const am_recv_params&) {
  ++*static_cast<int*>(arg);
  return status::ok;
}

/// Checks that b still serves its other endpoint (b to a) and a brand-new worker connecting to it.
void check_b_still_works(worker_pair& p) {
  // b -> a over b's own endpoint.
  uint64_t got = 0;
  const uint64_t v = 0xA11CE;
  op r = p.a->tag_recv(&got, 8, 0x77, tag_mask_full);
  BOOST_CHECK(p.ba->tag_send(0x77, &v, 8).done());
  BOOST_CHECK(p.finish(r) == status::ok);
  BOOST_CHECK_EQUAL(got, v);
  // A new worker c, connected both ways with b.
  auto c = worker::create(*p.ctx).value();
  endpoint *cb = nullptr, *bc = nullptr;
  BOOST_REQUIRE(c->connect(p.b->address(), &cb) == status::ok);
  BOOST_REQUIRE(p.b->connect(c->address(), &bc) == status::ok);
  auto all = [&] {
    p.progress();
    c->progress();
  };
  BOOST_REQUIRE(spin_until(all, [&] { return worker_pair::wired(cb) && worker_pair::wired(bc); }));
  const std::vector<uint8_t> data = pattern(3 * p.bcopy_payload(), 5);
  std::vector<uint8_t> in(data.size());
  recv_tracker rt;
  op rb = p.b->tag_recv(in.data(), in.size(), 0x78, tag_mask_full, recv_params(rt));
  op s = cb->tag_send(0x78, data.data(), data.size());
  BOOST_REQUIRE(spin_until(all, [&] {
    return rt.calls > 0 && (!s.pending() || c->request_status(s.req) != status::in_progress);
  }));
  BOOST_CHECK(rt.st == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(in.data(), in.size(), 5), -1);
  p.b->release(rb.req);
  if (s.pending()) c->release(s.req);
  uint64_t back = 0;
  op rc = c->tag_recv(&back, 8, 0x79, tag_mask_full);
  BOOST_CHECK(bc->tag_send(0x79, &v, 8).done());
  BOOST_REQUIRE(spin_until(all, [&] { return c->request_status(rc.req) != status::in_progress; }));
  BOOST_CHECK(c->request_status(rc.req) == status::ok);
  c->release(rc.req);
  BOOST_CHECK_EQUAL(back, v);
  // b's endpoint to c goes away with c.
  op closed = bc->close();
  spin_until(all, [&] { return !closed.pending() || p.b->request_status(closed.req) != status::in_progress; });
  if (closed.pending()) p.b->release(closed.req);
  c.reset();
  p.spin(10);
}

/// Fails the victim with a hostile header and checks the consequences.
template <class Attack>
void check_endpoint_fails(const std::string& tl_name, const char* what, Attack&& attack) {
  BOOST_TEST_CONTEXT(what) {
    victim_pair v(tl_name);
    const uint64_t before = protocol_errors(*v.p.b);
    attack(v);
    BOOST_CHECK_EQUAL(protocol_errors(*v.p.b), before + 1);
    BOOST_CHECK_EQUAL(v.errors.calls, 1);
    BOOST_CHECK(v.errors.reason == status::protocol_error);
    BOOST_CHECK(v.victim->endpoint::state() == status::protocol_error);
    BOOST_CHECK_GE(v.victim->counters().errors, 1u);
    // Later messages on the failed connection are not delivered.
    const uint64_t x = 1;
    (void)v.p.ab->tag_send(0x66, &x, 8);
    v.p.spin(50);
    BOOST_CHECK(!v.p.b->tag_probe(0x66, tag_mask_full, nullptr));
    check_b_still_works(v.p);
  }
}

}  // namespace wire_test

using namespace wire_test;

BOOST_AUTO_TEST_SUITE(garbage)

BOOST_DATA_TEST_CASE(random_bytes_into_every_handler, each_transport(), tl_name) {
  worker_pair p(tl_name);
  int am_calls = 0;
  for (uint16_t id = 0; id < 64; ++id) {
    BOOST_REQUIRE(p.b->set_am_handler(id, count_am, &am_calls) == status::ok);
  }
  std::mt19937_64 rng(12345);
  // Empty input: every handler counts exactly one error.
  for (proto_id id : all_ids(*p.b)) {
    const uint64_t before = protocol_errors(*p.b);
    wire_msg empty;
    empty.words.assign(1, 0);
    feed(*p.b, id, empty);
    BOOST_CHECK_MESSAGE(protocol_errors(*p.b) == before + 1,
                        "empty message to handler " << int(id) << " not counted");
  }
  for (int round = 0; round < 3000; ++round) {
    std::vector<uint8_t> bytes(rng() % 300);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    for (proto_id id : all_ids(*p.b)) feed(*p.b, id, raw(bytes));
  }
  BOOST_CHECK_GT(protocol_errors(*p.b), 3000u);
  // Nothing a connected endpoint owns was touched: random ids name none of them.
  BOOST_CHECK(p.ab->state() == status::ok);
  BOOST_CHECK(p.ba->state() == status::ok);
  BOOST_CHECK(worker_pair::receiving_ep(*p.b, p.ab)->endpoint::state() == status::ok);
  BOOST_CHECK(tag_roundtrip(p, 1000, 1, true));
  check_b_still_works(p);
}

BOOST_DATA_TEST_CASE(random_bytes_through_the_transport, each_transport(), tl_name) {
  worker_pair p(tl_name);
  std::mt19937_64 rng(777);
  const uint64_t before = protocol_errors(*p.b);
  int sent = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<uint8_t> bytes(rng() % 200);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    for (proto_id id : all_ids(*p.b)) {
      send_raw(p.ab, id, raw(bytes));
      ++sent;
      p.spin(2);
    }
  }
  p.spin(100);
  BOOST_CHECK_GT(protocol_errors(*p.b), before);
  BOOST_CHECK(p.ab->state() == status::ok);
  BOOST_CHECK(tag_roundtrip(p, 5000, 2, true));
  check_b_still_works(p);
}

BOOST_DATA_TEST_CASE(mutated_valid_headers, each_transport(), tl_name) {
  // Valid messages for a live endpoint with random bytes flipped: anything may happen to that
  // endpoint, but nothing may crash or leak, and the worker keeps serving others.
  victim_pair v(tl_name);
  int am_calls = 0;
  BOOST_REQUIRE(v.p.b->set_am_handler(3, count_am, &am_calls, am_flag_whole_msg) == status::ok);
  const std::vector<uint8_t> payload = pattern(64, 1);
  const uint32_t dst = v.dst;
  std::vector<std::pair<proto_id, wire_msg>> seeds;
  seeds.emplace_back(proto_id::tag_eager, header<wire::schema::TagEager>([&](auto f) {
                       f.setDstEp(dst);
                       f.setTag(1);
                     }, payload));
  seeds.emplace_back(proto_id::tag_eager_imm, header<wire::schema::TagEagerImm>([&](auto f) {
                       f.setDstEp(dst);
                       f.setTag(1);
                       f.setImm(2);
                     }, payload));
  seeds.emplace_back(proto_id::tag_eager_first, header<wire::schema::TagEagerFirst>([&](auto f) {
                       f.setDstEp(dst);
                       f.setTag(1);
                       f.setMsgId(9);
                       f.setTotalLength(128);
                     }, payload));
  seeds.emplace_back(proto_id::tag_fragment, header<wire::schema::FragmentMiddle>([&](auto f) {
                       f.setDstEp(dst);
                       f.setMsgId(9);
                       f.setOffset(64);
                     }, payload));
  seeds.emplace_back(proto_id::am_single, header<wire::schema::ActiveMessage>([&](auto f) {
                       f.setDstEp(dst);
                       f.setAmId(3);
                       f.setHeaderLength(8);
                     }, payload));
  seeds.emplace_back(proto_id::am_first, header<wire::schema::ActiveMessageFirst>([&](auto f) {
                       f.setDstEp(dst);
                       f.setAmId(3);
                       f.setHeaderLength(8);
                       f.setMsgId(10);
                       f.setTotalLength(128);
                     }, payload));
  seeds.emplace_back(proto_id::am_fragment, header<wire::schema::FragmentMiddle>([&](auto f) {
                       f.setDstEp(dst);
                       f.setMsgId(10);
                       f.setOffset(64);
                     }, payload));
  std::mt19937_64 rng(4242);
  for (int round = 0; round < 20000; ++round) {
    auto [id, m] = seeds[rng() % seeds.size()];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      // Mostly in the header words, where the lengths and ids are.
      const size_t at = (rng() % 4 != 0) ? rng() % std::min<size_t>(m.length, 48) : rng() % m.length;
      m.data()[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    if (rng() % 8 == 0) m.length = rng() % (m.length + 1);  // and sometimes truncated
    feed(*v.p.b, id, m);
  }
  BOOST_CHECK_GT(protocol_errors(*v.p.b), 0u);
  check_b_still_works(v.p);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(headers)

BOOST_DATA_TEST_CASE(truncated_headers_are_counted_not_delivered, each_transport(), tl_name) {
  victim_pair v(tl_name);
  int am_calls = 0;
  BOOST_REQUIRE(v.p.b->set_am_handler(3, count_am, &am_calls) == status::ok);
  const uint32_t dst = v.dst;
  const std::vector<std::pair<proto_id, wire_msg>> valid = {
      {proto_id::tag_eager, header<wire::schema::TagEager>([&](auto f) {
         f.setDstEp(dst);
         f.setTag(5);
       })},
      {proto_id::tag_eager_imm, header<wire::schema::TagEagerImm>([&](auto f) {
         f.setDstEp(dst);
         f.setTag(5);
       })},
      {proto_id::tag_eager_first, header<wire::schema::TagEagerFirst>([&](auto f) {
         f.setDstEp(dst);
         f.setTag(5);
         f.setTotalLength(10);
       })},
      {proto_id::tag_fragment, header<wire::schema::FragmentMiddle>([&](auto f) { f.setDstEp(dst); })},
      {proto_id::am_single, header<wire::schema::ActiveMessage>([&](auto f) {
         f.setDstEp(dst);
         f.setAmId(3);
       })},
      {proto_id::am_first, header<wire::schema::ActiveMessageFirst>([&](auto f) {
         f.setDstEp(dst);
         f.setAmId(3);
         f.setTotalLength(10);
       })},
      {proto_id::am_fragment, header<wire::schema::FragmentMiddle>([&](auto f) { f.setDstEp(dst); })},
      {proto_id::wireup_reply, header<wire::schema::WireupReply>([&](auto f) { f.setDstEp(dst); })},
      {proto_id::ep_close, header<wire::schema::EndpointClose>([&](auto f) { f.setDstEp(dst); })},
  };
  for (const auto& [id, m] : valid) {
    for (size_t cut = 0; cut < m.length; ++cut) {
      BOOST_TEST_CONTEXT("handler " << int(id) << " cut at " << cut) {
        wire_msg t = m;
        t.length = cut;
        const uint64_t before = protocol_errors(*v.p.b);
        feed(*v.p.b, id, t);
        BOOST_CHECK_EQUAL(protocol_errors(*v.p.b), before + 1);
      }
    }
  }
  BOOST_CHECK_EQUAL(am_calls, 0);
  BOOST_CHECK_EQUAL(detail::impl(*v.p.b).matcher.unexpected_count(), 0u);
  // A truncated header names no endpoint: none failed.
  BOOST_CHECK_EQUAL(v.errors.calls, 0);
  BOOST_CHECK(v.victim->endpoint::state() == status::ok);
  BOOST_CHECK(tag_roundtrip(v.p, 100, 3, false));
}

BOOST_DATA_TEST_CASE(malformed_root_pointers_are_rejected, each_transport(), tl_name) {
  victim_pair v(tl_name);
  const uint32_t dst = v.dst;
  const wire_msg good = header<wire::schema::TagEager>([&](auto f) {
    f.setDstEp(dst);
    f.setTag(6);
  }, pattern(16, 1));
  auto with_root = [&](uint64_t root) {
    wire_msg m = good;
    std::memcpy(m.data(), &root, sizeof(root));
    return m;
  };
  const uint64_t data_words = 2;  // TagEager's data section
  const std::vector<uint64_t> bad_roots = {
      (data_words << 32) | (1u << 2),           // non-zero offset
      (data_words << 32) | 1u,                  // a list pointer, not a struct
      (data_words << 32) | 2u,                  // a far pointer
      (data_words << 32) | (1ull << 48),        // a pointer section
      (1ull << 32),                             // data section smaller than ours
      (0xFFFFull << 32),                        // data section past the message
      ~0ull,
  };
  for (uint64_t root : bad_roots) {
    BOOST_TEST_CONTEXT("root " << std::hex << root) {
      const uint64_t before = protocol_errors(*v.p.b);
      feed(*v.p.b, proto_id::tag_eager, with_root(root));
      BOOST_CHECK_EQUAL(protocol_errors(*v.p.b), before + 1);
    }
  }
  BOOST_CHECK_EQUAL(detail::impl(*v.p.b).matcher.unexpected_count(), 0u);
  // Misaligned input is refused too (transports deliver 8-byte aligned data).
  wire_msg shifted;
  shifted.words.assign(good.words.size() + 1, 0);
  std::memcpy(shifted.data() + 1, good.data(), good.length);
  const uint64_t before = protocol_errors(*v.p.b);
  feed(*v.p.b, proto_id::tag_eager, shifted.data() + 1, good.length);
  BOOST_CHECK_EQUAL(protocol_errors(*v.p.b), before + 1);
  // A larger data section (a newer peer's header) is accepted; the payload follows it.
  wire_msg newer;
  newer.words.assign(good.words.size() + 2, 0);
  const uint64_t root = (data_words + 1) << 32;
  std::memcpy(newer.data(), &root, 8);
  std::memcpy(newer.data() + 8, good.data() + 8, 16);       // dstEp, tag
  std::memcpy(newer.data() + 32, good.data() + 24, 16);     // payload after the extra word
  newer.length = good.length + 8;
  feed(*v.p.b, proto_id::tag_eager, newer);
  uint8_t in[16] = {};
  tag_recv_info info{};
  request_params rp;
  rp.recv_info = &info;
  BOOST_CHECK(v.p.b->tag_recv(in, sizeof(in), 6, tag_mask_full, rp).done());
  BOOST_CHECK_EQUAL(info.length, 16u);
  BOOST_CHECK_EQUAL(first_mismatch(in, 16, 1), -1);
  BOOST_CHECK(v.victim->endpoint::state() == status::ok);
  // The well-formed original is delivered.
  feed(*v.p.b, proto_id::tag_eager, good);
  BOOST_CHECK(v.p.b->tag_recv(in, sizeof(in), 6, tag_mask_full).done());
}

BOOST_DATA_TEST_CASE(unknown_endpoint_ids, each_transport(), tl_name) {
  victim_pair v(tl_name);
  int am_calls = 0;
  BOOST_REQUIRE(v.p.b->set_am_handler(3, count_am, &am_calls) == status::ok);
  // Never used, an index past the table, and the victim's index with a stale generation.
  const uint32_t stale = (v.dst & 0xFFFFFu) | (((v.dst >> 20) + 7) & 0xFFFu) << 20;
  for (uint32_t dst : {0u, 12345u, 0xFFFFFFFFu, v.dst & 0xFFFFFu, stale}) {
    if (dst == v.dst) continue;
    BOOST_TEST_CONTEXT("dstEp " << dst) {
      const std::vector<std::pair<proto_id, wire_msg>> msgs = {
          {proto_id::tag_eager, header<wire::schema::TagEager>([&](auto f) {
             f.setDstEp(dst);
             f.setTag(7);
           }, pattern(8, 1))},
          {proto_id::tag_eager_imm, header<wire::schema::TagEagerImm>([&](auto f) {
             f.setDstEp(dst);
             f.setTag(7);
           })},
          {proto_id::tag_eager_first, header<wire::schema::TagEagerFirst>([&](auto f) {
             f.setDstEp(dst);
             f.setTag(7);
             f.setTotalLength(100);
           }, pattern(8, 1))},
          {proto_id::tag_fragment, header<wire::schema::FragmentMiddle>([&](auto f) {
             f.setDstEp(dst);
           }, pattern(8, 1))},
          {proto_id::am_single, header<wire::schema::ActiveMessage>([&](auto f) {
             f.setDstEp(dst);
             f.setAmId(3);
           })},
          {proto_id::am_first, header<wire::schema::ActiveMessageFirst>([&](auto f) {
             f.setDstEp(dst);
             f.setAmId(3);
             f.setTotalLength(100);
           }, pattern(8, 1))},
          {proto_id::am_fragment, header<wire::schema::FragmentMiddle>([&](auto f) {
             f.setDstEp(dst);
           }, pattern(8, 1))},
          {proto_id::wireup_reply, header<wire::schema::WireupReply>([&](auto f) {
             f.setDstEp(dst);
             f.setSrcEp(1);
           })},
      };
      for (const auto& [id, m] : msgs) {
        const uint64_t before = protocol_errors(*v.p.b);
        feed(*v.p.b, id, m);
        BOOST_CHECK_MESSAGE(protocol_errors(*v.p.b) == before + 1,
                            "handler " << int(id) << " did not count the unknown endpoint");
      }
      // A close for an unknown endpoint is ignored (closes may cross).
      feed(*v.p.b, proto_id::ep_close,
           header<wire::schema::EndpointClose>([&](auto f) { f.setDstEp(dst); }));
    }
  }
  BOOST_CHECK_EQUAL(am_calls, 0);
  BOOST_CHECK_EQUAL(detail::impl(*v.p.b).matcher.unexpected_count(), 0u);
  BOOST_CHECK_EQUAL(v.errors.calls, 0);
  BOOST_CHECK(v.victim->endpoint::state() == status::ok);
  BOOST_CHECK(tag_roundtrip(v.p, 100, 4, true));
}

BOOST_DATA_TEST_CASE(messages_for_a_just_closed_endpoint_are_dropped_quietly, each_transport(),
                     tl_name) {
  victim_pair v(tl_name);
  int am_calls = 0;
  BOOST_REQUIRE(v.p.b->set_am_handler(3, count_am, &am_calls) == status::ok);
  const uint32_t closed = v.dst;
  BOOST_CHECK(v.p.finish(v.victim->close()) != status::timed_out);
  v.p.spin(20);
  const uint64_t errors = protocol_errors(*v.p.b);
  const uint64_t late = detail::impl(*v.p.b).late_messages;
  // Messages the peer sent before it learnt of the close: expected, not malformed.
  feed(*v.p.b, proto_id::am_single, header<wire::schema::ActiveMessage>([&](auto f) {
         f.setDstEp(closed);
         f.setAmId(3);
       }));
  feed(*v.p.b, proto_id::tag_eager, header<wire::schema::TagEager>([&](auto f) {
         f.setDstEp(closed);
         f.setTag(7);
       }, pattern(8, 1)));
  BOOST_CHECK_EQUAL(protocol_errors(*v.p.b), errors);
  BOOST_CHECK_EQUAL(detail::impl(*v.p.b).late_messages, late + 2);
  BOOST_CHECK_EQUAL(am_calls, 0);
  BOOST_CHECK(!v.p.b->tag_probe(7, tag_mask_full, nullptr));
  // An id that never existed is still malformed.
  feed(*v.p.b, proto_id::am_single, header<wire::schema::ActiveMessage>([&](auto f) {
         f.setDstEp(12345);
         f.setAmId(3);
       }));
  BOOST_CHECK_EQUAL(protocol_errors(*v.p.b), errors + 1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hostile_lengths)

BOOST_DATA_TEST_CASE(oversized_and_inconsistent_lengths_fail_the_endpoint, each_transport(),
                     tl_name) {
  check_endpoint_fails(tl_name, "tag first fragment with a huge total length", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first,
         header<wire::schema::TagEagerFirst>([&](auto f) {
           f.setDstEp(v.dst);
           f.setTag(1);
           f.setMsgId(1);
           f.setTotalLength(1ull << 40);
         }, pattern(16, 1)));
  });
  check_endpoint_fails(tl_name, "tag first fragment longer than its total", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first,
         header<wire::schema::TagEagerFirst>([&](auto f) {
           f.setDstEp(v.dst);
           f.setTag(1);
           f.setMsgId(1);
           f.setTotalLength(8);
         }, pattern(16, 1)));
  });
  check_endpoint_fails(tl_name, "AM user header beyond the message", [](victim_pair& v) {
    feed(*v.p.b, proto_id::am_single, header<wire::schema::ActiveMessage>([&](auto f) {
           f.setDstEp(v.dst);
           f.setAmId(1);
           f.setHeaderLength(0xFFFFFFFFu);
         }, pattern(16, 1)));
  });
  check_endpoint_fails(tl_name, "AM first fragment with a huge total", [](victim_pair& v) {
    feed(*v.p.b, proto_id::am_first, header<wire::schema::ActiveMessageFirst>([&](auto f) {
           f.setDstEp(v.dst);
           f.setAmId(1);
           f.setHeaderLength(4);
           f.setMsgId(1);
           f.setTotalLength(~0ull);
         }, pattern(16, 1)));
  });
  check_endpoint_fails(tl_name, "AM first fragment header beyond the fragment", [](victim_pair& v) {
    feed(*v.p.b, proto_id::am_first, header<wire::schema::ActiveMessageFirst>([&](auto f) {
           f.setDstEp(v.dst);
           f.setAmId(1);
           f.setHeaderLength(100);
           f.setMsgId(1);
           f.setTotalLength(1000);
         }, pattern(16, 1)));
  });
  check_endpoint_fails(tl_name, "AM first fragment longer than its total", [](victim_pair& v) {
    feed(*v.p.b, proto_id::am_first, header<wire::schema::ActiveMessageFirst>([&](auto f) {
           f.setDstEp(v.dst);
           f.setAmId(1);
           f.setHeaderLength(4);
           f.setMsgId(1);
           f.setTotalLength(10);
         }, pattern(16, 1)));
  });
  check_endpoint_fails(tl_name, "hostile header through the transport", [](victim_pair& v) {
    send_raw(v.p.ab, proto_id::tag_eager_first,
             header<wire::schema::TagEagerFirst>([&](auto f) {
               f.setDstEp(v.dst);
               f.setTag(1);
               f.setMsgId(1);
               f.setTotalLength(1ull << 62);
             }, pattern(16, 1)));
    BOOST_REQUIRE(v.p.until([&] { return v.errors.calls > 0; }));
  });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sequence)

namespace sequence_test {
/// `length` bytes of pattern `seed` starting at byte `offset` of the pattern.
std::vector<uint8_t> pattern_at(size_t length, uint32_t seed, size_t offset) {
  std::vector<uint8_t> out(length);
  for (size_t i = 0; i < length; ++i) out[i] = pattern_byte(offset + i, seed);
  return out;
}
wire_msg first_tag(uint32_t dst, uint64_t msg_id, uint64_t total, size_t payload, tag_t tag = 1) {
  return header<wire::schema::TagEagerFirst>([&](auto f) {
    f.setDstEp(dst);
    f.setTag(tag);
    f.setMsgId(msg_id);
    f.setTotalLength(total);
  }, pattern(payload, 1));
}
wire_msg first_am(uint32_t dst, uint64_t msg_id, uint64_t total, size_t payload) {
  return header<wire::schema::ActiveMessageFirst>([&](auto f) {
    f.setDstEp(dst);
    f.setAmId(3);
    f.setMsgId(msg_id);
    f.setTotalLength(total);
  }, pattern(payload, 1));
}
wire_msg middle(uint32_t dst, uint64_t msg_id, uint64_t offset, size_t payload) {
  return header<wire::schema::FragmentMiddle>([&](auto f) {
    f.setDstEp(dst);
    f.setMsgId(msg_id);
    f.setOffset(offset);
  }, pattern_at(payload, 1, offset));
}
}  // namespace sequence_test
using namespace sequence_test;

BOOST_DATA_TEST_CASE(out_of_sequence_fragments_fail_the_endpoint, each_transport(), tl_name) {
  check_endpoint_fails(tl_name, "fragment without a first", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 1, 0, 8));
  });
  check_endpoint_fails(tl_name, "fragment at the wrong offset", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 100, 10));
    feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 5, 20, 10));
  });
  check_endpoint_fails(tl_name, "fragment of another message", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 100, 10));
    feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 6, 10, 10));
  });
  check_endpoint_fails(tl_name, "fragment beyond the total", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 100, 10));
    feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 5, 10, 200));
  });
  check_endpoint_fails(tl_name, "AM fragment during a tagged message", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 100, 10));
    feed(*v.p.b, proto_id::am_fragment, middle(v.dst, 5, 10, 10));
  });
  check_endpoint_fails(tl_name, "tag fragment during an AM", [](victim_pair& v) {
    int calls = 0;
    BOOST_REQUIRE(v.p.b->set_am_handler(3, count_am, &calls) == status::ok);
    feed(*v.p.b, proto_id::am_first, first_am(v.dst, 5, 100, 10));
    feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 5, 10, 10));
    BOOST_REQUIRE(v.p.b->set_am_handler(3, nullptr, nullptr) == status::ok);
  });
  check_endpoint_fails(tl_name, "new first fragment before the last one ended", [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 100, 10));
    feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 6, 100, 10));
  });
  check_endpoint_fails(tl_name, "new AM first during an unexpected tagged message",
                       [](victim_pair& v) {
    feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 100, 10));
    feed(*v.p.b, proto_id::am_first, first_am(v.dst, 6, 100, 10));
  });
}

BOOST_DATA_TEST_CASE(matched_receive_fails_with_the_endpoint, each_transport(), tl_name) {
  victim_pair v(tl_name);
  std::vector<uint8_t> in(100);
  recv_tracker rt;
  op r = v.p.b->tag_recv(in.data(), in.size(), 0xAB, tag_mask_full, recv_params(rt));
  feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 100, 10, 0xAB));
  BOOST_CHECK(r.req->as<detail::tag_recv_state>().matched);
  BOOST_CHECK(v.p.b->cancel(r.req) == status::busy);
  feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 5, 50, 10));
  BOOST_CHECK_EQUAL(rt.calls, 1);
  BOOST_CHECK(rt.st == status::protocol_error);
  BOOST_CHECK(v.victim->endpoint::state() == status::protocol_error);
  v.p.b->release(r.req);
  // A legitimate sequence on a healthy endpoint still works: first + middle + last.
  check_b_still_works(v.p);
}

BOOST_DATA_TEST_CASE(valid_fragment_sequence_is_delivered, each_transport(), tl_name) {
  victim_pair v(tl_name);
  feed(*v.p.b, proto_id::tag_eager_first, first_tag(v.dst, 5, 30, 10, 0xCD));
  feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 5, 10, 10));
  BOOST_CHECK(!v.p.b->tag_probe(0xCD, tag_mask_full, nullptr));  // not complete yet
  feed(*v.p.b, proto_id::tag_fragment, middle(v.dst, 5, 20, 10));
  std::vector<uint8_t> in(30);
  BOOST_CHECK(v.p.b->tag_recv(in.data(), in.size(), 0xCD, tag_mask_full).done());
  BOOST_CHECK_EQUAL(first_mismatch(in.data() + 10, 20, 1, 10), -1);
  BOOST_CHECK_EQUAL(v.errors.calls, 0);
  BOOST_CHECK(v.victim->endpoint::state() == status::ok);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(wireup)

BOOST_DATA_TEST_CASE(bad_wireup_messages, each_transport(), tl_name) {
  victim_pair v(tl_name);
  const size_t eps_before = std::count_if(detail::impl(*v.p.b).ep_table.begin(),
                                          detail::impl(*v.p.b).ep_table.end(),
                                          [](auto* e) { return e != nullptr; });
  // A well-formed request carrying an address that is garbage: no endpoint, no crash.
  {
    capnp::MallocMessageBuilder message;
    auto body = message.initRoot<wire::schema::WireupRequest>();
    body.setSrcEp(1);
    const std::vector<uint8_t> junk = pattern(40, 3);
    body.setAddress(kj::arrayPtr(junk.data(), junk.size()));
    auto words = capnp::messageToFlatArray(message);
    std::vector<uint8_t> bytes(words.asBytes().begin(), words.asBytes().end());
    feed(*v.p.b, proto_id::wireup_request, raw(bytes));
  }
  // A request whose segment table claims more than there is.
  {
    const std::vector<uint8_t> bytes = {0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0x0F, 0, 0, 0, 0, 0, 0, 0, 0};
    const uint64_t before = protocol_errors(*v.p.b);
    feed(*v.p.b, proto_id::wireup_request, raw(bytes));
    BOOST_CHECK_EQUAL(protocol_errors(*v.p.b), before + 1);
  }
  const size_t eps_after = std::count_if(detail::impl(*v.p.b).ep_table.begin(),
                                         detail::impl(*v.p.b).ep_table.end(),
                                         [](auto* e) { return e != nullptr; });
  BOOST_CHECK_EQUAL(eps_before, eps_after);
  // A reply for an endpoint that is not waiting for one is a protocol error of that endpoint.
  check_endpoint_fails(tl_name, "duplicate wireup reply", [](victim_pair& w) {
    feed(*w.p.b, proto_id::wireup_reply, header<wire::schema::WireupReply>([&](auto f) {
           f.setDstEp(w.dst);
           f.setSrcEp(1);
         }));
  });
}

BOOST_DATA_TEST_CASE(wireup_reply_status_fails_a_connecting_endpoint, each_transport(), tl_name) {
  // A refusal (an error status) fails the endpoint with it; a status that is not an error is
  // malformed: PROTOCOL_ERROR, never a failed endpoint whose state() reads as fine.
  const int16_t statuses[] = {static_cast<int16_t>(status::rejected),
                              static_cast<int16_t>(status::in_progress), 77};
  for (int16_t code : statuses) {
    BOOST_TEST_CONTEXT("status " << code) {
      worker_pair p(tl_name);
      endpoint* ep = nullptr;
      BOOST_REQUIRE(p.a->connect(p.b->address(), &ep) == status::ok);  // b does not answer yet
      BOOST_REQUIRE(!worker_pair::wired(ep));
      error_log errors;
      ep->set_error_handler(record_error, &errors);
      const uint32_t dst = detail::impl(*ep).id;
      feed(*p.a, proto_id::wireup_reply, header<wire::schema::WireupReply>([&](auto f) {
             f.setDstEp(dst);
             f.setSrcEp(1);
             f.setStatus(code);
           }));
      BOOST_CHECK_EQUAL(errors.calls, 1);
      BOOST_CHECK(is_error(ep->state()));
      BOOST_CHECK(is_error(errors.reason));
      if (is_error(static_cast<status>(code))) {
        BOOST_CHECK(ep->state() == static_cast<status>(code));
      } else {
        BOOST_CHECK(ep->state() == status::protocol_error);
      }
      // Sends on it fail at once; b's real reply, arriving later, is refused without harm.
      const uint64_t v = 1;
      BOOST_CHECK(ep->tag_send(1, &v, 8).failed());
      p.spin(50);
      BOOST_CHECK(is_error(ep->state()));
      BOOST_CHECK(tag_roundtrip(p, 64, 1, true));
    }
  }
}

BOOST_DATA_TEST_CASE(query_address_and_connect_reject_garbage, each_transport(), tl_name) {
  worker_pair p(tl_name);
  worker_address_attr attr;
  BOOST_CHECK(worker::query_address(nullptr, 0, &attr) == status::invalid_addr);
  std::mt19937_64 rng(99);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> junk(rng() % 256);
    for (uint8_t& b : junk) b = static_cast<uint8_t>(rng());
    const status st = worker::query_address(junk.data(), junk.size(), &attr);
    BOOST_CHECK(st == status::invalid_addr || st == status::ok);
  }
  const std::vector<uint8_t> zeros(64, 0);
  BOOST_CHECK(worker::query_address(zeros.data(), zeros.size(), &attr) == status::invalid_addr);
  const std::vector<uint8_t> ones(64, 0xFF);
  BOOST_CHECK(worker::query_address(ones.data(), ones.size(), &attr) == status::invalid_addr);
  // A real address: accepted and decoded; every truncation of it: refused.
  worker_params wp;
  wp.name = "queried";
  wp.client_id = 0xC11E;
  auto w = worker::create(*p.ctx, wp).value();
  const std::vector<uint8_t> address = w->address();
  BOOST_REQUIRE(worker::query_address(address.data(), address.size(), &attr) == status::ok);
  BOOST_CHECK_EQUAL(attr.uid, w->uid());
  BOOST_CHECK_EQUAL(attr.name, "queried");
  BOOST_CHECK_EQUAL(attr.client_id, 0xC11Eu);
  BOOST_REQUIRE_EQUAL(attr.transports.size(), 1u);
  BOOST_CHECK_EQUAL(attr.transports[0], tl_name);
  for (size_t cut = 0; cut < address.size(); ++cut) {
    BOOST_CHECK_MESSAGE(worker::query_address(address.data(), cut, &attr) == status::invalid_addr,
                        "truncated at " << cut);
  }
  // Bit flips: decoded or refused, never a crash.
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> bent = address;
    bent[rng() % bent.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    const status st = worker::query_address(bent.data(), bent.size(), &attr);
    BOOST_CHECK(st == status::invalid_addr || st == status::ok);
  }
  endpoint* ep = nullptr;
  BOOST_CHECK(p.a->connect(zeros, &ep) == status::invalid_addr);
  BOOST_CHECK(p.a->connect({}, &ep) == status::invalid_addr);
  BOOST_CHECK(p.a->connect(std::vector<uint8_t>(address.begin(), address.end() - 8), &ep) ==
              status::invalid_addr);
  BOOST_CHECK(p.a->connect(address, nullptr) == status::invalid_param);
}

BOOST_AUTO_TEST_SUITE_END()
