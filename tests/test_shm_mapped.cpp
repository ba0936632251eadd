// The shared heap (comm::mem_alloc / mem_free) and the mapped-segment path of shm RMA: blocks from
// several threads, plain heap blocks given to mem_free, the plain-heap fallback without fds, data
// kept by AM handlers and detached,
// get/put through a peer's mapped segment in one process and across fork() (with the iface's
// "rma mapped" counters showing which path ran), CMA for other buffers, the errors of freed and
// deregistered regions, forged segment references (in this process, and naming a hostile peer's
// FIFO, device, files and unsealed memfds, which are neither opened nor mapped), fd reuse, fork
// safety of the heap's caches, rendezvous between processes, and fd/mapping leaks. Every loop is
// bounded in count and time.
#define BOOST_TEST_MODULE shm_mapped
#include "fixture.hpp"
#include "hostile_peer.hpp"
#include "test_util.hpp"
#include "process_harness.hpp"
#include "rkey_edit.hpp"

#include <comm/memory.hpp>
#include <comm/transport/shared_heap.hpp>

#include "../transports/base/rkey.hpp"
#include "../transports/shm/shm_heap.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <mutex>
#include <ostream>
#include <random>
#include <thread>

using namespace comm;
using namespace std::chrono_literals;
using comm::test::channel;
using comm::test::first_mismatch;
using comm::test::fork_child;
using comm::test::pattern;
using comm::test::wait_child;


namespace {

constexpr size_t page = 4096;
/// Large blocks the heap keeps cached at most (shm_heap.cpp): freeing this many more evicts.
constexpr int heap_cache_count = 64;

// -- helpers --------------------------------------------------------------------------------------

std::unique_ptr<tl::iface> open_shm() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() != "shm") continue;
    std::unique_ptr<tl::iface> iface;
    const status st = c->open(tl::iface_params{}, iface);
    if (st != status::ok) throw std::runtime_error(std::string("open shm: ") + to_string(st));
    return iface;
  }
  throw std::runtime_error("no shm component");
}

std::unique_ptr<tl::ep> connect(tl::iface& from, const std::vector<uint8_t>& device,
                                const std::vector<uint8_t>& address) {
  std::unique_ptr<tl::ep> ep;
  const status st = from.create_ep(device, address, ep);
  if (st != status::ok) throw std::runtime_error(std::string("create_ep: ") + to_string(st));
  return ep;
}

uint64_t address_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

/// Fills `length` bytes at `p` with pattern `seed`.
void fill(void* p, size_t length, uint32_t seed) {
  auto* bytes = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < length; ++i) bytes[i] = test::pattern_byte(i, seed);
}

/// A registration of `length` bytes at `address` with `md` and its packed key.
struct registration {
  tl::md* md = nullptr;
  tl::mem_handle* handle = nullptr;
  std::vector<uint8_t> packed;

  registration(tl::md& domain, void* address, size_t length) : md(&domain) {
    if (md->mem_reg(address, length, &handle) != status::ok) throw std::runtime_error("mem_reg");
    if (md->rkey_pack(handle, packed) != status::ok) throw std::runtime_error("rkey_pack");
  }
  ~registration() {
    if (handle != nullptr) md->mem_dereg(handle);
  }
  status dereg() {
    const status st = md->mem_dereg(handle);
    handle = nullptr;
    return st;
  }
  /// The segment reference after the key (the key must carry one).
  tl::shm::segment_ref segment() const {
    tl::shm::segment_ref ref;
    if (packed.size() != sizeof(tl::packed_rkey) + sizeof(ref)) throw std::runtime_error("no ref");
    std::memcpy(&ref, packed.data() + sizeof(tl::packed_rkey), sizeof(ref));
    return ref;
  }
};

/// A key unpacked with `md`, released on destruction.
struct unpacked {
  tl::md* md;
  tl::remote_key key;
  status result;
  unpacked(tl::md& domain, const std::vector<uint8_t>& bytes) : md(&domain) {
    result = md->rkey_unpack(bytes.data(), bytes.size(), &key);
  }
  ~unpacked() {
    if (result == status::ok) md->rkey_release(&key);
  }
};

/// A key with its segment reference replaced by `ref`.
std::vector<uint8_t> with_segment(const std::vector<uint8_t>& packed,
                                  const tl::shm::segment_ref& ref) {
  std::vector<uint8_t> bytes(sizeof(tl::packed_rkey) + sizeof(ref));
  std::memcpy(bytes.data(), packed.data(), sizeof(tl::packed_rkey));
  std::memcpy(bytes.data() + sizeof(tl::packed_rkey), &ref, sizeof(ref));
  return bytes;
}

/// Two shm interfaces of this process and an endpoint from `a` to `b` (b owns the memory).
struct pair_fixture {
  std::unique_ptr<tl::iface> a = open_shm();
  std::unique_ptr<tl::iface> b = open_shm();
  std::unique_ptr<tl::ep> ab = connect(*a, b->device_address(), b->iface_address());

  ~pair_fixture() { ab.reset(); }

  status get(const tl::remote_key& key, void* dest, size_t length, uint64_t address) {
    const tl::iov entry{dest, length};
    return ab->get_zcopy(&entry, 1, address, key, nullptr);
  }
  status put(const tl::remote_key& key, const void* source, size_t length, uint64_t address) {
    const tl::iov entry{source, length};
    return ab->put_zcopy(&entry, 1, address, key, nullptr);
  }
};

/// The number right after `label` in `text`, or -1.
long number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return -1;
  return std::strtol(text.c_str() + at + label.size(), nullptr, 10);
}

/// Gets that took the mapped path, from an interface's (or a worker's) info.
long mapped_gets(const std::string& info) { return number_after(info, "shm: rma mapped: "); }

/// Puts that took the mapped path.
long mapped_puts(const std::string& info) {
  const size_t at = info.find("shm: rma mapped: ");
  return at == std::string::npos ? -1 : number_after(info.substr(at), " gets, ");
}

/// Failed attempts to map a peer's segment.
long map_failures(const std::string& info) {
  const size_t at = info.find("shm: rma mapped: ");
  return at == std::string::npos ? -1 : number_after(info.substr(at), " maps, ");
}

/// CMA and mapped gets together.
long all_gets(const std::string& info) { return number_after(info, "shm: rma: "); }


size_t count_maps() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) ++n;
  return n;
}

/// Frees as many large blocks as the heap caches after the blocks freed before, so that those are
/// released to the system. The blocks' size is one no test block of 64..256 KiB or 640 KiB and
/// up is reused for, so the cache ends up holding these blocks only.
void push_out_of_the_cache() {
  std::vector<void*> blocks;
  for (int i = 0; i < heap_cache_count; ++i) blocks.push_back(mem_alloc(300 * 1024));
  for (void* b : blocks) mem_free(b);
}

}  // namespace

// -- the heap -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(blocks_are_page_aligned_shared_and_reused) {
  const size_t live_before = tl::shared_heap_snapshot().live_blocks;
  const size_t sizes[] = {0, 1, 4095, 4096, 5000, 65536, 65537, size_t{1} << 20, (3u << 20) + 5};
  std::vector<void*> blocks;
  for (size_t size : sizes) {
    void* p = mem_alloc(size);
    BOOST_TEST_REQUIRE(p != nullptr);
    BOOST_TEST(address_of(p) % page == 0);
    fill(p, std::max<size_t>(size, 1), static_cast<uint32_t>(size));
    tl::shm::segment_ref ref;
    BOOST_TEST(tl::shm::heap_find(p, std::max<size_t>(size, 1), &ref));
    BOOST_TEST(uint64_t{ref.offset} >= tl::shm::heap_header_bytes);
    blocks.push_back(p);
  }
  BOOST_TEST(tl::shared_heap_snapshot().live_blocks == live_before + std::size(sizes));
  for (size_t i = 0; i < blocks.size(); ++i) {
    BOOST_TEST(first_mismatch(blocks[i], std::max<size_t>(sizes[i], 1),
                              static_cast<uint32_t>(sizes[i])) == -1);
    mem_free(blocks[i]);
  }
  BOOST_TEST(tl::shared_heap_snapshot().live_blocks == live_before);
  // A freed large block comes back for the next request of its size, already populated.
  void* first = mem_alloc(size_t{1} << 20);
  mem_free(first);
  void* again = mem_alloc(size_t{1} << 20);
  BOOST_TEST(again == first);
  mem_free(again);
  // Memory that is not the heap's is not inside a segment.
  std::vector<uint8_t> plain(page);
  tl::shm::segment_ref ref;
  BOOST_TEST(!tl::shm::heap_find(plain.data(), plain.size(), &ref));
}

BOOST_AUTO_TEST_CASE(alloc_and_free_from_several_threads) {
  // Each thread allocates, marks and hands blocks to a shared queue; any thread frees them.
  const size_t live_before = tl::shared_heap_snapshot().live_blocks;
  struct marked {
    uint8_t* block;
    size_t size;
    uint8_t mark;
  };
  std::mutex mutex;
  std::deque<marked> queue;
  std::atomic<int> bad{0};
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  auto body = [&](unsigned seed) {
    std::mt19937 random(seed);
    for (int i = 0; i < 1500 && std::chrono::steady_clock::now() < deadline; ++i) {
      const size_t size = random() % 8 == 0 ? (1u << 20) + random() % (1u << 20)
                                            : 1 + random() % (300 * 1024);
      auto* p = static_cast<uint8_t*>(mem_alloc(size));
      if (p == nullptr || address_of(p) % page != 0) {
        ++bad;
        continue;
      }
      const auto mark = static_cast<uint8_t>(random());
      p[0] = mark;
      p[size - 1] = mark;
      marked other{nullptr, 0, 0};
      {
        std::lock_guard lock(mutex);
        queue.push_back({p, size, mark});
        if (queue.size() > 16) {
          other = queue.front();
          queue.pop_front();
        }
      }
      if (other.block == nullptr) continue;
      if (other.block[0] != other.mark || other.block[other.size - 1] != other.mark) ++bad;
      mem_free(other.block);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) threads.emplace_back(body, 100 + t);
  for (std::thread& t : threads) t.join();
  for (const marked& m : queue) {
    if (m.block[0] != m.mark || m.block[m.size - 1] != m.mark) ++bad;
    mem_free(m.block);
  }
  BOOST_TEST(bad.load() == 0);
  BOOST_TEST(tl::shared_heap_snapshot().live_blocks == live_before);
}

BOOST_AUTO_TEST_CASE(mem_free_takes_plain_heap_blocks) {
  void* aligned = nullptr;
  BOOST_REQUIRE(::posix_memalign(&aligned, 64, 1000) == 0);
  mem_free(aligned);
  mem_free(std::malloc(10));
  mem_free(nullptr);
  const size_t live_before = tl::shared_heap_snapshot().live_blocks;
  void* shared = mem_alloc(100);
  mem_free(shared);
  BOOST_TEST(tl::shared_heap_snapshot().live_blocks == live_before);
}

BOOST_AUTO_TEST_CASE(detached_am_data_is_freed_with_mem_free_after_the_workers_are_gone) {
  // A small AM's persistent copy is posix_memalign'd; a rendezvous AM lands in a shared block.
  struct kept {
    std::vector<std::pair<void*, size_t>> data;
  } k;
  const size_t small = 100, large = size_t{1} << 20;
  {
    test::worker_pair p("shm");
    auto keep = [](void* arg, const void*, size_t, void* data, size_t length,
                   const am_recv_params& params) {
      if ((params.attr & am_recv_data_persistent) == 0) return status::ok;
      static_cast<kept*>(arg)->data.emplace_back(data, length);
      return status::in_progress;
    };
    BOOST_REQUIRE(p.b->set_am_handler(7, keep, &k,
                                      am_flag_whole_msg | am_flag_persistent_data |
                                          am_flag_fetch_rndv) == status::ok);
    const std::vector<uint8_t> one = pattern(small, 1), two = pattern(large, 2);
    BOOST_TEST(p.finish(p.ab->am_send(7, nullptr, 0, one.data(), one.size())) == status::ok);
    BOOST_TEST(p.finish(p.ab->am_send(7, nullptr, 0, two.data(), two.size())) == status::ok);
    BOOST_TEST_REQUIRE(p.until([&] { return k.data.size() == 2; }));
    for (auto& [data, length] : k.data) BOOST_TEST(p.b->am_data_detach(data));
    BOOST_TEST(!p.b->am_data_detach(k.data[0].first));  // no longer the worker's
  }
  BOOST_REQUIRE_EQUAL(k.data.size(), 2u);
  BOOST_TEST(k.data[0].second == small);
  BOOST_TEST(first_mismatch(k.data[0].first, small, 1) == -1);
  BOOST_TEST(k.data[1].second == large);
  BOOST_TEST(first_mismatch(k.data[1].first, large, 2) == -1);
  tl::shm::segment_ref ref;
  BOOST_TEST(!tl::shm::heap_find(k.data[0].first, small, &ref));
  BOOST_TEST(tl::shm::heap_find(k.data[1].first, large, &ref));  // shareable when sent on
  const size_t live_before = tl::shared_heap_snapshot().live_blocks;
  for (auto& [data, length] : k.data) mem_free(data);
  BOOST_TEST(tl::shared_heap_snapshot().live_blocks == live_before - 1);
}

BOOST_AUTO_TEST_CASE(without_file_descriptors_mem_alloc_falls_back_to_the_plain_heap) {
  const pid_t child = fork_child([]() -> int {
    const int lowest_free = ::dup(0);  // every fd below it is open: a limit there leaves none
    CHILD_CHECK(lowest_free >= 0 && ::close(lowest_free) == 0);
    const rlimit none_left{static_cast<rlim_t>(lowest_free), static_cast<rlim_t>(lowest_free)};
    CHILD_CHECK(::setrlimit(RLIMIT_NOFILE, &none_left) == 0);
    const uint64_t fallbacks = tl::shared_heap_snapshot().fallbacks;
    for (size_t size : {size_t{100}, size_t{1} << 20}) {
      auto* p = static_cast<uint8_t*>(mem_alloc(size));
      CHILD_CHECK(p != nullptr && address_of(p) % page == 0);
      std::memset(p, 0x77, size);
      tl::shm::segment_ref ref;
      CHILD_CHECK(!tl::shm::heap_find(p, size, &ref));
      mem_free(p);
    }
    CHILD_CHECK(tl::shared_heap_snapshot().fallbacks == fallbacks + 2);
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  BOOST_TEST(wait_child(child) == 0);
}

// -- the mapped path in one process ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(get_and_put_through_a_mapped_segment) {
  pair_fixture f;
  const size_t size = (size_t{1} << 20) + 123;
  auto* remote = static_cast<uint8_t*>(mem_alloc(size));
  fill(remote, size, 5);
  {
    registration reg(*f.b->memory_domain(), remote, size);
    BOOST_TEST(reg.packed.size() == sizeof(tl::packed_rkey) + sizeof(tl::shm::segment_ref));
    unpacked key(*f.a->memory_domain(), reg.packed);
    BOOST_TEST_REQUIRE(key.result == status::ok);
    const uint64_t base = address_of(remote);

    std::vector<uint8_t> got(size + 2, 0);
    BOOST_TEST(f.get(key.key, got.data(), size, base) == status::ok);
    BOOST_TEST(first_mismatch(got.data(), size, 5) == -1);
    // Scattered over an iov, in order, from an offset.
    const tl::iov entries[] = {{got.data() + 1, 10}, {got.data() + 11, 0}, {got.data() + 11, 5000}};
    BOOST_TEST(f.ab->get_zcopy(entries, 3, base + 777, key.key, nullptr) == status::ok);
    BOOST_TEST(first_mismatch(got.data() + 1, 5010, 5, 777) == -1);
    BOOST_TEST(f.ab->get_zcopy(nullptr, 0, base, key.key, nullptr) == status::ok);
    const std::vector<uint8_t> data = pattern(size, 6);
    BOOST_TEST(f.put(key.key, data.data(), size, base) == status::ok);
    BOOST_TEST(first_mismatch(remote, size, 6) == -1);
    const std::string info = f.a->info();
    BOOST_TEST(mapped_gets(info) == 2);
    BOOST_TEST(mapped_puts(info) == 1);
    // One mapping of the segment serves the gets and the put (the region is open to both).
    BOOST_TEST(info.find("1 peer segments mapped") != std::string::npos);
    // Bounds: the errors CMA gives.
    uint8_t byte = 0;
    BOOST_TEST(f.get(key.key, &byte, 1, base + size) == status::protection_error);
    BOOST_TEST(f.get(key.key, &byte, 1, base - 1) == status::protection_error);
    BOOST_TEST(f.get(key.key, got.data(), 2, base + size - 1) == status::length_error);
    BOOST_TEST(f.put(key.key, got.data(), 2, base + size - 1) == status::length_error);
    // Deregistered: the key is stale, as before.
    BOOST_TEST(reg.dereg() == status::ok);
    BOOST_TEST(f.get(key.key, &byte, 1, base) == status::protection_error);
    BOOST_TEST(f.put(key.key, &byte, 1, base) == status::protection_error);
  }
  mem_free(remote);
}

BOOST_AUTO_TEST_CASE(other_buffers_still_use_cma) {
  pair_fixture f;
  std::vector<uint8_t> remote = pattern(100000, 8);
  registration reg(*f.b->memory_domain(), remote.data(), remote.size());
  BOOST_TEST(reg.packed.size() == sizeof(tl::packed_rkey));
  unpacked key(*f.a->memory_domain(), reg.packed);
  BOOST_TEST_REQUIRE(key.result == status::ok);
  std::vector<uint8_t> got(remote.size());
  BOOST_TEST(f.get(key.key, got.data(), got.size(), address_of(remote.data())) == status::ok);
  BOOST_TEST(got == remote);
  const std::vector<uint8_t> data = pattern(remote.size(), 9);
  BOOST_TEST(f.put(key.key, data.data(), data.size(), address_of(remote.data())) == status::ok);
  BOOST_TEST(remote == data);
  const std::string info = f.a->info();
  BOOST_TEST(all_gets(info) == 1);
  BOOST_TEST(mapped_gets(info) == 0);
  BOOST_TEST(mapped_puts(info) == 0);
}

BOOST_AUTO_TEST_CASE(a_segment_released_under_a_registration_is_an_io_error) {
  // CMA reports EFAULT (io_error) for memory unmapped under a live registration; the mapped path
  // sees the owner's release mark and says the same.
  pair_fixture f;
  const size_t size = 128 * 1024;
  void* remote = mem_alloc(size);
  fill(remote, size, 10);
  registration reg(*f.b->memory_domain(), remote, size);
  unpacked key(*f.a->memory_domain(), reg.packed);
  BOOST_TEST_REQUIRE(key.result == status::ok);
  std::vector<uint8_t> got(size);
  BOOST_TEST(f.get(key.key, got.data(), size, address_of(remote)) == status::ok);
  BOOST_TEST(mapped_gets(f.a->info()) == 1);
  mem_free(remote);
  push_out_of_the_cache();  // the block's segment is unmapped and closed now
  BOOST_TEST(f.get(key.key, got.data(), size, address_of(remote)) == status::io_error);
  BOOST_TEST(f.put(key.key, got.data(), size, address_of(remote)) == status::io_error);
  BOOST_TEST(f.a->info().find("0 peer segments mapped") != std::string::npos);
  BOOST_TEST(reg.dereg() == status::ok);
  BOOST_TEST(f.get(key.key, got.data(), size, address_of(remote)) == status::protection_error);
}

BOOST_AUTO_TEST_CASE(forged_segment_references_are_refused_or_fall_back_to_cma) {
  pair_fixture f;
  const size_t size = 256 * 1024;
  void* remote = mem_alloc(size);
  void* other = mem_alloc(size);
  fill(remote, size, 11);
  fill(other, size, 12);
  {
    registration reg(*f.b->memory_domain(), remote, size);
    registration other_reg(*f.b->memory_domain(), other, size);
    const tl::shm::segment_ref good = reg.segment();
    tl::md& md = *f.a->memory_domain();
    auto unpack_status = [&](const std::vector<uint8_t>& bytes) {
      unpacked k(md, bytes);
      return k.result;
    };
    auto forged = [&](const std::function<void(tl::shm::segment_ref&)>& change) {
      tl::shm::segment_ref ref = good;
      change(ref);
      return with_segment(reg.packed, ref);
    };
    // Implausible references: refused at unpack.
    using ref_t = tl::shm::segment_ref;
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.reserved = 1; })) == status::invalid_param);
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.fd = -1; })) == status::invalid_param);
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.inode = 0; })) == status::invalid_param);
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.id = 0; })) == status::invalid_param);
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.size += 1; })) == status::invalid_param);
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.offset = 0; })) == status::invalid_param);
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.offset = r.size + page; })) ==
               status::invalid_param);
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.size = r.offset; })) ==
               status::invalid_param);  // the region does not fit
    BOOST_TEST(unpack_status(forged([](ref_t& r) { r.size = uint64_t{1} << 60; })) ==
               status::invalid_param);
    std::vector<uint8_t> shorter = reg.packed;
    shorter.pop_back();
    BOOST_TEST(unpack_status(shorter) == status::invalid_param);
    std::vector<uint8_t> longer = reg.packed;
    longer.push_back(0);
    BOOST_TEST(unpack_status(longer) == status::invalid_param);

    // Plausible but not the segment: the mapping is refused, the access still works by CMA.
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const tl::shm::segment_ref other_ref = other_reg.segment();
    const std::vector<std::vector<uint8_t>> wrong = {
        forged([](ref_t& r) { r.inode += 1; }),
        forged([](ref_t& r) { r.id += 1; }),
        forged([](ref_t& r) { r.size += page; }),
        forged([&](ref_t& r) { r.fd = null_fd; }),
        forged([](ref_t& r) { r.fd = 100000; }),
        forged([&](ref_t& r) { r.fd = other_ref.fd; }),  // another segment, our inode
        forged([&](ref_t& r) {                           // another segment, our id
          r.fd = other_ref.fd;
          r.inode = other_ref.inode;
        }),
    };
    long failures = map_failures(f.a->info());
    for (const std::vector<uint8_t>& bytes : wrong) {
      unpacked k(md, bytes);
      BOOST_TEST_REQUIRE(k.result == status::ok);
      std::vector<uint8_t> got(size, 0);
      BOOST_TEST(f.get(k.key, got.data(), size, address_of(remote)) == status::ok);
      BOOST_TEST(first_mismatch(got.data(), size, 11) == -1);
      BOOST_TEST(map_failures(f.a->info()) == ++failures);
      BOOST_TEST(mapped_gets(f.a->info()) == 0);
    }
    ::close(null_fd);
    // The genuine key is not spoiled by the forgeries.
    unpacked genuine(md, reg.packed);
    std::vector<uint8_t> got(size, 0);
    BOOST_TEST(f.get(genuine.key, got.data(), size, address_of(remote)) == status::ok);
    BOOST_TEST(first_mismatch(got.data(), size, 11) == -1);
    BOOST_TEST(mapped_gets(f.a->info()) == 1);
    // A smaller size for the segment now mapped (with a key for its first half, so that the
    // region fits): not trusted with that mapping either.
    registration half(*f.b->memory_domain(), remote, size / 2);
    tl::shm::segment_ref smaller_ref = half.segment();
    smaller_ref.size = smaller_ref.offset + size / 2;
    unpacked smaller(md, with_segment(half.packed, smaller_ref));
    BOOST_TEST_REQUIRE(smaller.result == status::ok);
    BOOST_TEST(f.get(smaller.key, got.data(), size / 2, address_of(remote)) == status::ok);
    BOOST_TEST(first_mismatch(got.data(), size / 2, 11) == -1);
    BOOST_TEST(mapped_gets(f.a->info()) == 1);
  }
  mem_free(remote);
  mem_free(other);
}

BOOST_AUTO_TEST_CASE(a_reused_fd_number_does_not_read_stale_memory) {
  pair_fixture f;
  const size_t size = 128 * 1024;
  void* first = mem_alloc(size);
  fill(first, size, 13);
  tl::shm::segment_ref first_ref;
  std::vector<uint8_t> got(size);
  {
    registration reg(*f.b->memory_domain(), first, size);
    first_ref = reg.segment();
    unpacked key(*f.a->memory_domain(), reg.packed);
    BOOST_TEST(f.get(key.key, got.data(), size, address_of(first)) == status::ok);
    BOOST_TEST(first_mismatch(got.data(), size, 13) == -1);
  }
  mem_free(first);
  push_out_of_the_cache();  // first's segment is closed
  // New segments (no cached block fits 68 KiB) until one gets first's fd number again.
  const size_t second_size = 68 * 1024;
  std::vector<void*> others;
  void* second = nullptr;
  for (int i = 0; i < 256 && second == nullptr; ++i) {
    void* p = mem_alloc(second_size);
    tl::shm::segment_ref ref;
    BOOST_TEST_REQUIRE(tl::shm::heap_find(p, second_size, &ref));
    (ref.fd == first_ref.fd ? second : others.emplace_back()) = p;
  }
  for (void* p : others) mem_free(p);
  BOOST_TEST_REQUIRE(second != nullptr);
  fill(second, second_size, 14);
  {
    registration reg(*f.b->memory_domain(), second, second_size);
    const tl::shm::segment_ref second_ref = reg.segment();
    BOOST_TEST(int{second_ref.fd} == int{first_ref.fd});
    BOOST_TEST(uint64_t{second_ref.inode} != uint64_t{first_ref.inode});
    unpacked key(*f.a->memory_domain(), reg.packed);
    BOOST_TEST(f.get(key.key, got.data(), second_size, address_of(second)) == status::ok);
    BOOST_TEST(first_mismatch(got.data(), second_size, 14) == -1);
    BOOST_TEST(mapped_gets(f.a->info()) == 2);
  }
  mem_free(second);
}

BOOST_AUTO_TEST_CASE(no_fd_or_mapping_leaks_over_many_cycles) {
  std::vector<uint8_t> local(3u << 20);
  push_out_of_the_cache();  // the cache at its steady state
  const tl::shared_heap_stats before = tl::shared_heap_snapshot();
  const size_t fds_before = comm::test::open_fds();
  const size_t maps_before = count_maps();
  const size_t sizes[] = {page, 100 * 1024, size_t{1} << 20, 3u << 20};
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  {
    pair_fixture f;
    for (int i = 0; i < 300 && std::chrono::steady_clock::now() < deadline; ++i) {
      const size_t size = sizes[i % std::size(sizes)];
      void* remote = mem_alloc(size);
      fill(remote, 64, static_cast<uint32_t>(i));
      {
        registration reg(*f.b->memory_domain(), remote, size);
        unpacked key(*f.a->memory_domain(), reg.packed);
        BOOST_TEST_REQUIRE(f.get(key.key, local.data(), size, address_of(remote)) == status::ok);
        BOOST_TEST_REQUIRE(first_mismatch(local.data(), 64, static_cast<uint32_t>(i)) == -1);
        BOOST_TEST_REQUIRE(f.put(key.key, local.data(), size, address_of(remote)) == status::ok);
      }
      mem_free(remote);
      if (i % 50 == 49) push_out_of_the_cache();  // segments released and made anew
    }
    BOOST_TEST(mapped_gets(f.a->info()) > 0);
  }
  const tl::shared_heap_stats after = tl::shared_heap_snapshot();
  BOOST_TEST(after.live_blocks == before.live_blocks);
  BOOST_TEST(after.cached_segments <= static_cast<size_t>(heap_cache_count));
  // Every fd and mapping left over is a segment the heap accounts for (its cache and slabs).
  const long extra_segments = static_cast<long>(after.segments) - static_cast<long>(before.segments);
  BOOST_TEST(extra_segments <= 8);
  BOOST_TEST(static_cast<long>(comm::test::open_fds()) - static_cast<long>(fds_before) == extra_segments);
  BOOST_TEST(static_cast<long>(count_maps()) - static_cast<long>(maps_before) <=
             extra_segments + 4);  // + a few of malloc's own
}

// -- across processes -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_forked_child_never_reuses_the_parents_cached_blocks) {
  const size_t size = size_t{1} << 20;
  void* block = mem_alloc(size);
  fill(block, size, 15);
  mem_free(block);  // cached in the parent
  channel to_parent;
  const pid_t child = fork_child([&]() -> int {
    void* mine = mem_alloc(size);  // must be a segment of the child's own
    CHILD_CHECK(mine != nullptr);
    std::memset(mine, 0x5a, size);
    tl::shm::segment_ref ref;
    CHILD_CHECK(tl::shm::heap_find(mine, size, &ref));
    to_parent.send_word(ref.inode);
    mem_free(mine);
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  uint64_t child_inode = 0;
  BOOST_TEST(to_parent.receive_word(&child_inode));
  BOOST_TEST(wait_child(child) == 0);
  void* again = mem_alloc(size);
  BOOST_TEST(again == block);
  BOOST_TEST(first_mismatch(again, size, 15) == -1);  // the child did not write into it
  tl::shm::segment_ref ref;
  BOOST_TEST(tl::shm::heap_find(again, size, &ref));
  BOOST_TEST(uint64_t{ref.inode} != child_inode);
  mem_free(again);
}

BOOST_AUTO_TEST_CASE(get_and_put_a_shared_block_of_a_forked_child) {
  const size_t size = 4u << 20;
  channel to_parent, to_child;
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_shm();
    auto* shared = static_cast<uint8_t*>(mem_alloc(size));
    CHILD_CHECK(shared != nullptr);
    fill(shared, size, 16);
    std::vector<uint8_t> plain = pattern(size, 17);
    auto reg = std::make_unique<registration>(*iface->memory_domain(), shared, size);
    registration plain_reg(*iface->memory_domain(), plain.data(), plain.size());
    to_parent.send(iface->device_address());
    to_parent.send(iface->iface_address());
    to_parent.send(reg->packed);
    to_parent.send_word(address_of(shared));
    to_parent.send(plain_reg.packed);
    to_parent.send_word(address_of(plain.data()));
    uint64_t step = 0;
    CHILD_CHECK(to_child.receive_word(&step) && step == 1);  // the parent has put
    CHILD_CHECK(first_mismatch(shared, size, 18) == -1);
    CHILD_CHECK(first_mismatch(plain.data(), size, 19) == -1);
    reg.reset();  // deregistered
    to_parent.send_word(2);
    CHILD_CHECK(to_child.receive_word(&step) && step == 3);
    mem_free(shared);
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  std::vector<uint8_t> device, address, key_bytes, plain_key_bytes;
  uint64_t base = 0, plain_base = 0;
  BOOST_REQUIRE(to_parent.receive(&device) && to_parent.receive(&address) &&
                to_parent.receive(&key_bytes) && to_parent.receive_word(&base) &&
                to_parent.receive(&plain_key_bytes) && to_parent.receive_word(&plain_base));
  {
    auto iface = open_shm();
    auto ep = connect(*iface, device, address);
    unpacked key(*iface->memory_domain(), key_bytes);
    unpacked plain_key(*iface->memory_domain(), plain_key_bytes);
    BOOST_REQUIRE(key.result == status::ok && plain_key.result == status::ok);
    std::vector<uint8_t> got(size, 0);
    const tl::iov whole{got.data(), size};
    BOOST_TEST(ep->get_zcopy(&whole, 1, base, key.key, nullptr) == status::ok);
    BOOST_TEST(first_mismatch(got.data(), size, 16) == -1);
    BOOST_TEST(ep->get_zcopy(&whole, 1, plain_base, plain_key.key, nullptr) == status::ok);
    BOOST_TEST(first_mismatch(got.data(), size, 17) == -1);
    const std::vector<uint8_t> data = pattern(size, 18), plain_data = pattern(size, 19);
    const tl::iov put{data.data(), size}, plain_put{plain_data.data(), size};
    BOOST_TEST(ep->put_zcopy(&put, 1, base, key.key, nullptr) == status::ok);
    BOOST_TEST(ep->put_zcopy(&plain_put, 1, plain_base, plain_key.key, nullptr) == status::ok);
    const std::string info = iface->info();
    BOOST_TEST(mapped_gets(info) == 1);  // the shared block; the plain one went by CMA
    BOOST_TEST(mapped_puts(info) == 1);
    BOOST_TEST(all_gets(info) == 2);
    to_child.send_word(1);
    uint64_t step = 0;
    BOOST_TEST((to_parent.receive_word(&step) && step == 2));
    uint8_t byte = 0;
    const tl::iov one{&byte, 1};
    BOOST_TEST(ep->get_zcopy(&one, 1, base, key.key, nullptr) == status::protection_error);
    BOOST_TEST(ep->put_zcopy(&one, 1, base, key.key, nullptr) == status::protection_error);
    to_child.send_word(3);
  }
  BOOST_TEST(wait_child(child) == 0);
}

namespace {

/// The owner's side of a key to a shared block: its interface, the block and the registration.
struct owned_block {
  std::unique_ptr<tl::iface> iface = open_shm();
  void* block;
  std::unique_ptr<registration> reg;

  explicit owned_block(size_t size) : block(mem_alloc(size)) {
    fill(block, size, 20);
    reg = std::make_unique<registration>(*iface->memory_domain(), block, size);
  }
  ~owned_block() {
    reg.reset();
    mem_free(block);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_key_naming_a_hostile_peers_files_neither_opens_nor_maps_them) {
  using hostile = comm::test::hostile_peer;
  constexpr size_t size = size_t{1} << 20;
  constexpr uint64_t segment_bytes = tl::shm::heap_header_bytes + size;  // a fresh large block's
  constexpr uint64_t forged_id = 0x5eed5eed5eed5eedull;
  auto heap_content = [](uint8_t* base, size_t) {
    auto& h = *reinterpret_cast<tl::shm::heap_header*>(base);
    h.magic = tl::shm::heap_magic;
    h.id = forged_id;
    h.size = segment_bytes;
    h.owner_pid = static_cast<int32_t>(::getpid());
  };
  hostile peer(segment_bytes, heap_content, [](const channel& out) {
    auto owned = std::make_shared<owned_block>(size_t{size});
    out.send(owned->iface->device_address());
    out.send(owned->iface->iface_address());
    out.send(owned->reg->packed);
    out.send_word(address_of(owned->block));
    return owned;
  });
  std::vector<uint8_t> device, address, packed;
  uint64_t base = 0;
  BOOST_REQUIRE(peer.from_setup().receive(&device) && peer.from_setup().receive(&address) &&
                peer.from_setup().receive(&packed) && peer.from_setup().receive_word(&base));
  tl::shm::segment_ref genuine;
  BOOST_REQUIRE(packed.size() == sizeof(tl::packed_rkey) + sizeof(genuine));
  std::memcpy(&genuine, packed.data() + sizeof(tl::packed_rkey), sizeof(genuine));
  BOOST_REQUIRE(uint64_t{genuine.size} == segment_bytes);

  auto iface = open_shm();
  auto ep = connect(*iface, device, address);
  const size_t fds_before = comm::test::open_fds();
  const size_t maps_before = count_maps();
  std::vector<uint8_t> got(size);
  const tl::iov whole{got.data(), size};
  long failures = 0;
  for (const hostile::file f :
       {hostile::fifo, hostile::device, hostile::disk_file, hostile::leased_file, hostile::socket,
        hostile::unsealed_memfd, hostile::half_sealed_memfd, hostile::write_sealed_memfd,
        hostile::read_only_memfd, hostile::empty_sealed_memfd}) {
    BOOST_TEST_CONTEXT("file " << f) {
      tl::shm::segment_ref forged = genuine;
      forged.fd = peer.fd(f);
      forged.inode = peer.inode(f) != 0 ? peer.inode(f) : genuine.inode;
      forged.id = forged_id;
      unpacked key(*iface->memory_domain(), with_segment(packed, forged));
      BOOST_TEST_REQUIRE(key.result == status::ok);
      std::fill(got.begin(), got.end(), 0);
      // Not mapped: the get goes by CMA and reads the registered block all the same.
      BOOST_TEST(ep->get_zcopy(&whole, 1, base, key.key, nullptr) == status::ok);
      BOOST_TEST(first_mismatch(got.data(), size, 20) == -1);
      BOOST_TEST(map_failures(iface->info()) == ++failures);
      BOOST_TEST(mapped_gets(iface->info()) == 0);
    }
  }
  BOOST_TEST(peer.opens_seen() == 0u);
  BOOST_TEST(!peer.lease_broken());
  BOOST_TEST(comm::test::open_fds() == fds_before);
  BOOST_TEST(count_maps() <= maps_before + 2);  // a few of malloc's own at most
  // The genuine key still takes the mapped path.
  unpacked key(*iface->memory_domain(), packed);
  BOOST_TEST(ep->get_zcopy(&whole, 1, base, key.key, nullptr) == status::ok);
  BOOST_TEST(first_mismatch(got.data(), size, 20) == -1);
  BOOST_TEST(mapped_gets(iface->info()) == 1);
}

namespace {

/// One side of a libcomm test across processes: an shm context and a worker.
struct side {
  side() : ctx(test::config_for("shm")), w(worker::create(ctx).value()) {}
  context ctx;
  std::unique_ptr<worker> w;
};

/// AM data kept by a handler.
struct kept_am {
  void* data = nullptr;
  size_t length = 0;
};

status keep_am(void* arg, const void*, size_t, void* data, size_t length,
               const am_recv_params& params) {
  if ((params.attr & am_recv_data_persistent) == 0) return status::ok;
  *static_cast<kept_am*>(arg) = {data, length};
  return status::in_progress;
}

/// Progresses `w` until `done()` (bounded).
template <class Done>
bool progress_until(worker& w, Done&& done) {
  return test::spin_until([&] { w.progress(); }, done);
}

constexpr size_t rndv_size = size_t{1} << 20;
constexpr tag_t tag_data = 0x3a9;
constexpr uint16_t am_echo = 9;

/// The child of rendezvous_between_processes_takes_the_mapped_path: receives a tagged message,
/// then an AM whose block it sends back as the echo, and reports its mapped gets.
int rendezvous_child(const channel& to_parent, const channel& to_child) {
  side s;
  to_parent.send(s.w->address());
  std::vector<uint8_t> parent;
  CHILD_CHECK(to_child.receive(&parent));
  endpoint* ep = nullptr;
  CHILD_CHECK(s.w->connect(parent, &ep) == status::ok);
  kept_am kept;
  CHILD_CHECK(s.w->set_am_handler(am_echo, keep_am, &kept,
                                  am_flag_whole_msg | am_flag_persistent_data |
                                      am_flag_fetch_rndv) == status::ok);
  std::vector<uint8_t> buffer(rndv_size);
  op r = s.w->tag_recv(buffer.data(), rndv_size, tag_data, tag_mask_full);
  CHILD_CHECK(s.w->wait(r, 30000) == status::ok);
  CHILD_CHECK(first_mismatch(buffer.data(), rndv_size, 20) == -1);
  CHILD_CHECK(progress_until(*s.w, [&] { return kept.data != nullptr; }));
  CHILD_CHECK(first_mismatch(kept.data, kept.length, 21) == -1);
  op back = ep->am_send(am_echo, nullptr, 0, kept.data, kept.length);
  CHILD_CHECK(!back.failed() && s.w->wait(back, 30000) == status::ok);
  s.w->am_data_release(kept.data);
  to_parent.send_word(static_cast<uint64_t>(mapped_gets(s.w->info())));
  uint64_t done = 0;
  CHILD_CHECK(to_child.receive_word(&done));
  return s.w->wait(ep->close(), 30000) == status::ok ? 0 : 5;
}

}  // namespace

BOOST_AUTO_TEST_CASE(rendezvous_between_processes_takes_the_mapped_path) {
  // The parent sends from mem_alloc'd memory; the child's AM receive block is shareable too, so
  // its echo is fetched through a mapping as well.
  channel to_parent, to_child;
  const pid_t child = fork_child([&]() -> int { return rendezvous_child(to_parent, to_child); });
  BOOST_REQUIRE(child > 0);
  {
    side s;
    std::vector<uint8_t> theirs;
    BOOST_REQUIRE(to_parent.receive(&theirs));
    to_child.send(s.w->address());
    endpoint* ep = nullptr;
    BOOST_REQUIRE(s.w->connect(theirs, &ep) == status::ok);
    kept_am echo;
    BOOST_REQUIRE(s.w->set_am_handler(am_echo, keep_am, &echo,
                                      am_flag_whole_msg | am_flag_persistent_data |
                                          am_flag_fetch_rndv) == status::ok);
    auto* tagged = static_cast<uint8_t*>(mem_alloc(rndv_size));
    auto* am = static_cast<uint8_t*>(mem_alloc(rndv_size));
    fill(tagged, rndv_size, 20);
    fill(am, rndv_size, 21);
    op t = ep->tag_send(tag_data, tagged, rndv_size);
    BOOST_TEST((!t.failed() && s.w->wait(t, 30000) == status::ok));
    op a = ep->am_send(am_echo, nullptr, 0, am, rndv_size);
    BOOST_TEST((!a.failed() && s.w->wait(a, 30000) == status::ok));
    BOOST_TEST(progress_until(*s.w, [&] { return echo.data != nullptr; }));
    BOOST_TEST(echo.length == rndv_size);
    if (echo.data != nullptr) {
      BOOST_TEST(first_mismatch(echo.data, echo.length, 21) == -1);
      s.w->am_data_release(echo.data);
    }
    uint64_t child_mapped = 0;
    BOOST_TEST(to_parent.receive_word(&child_mapped));
    BOOST_TEST(child_mapped == 2u);                // the tagged message and the AM
    BOOST_TEST(mapped_gets(s.w->info()) == 1);     // the echo, from the child's receive block
    to_child.send_word(1);
    mem_free(tagged);
    mem_free(am);
    int wstatus = -1;
    const bool exited = progress_until(*s.w, [&] { return ::waitpid(child, &wstatus, WNOHANG) == child; });
    if (!exited) ::kill(child, SIGKILL);
    BOOST_TEST((exited && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0));
    if (!exited) ::waitpid(child, nullptr, 0);
  }
}

// -- local addresses (tl::ep::rkey_local_address, endpoint::rkey_local_address) ------------------

BOOST_AUTO_TEST_CASE(a_local_address_is_the_peers_bytes_and_outlives_the_interface) {
  auto f = std::make_unique<pair_fixture>();
  const size_t size = (size_t{1} << 20) + 123;
  auto* remote = static_cast<uint8_t*>(mem_alloc(size));
  fill(remote, size, 5);
  tl::local_bytes here;
  {
    registration reg(*f->b->memory_domain(), remote, size);
    unpacked key(*f->a->memory_domain(), reg.packed);
    BOOST_TEST_REQUIRE(key.result == status::ok);
    const uint64_t base = address_of(remote);
    BOOST_TEST_REQUIRE(f->ab->rkey_local_address(base + 100, 5000, key.key, &here) == status::ok);
    BOOST_TEST(here.mapping != nullptr);
    // Another mapping of the same memory: what the owner writes shows through it.
    BOOST_TEST(here.data != static_cast<const void*>(remote + 100));
    BOOST_TEST(std::memcmp(here.data, remote + 100, 5000) == 0);
    remote[100] = static_cast<uint8_t>(~remote[100]);
    BOOST_TEST(*static_cast<const uint8_t*>(here.data) == remote[100]);
    // Checked as a get: out of the region, past its end.
    tl::local_bytes wrong;
    BOOST_TEST(f->ab->rkey_local_address(base + size, 1, key.key, &wrong) ==
               status::protection_error);
    BOOST_TEST(f->ab->rkey_local_address(base - 1, 1, key.key, &wrong) ==
               status::protection_error);
    BOOST_TEST(f->ab->rkey_local_address(base + size - 1, 2, key.key, &wrong) ==
               status::length_error);
    BOOST_TEST(reg.dereg() == status::ok);
    BOOST_TEST(f->ab->rkey_local_address(base, 1, key.key, &wrong) == status::protection_error);
  }
  // The endpoint and both interfaces go (the cache unmaps what it holds): the held mapping stays.
  f.reset();
  BOOST_TEST(std::memcmp(here.data, remote + 100, 5000) == 0);
  here = {};
  mem_free(remote);
}

BOOST_AUTO_TEST_CASE(a_read_only_region_is_mapped_read_only_and_refuses_puts) {
  pair_fixture f;
  const size_t size = 256 * 1024;
  auto* remote = static_cast<uint8_t*>(mem_alloc(size));
  fill(remote, size, 21);
  tl::md& md = *f.b->memory_domain();
  tl::mem_handle* handle = nullptr;
  BOOST_TEST_REQUIRE(md.mem_reg_read_only(remote, size, &handle) == status::ok);
  std::vector<uint8_t> packed;
  BOOST_TEST_REQUIRE(md.rkey_pack(handle, packed) == status::ok);
  const uint64_t base = address_of(remote);
  const std::vector<uint8_t> evil = test::pattern(4096, 99);
  tl::local_bytes seen;
  {
    // The same range open to writes too: a registration (and a slot) of its own.
    registration writable(md, remote, size);
    unpacked read_only(*f.a->memory_domain(), packed);
    unpacked read_write(*f.a->memory_domain(), writable.packed);
    BOOST_TEST_REQUIRE(read_only.result == status::ok);
    BOOST_TEST_REQUIRE(read_write.result == status::ok);
    BOOST_TEST_REQUIRE(f.ab->rkey_local_address(base, size, read_only.key, &seen) == status::ok);
    BOOST_TEST(test::first_mismatch(seen.data, size, 21) == -1);
    BOOST_TEST(test::mapping_protection(seen.data) == "r--s");
    const auto* borrowed = static_cast<const uint8_t*>(seen.data);
    BOOST_TEST(test::signal_of_a_child_writing(borrowed + 7) == SIGSEGV);
    // A put through the read-only key is refused and writes nothing; gets work.
    BOOST_TEST(f.put(read_only.key, evil.data(), evil.size(), base + 100) ==
               status::privileges_violation);
    BOOST_TEST(test::first_mismatch(remote, size, 21) == -1);
    std::vector<uint8_t> got(4096);
    BOOST_TEST(f.get(read_only.key, got.data(), got.size(), base + 100) == status::ok);
    BOOST_TEST(test::first_mismatch(got.data(), got.size(), 21, 100) == -1);
    // The writable key maps the segment writable and its puts land (and show through both).
    tl::local_bytes open;
    BOOST_TEST_REQUIRE(f.ab->rkey_local_address(base, size, read_write.key, &open) ==
                       status::ok);
    BOOST_TEST(test::mapping_protection(open.data) == "rw-s");
    BOOST_TEST(f.put(read_write.key, evil.data(), evil.size(), base + 100) == status::ok);
    BOOST_TEST(std::memcmp(remote + 100, evil.data(), evil.size()) == 0);
    BOOST_TEST(std::memcmp(static_cast<const uint8_t*>(seen.data) + 100, evil.data(),
                           evil.size()) == 0);
  }
  BOOST_TEST(md.mem_dereg(handle) == status::ok);
  // Memory outside the shared heap (reached by CMA): a put through a read-only key is refused too.
  std::vector<uint8_t> plain = test::pattern(8192, 22);
  BOOST_TEST_REQUIRE(md.mem_reg_read_only(plain.data(), plain.size(), &handle) == status::ok);
  packed.clear();
  BOOST_TEST_REQUIRE(md.rkey_pack(handle, packed) == status::ok);
  {
    unpacked key(*f.a->memory_domain(), packed);
    BOOST_TEST_REQUIRE(key.result == status::ok);
    BOOST_TEST(f.put(key.key, evil.data(), evil.size(), address_of(plain.data())) ==
               status::privileges_violation);
    BOOST_TEST(test::first_mismatch(plain.data(), plain.size(), 22) == -1);
    std::vector<uint8_t> got(plain.size());
    BOOST_TEST(f.get(key.key, got.data(), got.size(), address_of(plain.data())) == status::ok);
    BOOST_TEST(got == plain);
  }
  BOOST_TEST(md.mem_dereg(handle) == status::ok);
  seen = {};
  mem_free(remote);
}

BOOST_AUTO_TEST_CASE(a_region_mapped_for_remote_reads_only_is_read_only_for_the_peer) {
  comm::test::worker_pair p("shm");
  const size_t size = 512 * 1024;
  void* block = mem_alloc(size);
  fill(block, size, 23);
  memh* region = nullptr;
  BOOST_TEST_REQUIRE(p.b->mem_map(block, size, &region, mem_access_all & ~mem_remote_write) ==
                     status::ok);
  std::vector<uint8_t> packed;
  BOOST_TEST_REQUIRE(p.b->rkey_pack(region, packed) == status::ok);
  rkey* key = nullptr;
  BOOST_TEST_REQUIRE(p.ab->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  const uint64_t base = address_of(block);
  auto here = p.ab->rkey_local_address(*key, base, size);
  BOOST_TEST_REQUIRE(here.has_value());
  BOOST_TEST(test::first_mismatch(here->data, size, 23) == -1);
  BOOST_TEST(test::mapping_protection(here->data) == "r--s");
  BOOST_TEST(test::signal_of_a_child_writing(here->data) == SIGSEGV);
  const std::vector<uint8_t> evil = test::pattern(4096, 98);
  iov_entry from{const_cast<uint8_t*>(evil.data()), evil.size()};
  // The key says read-only: refused at once.
  BOOST_TEST(p.ab->put(&from, 1, base, key).st == status::privileges_violation);
  // A forged key that claims the right to write: the transport refuses it.
  rkey* forged = comm::test::reencoded_key(
      p, region, [](auto bundle) { bundle.setAccess(mem_remote_read | mem_remote_write); });
  const status written = p.finish(p.ab->put(&from, 1, base, forged));
  BOOST_TEST(written == status::privileges_violation, to_string(written));
  BOOST_TEST(test::first_mismatch(block, size, 23) == -1);
  auto forged_here = p.ab->rkey_local_address(*forged, base, size);
  BOOST_TEST_REQUIRE(forged_here.has_value());
  BOOST_TEST(test::mapping_protection(forged_here->data) == "r--s");
  p.ab->rkey_destroy(forged);
  p.ab->rkey_destroy(key);
  BOOST_TEST(p.b->mem_unmap(region) == status::ok);
  here = status::not_connected;
  forged_here = status::not_connected;
  mem_free(block);
}

BOOST_AUTO_TEST_CASE(memory_outside_the_shared_heap_has_no_local_address) {
  pair_fixture f;
  std::vector<uint8_t> remote = pattern(100000, 8);
  registration reg(*f.b->memory_domain(), remote.data(), remote.size());
  unpacked key(*f.a->memory_domain(), reg.packed);
  BOOST_TEST_REQUIRE(key.result == status::ok);
  tl::local_bytes here;
  BOOST_TEST(f.ab->rkey_local_address(address_of(remote.data()), remote.size(), key.key, &here) ==
             status::unsupported);
}

BOOST_AUTO_TEST_CASE(endpoint_local_addresses_over_shm_and_self) {
  for (const std::string transport : {"shm", "self"}) {
    BOOST_TEST_CONTEXT(transport) {
      comm::test::worker_pair p(transport);
      const size_t size = 256 * 1024;
      void* block = mem_alloc(size);
      fill(block, size, 3);
      auto region = p.b->mem_map(mutable_bytes(block, size)).value();
      const std::vector<uint8_t> packed = p.b->rkey_pack(*region).value();
      auto key = p.ab->rkey_unpack(packed).value();
      const uint64_t base = address_of(block);
      auto here = p.ab->rkey_local_address(*key, base + 10, size - 10);
      BOOST_TEST_REQUIRE(here.has_value());
      BOOST_TEST(here->length == size - 10);
      BOOST_TEST(std::memcmp(here->data, static_cast<uint8_t*>(block) + 10, size - 10) == 0);
      BOOST_TEST((transport == "self") == (here->data == static_cast<uint8_t*>(block) + 10));
      BOOST_TEST(p.ab->rkey_local_address(*key, base + size, 1).error() ==
                 status::protection_error);
      BOOST_TEST(p.ab->rkey_local_address(*key, base + size - 1, 2).error() ==
                 status::length_error);
      // A key of another endpoint.
      BOOST_TEST(p.ba->rkey_local_address(*key, base, 1).error() == status::invalid_param);
      // A region closed to remote reads is the owner's to serve: nothing to map.
      auto closed = p.b->mem_map(mutable_bytes(block, size), mem_local_read | mem_remote_write);
      BOOST_TEST_REQUIRE(closed.has_value());
      const std::vector<uint8_t> closed_packed = p.b->rkey_pack(**closed).value();
      auto closed_key = p.ab->rkey_unpack(closed_packed).value();
      BOOST_TEST(p.ab->rkey_local_address(*closed_key, base, 1).error() ==
                 status::privileges_violation);
      closed_key.reset();
      closed.value().reset();
      key.reset();
      region.reset();
      here = status::not_connected;
      mem_free(block);
    }
  }
}
