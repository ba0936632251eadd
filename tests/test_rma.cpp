// RMA through the protocol layer: registration, keys, put and get with DAT's RDMA-read semantics
// (iov filled in order, cookie, completion suppression, fence, bounded outstanding reads), bad
// ranges and keys, flush, and operations on a failed endpoint. Runs over every transport present.
#define BOOST_TEST_MODULE rma
#include "fixture.hpp"

using namespace comm;
using namespace comm::test;

namespace {

/// A region of b's memory registered and unpacked on a's endpoint.
struct remote_region {
  remote_region(worker_pair& p, size_t length, uint32_t seed) : pair(p), bytes(pattern(length, seed)) {
    BOOST_REQUIRE(p.b->mem_map(bytes.data(), bytes.size(), &handle) == status::ok);
    std::vector<uint8_t> packed;
    BOOST_REQUIRE(p.b->rkey_pack(handle, packed) == status::ok);
    BOOST_REQUIRE(p.ab->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  }
  ~remote_region() {
    pair.ab->rkey_destroy(key);
    if (handle != nullptr) pair.b->mem_unmap(handle);
  }
  uint64_t address(size_t offset = 0) const {
    return reinterpret_cast<uintptr_t>(bytes.data()) + offset;
  }

  worker_pair& pair;
  std::vector<uint8_t> bytes;
  memh* handle = nullptr;
  rkey* key = nullptr;
};

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
  constexpr int n = 64;  // more than any transport's outstanding-read limit
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
    BOOST_CHECK_EQUAL(first_mismatch(buffers[i].data(), 1024, 17, i * 1024), -1);
    p.a->release(ops[i].req);
  }
}

BOOST_DATA_TEST_CASE(operations_on_a_failed_endpoint_fail, each_transport(), transport) {
  worker_pair p(transport);
  remote_region region(p, 4096, 18);
  detail::impl(*p.ab).fail(status::connection_reset);
  std::vector<uint8_t> local(64);
  iov_entry e{local.data(), local.size()};
  BOOST_CHECK(p.ab->get(&e, 1, region.address(), region.key).st == status::connection_reset);
  BOOST_CHECK(p.ab->put(&e, 1, region.address(), region.key).st == status::connection_reset);
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
