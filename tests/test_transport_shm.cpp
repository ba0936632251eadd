// What is particular to the shm transport: its attributes and configuration limits, address
// validation, zcopy from unmapped memory, malformed cells, many threads into one FIFO, memfd leaks;
// endpoints to one peer sharing its mapping; addresses naming what is not the peer's sealed segment
// (a FIFO, a device, files, unsealed memfds, a reused pid) refused without opening it. Delivery,
// flow control and the pending queue, zcopy completion, blocking progress and peer failure are
// checked for every transport in test_conformance.cpp.
// Every wait is bounded in iterations and time; nothing asserts on timing.
#define BOOST_TEST_MODULE transport_shm
#include "hostile_peer.hpp"
#include "process_harness.hpp"
#include "test_util.hpp"
#include "tl_helpers.hpp"
#include <boost/test/unit_test.hpp>

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include "../transports/shm/shm_peer_fd.hpp"
#include "../transports/shm/shm_segment.hpp"
#include "shm/shm.capnp.h"

#include <linux/sched.h>

#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

using namespace comm;
using namespace std::chrono_literals;
using comm::test::channel;
using comm::test::completion_probe;
using comm::test::connect;
using comm::test::fork_child;
using comm::test::receive_addresses;
using comm::test::recorder;
using comm::test::send_addresses;
using comm::test::wait_child;


namespace {

// -- helpers --------------------------------------------------------------------------------------

tl::component& shm_component() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == "shm") return *c;
  }
  throw std::runtime_error("no shm component");
}

std::unique_ptr<tl::iface> open_iface(size_t fifo_size = 0, size_t segment_size = 0) {
  tl::iface_params params;
  params.fifo_size = fifo_size;
  params.segment_size = segment_size;
  std::unique_ptr<tl::iface> iface;
  const status st = shm_component().open(params, iface);
  if (st != status::ok) throw std::runtime_error(std::string("open: ") + to_string(st));
  return iface;
}

/// Calls progress on `ifaces` until `done()` holds, at most `limit` and `max_rounds` rounds.
bool progress_until(std::initializer_list<tl::iface*> ifaces, const std::function<bool()>& done,
                    std::chrono::milliseconds limit = 10s, uint64_t max_rounds = 50'000'000) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (uint64_t round = 0; round < max_rounds; ++round) {
    for (tl::iface* iface : ifaces) iface->progress();
    if (done()) return true;
    if ((round & 1023) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}


/// Open fds and mappings of memfds (our segments, or anything a peer named).
size_t count_memfds() {
  size_t n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  while (dirent* entry = ::readdir(dir)) {
    char path[300], target[300];
    std::snprintf(path, sizeof(path), "/proc/self/fd/%s", entry->d_name);
    const ssize_t len = ::readlink(path, target, sizeof(target) - 1);
    if (len > 0 && std::string(target, len).find("/memfd:") != std::string::npos) ++n;
  }
  ::closedir(dir);
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  char line[512];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    if (std::strstr(line, "/memfd:") != nullptr) ++n;
  }
  std::fclose(maps);
  return n;
}

/// The value (kB) of `field` in /proc/self/status, or -1.
long status_kib(const char* field) {
  std::FILE* file = std::fopen("/proc/self/status", "r");
  char line[256];
  long value = -1;
  const size_t length = std::strlen(field);
  while (file != nullptr && std::fgets(line, sizeof(line), file) != nullptr) {
    if (std::strncmp(line, field, length) == 0 && line[length] == ':') {
      value = std::strtol(line + length + 1, nullptr, 10);
    }
  }
  if (file != nullptr) std::fclose(file);
  return value;
}

/// What `body` writes to stderr (the log), which goes nowhere else meanwhile.
std::string captured_stderr(const std::function<void()>& body) {
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  const int sink = ::memfd_create("captured-stderr", MFD_CLOEXEC);
  BOOST_REQUIRE(saved >= 0 && sink >= 0);
  ::dup2(sink, STDERR_FILENO);
  body();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string text(static_cast<size_t>(::lseek(sink, 0, SEEK_END)), '\0');
  const ssize_t got = ::pread(sink, text.data(), text.size(), 0);
  text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  ::close(sink);
  return text;
}

/// Runs `body` in a child created with pid `pid` (clone3 with set_tid: root only here), which
/// exits with its return value; -1 with errno set when the kernel refuses (EEXIST: pid in use).
pid_t fork_child_with_pid(pid_t pid, const std::function<int()>& body) {
  std::fflush(nullptr);
  clone_args args{};
  args.exit_signal = SIGCHLD;
  args.set_tid = reinterpret_cast<uintptr_t>(&pid);
  args.set_tid_size = 1;
  const long child = ::syscall(SYS_clone3, &args, sizeof(args));
  if (child == 0) {
    int rc = 100;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: exception: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return static_cast<pid_t>(child);
}

/// What a hostile peer writes into its memfds: the control block a segment of interface `id` and
/// geometry `geo` has, owned by the writing process.
comm::test::hostile_peer::content_fn segment_content(const tl::shm::geometry& geo, uint64_t id) {
  return [geo, id](uint8_t* base, size_t) {
    auto& ctl = *reinterpret_cast<tl::shm::control_block*>(base);
    ctl.magic = tl::shm::segment_magic;
    ctl.iface_id = id;
    ctl.version = tl::shm::segment_version;
    ctl.fifo_size = geo.fifo_size;
    ctl.cell_size = geo.cell_size;
    ctl.segment_size = geo.segment_size;
    ctl.owner_pid = static_cast<int32_t>(::getpid());
    ctl.region_count = tl::shm::region_table_size;
  };
}

/// The address of interface `id` of process `pid` with `fd` as its segment, geometry `geo`.
std::vector<uint8_t> forged_address(pid_t pid, int fd, const tl::shm::geometry& geo,
                                    uint64_t id) {
  tl::shm::iface_addr address;
  address.pid = pid;
  address.fd = fd;
  address.fifo_size = geo.fifo_size;
  address.cell_size = geo.cell_size;
  address.segment_size = geo.segment_size;
  address.iface_id = id;
  return address.pack();
}

}  // namespace

// -- tests ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(component_and_attributes) {
  tl::component& shm = shm_component();
  BOOST_TEST(shm.devices() == std::vector<std::string>{"memory"});
  auto iface = open_iface();
  const tl::iface_attr& attr = iface->attr();
  BOOST_TEST(iface->transport_name() == "shm");
  BOOST_TEST((attr.caps & tl::cap_am_short) != 0u);
  BOOST_TEST((attr.caps & tl::cap_am_bcopy) != 0u);
  BOOST_TEST((attr.caps & tl::cap_am_zcopy) != 0u);
  BOOST_TEST((attr.caps & tl::cap_pending) != 0u);
  BOOST_TEST((attr.caps & tl::cap_event_fd) != 0u);
  BOOST_TEST((attr.caps & tl::cap_peer_failure) != 0u);
  BOOST_TEST((attr.caps & (tl::cap_put_zcopy | tl::cap_get_zcopy)) ==
             (tl::cap_put_zcopy | tl::cap_get_zcopy));
  BOOST_TEST(attr.max_short == 112u);
  BOOST_TEST(attr.max_bcopy == 8192u);
  BOOST_TEST(attr.max_zcopy >= attr.max_bcopy);
  BOOST_TEST(iface->event_fd() >= 0);
  BOOST_TEST(iface->info().find("shm: fifo size 256 cells") != std::string::npos);

  std::unique_ptr<tl::iface> bad;
  tl::iface_params params;
  params.fifo_size = 100;  // not a power of two
  BOOST_TEST(shm.open(params, bad) == status::invalid_param);
  params.fifo_size = 0;
  params.segment_size = 100;  // too small
  BOOST_TEST(shm.open(params, bad) == status::invalid_param);
  params.segment_size = 0;
  params.device = "nonsense";
  BOOST_TEST(shm.open(params, bad) == status::no_elem);
}

BOOST_AUTO_TEST_CASE(addresses_are_validated) {
  auto a = open_iface();
  auto b = open_iface();
  const auto device = b->device_address();
  const auto address = b->iface_address();
  BOOST_TEST(a->is_reachable(device, address));

  std::unique_ptr<tl::ep> ep;
  auto short_address = address;
  short_address.pop_back();
  BOOST_TEST(!a->is_reachable(device, short_address));
  BOOST_TEST(a->create_ep(device, short_address, ep) == status::invalid_addr);
  auto long_device = device;
  long_device.push_back(0);
  BOOST_TEST(a->create_ep(long_device, address, ep) == status::invalid_addr);
  auto bad_geometry = address;
  bad_geometry[12] ^= 0x01;  // fifo_size no longer a power of two
  BOOST_TEST(a->create_ep(device, bad_geometry, ep) == status::invalid_addr);

  auto other_host = device;
  other_host[0] ^= 0xff;  // another boot id
  BOOST_TEST(!a->is_reachable(other_host, address));
  BOOST_TEST(a->create_ep(other_host, address, ep) == status::unreachable);
  auto other_namespace = device;
  other_namespace.back() ^= 0xff;
  BOOST_TEST(!a->is_reachable(other_namespace, address));

  // A stale address: its interface is gone, and its fd number is probably reused by another.
  b.reset();
  auto c = open_iface();
  BOOST_TEST(a->create_ep(device, address, ep) == status::unreachable);
  BOOST_TEST(!ep);
}

BOOST_AUTO_TEST_CASE(zcopy_from_freed_memory_completes_with_an_error) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 2);
  auto ep = connect(*sender, *receiver);
  const uint64_t header = 1;
  // An address that is not mapped in the sender: the receiver's read fails, nobody crashes.
  const tl::iov entry{reinterpret_cast<const void*>(uintptr_t{8}), 4096};
  completion_probe done;
  BOOST_TEST(ep->am_zcopy(2, &header, sizeof(header), &entry, 1, &done) == status::in_progress);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST(done.result == status::io_error);
  BOOST_TEST(got.messages.empty());
  BOOST_TEST(receiver->info().find("shm: zcopy read errors 1") != std::string::npos);
}

namespace {

/// A rogue sender writing straight into a mapped segment.
struct rogue {
  tl::shm::segment seg;
  explicit rogue(tl::iface& receiver) {
    const auto address = tl::shm::iface_addr::unpack(receiver.iface_address());
    BOOST_REQUIRE(address.has_value());
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
    BOOST_REQUIRE(pidfd >= 0);
    BOOST_REQUIRE(tl::shm::segment::attach(pidfd, *address, &seg) == status::ok);
    ::close(pidfd);
  }
  uint64_t claim() {
    return tl::shm::shared_word(seg.control().head).fetch_add(1) & ~tl::shm::head_armed;
  }
  void publish(uint64_t index, tl::shm::cell_meta meta) {
    tl::shm::cell_header* cell = seg.cell(index);
    cell->meta = meta.pack();
    tl::shm::shared_word(cell->seq).store(index + 1, std::memory_order_release);
  }
  uint64_t ack(uint64_t index) { return tl::shm::shared_word(*seg.ack(index)).load(); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(malformed_cells_are_logged_skipped_and_survived) {
  using tl::shm::cell_meta;
  auto sender = open_iface();
  auto receiver = open_iface(16);
  recorder got;
  got.install(*receiver, 1);
  rogue bad(*receiver);

  bad.publish(bad.claim(), cell_meta{200, tl::shm::cell_inline, 0, 8});          // am id
  bad.publish(bad.claim(), cell_meta{1, tl::shm::cell_inline, 0, 5000});         // > cell
  bad.publish(bad.claim(), cell_meta{1, tl::shm::cell_bcopy, 0, 1u << 30});      // > buffer
  bad.publish(bad.claim(), cell_meta{1, 77, 0, 8});                              // kind
  const uint64_t too_many_words = bad.claim();
  bad.publish(too_many_words, cell_meta{1, tl::shm::cell_zcopy, 1000, 8000});    // descriptor size
  const uint64_t garbage = bad.claim();                                          // not capnp
  std::memset(bad.seg.buffer(garbage), 0xab, 64);
  bad.publish(garbage, cell_meta{1, tl::shm::cell_zcopy, 4, 32});
  // A well-formed descriptor that lies: its iov list is longer than max_iov.
  const uint64_t lying = bad.claim();
  {
    capnp::MallocMessageBuilder message;
    auto d = message.initRoot<wire::schema::ShmZcopyDescriptor>();
    d.setSenderPid(::getpid());
    d.setAmId(1);
    d.setHeaderLength(0);
    d.setCompletionSeq(lying + 1);
    d.initIov(tl::shm::zcopy_max_iov + 1);
    const auto words = message.getSegmentsForOutput()[0];
    std::memcpy(bad.seg.buffer(lying), words.begin(), words.size() * 8);
    bad.publish(lying, cell_meta{1, tl::shm::cell_zcopy, static_cast<uint16_t>(words.size()),
                                 static_cast<uint32_t>(words.size() * 8)});
  }

  auto ep = connect(*sender, *receiver);
  const uint64_t value = 77;
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({receiver.get()}, [&] { return got.messages.size() == 1; }));
  BOOST_TEST(got.messages[0].bytes.size() == sizeof(value));
  BOOST_TEST(receiver->info().find("shm: malformed cells 7\n") != std::string::npos);
  // Bad zcopy cells are acked with an error, so a (confused) sender would not wait forever.
  BOOST_TEST((bad.ack(garbage) >> tl::shm::ack_shift) == garbage + 1);
  BOOST_TEST((bad.ack(garbage) & 0xffff) != 0u);
  BOOST_TEST((bad.ack(lying) & 0xffff) != 0u);
  // And the FIFO keeps working, including around the wrap.
  for (uint64_t i = 0; i < 40; ++i) {
    BOOST_TEST(ep->am_short(1, &i, sizeof(i), nullptr, 0) == status::ok);
    BOOST_TEST(progress_until({receiver.get()}, [&] { return got.messages.size() == i + 2; }));
  }
}

BOOST_AUTO_TEST_CASE(many_senders_into_one_fifo) {
  constexpr int senders = 2;
  constexpr uint64_t per_sender = 200000;
  auto receiver = open_iface(64);
  std::vector<uint64_t> next(senders, 0);
  bool in_order = true;
  struct state {
    std::vector<uint64_t>* next;
    bool* in_order;
    uint64_t total = 0;
  } st{&next, &in_order};
  receiver->set_am_handler(
      1,
      [](void* arg, void* data, size_t length, unsigned) {
        auto* s = static_cast<state*>(arg);
        uint64_t words[2];
        std::memcpy(words, data, sizeof(words));
        if (length != sizeof(words) || words[0] >= s->next->size() ||
            (*s->next)[words[0]] != words[1]) {
          *s->in_order = false;
        } else {
          ++(*s->next)[words[0]];
        }
        ++s->total;
        return status::ok;
      },
      &st);
  std::vector<std::unique_ptr<tl::iface>> ifaces;
  std::vector<std::unique_ptr<tl::ep>> eps;
  for (int i = 0; i < senders; ++i) {
    ifaces.push_back(open_iface());
    eps.push_back(connect(*ifaces.back(), *receiver));
  }
  std::atomic<bool> give_up{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < senders; ++i) {
    threads.emplace_back([&, i] {
      for (uint64_t seq = 0; seq < per_sender && !give_up.load(std::memory_order_relaxed);) {
        const uint64_t words[2] = {static_cast<uint64_t>(i), seq};
        if (eps[i]->am_short(1, words, sizeof(words), nullptr, 0) == status::ok) ++seq;
      }
    });
  }
  // The receiver may spin through many empty rounds while the sender threads are not scheduled
  // (three threads, two cores): bounded by time rather than by rounds.
  const bool all = progress_until(
      {receiver.get()}, [&] { return st.total == senders * per_sender; }, 60s, uint64_t{1} << 40);
  give_up = true;
  for (auto& t : threads) t.join();
  BOOST_TEST(all);
  BOOST_TEST(in_order);
}

BOOST_AUTO_TEST_CASE(no_fd_or_memfd_leaks) {
  const size_t fds_before = comm::test::open_fds();
  const size_t memfds_before = count_memfds();
  {
    auto a = open_iface();
    auto b = open_iface();
    recorder got;
    got.install(*b, 1);
    auto ab = connect(*a, *b);
    auto ba = connect(*b, *a);
    auto aa = connect(*a, *a);
    const uint64_t value = 1;
    const tl::iov entry{&value, sizeof(value)};
    completion_probe done;
    BOOST_TEST(ab->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
    BOOST_TEST(ab->am_zcopy(1, &value, sizeof(value), &entry, 1, &done) == status::in_progress);
    BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return done.calls == 1; }));
    BOOST_TEST(comm::test::open_fds() > fds_before);
    BOOST_TEST(count_memfds() > memfds_before);
    // Eps first, then their interfaces: the order the protocol layer keeps.
  }
  BOOST_TEST(comm::test::open_fds() == fds_before);
  BOOST_TEST(count_memfds() == memfds_before);

  // Failed opens leak nothing either.
  tl::iface_params params;
  params.fifo_size = 3;
  std::unique_ptr<tl::iface> bad;
  BOOST_TEST(shm_component().open(params, bad) == status::invalid_param);
  BOOST_TEST(comm::test::open_fds() == fds_before);
}

// -- endpoints to one peer share its mapping ------------------------------------------------------

BOOST_AUTO_TEST_CASE(endpoints_to_one_peer_share_one_mapping_and_one_pidfd) {
  auto sender = open_iface();
  auto peer = open_iface();
  recorder got;
  got.install(*peer, 1);
  const size_t segment_bytes =
      tl::shm::iface_addr::unpack(peer->iface_address())->geo().total_size();
  constexpr size_t n = 1000;
  std::vector<std::unique_ptr<tl::ep>> eps;
  eps.reserve(n);
  const size_t fds_before = comm::test::open_fds();
  const size_t memfds_before = count_memfds();
  const long rss_before = status_kib("VmRSS");
  for (size_t i = 0; i < n; ++i) eps.push_back(connect(*sender, *peer));
  const long rss_growth_kib = status_kib("VmRSS") - rss_before;
  BOOST_TEST(comm::test::open_fds() == fds_before + 1);  // one pidfd of the peer
  BOOST_TEST(count_memfds() == memfds_before + 1);        // one mapping of its segment
  // The peer's segment once, populated (2.2 MB), and a little per endpoint; mapped again by every
  // endpoint, as before, it was 2.2 GB.
  BOOST_TEST(rss_growth_kib * 1024 <= static_cast<long>(segment_bytes + n * 4096),
             "resident memory grew by " << rss_growth_kib << " KiB");
  BOOST_TEST(sender->info().find("shm: endpoints 1000 (0 failed) to 1 peer interfaces") !=
             std::string::npos);

  // Every endpoint sends through the shared mapping; one sender, so the FIFO keeps their order.
  for (uint64_t i = 0; i < n; ++i) {
    BOOST_TEST_REQUIRE(eps[i]->am_short(1, &i, sizeof(i), nullptr, 0) == status::ok);
    if (i % 64 == 63) BOOST_TEST_REQUIRE(progress_until({peer.get()}, [&] {
      return got.messages.size() == i + 1;
    }));
  }
  BOOST_TEST(progress_until({peer.get()}, [&] { return got.messages.size() == n; }));
  bool in_order = got.messages.size() == n;
  for (uint64_t i = 0; in_order && i < n; ++i) {
    uint64_t value = 0;
    std::memcpy(&value, got.messages[i].bytes.data(), sizeof(value));
    in_order = got.messages[i].bytes.size() == sizeof(value) && value == i;
  }
  BOOST_TEST(in_order);

  // Released with the last endpoint, not before; attached again when needed.
  eps.erase(eps.begin(), eps.end() - 1);
  BOOST_TEST(count_memfds() == memfds_before + 1);
  const uint64_t last = 7;
  BOOST_TEST(eps.back()->am_short(1, &last, sizeof(last), nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({peer.get()}, [&] { return got.messages.size() == n + 1; }));
  eps.clear();
  BOOST_TEST(comm::test::open_fds() == fds_before);
  BOOST_TEST(count_memfds() == memfds_before);
  BOOST_TEST(sender->info().find("shm: endpoints 0 (0 failed) to 0 peer interfaces") !=
             std::string::npos);
  eps.push_back(connect(*sender, *peer));
  BOOST_TEST(count_memfds() == memfds_before + 1);
}

BOOST_AUTO_TEST_CASE(a_peer_that_dies_fails_every_endpoint_to_it_once) {
  channel to_parent;
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface();
    send_addresses(to_parent, *iface);
    std::this_thread::sleep_for(30s);  // killed long before
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  auto survivor = open_iface();
  std::map<tl::ep*, int> failures;
  survivor->set_error_handler(
      [](void* arg, tl::ep* failed, status reason) {
        auto& counts = *static_cast<std::map<tl::ep*, int>*>(arg);
        if (reason == status::connection_reset) ++counts[failed];
      },
      &failures);
  std::vector<std::unique_ptr<tl::ep>> eps;
  for (int i = 0; i < 3; ++i) eps.push_back(connect(*survivor, device, address));
  BOOST_REQUIRE(::kill(child, SIGKILL) == 0);
  BOOST_TEST(progress_until({survivor.get()}, [&] { return failures.size() == 3; }));
  for (int i = 0; i < 1000; ++i) survivor->progress();
  for (const auto& ep : eps) {
    BOOST_TEST(failures[ep.get()] == 1);
    const uint64_t value = 1;
    BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::connection_reset);
  }
  // The peer is known dead while its endpoints remain: no new endpoint to it.
  std::unique_ptr<tl::ep> late;
  BOOST_TEST(survivor->create_ep(device, address, late) == status::unreachable);
  eps.clear();
  ::waitpid(child, nullptr, 0);
}

// -- what a peer names is not trusted -------------------------------------------------------------

namespace {

using hostile = comm::test::hostile_peer;

/// A hostile peer's file, and what the log must say when it is refused as a segment.
struct refused_file {
  hostile::file file;
  const char* name;
  const char* reason;
};

const refused_file refused_as_segments[] = {
    {hostile::fifo, "FIFO", "not a regular file"},
    {hostile::device, "device", "not a regular file"},
    {hostile::disk_file, "file on disk", "not a file in memory"},
    {hostile::leased_file, "leased file", "not a file in memory"},
    {hostile::socket, "socket", "not a regular file"},
    {hostile::unsealed_memfd, "unsealed memfd", "not sealed against growing and shrinking"},
    {hostile::half_sealed_memfd, "memfd sealed against shrinking only",
     "not sealed against growing and shrinking"},
    {hostile::write_sealed_memfd, "memfd sealed against writing", "sealed against writing"},
    {hostile::read_only_memfd, "memfd held read-only", "open read-only"},
    {hostile::empty_sealed_memfd, "sealed memfd without a segment", "no segment header"},
};

/// The geometry of a default interface.
tl::shm::geometry default_geometry() {
  return tl::shm::iface_addr::unpack(open_iface()->iface_address())->geo();
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_address_naming_anything_but_a_sealed_segment_is_refused_unopened) {
  auto iface = open_iface();
  auto genuine = open_iface();
  recorder got;
  got.install(*genuine, 1);
  const tl::shm::geometry geo = default_geometry();
  const uint64_t id = 0x5eed5eed5eed5eedull;
  hostile peer(geo.total_size(), segment_content(geo, id));
  const auto device = iface->device_address();
  const size_t fds_before = comm::test::open_fds();
  const size_t memfds_before = count_memfds();

  auto attempt = [&](int fd, std::string* log) {
    std::unique_ptr<tl::ep> ep;
    status st = status::ok;
    const auto address = forged_address(peer.pid(), fd, geo, id);
    *log = captured_stderr([&] { st = iface->create_ep(device, address, ep); });
    BOOST_TEST(!ep);
    return st;
  };
  for (const refused_file& f : refused_as_segments) {
    BOOST_TEST_CONTEXT(f.name) {
      std::string log;
      BOOST_TEST(attempt(peer.fd(f.file), &log) == status::unreachable);
      BOOST_TEST(log.find(f.reason) != std::string::npos, "logged: " << log);
    }
  }
  std::string log;
  BOOST_TEST(attempt(100000, &log) == status::unreachable);
  BOOST_TEST(log.find("no such descriptor in the peer") != std::string::npos, "logged: " << log);

  // Nothing was opened (so nothing blocked), the lease holds, nothing leaked.
  BOOST_TEST(peer.opens_seen() == 0u);
  BOOST_TEST(!peer.lease_broken());
  BOOST_TEST(comm::test::open_fds() == fds_before);
  BOOST_TEST(count_memfds() == memfds_before);
  BOOST_TEST(iface->info().find("11 peer segments refused") != std::string::npos);

  // The control: a sealed memfd of the peer that is a segment in every respect is one.
  {
    std::unique_ptr<tl::ep> ep;
    BOOST_TEST(iface->create_ep(device, forged_address(peer.pid(), peer.fd(hostile::sealed_memfd),
                                                       geo, id),
                                ep) == status::ok);
  }
  // And the interface keeps working.
  auto ep = connect(*iface, *genuine);
  const uint64_t value = 42;
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({genuine.get()}, [&] { return got.messages.size() == 1; }));
}

BOOST_AUTO_TEST_CASE(both_routes_to_a_peer_descriptor_refuse_what_is_not_a_sealed_memfd) {
  using tl::shm::peer_fd_route;
  const size_t size = default_geometry().total_size();
  hostile peer(size, segment_content(default_geometry(), 1));
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, peer.pid(), 0));
  BOOST_REQUIRE(pidfd >= 0);
  const size_t fds_before = comm::test::open_fds();
  for (const peer_fd_route route : {peer_fd_route::duplicate, peer_fd_route::reopen}) {
    BOOST_TEST_CONTEXT((route == peer_fd_route::duplicate ? "pidfd_getfd" : "reopen")) {
      auto take = [&](hostile::file f, uint64_t bytes, uint64_t inode) {
        const tl::shm::memfd_expectation want{peer.fd(f), bytes, inode};
        return tl::shm::take_peer_memfd(pidfd, peer.pid(), want, route);
      };
      for (const refused_file& f : refused_as_segments) {
        if (f.file == hostile::empty_sealed_memfd) continue;  // a sealed memfd: the header decides
        // A sealed memfd that the peer holds read-only: reopened read-write, it is a segment.
        if (f.file == hostile::read_only_memfd && route == peer_fd_route::reopen) continue;
        BOOST_TEST_CONTEXT(f.name) {
          const tl::shm::taken_fd taken = take(f.file, size, 0);
          BOOST_TEST(taken.fd == -1);
          BOOST_TEST((taken.refusal != nullptr && std::strcmp(taken.refusal, "") != 0));
        }
      }
      for (const hostile::file f : {hostile::empty_sealed_memfd, hostile::sealed_memfd}) {
        const tl::shm::taken_fd taken = take(f, size, peer.inode(f));
        BOOST_TEST(taken.fd >= 0);
        if (taken.fd >= 0) ::close(taken.fd);
      }
      BOOST_TEST(take(hostile::sealed_memfd, size + 4096, 0).fd == -1);
      BOOST_TEST(take(hostile::sealed_memfd, size, peer.inode(hostile::sealed_memfd) + 1).fd == -1);
    }
  }
  BOOST_TEST(peer.opens_seen() == 0u);
  BOOST_TEST(!peer.lease_broken());
  BOOST_TEST(comm::test::open_fds() == fds_before);
  ::close(pidfd);
}

BOOST_AUTO_TEST_CASE(an_address_whose_pid_was_reused_is_refused) {
  auto iface = open_iface();
  channel to_parent, to_second;
  const pid_t first = fork_child([&]() -> int {
    auto gone = open_iface();
    send_addresses(to_parent, *gone);
    return 0;
  });
  BOOST_REQUIRE(first > 0);
  std::vector<uint8_t> device, stale;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &stale));
  BOOST_REQUIRE(wait_child(first) == 0);  // exited and reaped: its pid is free
  // Another process gets that pid and opens an interface the same way (so at the same fd).
  const pid_t second = fork_child_with_pid(first, [&]() -> int {
    auto other = open_iface();
    send_addresses(to_parent, *other);
    std::vector<uint8_t> done;
    to_second.receive(&done);
    return 0;
  });
  BOOST_REQUIRE_MESSAGE(second == first, "clone3 with set_tid: " << std::strerror(errno));
  std::vector<uint8_t> device_now, fresh;
  BOOST_REQUIRE(receive_addresses(to_parent, &device_now, &fresh));
  const auto then = tl::shm::iface_addr::unpack(stale);
  const auto now = tl::shm::iface_addr::unpack(fresh);
  BOOST_REQUIRE((then && now));
  BOOST_TEST(then->pid == now->pid);
  BOOST_TEST(then->fd == now->fd);  // the same name for another interface's segment

  const size_t fds_before = comm::test::open_fds();
  const size_t memfds_before = count_memfds();
  std::unique_ptr<tl::ep> ep;
  status st = status::ok;
  const std::string log = captured_stderr([&] { st = iface->create_ep(device, stale, ep); });
  BOOST_TEST(st == status::unreachable);
  BOOST_TEST(log.find("a reused pid") != std::string::npos, "logged: " << log);
  BOOST_TEST(comm::test::open_fds() == fds_before);
  BOOST_TEST(count_memfds() == memfds_before);
  BOOST_TEST(iface->create_ep(device_now, fresh, ep) == status::ok);  // the new owner's own
  ep.reset();
  to_second.send({1});
  BOOST_TEST(wait_child(second) == 0);
}
