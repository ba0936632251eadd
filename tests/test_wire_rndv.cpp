// Malformed rendezvous messages from the wire: garbage and truncated announcements, impossible
// lengths, acknowledgements and data for requests that do not exist, data out of sequence. Nothing
// may crash or leak; errors are counted; a named endpoint fails with PROTOCOL_ERROR; the worker
// keeps working for its other endpoints.
#define BOOST_TEST_MODULE wire_rndv
#include "fixture.hpp"
#include "rkey_edit.hpp"

#include <capnp/serialize.h>

#include <algorithm>
#include <random>

using namespace comm;
using namespace comm::test;

namespace {

/// An encoded RndvRts.
std::vector<uint8_t> rts(uint32_t dst, uint64_t length, uint64_t sreq, bool is_am = false) {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::schema::RndvRts>();
  r.setDstEp(dst);
  r.setTag(0x42);
  r.setSreqId(sreq);
  r.setLength(length);
  r.setAddress(0x1000);
  r.setIsAm(is_am);
  r.setAmId(3);
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

/// A data-only header of type Struct filled by `fill`, followed by `payload` bytes.
template <class Struct, class Fill>
std::vector<uint8_t> header(Fill&& fill, size_t payload = 0) {
  wire::header_writer<Struct> w;
  fill(w.fields());
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(w.bytes()),
                             static_cast<const uint8_t*>(w.bytes()) + w.size());
  bytes.resize(bytes.size() + payload, 0xab);
  return bytes;
}

uint64_t errors(worker& w) { return detail::impl(w).protocol_errors; }

/// The software-rendezvous receives of `w` that wait for data, by id.
const auto& rndv_receives(worker& w) {
  return detail::module_of<detail::rndv_protocol>(detail::impl(w)).receives();
}

/// The endpoint of b that receives what ab sends.
detail::endpoint_impl& victim(worker_pair& p) { return *worker_pair::receiving_ep(*p.b, p.ab); }

}  // namespace

BOOST_DATA_TEST_CASE(garbage_announcements_are_counted_and_dropped, each_transport(), transport) {
  worker_pair p(transport);
  auto& wi = detail::impl(*p.b);
  std::mt19937_64 rng(7);
  const uint64_t before = errors(*p.b);
  for (int i = 0; i < 500; ++i) {
    std::vector<uint8_t> junk(8 * (1 + rng() % 40));
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    aligned_bytes m(junk);
    feed(*p.b, proto_id::rndv_rts, m.data(), m.length);
    feed(*p.b, proto_id::rndv_ats, m.data(), m.length);
    feed(*p.b, proto_id::rndv_rtr, m.data(), m.length);
    feed(*p.b, proto_id::rndv_data, m.data(), m.length);
    feed(*p.b, proto_id::rndv_cancel, m.data(), m.length);
  }
  for (size_t cut = 0; cut < 24; ++cut) {  // truncated headers
    aligned_bytes m(std::vector<uint8_t>(cut, 0));
    feed(*p.b, proto_id::rndv_ats, m.data(), m.length);
    feed(*p.b, proto_id::rndv_data, m.data(), m.length);
  }
  BOOST_CHECK_GT(errors(*p.b), before);
  BOOST_CHECK_EQUAL(wi.matcher.unexpected_count(), 0u);  // nothing half-parsed was kept
  BOOST_CHECK(tag_roundtrip(p, 1 << 20, 1, true));       // rendezvous still works
}

BOOST_DATA_TEST_CASE(impossible_length_fails_the_endpoint, each_transport(), transport) {
  worker_pair p(transport);
  auto& v = victim(p);
  aligned_bytes m(rts(v.id, uint64_t{1} << 60, 1));
  feed(*p.b, proto_id::rndv_rts, m.data(), m.length);
  BOOST_CHECK(v.state == detail::endpoint_impl::phase::failed);
  BOOST_CHECK(v.failure == status::protocol_error);
  BOOST_CHECK_EQUAL(detail::impl(*p.b).matcher.unexpected_count(), 0u);
}

BOOST_DATA_TEST_CASE(announcement_for_unknown_endpoint, each_transport(), transport) {
  worker_pair p(transport);
  const uint64_t before = errors(*p.b);
  aligned_bytes m(rts(0xFFFFF, 4096, 1));
  feed(*p.b, proto_id::rndv_rts, m.data(), m.length);
  BOOST_CHECK_EQUAL(errors(*p.b), before + 1);
  BOOST_CHECK_EQUAL(detail::impl(*p.b).matcher.unexpected_count(), 0u);
}

BOOST_DATA_TEST_CASE(forged_announcement_cannot_read_the_sender, each_transport(), transport) {
  // An announcement whose key is garbage: the matched receive fails cleanly, the "sender" is told.
  worker_pair p(transport);
  auto& v = victim(p);
  std::vector<uint8_t> buf(4096);
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), buf.size(), 0x42, tag_mask_full, recv_params(rt));
  capnp::MallocMessageBuilder message;
  auto a = message.initRoot<wire::schema::RndvRts>();
  a.setDstEp(v.id);
  a.setTag(0x42);
  a.setSreqId(9);
  a.setLength(4096);
  a.setAddress(0x1000);
  const uint8_t junk_key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  a.setRkey(kj::arrayPtr(junk_key, sizeof(junk_key)));
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  aligned_bytes m(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  feed(*p.b, proto_id::rndv_rts, m.data(), m.length);
  BOOST_REQUIRE(p.until([&] { return rt.calls == 1; }));
  BOOST_CHECK(is_error(rt.st));
  p.b->release(r.req);
  BOOST_CHECK(tag_roundtrip(p, 64, 2, true));
}

BOOST_DATA_TEST_CASE(stray_acks_and_data_are_harmless, each_transport(), transport) {
  worker_pair p(transport);
  auto& v = victim(p);
  aligned_bytes ack(header<wire::schema::RndvAts>([&](auto h) {
    h.setDstEp(v.id);
    h.setSreqId(12345);
  }));
  feed(*p.b, proto_id::rndv_ats, ack.data(), ack.length);  // no such send: ignored
  BOOST_CHECK(v.state != detail::endpoint_impl::phase::failed);
  aligned_bytes data(header<wire::schema::RndvData>(
      [&](auto h) {
        h.setDstEp(v.id);
        h.setRreqId(777);
        h.setOffset(0);
      },
      64));
  // Data for no receive: the peer misbehaves.
  feed(*p.b, proto_id::rndv_data, data.data(), data.length);
  BOOST_CHECK(v.state == detail::endpoint_impl::phase::failed);
  BOOST_CHECK(v.failure == status::protocol_error);
  BOOST_CHECK(p.ba->state() == status::ok);  // b's own endpoint to a is unaffected
}

BOOST_DATA_TEST_CASE(software_rendezvous_data_out_of_sequence, each_transport(), transport) {
  // Force the software protocol by receiving through a request id we register by hand.
  worker_pair p(transport);
  auto& v = victim(p);
  std::vector<uint8_t> buf(8192);
  recv_tracker rt;
  op r = p.b->tag_recv(buf.data(), buf.size(), 0x42, tag_mask_full, recv_params(rt));
  aligned_bytes announce(rts(v.id, 8192, 5));  // no key: the receiver asks for the data
  feed(*p.b, proto_id::rndv_rts, announce.data(), announce.length);
  BOOST_REQUIRE_EQUAL(rndv_receives(*p.b).size(), 1u);
  const uint64_t rreq = rndv_receives(*p.b).begin()->first;
  aligned_bytes skip(header<wire::schema::RndvData>(
      [&](auto h) {
        h.setDstEp(v.id);
        h.setRreqId(rreq);
        h.setOffset(4096);  // skips the first 4 KiB
      },
      100));
  feed(*p.b, proto_id::rndv_data, skip.data(), skip.length);
  BOOST_CHECK(v.state == detail::endpoint_impl::phase::failed);
  BOOST_REQUIRE(p.until([&] { return rt.calls == 1; }));  // the receive fails with the endpoint
  BOOST_CHECK(is_error(rt.st));
  BOOST_CHECK(rndv_receives(*p.b).empty());
  p.b->release(r.req);
}

BOOST_DATA_TEST_CASE(huge_announced_eager_message_allocates_only_what_arrives, each_transport(),
                     transport) {
  worker_pair p(transport);
  auto& v = victim(p);
  aligned_bytes first(header<wire::schema::TagEagerFirst>(
      [&](auto h) {
        h.setDstEp(v.id);
        h.setTag(0x99);
        h.setMsgId(1);
        h.setTotalLength(uint64_t{1} << 30);  // announces 1 GiB, sends 16 bytes
      },
      16));
  feed(*p.b, proto_id::tag_eager_first, first.data(), first.length);
  const detail::unexpected_msg* arriving =
      detail::module_of<detail::tag_protocol>(detail::impl(*p.b)).arriving(v);
  BOOST_REQUIRE(arriving != nullptr);
  BOOST_CHECK_LE(arriving->capacity, size_t{1} << 20);
  BOOST_CHECK(v.state != detail::endpoint_impl::phase::failed);
}

BOOST_DATA_TEST_CASE(software_rma_requests_are_checked_by_the_owner, each_transport(), transport) {
  worker_pair p(transport);
  auto& v = victim(p);
  auto& wi = detail::impl(*p.b);
  std::vector<uint8_t> region(4096, 0x11);
  memh* handle = nullptr;
  BOOST_REQUIRE(p.b->mem_map(region.data(), region.size(), &handle) == status::ok);
  const uint64_t base = reinterpret_cast<uintptr_t>(region.data());
  auto request = [&](uint64_t token, uint64_t address, uint64_t length, size_t payload) {
    return aligned_bytes(header<wire::schema::RmaRequest>(
        [&](auto h) {
          h.setDstEp(v.id);
          h.setIsGet(false);
          h.setReqId(1);
          h.setToken(token);
          h.setAddress(address);
          h.setLength(length);
        },
        payload));
  };
  // Wrong token, out of range, past the end: nothing is written, the endpoint keeps working.
  auto bad_token = request(0x1234, base, 16, 16);
  feed(*p.b, proto_id::rma_request, bad_token.data(), bad_token.length);
  // A put whose data is shorter than its header says is malformed.
  uint64_t token = 0;
  for (auto& [t, h] : detail::module_of<detail::rma_protocol>(wi).regions()) {
    if (h == handle) token = t;
  }
  BOOST_REQUIRE(token != 0);
  auto outside = request(token, base - 4096, 16, 16);
  feed(*p.b, proto_id::rma_request, outside.data(), outside.length);
  auto past = request(token, base + 4090, 16, 16);
  feed(*p.b, proto_id::rma_request, past.data(), past.length);
  BOOST_CHECK(std::all_of(region.begin(), region.end(), [](uint8_t b) { return b == 0x11; }));
  BOOST_CHECK(v.state != detail::endpoint_impl::phase::failed);
  auto lying = request(token, base, 64, 16);
  feed(*p.b, proto_id::rma_request, lying.data(), lying.length);
  BOOST_CHECK(v.failure == status::protocol_error);
  BOOST_CHECK(std::all_of(region.begin(), region.end(), [](uint8_t b) { return b == 0x11; }));
  BOOST_CHECK(p.b->mem_unmap(handle) == status::ok);
}

BOOST_DATA_TEST_CASE(acknowledgement_for_an_unannounced_send_fails_the_endpoint, each_transport(),
                     transport) {
  // The transport is full, so the announcement of a rendezvous send waits in the pending queue
  // (its id is taken already): a forged acknowledgement must not complete the send there.
  worker_pair p(transport, [](config& c) {
    c.transport_options = {
        {"COMM_SELF_FIFO_SIZE", "4"}, {"COMM_SHM_FIFO_SIZE", "4"}, {"COMM_TCP_WINDOW", "4"}};
  });
  request_params fi;
  fi.flags = request_force_immediate;
  const uint64_t value = 0;
  int went = 0;
  while (went < 100000 && p.ab->tag_send(1, &value, sizeof(value), fi).done()) ++went;
  BOOST_REQUIRE(went < 100000);
  const std::vector<uint8_t> big = pattern(64 << 10, 3);
  request_params rp;
  rp.flags = request_force_rndv;
  op s = p.ab->tag_send(2, big.data(), big.size(), rp);
  BOOST_REQUIRE(s.pending());
  const detail::rndv_send& r = s.req->as<detail::tag_send_state>().rndv;
  BOOST_REQUIRE(r.id != 0);
  BOOST_REQUIRE(r.phase == detail::rndv_phase::none);
  detail::endpoint_impl& ab = detail::impl(*p.ab);
  aligned_bytes ack(header<wire::schema::RndvAts>([&](auto h) {
    h.setDstEp(ab.id);
    h.setSreqId(r.id);
  }));
  feed(*p.a, proto_id::rndv_ats, ack.data(), ack.length);
  BOOST_CHECK(ab.state == detail::endpoint_impl::phase::failed);
  BOOST_CHECK(ab.failure == status::protocol_error);
  BOOST_CHECK(p.finish(s) == status::protocol_error);
}

/// b's region of `length` bytes of pattern `seed`, open to one remote right only (`remote`), with
/// a's key for it without the transports' entries, so that every lane reaches it by software RMA
/// (a read-only region is mapped by shm otherwise).
struct software_region {
  software_region(worker_pair& p, size_t length, uint32_t seed, uint32_t remote)
      : p(p), bytes(pattern(length, seed)) {
    BOOST_REQUIRE(p.b->mem_map(bytes.data(), bytes.size(), &handle,
                               mem_local_read | mem_local_write | remote) == status::ok);
    key = key_served_by_owner(p, handle);
    for (auto& [t, h] : detail::module_of<detail::rma_protocol>(detail::impl(*p.b)).regions()) {
      if (h == handle) token = t;
    }
  }
  ~software_region() {
    if (p.ab != nullptr) p.ab->rkey_destroy(key);
    BOOST_CHECK(p.b->mem_unmap(handle) == status::ok);
  }
  uint64_t base() const { return reinterpret_cast<uintptr_t>(bytes.data()); }

  worker_pair& p;
  std::vector<uint8_t> bytes;
  memh* handle = nullptr;
  rkey* key = nullptr;
  uint64_t token = 0;
};

BOOST_DATA_TEST_CASE(software_get_reply_fits_one_bcopy, each_transport(), transport) {
  worker_pair p(transport);
  auto& v = victim(p);
  const size_t max_bcopy = p.attr().max_bcopy;
  software_region region(p, max_bcopy, 5, mem_remote_read);
  std::vector<uint8_t> local(16);
  iov_entry entry{local.data(), local.size()};
  op g = p.ab->get(&entry, 1, region.base(), region.key);
  BOOST_REQUIRE(g.pending());
  const uint64_t id = g.req->as<detail::rma_state>().id;
  BOOST_REQUIRE(id != 0);
  // A get of a whole bcopy, under the id of a's get, reaches b before a's own request: its data
  // behind the reply's header would not fit one bcopy, so b refuses it (length_error) instead of
  // overrunning the transport's buffer, and a's get ends with that refusal, its first reply.
  aligned_bytes whole(header<wire::schema::RmaRequest>([&](auto h) {
    h.setDstEp(v.id);
    h.setIsGet(true);
    h.setReqId(id);
    h.setToken(region.token);
    h.setAddress(region.base());
    h.setLength(max_bcopy);
  }));
  feed(*p.b, proto_id::rma_request, whole.data(), whole.length);
  BOOST_CHECK(v.state != detail::endpoint_impl::phase::failed);
  BOOST_CHECK(p.finish(g) == status::length_error);
}

BOOST_DATA_TEST_CASE(more_rma_replies_than_requests_fail_the_endpoint, each_transport(),
                     transport) {
  // a's software put has more chunks than the transport takes: it waits in the pending queue.
  // Replies beyond the requests sent must not complete it there.
  worker_pair p(transport, [](config& c) {
    c.transport_options = {
        {"COMM_SELF_FIFO_SIZE", "4"}, {"COMM_SHM_FIFO_SIZE", "4"}, {"COMM_TCP_WINDOW", "4"}};
  });
  const size_t chunk = p.bcopy_payload();
  software_region region(p, 64 * chunk, 6, mem_remote_write);
  const std::vector<uint8_t> local = pattern(region.bytes.size(), 7);
  iov_entry entry{const_cast<uint8_t*>(local.data()), local.size()};
  op put = p.ab->put(&entry, 1, region.base(), region.key);
  BOOST_REQUIRE(put.pending());
  const auto& s = put.req->as<detail::rma_state>();
  const unsigned sent = s.replies_due;
  BOOST_REQUIRE(sent > 0);
  BOOST_REQUIRE(s.offset < s.length);  // the rest waits for the transport
  detail::endpoint_impl& ab = detail::impl(*p.ab);
  aligned_bytes refusal(header<wire::schema::RmaReply>([&](auto h) {
    h.setDstEp(ab.id);
    h.setReqId(s.id);
    h.setAddress(region.base());
    h.setStatus(static_cast<int16_t>(status::protection_error));
  }));
  for (unsigned i = 0; i < sent; ++i) {
    feed(*p.a, proto_id::rma_reply, refusal.data(), refusal.length);
  }
  BOOST_CHECK(ab.state != detail::endpoint_impl::phase::failed);
  BOOST_CHECK(p.a->request_status(put.req) == status::in_progress);
  feed(*p.a, proto_id::rma_reply, refusal.data(), refusal.length);
  BOOST_CHECK(ab.state == detail::endpoint_impl::phase::failed);
  BOOST_CHECK(ab.failure == status::protocol_error);
  BOOST_CHECK(is_error(p.finish(put)));
}
