// RMA through the protocol layer: registration, keys, put and get with DAT's RDMA-read semantics
// (iov filled in order, cookie, completion suppression, fence, bounded outstanding reads), bad
// ranges and keys, flush, posts on a failed endpoint (flushed), access rights (local misuse and a
// hostile reader with a forged key), remote segments, the outstanding-reads limit exchanged at
// connection, one cookie on two reads, the iov array the caller's again when a post returns, no
// allocation per post once the request pool is warm (operator new is counted here), and the
// optimal alignment. Runs over every transport present.
#define BOOST_TEST_MODULE rma
#include "fixture.hpp"
#include "rkey_edit.hpp"
#include "test_util.hpp"

#include "verbs/testdev/testdev.hpp"
#include "verbs/verbs_component.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

// Every allocation through operator new is counted while this thread's `counting` is set and
// it is not inside the verbs test device (the case about allocation per post).
namespace {
std::atomic<uint64_t> allocations{0};
thread_local bool counting = false;
thread_local bool in_test_device = false;
}  // namespace

void* operator new(std::size_t size) {
  if (counting && !in_test_device) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  if (counting && !in_test_device) allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace comm;
using namespace comm::test;

namespace {

/// b's key for `handle`, re-encoded with the rights `access` and (when not 0) the length
/// `length` in place of what b packed (a hostile reader), unpacked on a's endpoint.
rkey* forged_key(worker_pair& p, memh* handle, uint32_t access, uint64_t length) {
  return reencoded_key(p, handle, [&](auto bundle) {
    bundle.setAccess(access);
    if (length != 0) bundle.setLength(length);
  });
}

/// The verbs test device's post_send, called by marked_post_send.
decltype(comm::verbs::api::post_send) device_post_send = nullptr;

/// The verbs test device's table, except that its post_send marks the thread as inside the
/// device while it runs: what the software stand-in allocates for its work queues (a NIC's
/// post_send allocates nothing) is not counted as the post's. Installed while the case that
/// counts allocations runs over verbs.
const comm::verbs::api& marked_device_table() {
  static const comm::verbs::api table = [] {
    comm::verbs::api t = comm::verbs::testdev::table();
    device_post_send = t.post_send;
    t.post_send = [](ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
      in_test_device = true;
      const int result = device_post_send(qp, wr, bad);
      in_test_device = false;
      return result;
    };
    return t;
  }();
  return table;
}

/// Runs the registered verbs transport over marked_device_table() while it lives.
struct marked_device {
  explicit marked_device(const std::string& transport) : active(transport == "verbs") {
    if (active) comm::verbs::use_verbs_table(marked_device_table());
  }
  ~marked_device() {
    if (active) comm::verbs::use_verbs_table(comm::verbs::testdev::table());
  }
  marked_device(const marked_device&) = delete;
  marked_device& operator=(const marked_device&) = delete;
  bool active;
};

/// Posts 64 gets of 1 KiB in a row from `region` (pattern `seed`), more than any transport's
/// outstanding-read limit, and checks that they complete in posting order with their data.
void reads_complete_in_order(worker_pair& p, const remote_region& region, uint32_t seed) {
  constexpr int n = 64;
  std::vector<std::vector<uint8_t>> buffers(n, std::vector<uint8_t>(1024));
  std::vector<int> order;
  std::vector<send_tracker> trackers(n);
  std::vector<op> ops;
  for (int i = 0; i < n; ++i) {
    trackers[i].id = i;
    trackers[i].order = &order;
    iov_entry e{buffers[i].data(), 1024};
    ops.push_back(p.ab->get(&e, 1, region.address(i * 1024), region.key,
                            send_params(trackers[i], request_no_immediate_completion)));
    BOOST_REQUIRE(!ops.back().failed());
  }
  BOOST_REQUIRE(p.until([&] { return order.size() == n; }));
  for (int i = 0; i < n; ++i) {
    BOOST_CHECK_EQUAL(order[i], i);
    BOOST_CHECK_EQUAL(first_mismatch(buffers[i].data(), 1024, seed, i * 1024), -1);
    p.a->release(ops[i].req);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(data)

BOOST_DATA_TEST_CASE(get_fills_the_iov_in_order, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 1 << 16, 7);
  std::vector<uint8_t> storage(70000, 0xEE);
  // 3 entries; the read covers the first fully, the second partly, and never touches the third.
  iov_entry entries[] = {{storage.data() + 1, 1000}, {storage.data() + 2001, 5000},
                         {storage.data() + 8001, 4000}};
  iov_entry used[] = {entries[0], {entries[1].buffer, 3000}};
  op o = p.ab->get(used, 2, region.address(100), region.key);
  BOOST_REQUIRE(!o.failed());
  BOOST_CHECK(p.finish(o) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(entries[0].buffer, 1000, 7, 100), -1);
  BOOST_CHECK_EQUAL(first_mismatch(entries[1].buffer, 3000, 7, 1100), -1);
  BOOST_CHECK(storage[2001 + 3000] == 0xEE);
  BOOST_CHECK(storage[8001] == 0xEE && storage[0] == 0xEE && storage[1001] == 0xEE);
}

BOOST_DATA_TEST_CASE(cookie_comes_back_with_the_completion, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 4096, 8);
  std::vector<uint8_t> local(4096);
  iov_entry entry{local.data(), local.size()};
  send_tracker t;
  t.id = 1234;
  op o = p.ab->get(&entry, 1, region.address(), region.key,
                   send_params(t, request_no_immediate_completion));
  BOOST_REQUIRE(o.pending());
  BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
  BOOST_CHECK(t.st == status::ok);
  BOOST_CHECK_EQUAL(t.id, 1234);  // the user_data we passed is what the callback got
  p.a->release(o.req);
  BOOST_CHECK_EQUAL(first_mismatch(local.data(), local.size(), 8), -1);
}

BOOST_DATA_TEST_CASE(put_then_get_round_trip_sizes, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, (64u << 20) + 64, 9);
  const size_t sizes[] = {0, 1, 7, 4096, 65537, 1u << 20, 64u << 20};
  uint32_t seed = 100;
  for (size_t size : sizes) {
    BOOST_TEST_CONTEXT("size " << size) {
      auto out = pattern(size, seed);
      iov_entry src{out.data(), size};
      BOOST_CHECK(p.finish(p.ab->put(&src, 1, region.address(3), region.key)) == status::ok);
      BOOST_CHECK(p.finish(p.ab->flush()) == status::ok);
      BOOST_CHECK_EQUAL(first_mismatch(region.bytes.data() + 3, size, seed), -1);
      std::vector<uint8_t> back(size + 1, 0xEE);
      iov_entry dst{back.data(), size};
      BOOST_CHECK(p.finish(p.ab->get(&dst, 1, region.address(3), region.key)) == status::ok);
      BOOST_CHECK_EQUAL(first_mismatch(back.data(), size, seed), -1);
      BOOST_CHECK(back[size] == 0xEE);
      ++seed;
    }
  }
}

BOOST_DATA_TEST_CASE(two_reads_may_carry_the_same_cookie, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 8192, 12);
  std::vector<uint8_t> x(4096), y(4096);
  /// What the callback was told, in order: the request and the status.
  struct seen_t {
    std::vector<std::pair<request*, status>> calls;
  } seen;
  request_params params;
  params.flags = request_no_immediate_completion;
  params.user_data = &seen;  // one cookie for both reads
  params.send_cb = [](request* req, status st, void* cookie) {
    static_cast<seen_t*>(cookie)->calls.emplace_back(req, st);
  };
  const iov_entry into_x{x.data(), x.size()}, into_y{y.data(), y.size()};
  op first = p.ab->get(&into_x, 1, region.address(0), region.key, params);
  op second = p.ab->get(&into_y, 1, region.address(4096), region.key, params);
  BOOST_REQUIRE(first.pending());
  BOOST_REQUIRE(second.pending());
  BOOST_REQUIRE(p.until([&] { return seen.calls.size() == 2; }));
  BOOST_TEST(seen.calls[0].first == first.req);
  BOOST_TEST(seen.calls[1].first == second.req);
  BOOST_TEST(seen.calls[0].second == status::ok);
  BOOST_TEST(seen.calls[1].second == status::ok);
  BOOST_TEST(first_mismatch(x.data(), x.size(), 12, 0) == -1);
  BOOST_TEST(first_mismatch(y.data(), y.size(), 12, 4096) == -1);
  p.spin(100);
  BOOST_TEST(seen.calls.size() == 2u);
  p.a->release(first.req);
  p.a->release(second.req);
}

BOOST_DATA_TEST_CASE(the_iov_array_is_the_callers_again_when_the_post_returns, each_transport(),
                     transport) {
  worker_pair p(transport);
  remote_region region(p, 8192, 13);
  // Served by b's worker: the data moves only once b progresses, after the posts returned.
  rkey* served = key_served_by_owner(p, region.handle);
  std::vector<uint8_t> target(6000, 0xEE), decoy(6000, 0x11);
  const std::vector<uint8_t> source = pattern(3000, 14);
  auto read_array = std::make_unique<iov_entry[]>(3);
  read_array[0] = {target.data(), 1000};
  read_array[1] = {target.data() + 2000, 1000};
  read_array[2] = {target.data() + 4000, 1000};
  auto write_array = std::make_unique<iov_entry[]>(2);
  write_array[0] = {const_cast<uint8_t*>(source.data()), 1500};
  write_array[1] = {const_cast<uint8_t*>(source.data()) + 1500, 1500};
  send_tracker read_done, write_done;
  op get = p.ab->get(read_array.get(), 3, region.address(100), served,
                     send_params(read_done, request_no_immediate_completion));
  op put = p.ab->put(write_array.get(), 2, region.address(5000), served,
                     send_params(write_done, request_no_immediate_completion));
  BOOST_REQUIRE(get.pending());
  BOOST_REQUIRE(put.pending());
  // The arrays are reused for something else and freed before anything moved.
  BOOST_TEST(read_done.calls + write_done.calls == 0);
  for (int i = 0; i < 3; ++i) read_array[i] = {decoy.data() + i, 1};
  for (int i = 0; i < 2; ++i) write_array[i] = {decoy.data() + 10 + i, 1};
  read_array.reset();
  write_array.reset();
  BOOST_REQUIRE(p.until([&] { return read_done.calls == 1 && write_done.calls == 1; }));
  BOOST_TEST(read_done.st == status::ok);
  BOOST_TEST(write_done.st == status::ok);
  BOOST_TEST(first_mismatch(target.data(), 1000, 13, 100) == -1);
  BOOST_TEST(first_mismatch(target.data() + 2000, 1000, 13, 1100) == -1);
  BOOST_TEST(first_mismatch(target.data() + 4000, 1000, 13, 2100) == -1);
  BOOST_TEST((target[1000] == 0xEE && target[3999] == 0xEE && target[5000] == 0xEE));
  BOOST_TEST(std::equal(source.begin(), source.end(), region.bytes.begin() + 5000));
  BOOST_TEST(std::all_of(decoy.begin(), decoy.end(), [](uint8_t b) { return b == 0x11; }));
  p.a->release(get.req);
  p.a->release(put.req);
  p.ab->rkey_destroy(served);
}

BOOST_DATA_TEST_CASE(a_post_allocates_nothing_once_the_pool_is_warm, each_transport(),
                     transport) {
  const marked_device device(transport);  // verbs: the test device's own allocations not counted
  worker_pair p(transport);
  constexpr size_t n = 24, size = 2048;
  remote_region region(p, n * size, 15);
  const remote_segment whole = p.ab->rkey_segment(region.key);
  // The local buffers are registered, as DAT's local iov is (LMRs): one slab for the two-entry
  // reads, one for the whole-segment reads, one holding what the puts write (the region's own
  // bytes: the writes change nothing the reads could see).
  std::vector<uint8_t> halves_slab(n * size), wholes_slab(n * n * size);
  std::vector<uint8_t> original = pattern(n * size, 15);
  std::vector<memh_ptr> maps;
  for (auto* slab : {&halves_slab, &wholes_slab, &original}) {
    maps.push_back(p.a->mem_map(mutable_bytes(slab->data(), slab->size())).value());
  }
  std::vector<op> ops(3 * n);
  // n of each kind in flight at once.
  const auto post_all = [&] {
    const uint64_t before = allocations.load();
    counting = true;
    for (size_t i = 0; i < n; ++i) {
      uint8_t* half = halves_slab.data() + i * size;
      const iov_entry halves[] = {{half, size / 2}, {half + size / 2, size / 2}};
      ops[3 * i] = p.ab->get(halves, 2, region.address(i * size), region.key);
      const iov_entry all{wholes_slab.data() + i * n * size, n * size};
      ops[3 * i + 1] = p.ab->get(&all, 1, whole);
      const iov_entry from[] = {{original.data() + i * size, size / 2},
                                {original.data() + i * size + size / 2, size / 2}};
      ops[3 * i + 2] = p.ab->put(from, 2, region.address(i * size), region.key);
    }
    counting = false;
    return allocations.load() - before;
  };
  const auto finish_all = [&] {
    for (op& o : ops) BOOST_TEST(p.finish(o) == status::ok);
  };
  const uint64_t cold = post_all();
  finish_all();
  const uint64_t warm = post_all();
  finish_all();
  BOOST_TEST_MESSAGE(transport << ": " << cold << " allocations in the first " << 3 * n
                               << " posts, " << warm << " once warm");
  BOOST_TEST(warm == 0u);
  BOOST_TEST(first_mismatch(halves_slab.data() + 3 * size, size, 15, 3 * size) == -1);
  BOOST_TEST(first_mismatch(wholes_slab.data() + 5 * n * size, n * size, 15) == -1);
}

BOOST_DATA_TEST_CASE(the_optimal_alignment_is_a_power_of_two_and_a_get_there_fills_it,
                     each_transport(), transport) {
  worker_pair p(transport);
  const size_t align = p.a->optimal_alignment();
  BOOST_TEST(align >= alignof(std::max_align_t));
  BOOST_TEST((align & (align - 1)) == 0u, align << " is a power of two");
  BOOST_TEST(align <= static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  BOOST_TEST(p.b->optimal_alignment() == align, "a property of the machine");
  // Buffers at that alignment work as any other.
  remote_region region(p, 4 * align, 3);
  void* raw = std::aligned_alloc(align, 4 * align);
  BOOST_REQUIRE(raw != nullptr);
  BOOST_TEST(reinterpret_cast<uintptr_t>(raw) % align == 0u);
  const iov_entry entry{raw, 4 * align};
  BOOST_TEST(p.finish(p.ab->get(&entry, 1, region.address(), region.key)) == status::ok);
  BOOST_TEST(first_mismatch(raw, 4 * align, 3) == -1);
  std::free(raw);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(errors)

BOOST_DATA_TEST_CASE(out_of_bounds_and_past_the_end, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 4096, 10);
  std::vector<uint8_t> local(8192);
  iov_entry e{local.data(), 100};
  op before = p.ab->get(&e, 1, region.address() - 64, region.key);
  BOOST_CHECK(before.st == status::protection_error);
  op after = p.ab->get(&e, 1, region.address() + 8192, region.key);
  BOOST_CHECK(after.st == status::protection_error);
  op past = p.ab->get(&e, 1, region.address(4000), region.key);
  BOOST_CHECK(past.st == status::length_error);
  iov_entry big{local.data(), 4097};
  BOOST_CHECK(p.ab->put(&big, 1, region.address(), region.key).st == status::length_error);
  // Nothing outside the region was read or written, and the endpoint still works.
  BOOST_CHECK(p.ab->state() == status::ok);
  BOOST_CHECK(tag_roundtrip(p, 100, 11, true));
}

BOOST_DATA_TEST_CASE(garbage_and_stale_keys, each_transport(), transport) {
  worker_pair p(transport);
  rkey* key = nullptr;
  std::vector<uint8_t> garbage(64, 0x5a);
  BOOST_CHECK(p.ab->rkey_unpack(garbage.data(), garbage.size(), &key) == status::invalid_param);
  BOOST_CHECK(p.ab->rkey_unpack(garbage.data(), 3, &key) == status::invalid_param);
  std::vector<uint8_t> buffer(4096);
  memh* handle = nullptr;
  BOOST_REQUIRE(p.b->mem_map(buffer.data(), buffer.size(), &handle) == status::ok);
  std::vector<uint8_t> packed;
  BOOST_REQUIRE(p.b->rkey_pack(handle, packed) == status::ok);
  BOOST_REQUIRE(p.ab->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  BOOST_REQUIRE(p.b->mem_unmap(handle) == status::ok);
  std::vector<uint8_t> local(64);
  iov_entry e{local.data(), local.size()};
  const uint64_t address = reinterpret_cast<uintptr_t>(buffer.data());
  error_log errors;
  p.ab->set_error_handler(record_error, &errors);
  const status stale = p.finish(p.ab->get(&e, 1, address, key));
  BOOST_CHECK_MESSAGE(stale == status::protection_error, "stale key: " << to_string(stale));
  p.ab->rkey_destroy(key);
  if (remote_errors_fail_connection(transport)) {
    // The peer's device refused the read and the connection failed with it (an RC queue pair
    // goes to the error state): the endpoint says so, once, and a new endpoint works.
    BOOST_CHECK(p.until([&] { return errors.calls > 0; }));
    BOOST_CHECK_EQUAL(errors.calls, 1);
    BOOST_CHECK(errors.reason == status::protection_error);
    BOOST_CHECK(p.ab->state() == status::protection_error);
    BOOST_CHECK(p.ab->close().done());
    BOOST_REQUIRE(p.a->connect(p.b->address(), &p.ab) == status::ok);
    BOOST_REQUIRE(p.until([&] { return worker_pair::wired(p.ab); }));
  } else {
    // Only the operation was refused: the endpoint keeps working.
    p.spin(100);
    BOOST_CHECK_EQUAL(errors.calls, 0);
    BOOST_CHECK(p.ab->state() == status::ok);
  }
  BOOST_CHECK(tag_roundtrip(p, 64, 12, true));
}

BOOST_DATA_TEST_CASE(key_of_another_endpoint_is_refused, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 256, 13);
  std::vector<uint8_t> local(64);
  iov_entry e{local.data(), local.size()};
  // region.key was unpacked for ab; using it on ba is a caller error.
  BOOST_CHECK(p.ba->get(&e, 1, region.address(), region.key).st == status::invalid_param);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dat_flags)

BOOST_DATA_TEST_CASE(suppressed_completion_still_counts_for_flush, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 1 << 20, 14);
  std::vector<uint8_t> local(1 << 20);
  send_tracker t;
  for (int i = 0; i < 16; ++i) {
    iov_entry e{local.data() + i * 65536, 65536};
    op o = p.ab->get(&e, 1, region.address(i * 65536), region.key,
                     send_params(t, request_completion_suppressed));
    BOOST_CHECK(o.done());  // no request for the caller
  }
  BOOST_CHECK(p.finish(p.ab->flush()) == status::ok);
  BOOST_CHECK_EQUAL(t.calls, 0);
  BOOST_CHECK_EQUAL(first_mismatch(local.data(), local.size(), 14), -1);
}

BOOST_DATA_TEST_CASE(fenced_put_after_reads, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 8192, 15);
  std::vector<uint8_t> read_back(4096);
  iov_entry r{read_back.data(), read_back.size()};
  op g = p.ab->get(&r, 1, region.address(), region.key);
  auto fresh = pattern(4096, 16);
  iov_entry w{fresh.data(), fresh.size()};
  send_tracker fenced;
  op put = p.ab->put(&w, 1, region.address(), region.key, send_params(fenced, request_fence));
  BOOST_CHECK(p.finish(g) == status::ok);
  BOOST_CHECK(p.finish(put) == status::ok);
  // The read saw the old bytes: the fenced write could not overtake it.
  BOOST_CHECK_EQUAL(first_mismatch(read_back.data(), 4096, 15), -1);
  BOOST_CHECK_EQUAL(first_mismatch(region.bytes.data(), 4096, 16), -1);
}

BOOST_DATA_TEST_CASE(many_reads_complete_in_order, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 1 << 16, 17);
  reads_complete_in_order(p, region, 17);
}

BOOST_DATA_TEST_CASE(posts_on_a_disconnected_endpoint_are_flushed, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 4096, 18);
  detail::impl(*p.ab).fail(status::connection_reset);
  std::vector<uint8_t> local(64, 0xEE);
  iov_entry e{local.data(), local.size()};
  send_tracker got, put, suppressed;
  op g = p.ab->get(&e, 1, region.address(), region.key, send_params(got));
  BOOST_REQUIRE(g.pending());  // posted, then flushed: the callback ran with that status
  BOOST_CHECK_EQUAL(got.calls, 1);
  BOOST_CHECK(got.st == status::flushed);
  BOOST_CHECK(p.a->request_status(g.req) == status::flushed);
  p.a->release(g.req);
  op w = p.ab->put(&e, 1, region.address(), region.key, send_params(put));
  BOOST_REQUIRE(w.pending());
  BOOST_CHECK(put.calls == 1 && put.st == status::flushed);
  p.a->release(w.req);
  // Suppression hides successes only: a flushed post still reports.
  op s = p.ab->get(&e, 1, region.address(), region.key,
                   send_params(suppressed, request_completion_suppressed));
  BOOST_CHECK(s.done());
  BOOST_CHECK(suppressed.calls == 1 && suppressed.st == status::flushed);
  BOOST_CHECK(local[0] == 0xEE);
}

BOOST_DATA_TEST_CASE(suppressed_failure_still_reports_its_error, each_transport(), transport) {
  worker_pair p(transport);
  std::vector<uint8_t> buffer(4096, 0x11);
  memh* handle = nullptr;
  BOOST_REQUIRE(p.b->mem_map(buffer.data(), buffer.size(), &handle,
                             mem_access_all & ~mem_remote_read) == status::ok);
  // The owner refuses the read, whatever rights the reader's copy of the key claims.
  rkey* key = forged_key(p, handle, mem_access_all, 0);
  std::vector<uint8_t> local(512, 0xEE);
  iov_entry e{local.data(), local.size()};
  send_tracker t;
  t.id = 77;
  op o = p.ab->get(&e, 1, reinterpret_cast<uintptr_t>(buffer.data()), key,
                   send_params(t, request_completion_suppressed));
  BOOST_CHECK(!o.pending());
  if (!o.failed()) BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
  const status st = o.failed() ? o.st : t.st;
  BOOST_CHECK_MESSAGE(st == status::privileges_violation, to_string(st));
  BOOST_CHECK_EQUAL(t.id, 77);  // the cookie came back with the error
  BOOST_CHECK(p.finish(p.ab->flush()) == status::ok);
  BOOST_CHECK(local[0] == 0xEE);
  p.ab->rkey_destroy(key);
  BOOST_CHECK(p.b->mem_unmap(handle) == status::ok);
}

BOOST_DATA_TEST_CASE(unsignalled_completes_without_notifying, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 8192, 20);
  std::vector<uint8_t> local(8192);
  iov_entry e{local.data(), local.size()};
  send_tracker t;
  op o = p.ab->get(&e, 1, region.address(), region.key,
                   send_params(t, request_unsignalled | request_no_immediate_completion));
  BOOST_REQUIRE(o.pending());  // the caller has its request: the completion is recorded there
  BOOST_REQUIRE(p.until([&] { return p.a->request_status(o.req) != status::in_progress; }));
  BOOST_CHECK(p.a->request_status(o.req) == status::ok);
  BOOST_CHECK_EQUAL(t.calls, 0);  // ... but a success does not notify
  p.a->release(o.req);
  BOOST_CHECK_EQUAL(first_mismatch(local.data(), local.size(), 20), -1);
  // A failure notifies.
  op bad = p.ab->get(&e, 1, region.address() - 4096, region.key,
                     send_params(t, request_unsignalled));
  if (bad.pending()) {
    BOOST_REQUIRE(p.until([&] { return t.calls == 1; }));
    BOOST_CHECK(t.st == status::protection_error);
    p.a->release(bad.req);
  } else {
    BOOST_CHECK(bad.st == status::protection_error);
  }
}

BOOST_DATA_TEST_CASE(fenced_get_waits_for_earlier_puts, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 4u << 20, 21);
  // Once through the lane (on self and shm the put is a local copy, done in the call), once
  // through b's worker, where the put is in flight on every lane until b answers.
  rkey* served = key_served_by_owner(p, region.handle);
  for (rkey* key : {region.key, served}) {
    const uint32_t seed = key == served ? 23 : 22;
    auto fresh = pattern(4u << 20, seed);
    iov_entry w{fresh.data(), fresh.size()};
    op put = p.ab->put(&w, 1, region.address(), key);
    auto& rma = module_of<detail::rma_protocol>(detail::impl(*p.a));
    const unsigned puts_in_flight = rma.ops_in_flight(detail::impl(*p.ab));
    if (key == served) BOOST_CHECK_GT(puts_in_flight, 0u);
    std::vector<uint8_t> back(4096);
    iov_entry r{back.data(), back.size()};
    op get = p.ab->get(&r, 1, region.address((4u << 20) - 4096), key,
                       request_params{.flags = request_fence});
    if (puts_in_flight > 0) {
      // The fenced read may not start while the write is in flight.
      BOOST_CHECK_EQUAL(rma.reads_in_flight(detail::impl(*p.ab)), 0u);
      BOOST_CHECK(get.pending());
    }
    BOOST_CHECK(p.finish(put) == status::ok);
    BOOST_CHECK(p.finish(get) == status::ok);
    BOOST_CHECK_EQUAL(first_mismatch(back.data(), 4096, seed, (4u << 20) - 4096), -1);
  }
  p.ab->rkey_destroy(served);
}

BOOST_DATA_TEST_CASE(reads_never_exceed_what_the_peer_accepts, each_transport(), transport) {
  worker_pair p(transport, [](config& c) { c.limits.rma_reads_in = 2; });
  // The limit travels in the worker's address, in the entry of every device of the transport.
  auto address = p.b->address();
  auto words = kj::heapArray<capnp::word>(address.size() / 8);
  std::memcpy(words.begin(), address.data(), address.size());
  capnp::FlatArrayMessageReader reader(words);
  auto transports = reader.getRoot<wire::schema::WorkerAddress>().getTransports();
  BOOST_REQUIRE_GE(transports.size(), 1u);
  for (auto t : transports) BOOST_CHECK_EQUAL(t.getReadsIn(), 2u);
  auto& rma = module_of<detail::rma_protocol>(detail::impl(*p.a));
  BOOST_CHECK_EQUAL(rma.read_limit(detail::impl(*p.ab)), 2u);
  remote_region region(p, 1 << 16, 23);
  reads_complete_in_order(p, region, 23);
  BOOST_CHECK_LE(rma.peak_reads(detail::impl(*p.ab)), 2u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(registration)

BOOST_DATA_TEST_CASE(map_unmap_many_times_leaks_nothing, each_transport(), transport) {
  worker_pair p(transport);
  std::vector<uint8_t> buffer(1 << 16);
  for (int i = 0; i < 2000; ++i) {
    memh* h = nullptr;
    BOOST_REQUIRE(p.b->mem_map(buffer.data() + (i % 7), 4096, &h) == status::ok);
    std::vector<uint8_t> packed;
    BOOST_REQUIRE(p.b->rkey_pack(h, packed) == status::ok);
    rkey* key = nullptr;
    BOOST_REQUIRE(p.ab->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
    p.ab->rkey_destroy(key);
    BOOST_REQUIRE(p.b->mem_unmap(h) == status::ok);
  }
  BOOST_CHECK(tag_roundtrip(p, 1 << 20, 19, true));  // rendezvous registrations still work
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rights)

BOOST_DATA_TEST_CASE(remote_rights_are_enforced, each_transport(), transport) {
  worker_pair p(transport);
  auto bytes = pattern(4096, 30);
  memh* read_only = nullptr;
  BOOST_REQUIRE(p.b->mem_map(bytes.data(), bytes.size(), &read_only,
                             mem_local_read | mem_local_write | mem_remote_read) == status::ok);
  std::vector<uint8_t> packed;
  BOOST_REQUIRE(p.b->rkey_pack(read_only, packed) == status::ok);
  rkey* key = nullptr;
  BOOST_REQUIRE(p.ab->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  const uint64_t address = reinterpret_cast<uintptr_t>(bytes.data());
  std::vector<uint8_t> local(4096, 0xEE);
  iov_entry e{local.data(), local.size()};
  BOOST_CHECK(p.finish(p.ab->get(&e, 1, address, key)) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(local.data(), local.size(), 30), -1);
  BOOST_CHECK(p.ab->put(&e, 1, address, key).st == status::privileges_violation);
  p.ab->rkey_destroy(key);
  BOOST_CHECK(p.b->mem_unmap(read_only) == status::ok);

  memh* write_only = nullptr;
  BOOST_REQUIRE(p.b->mem_map(bytes.data(), bytes.size(), &write_only, mem_remote_write) ==
                status::ok);
  packed.clear();
  BOOST_REQUIRE(p.b->rkey_pack(write_only, packed) == status::ok);
  BOOST_REQUIRE(p.ab->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  BOOST_CHECK(p.ab->get(&e, 1, address, key).st == status::privileges_violation);
  auto fresh = pattern(4096, 31);
  iov_entry w{fresh.data(), fresh.size()};
  BOOST_CHECK(p.finish(p.ab->put(&w, 1, address, key)) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(bytes.data(), bytes.size(), 31), -1);
  p.ab->rkey_destroy(key);
  BOOST_CHECK(p.b->mem_unmap(write_only) == status::ok);

  memh* private_region = nullptr;
  BOOST_REQUIRE(p.b->mem_map(bytes.data(), bytes.size(), &private_region,
                             mem_local_read | mem_local_write) == status::ok);
  packed.clear();
  BOOST_CHECK(p.b->rkey_pack(private_region, packed) == status::privileges_violation);
  BOOST_CHECK(p.b->mem_unmap(private_region) == status::ok);
  memh* bad = nullptr;
  BOOST_CHECK(p.b->mem_map(bytes.data(), bytes.size(), &bad, 1u << 7) == status::invalid_param);
}

BOOST_DATA_TEST_CASE(local_rights_are_enforced, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 4096, 32);
  std::vector<uint8_t> mine(8192, 0xEE);
  memh* no_write = nullptr;
  BOOST_REQUIRE(p.a->mem_map(mine.data(), 4096, &no_write, mem_local_read | mem_remote_read) ==
                status::ok);
  memh* no_read = nullptr;
  BOOST_REQUIRE(p.a->mem_map(mine.data() + 4096, 4096, &no_read,
                             mem_local_write | mem_remote_write) == status::ok);
  iov_entry into_no_write{mine.data() + 100, 64};
  BOOST_CHECK(p.ab->get(&into_no_write, 1, region.address(), region.key).st ==
              status::privileges_violation);
  BOOST_CHECK(mine[100] == 0xEE);
  iov_entry from_no_read{mine.data() + 4096 + 100, 64};
  BOOST_CHECK(p.ab->put(&from_no_read, 1, region.address(), region.key).st ==
              status::privileges_violation);
  BOOST_CHECK_EQUAL(first_mismatch(region.bytes.data(), 4096, 32), -1);
  // The rights each region grants still work.
  BOOST_CHECK(p.finish(p.ab->put(&into_no_write, 1, region.address(), region.key)) == status::ok);
  BOOST_CHECK(p.finish(p.ab->get(&from_no_read, 1, region.address(), region.key)) == status::ok);
  BOOST_CHECK(p.a->mem_unmap(no_write) == status::ok);
  BOOST_CHECK(p.a->mem_unmap(no_read) == status::ok);
  // Unmapped: the buffer is plain memory again.
  BOOST_CHECK(p.finish(p.ab->get(&into_no_write, 1, region.address(), region.key)) ==
              status::ok);
}

BOOST_DATA_TEST_CASE(hostile_reader_with_a_forged_key_gets_an_error, each_transport(), transport) {
  worker_pair p(transport);
  // b's region is 4096 bytes inside a larger buffer: the bytes around it are b's too.
  std::vector<uint8_t> memory(3 * 4096, 0x5A);
  uint8_t* region = memory.data() + 4096;
  memh* read_only = nullptr;
  BOOST_REQUIRE(p.b->mem_map(region, 4096, &read_only, mem_remote_read) == status::ok);
  const uint64_t address = reinterpret_cast<uintptr_t>(region);
  auto evil = pattern(8192, 33);
  iov_entry w{evil.data(), 4096};
  // Rights beyond what b granted: the reader claims remote write.
  rkey* writer = forged_key(p, read_only, mem_access_all, 0);
  const status written = p.finish(p.ab->put(&w, 1, address, writer));
  BOOST_CHECK_MESSAGE(written == status::privileges_violation, to_string(written));
  p.ab->rkey_destroy(writer);
  // A length beyond the region: reads and writes past its end are refused.
  memh* full = nullptr;
  BOOST_REQUIRE(p.b->mem_map(region, 4096, &full) == status::ok);
  rkey* longer = forged_key(p, full, 0, 8192);
  iov_entry w2{evil.data(), 8192};
  const status past = p.finish(p.ab->put(&w2, 1, address, longer));
  BOOST_CHECK_MESSAGE(is_error(past), to_string(past));
  std::vector<uint8_t> stolen(8192, 0xEE);
  iov_entry r{stolen.data(), stolen.size()};
  const status read = p.finish(p.ab->get(&r, 1, address, longer));
  BOOST_CHECK_MESSAGE(is_error(read), to_string(read));
  BOOST_CHECK(stolen[4096] == 0xEE && stolen[8191] == 0xEE);  // nothing past the region came
  p.ab->rkey_destroy(longer);
  // b's memory is untouched, inside and around the region.
  BOOST_CHECK(std::all_of(memory.begin(), memory.end(), [](uint8_t b) { return b == 0x5A; }));
  BOOST_CHECK(p.b->mem_unmap(full) == status::ok);
  BOOST_CHECK(p.b->mem_unmap(read_only) == status::ok);
  BOOST_CHECK(tag_roundtrip(p, 100, 34, true));
}

BOOST_DATA_TEST_CASE(remote_segment_length_fills_one_entry_partially, each_transport(),
                     transport) {
  worker_pair p(transport);
  remote_region region(p, 3000, 35);
  const remote_segment segment = p.ab->rkey_segment(region.key);
  BOOST_CHECK_EQUAL(segment.address, region.address());
  BOOST_CHECK_EQUAL(segment.length, 3000u);
  std::vector<uint8_t> storage(12000, 0xEE);
  iov_entry entries[] = {{storage.data(), 1000}, {storage.data() + 2000, 5000},
                         {storage.data() + 8000, 4000}};
  // The remote side decides how much: the first entry full, the second partly, the third not.
  BOOST_CHECK(p.finish(p.ab->get(entries, 3, segment)) == status::ok);
  BOOST_CHECK_EQUAL(first_mismatch(storage.data(), 1000, 35), -1);
  BOOST_CHECK_EQUAL(first_mismatch(storage.data() + 2000, 2000, 35, 1000), -1);
  BOOST_CHECK(storage[4000] == 0xEE && storage[6999] == 0xEE && storage[8000] == 0xEE);
  BOOST_CHECK(storage[1000] == 0xEE);
  BOOST_CHECK(p.ab->get(entries, 1, segment).st == status::length_error);  // iov too short
}

BOOST_AUTO_TEST_SUITE_END()
