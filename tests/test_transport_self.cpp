// What is particular to the self transport (loopback between interfaces of one process): a zcopy to
// its own interface completing in one progress, addresses naming this process only (a forked child
// is refused), sends to a closed target answering connection_reset (self has no cap_peer_failure),
// and a destroyed endpoint dropping its completions. What every transport must do is checked in
// test_conformance.cpp. Every wait is bounded in iterations and time; nothing asserts on timing.
#define BOOST_TEST_MODULE transport_self
#include <boost/test/unit_test.hpp>

#include "test_util.hpp"
#include "tl_helpers.hpp"

#include <comm/transport/transport.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <ostream>
#include <vector>

using namespace comm;
using namespace std::chrono_literals;
using comm::test::completion_probe;
using comm::test::connect;
using comm::test::numbered_send;
using comm::test::recorder;


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

bool progress_until(std::initializer_list<tl::iface*> ifaces, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (uint64_t round = 0; round < 10'000'000; ++round) {
    for (tl::iface* iface : ifaces) iface->progress();
    if (done()) return true;
    if ((round & 1023) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}

}  // namespace

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

