// Transport conformance (in the spirit of UCX's uct_p2p_test): every case runs on the transport
// interface directly, once per transport the registry has a device for (tests/transport_list.hpp),
// so adding a transport adds it here with no edit. Capability flags decide what a case exercises:
// an operation a flag does not claim must answer unsupported; one it claims must work. Failures
// print the transport ("transport = shm"). Cases needing another process skip a transport whose
// interfaces another process cannot reach, and say so. Transport-specific cases (addresses,
// configuration, framing details, counters in info()) stay in test_transport_<name>.cpp.
// Every wait is bounded in iterations and time; nothing asserts on timing.
#define BOOST_TEST_MODULE transport_conformance
#include "process_harness.hpp"
#include "test_util.hpp"
#include "tl_helpers.hpp"
#include "transport_list.hpp"
#include "wire_injectors.hpp"
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <comm/transport/transport.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace comm;
using namespace std::chrono_literals;
using comm::test::channel;
using comm::test::completion_probe;
using comm::test::connect;
using comm::test::failure_log;
using comm::test::fork_child;
using comm::test::numbered_send;
using comm::test::receive_addresses;
using comm::test::recorder;
using comm::test::send_addresses;
using comm::test::wait_child;

namespace conformance {

// -- opening interfaces and endpoints --------------------------------------------------------------

/// Opens an interface of `transport` on its first device; `fifo_size` 0 is the transport default.
std::unique_ptr<tl::iface> open_iface(const std::string& transport, size_t fifo_size = 0) {
  tl::component* component = comm::test::find_component(transport);
  if (component == nullptr) throw std::runtime_error("no component " + transport);
  const std::vector<std::string> devices = component->devices();
  if (devices.empty()) throw std::runtime_error("no device for " + transport);
  tl::iface_params params;
  params.device = devices.front();
  params.fifo_size = fifo_size;
  std::unique_ptr<tl::iface> iface;
  const status st = component->open(params, iface);
  if (st != status::ok) throw std::runtime_error("open " + transport + ": " + to_string(st));
  return iface;
}

bool has(const tl::iface& iface, tl::cap flag) { return (iface.attr().caps & flag) != 0; }

// -- progress ------------------------------------------------------------------------------------

using iface_list = std::initializer_list<tl::iface*>;

/// Calls progress on `ifaces` until `done()` holds, at most `limit` long and 50 M rounds.
bool progress_until(iface_list ifaces, const std::function<bool()>& done,
                    std::chrono::milliseconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (uint64_t round = 0; round < 50'000'000; ++round) {
    for (tl::iface* iface : ifaces) iface->progress();
    if (done()) return true;
    if ((round & 255) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}

/// Progresses `ifaces` `rounds` times.
void progress_rounds(iface_list ifaces, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    for (tl::iface* iface : ifaces) iface->progress();
  }
}

/// Retries `send` (which returns a status) while it answers no_resource, progressing `ifaces`;
/// returns its last answer.
status retry_while_busy(iface_list ifaces, const std::function<status()>& send) {
  status st = status::no_resource;
  progress_until(ifaces, [&] {
    st = send();
    return st != status::no_resource;
  });
  return st;
}

// -- data ----------------------------------------------------------------------------------------

std::vector<uint8_t> pattern(size_t length, uint32_t seed) {
  std::vector<uint8_t> bytes(length);
  for (size_t i = 0; i < length; ++i) {
    bytes[i] = static_cast<uint8_t>(seed * 31 + i * 7 + (i >> 8) + (i >> 16));
  }
  return bytes;
}

std::vector<uint8_t> concat(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<uint8_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  return all;
}

/// Sizes worth trying up to `max`: 0, 1, each power of two and its neighbours, and `max`.
std::vector<size_t> size_classes(size_t max) {
  std::set<size_t> sizes = {0, 1, max};
  if (max > 0) sizes.insert(max - 1);
  for (size_t p = 2; p <= max; p *= 2) {
    for (size_t s : {p - 1, p, p + 1}) {
      if (s <= max) sizes.insert(s);
    }
  }
  return {sizes.begin(), sizes.end()};
}

/// Writes a byte vector in am_bcopy's pack callback.
size_t pack_vector(void* dest, void* arg) {
  const auto* bytes = static_cast<const std::vector<uint8_t>*>(arg);
  if (!bytes->empty()) std::memcpy(dest, bytes->data(), bytes->size());
  return bytes->size();
}

// -- completions --------------------------------------------------------------------------------

/// Starts a zcopy on `ep`; when it completed at once, marks `probe` as called. Returns the status.
status start_zcopy(tl::ep& ep, tl::am_id id, const std::vector<uint8_t>& header,
                   const std::vector<tl::iov>& entries, completion_probe& probe) {
  const status st = ep.am_zcopy(id, header.data(), header.size(), entries.data(), entries.size(),
                                &probe);
  if (st == status::ok) {
    probe.calls = 1;
    probe.result = status::ok;
  }
  return st;
}

/// A region of `b` registered and its key unpacked on `a`'s side.
struct remote_region {
  tl::iface& owner;
  tl::iface& user;
  std::vector<uint8_t> bytes;
  tl::mem_handle* handle = nullptr;
  std::vector<uint8_t> packed;
  tl::remote_key key;

  remote_region(tl::iface& a, tl::iface& b, size_t size) : owner(b), user(a), bytes(pattern(size, 8)) {
    BOOST_REQUIRE(owner.memory_domain()->mem_reg(bytes.data(), bytes.size(), &handle) == status::ok);
    BOOST_REQUIRE(owner.memory_domain()->rkey_pack(handle, packed) == status::ok);
    BOOST_REQUIRE(user.memory_domain()->rkey_unpack(packed.data(), packed.size(), &key) ==
                  status::ok);
  }
  ~remote_region() {
    user.memory_domain()->rkey_release(&key);
    if (handle != nullptr) owner.memory_domain()->mem_dereg(handle);
  }
  uint64_t at(int64_t offset) const {
    return reinterpret_cast<uintptr_t>(bytes.data()) + static_cast<uint64_t>(offset);
  }
};

// -- another process -----------------------------------------------------------------------------

/// True when cross-process cases run over `transport`; otherwise reports the skip.
bool reaches_other_processes(const std::string& transport) {
  const std::string why = comm::test::cannot_reach_other_processes(transport);
  if (why.empty()) return true;
  BOOST_TEST_MESSAGE("skipped over " << transport << ": " << why);
  return false;
}

auto each_transport() { return boost::unit_test::data::make(comm::test::transports_under_test()); }

}  // namespace conformance

// Named rather than anonymous: data-driven cases are templates, and their lambdas capture these
// types (g++ warns about anonymous-namespace types inside them).
using namespace conformance;

// -- the registry ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_transport_runs_or_says_why_not) {
  const auto running = comm::test::transports_under_test();
  for (const std::string& name : running) {
    BOOST_TEST_MESSAGE("conformance runs over " << name);
  }
  for (const auto& [name, why] : comm::test::transports_skipped()) {
    BOOST_TEST_MESSAGE("conformance skips " << name << ": " << why);
    BOOST_TEST(!why.empty());
  }
  BOOST_TEST(running.size() + comm::test::transports_skipped().size() ==
             tl::all_components().size());
  BOOST_TEST(!running.empty());
}

// -- capabilities ----------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(limits_agree_with_the_capability_flags, each_transport(), transport) {
  auto iface = open_iface(transport);
  const tl::iface_attr& attr = iface->attr();
  BOOST_TEST(iface->transport_name() == transport);
  BOOST_TEST(!iface->info().empty());
  BOOST_TEST(has(*iface, tl::cap_am_short) == (attr.max_short > 0));
  BOOST_TEST(has(*iface, tl::cap_am_bcopy) == (attr.max_bcopy > 0));
  BOOST_TEST(has(*iface, tl::cap_am_zcopy) == (attr.max_zcopy > 0 && attr.max_iov > 0));
  BOOST_TEST(has(*iface, tl::cap_put_zcopy) == (attr.max_put_zcopy > 0));
  BOOST_TEST(has(*iface, tl::cap_get_zcopy) == (attr.max_get_zcopy > 0));
  if (has(*iface, tl::cap_get_zcopy)) BOOST_TEST(attr.max_outstanding_reads > 0u);
  const bool rma = has(*iface, tl::cap_put_zcopy) || has(*iface, tl::cap_get_zcopy);
  BOOST_TEST(rma == (iface->memory_domain() != nullptr));
  BOOST_TEST(has(*iface, tl::cap_event_fd) == (iface->event_fd() >= 0));
  BOOST_TEST(attr.latency_ns > 0);
  BOOST_TEST(attr.bandwidth_bytes_per_s > 0);
}

BOOST_DATA_TEST_CASE(operations_answer_as_their_flags_claim, each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  uint8_t byte = 7;
  const tl::iov entry{&byte, 1};
  completion_probe zcopy;
  const status z = ep->am_zcopy(1, nullptr, 0, &entry, 1, &zcopy);
  if (has(*sender, tl::cap_am_zcopy)) {
    BOOST_TEST((z == status::ok || z == status::in_progress || z == status::no_resource));
  } else {
    BOOST_TEST(z == status::unsupported);
  }
  // Without a remote key of its own, a transport that claims RMA refuses the empty key; one that
  // does not claim it answers unsupported whatever the key.
  completion_probe rma;
  const status put = ep->put_zcopy(&entry, 1, 0, tl::remote_key{}, &rma);
  const status get = ep->get_zcopy(&entry, 1, 0, tl::remote_key{}, &rma);
  BOOST_TEST((has(*sender, tl::cap_put_zcopy) ? put != status::unsupported && is_error(put)
                                               : put == status::unsupported));
  BOOST_TEST((has(*sender, tl::cap_get_zcopy) ? get != status::unsupported && is_error(get)
                                               : get == status::unsupported));
  BOOST_TEST(rma.calls == 0);
  BOOST_TEST(ep->am_short(tl::am_id_count, nullptr, 0, nullptr, 0) == status::invalid_param);
  if (z == status::in_progress) {
    BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return zcopy.calls == 1; }));
  }
}

// -- active messages at every size -----------------------------------------------------------------

BOOST_DATA_TEST_CASE(am_short_at_every_size_up_to_max_short, each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  recorder got;
  got.install(*receiver, 2);
  auto ep = connect(*sender, *receiver);
  const size_t max = sender->attr().max_short;
  std::vector<std::vector<uint8_t>> expected;
  for (size_t size : size_classes(max)) {
    // Split header/payload three ways: all header, all payload, and in the middle.
    for (size_t header : {size, size_t{0}, size / 2}) {
      const auto bytes = pattern(size, static_cast<uint32_t>(size + header));
      const status st = retry_while_busy({sender.get(), receiver.get()}, [&] {
        return ep->am_short(2, bytes.data(), header, bytes.data() + header, size - header);
      });
      BOOST_TEST_REQUIRE(st == status::ok, "size " << size << ", header " << header << ": " << st);
      expected.push_back(bytes);
    }
  }
  const auto over = pattern(max + 1, 1);
  BOOST_TEST(ep->am_short(2, over.data(), 1, over.data() + 1, max) == status::invalid_param);
  BOOST_TEST(ep->am_short(2, over.data(), max + 1, nullptr, 0) == status::invalid_param);
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.size() == expected.size(); }));
  BOOST_REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    BOOST_TEST_CONTEXT("message " << i << " of size " << expected[i].size()) {
      BOOST_TEST((got.messages[i].bytes == expected[i]));
    }
  }
  BOOST_TEST(!got.misaligned);
}

BOOST_DATA_TEST_CASE(am_bcopy_at_every_size_up_to_max_bcopy, each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  recorder got;
  got.install(*receiver, 3);
  auto ep = connect(*sender, *receiver);
  std::vector<std::vector<uint8_t>> expected;
  for (size_t size : size_classes(sender->attr().max_bcopy)) {
    auto bytes = pattern(size, static_cast<uint32_t>(size));
    ssize_t sent = 0;
    retry_while_busy({sender.get(), receiver.get()}, [&] {
      sent = ep->am_bcopy(3, &pack_vector, &bytes);
      return sent < 0 ? static_cast<status>(sent) : status::ok;
    });
    BOOST_TEST_REQUIRE(sent == static_cast<ssize_t>(size), "size " << size << ": " << sent);
    expected.push_back(std::move(bytes));
  }
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.size() == expected.size(); }));
  BOOST_REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    BOOST_TEST_CONTEXT("size " << expected[i].size()) {
      BOOST_TEST((got.messages[i].bytes == expected[i]));
    }
  }
  BOOST_TEST(!got.misaligned);
}

namespace conformance {

/// `data` cut into `count` entries of uneven lengths (the first ones may be empty).
std::vector<tl::iov> cut(const std::vector<uint8_t>& data, size_t count) {
  std::vector<tl::iov> entries(count);
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t left = data.size() - offset;
    const size_t length = i + 1 == count ? left : std::min(left, (data.size() / count) / 2 + i);
    entries[i] = {data.data() + offset, length};
    offset += length;
  }
  return entries;
}

}  // namespace conformance

BOOST_DATA_TEST_CASE(am_zcopy_at_every_size_header_and_iov_count, each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  if (!has(*sender, tl::cap_am_zcopy)) return;  // operations_answer_as_their_flags_claim
  recorder got;
  got.install(*receiver, 4);
  auto ep = connect(*sender, *receiver);
  const tl::iface_attr& attr = sender->attr();
  std::vector<std::vector<uint8_t>> expected;
  const std::vector<size_t> headers = {0, 1, 8, attr.max_hdr};
  const std::vector<size_t> counts = {1, 2, attr.max_iov};
  size_t variant = 0;
  for (size_t size : size_classes(attr.max_zcopy)) {
    // Every size once, with header lengths and iov counts taking turns.
    const size_t header_length = headers[variant % headers.size()];
    const size_t count = counts[(variant / headers.size()) % counts.size()];
    ++variant;
    const auto header = pattern(header_length, 100 + static_cast<uint32_t>(size));
    const auto data = pattern(size, static_cast<uint32_t>(size));
    completion_probe done;
    const status st = retry_while_busy({sender.get(), receiver.get()}, [&] {
      return start_zcopy(*ep, 4, header, cut(data, count), done);
    });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress),
                       "size " << size << ", header " << header_length << ", iov " << count
                               << ": " << st);
    BOOST_TEST_REQUIRE(progress_until({receiver.get(), sender.get()},
                                      [&] { return done.calls == 1; }));
    BOOST_TEST(done.result == status::ok);
    expected.push_back(concat(header, data));
  }
  // Over each limit: refused at once, the completion never called.
  const auto big = pattern(attr.max_zcopy + 1, 9);
  const auto header = pattern(attr.max_hdr + 1, 9);
  completion_probe unused;
  BOOST_TEST(ep->am_zcopy(4, header.data(), header.size(), nullptr, 0, &unused) ==
             status::invalid_param);
  const std::vector<tl::iov> too_many(attr.max_iov + 1, tl::iov{big.data(), 1});
  BOOST_TEST(ep->am_zcopy(4, nullptr, 0, too_many.data(), too_many.size(), &unused) ==
             status::invalid_param);
  const tl::iov too_long[] = {{big.data(), attr.max_zcopy}, {big.data(), 1}};
  BOOST_TEST(ep->am_zcopy(4, nullptr, 0, too_long, 2, &unused) == status::invalid_param);
  BOOST_TEST(ep->am_zcopy(tl::am_id_count, nullptr, 0, too_long, 1, &unused) ==
             status::invalid_param);

  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.size() == expected.size(); }));
  BOOST_REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    BOOST_TEST_CONTEXT("message " << i << " of " << expected[i].size() << " bytes") {
      BOOST_TEST((got.messages[i].bytes == expected[i]));
    }
  }
  BOOST_TEST(!got.misaligned);
  progress_rounds({sender.get(), receiver.get()}, 100);
  BOOST_TEST(unused.calls == 0);
}

BOOST_DATA_TEST_CASE(loopback_to_own_interface, each_transport(), transport) {
  auto iface = open_iface(transport);
  recorder got;
  got.install(*iface, 7);
  auto ep = connect(*iface, *iface);
  for (uint64_t seq = 0; seq < 3; ++seq) {
    BOOST_TEST(retry_while_busy({iface.get()}, [&] {
                 return ep->am_short(7, &seq, sizeof(seq), nullptr, 0);
               }) == status::ok);
  }
  BOOST_TEST(progress_until({iface.get()}, [&] { return got.size() == 3; }));
  BOOST_TEST(got.in_sequence());
}

// -- zcopy completion, flush, fence ----------------------------------------------------------------

BOOST_DATA_TEST_CASE(zcopy_completes_only_once_the_peer_holds_the_data, each_transport(),
                     transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  if (!has(*sender, tl::cap_am_zcopy)) return;
  recorder got;
  got.install(*receiver, 5);
  auto ep = connect(*sender, *receiver);
  const size_t size = std::min<size_t>(sender->attr().max_zcopy, 100000);
  std::vector<uint8_t> data = pattern(size, 11);
  const std::vector<uint8_t> original = data;
  const std::vector<uint8_t> header = pattern(std::min<size_t>(8, sender->attr().max_hdr), 12);
  completion_probe done, flushed;
  bool completed_before_delivery = false;
  done.on_call = [&] { completed_before_delivery = got.size() == 0; };
  bool flushed_before_done = false;
  flushed.on_call = [&] { flushed_before_done = done.calls == 0; };
  const status st = retry_while_busy({sender.get(), receiver.get()}, [&] {
    return start_zcopy(*ep, 5, header, {{data.data(), data.size()}}, done);
  });
  BOOST_REQUIRE((st == status::ok || st == status::in_progress));
  if (st == status::in_progress) {
    BOOST_TEST(ep->flush(&flushed) == status::in_progress);
    if (comm::test::acknowledged_by_device(transport)) {
      // The peer's device takes the data: the sender alone finishes (checked below: it is there).
      BOOST_TEST(progress_until({sender.get()}, [&] { return flushed.calls == 1; }));
    } else {
      // The sender alone cannot finish it: nobody has taken the data yet.
      progress_rounds({sender.get()}, 1000);
      BOOST_TEST(done.calls == 0);
      BOOST_TEST(flushed.calls == 0);
      BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return done.calls == 1; }));
      BOOST_TEST(progress_until({sender.get()}, [&] { return flushed.calls == 1; }));
      BOOST_TEST(!completed_before_delivery);
    }
    BOOST_TEST(done.calls == 1);
    BOOST_TEST(!flushed_before_done);
    BOOST_TEST(done.result == status::ok);
    BOOST_TEST(flushed.result == status::ok);
  }
  // Complete means the buffer is ours again: changing it now must not change what arrived.
  std::fill(data.begin(), data.end(), 0);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return got.size() == 1; }));
  BOOST_REQUIRE(got.size() == 1u);
  BOOST_TEST((got.messages[0].bytes == concat(header, original)));
  BOOST_TEST(progress_until({sender.get(), receiver.get()},
                            [&] { return ep->flush(nullptr) == status::ok; }));
}

BOOST_DATA_TEST_CASE(zcopy_completions_come_in_issue_order, each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  if (!has(*sender, tl::cap_am_zcopy)) return;
  recorder got;
  got.install(*receiver, 5);
  auto ep = connect(*sender, *receiver);
  const auto data = pattern(std::min<size_t>(sender->attr().max_zcopy, 5000), 3);
  constexpr int count = 20;
  std::vector<int> order;
  std::vector<completion_probe> probes(count);
  for (int i = 0; i < count; ++i) {
    probes[i].on_call = [&order, i] { order.push_back(i); };
    const status st = retry_while_busy({sender.get(), receiver.get()}, [&] {
      return start_zcopy(*ep, 5, {}, {{data.data(), data.size()}}, probes[i]);
    });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), "zcopy " << i << ": " << st);
    if (st == status::ok) order.push_back(i);
  }
  completion_probe flushed;
  const status flush = ep->flush(&flushed);
  if (flush == status::in_progress) {
    BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return flushed.calls == 1; }));
  } else {
    BOOST_TEST(flush == status::ok);
  }
  // A flush completes after everything issued before it.
  BOOST_TEST(order.size() == static_cast<size_t>(count));
  std::vector<int> expected(count);
  for (int i = 0; i < count; ++i) expected[i] = i;
  BOOST_TEST(order == expected, boost::test_tools::per_element());
  BOOST_TEST(progress_until({receiver.get()}, [&] { return got.size() == count; }));
}

BOOST_DATA_TEST_CASE(a_zcopy_without_a_completion_is_done_once_a_later_one_or_a_flush_is,
                     each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  auto ep = connect(*sender, *receiver);
  const iface_list both = {sender.get(), receiver.get()};
  const auto flush_all = [&] {
    completion_probe flushed;
    const status st = ep->flush(&flushed);
    if (st != status::in_progress) return st;
    if (!progress_until(both, [&] { return flushed.calls == 1; })) return status::timed_out;
    return flushed.result;
  };
  if (has(*sender, tl::cap_am_zcopy)) {
    recorder got;
    got.install(*receiver, 5);
    const auto first = pattern(std::min<size_t>(sender->attr().max_zcopy, 5000), 21);
    const auto second = pattern(100, 22);
    const std::vector<tl::iov> one{{first.data(), first.size()}}, two{{second.data(), 100}};
    status st = retry_while_busy(
        both, [&] { return ep->am_zcopy(5, nullptr, 0, one.data(), one.size(), nullptr); });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), to_string(st));
    // Completions come in issue order: once the later one completes, the first is done too.
    completion_probe later;
    st = retry_while_busy(both, [&] { return start_zcopy(*ep, 5, {}, two, later); });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), to_string(st));
    BOOST_TEST(progress_until(both, [&] { return later.calls == 1; }));
    BOOST_TEST(later.result == status::ok);
    st = retry_while_busy(
        both, [&] { return ep->am_zcopy(5, nullptr, 0, two.data(), two.size(), nullptr); });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), to_string(st));
    BOOST_TEST(flush_all() == status::ok);
    BOOST_TEST(progress_until({receiver.get()}, [&] { return got.size() == 3; }));
    BOOST_REQUIRE(got.size() == 3u);
    BOOST_TEST((got.messages[0].bytes == first));
    BOOST_TEST((got.messages[2].bytes == second));
  }
  if (!has(*sender, tl::cap_put_zcopy) && !has(*sender, tl::cap_get_zcopy)) return;
  remote_region region(*sender, *receiver, 4096);
  if (has(*sender, tl::cap_put_zcopy)) {
    const auto x = pattern(1000, 31);
    const tl::iov entry{x.data(), x.size()};
    const status st = retry_while_busy(
        both, [&] { return ep->put_zcopy(&entry, 1, region.at(100), region.key, nullptr); });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), to_string(st));
    BOOST_TEST(flush_all() == status::ok);
    BOOST_TEST(std::equal(x.begin(), x.end(), region.bytes.begin() + 100));
  }
  if (has(*sender, tl::cap_get_zcopy)) {
    std::vector<uint8_t> into(1000, 0xee);
    const tl::iov entry{into.data(), into.size()};
    const status st = retry_while_busy(
        both, [&] { return ep->get_zcopy(&entry, 1, region.at(2000), region.key, nullptr); });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), to_string(st));
    BOOST_TEST(flush_all() == status::ok);
    BOOST_TEST(std::equal(into.begin(), into.end(), region.bytes.begin() + 2000));
  }
}

BOOST_DATA_TEST_CASE(flush_of_an_idle_endpoint_and_fence_between_sends, each_transport(),
                     transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  // Nothing started yet: done at once, even while a connection is still being set up, and the
  // completion is never called.
  completion_probe untouched;
  BOOST_TEST(ep->flush(&untouched) == status::ok);
  progress_rounds({sender.get(), receiver.get()}, 1000);
  BOOST_TEST(untouched.calls == 0);
  BOOST_TEST(ep->flush(nullptr) == status::ok);
  for (uint64_t seq = 0; seq < 10; ++seq) {
    BOOST_TEST(retry_while_busy({sender.get(), receiver.get()}, [&] {
                 return ep->am_short(1, &seq, sizeof(seq), nullptr, 0);
               }) == status::ok);
    if (seq % 3 == 0) BOOST_TEST(ep->fence() == status::ok);
  }
  BOOST_TEST(progress_until({sender.get(), receiver.get()}, [&] {
    return got.size() == 10 && ep->flush(nullptr) == status::ok;
  }));
  BOOST_TEST(got.in_sequence());
}

BOOST_DATA_TEST_CASE(a_put_before_a_fence_lands_before_a_message_after_it, each_transport(),
                     transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  if (!has(*sender, tl::cap_put_zcopy)) return;
  remote_region target(*sender, *receiver, 4096);
  struct observer {
    const std::vector<uint8_t>* target;
    std::vector<uint8_t> seen;
  } seen{&target.bytes, {}};
  receiver->set_am_handler(
      1,
      [](void* arg, void*, size_t, unsigned) {
        auto* o = static_cast<observer*>(arg);
        o->seen = *o->target;
        return status::ok;
      },
      &seen);
  auto ep = connect(*sender, *receiver);
  const auto data = pattern(target.bytes.size(), 21);
  const tl::iov entry{data.data(), data.size()};
  completion_probe put;
  // A fresh endpoint may answer no_resource while its connection is set up.
  const status st = retry_while_busy({sender.get(), receiver.get()}, [&] {
    return ep->put_zcopy(&entry, 1, target.at(0), target.key, &put);
  });
  BOOST_TEST((st == status::ok || st == status::in_progress));
  BOOST_TEST(ep->fence() == status::ok);
  BOOST_TEST(retry_while_busy({sender.get(), receiver.get()}, [&] {
               return ep->am_short(1, nullptr, 0, nullptr, 0);
             }) == status::ok);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return !seen.seen.empty(); }));
  BOOST_TEST((seen.seen == data));
  if (st == status::in_progress) {
    BOOST_TEST(progress_until({sender.get(), receiver.get()}, [&] { return put.calls == 1; }));
  }
  BOOST_TEST(receiver->memory_domain()->mem_dereg(target.handle) == status::ok);
  target.handle = nullptr;
}

// -- ordering --------------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(mixed_sends_on_one_endpoint_arrive_in_order, each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  recorder got;
  for (tl::am_id id : {1, 2, 3}) got.install(*receiver, id);
  auto ep = connect(*sender, *receiver);
  const tl::iface_attr& attr = sender->attr();
  const bool zcopy = has(*sender, tl::cap_am_zcopy);
  constexpr uint64_t count = 2000;
  const auto body = pattern(std::max({attr.max_short, attr.max_bcopy, attr.max_zcopy}), 13);
  std::vector<completion_probe> probes(count);
  for (uint64_t seq = 0; seq < count; ++seq) {
    const size_t length = (seq * 7919) % 200;
    const status st = retry_while_busy({sender.get(), receiver.get()}, [&]() -> status {
      switch (seq % (zcopy ? 3 : 2)) {
        case 0:
          return ep->am_short(1, &seq, sizeof(seq), body.data(),
                              std::min(length, attr.max_short - sizeof(seq)));
        case 1: {
          std::vector<uint8_t> bytes(sizeof(seq) + std::min(length * 40, attr.max_bcopy - 8));
          std::memcpy(bytes.data(), &seq, sizeof(seq));
          const ssize_t n = ep->am_bcopy(2, &pack_vector, &bytes);
          return n < 0 ? static_cast<status>(n) : status::ok;
        }
        default: {
          const std::vector<uint8_t> header(reinterpret_cast<const uint8_t*>(&seq),
                                            reinterpret_cast<const uint8_t*>(&seq) + 8);
          const size_t part = std::min(length * 100, attr.max_zcopy / 2);
          return start_zcopy(*ep, 3, header, {{body.data(), part}, {body.data(), length / 2}},
                             probes[seq]);
        }
      }
    });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), "send " << seq << ": " << st);
  }
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return got.size() == count; }));
  BOOST_TEST(got.size() == count);
  BOOST_TEST(got.in_sequence());
  BOOST_TEST(!got.misaligned);
  BOOST_TEST(progress_until({sender.get(), receiver.get()},
                            [&] { return ep->flush(nullptr) == status::ok; }));
}

// -- descriptors kept by am handlers ---------------------------------------------------------------

namespace conformance {

/// A message of the descriptor case: its sequence number, then a pattern of its own; every 16th
/// is max_bcopy long (tcp's large-frame path), the others short or mid-sized.
std::vector<uint8_t> numbered_message(uint64_t seq, size_t max_bcopy) {
  const size_t sizes[] = {8, 200, std::min<size_t>(max_bcopy, 1500)};
  const size_t length = seq % 16 == 15 ? max_bcopy : sizes[seq % 3];
  std::vector<uint8_t> bytes = pattern(length, static_cast<uint32_t>(seq));
  std::memcpy(bytes.data(), &seq, sizeof(seq));
  return bytes;
}

/// Sends messages [first, first + count) of numbered_message as bcopy on `ep`, retrying
/// no_resource; false (with the status reported) when one fails.
bool send_numbered(iface_list ifaces, tl::ep& ep, uint64_t first, uint64_t count,
                   size_t max_bcopy) {
  for (uint64_t seq = first; seq < first + count; ++seq) {
    std::vector<uint8_t> bytes = numbered_message(seq, max_bcopy);
    const status st = retry_while_busy(ifaces, [&] {
      const ssize_t n = ep.am_bcopy(5, &pack_vector, &bytes);
      return n < 0 ? static_cast<status>(n) : status::ok;
    });
    if (st != status::ok) {
      BOOST_TEST_MESSAGE("bcopy " << seq << ": " << st);
      return false;
    }
  }
  return true;
}

}  // namespace conformance

// A handler keeps every message lent as a descriptor; the interface lends at most max_am_descs,
// keeps them intact while enough traffic to reuse every receive slot passes, refuses a pointer it
// did not lend (and a second release), and lends the full limit again once they are released.
BOOST_DATA_TEST_CASE(kept_descriptors_stay_intact_and_come_back_on_release, each_transport(),
                     transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  const size_t limit = receiver->attr().max_am_descs;
  BOOST_TEST_REQUIRE(limit > 0u);
  const size_t max_bcopy = std::min<size_t>(sender->attr().max_bcopy, 256 * 1024);
  comm::test::desc_keeper keeper;
  keeper.expected = [&](uint64_t seq) { return numbered_message(seq, max_bcopy); };
  keeper.install(*receiver, 5);
  auto ep = connect(*sender, *receiver);
  const iface_list both = {sender.get(), receiver.get()};
  // Past every receive queue's length (shm 256 cells, self 256 slots), so each slot is reused.
  constexpr uint64_t traffic = 700;

  BOOST_REQUIRE(send_numbered(both, *ep, 0, limit + traffic, max_bcopy));
  BOOST_TEST(progress_until(both, [&] { return keeper.delivered == limit + traffic; }));
  BOOST_TEST(keeper.kept.size() == limit);
  BOOST_TEST(keeper.flagged == limit);
  BOOST_TEST(keeper.kept_intact());

  int stranger = 0;
  receiver->release_am_desc(&stranger);  // refused with a log line
  void* first = keeper.kept.front().data;
  receiver->release_am_desc(first);
  receiver->release_am_desc(first);      // refused: not kept any more
  keeper.kept.erase(keeper.kept.begin());
  keeper.release_all(*receiver);

  // Every descriptor came back: the limit is lent again, and not one more.
  const uint64_t before = keeper.delivered;
  BOOST_REQUIRE(send_numbered(both, *ep, before, limit + traffic, max_bcopy));
  BOOST_TEST(progress_until(both, [&] { return keeper.delivered == before + limit + traffic; }));
  BOOST_TEST(keeper.kept.size() == limit);
  BOOST_TEST(keeper.kept_intact());
  keeper.release_all(*receiver);

  // Released messages are not kept: a handler answering ok leaves the interface its buffers.
  keeper.keep = false;
  const uint64_t flagged_before = keeper.flagged;
  const uint64_t last = keeper.delivered;
  BOOST_REQUIRE(send_numbered(both, *ep, last, 2 * limit, max_bcopy));
  BOOST_TEST(progress_until(both, [&] { return keeper.delivered == last + 2 * limit; }));
  BOOST_TEST(keeper.flagged - flagged_before == 2 * limit);
  BOOST_TEST(keeper.wrong == 0u);
  BOOST_TEST(keeper.out_of_order == 0u);
  BOOST_TEST(!keeper.misaligned);
  BOOST_TEST(progress_until(both, [&] { return ep->flush(nullptr) == status::ok; }));
}

// A zcopy kept as a descriptor stays intact while more traffic passes.
BOOST_DATA_TEST_CASE(kept_zcopy_descriptors_stay_intact, each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  if (!has(*sender, tl::cap_am_zcopy)) return;
  const size_t limit = receiver->attr().max_am_descs;
  const size_t max_bcopy = std::min<size_t>(sender->attr().max_bcopy, 256 * 1024);
  const size_t payload = std::min<size_t>(sender->attr().max_zcopy, 64 * 1024);
  comm::test::desc_keeper keeper;
  keeper.expected = [&](uint64_t seq) {
    if (seq >= limit) return numbered_message(seq, max_bcopy);
    std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&seq),
                               reinterpret_cast<uint8_t*>(&seq) + sizeof(seq));
    return concat(bytes, pattern(payload, static_cast<uint32_t>(seq)));
  };
  keeper.install(*receiver, 5);
  auto ep = connect(*sender, *receiver);
  const iface_list both = {sender.get(), receiver.get()};
  std::vector<std::vector<uint8_t>> bodies;
  std::vector<completion_probe> probes(limit);
  for (uint64_t seq = 0; seq < limit; ++seq) bodies.push_back(pattern(payload, seq));
  for (uint64_t seq = 0; seq < limit; ++seq) {
    const std::vector<uint8_t> header(reinterpret_cast<uint8_t*>(&seq),
                                      reinterpret_cast<uint8_t*>(&seq) + sizeof(seq));
    const status st = retry_while_busy(both, [&] {
      return start_zcopy(*ep, 5, header, {{bodies[seq].data(), payload}}, probes[seq]);
    });
    BOOST_TEST_REQUIRE((st == status::ok || st == status::in_progress), "zcopy " << seq << ": " << st);
  }
  BOOST_REQUIRE(send_numbered(both, *ep, limit, 700, max_bcopy));
  BOOST_TEST(progress_until(both, [&] { return keeper.delivered == limit + 700; }));
  BOOST_TEST(keeper.kept.size() == limit);
  BOOST_TEST(keeper.kept_intact());
  BOOST_TEST(keeper.wrong == 0u);
  BOOST_TEST(keeper.out_of_order == 0u);
  keeper.release_all(*receiver);
  BOOST_TEST(progress_until(both, [&] {
    return std::all_of(probes.begin(), probes.end(), [](const auto& p) { return p.calls == 1; });
  }));
}

// -- NO_RESOURCE and the pending queue -------------------------------------------------------------

namespace conformance {

/// Sends numbered shorts on `ep` until the transport answers no_resource (at most `limit`);
/// returns how many went out.
uint64_t fill_until_no_resource(tl::ep& ep, uint64_t limit = 10'000'000) {
  uint64_t seq = 0;
  while (seq < limit && ep.am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) ++seq;
  return seq;
}

void collect_purged(tl::pending_req* req, void* arg) {
  static_cast<std::vector<tl::pending_req*>*>(arg)->push_back(req);
}

}  // namespace conformance

BOOST_DATA_TEST_CASE(no_resource_parks_requests_and_resumes_them_in_order, each_transport(),
                     transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport, 8);  // a small receive queue fills quickly
  BOOST_REQUIRE(has(*sender, tl::cap_pending));
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  uint64_t seq = fill_until_no_resource(*ep);
  BOOST_TEST_REQUIRE(seq < 10'000'000u, "never answered no_resource");
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::no_resource);

  std::vector<numbered_send> parked(20);
  for (auto& req : parked) {
    req.ep = ep.get();
    req.seq = seq++;
    BOOST_TEST(ep->pending_add(&req) == status::ok);
  }
  // While requests are parked, new sends queue behind them.
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::no_resource);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return got.size() == seq; }));
  BOOST_TEST(got.size() == seq);
  BOOST_TEST(got.in_sequence());
  for (const auto& req : parked) BOOST_TEST(req.calls >= 1);

  // Nothing parked and room again: pending_add says "send now".
  numbered_send extra;
  extra.ep = ep.get();
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return ep->pending_add(&extra) == status::busy; }));
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok);
}

// Seed 004: when send resources are shared (here a receiver's queue, which three endpoints of
// one interface fill together), a parked request is called when its endpoint's turn comes, by
// the transport's policy: every endpoint gets its turn, and each one's requests go in order.
BOOST_DATA_TEST_CASE(endpoints_sharing_a_receivers_queue_each_get_their_turn_in_order,
                     each_transport(), transport) {
  auto sender = open_iface(transport);
  // verbs grants each connection credits out of the receive buffers and refuses a connection it
  // has none left for (REJECTED): 8 buffers admit one; 256 admit seven (32 credits each).
  auto receiver = open_iface(transport, transport == "verbs" ? 256 : 8);
  recorder got;
  got.install(*receiver, 1);
  // Declared before the endpoints, so that they go first (a parked request must outlive them).
  std::vector<std::vector<numbered_send>> parked(3);
  std::vector<std::unique_ptr<tl::ep>> eps;
  for (int k = 0; k < 3; ++k) eps.push_back(connect(*sender, *receiver));
  // Endpoint k sends (k << 32) | i: the i-th message of endpoint k.
  const auto word = [](uint64_t k, uint64_t i) { return k << 32 | i; };
  std::vector<uint64_t> next(eps.size(), 0);
  // Fill through the first endpoint; see which others are refused too (resources shared).
  uint64_t filled = 0;
  for (; filled < 1'000'000; ++filled) {
    const uint64_t w = word(0, next[0]);
    if (eps[0]->am_short(1, &w, sizeof(w), nullptr, 0) != status::ok) break;
    ++next[0];
  }
  BOOST_TEST_REQUIRE(filled < 1'000'000u, "never answered no_resource");
  std::vector<bool> refused(eps.size(), true);
  for (size_t k = 1; k < eps.size(); ++k) {
    const uint64_t w = word(k, next[k]);
    const status st = eps[k]->am_short(1, &w, sizeof(w), nullptr, 0);
    refused[k] = st == status::no_resource;
    if (st == status::ok) ++next[k];
  }
  BOOST_TEST_MESSAGE(transport << ": the receiver's queue is shared by the endpoints: "
                               << (refused[1] && refused[2] ? "yes" : "no"));
  // Park ten requests on every endpoint (taking turns); every endpoint is called back, and each
  // one's messages arrive in its own order.
  std::vector<std::vector<bool>> was_parked(eps.size(), std::vector<bool>(10, false));
  for (auto& list : parked) list.resize(10);
  for (int i = 0; i < 10; ++i) {
    for (size_t k = 0; k < eps.size(); ++k) {
      numbered_send& req = parked[k][i];
      req.ep = eps[k].get();
      req.seq = word(k, next[k]++);
      const status st = eps[k]->pending_add(&req);
      // An endpoint whose own resources are free may say "send now" (busy): then it sends.
      if (st == status::busy) {
        BOOST_TEST(eps[k]->am_short(1, &req.seq, sizeof(req.seq), nullptr, 0) == status::ok);
      } else {
        BOOST_TEST(st == status::ok);
        was_parked[k][i] = true;
      }
    }
  }
  uint64_t total = 0;
  for (uint64_t n : next) total += n;
  const bool all = progress_until({receiver.get(), sender.get()},
                                  [&] { return got.size() == total; }, 20s);
  BOOST_TEST(all);
  progress_rounds({receiver.get(), sender.get()}, 200);
  std::vector<uint64_t> seen(eps.size(), 0);
  for (const auto& m : got.messages) {
    const uint64_t w = comm::test::sequence_of(m.bytes), k = w >> 32, i = w & 0xffffffffu;
    BOOST_REQUIRE(k < eps.size());
    BOOST_TEST(i == seen[k], "endpoint " << k << " message " << i << " in order");
    seen[k] = i + 1;
  }
  for (size_t k = 0; k < eps.size(); ++k) {
    BOOST_TEST_MESSAGE(transport << ": endpoint " << k << " delivered " << seen[k] << " of "
                                 << next[k]);
    BOOST_TEST(seen[k] == next[k], "endpoint " << k << ": " << seen[k] << " of " << next[k]);
    for (int i = 0; i < 10; ++i) {
      if (was_parked[k][i]) BOOST_TEST(parked[k][i].calls >= 1, "endpoint " << k << " called");
    }
  }
  std::vector<tl::pending_req*> purged;
  for (auto& ep : eps) ep->pending_purge(&collect_purged, &purged);
  BOOST_TEST(purged.empty());
}

BOOST_DATA_TEST_CASE(pending_purge_hands_back_every_parked_request_in_order, each_transport(),
                     transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport, 8);
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  const uint64_t sent = fill_until_no_resource(*ep);
  BOOST_TEST_REQUIRE(sent < 10'000'000u, "never answered no_resource");
  std::vector<numbered_send> parked(3);
  for (auto& req : parked) {
    req.ep = ep.get();
    BOOST_TEST(ep->pending_add(&req) == status::ok);
  }
  std::vector<tl::pending_req*> purged;
  ep->pending_purge(&collect_purged, &purged);
  BOOST_REQUIRE(purged.size() == 3u);
  BOOST_TEST((purged[0] == &parked[0] && purged[1] == &parked[1] && purged[2] == &parked[2]));
  // Purged requests are the caller's again: never called back.
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return got.size() == sent; }));
  progress_rounds({receiver.get(), sender.get()}, 100);
  for (const auto& req : parked) BOOST_TEST(req.calls <= 1);
  BOOST_TEST(got.size() == sent);
  purged.clear();
  ep->pending_purge(&collect_purged, &purged);
  BOOST_TEST(purged.empty());
}

// -- the event fd ----------------------------------------------------------------------------------

namespace conformance {

/// Progresses `ifaces` until `iface` arms (nothing left to do); true when it did.
bool settle_and_arm(iface_list ifaces, tl::iface& iface) {
  return progress_until(ifaces, [&] { return iface.event_arm() == status::ok; });
}

bool readable(int fd, int timeout_ms) {
  pollfd pfd{fd, POLLIN, 0};
  return ::poll(&pfd, 1, timeout_ms) == 1;
}

}  // namespace conformance

BOOST_DATA_TEST_CASE(event_fd_sleeps_until_a_message_and_is_busy_while_one_waits,
                     each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  if (!has(*receiver, tl::cap_event_fd)) return;  // limits_agree_with_the_capability_flags
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  // Wire the endpoint up first, so only the message itself remains to wake anybody.
  const uint64_t first = 0;
  BOOST_TEST(retry_while_busy({sender.get(), receiver.get()}, [&] {
               return ep->am_short(1, &first, sizeof(first), nullptr, 0);
             }) == status::ok);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return got.size() == 1; }));
  BOOST_TEST(settle_and_arm({receiver.get(), sender.get()}, *receiver));
  BOOST_TEST(!readable(receiver->event_fd(), 0));

  std::thread other([&] {
    std::this_thread::sleep_for(20ms);
    const uint64_t second = 1;
    // The sender progresses a little (a transport may have bytes left to write), never the
    // receiver: only the event fd may tell it.
    if (ep->am_short(1, &second, sizeof(second), nullptr, 0) == status::ok) {
      progress_rounds({sender.get()}, 1000);
    }
  });
  const bool woken = readable(receiver->event_fd(), 10000);
  other.join();
  BOOST_TEST(woken);
  BOOST_TEST(receiver->event_arm() == status::busy);
  BOOST_TEST(progress_until({receiver.get()}, [&] { return got.size() == 2; }));
  BOOST_TEST(got.in_sequence());
  BOOST_TEST(settle_and_arm({receiver.get(), sender.get()}, *receiver));
  BOOST_TEST(!readable(receiver->event_fd(), 0));
}

BOOST_DATA_TEST_CASE(event_fd_wakes_a_sender_for_its_zcopy_completion, each_transport(),
                     transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport);
  if (!has(*sender, tl::cap_event_fd) || !has(*sender, tl::cap_am_zcopy)) return;
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  const auto data = pattern(std::min<size_t>(sender->attr().max_zcopy, 20000), 5);
  completion_probe warmup, done;
  // A first zcopy wires the endpoint up.
  BOOST_TEST(retry_while_busy({sender.get(), receiver.get()}, [&] {
               return start_zcopy(*ep, 1, {}, {{data.data(), data.size()}}, warmup);
             }) != status::no_resource);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return warmup.calls == 1; }));
  const status st = start_zcopy(*ep, 1, {}, {{data.data(), data.size()}}, done);
  BOOST_REQUIRE((st == status::ok || st == status::in_progress));
  if (st == status::ok) return;  // complete at once: nothing to wake for
  if (comm::test::acknowledged_by_device(transport)) {
    // Without the receiver: the completion is there when arming (busy), or it wakes the sender.
    const status armed = sender->event_arm();
    const bool told = armed == status::busy ||
                      (armed == status::ok && readable(sender->event_fd(), 10000));
    BOOST_TEST(told, "event_arm: " << armed);
    BOOST_TEST(progress_until({sender.get()}, [&] { return done.calls == 1; }));
    BOOST_TEST(progress_until({receiver.get()}, [&] { return got.size() == 2; }));
  } else {
    progress_rounds({sender.get()}, 100);
    BOOST_TEST(settle_and_arm({sender.get()}, *sender));
    BOOST_TEST(progress_until({receiver.get()}, [&] { return got.size() == 2; }));
    BOOST_TEST(readable(sender->event_fd(), 10000));
    BOOST_TEST(progress_until({sender.get()}, [&] { return done.calls == 1; }));
  }
  BOOST_TEST(done.result == status::ok);
}

// -- peer failure ----------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(destroyed_peer_interface_fails_outstanding_operations, each_transport(),
                     transport) {
  auto survivor = open_iface(transport);
  auto peer = open_iface(transport);
  recorder got;
  got.install(*peer, 1);
  failure_log failures;
  failures.install(*survivor);
  std::unique_ptr<tl::ep> ep = connect(*survivor, *peer);
  // A second endpoint to the same peer, which the error handler destroys (the API allows it).
  std::unique_ptr<tl::ep> doomed = connect(*survivor, *peer);
  tl::ep* const kept = ep.get();
  tl::ep* const destroyed = doomed.get();
  failures.destroy = &doomed;
  const uint64_t value = 1;
  for (tl::ep* e : {kept, destroyed}) {
    BOOST_TEST(retry_while_busy({survivor.get(), peer.get()}, [&] {
                 return e->am_short(1, &value, sizeof(value), nullptr, 0);
               }) == status::ok);
  }
  BOOST_TEST(progress_until({peer.get(), survivor.get()}, [&] { return got.size() == 2; }));
  // An operation the peer never finishes: a zcopy it does not take.
  completion_probe done;
  const auto data = pattern(1000, 2);
  status st = status::ok;
  if (has(*survivor, tl::cap_am_zcopy)) {
    st = start_zcopy(*ep, 1, {}, {{data.data(), data.size()}}, done);
    BOOST_TEST((st == status::ok || st == status::in_progress));
  }
  completion_probe flushed;
  const status flush = ep->flush(&flushed);
  peer.reset();
  if (has(*survivor, tl::cap_peer_failure)) {
    BOOST_TEST(progress_until({survivor.get()}, [&] { return failures.entries.size() == 2; }));
    BOOST_REQUIRE(failures.entries.size() == 2u);
    const bool each_once = (failures.entries[0].ep == kept && failures.entries[1].ep == destroyed) ||
                           (failures.entries[0].ep == destroyed && failures.entries[1].ep == kept);
    BOOST_TEST(each_once);
    BOOST_TEST(is_error(failures.entries[0].reason));
    BOOST_TEST(is_error(failures.entries[1].reason));
    BOOST_TEST(!doomed);
    BOOST_TEST(is_error(ep->am_short(1, &value, sizeof(value), nullptr, 0)));
    BOOST_TEST(is_error(ep->flush(nullptr)));
    numbered_send parked;
    parked.ep = ep.get();
    BOOST_TEST(is_error(ep->pending_add(&parked)));
  } else {
    BOOST_TEST_MESSAGE(transport << " has no cap_peer_failure: only outstanding operations checked");
  }
  // Without cap_peer_failure too, nothing outstanding is left hanging.
  if (st == status::in_progress) {
    BOOST_TEST(progress_until({survivor.get()}, [&] { return done.calls == 1; }));
    // The peer's device may have taken it before the peer went.
    if (!comm::test::acknowledged_by_device(transport)) BOOST_TEST(is_error(done.result));
  }
  if (flush == status::in_progress) {
    BOOST_TEST(progress_until({survivor.get()}, [&] { return flushed.calls == 1; }));
  }
  const size_t told = failures.entries.size();
  progress_rounds({survivor.get()}, 1000);
  BOOST_TEST(failures.entries.size() == told);  // each endpoint once
}

BOOST_DATA_TEST_CASE(killed_peer_process_is_reported_once_and_fails_outstanding_operations,
                     each_transport(), transport) {
  if (!reaches_other_processes(transport)) return;
  {
    auto probe = open_iface(transport);
    if (!has(*probe, tl::cap_peer_failure)) {
      BOOST_TEST_MESSAGE("skipped over " << transport << ": no cap_peer_failure");
      return;
    }
  }
  channel to_parent;
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface(transport);
    recorder got;
    got.install(*iface, 1);
    send_addresses(to_parent, *iface);
    // Take the first message (the endpoint is wired), then stop progressing until killed.
    progress_until({iface.get()}, [&] { return got.size() == 1; });
    to_parent.send({1});
    ::pause();
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  auto survivor = open_iface(transport);
  failure_log failures;
  failures.install(*survivor);
  std::vector<uint8_t> device, address, ready;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  auto ep = connect(*survivor, device, address);
  const uint64_t value = 1;
  BOOST_TEST(retry_while_busy({survivor.get()}, [&] {
               return ep->am_short(1, &value, sizeof(value), nullptr, 0);
             }) == status::ok);
  BOOST_TEST(progress_until({survivor.get()}, [&] { return readable(to_parent.fds[0], 0); }));
  BOOST_REQUIRE(to_parent.receive(&ready));
  completion_probe done, flushed;
  const auto data = pattern(1000, 4);
  status st = status::ok;
  if (has(*survivor, tl::cap_am_zcopy)) {
    st = retry_while_busy({survivor.get()}, [&] {
      return start_zcopy(*ep, 1, {}, {{data.data(), data.size()}}, done);
    });
    BOOST_TEST(st == status::in_progress);  // the peer does not progress: it cannot finish
  }
  const status flush = ep->flush(&flushed);
  BOOST_TEST(settle_and_arm({survivor.get()}, *survivor));

  BOOST_REQUIRE(::kill(child, SIGKILL) == 0);
  // A sleeping survivor is woken by the death.
  if (has(*survivor, tl::cap_event_fd)) BOOST_TEST(readable(survivor->event_fd(), 10000));
  BOOST_TEST(progress_until({survivor.get()}, [&] { return !failures.entries.empty(); }));
  BOOST_REQUIRE(failures.entries.size() == 1u);
  BOOST_TEST(failures.entries[0].ep == ep.get());
  BOOST_TEST(failures.entries[0].reason == status::connection_reset);
  if (st == status::in_progress) {
    BOOST_TEST(done.calls == 1);
    BOOST_TEST(done.result == status::connection_reset);
  }
  if (flush == status::in_progress) BOOST_TEST(flushed.calls == 1);
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::connection_reset);
  BOOST_TEST(ep->flush(nullptr) == status::connection_reset);
  progress_rounds({survivor.get()}, 1000);
  BOOST_TEST(failures.entries.size() == 1u);  // once
  BOOST_TEST(wait_child(child) == -1);
}

// -- across processes ------------------------------------------------------------------------------

namespace conformance {

constexpr tl::am_id id_short = 3, id_bcopy = 4, id_zcopy = 5;

/// The three messages each side of the cross-process case sends.
struct three_messages {
  std::vector<uint8_t> short_bytes, bcopy_bytes, zcopy_header, zcopy_data;
  explicit three_messages(const tl::iface_attr& attr)
      : short_bytes(pattern(attr.max_short, 1)),
        bcopy_bytes(pattern(attr.max_bcopy, 2)),
        zcopy_header(pattern(attr.max_hdr, 3)),
        zcopy_data(pattern(attr.max_zcopy, 4)) {}

  /// Sends the three on `ep` and waits (progressing `iface`) until the zcopy completed.
  status send(tl::iface& iface, tl::ep& ep, bool zcopy) {
    status st = retry_while_busy({&iface}, [&] {
      return ep.am_short(id_short, short_bytes.data(), 8, short_bytes.data() + 8,
                         short_bytes.size() - 8);
    });
    if (st != status::ok) return st;
    ssize_t n = 0;
    st = retry_while_busy({&iface}, [&] {
      n = ep.am_bcopy(id_bcopy, &pack_vector, &bcopy_bytes);
      return n < 0 ? static_cast<status>(n) : status::ok;
    });
    if (st != status::ok || n != static_cast<ssize_t>(bcopy_bytes.size())) return status::io_error;
    if (!zcopy) return status::ok;
    completion_probe done;
    st = retry_while_busy({&iface}, [&] {
      return start_zcopy(ep, id_zcopy, zcopy_header, cut(zcopy_data, 3), done);
    });
    if (st != status::ok && st != status::in_progress) return st;
    if (!progress_until({&iface}, [&] { return done.calls == 1; })) return status::timed_out;
    return done.result;
  }

  /// True when `got` holds exactly the three, intact.
  bool arrived_intact(const recorder& got, bool zcopy) const {
    const size_t expected = zcopy ? 3 : 2;
    if (got.size() != expected || got.misaligned) return false;
    return got.messages[0].id == id_short && got.messages[0].bytes == short_bytes &&
           got.messages[1].id == id_bcopy && got.messages[1].bytes == bcopy_bytes &&
           (!zcopy || (got.messages[2].id == id_zcopy &&
                       got.messages[2].bytes == concat(zcopy_header, zcopy_data)));
  }
};

/// Installs `got` on the three ids.
void install_three(recorder& got, tl::iface& iface) {
  for (tl::am_id id : {id_short, id_bcopy, id_zcopy}) got.install(iface, id);
}

}  // namespace conformance

BOOST_DATA_TEST_CASE(every_kind_of_message_both_ways_between_processes_waking_a_sleeper,
                     each_transport(), transport) {
  if (!reaches_other_processes(transport)) return;
  channel to_child, to_parent;
  auto parent_iface = open_iface(transport);
  const bool zcopy = has(*parent_iface, tl::cap_am_zcopy);
  three_messages messages(parent_iface->attr());
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface(transport);
    recorder got;
    install_three(got, *iface);
    send_addresses(to_parent, *iface);
    std::vector<uint8_t> device, address, verdict;
    CHILD_CHECK(receive_addresses(to_child, &device, &address));
    auto ep = connect(*iface, device, address);
    // First the child sends while the parent sleeps on its event fd; then the parent sends.
    std::this_thread::sleep_for(50ms);
    CHILD_CHECK(messages.send(*iface, *ep, zcopy) == status::ok);
    CHILD_CHECK(progress_until({iface.get()}, [&] { return got.size() == (zcopy ? 3u : 2u); }));
    CHILD_CHECK(messages.arrived_intact(got, zcopy));
    CHILD_CHECK(to_child.receive(&verdict));
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  recorder got;
  install_three(got, *parent_iface);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  send_addresses(to_child, *parent_iface);
  int sleeps = 0;
  for (int round = 0; round < 100000 && got.size() < (zcopy ? 3u : 2u); ++round) {
    if (has(*parent_iface, tl::cap_event_fd) && parent_iface->event_arm() == status::ok) {
      if (!readable(parent_iface->event_fd(), 10000)) break;
      ++sleeps;
    }
    parent_iface->progress();
  }
  if (has(*parent_iface, tl::cap_event_fd)) BOOST_TEST(sleeps >= 1);
  BOOST_TEST(messages.arrived_intact(got, zcopy));
  auto ep = connect(*parent_iface, device, address);
  BOOST_TEST(messages.send(*parent_iface, *ep, zcopy) == status::ok);
  BOOST_TEST(progress_until({parent_iface.get()}, [&] { return ep->flush(nullptr) == status::ok; }));
  to_child.send({1});
  BOOST_TEST(wait_child(child) == 0);
}

// -- many peers ------------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(endpoints_to_many_peers_and_from_many_senders, each_transport(), transport) {
  constexpr size_t peers = 12;
  constexpr uint64_t per_peer = 50;
  auto hub = open_iface(transport);
  recorder at_hub;
  at_hub.install(*hub, 1);
  std::vector<std::unique_ptr<tl::iface>> others;
  std::vector<recorder> at_other(peers);
  std::vector<std::unique_ptr<tl::ep>> out, in;
  for (size_t i = 0; i < peers; ++i) {
    others.push_back(open_iface(transport));
    at_other[i].install(*others.back(), 1);
    out.push_back(connect(*hub, *others.back()));
    in.push_back(connect(*others.back(), *hub));
  }
  auto progress_all = [&] {
    hub->progress();
    for (auto& o : others) o->progress();
  };
  for (uint64_t seq = 0; seq < per_peer; ++seq) {
    for (size_t i = 0; i < peers; ++i) {
      const uint64_t words[2] = {seq, i};
      for (tl::ep* ep : {out[i].get(), in[i].get()}) {
        status st = status::no_resource;
        for (int tries = 0; tries < 1'000'000 && st == status::no_resource; ++tries) {
          st = ep->am_short(1, words, sizeof(words), nullptr, 0);
          if (st == status::no_resource) progress_all();
        }
        BOOST_TEST_REQUIRE(st == status::ok, "peer " << i << ", message " << seq << ": " << st);
      }
    }
  }
  BOOST_TEST(progress_until({hub.get()}, [&] {
    progress_all();
    if (at_hub.size() != peers * per_peer) return false;
    for (const recorder& r : at_other) {
      if (r.size() != per_peer) return false;
    }
    return true;
  }));
  // Each peer got its own messages in order; the hub got every sender's in order.
  for (size_t i = 0; i < peers; ++i) {
    BOOST_TEST_CONTEXT("peer " << i) { BOOST_TEST(at_other[i].in_sequence()); }
  }
  std::vector<uint64_t> next(peers, 0);
  bool hub_in_order = at_hub.size() == peers * per_peer;
  for (const auto& m : at_hub.messages) {
    uint64_t words[2] = {~uint64_t{0}, ~uint64_t{0}};
    if (m.bytes.size() == sizeof(words)) std::memcpy(words, m.bytes.data(), sizeof(words));
    hub_in_order = hub_in_order && words[1] < peers && words[0] == next[words[1]]++;
  }
  BOOST_TEST(hub_in_order);
}

// -- RMA with remote keys --------------------------------------------------------------------------

namespace conformance {

/// Runs a put or get and waits for its completion; returns its final status.
status finish_rma(iface_list ifaces, const std::function<status(tl::completion*)>& start) {
  completion_probe done;
  const status st = retry_while_busy(ifaces, [&] { return start(&done); });
  if (st != status::in_progress) return st;
  if (!progress_until(ifaces, [&] { return done.calls == 1; })) return status::timed_out;
  return done.result;
}

}  // namespace conformance

BOOST_DATA_TEST_CASE(put_and_get_inside_a_registered_region, each_transport(), transport) {
  auto a = open_iface(transport);
  auto b = open_iface(transport);
  const bool put = has(*a, tl::cap_put_zcopy), get = has(*a, tl::cap_get_zcopy);
  if (!put && !get) return;  // operations_answer_as_their_flags_claim
  auto ep = connect(*a, *b);
  remote_region region(*a, *b, 100000);
  const iface_list both = {a.get(), b.get()};
  auto get_into = [&](std::vector<tl::iov> entries, int64_t offset) {
    return finish_rma(both, [&](tl::completion* c) {
      return ep->get_zcopy(entries.data(), entries.size(), region.at(offset), region.key, c);
    });
  };
  auto put_from = [&](std::vector<tl::iov> entries, int64_t offset) {
    return finish_rma(both, [&](tl::completion* c) {
      return ep->put_zcopy(entries.data(), entries.size(), region.at(offset), region.key, c);
    });
  };
  if (get) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{100000}}) {
      std::vector<uint8_t> got(size + 1, 0xee);
      const int64_t offset = static_cast<int64_t>(100000 - size);  // ends at the region's end
      BOOST_TEST(get_into({{got.data(), size}}, offset) == status::ok, "get of " << size);
      BOOST_TEST(std::equal(got.begin(), got.begin() + size, region.bytes.begin() + offset));
      BOOST_TEST(got[size] == 0xee);
    }
    // DAT's read: the local iov is filled in order, nothing around it touched.
    std::vector<uint8_t> first(301, 0xaa), second(1000, 0xbb);
    BOOST_TEST(get_into({{first.data(), first.size()}, {nullptr, 0}, {second.data() + 3, 499}},
                        17) == status::ok);
    BOOST_TEST(std::equal(first.begin(), first.end(), region.bytes.begin() + 17));
    BOOST_TEST(std::equal(second.begin() + 3, second.begin() + 502, region.bytes.begin() + 318));
    BOOST_TEST((second[2] == 0xbb && second[502] == 0xbb));
  }
  if (put) {
    const auto x = pattern(33, 40), y = pattern(5000, 41);
    BOOST_TEST(put_from({{x.data(), x.size()}, {y.data() + 1, 4000}}, 5001) == status::ok);
    BOOST_TEST(std::equal(x.begin(), x.end(), region.bytes.begin() + 5001));
    BOOST_TEST(std::equal(y.begin() + 1, y.begin() + 4001, region.bytes.begin() + 5034));
    BOOST_TEST(region.bytes[5000] == pattern(100000, 8)[5000]);
    BOOST_TEST(region.bytes[9034] == pattern(100000, 8)[9034]);
  }
}

BOOST_DATA_TEST_CASE(put_and_get_outside_a_region_or_with_bad_keys_are_errors, each_transport(),
                     transport) {
  auto a = open_iface(transport);
  auto b = open_iface(transport);
  const bool put = has(*a, tl::cap_put_zcopy), get = has(*a, tl::cap_get_zcopy);
  if (!put && !get) return;
  auto ep = connect(*a, *b);
  const iface_list both = {a.get(), b.get()};
  auto region = std::make_unique<remote_region>(*a, *b, 4096);
  const std::vector<uint8_t> original = region->bytes;
  std::vector<uint8_t> local(8192, 0x5a);
  // Every claimed operation must answer the same; the answer of the first is returned.
  auto access = [&](int64_t offset, size_t length, const tl::remote_key& key) {
    const tl::iov entry{local.data(), length};
    const uint64_t address = region->at(offset);
    const status got = get ? finish_rma(both, [&](tl::completion* c) {
      return ep->get_zcopy(&entry, 1, address, key, c);
    }) : status::ok;
    if (!is_error(got)) region->bytes = original;  // a put must find the region as it was
    const status put_st = put ? finish_rma(both, [&](tl::completion* c) {
      return ep->put_zcopy(&entry, 1, address, key, c);
    }) : got;
    if (!is_error(put_st)) region->bytes = original;
    BOOST_TEST((!get || !put || got == put_st), "get " << got << ", put " << put_st);
    return get ? got : put_st;
  };
  // Starting outside the region: a protection error; starting inside and running past its end:
  // a length error (DAT's RDMA read).
  for (const auto& [offset, length] : std::vector<std::pair<int64_t, size_t>>{
           {-1, 1}, {-4096, 8192}, {4096, 1}, {1 << 20, 1}, {4097, 0}}) {
    BOOST_TEST(access(offset, length, region->key) == status::protection_error,
               "offset " << offset << ", length " << length);
  }
  for (const auto& [offset, length] :
       std::vector<std::pair<int64_t, size_t>>{{4095, 2}, {0, 4097}, {1000, 4000}}) {
    BOOST_TEST(access(offset, length, region->key) == status::length_error,
               "offset " << offset << ", length " << length);
  }
  BOOST_TEST(std::all_of(local.begin(), local.end(), [](uint8_t v) { return v == 0x5a; }));
  BOOST_TEST((region->bytes == original));
  BOOST_TEST(access(4095, 1, region->key) == status::ok);
  // An empty key, garbage keys, and a key whose region was deregistered.
  BOOST_TEST(is_error(access(0, 1, tl::remote_key{})));
  tl::remote_key garbage;
  const auto junk = pattern(region->packed.size(), 99);
  BOOST_TEST(a->memory_domain()->rkey_unpack(junk.data(), junk.size(), &garbage) ==
             status::invalid_param);
  BOOST_TEST(a->memory_domain()->rkey_unpack(region->packed.data(), region->packed.size() - 1,
                                             &garbage) == status::invalid_param);
  BOOST_TEST(b->memory_domain()->mem_dereg(region->handle) == status::ok);
  region->handle = nullptr;
  BOOST_TEST(is_error(access(0, 1, region->key)));
  // A key of a third interface, used on the endpoint to b.
  auto c = open_iface(transport);
  remote_region elsewhere(*a, *c, 64);
  const tl::iov entry{local.data(), 1};
  BOOST_TEST(is_error(finish_rma(both, [&](tl::completion* done) {
    return get ? ep->get_zcopy(&entry, 1, elsewhere.at(0), elsewhere.key, done)
               : ep->put_zcopy(&entry, 1, elsewhere.at(0), elsewhere.key, done);
  })));
}

// -- leaks -----------------------------------------------------------------------------------------

// -- hostile input --------------------------------------------------------------------------------

// Raw, malformed bytes on the wire to an interface, as its peer would send them (each transport's
// injector in wire_injectors.hpp): the interface refuses each input (closes the connection it came
// on, or skips and counts it where no connection carries it), keeps serving its good peer both
// ways, lets go of what it held for the hostile peer, calls no error handler of anybody else, and
// a new peer works afterwards; no descriptor is left over.
BOOST_DATA_TEST_CASE(malformed_input_fails_only_the_peer_that_sent_it, each_transport(),
                     transport) {
  {
    // A first connection before counting descriptors: rdmacm opens a device's context at its
    // first use and keeps it for the process (librdmacm does the same).
    auto a = open_iface(transport);
    auto b = open_iface(transport);
    auto ab = connect(*a, *b);
    progress_rounds({a.get(), b.get()}, 100);
  }
  const size_t fds_before = comm::test::open_fds();
  {
    auto target = open_iface(transport);
    auto sender = open_iface(transport);
    recorder at_target, at_sender;
    at_target.install(*target, 1);
    at_sender.install(*sender, 1);
    failure_log target_failures, sender_failures;
    target_failures.install(*target);
    sender_failures.install(*sender);
    auto good = connect(*sender, *target);
    auto back = connect(*target, *sender);
    uint64_t sent = 0, answered = 0;
    const auto exchange = [&]() -> bool {
      const uint64_t ping = sent++, pong = answered++;
      return retry_while_busy({target.get(), sender.get()}, [&] {
               return good->am_short(1, &ping, sizeof(ping), nullptr, 0);
             }) == status::ok &&
             retry_while_busy({target.get(), sender.get()}, [&] {
               return back->am_short(1, &pong, sizeof(pong), nullptr, 0);
             }) == status::ok &&
             progress_until({target.get(), sender.get()}, [&] {
               return at_target.size() == sent && at_sender.size() == answered;
             });
    };
    BOOST_REQUIRE(exchange());
    std::string why;
    tl::component& component = *comm::test::find_component(transport);
    auto injector = comm::test::make_injector(component, *target, &why);
    if (injector == nullptr) {
      BOOST_TEST(transport == "self", why);  // every transport with a wire has an injector
      BOOST_TEST_MESSAGE("no hostile input over " << transport << ": " << why);
      return;
    }
    const std::vector<std::string> inputs = injector->inputs();
    for (size_t i = 0; i < inputs.size(); ++i) {
      BOOST_TEST_CONTEXT(inputs[i]) {
        injector->inject(i);
        const iface_list both = {target.get(), sender.get()};
        BOOST_TEST(progress_until(both, [&] { return injector->refused(); }),
                   "the target did not refuse the input");
        BOOST_TEST(progress_until(both, [&] { return injector->held() == 0; }),
                   "the target still holds a connection of the hostile peer");
        BOOST_TEST(exchange(), "the good peer is no longer served");
        BOOST_TEST(at_target.in_sequence(), "the target delivered something of the hostile peer");
      }
    }
    injector.reset();
    // A new peer is served too, and nobody else was told of a failure.
    auto newcomer = open_iface(transport);
    auto fresh = connect(*newcomer, *target);
    const uint64_t hello = sent++;
    BOOST_TEST(retry_while_busy({target.get(), newcomer.get()}, [&] {
                 return fresh->am_short(1, &hello, sizeof(hello), nullptr, 0);
               }) == status::ok);
    BOOST_TEST(
        progress_until({target.get(), newcomer.get()}, [&] { return at_target.size() == sent; }));
    BOOST_TEST(at_target.in_sequence());
    BOOST_TEST(target_failures.entries.empty());
    BOOST_TEST(sender_failures.entries.empty());
    fresh.reset();
    good.reset();
    back.reset();
  }
  BOOST_TEST(comm::test::open_fds() == fds_before);
}

BOOST_DATA_TEST_CASE(closing_everything_releases_every_descriptor, each_transport(), transport) {
  const size_t before = comm::test::open_fds();
  for (int round = 0; round < 2; ++round) {
    auto a = open_iface(transport);
    auto b = open_iface(transport);
    recorder got;
    got.install(*b, 1);
    got.install(*a, 1);
    auto ab = connect(*a, *b);
    auto ba = connect(*b, *a);
    auto aa = connect(*a, *a);
    const uint64_t value = 1;
    for (tl::ep* ep : {ab.get(), ba.get(), aa.get()}) {
      BOOST_TEST(retry_while_busy({a.get(), b.get()}, [&] {
                   return ep->am_short(1, &value, sizeof(value), nullptr, 0);
                 }) == status::ok);
    }
    completion_probe done;
    if (has(*a, tl::cap_am_zcopy)) {
      const status st = start_zcopy(*ab, 1, {}, {{&value, sizeof(value)}}, done);
      BOOST_TEST((st == status::ok || st == status::in_progress));
      BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return done.calls == 1; }));
    }
    BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return got.size() >= 3; }));
    BOOST_TEST(comm::test::open_fds() > before);
    // Endpoints first, then their interfaces: the order the protocol layer keeps.
    ab.reset();
    ba.reset();
    aa.reset();
  }
  BOOST_TEST(comm::test::open_fds() == before);
}
