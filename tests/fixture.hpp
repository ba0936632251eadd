// Shared fixture of the protocol-layer suites: two workers of one context restricted to a single
// transport, connected both ways, plus bounded progress loops, completion trackers and data
// patterns. Every protocol test runs once per transport that has devices here (see
// transport_list.hpp: the list comes from the component registry), so adding a transport adds it
// to every suite; suites that start processes use interprocess_transports(), which leaves out (and
// names) a transport whose device exists only in this process.
#pragma once

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <comm/context.hpp>
#include <comm/transport/transport.hpp>
#include <comm/worker.hpp>

#include "transport_list.hpp"
#include "protocols.hpp"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace comm::test {

// -- transports ----------------------------------------------------------------------------------

/// Dataset for BOOST_DATA_TEST_CASE: one sample per transport under test.
inline auto each_transport() { return boost::unit_test::data::make(transports_under_test()); }

// -- wire ids ------------------------------------------------------------------------------------

/// The wire ids of the protocol modules under one name, for the tests that forge messages (each
/// module declares its own: wireup_msg, tag_msg, am_msg, rndv_msg, rma_msg, stream_msg).
enum class proto_id : tl::am_id {
  wireup_request = detail::wire_id(detail::wireup_msg::request),
  wireup_reply = detail::wire_id(detail::wireup_msg::reply),
  ep_close = detail::wire_id(detail::wireup_msg::close),
  tag_eager = detail::wire_id(detail::tag_msg::eager),
  tag_eager_imm = detail::wire_id(detail::tag_msg::eager_imm),
  tag_eager_first = detail::wire_id(detail::tag_msg::eager_first),
  tag_fragment = detail::wire_id(detail::tag_msg::fragment),
  am_single = detail::wire_id(detail::am_msg::single),
  am_first = detail::wire_id(detail::am_msg::first),
  am_fragment = detail::wire_id(detail::am_msg::fragment),
  rndv_rts = detail::wire_id(detail::rndv_msg::rts),
  rndv_ats = detail::wire_id(detail::rndv_msg::ats),
  rndv_rtr = detail::wire_id(detail::rndv_msg::rtr),
  rndv_data = detail::wire_id(detail::rndv_msg::data),
  rndv_cancel = detail::wire_id(detail::rndv_msg::cancel),
  rndv_refuse = detail::wire_id(detail::rndv_msg::refuse),
  rma_request = detail::wire_id(detail::rma_msg::request),
  rma_reply = detail::wire_id(detail::rma_msg::reply),
  stream_data = detail::wire_id(detail::stream_msg::data),
  stream_first = detail::wire_id(detail::stream_msg::first),
  stream_fragment = detail::wire_id(detail::stream_msg::fragment),
};

/// Hands `length` bytes at `data` to the receive handler of `id` on `w`, as a transport would.
inline void feed(worker& w, proto_id id, const uint8_t* data, size_t length) {
  detail::impl(w).deliver(static_cast<tl::am_id>(id), data, length);
}

// -- bounded loops -------------------------------------------------------------------------------

/// Upper bounds of every wait in the suites: generous, only there so a bug fails instead of hangs.
inline constexpr double default_wait_seconds = 30.0;
inline constexpr uint64_t max_spins = 200'000'000;

/// Calls `step` until `done()` holds, at most `max_spins` times and `seconds` long; returns
/// whether `done()` held.
template <class Step, class Done>
bool spin_until(Step&& step, Done&& done, double seconds = default_wait_seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  for (uint64_t spin = 0; spin < max_spins; ++spin) {
    if (done()) return true;
    step();
    if ((spin & 1023) == 1023 && std::chrono::steady_clock::now() > deadline) break;
  }
  return done();
}

// -- endpoint errors -----------------------------------------------------------------------------

/// What an endpoint error handler installed as record_error was told.
struct error_log {
  int calls = 0;               ///< calls so far
  status reason = status::ok;  ///< the reason of the last one
};

/// Endpoint error handler (endpoint::set_error_handler, endpoint_params::on_error) that records
/// into the error_log `arg`.
inline void record_error(void* arg, endpoint*, status reason) {
  auto* log = static_cast<error_log*>(arg);
  ++log->calls;
  log->reason = reason;
}

// -- completion trackers -------------------------------------------------------------------------

/// Records what a send callback was told. With `order` set, appends `id` to it on completion.
struct send_tracker {
  int calls = 0;
  status st = status::in_progress;
  int id = 0;
  std::vector<int>* order = nullptr;
  /// Called in the callback after recording (e.g. to check the receiver's state).
  std::function<void(status)> check;
};

inline void on_send(request*, status st, void* user) {
  auto* t = static_cast<send_tracker*>(user);
  ++t->calls;
  t->st = st;
  if (t->order != nullptr) t->order->push_back(t->id);
  if (t->check) t->check(st);
}

/// Records what a receive callback was told.
struct recv_tracker {
  int calls = 0;
  status st = status::in_progress;
  tag_recv_info info;
  int id = 0;
  std::vector<int>* order = nullptr;
};

inline void on_recv(request*, status st, const tag_recv_info& info, void* user) {
  auto* t = static_cast<recv_tracker*>(user);
  ++t->calls;
  t->st = st;
  t->info = info;
  if (t->order != nullptr) t->order->push_back(t->id);
}

/// Parameters with the send callback reporting to `t`.
inline request_params send_params(send_tracker& t, uint32_t flags = 0) {
  request_params p;
  p.flags = flags;
  p.send_cb = on_send;
  p.user_data = &t;
  return p;
}

/// Parameters with the receive callback reporting to `t`.
inline request_params recv_params(recv_tracker& t, uint32_t flags = 0) {
  request_params p;
  p.flags = flags;
  p.recv_cb = on_recv;
  p.user_data = &t;
  return p;
}

// -- data patterns -------------------------------------------------------------------------------

/// The byte at `index` of pattern `seed`.
inline uint8_t pattern_byte(size_t index, uint32_t seed) {
  const uint64_t x = (index + 1) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>((x >> 29) ^ (x >> 47) ^ index);
}

/// `length` bytes of pattern `seed`.
inline std::vector<uint8_t> pattern(size_t length, uint32_t seed) {
  std::vector<uint8_t> out(length);
  for (size_t i = 0; i < length; ++i) out[i] = pattern_byte(i, seed);
  return out;
}

/// Index of the first byte of `data` that differs from pattern `seed` at `offset`, or -1.
inline long first_mismatch(const void* data, size_t length, uint32_t seed, size_t offset = 0) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < length; ++i) {
    if (p[i] != pattern_byte(offset + i, seed)) return static_cast<long>(i);
  }
  return -1;
}

// -- the two-worker fixture ----------------------------------------------------------------------

/// Rendezvous threshold the suite's configurations start with (0: the library's choice). The
/// eager suites raise it so their large messages stay eager; test_rndv covers rendezvous.
inline size_t suite_rndv_thresh = 0;

/// Sets suite_rndv_thresh for a whole test module (use with BOOST_TEST_GLOBAL_FIXTURE).
struct eager_only_suite {
  eager_only_suite() { suite_rndv_thresh = size_t{1} << 40; }
};

/// The configuration the fixture starts from: the environment, restricted to `transport`.
inline config config_for(const std::string& transport) {
  config cfg = config::from_environment();
  cfg.transports = {transport};
  if (suite_rndv_thresh != 0) cfg.rndv_thresh = suite_rndv_thresh;
  return cfg;
}

/// Two workers `a` and `b` on one context restricted to one transport, connected both ways:
/// `ab` sends from a to b, `ba` from b to a.
struct worker_pair {
  /// Creates the context and workers, connects them and progresses until wireup is done.
  explicit worker_pair(const std::string& transport, std::function<void(config&)> tweak = {},
                       const worker_params& pa = {}, const worker_params& pb = {}) {
    cfg = config_for(transport);
    if (tweak) tweak(cfg);
    ctx = std::make_unique<context>(cfg);
    BOOST_REQUIRE_MESSAGE(ctx->components().size() == 1,
                          "transport " << transport << " is not available here");
    worker_params wa = pa, wb = pb;
    if (wa.name.empty()) wa.name = "a";
    if (wb.name.empty()) wb.name = "b";
    a = worker::create(*ctx, wa).value();
    b = worker::create(*ctx, wb).value();
    // One interface per device of the transport (tcp: every interface that is up).
    BOOST_REQUIRE(!detail::impl(*a).ifaces.empty());
    BOOST_REQUIRE(!detail::impl(*b).ifaces.empty());
    BOOST_REQUIRE(a->connect(b->address(), &ab) == status::ok);
    BOOST_REQUIRE(b->connect(a->address(), &ba) == status::ok);
    BOOST_REQUIRE_MESSAGE(until([&] { return wired(ab) && wired(ba); }), "wireup did not finish");
    BOOST_REQUIRE_EQUAL(ab->transport(), transport);
  }

  worker_pair(const worker_pair&) = delete;
  worker_pair& operator=(const worker_pair&) = delete;

  ~worker_pair() {
    // Destroy b first: a's endpoints to it see the peer go, as in a real shutdown.
    b.reset();
    a.reset();
  }

  /// True once `ep` finished wireup.
  static bool wired(endpoint* ep) {
    return detail::impl(*ep).state == detail::endpoint_impl::phase::connected;
  }

  /// Progresses both workers once.
  unsigned progress() { return a->progress() + b->progress(); }

  /// Progresses both workers until `done()` holds (bounded); returns whether it did.
  template <class Done>
  bool until(Done&& done, double seconds = default_wait_seconds) {
    return spin_until([&] { progress(); }, done, seconds);
  }

  /// Progresses only `w` until `done()` holds (bounded); returns whether it did.
  template <class Done>
  static bool until_on(worker& w, Done&& done, double seconds = default_wait_seconds) {
    return spin_until([&] { w.progress(); }, done, seconds);
  }

  /// Progresses both workers `rounds` times.
  void spin(unsigned rounds) {
    for (unsigned i = 0; i < rounds; ++i) progress();
  }

  /// Waits for `o` (progressing both workers), releases its request and returns its final status;
  /// timed_out when it did not finish in time (the request is then left alone).
  status finish(op o, double seconds = default_wait_seconds) {
    if (o.req == nullptr) return o.st;
    worker& owner = *owner_of(o.req);
    if (!until([&] { return owner.request_status(o.req) != status::in_progress; }, seconds)) {
      return status::timed_out;
    }
    const status st = owner.request_status(o.req);
    owner.release(o.req);
    return st;
  }

  /// The worker whose pool holds `req`.
  worker* owner_of(const request* req) {
    return req->owner == &detail::impl(*a) ? a.get() : b.get();
  }

  /// Limits of the lane of `ab`.
  const tl::iface_attr& attr() const { return *detail::impl(*ab).lane_attr; }

  /// Largest tagged message that goes eager short from `ab`.
  size_t max_short_payload() const {
    const size_t limit = detail::impl(*ab).short_limit;
    const size_t header = wire::header_size<wire::schema::TagEager>();
    return limit > header ? limit - header : 0;
  }

  /// Data bytes of a bcopy fragment (what fits next to the largest protocol header).
  size_t bcopy_payload() const { return attr().max_bcopy - 64; }

  /// The endpoint of `w` that the peer created for messages arriving on `ep` of the other
  /// worker (its reply endpoint), or null.
  static detail::endpoint_impl* receiving_ep(worker& w, endpoint* ep) {
    const uint32_t remote = detail::impl(*ep).remote_id;
    for (detail::endpoint_impl* e : detail::impl(w).ep_table) {
      if (e != nullptr && e->id == remote) return e;
    }
    return nullptr;
  }

  config cfg;
  std::unique_ptr<context> ctx;
  std::unique_ptr<worker> a;
  std::unique_ptr<worker> b;
  endpoint* ab = nullptr;
  endpoint* ba = nullptr;
};

// -- RMA -----------------------------------------------------------------------------------------

/// A region of b's memory (pattern `seed`, or zeros for seed 0) registered with the rights
/// `access` and unpacked on a's endpoint; unmapped at destruction (while b lives). A region
/// without both remote rights is not mapped by the transports: b's worker serves it (software
/// RMA), on every lane.
struct remote_region {
  remote_region(worker_pair& p, size_t length, uint32_t seed, uint32_t access = mem_access_all)
      : pair(p), bytes(seed == 0 ? std::vector<uint8_t>(length, 0) : pattern(length, seed)) {
    BOOST_REQUIRE(p.b->mem_map(bytes.data(), bytes.size(), &handle, access) == status::ok);
    std::vector<uint8_t> packed;
    BOOST_REQUIRE(p.b->rkey_pack(handle, packed) == status::ok);
    BOOST_REQUIRE(p.ab->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  }
  remote_region(const remote_region&) = delete;
  remote_region& operator=(const remote_region&) = delete;
  ~remote_region() { release(); }

  /// Destroys the key and unmaps the region (while b lives) ahead of destruction.
  void release() {
    if (key != nullptr) pair.ab->rkey_destroy(key);
    if (handle != nullptr && pair.b) pair.b->mem_unmap(handle);
    key = nullptr;
    handle = nullptr;
  }

  /// The remote address of byte `offset`.
  uint64_t address(size_t offset = 0) const {
    return reinterpret_cast<uintptr_t>(bytes.data()) + offset;
  }

  worker_pair& pair;
  std::vector<uint8_t> bytes;
  memh* handle = nullptr;
  rkey* key = nullptr;
};

// -- forged messages -----------------------------------------------------------------------------

/// 8-byte aligned bytes, as a transport delivers them (for feed()).
struct aligned_bytes {
  explicit aligned_bytes(const std::vector<uint8_t>& bytes)
      : words(bytes.size() / 8 + 1, 0), length(bytes.size()) {
    if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  std::vector<uint64_t> words;
  size_t length;
};

/// Sends `length` bytes of pattern `seed` tagged `tag` from `ab` and receives them on b, posting
/// the receive before the send (expected) or after it arrived (unexpected). Checks data, tag,
/// length and status; returns false (after reporting) on any failure.
inline bool tag_roundtrip(worker_pair& p, size_t length, uint32_t seed, bool expected,
                          const request_params& extra = {}, tag_t tag = 0x5eed) {
  const std::vector<uint8_t> data = pattern(length, seed);
  std::vector<uint8_t> buffer(length + 16, 0xEE);
  recv_tracker rt;
  op r{};
  if (expected) {
    r = p.b->tag_recv(buffer.data(), length, tag, tag_mask_full, recv_params(rt));
    BOOST_CHECK(r.pending());
  }
  request_params sp = extra;
  send_tracker st;
  if (sp.send_cb == nullptr) {
    sp.send_cb = on_send;
    sp.user_data = &st;
  }
  op s = p.ab->tag_send(tag, data.data(), length, sp);
  BOOST_CHECK_MESSAGE(!s.failed(), "tag_send of " << length << " failed: " << to_string(s.st));
  if (s.failed()) {
    if (r.req) {
      (void)p.b->cancel(r.req, cancel_mode::force);
    }
    return false;
  }
  if (!expected) {
    tag_recv_info info{};
    const bool arrived = p.until([&] { return p.b->tag_probe(tag, tag_mask_full, &info); });
    BOOST_CHECK_MESSAGE(arrived, "message of " << length << " never arrived");
    if (!arrived) {
      (void)p.finish(s, 5);  // the send's callback reports to `st`, on this stack
      return false;
    }
    BOOST_CHECK_EQUAL(info.length, length);
    request_params rp = recv_params(rt);
    r = p.b->tag_recv(buffer.data(), length, tag, tag_mask_full, rp);
    // An eager message completes at once; a rendezvous one may still have to be fetched.
    const status got = r.pending() ? p.finish(r) : r.st;
    BOOST_CHECK_MESSAGE(got == status::ok,
                        "unexpected receive of " << length << ": " << to_string(got));
  } else {
    const bool got = p.until([&] { return rt.calls > 0; });
    BOOST_CHECK_MESSAGE(got, "expected receive of " << length << " never completed");
    if (!got) {
      (void)p.b->cancel(r.req, cancel_mode::force);
      (void)p.finish(s, 5);  // the send's callback reports to `st`, on this stack
      return false;
    }
    BOOST_CHECK_EQUAL(rt.calls, 1);
    BOOST_CHECK_MESSAGE(rt.st == status::ok, "receive status " << to_string(rt.st));
    BOOST_CHECK_EQUAL(rt.info.length, length);
    BOOST_CHECK_EQUAL(rt.info.sender_tag, tag);
    p.b->release(r.req);
  }
  const status sent = p.finish(s);
  BOOST_CHECK_MESSAGE(sent == status::ok, "send of " << length << ": " << to_string(sent));
  const long bad = first_mismatch(buffer.data(), length, seed);
  BOOST_CHECK_MESSAGE(bad < 0, "size " << length << ": data differs at byte " << bad);
  bool guard_ok = true;
  for (size_t i = length; i < buffer.size(); ++i) guard_ok = guard_ok && buffer[i] == 0xEE;
  BOOST_CHECK_MESSAGE(guard_ok, "size " << length << ": bytes written past the receive buffer");
  return sent == status::ok && bad < 0 && guard_ok;
}

}  // namespace comm::test
