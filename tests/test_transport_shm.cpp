// The shm transport: delivery within a process and across fork(), the FIFO's flow control and
// pending queue, zcopy completion, blocking progress, malformed cells, peer failure, and leaks;
// endpoints to one peer sharing its mapping; addresses naming what is not the peer's sealed segment
// (a FIFO, a device, files, unsealed memfds, a reused pid) refused without opening it.
// Every wait is bounded in iterations and time; nothing asserts on timing.
#define BOOST_TEST_MODULE transport_shm
#include "hostile_peer.hpp"
#include "process_harness.hpp"
#include "test_util.hpp"
#include <boost/test/unit_test.hpp>

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include "../transports/shm/shm_peer_fd.hpp"
#include "../transports/shm/shm_segment.hpp"
#include "shm/shm.capnp.h"

#include <linux/sched.h>

#include <dirent.h>
#include <poll.h>
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
using comm::test::fork_child;
using comm::test::receive_addresses;
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

std::unique_ptr<tl::ep> connect(tl::iface& from, const std::vector<uint8_t>& device,
                                const std::vector<uint8_t>& address) {
  std::unique_ptr<tl::ep> ep;
  const status st = from.create_ep(device, address, ep);
  if (st != status::ok) throw std::runtime_error(std::string("create_ep: ") + to_string(st));
  return ep;
}

std::unique_ptr<tl::ep> connect(tl::iface& from, tl::iface& to) {
  return connect(from, to.device_address(), to.iface_address());
}

/// Records every message delivered to the handlers it is installed on.
struct recorder {
  struct message {
    tl::am_id id;
    std::vector<uint8_t> bytes;
  };
  std::vector<message> messages;
  bool misaligned = false;

  static status handler(void* arg, void* data, size_t length, unsigned flags) {
    auto* self = static_cast<recorder*>(arg);
    if (reinterpret_cast<uintptr_t>(data) % 8 != 0) self->misaligned = true;
    const auto* p = static_cast<const uint8_t*>(data);
    self->messages.push_back({self->current_id, std::vector<uint8_t>(p, p + length)});
    return status::ok;
  }
  tl::am_id current_id = 0;

  void install(tl::iface& iface, tl::am_id id) { iface.set_am_handler(id, &handler, this); }
};

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

std::vector<uint8_t> pattern(size_t length, uint8_t seed) {
  std::vector<uint8_t> bytes(length);
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return bytes;
}

struct completion_probe : tl::completion {
  int calls = 0;
  completion_probe() {
    count = 1;
    func = [](tl::completion* self) { ++static_cast<completion_probe*>(self)->calls; };
  }
};

struct bcopy_source {
  const std::vector<uint8_t>* bytes;
  static size_t pack(void* dest, void* arg) {
    const auto* source = static_cast<bcopy_source*>(arg)->bytes;
    std::memcpy(dest, source->data(), source->size());
    return source->size();
  }
};


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

// -- fork helpers ---------------------------------------------------------------------------------


// The messages the cross-process test sends each way.
constexpr tl::am_id id_short = 3, id_bcopy = 4, id_zcopy = 5;
const std::vector<uint8_t> short_header = pattern(8, 1);
const std::vector<uint8_t> short_payload = pattern(40, 2);
const std::vector<uint8_t> bcopy_bytes = pattern(6000, 3);
const std::vector<uint8_t> zcopy_header = pattern(24, 4);
const std::vector<uint8_t> zcopy_part1 = pattern(70000, 5);
const std::vector<uint8_t> zcopy_part2 = pattern(13, 6);

std::vector<uint8_t> concat(std::initializer_list<const std::vector<uint8_t>*> parts) {
  std::vector<uint8_t> all;
  for (const auto* part : parts) all.insert(all.end(), part->begin(), part->end());
  return all;
}

/// Sends one short, one bcopy and one zcopy message on `ep`, then sleeps on `sender`'s event fd
/// until the zcopy completes (the receiver's ack wakes us). Returns the zcopy completion's result,
/// or timed_out when nobody woke us.
status send_three(tl::iface& sender, tl::ep& ep) {
  if (ep.am_short(id_short, short_header.data(), short_header.size(), short_payload.data(),
                  short_payload.size()) != status::ok) {
    return status::io_error;
  }
  bcopy_source source{&bcopy_bytes};
  if (ep.am_bcopy(id_bcopy, &bcopy_source::pack, &source) !=
      static_cast<ssize_t>(bcopy_bytes.size())) {
    return status::io_error;
  }
  const tl::iov entries[] = {{zcopy_part1.data(), zcopy_part1.size()},
                             {zcopy_part2.data(), zcopy_part2.size()}};
  completion_probe done;
  const status st =
      ep.am_zcopy(id_zcopy, zcopy_header.data(), zcopy_header.size(), entries, 2, &done);
  if (st == status::ok) return status::ok;
  if (st != status::in_progress) return st;
  for (int round = 0; round < 1000 && done.calls == 0; ++round) {
    if (sender.event_arm() == status::ok) {
      pollfd pfd{sender.event_fd(), POLLIN, 0};
      if (::poll(&pfd, 1, 10000) != 1) return status::timed_out;
    }
    sender.progress();
  }
  return done.calls == 1 ? done.result : status::timed_out;
}

/// Installs recorders for the three ids on `iface`.
struct three_recorders {
  recorder shorts, bcopies, zcopies;
  explicit three_recorders(tl::iface& iface) {
    shorts.install(iface, id_short);
    bcopies.install(iface, id_bcopy);
    zcopies.install(iface, id_zcopy);
  }
  bool all_arrived() const {
    return shorts.messages.size() == 1 && bcopies.messages.size() == 1 &&
           zcopies.messages.size() == 1;
  }
  bool contents_match() const {
    return all_arrived() && !shorts.misaligned && !bcopies.misaligned && !zcopies.misaligned &&
           shorts.messages[0].bytes == concat({&short_header, &short_payload}) &&
           bcopies.messages[0].bytes == bcopy_bytes &&
           zcopies.messages[0].bytes == concat({&zcopy_header, &zcopy_part1, &zcopy_part2});
  }
};

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

BOOST_AUTO_TEST_CASE(short_bcopy_zcopy_in_one_process) {
  auto sender = open_iface();
  auto receiver = open_iface();
  three_recorders got(*receiver);
  auto ep = connect(*sender, *receiver);

  BOOST_TEST(ep->am_short(id_short, short_header.data(), short_header.size(),
                          short_payload.data(), short_payload.size()) == status::ok);
  bcopy_source source{&bcopy_bytes};
  BOOST_TEST(ep->am_bcopy(id_bcopy, &bcopy_source::pack, &source) ==
             static_cast<ssize_t>(bcopy_bytes.size()));
  const tl::iov entries[] = {{zcopy_part1.data(), zcopy_part1.size()},
                             {zcopy_part2.data(), zcopy_part2.size()}};
  completion_probe done;
  BOOST_TEST(ep->am_zcopy(id_zcopy, zcopy_header.data(), zcopy_header.size(), entries, 2,
                          &done) == status::in_progress);
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.all_arrived() && done.calls == 1; }));
  BOOST_TEST(got.contents_match());
  BOOST_TEST(done.result == status::ok);

  // Largest sizes, and an empty message.
  const tl::iface_attr& attr = receiver->attr();
  const auto biggest_short = pattern(attr.max_short, 9);
  BOOST_TEST(ep->am_short(id_short, biggest_short.data(), 10, biggest_short.data() + 10,
                          attr.max_short - 10) == status::ok);
  BOOST_TEST(ep->am_short(id_short, nullptr, 0, nullptr, 0) == status::ok);
  BOOST_TEST(ep->am_short(id_short, biggest_short.data(), attr.max_short, biggest_short.data(),
                          1) == status::invalid_param);
  const auto biggest_bcopy = pattern(attr.max_bcopy, 10);
  bcopy_source big{&biggest_bcopy};
  BOOST_TEST(ep->am_bcopy(id_bcopy, &bcopy_source::pack, &big) ==
             static_cast<ssize_t>(attr.max_bcopy));
  BOOST_TEST(ep->am_short(tl::am_id_count, nullptr, 0, nullptr, 0) == status::invalid_param);
  BOOST_TEST(progress_until({receiver.get()}, [&] {
    return got.shorts.messages.size() == 3 && got.bcopies.messages.size() == 2;
  }));
  BOOST_TEST(got.shorts.messages[1].bytes == biggest_short);
  BOOST_TEST(got.shorts.messages[2].bytes.empty());
  BOOST_TEST(got.bcopies.messages[1].bytes == biggest_bcopy);
  BOOST_TEST(ep->flush(nullptr) == status::ok);
}

BOOST_AUTO_TEST_CASE(loopback_to_own_interface) {
  auto iface = open_iface();
  recorder got;
  got.install(*iface, 7);
  auto ep = connect(*iface, *iface);
  const uint64_t value = 0x1122334455667788;
  BOOST_TEST(ep->am_short(7, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({iface.get()}, [&] { return got.messages.size() == 1; }));
  BOOST_TEST(got.messages[0].bytes.size() == sizeof(value));
}

BOOST_AUTO_TEST_CASE(short_bcopy_zcopy_across_processes) {
  channel to_child, to_parent;
  auto parent_iface = open_iface();
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface();
    three_recorders got(*iface);
    send_addresses(to_parent, *iface);
    std::vector<uint8_t> device, address;
    CHILD_CHECK(receive_addresses(to_child, &device, &address));
    CHILD_CHECK(progress_until({iface.get()}, [&] { return got.all_arrived(); }));
    CHILD_CHECK(got.contents_match());
    // Now the other way round: the child sends, the parent checks.
    auto ep = connect(*iface, device, address);
    CHILD_CHECK(send_three(*iface, *ep) == status::ok);
    std::vector<uint8_t> verdict;
    CHILD_CHECK(to_child.receive(&verdict));
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  send_addresses(to_child, *parent_iface);
  three_recorders got(*parent_iface);
  auto ep = connect(*parent_iface, device, address);
  BOOST_TEST(send_three(*parent_iface, *ep) == status::ok);
  BOOST_TEST(progress_until({parent_iface.get()}, [&] { return got.all_arrived(); }));
  BOOST_TEST(got.contents_match());
  to_child.send({1});
  BOOST_TEST(wait_child(child) == 0);
}

namespace {

/// A parked am_short carrying a sequence number.
struct numbered_send : tl::pending_req {
  tl::ep* ep = nullptr;
  uint64_t seq = 0;
  int calls = 0;
  numbered_send() {
    func = [](tl::pending_req* self) {
      auto* req = static_cast<numbered_send*>(self);
      ++req->calls;
      return req->ep->am_short(1, &req->seq, sizeof(req->seq), nullptr, 0);
    };
  }
};

std::vector<uint64_t> sequence_numbers(const recorder& got) {
  std::vector<uint64_t> seqs;
  for (const auto& m : got.messages) {
    uint64_t seq = ~uint64_t{0};
    if (m.bytes.size() == sizeof(seq)) std::memcpy(&seq, m.bytes.data(), sizeof(seq));
    seqs.push_back(seq);
  }
  return seqs;
}

}  // namespace

BOOST_AUTO_TEST_CASE(full_fifo_parks_and_resumes_in_order) {
  constexpr size_t fifo = 8;
  auto sender = open_iface();
  auto receiver = open_iface(fifo);
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);

  uint64_t seq = 0;
  while (seq < 100 && ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) ++seq;
  BOOST_TEST(seq == fifo);  // the FIFO holds exactly fifo_size cells
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::no_resource);
  bcopy_source source{&bcopy_bytes};
  BOOST_TEST(ep->am_bcopy(1, &bcopy_source::pack, &source) ==
             static_cast<ssize_t>(status::no_resource));

  std::vector<numbered_send> parked(20);
  for (auto& req : parked) {
    req.ep = ep.get();
    req.seq = seq++;
    BOOST_TEST(ep->pending_add(&req) == status::ok);
  }
  // While requests are parked, new sends queue behind them.
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::no_resource);
  // The sender alone cannot make room.
  for (int i = 0; i < 100; ++i) sender->progress();
  BOOST_TEST(got.messages.empty());
  BOOST_TEST(parked.front().calls <= 1);  // tried at most once, when it looked like room

  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.messages.size() == fifo + parked.size(); }));
  std::vector<uint64_t> expected(fifo + parked.size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = i;
  BOOST_TEST(sequence_numbers(got) == expected, boost::test_tools::per_element());
  for (const auto& req : parked) BOOST_TEST(req.calls >= 1);

  // Nothing parked any more: pending_add says "send now".
  numbered_send extra;
  extra.ep = ep.get();
  BOOST_TEST(ep->pending_add(&extra) == status::busy);
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok);
}

BOOST_AUTO_TEST_CASE(pending_purge_hands_back_every_request) {
  auto sender = open_iface();
  auto receiver = open_iface(2);
  auto ep = connect(*sender, *receiver);
  uint64_t seq = 0;
  while (ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) ++seq;
  std::vector<numbered_send> parked(3);
  for (auto& req : parked) {
    req.ep = ep.get();
    BOOST_TEST(ep->pending_add(&req) == status::ok);
  }
  std::vector<tl::pending_req*> purged;
  ep->pending_purge(
      [](tl::pending_req* req, void* arg) {
        static_cast<std::vector<tl::pending_req*>*>(arg)->push_back(req);
      },
      &purged);
  BOOST_TEST(purged.size() == 3u);
  BOOST_TEST((purged[0] == &parked[0] && purged[2] == &parked[2]));
}

BOOST_AUTO_TEST_CASE(zcopy_completes_only_after_the_receiver_has_the_data) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 2);
  auto ep = connect(*sender, *receiver);
  std::vector<uint8_t> payload = pattern(100000, 11);
  const uint64_t header = 42;
  const tl::iov entry{payload.data(), payload.size()};
  completion_probe done, flushed;
  BOOST_TEST(ep->am_zcopy(2, &header, sizeof(header), &entry, 1, &done) == status::in_progress);
  BOOST_TEST(ep->flush(&flushed) == status::in_progress);
  for (int i = 0; i < 1000; ++i) sender->progress();
  BOOST_TEST(done.calls == 0);
  BOOST_TEST(flushed.calls == 0);
  // The sender may sleep: the receiver wakes it when it acks.
  BOOST_TEST(sender->event_arm() == status::ok);
  pollfd sender_fd{sender->event_fd(), POLLIN, 0};
  BOOST_TEST(::poll(&sender_fd, 1, 0) == 0);

  receiver->progress();
  BOOST_TEST(got.messages.size() == 1u);
  BOOST_TEST(::poll(&sender_fd, 1, 10000) == 1);
  BOOST_TEST(sender->event_arm() == status::busy);  // the ack is there
  // The receiver read the payload from our buffer: change it now, its copy must not change.
  const std::vector<uint8_t> original = payload;
  std::fill(payload.begin(), payload.end(), 0);
  BOOST_TEST(progress_until({sender.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST(flushed.calls == 1);
  BOOST_TEST(done.result == status::ok);
  BOOST_TEST(got.messages[0].bytes.size() == sizeof(header) + original.size());
  BOOST_TEST(std::equal(original.begin(), original.end(),
                        got.messages[0].bytes.begin() + sizeof(header)));
  BOOST_TEST(ep->flush(nullptr) == status::ok);

  // Many in flight complete in order.
  std::vector<int> order;
  struct ordered : tl::completion {
    std::vector<int>* order;
    int n;
  };
  std::vector<ordered> comps(10);
  for (int i = 0; i < 10; ++i) {
    comps[i].count = 1;
    comps[i].order = &order;
    comps[i].n = i;
    comps[i].func = [](tl::completion* c) {
      auto* o = static_cast<ordered*>(c);
      o->order->push_back(o->n);
    };
    BOOST_TEST(ep->am_zcopy(2, &header, sizeof(header), &entry, 1, &comps[i]) ==
               status::in_progress);
  }
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return order.size() == 10; }));
  BOOST_TEST(order == std::vector<int>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}),
             boost::test_tools::per_element());

  // Limits.
  const tl::iov too_big{payload.data(), receiver->attr().max_zcopy + 1};
  BOOST_TEST(ep->am_zcopy(2, &header, sizeof(header), &too_big, 1, &done) ==
             status::invalid_param);
  std::vector<tl::iov> too_many(receiver->attr().max_iov + 1, entry);
  BOOST_TEST(ep->am_zcopy(2, &header, sizeof(header), too_many.data(), too_many.size(), &done) ==
             status::invalid_param);
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

BOOST_AUTO_TEST_CASE(event_fd_arm_busy_and_wakeup_in_one_process) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  pollfd pfd{receiver->event_fd(), POLLIN, 0};

  BOOST_TEST(receiver->event_arm() == status::ok);
  BOOST_TEST(::poll(&pfd, 1, 0) == 0);
  const uint64_t value = 5;
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(::poll(&pfd, 1, 10000) == 1);  // the send woke us
  BOOST_TEST(receiver->event_arm() == status::busy);  // a message is waiting
  BOOST_TEST(progress_until({receiver.get()}, [&] { return got.messages.size() == 1; }));
  BOOST_TEST(receiver->event_arm() == status::ok);
  BOOST_TEST(::poll(&pfd, 1, 0) == 0);  // the wakeup was consumed by arming
  // Unarmed: senders do not wake anybody, and nothing extra happens.
  receiver->progress();
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({receiver.get()}, [&] { return got.messages.size() == 3; }));
}

BOOST_AUTO_TEST_CASE(sleeping_receiver_wakes_on_a_send_from_another_process) {
  channel to_child, to_parent;
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 1);
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface();
    std::vector<uint8_t> device, address, go;
    CHILD_CHECK(receive_addresses(to_child, &device, &address));
    auto ep = connect(*iface, device, address);
    CHILD_CHECK(to_child.receive(&go));  // the parent is about to sleep
    std::this_thread::sleep_for(50ms);
    const uint64_t value = 0xfeed;
    CHILD_CHECK(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
    CHILD_CHECK(to_child.receive(&go));
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  send_addresses(to_child, *receiver);
  BOOST_TEST(receiver->event_arm() == status::ok);
  to_child.send({1});
  pollfd pfd{receiver->event_fd(), POLLIN, 0};
  BOOST_TEST(::poll(&pfd, 1, 10000) == 1);
  BOOST_TEST(progress_until({receiver.get()}, [&] { return got.messages.size() == 1; }));
  uint64_t value = 0;
  if (got.messages.size() == 1) std::memcpy(&value, got.messages[0].bytes.data(), sizeof(value));
  BOOST_TEST(value == 0xfeedu);
  to_child.send({1});
  BOOST_TEST(wait_child(child) == 0);
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

BOOST_AUTO_TEST_CASE(killed_peer_is_reported_and_outstanding_zcopy_fails) {
  channel to_parent;
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface();
    send_addresses(to_parent, *iface);
    std::this_thread::sleep_for(30s);  // never progresses; killed long before
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));

  auto survivor = open_iface();
  struct failure_log {
    int calls = 0;
    tl::ep* ep = nullptr;
    status reason = status::ok;
  } failures;
  survivor->set_error_handler(
      [](void* arg, tl::ep* failed, status reason) {
        auto* log = static_cast<failure_log*>(arg);
        ++log->calls;
        log->ep = failed;
        log->reason = reason;
      },
      &failures);
  auto ep = connect(*survivor, device, address);
  const uint64_t header = 9;
  const std::vector<uint8_t> payload = pattern(5000, 1);
  const tl::iov entry{payload.data(), payload.size()};
  completion_probe done, flushed;
  BOOST_TEST(ep->am_zcopy(2, &header, sizeof(header), &entry, 1, &done) == status::in_progress);
  BOOST_TEST(ep->flush(&flushed) == status::in_progress);
  BOOST_TEST(ep->am_short(1, &header, sizeof(header), nullptr, 0) == status::ok);

  BOOST_REQUIRE(::kill(child, SIGKILL) == 0);
  // Not reaped yet: a zombie is dead enough.
  BOOST_TEST(progress_until({survivor.get()}, [&] { return failures.calls > 0; }));
  BOOST_TEST(failures.calls == 1);
  BOOST_TEST(failures.ep == ep.get());
  BOOST_TEST(failures.reason == status::connection_reset);
  BOOST_TEST(done.calls == 1);
  BOOST_TEST(done.result == status::connection_reset);
  BOOST_TEST(flushed.calls == 1);
  BOOST_TEST(ep->am_short(1, &header, sizeof(header), nullptr, 0) == status::connection_reset);
  BOOST_TEST(ep->flush(nullptr) == status::connection_reset);
  for (int i = 0; i < 1000; ++i) survivor->progress();
  BOOST_TEST(failures.calls == 1);  // reported once
  ep.reset();
  int wstatus = 0;
  BOOST_TEST(::waitpid(child, &wstatus, 0) == child);
  BOOST_TEST(WIFSIGNALED(wstatus));
}

BOOST_AUTO_TEST_CASE(sleeping_survivor_wakes_when_its_peer_dies) {
  channel to_parent;
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface();
    send_addresses(to_parent, *iface);
    std::this_thread::sleep_for(30s);
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  auto survivor = open_iface();
  int failures = 0;
  survivor->set_error_handler([](void* arg, tl::ep*, status) { ++*static_cast<int*>(arg); },
                              &failures);
  auto ep = connect(*survivor, device, address);
  BOOST_TEST(survivor->event_arm() == status::ok);
  BOOST_REQUIRE(::kill(child, SIGKILL) == 0);
  pollfd pfd{survivor->event_fd(), POLLIN, 0};
  BOOST_TEST(::poll(&pfd, 1, 10000) == 1);
  // A woken worker arms again before sleeping: that notices the death and says busy.
  BOOST_TEST(survivor->event_arm() == status::busy);
  BOOST_TEST(progress_until({survivor.get()}, [&] { return failures == 1; }));
  BOOST_TEST(survivor->event_arm() == status::ok);  // nothing left to report
  ::waitpid(child, nullptr, 0);
}

BOOST_AUTO_TEST_CASE(destroyed_peer_interface_is_reported) {
  auto survivor = open_iface();
  auto peer = open_iface();
  int failures = 0;
  survivor->set_error_handler([](void* arg, tl::ep*, status) { ++*static_cast<int*>(arg); },
                              &failures);
  auto ep = connect(*survivor, *peer);
  peer.reset();
  BOOST_TEST(progress_until({survivor.get()}, [&] { return failures == 1; }));
  const uint64_t value = 1;
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::connection_reset);
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
