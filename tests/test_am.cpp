// Active messages over every transport: handlers per id, header + data, whole-message vs
// per-fragment delivery, persistent data, reply endpoints, unknown ids and data alignment.
#define BOOST_TEST_MODULE am
#include "fixture.hpp"

#include <comm/memory.hpp>

// These suites test the eager protocols: rendezvous is kept out of their way (see test_rndv).
using comm::test::eager_only_suite;
BOOST_TEST_GLOBAL_FIXTURE(eager_only_suite);

#include <algorithm>
#include <deque>
#include <map>
#include <set>

using namespace comm;
using namespace comm::test;
namespace am_test {}
using namespace am_test;

namespace am_test {

/// One call of an AM handler, with copies of what it was given.
struct am_call {
  std::vector<uint8_t> header;
  std::vector<uint8_t> data;
  const void* data_ptr = nullptr;
  am_recv_params params;
};

/// Records every call of the handlers it is installed for. Optionally keeps persistent data
/// (returns in_progress) or answers through the reply endpoint.
struct am_log {
  std::vector<am_call> calls;
  bool keep = false;                 ///< return in_progress for persistent data
  std::vector<void*> kept;           ///< data pointers kept
  bool reply = false;                ///< answer on the reply endpoint with id `reply_id`
  uint16_t reply_id = 0;
  std::vector<status> reply_status;  ///< what the replies returned
};

status record(void* arg, const void* header, size_t header_length, void* data, size_t length,
              const am_recv_params& params) {
  auto* log = static_cast<am_log*>(arg);
  am_call c;
  const auto* h = static_cast<const uint8_t*>(header);
  const auto* d = static_cast<const uint8_t*>(data);
  c.header.assign(h, h + header_length);
  c.data.assign(d, d + length);
  c.data_ptr = data;
  c.params = params;
  log->calls.push_back(std::move(c));
  if (log->reply && (params.attr & am_recv_reply_ep) && params.reply_ep != nullptr) {
    // Answer with the length of the data this call got.
    const uint64_t n = length;
    op o = params.reply_ep->am_send(log->reply_id, nullptr, 0, &n, sizeof(n));
    log->reply_status.push_back(o.st);
    // A short reply completes at once; anything else would outlive `n`.
    BOOST_CHECK(o.done());
  }
  if (log->keep && (params.attr & am_recv_data_persistent)) {
    log->kept.push_back(data);
    return status::in_progress;
  }
  return status::ok;
}

/// Concatenates the data of `calls` by offset; false if the pieces do not tile the message.
bool reassemble(const std::vector<am_call>& calls, std::vector<uint8_t>* out) {
  if (calls.empty()) return false;
  const size_t total = calls.front().params.total_length;
  out->assign(total, 0);
  size_t next = 0;
  for (const am_call& c : calls) {
    if (c.params.offset != next || c.params.total_length != total) return false;
    if (next + c.data.size() > total) return false;
    std::copy(c.data.begin(), c.data.end(), out->begin() + next);
    next += c.data.size();
  }
  return next == total;
}

/// Total errors counted by `w`'s endpoints.
uint64_t endpoint_errors(worker& w) {
  uint64_t n = 0;
  for (detail::endpoint_impl* ep : detail::impl(w).ep_table) {
    if (ep != nullptr) n += ep->counters_.errors;
  }
  return n;
}

/// True when `w` keeps no data for its handlers.
bool holds_no_data(worker& w) {
  return detail::module_of<detail::am_protocol>(detail::impl(w)).persistent_data().empty();
}

}  // namespace am_test

BOOST_AUTO_TEST_SUITE(handlers)

BOOST_DATA_TEST_CASE(handler_per_id_with_header_and_data, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log one, two;
  BOOST_REQUIRE(p.b->set_am_handler(1, record, &one) == status::ok);
  BOOST_REQUIRE(p.b->set_am_handler(2, record, &two) == status::ok);
  BOOST_CHECK(p.b->set_am_handler(3, record, &two, 1u << 7) == status::invalid_param);
  const std::vector<uint8_t> h1 = pattern(16, 1), d1 = pattern(100, 2);
  const std::vector<uint8_t> h2 = pattern(3, 3), d2 = pattern(1, 4);
  BOOST_CHECK(p.ab->am_send(1, h1.data(), h1.size(), d1.data(), d1.size()).done());
  BOOST_CHECK(p.ab->am_send(2, h2.data(), h2.size(), d2.data(), d2.size()).done());
  BOOST_CHECK(p.ab->am_send(1, nullptr, 0, nullptr, 0).done());         // empty
  BOOST_CHECK(p.ab->am_send(2, h1.data(), h1.size(), nullptr, 0).done());  // header only
  BOOST_CHECK(p.ab->am_send(2, nullptr, 0, d1.data(), d1.size()).done());  // data only
  BOOST_REQUIRE(p.until([&] { return one.calls.size() == 2 && two.calls.size() == 3; }));
  BOOST_CHECK(one.calls[0].header == h1);
  BOOST_CHECK(one.calls[0].data == d1);
  BOOST_CHECK(one.calls[0].params.attr & am_recv_first);
  BOOST_CHECK(!(one.calls[0].params.attr & am_recv_more));
  BOOST_CHECK(!(one.calls[0].params.attr & am_recv_reply_ep));
  BOOST_CHECK_EQUAL(one.calls[0].params.total_length, d1.size());
  BOOST_CHECK(one.calls[1].header.empty() && one.calls[1].data.empty());
  BOOST_CHECK(two.calls[0].header == h2);
  BOOST_CHECK(two.calls[0].data == d2);
  BOOST_CHECK(two.calls[1].header == h1 && two.calls[1].data.empty());
  BOOST_CHECK(two.calls[2].header.empty() && two.calls[2].data == d1);

  // Removing a handler: later messages for the id are dropped (and counted), others still work.
  BOOST_CHECK(p.b->set_am_handler(1, nullptr, nullptr) == status::ok);
  const uint64_t before = endpoint_errors(*p.b);
  BOOST_CHECK(p.ab->am_send(1, h1.data(), h1.size(), d1.data(), d1.size()).done());
  BOOST_CHECK(p.ab->am_send(2, h2.data(), h2.size(), d2.data(), d2.size()).done());
  BOOST_REQUIRE(p.until([&] { return two.calls.size() == 4; }));
  BOOST_CHECK_EQUAL(one.calls.size(), 2u);
  BOOST_CHECK_EQUAL(endpoint_errors(*p.b), before + 1);
}

BOOST_DATA_TEST_CASE(large_user_header, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log log;
  BOOST_REQUIRE(p.b->set_am_handler(7, record, &log) == status::ok);
  const size_t max_header = p.a->max_am_header();
  BOOST_REQUIRE_GT(max_header, 0u);
  uint32_t seed = 1;
  for (size_t hl : {size_t{1000}, size_t{1100}, size_t{2000}, max_header}) {
    for (size_t dl : {size_t{0}, size_t{8}, 3 * p.bcopy_payload()}) {
      BOOST_TEST_CONTEXT("header " << hl << " data " << dl) {
        const std::vector<uint8_t> h = pattern(hl, seed++), d = pattern(dl, seed++);
        log.calls.clear();
        op o = p.ab->am_send(7, h.data(), h.size(), d.data(), d.size());
        BOOST_CHECK_MESSAGE(!o.failed(), to_string(o.st));
        if (o.failed()) continue;
        BOOST_CHECK(p.finish(o) == status::ok);
        BOOST_REQUIRE(p.until([&] {
          return !log.calls.empty() &&
                 !(log.calls.back().params.attr & am_recv_more) &&
                 log.calls.back().params.offset + log.calls.back().data.size() == dl;
        }));
        std::vector<uint8_t> whole;
        BOOST_CHECK(reassemble(log.calls, &whole));
        BOOST_CHECK(whole == d);
        for (const am_call& c : log.calls) BOOST_CHECK(c.header == h);
      }
    }
  }
  const std::vector<uint8_t> too_big(max_header + 1, 1);
  BOOST_CHECK(p.ab->am_send(7, too_big.data(), too_big.size(), nullptr, 0).st ==
              status::invalid_param);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(fragments)

BOOST_DATA_TEST_CASE(whole_message_vs_per_fragment, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log whole, pieces;
  BOOST_REQUIRE(p.b->set_am_handler(10, record, &whole, am_flag_whole_msg) == status::ok);
  BOOST_REQUIRE(p.b->set_am_handler(11, record, &pieces) == status::ok);
  const std::vector<uint8_t> header = pattern(24, 9);
  for (uint32_t flags : {0u, uint32_t{request_force_bcopy}, uint32_t{request_force_zcopy}}) {
    for (size_t n : {3 * p.attr().max_bcopy + 17, size_t{1} << 20}) {
      BOOST_TEST_CONTEXT("size " << n << " flags " << flags) {
        whole.calls.clear();
        pieces.calls.clear();
        const std::vector<uint8_t> data = pattern(n, static_cast<uint32_t>(n + flags));
        request_params rp;
        rp.flags = flags;
        op o1 = p.ab->am_send(10, header.data(), header.size(), data.data(), data.size(), rp);
        op o2 = p.ab->am_send(11, header.data(), header.size(), data.data(), data.size(), rp);
        BOOST_REQUIRE(!o1.failed() && !o2.failed());
        BOOST_REQUIRE(p.until([&] {
          size_t got = 0;
          for (const am_call& c : pieces.calls) got += c.data.size();
          return whole.calls.size() == 1 && got == n;
        }));
        BOOST_CHECK(p.finish(o1) == status::ok);
        BOOST_CHECK(p.finish(o2) == status::ok);

        // Whole: one call with everything, first and last, data persistent (reassembled).
        const am_call& w = whole.calls.front();
        BOOST_CHECK(w.header == header);
        BOOST_CHECK(w.data == data);
        BOOST_CHECK_EQUAL(w.params.offset, 0u);
        BOOST_CHECK_EQUAL(w.params.total_length, n);
        BOOST_CHECK(w.params.attr & am_recv_first);
        BOOST_CHECK(!(w.params.attr & am_recv_more));

        // Per fragment: several calls (when the protocol used fragments the message), FIRST on
        // the first only, MORE on all but the last, contiguous offsets, one message id, the
        // header with each.
        const bool zcopy = (p.attr().caps & tl::cap_am_zcopy) &&
                           (flags == request_force_zcopy || (flags == 0 && n >= p.cfg.zcopy_thresh));
        const size_t piece = zcopy ? p.attr().max_zcopy : p.bcopy_payload() - header.size();
        if (n > piece) BOOST_CHECK_GT(pieces.calls.size(), 1u);
        std::vector<uint8_t> joined;
        BOOST_CHECK(reassemble(pieces.calls, &joined));
        BOOST_CHECK(joined == data);
        for (size_t i = 0; i < pieces.calls.size(); ++i) {
          const am_recv_params& prm = pieces.calls[i].params;
          BOOST_CHECK_EQUAL(bool(prm.attr & am_recv_first), i == 0);
          BOOST_CHECK_EQUAL(bool(prm.attr & am_recv_more), i + 1 < pieces.calls.size());
          BOOST_CHECK_EQUAL(prm.message_id, pieces.calls[0].params.message_id);
          BOOST_CHECK(pieces.calls[i].header == header);
        }
      }
    }
  }
  // A message that fits one fragment reaches a whole-message handler the same way.
  whole.calls.clear();
  const std::vector<uint8_t> small = pattern(50, 4);
  BOOST_CHECK(p.ab->am_send(10, header.data(), header.size(), small.data(), small.size()).done());
  BOOST_REQUIRE(p.until([&] { return whole.calls.size() == 1; }));
  BOOST_CHECK(whole.calls[0].data == small);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(persistent)

BOOST_DATA_TEST_CASE(data_kept_past_the_callback, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log log;
  log.keep = true;
  BOOST_REQUIRE(p.b->set_am_handler(20, record, &log, am_flag_persistent_data) == status::ok);
  am_log whole;
  whole.keep = true;
  BOOST_REQUIRE(p.b->set_am_handler(21, record, &whole, am_flag_whole_msg) == status::ok);
  const size_t big = 2 * p.attr().max_bcopy + 5;
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t i = 0; i < 20; ++i) {
    sent.push_back(pattern(i == 7 ? big : 10 + i * 37, 300 + i));
    op o = p.ab->am_send(20, nullptr, 0, sent.back().data(), sent.back().size());
    BOOST_CHECK(p.finish(o) == status::ok);
  }
  const std::vector<uint8_t> w = pattern(big, 999);
  request_params fragmented;
  fragmented.flags = request_force_bcopy;
  BOOST_CHECK(p.finish(p.ab->am_send(21, nullptr, 0, w.data(), w.size(), fragmented)) ==
              status::ok);
  // Persistent handler: every call is told its data persists (also each fragment of the big one).
  BOOST_REQUIRE(p.until([&] {
    size_t got = 0;
    for (const am_call& c : log.calls) got += c.data.size();
    size_t want = 0;
    for (const auto& s : sent) want += s.size();
    return got == want && whole.calls.size() == 1;
  }));
  for (const am_call& c : log.calls) BOOST_CHECK(c.params.attr & am_recv_data_persistent);
  BOOST_CHECK_EQUAL(log.kept.size(), log.calls.size());
  // A reassembled whole message is persistent without the flag.
  BOOST_CHECK(whole.calls[0].params.attr & am_recv_data_persistent);
  BOOST_REQUIRE_EQUAL(whole.kept.size(), 1u);

  // More traffic through the same receive buffers, then check the kept data is intact.
  for (int i = 0; i < 600; ++i) {
    const std::vector<uint8_t> noise(64, static_cast<uint8_t>(i));
    BOOST_CHECK(p.finish(p.ab->am_send(22, nullptr, 0, noise.data(), noise.size())) ==
                status::ok);
    p.progress();
  }
  p.spin(100);
  size_t call = 0;
  for (uint32_t i = 0; i < 20; ++i) {
    size_t offset = 0;
    while (offset < sent[i].size() && call < log.calls.size()) {
      const am_call& c = log.calls[call++];
      BOOST_CHECK(std::memcmp(c.data_ptr, sent[i].data() + offset, c.data.size()) == 0);
      offset += c.data.size();
    }
  }
  BOOST_CHECK(std::memcmp(whole.kept[0], w.data(), w.size()) == 0);
  for (void* data : log.kept) p.b->am_data_release(data);
  p.b->am_data_release(whole.kept[0]);
  BOOST_CHECK(holds_no_data(*p.b));
  // Releasing twice or something never kept is reported and ignored.
  int local = 0;
  p.b->am_data_release(&local);
}

/// What a handler that detaches its persistent data inside the call took.
struct detached_log {
  comm::worker* w = nullptr;
  std::vector<std::pair<void*, size_t>> taken;
  bool in_progress = false;  ///< return in_progress after detaching (ok otherwise)
};

status detach_inside(void* arg, const void*, size_t, void* data, size_t length,
                     const am_recv_params& params) {
  auto* log = static_cast<detached_log*>(arg);
  if ((params.attr & am_recv_data_persistent) && log->w->am_data_detach(data)) {
    log->taken.emplace_back(data, length);
  }
  return log->in_progress ? status::in_progress : status::ok;
}

BOOST_DATA_TEST_CASE(data_detached_inside_the_handler_is_the_users, each_transport(), tl_name) {
  worker_pair p(tl_name);
  detached_log log;
  log.w = p.b.get();
  BOOST_REQUIRE(p.b->set_am_handler(24, detach_inside, &log, am_flag_whole_msg) == status::ok);
  const size_t big = 2 * p.attr().max_bcopy + 5;
  request_params fragmented;
  fragmented.flags = request_force_bcopy;
  std::vector<std::vector<uint8_t>> sent;
  for (int i = 0; i < 4; ++i) {
    log.in_progress = i % 2 == 1;  // either answer leaves the data to the handler
    sent.push_back(pattern(big, 40 + i));
    BOOST_CHECK(p.finish(p.ab->am_send(24, nullptr, 0, sent.back().data(), big, fragmented)) ==
                status::ok);
    BOOST_REQUIRE(p.until([&] { return log.taken.size() == sent.size(); }));
  }
  BOOST_CHECK(holds_no_data(*p.b));
  // More reassembled traffic: the worker must not reuse what it handed over.
  am_log noise;
  BOOST_REQUIRE(p.b->set_am_handler(25, record, &noise, am_flag_whole_msg) == status::ok);
  for (int i = 0; i < 8; ++i) {
    const std::vector<uint8_t> other = pattern(big, 90 + i);
    BOOST_CHECK(p.finish(p.ab->am_send(25, nullptr, 0, other.data(), big, fragmented)) ==
                status::ok);
  }
  BOOST_REQUIRE(p.until([&] { return noise.calls.size() == 8; }));
  for (size_t i = 0; i < sent.size(); ++i) {
    BOOST_CHECK_EQUAL(log.taken[i].second, big);
    BOOST_CHECK(std::memcmp(log.taken[i].first, sent[i].data(), big) == 0);
  }
  BOOST_CHECK(!p.b->am_data_detach(log.taken[0].first));  // not the worker's any more
  for (auto& [data, length] : log.taken) comm::mem_free(data);
}

BOOST_DATA_TEST_CASE(non_persistent_data_is_not_kept, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log log;
  log.keep = true;  // only keeps data marked persistent
  BOOST_REQUIRE(p.b->set_am_handler(23, record, &log) == status::ok);
  const std::vector<uint8_t> d = pattern(64, 1);
  BOOST_CHECK(p.ab->am_send(23, nullptr, 0, d.data(), d.size()).done());
  BOOST_REQUIRE(p.until([&] { return log.calls.size() == 1; }));
  if (!(log.calls[0].params.attr & am_recv_data_persistent)) {
    BOOST_CHECK(log.kept.empty());
    BOOST_CHECK(holds_no_data(*p.b));
  } else {
    for (void* data : log.kept) p.b->am_data_release(data);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(reply)

BOOST_DATA_TEST_CASE(reply_endpoint_answers_the_sender, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log server, client;
  server.reply = true;
  server.reply_id = 31;
  BOOST_REQUIRE(p.b->set_am_handler(30, record, &server) == status::ok);
  BOOST_REQUIRE(p.a->set_am_handler(31, record, &client) == status::ok);
  const std::vector<uint8_t> small = pattern(40, 1), big = pattern(3 * p.attr().max_bcopy, 2);
  request_params rp;
  rp.flags = request_reply_endpoint;
  BOOST_CHECK(p.ab->am_send(30, nullptr, 0, small.data(), small.size(), rp).done());
  BOOST_CHECK(p.finish(p.ab->am_send(30, nullptr, 0, big.data(), big.size(), rp)) == status::ok);
  // Without the flag there is no reply endpoint (and the handler does not answer).
  BOOST_CHECK(p.ab->am_send(30, nullptr, 0, small.data(), small.size()).done());
  BOOST_REQUIRE(p.until([&] {
    size_t got = 0;
    for (const am_call& c : server.calls) got += c.data.size();
    return got == 2 * small.size() + big.size() && !client.calls.empty();
  }));
  p.spin(200);
  for (const am_call& c : server.calls) {
    const bool asked = &c != &server.calls.back();  // the last message did not ask
    BOOST_CHECK_EQUAL(bool(c.params.attr & am_recv_reply_ep), asked);
    if (asked) {
      BOOST_REQUIRE(c.params.reply_ep != nullptr);
      BOOST_CHECK_EQUAL(c.params.reply_ep->peer_uid(), p.a->uid());
    }
  }
  // One reply per call that had a reply endpoint: the small message, each fragment of the big.
  BOOST_CHECK_EQUAL(client.calls.size(), server.calls.size() - 1);
  BOOST_REQUIRE(!client.calls.empty());
  uint64_t first = 0;
  std::memcpy(&first, client.calls[0].data.data(), sizeof(first));
  BOOST_CHECK_EQUAL(first, small.size());
  for (status st : server.reply_status) BOOST_CHECK(st == status::ok);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(errors)

BOOST_DATA_TEST_CASE(unknown_id_is_counted_and_dropped, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log known;
  BOOST_REQUIRE(p.b->set_am_handler(40, record, &known) == status::ok);
  const uint64_t before = endpoint_errors(*p.b);
  const std::vector<uint8_t> small = pattern(10, 1), big = pattern(4 * p.attr().max_bcopy, 2);
  BOOST_CHECK(p.ab->am_send(41, nullptr, 0, small.data(), small.size()).done());
  BOOST_CHECK(p.finish(p.ab->am_send(42, small.data(), 8, big.data(), big.size())) == status::ok);
  BOOST_CHECK(p.ab->am_send(40, nullptr, 0, small.data(), small.size()).done());
  BOOST_REQUIRE(p.until([&] { return known.calls.size() == 1; }));
  BOOST_CHECK_EQUAL(endpoint_errors(*p.b), before + 2);
  BOOST_CHECK(known.calls[0].data == small);
  // Nothing failed: both directions still work.
  BOOST_CHECK(p.ab->state() == status::ok);
  BOOST_CHECK(p.ba->state() == status::ok);
  BOOST_CHECK(tag_roundtrip(p, 100, 3, true));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(alignment)

BOOST_DATA_TEST_CASE(am_alignment_of_handler_data, each_transport(), tl_name) {
  for (size_t align : {size_t{8}, size_t{64}, size_t{4096}}) {
    BOOST_TEST_CONTEXT("alignment " << align) {
      worker_params wp;
      wp.am_alignment = align;
      worker_pair p(tl_name, {}, {}, wp);
      am_log pieces, whole, persistent;
      BOOST_REQUIRE(p.b->set_am_handler(50, record, &pieces) == status::ok);
      BOOST_REQUIRE(p.b->set_am_handler(51, record, &whole, am_flag_whole_msg) == status::ok);
      BOOST_REQUIRE(p.b->set_am_handler(52, record, &persistent, am_flag_persistent_data) ==
                    status::ok);
      for (size_t hl : {size_t{0}, size_t{1}, size_t{13}}) {
        for (size_t n : {size_t{1}, size_t{100}, 2 * p.attr().max_bcopy + 3}) {
          const std::vector<uint8_t> h = pattern(hl, 1), d = pattern(n, 2);
          for (uint16_t id : {50, 51, 52}) {
            BOOST_CHECK(p.finish(p.ab->am_send(id, h.data(), hl, d.data(), n)) == status::ok);
          }
        }
      }
      BOOST_REQUIRE(p.until([&] { return whole.calls.size() == 9; }));
      p.spin(100);
      for (am_log* log : {&pieces, &whole, &persistent}) {
        BOOST_CHECK(!log->calls.empty());
        for (const am_call& c : log->calls) {
          BOOST_CHECK_EQUAL(reinterpret_cast<uintptr_t>(c.data_ptr) % align, 0u);
        }
      }
    }
  }
  // A non-power-of-two alignment is refused (falls back to 1) without failing creation.
  config cfg = config_for(tl_name);
  context ctx(cfg);
  worker_params bad;
  bad.am_alignment = 24;
  auto w = worker::create(ctx, bad).value();
  BOOST_CHECK_EQUAL(detail::impl(*w).params.am_alignment, 1u);
}

BOOST_AUTO_TEST_SUITE_END()

namespace am_test {
struct sequence_log {
  std::vector<int> order;  ///< message numbers in delivery order
};
status record_sequence(void* arg, const void* header, size_t header_length, void* data,
                       size_t length, const am_recv_params& params) {
  int seq = -1;
  if (header_length >= sizeof(seq)) std::memcpy(&seq, header, sizeof(seq));
  static_cast<sequence_log*>(arg)->order.push_back(seq);
  return status::ok;
}
size_t pack_am(void* dest, size_t offset, size_t max, void* arg) {
  auto* out = static_cast<uint8_t*>(dest);
  for (size_t i = 0; i < max; ++i) out[i] = pattern_byte(offset + i, 4321);
  return max;
}
}  // namespace am_test

BOOST_AUTO_TEST_SUITE(mixed)

BOOST_DATA_TEST_CASE(am_and_tag_interleaved_in_order, each_transport(), tl_name) {
  // Fragmented and single AMs and tagged messages share one endpoint: each arrives whole and
  // in send order relative to the others.
  worker_pair p(tl_name);
  sequence_log seen;
  BOOST_REQUIRE(p.b->set_am_handler(60, record_sequence, &seen, am_flag_whole_msg) == status::ok);
  const size_t big = 3 * p.attr().max_bcopy + 1;
  const std::vector<uint8_t> data = pattern(big, 2);
  std::vector<op> ops;
  std::vector<int> seqs(40);
  std::deque<std::vector<uint8_t>> in;
  std::vector<op> recvs;
  std::deque<recv_tracker> rts;
  for (int i = 0; i < 40; ++i) {
    seqs[i] = i;
    const size_t n = i % 3 == 0 ? big : 16;
    request_params rp;
    rp.flags = request_force_bcopy;
    if (i % 2 == 0) {
      ops.push_back(p.ab->am_send(60, &seqs[i], sizeof(int), data.data(), n, rp));
    } else {
      in.emplace_back(n);
      rts.emplace_back();
      rts.back().id = i;
      rts.back().order = &seen.order;
      recvs.push_back(p.b->tag_recv(in.back().data(), n, i, tag_mask_full, recv_params(rts.back())));
      ops.push_back(p.ab->tag_send(i, data.data(), n, rp));
    }
    BOOST_REQUIRE(!ops.back().failed());
  }
  BOOST_REQUIRE(p.until([&] { return seen.order.size() == 40; }));
  for (int i = 0; i < 40; ++i) BOOST_CHECK_EQUAL(seen.order[i], i);
  for (op o : ops) BOOST_CHECK(p.finish(o) == status::ok);
  for (op r : recvs) p.b->release(r.req);
}

BOOST_DATA_TEST_CASE(am_with_a_pack_callback, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log log;
  BOOST_REQUIRE(p.b->set_am_handler(61, record, &log, am_flag_whole_msg) == status::ok);
  for (size_t n : {size_t{1}, size_t{100}, 3 * p.attr().max_bcopy + 7}) {
    log.calls.clear();
    request_params rp;
    rp.pack = pack_am;
    const uint32_t h = 0xABCD;
    op o = p.ab->am_send(61, &h, sizeof(h), nullptr, n, rp);
    BOOST_REQUIRE_MESSAGE(!o.failed(), to_string(o.st));
    BOOST_CHECK(p.finish(o) == status::ok);
    BOOST_REQUIRE(p.until([&] { return log.calls.size() == 1; }));
    BOOST_CHECK_EQUAL(log.calls[0].data.size(), n);
    BOOST_CHECK_EQUAL(first_mismatch(log.calls[0].data.data(), n, 4321), -1);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(send_engine)

// A message that fits one eager short send but not one bcopy fragment goes whole: the send
// engine once cut it at the bcopy size and sent the later piece from the start of the buffer.
BOOST_DATA_TEST_CASE(short_sends_larger_than_a_bcopy_fragment, each_transport(), tl_name) {
  worker_pair p(tl_name);
  am_log log;
  BOOST_REQUIRE(p.b->set_am_handler(1, record, &log, am_flag_whole_msg) == status::ok);
  const size_t bcopy = p.bcopy_payload();
  const std::vector<size_t> sizes = {bcopy - 1, bcopy, bcopy + 1, bcopy + 40};
  for (size_t n : sizes) {
    const std::vector<uint8_t> data = pattern(n, 77);
    BOOST_REQUIRE(p.finish(p.ab->am_send(1, nullptr, 0, data.data(), n)) == status::ok);
  }
  BOOST_REQUIRE(p.until([&] { return log.calls.size() == sizes.size(); }));
  for (size_t i = 0; i < sizes.size(); ++i) {
    BOOST_CHECK_EQUAL(log.calls[i].data.size(), sizes[i]);
    BOOST_CHECK_EQUAL(first_mismatch(log.calls[i].data.data(), sizes[i], 77), -1);
  }
}

BOOST_AUTO_TEST_SUITE_END()
