// The self transport: loopback between interfaces of one process. Every wait is bounded in
// iterations and time; nothing asserts on timing.
#define BOOST_TEST_MODULE transport_self
#include <boost/test/unit_test.hpp>

#include "test_util.hpp"

#include <comm/transport/transport.hpp>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <ostream>
#include <thread>
#include <vector>

using namespace comm;
using namespace std::chrono_literals;


namespace {

tl::component& self_component() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == "self") return *c;
  }
  throw std::runtime_error("no self component");
}

std::unique_ptr<tl::iface> open_iface(size_t fifo_size = 0) {
  tl::iface_params params;
  params.fifo_size = fifo_size;
  std::unique_ptr<tl::iface> iface;
  const status st = self_component().open(params, iface);
  if (st != status::ok) throw std::runtime_error(std::string("open: ") + to_string(st));
  return iface;
}

std::unique_ptr<tl::ep> connect(tl::iface& from, tl::iface& to) {
  std::unique_ptr<tl::ep> ep;
  const status st = from.create_ep(to.device_address(), to.iface_address(), ep);
  if (st != status::ok) throw std::runtime_error(std::string("create_ep: ") + to_string(st));
  return ep;
}

struct recorder {
  std::vector<std::vector<uint8_t>> messages;
  bool misaligned = false;
  static status handler(void* arg, void* data, size_t length, unsigned) {
    auto* self = static_cast<recorder*>(arg);
    if (reinterpret_cast<uintptr_t>(data) % 8 != 0) self->misaligned = true;
    const auto* p = static_cast<const uint8_t*>(data);
    self->messages.emplace_back(p, p + length);
    return status::ok;
  }
  void install(tl::iface& iface, tl::am_id id) { iface.set_am_handler(id, &handler, this); }
};

bool progress_until(std::initializer_list<tl::iface*> ifaces, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (uint64_t round = 0; round < 10'000'000; ++round) {
    for (tl::iface* iface : ifaces) iface->progress();
    if (done()) return true;
    if ((round & 1023) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}

std::vector<uint8_t> pattern(size_t length, uint8_t seed) {
  std::vector<uint8_t> bytes(length);
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 13);
  return bytes;
}

struct completion_probe : tl::completion {
  int calls = 0;
  completion_probe() {
    count = 1;
    func = [](tl::completion* self) { ++static_cast<completion_probe*>(self)->calls; };
  }
};

size_t pack_vector(void* dest, void* arg) {
  const auto* bytes = static_cast<const std::vector<uint8_t>*>(arg);
  std::memcpy(dest, bytes->data(), bytes->size());
  return bytes->size();
}

struct numbered_send : tl::pending_req {
  tl::ep* ep = nullptr;
  uint64_t seq = 0;
  numbered_send() {
    func = [](tl::pending_req* self) {
      auto* req = static_cast<numbered_send*>(self);
      return req->ep->am_short(1, &req->seq, sizeof(req->seq), nullptr, 0);
    };
  }
};


}  // namespace

BOOST_AUTO_TEST_CASE(component_and_attributes) {
  auto iface = open_iface();
  BOOST_TEST(iface->transport_name() == "self");
  const tl::iface_attr& attr = iface->attr();
  BOOST_TEST((attr.caps & tl::cap_am_zcopy) != 0u);
  BOOST_TEST((attr.caps & tl::cap_pending) != 0u);
  BOOST_TEST((attr.caps & tl::cap_event_fd) != 0u);
  BOOST_TEST(attr.max_short > 0u);
  BOOST_TEST(iface->event_fd() >= 0);
  BOOST_TEST(!iface->info().empty());
  BOOST_TEST(tl::all_components().at(0)->name() == "self");
}

BOOST_AUTO_TEST_CASE(short_bcopy_zcopy_between_two_interfaces) {
  auto a = open_iface();
  auto b = open_iface();
  recorder shorts, bcopies, zcopies;
  shorts.install(*b, 1);
  bcopies.install(*b, 2);
  zcopies.install(*b, 3);
  auto ep = connect(*a, *b);

  const auto header = pattern(8, 1), payload = pattern(50, 2), bulk = pattern(8000, 3);
  BOOST_TEST(ep->am_short(1, header.data(), header.size(), payload.data(), payload.size()) ==
             status::ok);
  auto bcopy = bulk;
  BOOST_TEST(ep->am_bcopy(2, &pack_vector, &bcopy) == static_cast<ssize_t>(bulk.size()));
  const tl::iov entries[] = {{payload.data(), payload.size()}, {bulk.data(), 100}};
  completion_probe done;
  BOOST_TEST(ep->am_zcopy(3, header.data(), header.size(), entries, 2, &done) ==
             status::in_progress);
  BOOST_TEST(ep->flush(nullptr) == status::in_progress);
  // Nothing is delivered inside a send, and the zcopy waits for the receiver.
  BOOST_TEST(shorts.messages.empty());
  for (int i = 0; i < 100; ++i) a->progress();
  BOOST_TEST(done.calls == 0);

  BOOST_TEST(progress_until({b.get()}, [&] { return zcopies.messages.size() == 1; }));
  BOOST_TEST(progress_until({a.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST(done.result == status::ok);
  BOOST_TEST(ep->flush(nullptr) == status::ok);

  std::vector<uint8_t> expected = header;
  expected.insert(expected.end(), payload.begin(), payload.end());
  BOOST_TEST(shorts.messages.at(0) == expected);
  BOOST_TEST(bcopies.messages.at(0) == bulk);
  expected.insert(expected.end(), bulk.begin(), bulk.begin() + 100);
  BOOST_TEST(zcopies.messages.at(0) == expected);
  BOOST_TEST(!shorts.misaligned);
  BOOST_TEST(!bcopies.misaligned);
  BOOST_TEST(!zcopies.misaligned);

  BOOST_TEST(ep->am_short(tl::am_id_count, nullptr, 0, nullptr, 0) == status::invalid_param);
  std::vector<uint8_t> too_big(a->attr().max_short + 1);
  BOOST_TEST(ep->am_short(1, too_big.data(), too_big.size(), nullptr, 0) == status::invalid_param);
}

BOOST_AUTO_TEST_CASE(loopback_zcopy_completes_in_the_same_progress) {
  auto iface = open_iface();
  recorder got;
  got.install(*iface, 4);
  auto ep = connect(*iface, *iface);
  const uint64_t value = 99;
  const tl::iov entry{&value, sizeof(value)};
  completion_probe done, flushed;
  BOOST_TEST(ep->am_zcopy(4, nullptr, 0, &entry, 1, &done) == status::in_progress);
  BOOST_TEST(ep->flush(&flushed) == status::in_progress);
  iface->progress();
  BOOST_TEST(got.messages.size() == 1u);
  BOOST_TEST(done.calls == 1);
  BOOST_TEST(flushed.calls == 1);
}

BOOST_AUTO_TEST_CASE(full_queue_parks_and_resumes_in_order) {
  constexpr size_t fifo = 4;
  auto a = open_iface();
  auto b = open_iface(fifo);
  recorder got;
  got.install(*b, 1);
  auto ep = connect(*a, *b);
  uint64_t seq = 0;
  while (seq < 100 && ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) ++seq;
  BOOST_TEST(seq == fifo);
  std::vector<numbered_send> parked(10);
  for (auto& req : parked) {
    req.ep = ep.get();
    req.seq = seq++;
    BOOST_TEST(ep->pending_add(&req) == status::ok);
  }
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::no_resource);
  for (int i = 0; i < 100; ++i) a->progress();
  BOOST_TEST(got.messages.empty());
  BOOST_TEST(progress_until({b.get(), a.get()},
                            [&] { return got.messages.size() == fifo + parked.size(); }));
  for (size_t i = 0; i < got.messages.size(); ++i) {
    uint64_t value = 0;
    std::memcpy(&value, got.messages[i].data(), sizeof(value));
    BOOST_TEST(value == i);
  }
  numbered_send extra;
  extra.ep = ep.get();
  BOOST_TEST(ep->pending_add(&extra) == status::busy);
}

BOOST_AUTO_TEST_CASE(event_fd_arm_busy_and_wakeup_from_another_thread) {
  auto a = open_iface();
  auto b = open_iface();
  recorder got;
  got.install(*b, 1);
  auto ep = connect(*a, *b);
  pollfd pfd{b->event_fd(), POLLIN, 0};
  BOOST_TEST(b->event_arm() == status::ok);
  BOOST_TEST(::poll(&pfd, 1, 0) == 0);
  std::thread sender([&] {
    std::this_thread::sleep_for(20ms);
    const uint64_t value = 3;
    (void)ep->am_short(1, &value, sizeof(value), nullptr, 0);
  });
  BOOST_TEST(::poll(&pfd, 1, 10000) == 1);
  sender.join();
  BOOST_TEST(b->event_arm() == status::busy);
  BOOST_TEST(progress_until({b.get()}, [&] { return got.messages.size() == 1; }));
  BOOST_TEST(b->event_arm() == status::ok);
  BOOST_TEST(::poll(&pfd, 1, 0) == 0);
}

BOOST_AUTO_TEST_CASE(sender_wakes_for_a_zcopy_completion) {
  auto a = open_iface();
  auto b = open_iface();
  recorder got;
  got.install(*b, 1);
  auto ep = connect(*a, *b);
  const uint64_t value = 3;
  const tl::iov entry{&value, sizeof(value)};
  completion_probe done;
  BOOST_TEST(ep->am_zcopy(1, nullptr, 0, &entry, 1, &done) == status::in_progress);
  BOOST_TEST(a->event_arm() == status::ok);
  pollfd pfd{a->event_fd(), POLLIN, 0};
  BOOST_TEST(::poll(&pfd, 1, 0) == 0);
  b->progress();  // delivers, hands the completion back to a
  BOOST_TEST(::poll(&pfd, 1, 10000) == 1);
  BOOST_TEST(a->event_arm() == status::busy);
  a->progress();
  BOOST_TEST(done.calls == 1);
}

BOOST_AUTO_TEST_CASE(addresses_and_reachability) {
  auto a = open_iface();
  auto b = open_iface();
  const auto device = b->device_address();
  const auto address = b->iface_address();
  BOOST_TEST(a->is_reachable(device, address));
  BOOST_TEST(a->iface_address() != address);
  std::unique_ptr<tl::ep> ep;
  auto truncated = address;
  truncated.pop_back();
  BOOST_TEST(a->create_ep(device, truncated, ep) == status::invalid_addr);
  BOOST_TEST(!a->is_reachable(device, truncated));
  auto other_process = device;
  other_process[0] ^= 0x01;  // another pid
  BOOST_TEST(!a->is_reachable(other_process, address));
  BOOST_TEST(a->create_ep(other_process, address, ep) == status::unreachable);
  b.reset();
  BOOST_TEST(!a->is_reachable(device, address));
  BOOST_TEST(a->create_ep(device, address, ep) == status::unreachable);

  // A forked child inherits the registry, but not the right to use it.
  auto c = open_iface();
  const auto c_device = c->device_address();
  const auto c_address = c->iface_address();
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    auto mine = open_iface();
    std::unique_ptr<tl::ep> stolen;
    const bool refused = !mine->is_reachable(c_device, c_address) &&
                         mine->create_ep(c_device, c_address, stolen) == status::unreachable;
    ::_exit(refused ? 0 : 1);
  }
  int wstatus = 0;
  BOOST_TEST(::waitpid(child, &wstatus, 0) == child);
  BOOST_TEST((WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0));
}

BOOST_AUTO_TEST_CASE(closed_target_resets_sends_and_undelivered_zcopy) {
  auto a = open_iface();
  auto b = open_iface();
  auto ep = connect(*a, *b);
  const uint64_t value = 1;
  const tl::iov entry{&value, sizeof(value)};
  completion_probe done;
  BOOST_TEST(ep->am_zcopy(1, nullptr, 0, &entry, 1, &done) == status::in_progress);
  b.reset();
  BOOST_TEST(progress_until({a.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST(done.result == status::connection_reset);
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::connection_reset);
  numbered_send req;
  req.ep = ep.get();
  BOOST_TEST(ep->pending_add(&req) == status::connection_reset);
}

BOOST_AUTO_TEST_CASE(destroyed_endpoint_drops_its_completions) {
  auto a = open_iface();
  auto b = open_iface();
  recorder got;
  got.install(*b, 1);
  auto ep = connect(*a, *b);
  const uint64_t value = 1;
  const tl::iov entry{&value, sizeof(value)};
  completion_probe done;
  BOOST_TEST(ep->am_zcopy(1, nullptr, 0, &entry, 1, &done) == status::in_progress);
  ep.reset();
  BOOST_TEST(progress_until({b.get()}, [&] { return got.messages.size() == 1; }));
  for (int i = 0; i < 100; ++i) a->progress();
  BOOST_TEST(done.calls == 0);
}

BOOST_AUTO_TEST_CASE(no_fd_leaks) {
  const size_t before = comm::test::open_fds();
  {
    auto a = open_iface();
    auto b = open_iface();
    auto ab = connect(*a, *b);
    auto ba = connect(*b, *a);
    const uint64_t value = 1;
    BOOST_TEST(ab->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
    BOOST_TEST(comm::test::open_fds() == before + 2);  // one eventfd per interface
  }
  BOOST_TEST(comm::test::open_fds() == before);
}
