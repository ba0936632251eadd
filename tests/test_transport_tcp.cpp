// What is particular to the tcp transport: devices and addresses (IPv4 and IPv6, COMM_TCP_AF_PRIO,
// the device address decoder's checks, link-local reachability), one connection shared both ways
// (simultaneous connects, several endpoints, bye and reconnect, piggybacked acknowledgements), the
// receiver's window, backpressure with a slow receiver (partial zcopy writes, a full kernel buffer,
// bounded memory), liveness timeouts, authentication with a shared key (right, wrong and missing
// keys, forged peers on either side), garbage from raw sockets, and descriptor leaks with raw
// connections. Sizes, ordering, zcopy completion, blocking progress and killed peers are checked
// for every transport in test_conformance.cpp.
// Every wait is bounded in iterations and time; nothing asserts on timing beyond generous bounds.
#define BOOST_TEST_MODULE transport_tcp
#include "process_harness.hpp"
#include "test_util.hpp"
#include "tl_helpers.hpp"
#include <boost/test/unit_test.hpp>

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include "base/rkey.hpp"
#include "tcp/tcp.capnp.h"
#include "tcp/tcp_md.hpp"
#include "tcp/tcp_wire.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
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


namespace {

// -- helpers --------------------------------------------------------------------------------------

tl::component& tcp_component() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == "tcp") return *c;
  }
  throw std::runtime_error("no tcp component");
}

std::unique_ptr<tl::iface> open_iface(const std::string& device = "lo", size_t fifo_size = 0,
                                      const std::string& auth_key = "") {
  tl::iface_params params;
  params.device = device;
  params.fifo_size = fifo_size;
  params.auth_key = auth_key;
  params.opts["COMM_TCP_RMA"] = "1";  // put and get are tested here
  std::unique_ptr<tl::iface> iface;
  const status st = tcp_component().open(params, iface);
  if (st != status::ok) throw std::runtime_error(std::string("open: ") + to_string(st));
  return iface;
}

/// Calls progress on `ifaces` until `done()` holds, at most `limit` long and `max_rounds` rounds.
bool progress_until(std::initializer_list<tl::iface*> ifaces, const std::function<bool()>& done,
                    std::chrono::milliseconds limit = 10s, uint64_t max_rounds = 50'000'000) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (uint64_t round = 0; round < max_rounds; ++round) {
    for (tl::iface* iface : ifaces) iface->progress();
    if (done()) return true;
    if ((round & 255) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}

/// Progresses `ifaces` for `duration` (bounded rounds).
void progress_for(std::initializer_list<tl::iface*> ifaces, std::chrono::milliseconds duration) {
  progress_until(ifaces, [] { return false; }, duration);
}

std::vector<uint8_t> pattern(size_t length, uint8_t seed) {
  std::vector<uint8_t> bytes(length);
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return bytes;
}

std::vector<uint8_t> concat(std::initializer_list<const std::vector<uint8_t>*> parts) {
  std::vector<uint8_t> all;
  for (const auto* part : parts) all.insert(all.end(), part->begin(), part->end());
  return all;
}

struct bcopy_source {
  const std::vector<uint8_t>* bytes;
  static size_t pack(void* dest, void* arg) {
    const auto* source = static_cast<bcopy_source*>(arg)->bytes;
    if (!source->empty()) std::memcpy(dest, source->data(), source->size());
    return source->size();
  }
};


/// Resident set size of this process in KiB.
size_t rss_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  size_t kib = 0;
  while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %zu kB", &kib) == 1) break;
  }
  if (f != nullptr) std::fclose(f);
  return kib;
}

/// The number after `label` in the interface's info(), or -1.
long info_number(const tl::iface& iface, const std::string& label) {
  const std::string text = iface.info();
  const size_t at = text.find(label);
  if (at == std::string::npos) return -1;
  return std::strtol(text.c_str() + at + label.size(), nullptr, 10);
}

// -- raw sockets ----------------------------------------------------------------------------------

/// The port in a tcp interface address (its first two bytes, host order).
uint16_t port_of(const tl::iface& iface) {
  const auto address = iface.iface_address();
  uint16_t port = 0;
  std::memcpy(&port, address.data(), sizeof(port));
  return port;
}

/// A blocking client socket connected to 127.0.0.1:port, or -1.
int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// True once the peer closed `fd` (recv returns 0 or an error), checked without blocking.
bool peer_closed(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  if (::poll(&pfd, 1, 0) != 1) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

/// The interface id in a tcp interface address (after the port).
uint64_t id_of(const tl::iface& iface) {
  const auto address = iface.iface_address();
  uint64_t id = 0;
  std::memcpy(&id, address.data() + 2, sizeof(id));
  return id;
}

template <class Writer>
std::vector<uint8_t> bytes_of(const Writer& writer) {
  const auto* p = static_cast<const uint8_t*>(writer.bytes());
  return std::vector<uint8_t>(p, p + writer.size());
}

/// A valid TcpHello for the interface `iface`, from a made-up interface `src_id`.
std::vector<uint8_t> hello_for(const tl::iface& iface, uint64_t src_id = 1) {
  wire::header_writer<wire::schema::TcpHello> writer;
  writer.fields().setMagic(0x434f4d4d54435000ull);
  writer.fields().setVersion(tl::tcp::hello_version);
  writer.fields().setSrcPort(1);
  writer.fields().setSrcAddress(htonl(INADDR_LOOPBACK));
  writer.fields().setSrcIfaceId(src_id);
  writer.fields().setDstIfaceId(id_of(iface));
  writer.fields().setWindow(64);
  writer.fields().setNonce0(0x1234);
  writer.fields().setNonce1(0x5678);
  return bytes_of(writer);
}

/// A TcpFrame header announcing `length` bytes for am id `id` (a message), acknowledging
/// `delivered` messages of the other direction.
std::vector<uint8_t> frame_header(unsigned id, uint32_t length, uint64_t delivered = 0,
                                  wire::schema::TcpFrameKind kind =
                                      wire::schema::TcpFrameKind::MESSAGE) {
  wire::header_writer<wire::schema::TcpFrame> writer;
  writer.fields().setAmId(static_cast<uint8_t>(id));
  writer.fields().setLength(length);
  writer.fields().setKind(kind);
  writer.fields().setDelivered(delivered);
  return bytes_of(writer);
}

/// A complete message frame: header, `payload` and padding to 8 bytes.
std::vector<uint8_t> message_frame(unsigned id, const std::vector<uint8_t>& payload) {
  auto bytes = frame_header(id, static_cast<uint32_t>(payload.size()));
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  bytes.resize((bytes.size() + 7) & ~size_t{7}, 0);
  return bytes;
}

/// An rma frame of `kind` with the record `rma` and `data` (padded to 8 bytes).
std::vector<uint8_t> rma_frame(tl::tcp::frame_kind kind, const tl::tcp::parsed_rma& rma,
                               const std::vector<uint8_t>& data = {}) {
  tl::tcp::record_writer writer;
  std::vector<uint8_t> bytes(tl::tcp::frame_header_size + tl::tcp::rma_header_size);
  writer.rma(kind, 0, rma, data.size(), bytes.data());
  bytes.insert(bytes.end(), data.begin(), data.end());
  bytes.resize((bytes.size() + 7) & ~size_t{7}, 0);
  return bytes;
}

bool write_all(int fd, const std::vector<uint8_t>& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// -- fork helpers ---------------------------------------------------------------------------------


// -- the three kinds of message -------------------------------------------------------------------

constexpr tl::am_id id_short = 3, id_bcopy = 4, id_zcopy = 5;
const std::vector<uint8_t> short_header = pattern(8, 1);
const std::vector<uint8_t> short_payload = pattern(41, 2);
const std::vector<uint8_t> bcopy_bytes = pattern(6001, 3);
const std::vector<uint8_t> zcopy_header = pattern(24, 4);
const std::vector<uint8_t> zcopy_part1 = pattern(70000, 5);
const std::vector<uint8_t> zcopy_part2 = pattern(13, 6);

/// Sends one short, one bcopy and one zcopy message on `ep`, then progresses `ifaces` until the
/// zcopy completed (the receiver acknowledged it). Returns its result, or timed_out.
status send_three(std::initializer_list<tl::iface*> ifaces, tl::ep& ep) {
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
  if (!progress_until(ifaces, [&] { return done.calls == 1; })) return status::timed_out;
  return done.result;
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

/// Restores (or unsets) an environment variable when it goes out of scope.
struct scoped_env {
  std::string name;
  bool had = false;
  std::string old;
  scoped_env(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) {
      had = true;
      old = v;
    }
    if (value != nullptr) {
      ::setenv(n, value, 1);
    } else {
      ::unsetenv(n);
    }
  }
  ~scoped_env() {
    if (had) {
      ::setenv(name.c_str(), old.c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
};

}  // namespace

// -- component, attributes, addresses -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(component_devices_and_attributes) {
  scoped_env unset("COMM_TCP_DEVICE", nullptr);
  tl::component& tcp = tcp_component();
  const auto devices = tcp.devices();
  BOOST_REQUIRE(!devices.empty());
  BOOST_TEST((std::find(devices.begin(), devices.end(), "lo") != devices.end()));
  if (devices.size() > 1) BOOST_TEST(devices.front() != "lo");  // a real device first
  BOOST_TEST(tcp.unavailable_reason().empty());
  {
    scoped_env only_lo("COMM_TCP_DEVICE", "lo");
    BOOST_TEST(tcp.devices() == std::vector<std::string>{"lo"});
  }
  {
    scoped_env none("COMM_TCP_DEVICE", "no-such-device0");
    BOOST_TEST(tcp.devices().empty());
    BOOST_TEST(!tcp.unavailable_reason().empty());
  }

  auto iface = open_iface("lo");
  const tl::iface_attr& attr = iface->attr();
  BOOST_TEST(iface->transport_name() == "tcp");
  const uint64_t wanted = tl::cap_am_short | tl::cap_am_bcopy | tl::cap_am_zcopy |
                          tl::cap_put_zcopy | tl::cap_get_zcopy | tl::cap_pending |
                          tl::cap_event_fd | tl::cap_connect_to_iface | tl::cap_peer_failure;
  BOOST_TEST((attr.caps & wanted) == wanted);
  BOOST_TEST(attr.max_get_zcopy >= 1024u * 1024);
  BOOST_TEST(attr.max_put_zcopy == attr.max_get_zcopy);
  BOOST_TEST(attr.max_outstanding_reads > 0u);
  BOOST_TEST(iface->memory_domain() != nullptr);
  BOOST_TEST(attr.max_short >= 4096u);
  BOOST_TEST(attr.max_short <= attr.max_bcopy);
  BOOST_TEST(attr.max_bcopy >= 8192u);
  BOOST_TEST(attr.max_zcopy >= 256u * 1024);
  BOOST_TEST(attr.max_iov == 16u);
  BOOST_TEST(iface->event_fd() >= 0);
  BOOST_TEST(port_of(*iface) != 0);
  const std::string info = iface->info();
  BOOST_TEST(info.find("tcp: device lo address 127.0.0.1 port " +
                       std::to_string(port_of(*iface))) != std::string::npos);
  BOOST_TEST(info.find("max_bcopy") != std::string::npos);
  BOOST_TEST(info.find("connections 0 open") != std::string::npos);

  std::unique_ptr<tl::iface> bad;
  tl::iface_params params;
  params.device = "no-such-device0";
  BOOST_TEST(tcp.open(params, bad) == status::no_elem);
  params.device = "lo";
  params.fifo_size = 1;  // a window of one frame could never return credits
  BOOST_TEST(tcp.open(params, bad) == status::invalid_param);
  params.fifo_size = 0;
  params.device.clear();  // the first device
  BOOST_TEST(tcp.open(params, bad) == status::ok);
  BOOST_TEST(bad->info().find("device " + devices.front()) != std::string::npos);
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
  auto no_port = address;
  no_port[0] = no_port[1] = 0;
  BOOST_TEST(a->create_ep(device, no_port, ep) == status::invalid_addr);
  auto no_window = address;
  std::fill(no_window.end() - 4, no_window.end(), 0);
  BOOST_TEST(a->create_ep(device, no_window, ep) == status::invalid_addr);

  // A loopback address only reaches the same host (boot) and network namespace.
  auto other_host = device;
  other_host[offsetof(tl::tcp::device_addr, boot_id)] ^= 0xff;  // another boot id
  BOOST_TEST(!a->is_reachable(other_host, address));
  BOOST_TEST(a->create_ep(other_host, address, ep) == status::unreachable);
  auto other_namespace = device;
  other_namespace.back() ^= 0xff;
  BOOST_TEST(!a->is_reachable(other_namespace, address));
  BOOST_TEST(!ep);
}

BOOST_AUTO_TEST_CASE(connect_to_a_closed_port_is_unreachable) {
  auto a = open_iface();
  failure_log failures;
  failures.install(*a);
  std::vector<uint8_t> device, address;
  {
    auto gone = open_iface();
    device = gone->device_address();
    address = gone->iface_address();
  }
  std::unique_ptr<tl::ep> ep;
  const status st = a->create_ep(device, address, ep);
  if (st == status::ok) {
    // The refusal came asynchronously: it is reported from progress.
    BOOST_TEST(progress_until({a.get()}, [&] { return !failures.entries.empty(); }));
    BOOST_REQUIRE(failures.entries.size() == 1u);
    BOOST_TEST(failures.entries[0].ep == ep.get());
    BOOST_TEST(failures.entries[0].reason == status::unreachable);
    BOOST_TEST(ep->am_short(1, nullptr, 0, nullptr, 0) == status::unreachable);
  } else {
    BOOST_TEST(st == status::unreachable);
  }
}

BOOST_AUTO_TEST_CASE(hello_for_another_interface_is_refused) {
  // An address whose port is right but whose interface id is not (the port was reused): the
  // listener closes the connection as malformed, and the endpoint, seeing another interface's
  // challenge, reports the one it wanted unreachable.
  auto a = open_iface();
  auto b = open_iface();
  failure_log failures;
  failures.install(*a);
  auto address = b->iface_address();
  address[5] ^= 0x5a;  // in the interface id
  auto ep = connect(*a, b->device_address(), address);
  BOOST_TEST(ep->am_short(1, nullptr, 0, nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return !failures.entries.empty(); }));
  BOOST_REQUIRE(failures.entries.size() == 1u);
  BOOST_TEST(failures.entries[0].reason == status::unreachable);
  BOOST_TEST(progress_until({a.get(), b.get()},
                            [&] { return info_number(*b, "malformed connections closed ") == 1; }));
}

// -- IPv6 -----------------------------------------------------------------------------------------

namespace {

/// An interface on `device` that takes its IPv6 address (COMM_TCP_AF_PRIO=inet6).
std::unique_ptr<tl::iface> open_iface6(const std::string& device = "lo") {
  tl::iface_params params;
  params.device = device;
  params.opts["COMM_TCP_AF_PRIO"] = "inet6";
  std::unique_ptr<tl::iface> iface;
  const status st = tcp_component().open(params, iface);
  if (st != status::ok) throw std::runtime_error(std::string("open: ") + to_string(st));
  return iface;
}

constexpr size_t family_at = offsetof(tl::tcp::device_addr, family);
constexpr size_t reserved_at = offsetof(tl::tcp::device_addr, reserved);
constexpr size_t ip_at = offsetof(tl::tcp::device_addr, ip);

/// `device` (a packed device address) with family byte `family` and address bytes `ip` (16).
std::vector<uint8_t> with_ip(std::vector<uint8_t> device, uint8_t family,
                             std::initializer_list<uint8_t> ip) {
  device[family_at] = family;
  std::fill(device.begin() + ip_at, device.begin() + ip_at + 16, 0);
  std::copy(ip.begin(), ip.end(), device.begin() + ip_at);
  return device;
}

}  // namespace

BOOST_AUTO_TEST_CASE(af_prio_chooses_the_family_of_every_device) {
  scoped_env unset("COMM_TCP_DEVICE", nullptr);
  tl::component& tcp = tcp_component();
  tl::options v6;
  v6["COMM_TCP_AF_PRIO"] = "inet6";
  const auto devices = tcp.devices(v6);
  BOOST_TEST((std::find(devices.begin(), devices.end(), "lo") != devices.end()));  // ::1
  if (devices.size() > 1) BOOST_TEST(devices.front() != "lo");  // a real device first
  for (const char* refused : {"inet,ipx", "inet,inet", "", "inet6,"}) {
    tl::options bad;
    bad["COMM_TCP_AF_PRIO"] = refused;
    std::string why;
    BOOST_TEST(tcp.check_options(bad, &why) == status::invalid_param);
    BOOST_TEST(why.find("COMM_TCP_AF_PRIO=" + std::string(refused) + " refused") == 0u, why);
    std::unique_ptr<tl::iface> none;
    tl::iface_params params;
    params.opts = bad;
    BOOST_TEST(tcp.open(params, none) == status::invalid_param);
  }
  tl::options both;
  both["COMM_TCP_AF_PRIO"] = "inet6,inet";
  BOOST_TEST(tcp.check_options(both, nullptr) == status::ok);

  auto iface = open_iface6();
  BOOST_TEST(iface->device_address().at(family_at) == tl::tcp::device_family_ipv6);
  BOOST_TEST(iface->info().find("tcp: device lo address ::1 port " +
                                std::to_string(port_of(*iface))) != std::string::npos);
  BOOST_TEST(open_iface()->device_address().at(family_at) == tl::tcp::device_family_ipv4);
}

BOOST_AUTO_TEST_CASE(ipv6_loopback_interfaces_carry_every_kind_of_message_both_ways) {
  auto a = open_iface6();
  auto b = open_iface6();
  three_recorders at_a(*a), at_b(*b);
  auto ab = connect(*a, *b);
  BOOST_TEST(send_three({a.get(), b.get()}, *ab) == status::ok);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return at_b.all_arrived(); }));
  BOOST_TEST(at_b.contents_match());
  auto ba = connect(*b, *a);
  BOOST_TEST(send_three({a.get(), b.get()}, *ba) == status::ok);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return at_a.all_arrived(); }));
  BOOST_TEST(at_a.contents_match());
  BOOST_TEST(info_number(*a, "connections ") == 1);  // one connection, both ways
  BOOST_TEST(a->info().find("[::1]:") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(interfaces_reach_peers_of_their_own_family_only) {
  auto v4 = open_iface();
  auto v6 = open_iface6();
  std::unique_ptr<tl::ep> ep;
  BOOST_TEST(!v4->is_reachable(v6->device_address(), v6->iface_address()));
  BOOST_TEST(!v6->is_reachable(v4->device_address(), v4->iface_address()));
  BOOST_TEST(v4->create_ep(v6->device_address(), v6->iface_address(), ep) == status::unreachable);
  BOOST_TEST(v6->create_ep(v4->device_address(), v4->iface_address(), ep) == status::unreachable);
  BOOST_TEST(!ep);
  // The loopback rule holds for ::1 as for 127.0.0.1: same boot, same network namespace.
  auto other_host = v6->device_address();
  other_host[offsetof(tl::tcp::device_addr, boot_id)] ^= 0xff;
  BOOST_TEST(!v6->is_reachable(other_host, v6->iface_address()));
}

BOOST_AUTO_TEST_CASE(device_addresses_are_decoded_with_bounds_checks) {
  auto v6 = open_iface6();
  auto v4 = open_iface();
  const auto good = v6->device_address();
  const auto address = v6->iface_address();
  BOOST_REQUIRE(v6->is_reachable(good, address));
  auto reserved = good;
  reserved[reserved_at + 1] = 1;
  auto shorter = good;
  shorter.pop_back();
  auto longer = good;
  longer.push_back(0);
  const std::vector<std::vector<uint8_t>> refused = {
      with_ip(good, 5, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),       // unknown family
      reserved,                                                                // reserved bytes
      with_ip(good, 6, {}),                                                    // ::
      with_ip(good, 6, {0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),  // multicast
      with_ip(good, 6, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}),  // v4-mapped
      with_ip(good, 4, {127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),    // bytes past IPv4
      with_ip(good, 4, {}),                                                    // 0.0.0.0
      with_ip(good, 4, {224, 0, 0, 1}),                                        // multicast
      with_ip(good, 4, {255, 255, 255, 255}),                                  // broadcast
      shorter,
      longer,
  };
  std::unique_ptr<tl::ep> ep;
  for (const auto& device : refused) {
    BOOST_TEST(!v6->is_reachable(device, address));
    BOOST_TEST(!v4->is_reachable(device, v4->iface_address()));
    BOOST_TEST(v6->create_ep(device, address, ep) == status::invalid_addr);
  }
  BOOST_TEST(!ep);
  // Well-formed addresses of this host: 127.0.0.1 for the IPv4 interface, ::1 for the IPv6 one.
  BOOST_TEST(v4->is_reachable(with_ip(good, 4, {127, 0, 0, 1}), v4->iface_address()));
  BOOST_TEST(v6->is_reachable(with_ip(v4->device_address(), 6,
                                      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),
                              address));
}

BOOST_AUTO_TEST_CASE(a_link_local_peer_is_reached_through_our_own_device_only) {
  // A link-local address travels without its scope: the connecting side goes through its own
  // device, which a loopback interface cannot do. (Connections over link-local addresses are
  // made in test_netns, between two network namespaces.)
  auto loopback = open_iface6();
  const auto link_local =
      with_ip(loopback->device_address(), 6, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7});
  BOOST_TEST(!loopback->is_reachable(link_local, loopback->iface_address()));
  tl::options v6;
  v6["COMM_TCP_AF_PRIO"] = "inet6";
  const auto devices = tcp_component().devices(v6);
  const auto real = std::find_if(devices.begin(), devices.end(),
                                 [](const std::string& name) { return name != "lo"; });
  if (real == devices.end()) {
    BOOST_TEST_MESSAGE("no interface but lo has IPv6 here: only the loopback side is checked");
    return;
  }
  auto through_device = open_iface6(*real);
  BOOST_TEST(through_device->is_reachable(link_local, loopback->iface_address()));
}

// -- delivery -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(short_bcopy_zcopy_in_one_process) {
  auto sender = open_iface();
  auto receiver = open_iface();
  three_recorders got(*receiver);
  auto ep = connect(*sender, *receiver);
  BOOST_TEST(send_three({sender.get(), receiver.get()}, *ep) == status::ok);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return got.all_arrived(); }));
  BOOST_TEST(got.contents_match());
  BOOST_TEST(ep->flush(nullptr) == status::ok);
  BOOST_TEST(info_number(*receiver, "connections ") == 1);
}

BOOST_AUTO_TEST_CASE(window_of_the_receiver_bounds_frames_in_flight) {
  auto sender = open_iface();
  auto receiver = open_iface("lo", 8);  // fifo_size: 8 frames undelivered per connection
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  uint64_t seq = 0;
  while (seq < 1000 && ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) ++seq;
  BOOST_TEST(seq == 8u);
  numbered_send parked;
  parked.ep = ep.get();
  parked.seq = seq++;
  BOOST_TEST(ep->pending_add(&parked) == status::ok);
  progress_for({sender.get()}, 20ms);
  BOOST_TEST(parked.calls == 0);  // no credits came back
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.messages.size() == seq && parked.calls == 1; }));
  // A long stream through the small window arrives complete and in order.
  const uint64_t first = seq;
  BOOST_TEST(progress_until({sender.get(), receiver.get()}, [&] {
    while (seq < first + 5000 && ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) {
      ++seq;
    }
    return seq == first + 5000 && got.messages.size() == seq;
  }));
  bool in_order = got.messages.size() == seq;
  for (uint64_t i = 0; in_order && i < seq; ++i) {
    uint64_t value = ~uint64_t{0};
    std::memcpy(&value, got.messages[i].bytes.data(), sizeof(value));
    in_order = value == i;
  }
  BOOST_TEST(in_order);
}

// -- one connection both ways --------------------------------------------------------------------

namespace {

/// True when the first 8 bytes of the messages `r` recorded from `from` on are 0, 1, 2, ...
bool in_sequence(const recorder& r, size_t from = 0, uint64_t first = 0) {
  for (size_t i = from; i < r.messages.size(); ++i) {
    uint64_t value = ~uint64_t{0};
    if (r.messages[i].bytes.size() >= 8) std::memcpy(&value, r.messages[i].bytes.data(), 8);
    if (value != first + (i - from)) return false;
  }
  return true;
}

/// Sends `count` shorts numbered `first`.. on `ep` (progressing `ifaces` while refused).
bool send_numbered(std::initializer_list<tl::iface*> ifaces, tl::ep& ep, uint64_t first,
                   uint64_t count, tl::am_id id = 1) {
  uint64_t seq = first;
  return progress_until(ifaces, [&] {
    while (seq < first + count) {
      const status st = ep.am_short(id, &seq, sizeof(seq), nullptr, 0);
      if (st == status::no_resource) return false;
      if (st != status::ok) return true;  // the caller's checks fail
      ++seq;
    }
    return true;
  }) && seq == first + count;
}

/// Both directions' connection counts of `a` and `b` are `n`.
bool connections_are(const tl::iface& a, const tl::iface& b, long n) {
  return info_number(a, "connections ") == n && info_number(b, "connections ") == n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_connection_carries_both_directions_and_acks_ride_along) {
  auto a = open_iface();
  auto b = open_iface();
  recorder at_a, at_b;
  at_a.install(*a, 1);
  at_b.install(*b, 1);
  auto ab = connect(*a, *b);
  BOOST_TEST(send_numbered({a.get(), b.get()}, *ab, 0, 1));
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return at_b.messages.size() == 1; }));
  // b's endpoint back to a goes on the connection b accepted: no second socket.
  auto ba = connect(*b, *a);
  BOOST_TEST(connections_are(*a, *b, 1));
  BOOST_TEST(info_number(*b, "to peers), ") == 0);  // b connected nothing itself
  BOOST_TEST(info_number(*a, "to peers), ") == 1);

  // A ping-pong: every message acknowledges the one before it, no ack ever goes alone.
  constexpr uint64_t rounds = 2000;
  bool ok = true;
  for (uint64_t i = 0; ok && i < rounds; ++i) {
    ok = ba->am_short(1, &i, sizeof(i), nullptr, 0) == status::ok &&
         progress_until({a.get(), b.get()}, [&] { return at_a.messages.size() == i + 1; });
    const uint64_t next = i + 1;
    ok = ok && ab->am_short(1, &next, sizeof(next), nullptr, 0) == status::ok &&
         progress_until({a.get(), b.get()}, [&] { return at_b.messages.size() == i + 2; });
  }
  BOOST_TEST(ok);
  BOOST_TEST(in_sequence(at_a));
  BOOST_TEST(in_sequence(at_b));
  BOOST_TEST(info_number(*a, "acknowledgements sent alone ") == 0);
  BOOST_TEST(info_number(*b, "acknowledgements sent alone ") == 0);
  BOOST_TEST(connections_are(*a, *b, 1));

  // Zcopy both ways completes (each waits for the other side's delivered count).
  three_recorders three_a(*a), three_b(*b);
  BOOST_TEST(send_three({a.get(), b.get()}, *ab) == status::ok);
  BOOST_TEST(send_three({a.get(), b.get()}, *ba) == status::ok);
  BOOST_TEST(progress_until({a.get(), b.get()},
                            [&] { return three_a.all_arrived() && three_b.all_arrived(); }));
  BOOST_TEST(three_a.contents_match());
  BOOST_TEST(three_b.contents_match());
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] {
    return ab->flush(nullptr) == status::ok && ba->flush(nullptr) == status::ok;
  }));
  BOOST_TEST(connections_are(*a, *b, 1));
}

BOOST_AUTO_TEST_CASE(simultaneous_connects_keep_one_connection_and_every_message) {
  // Both interfaces connect before either progresses, with messages (and a zcopy) queued at once.
  // Exactly one side answers "duplicate"; nothing is lost or reordered. The interface ids are
  // random, so the rounds see both orders.
  int smaller_first = 0;
  for (int round = 0; round < 16; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      auto a = open_iface();
      auto b = open_iface();
      smaller_first += id_of(*a) < id_of(*b) ? 1 : 0;
      recorder at_a, at_b;
      at_a.install(*a, 1);
      at_b.install(*b, 1);
      three_recorders three_a(*a), three_b(*b);
      auto ab = connect(*a, *b);
      auto ba = connect(*b, *a);
      constexpr uint64_t count = 200;
      BOOST_TEST(send_numbered({}, *ab, 0, count / 2));
      BOOST_TEST(send_numbered({}, *ba, 0, count / 2));
      BOOST_TEST(send_three({a.get(), b.get()}, *ab) == status::ok);
      BOOST_TEST(send_numbered({a.get(), b.get()}, *ab, count / 2, count / 2));
      BOOST_TEST(send_three({a.get(), b.get()}, *ba) == status::ok);
      BOOST_TEST(send_numbered({a.get(), b.get()}, *ba, count / 2, count / 2));
      BOOST_TEST(progress_until({a.get(), b.get()}, [&] {
        return at_a.messages.size() == count && at_b.messages.size() == count &&
               three_a.all_arrived() && three_b.all_arrived();
      }));
      BOOST_TEST(in_sequence(at_a));
      BOOST_TEST(in_sequence(at_b));
      BOOST_TEST(three_a.contents_match());
      BOOST_TEST(three_b.contents_match());
      // The losing socket may still be open on one side until its EOF arrives.
      BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return connections_are(*a, *b, 1); }));
      // Exactly one side took the other's socket over (the other answered "duplicate", or had
      // its own connection welcomed first and saw the abandoned socket close).
      BOOST_TEST(info_number(*a, "sockets taken over ") + info_number(*b, "sockets taken over ") ==
                 1);
      BOOST_TEST(info_number(*a, "answered duplicate ") + info_number(*b, "answered duplicate ") <=
                 1);
      BOOST_TEST(info_number(*a, "malformed connections closed ") == 0);
      BOOST_TEST(info_number(*b, "malformed connections closed ") == 0);
    }
  }
  BOOST_TEST_MESSAGE("a had the smaller id in " << smaller_first << " of 16 rounds");
}

BOOST_AUTO_TEST_CASE(endpoints_share_the_connection_until_both_sides_said_bye) {
  auto a = open_iface();
  auto b = open_iface();
  recorder at_a, at_b1, at_b2;
  at_a.install(*a, 1);
  at_b1.install(*b, 1);
  at_b2.install(*b, 2);
  auto ab1 = connect(*a, *b);
  auto ab2 = connect(*a, *b);
  BOOST_TEST(info_number(*a, "connections ") == 1);
  // Two endpoints interleaved: each one's messages stay in order.
  for (uint64_t i = 0; i < 100; ++i) {
    BOOST_TEST(ab1->am_short(1, &i, sizeof(i), nullptr, 0) == status::ok);
    BOOST_TEST(ab2->am_short(2, &i, sizeof(i), nullptr, 0) == status::ok);
  }
  ab1.reset();  // with its messages still waiting for the handshake
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] {
    return at_b1.messages.size() == 100 && at_b2.messages.size() == 100;
  }));
  BOOST_TEST(in_sequence(at_b1));
  BOOST_TEST(in_sequence(at_b2));
  auto ba = connect(*b, *a);
  BOOST_TEST(connections_are(*a, *b, 1));

  // a's last endpoint goes: a says bye, but b still sends on the connection.
  ab2.reset();
  BOOST_TEST(send_numbered({a.get(), b.get()}, *ba, 0, 50));
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return at_a.messages.size() == 50; }));
  BOOST_TEST(a->info().find("bye sent") != std::string::npos);
  BOOST_TEST(b->info().find("bye received") != std::string::npos);
  BOOST_TEST(connections_are(*a, *b, 1));

  // A new endpoint from a opens a new connection; b's endpoint keeps the old one.
  auto ab3 = connect(*a, *b);
  BOOST_TEST(send_numbered({a.get(), b.get()}, *ab3, 100, 50));
  BOOST_TEST(send_numbered({a.get(), b.get()}, *ba, 50, 50));
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] {
    return at_b1.messages.size() == 150 && at_a.messages.size() == 100;
  }));
  BOOST_TEST(in_sequence(at_b1));
  BOOST_TEST(in_sequence(at_a));
  BOOST_TEST(connections_are(*a, *b, 2));
  // Back and forth on the new one too: b's new endpoint uses it.
  ba.reset();  // b says bye on the old connection: it closes on both sides
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return connections_are(*a, *b, 1); }));
  auto ba2 = connect(*b, *a);
  BOOST_TEST(send_numbered({a.get(), b.get()}, *ba2, 100, 10));
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return at_a.messages.size() == 110; }));
  BOOST_TEST(in_sequence(at_a));
  BOOST_TEST(connections_are(*a, *b, 1));
  ab3.reset();
  ba2.reset();
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] {
    return connections_are(*a, *b, 0) && a->info().find(" 0 closing") != std::string::npos &&
           b->info().find(" 0 closing") != std::string::npos;
  }));
  BOOST_TEST(info_number(*a, "malformed connections closed ") == 0);
  BOOST_TEST(info_number(*b, "malformed connections closed ") == 0);
}

BOOST_AUTO_TEST_CASE(simultaneous_connect_across_processes) {
  // Parent and child learn each other's address, then both connect at once and ping-pong.
  channel to_child, to_parent;
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface();
    recorder got;
    got.install(*iface, 1);
    send_addresses(to_parent, *iface);
    std::vector<uint8_t> device, address, go;
    CHILD_CHECK(receive_addresses(to_child, &device, &address));
    CHILD_CHECK(to_child.receive(&go));
    auto ep = connect(*iface, device, address);
    for (uint64_t i = 0; i < 500; ++i) {
      CHILD_CHECK(progress_until({iface.get()}, [&] { return got.messages.size() == i + 1; }));
      CHILD_CHECK(ep->am_short(1, &i, sizeof(i), nullptr, 0) == status::ok);
    }
    CHILD_CHECK(in_sequence(got));
    CHILD_CHECK(progress_until({iface.get()}, [&] {
      return ep->flush(nullptr) == status::ok && info_number(*iface, "connections ") == 1;
    }));
    to_parent.send_word(static_cast<uint64_t>(info_number(*iface, "sockets taken over ")));
    std::vector<uint8_t> verdict;
    CHILD_CHECK(to_child.receive(&verdict));
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  auto iface = open_iface();
  recorder got;
  got.install(*iface, 1);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  send_addresses(to_child, *iface);
  to_child.send({1});  // go: both connect now
  auto ep = connect(*iface, device, address);
  bool ok = true;
  for (uint64_t i = 0; ok && i < 500; ++i) {
    ok = ep->am_short(1, &i, sizeof(i), nullptr, 0) == status::ok &&
         progress_until({iface.get()}, [&] { return got.messages.size() == i + 1; });
  }
  BOOST_TEST(ok);
  BOOST_TEST(in_sequence(got));
  uint64_t child_took_over = 0;
  BOOST_TEST(to_parent.receive_word(&child_took_over));
  BOOST_TEST(progress_until({iface.get()}, [&] { return info_number(*iface, "connections ") == 1; }));
  // Neither progressed before both connected: exactly one took the other's socket over.
  BOOST_TEST(child_took_over + info_number(*iface, "sockets taken over ") == 1u);
  to_child.send({1});
  BOOST_TEST(wait_child(child) == 0);
}

// -- backpressure ---------------------------------------------------------------------------------

namespace {

/// Streams `count` zcopy messages of `chunk` bytes (an 8-byte sequence number as header, a slice
/// of `source` as payload) through `ep`, parking on the pending queue whenever it is refused.
struct zcopy_stream : tl::pending_req {
  tl::ep* ep = nullptr;
  const std::vector<uint8_t>* source = nullptr;
  size_t chunk = 0;
  uint64_t count = 0;
  uint64_t next = 0;
  std::vector<uint64_t> seqs;
  std::vector<completion_probe> probes;
  int parked = 0;
  status error = status::ok;

  zcopy_stream(tl::ep& e, const std::vector<uint8_t>& src, size_t c, uint64_t n)
      : ep(&e), source(&src), chunk(c), count(n), seqs(n), probes(n) {
    func = [](tl::pending_req* self) { return static_cast<zcopy_stream*>(self)->pump(); };
  }

  /// Offset into `source` of message `seq`'s payload.
  size_t offset(uint64_t seq) const { return (seq * 4099) % (source->size() - chunk); }

  /// Sends until refused; returns ok when all went, no_resource when refused, or the error.
  status pump() {
    while (next < count) {
      seqs[next] = next;
      const tl::iov entry{source->data() + offset(next), chunk};
      const status st = ep->am_zcopy(1, &seqs[next], sizeof(uint64_t), &entry, 1, &probes[next]);
      if (st == status::no_resource) return st;
      if (st == status::ok) probes[next].calls = 1;
      if (st != status::ok && st != status::in_progress) {
        error = st;
        return status::ok;  // dropped: the test reports it
      }
      ++next;
    }
    return status::ok;
  }

  /// Starts the stream: sends what goes and parks the rest.
  void start() {
    for (int attempt = 0; attempt < 1000; ++attempt) {
      if (pump() != status::no_resource) return;
      const status st = ep->pending_add(this);
      if (st == status::ok) {
        ++parked;
        return;
      }
      if (st != status::busy) {
        error = st;
        return;
      }
    }
  }

  bool all_completed() const {
    for (const auto& p : probes) {
      if (p.calls != 1) return false;
    }
    return next == count;
  }
};

}  // namespace

/// Checks the messages of a zcopy_stream as they arrive, keeping nothing.
struct stream_checker {
  const zcopy_stream* stream = nullptr;
  uint64_t received = 0;
  uint64_t bad = 0;
  bool misaligned = false;

  static status handler(void* arg, void* data, size_t length, unsigned flags) {
    auto* self = static_cast<stream_checker*>(arg);
    const zcopy_stream& s = *self->stream;
    const auto* bytes = static_cast<const uint8_t*>(data);
    uint64_t seq = ~uint64_t{0};
    if (length == 8 + s.chunk) std::memcpy(&seq, bytes, 8);
    if (reinterpret_cast<uintptr_t>(data) % 8 != 0) self->misaligned = true;
    const bool intact = seq == self->received &&
                        std::memcmp(bytes + 8, s.source->data() + s.offset(seq), s.chunk) == 0;
    if (!intact && self->bad++ == 0) BOOST_ERROR("message " << self->received << " is wrong");
    ++self->received;
    return status::ok;
  }
};

BOOST_AUTO_TEST_CASE(slow_receiver_bounds_sender_memory_and_everything_arrives_in_order) {
  auto sender = open_iface();
  auto receiver = open_iface();
  const auto source = pattern(8 << 20, 21);
  constexpr size_t chunk = 256 * 1024;
  constexpr uint64_t count = 256;  // 64 MiB in all, far beyond any socket buffer
  auto ep = connect(*sender, *receiver);
  zcopy_stream stream(*ep, source, chunk, count);
  stream_checker got;
  got.stream = &stream;
  receiver->set_am_handler(1, &stream_checker::handler, &got);
  // A first message: the connection is open (its handshake over) before the receiver stops.
  recorder opened;
  opened.install(*receiver, 2);
  BOOST_TEST(ep->am_short(2, nullptr, 0, nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({sender.get(), receiver.get()},
                            [&] { return opened.messages.size() == 1; }));
  const size_t rss_before = rss_kib();

  stream.start();
  BOOST_TEST(stream.error == status::ok);
  // Only the sender progresses: the kernel buffers fill, then everything waits.
  progress_for({sender.get()}, 300ms);
  BOOST_TEST(info_number(*sender, "writes the kernel did not take in full ") > 0);
  BOOST_TEST(stream.next < count);
  BOOST_TEST(stream.parked == 1);
  BOOST_TEST(!stream.all_completed());  // a partially written zcopy waits for the receiver
  BOOST_TEST(ep->am_short(1, nullptr, 0, nullptr, 0) == status::no_resource);
  BOOST_TEST(ep->flush(nullptr) == status::in_progress);
  const size_t rss_blocked = rss_kib();
  BOOST_TEST_MESSAGE("accepted " << stream.next << " of " << count << " zcopy messages while "
                                 << "the receiver slept; RSS grew by "
                                 << (rss_blocked - rss_before) << " KiB");
  // Memory bound: the send buffer and the kernel's socket buffers, nothing per message.
  BOOST_TEST(rss_blocked < rss_before + 16 * 1024);

  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.received == count && stream.all_completed(); },
                            60s));
  BOOST_TEST(stream.error == status::ok);
  BOOST_TEST(got.received == count);
  BOOST_TEST(got.bad == 0u);
  BOOST_TEST(!got.misaligned);
  // The receiver's side: its receive buffer and one large-frame buffer.
  BOOST_TEST(rss_kib() < rss_before + 16 * 1024);
  BOOST_TEST(ep->flush(nullptr) == status::ok);
  BOOST_TEST(info_number(*sender, "writes the kernel did not take in full ") > 0);
  BOOST_TEST(info_number(*sender, "sends refused for lack of resources ") > 0);
}

// -- a slow peer is not a dead one ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(liveness_knobs_come_from_the_environment_within_their_limits) {
  const auto knobs = [](const char* peer, const char* stall) {
    scoped_env p("COMM_TCP_PEER_TIMEOUT", peer);
    scoped_env s("COMM_TCP_STALL_TIMEOUT", stall);
    auto iface = open_iface();
    return std::make_pair(info_number(*iface, "COMM_TCP_PEER_TIMEOUT="),
                          info_number(*iface, "COMM_TCP_STALL_TIMEOUT="));
  };
  BOOST_TEST((knobs(nullptr, nullptr) == std::make_pair(11L, 0L)));  // the defaults
  BOOST_TEST((knobs("4", "30") == std::make_pair(4L, 30L)));
  BOOST_TEST((knobs("3600", "86400") == std::make_pair(3600L, 86400L)));
  // Malformed or out of range: refused, the interface does not open.
  const auto refused = [](const char* name, const char* value) {
    scoped_env bad(name, value);
    tl::iface_params params;
    params.device = "lo";
    std::unique_ptr<tl::iface> iface;
    return tcp_component().open(params, iface) == status::invalid_param && !iface;
  };
  for (const char* value : {"3", "3601", "ten", "", "-1"})
    BOOST_TEST(refused("COMM_TCP_PEER_TIMEOUT", value), "COMM_TCP_PEER_TIMEOUT=" << value);
  for (const char* value : {"86401", "-1", "5s"})
    BOOST_TEST(refused("COMM_TCP_STALL_TIMEOUT", value), "COMM_TCP_STALL_TIMEOUT=" << value);
}

BOOST_AUTO_TEST_CASE(a_receiver_that_stops_reading_past_the_peer_timeout_keeps_its_connection) {
  // The receiver does not progress for 1.5x COMM_TCP_PEER_TIMEOUT while the sender's bytes wait
  // behind its zero window; its kernel answers the window probes, so nothing fails, and once it
  // reads again every message arrives in order.
  scoped_env peer_timeout("COMM_TCP_PEER_TIMEOUT", "4");
  auto sender = open_iface();
  auto receiver = open_iface();
  failure_log failures;
  failures.install(*sender);
  const auto source = pattern(8 << 20, 22);
  constexpr uint64_t count = 256;
  auto ep = connect(*sender, *receiver);
  zcopy_stream stream(*ep, source, 256 * 1024, count);
  stream_checker got;
  got.stream = &stream;
  receiver->set_am_handler(1, &stream_checker::handler, &got);
  recorder opened;  // a first message: the connection is open before the receiver stops
  opened.install(*receiver, 2);
  BOOST_TEST(ep->am_short(2, nullptr, 0, nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({sender.get(), receiver.get()},
                            [&] { return opened.messages.size() == 1; }));
  stream.start();
  const long checks_before = info_number(*sender, "liveness checks made ");
  progress_for({sender.get()}, 6s);
  BOOST_TEST(failures.entries.empty());
  BOOST_TEST(stream.next < count);  // it waited
  BOOST_TEST(info_number(*sender, "writes the kernel did not take in full ") > 0);
  BOOST_TEST(info_number(*sender, "host silent ") == 0);
  const long checks = info_number(*sender, "liveness checks made ") - checks_before;
  BOOST_TEST_MESSAGE("liveness checks during the stall: " << checks);
  BOOST_TEST(checks >= 10);  // every 0.4 s, the timer running throughout
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.received == count && stream.all_completed(); },
                            60s));
  BOOST_TEST(got.bad == 0u);
  BOOST_TEST(failures.entries.empty());
}

BOOST_AUTO_TEST_CASE(stall_timeout_waits_for_a_live_receiver_and_gives_up_on_a_stalled_one) {
  // COMM_TCP_STALL_TIMEOUT=1: a receiver that delivers a few messages (far below half its window,
  // so it owes no acknowledgement) is asked by a heartbeat and answers; one that stops
  // progressing with messages undelivered fails the sender's endpoint with endpoint_timeout.
  scoped_env stall_timeout("COMM_TCP_STALL_TIMEOUT", "1");
  auto sender = open_iface();
  auto receiver = open_iface();
  failure_log failures;
  failures.install(*sender);
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  for (uint64_t seq = 0; seq < 5; ++seq) {
    BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok);
  }
  progress_for({sender.get(), receiver.get()}, 3s);
  BOOST_TEST(got.messages.size() == 5u);
  BOOST_TEST(failures.entries.empty());
  BOOST_TEST(info_number(*sender, "heartbeats sent ") >= 1);

  for (uint64_t seq = 5; seq < 10; ++seq) {
    BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok);
  }
  const auto stalled_at = std::chrono::steady_clock::now();
  BOOST_TEST(progress_until({sender.get()}, [&] { return !failures.entries.empty(); }, 10s));
  const auto took = std::chrono::steady_clock::now() - stalled_at;
  BOOST_TEST_MESSAGE("stalled receiver given up after "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                     << " ms");
  BOOST_TEST(took >= 750ms);  // not before the stall timeout (less a check period)
  BOOST_TEST(took < 5s);
  BOOST_REQUIRE(failures.entries.size() == 1u);
  BOOST_TEST(failures.entries[0].reason == status::endpoint_timeout);
  BOOST_TEST(info_number(*sender, "process stalled ") == 1);
  BOOST_TEST(ep->am_short(1, nullptr, 0, nullptr, 0) == status::endpoint_timeout);
}

BOOST_AUTO_TEST_CASE(both_directions_stream_at_once_in_order_with_bounded_memory) {
  // Zcopy streams both ways on the one connection, small windows, each side parking when refused;
  // first only one side progresses (the other sleeps), then both.
  auto a = open_iface("lo", 16);
  auto b = open_iface("lo", 16);
  const auto source = pattern(8 << 20, 23);
  constexpr size_t chunk = 128 * 1024;
  constexpr uint64_t count = 256;  // 32 MiB each way
  auto ab = connect(*a, *b);
  auto ba = connect(*b, *a);
  zcopy_stream a_to_b(*ab, source, chunk, count), b_to_a(*ba, source, chunk, count);
  stream_checker at_a, at_b;
  at_a.stream = &b_to_a;
  at_b.stream = &a_to_b;
  a->set_am_handler(1, &stream_checker::handler, &at_a);
  b->set_am_handler(1, &stream_checker::handler, &at_b);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return connections_are(*a, *b, 1); }));
  const size_t rss_before = rss_kib();

  a_to_b.start();
  b_to_a.start();
  progress_for({a.get()}, 200ms);
  BOOST_TEST(a_to_b.next < count);
  BOOST_TEST(rss_kib() < rss_before + 16 * 1024);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] {
    return at_a.received == count && at_b.received == count && a_to_b.all_completed() &&
           b_to_a.all_completed();
  }, 60s));
  BOOST_TEST(a_to_b.error == status::ok);
  BOOST_TEST(b_to_a.error == status::ok);
  BOOST_TEST(at_a.bad == 0u);
  BOOST_TEST(at_b.bad == 0u);
  BOOST_TEST(!at_a.misaligned);
  BOOST_TEST(!at_b.misaligned);
  BOOST_TEST(rss_kib() < rss_before + 16 * 1024);
  BOOST_TEST(connections_are(*a, *b, 1));
}

BOOST_AUTO_TEST_CASE(full_send_buffer_parks_short_sends_and_resumes_in_order) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);

  // Fill the kernel and the send buffer with shorts while the receiver sleeps.
  uint64_t seq = 0;
  while (seq < 10'000'000 && ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) ++seq;
  BOOST_TEST(seq < 10'000'000u);
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::no_resource);
  std::vector<numbered_send> parked(50);
  for (auto& req : parked) {
    req.ep = ep.get();
    req.seq = seq++;
    BOOST_TEST(ep->pending_add(&req) == status::ok);
  }
  // While requests are parked, new sends queue behind them, however much room there is.
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::no_resource);
  for (int i = 0; i < 100; ++i) sender->progress();

  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.messages.size() == seq; }, 30s));
  bool in_order = got.messages.size() == seq;
  for (uint64_t i = 0; in_order && i < seq; ++i) {
    uint64_t value = ~uint64_t{0};
    std::memcpy(&value, got.messages[i].bytes.data(), 8);
    in_order = value == i;
  }
  BOOST_TEST(in_order);
  numbered_send extra;
  extra.ep = ep.get();
  BOOST_TEST(ep->pending_add(&extra) == status::busy);

  // pending_purge hands back parked requests.
  std::vector<tl::pending_req*> purged;
  ep->pending_purge(
      [](tl::pending_req* req, void* arg) {
        static_cast<std::vector<tl::pending_req*>*>(arg)->push_back(req);
      },
      &purged);
  BOOST_TEST(purged.empty());
}

BOOST_AUTO_TEST_CASE(the_largest_shorts_survive_a_full_socket_intact_and_in_order) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  const size_t payload = sender->attr().max_short - 8;
  std::vector<uint8_t> buffer(payload);
  auto fill = [&](uint64_t seq) {
    for (size_t i = 0; i < payload; ++i) buffer[i] = static_cast<uint8_t>(seq * 31 + i);
  };
  // The connection is open first (until then messages wait in the send buffer).
  uint64_t seq = 0;
  fill(seq);
  BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), buffer.data(), payload) == status::ok);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return got.size() == 1; }));
  // While the receiver sleeps the kernel takes less and less: one write goes in part, the rest
  // waits in the send buffer (the caller refills its buffer at once) until it has no room.
  for (++seq; seq < 100'000; ++seq) {
    fill(seq);
    if (ep->am_short(1, &seq, sizeof(seq), buffer.data(), payload) != status::ok) break;
    std::fill(buffer.begin(), buffer.end(), 0xee);
  }
  BOOST_TEST(seq < 100'000u);
  BOOST_TEST(info_number(*sender, "writes the kernel did not take in full ") > 0);
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.messages.size() == seq; }, 30s));
  bool intact = got.messages.size() == seq;
  for (uint64_t i = 0; intact && i < seq; ++i) {
    const auto& bytes = got.messages[i].bytes;
    uint64_t value = ~uint64_t{0};
    std::memcpy(&value, bytes.data(), sizeof(value));
    fill(i);
    intact = value == i && bytes.size() == 8 + payload &&
             std::equal(buffer.begin(), buffer.end(), bytes.begin() + 8);
  }
  BOOST_TEST(intact);
}

BOOST_AUTO_TEST_CASE(destroyed_endpoint_still_delivers_its_buffered_bytes) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  uint64_t seq = 0;
  while (seq < 10'000'000 && ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok) ++seq;
  ep.reset();  // with bytes still in its send buffer (and the handshake not even done)
  BOOST_TEST(info_number(*sender, "connections ") == 1);
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return got.messages.size() == seq; }, 30s));
  bool in_order = got.messages.size() == seq;
  for (uint64_t i = 0; in_order && i < seq; ++i) {
    uint64_t value = ~uint64_t{0};
    std::memcpy(&value, got.messages[i].bytes.data(), 8);
    in_order = value == i;
  }
  BOOST_TEST(in_order);
  // Both sides said bye: the connection is closed gracefully on both.
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] {
    return info_number(*sender, "connections ") == 0 &&
           info_number(*receiver, "connections ") == 0 &&
           sender->info().find(" 0 closing") != std::string::npos &&
           receiver->info().find(" 0 closing") != std::string::npos;
  }));
  BOOST_TEST(info_number(*receiver, "malformed connections closed ") == 0);
}

BOOST_AUTO_TEST_CASE(destroyed_endpoint_finishes_a_half_written_zcopy) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  BOOST_TEST(progress_until({sender.get(), receiver.get()},
                            [&] { return info_number(*receiver, "connections ") == 1; }));
  // Zcopy messages until one is only partly written (the receiver sleeps).
  auto source = std::make_unique<std::vector<uint8_t>>(pattern(1 << 20, 41));
  std::vector<completion_probe> probes(64);
  size_t issued = 0;
  for (; issued < probes.size(); ++issued) {
    const tl::iov entry{source->data(), source->size()};
    const status st = ep->am_zcopy(1, &issued, sizeof(issued), &entry, 1, &probes[issued]);
    if (st == status::no_resource) break;
    BOOST_REQUIRE(st == status::in_progress);
  }
  BOOST_REQUIRE(issued < probes.size());
  BOOST_TEST(ep->flush(nullptr) == status::in_progress);
  ep.reset();          // its completions are dropped...
  const auto expected = *source;
  source.reset();      // ...so the caller may free the memory at once
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] {
    return got.messages.size() == issued &&
           sender->info().find("0 closing") != std::string::npos;
  }));
  BOOST_REQUIRE(got.messages.size() == issued);
  bool intact = true;
  for (size_t i = 0; i < issued; ++i) {
    const auto& bytes = got.messages[i].bytes;
    size_t seq = ~size_t{0};
    if (bytes.size() == 8 + expected.size()) std::memcpy(&seq, bytes.data(), 8);
    intact = intact && seq == i &&
             std::memcmp(bytes.data() + 8, expected.data(), expected.size()) == 0;
  }
  BOOST_TEST(intact);
  for (const auto& p : probes) BOOST_TEST(p.calls == 0);
  BOOST_TEST(info_number(*receiver, "malformed connections closed ") == 0);
  BOOST_TEST(progress_until({receiver.get()},
                            [&] { return info_number(*receiver, "connections ") == 0; }));
}

// -- authentication -------------------------------------------------------------------------------

namespace {

/// Messages of id 1 whose first byte is `tag`.
size_t count_tagged(const recorder& r, uint8_t tag) {
  return static_cast<size_t>(std::count_if(r.messages.begin(), r.messages.end(), [&](const auto& m) {
    return !m.bytes.empty() && m.bytes[0] == tag;
  }));
}

/// Queues `count` shorts of 8 bytes starting with byte `tag` on `ep` (before any progress: they
/// wait for the handshake).
bool queue_tagged(tl::ep& ep, uint8_t tag, int count) {
  for (int i = 0; i < count; ++i) {
    uint8_t bytes[8] = {tag, static_cast<uint8_t>(i)};
    if (ep.am_short(1, bytes, sizeof(bytes), nullptr, 0) != status::ok) return false;
  }
  return true;
}

/// A listening raw socket on 127.0.0.1 (nonblocking), or -1.
int raw_listen(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd, 4) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(address.sin_port);
  return fd;
}

/// Reads exactly `length` bytes from the nonblocking `fd`, progressing `iface` meanwhile.
bool read_exactly(tl::iface& iface, int fd, size_t length, std::vector<uint8_t>* out) {
  out->clear();
  return progress_until({&iface}, [&] {
    uint8_t buffer[256];
    const ssize_t got =
        ::recv(fd, buffer, std::min(sizeof(buffer), length - out->size()), MSG_DONTWAIT);
    if (got > 0) out->insert(out->end(), buffer, buffer + got);
    return out->size() == length;
  });
}

}  // namespace

BOOST_AUTO_TEST_CASE(interfaces_with_the_same_key_talk_both_ways) {
  auto a = open_iface("lo", 0, "cluster secret");
  auto b = open_iface("lo", 0, "cluster secret");
  BOOST_TEST(a->info().find("authentication on") != std::string::npos);
  three_recorders at_a(*a), at_b(*b);
  auto ab = connect(*a, *b);
  auto ba = connect(*b, *a);  // at once: the simultaneous connect is authenticated too
  BOOST_TEST(send_three({a.get(), b.get()}, *ab) == status::ok);
  BOOST_TEST(send_three({a.get(), b.get()}, *ba) == status::ok);
  BOOST_TEST(progress_until({a.get(), b.get()},
                            [&] { return at_a.all_arrived() && at_b.all_arrived(); }));
  BOOST_TEST(at_a.contents_match());
  BOOST_TEST(at_b.contents_match());
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return connections_are(*a, *b, 1); }));
  // Each side checked the other's proof at least once (the connector the acceptor's, and back).
  BOOST_TEST(info_number(*a, "proofs of the key checked ") >= 1);
  BOOST_TEST(info_number(*b, "proofs of the key checked ") >= 1);
  BOOST_TEST(info_number(*a, "authentication refused ") == 0);
  BOOST_TEST(info_number(*b, "authentication refused ") == 0);
}

BOOST_AUTO_TEST_CASE(wrong_or_missing_key_is_refused_while_a_good_client_is_served) {
  auto server = open_iface("lo", 0, "cluster secret");
  auto good = open_iface("lo", 0, "cluster secret");
  auto wrong = open_iface("lo", 0, "a guess");
  auto none = open_iface();
  recorder at_server;
  at_server.install(*server, 1);
  failure_log good_failures, wrong_failures, none_failures;
  good_failures.install(*good);
  wrong_failures.install(*wrong);
  none_failures.install(*none);
  auto from_good = connect(*good, *server);
  auto from_wrong = connect(*wrong, *server);
  auto from_none = connect(*none, *server);
  // Messages queued before the handshake: only the good client's may ever be delivered.
  BOOST_TEST(queue_tagged(*from_good, 'g', 20));
  BOOST_TEST(queue_tagged(*from_wrong, 'w', 20));
  BOOST_TEST(queue_tagged(*from_none, 'n', 20));
  // And raw clients: one sends frames instead of a proof, one a proof of random bytes.
  const uint16_t port = port_of(*server);
  const int frames_instead = raw_connect(port);
  const int random_proof = raw_connect(port);
  BOOST_REQUIRE(frames_instead >= 0);
  BOOST_REQUIRE(random_proof >= 0);
  auto hello = hello_for(*server, 77);
  auto with_frames = hello;
  for (int i = 0; i < 4; ++i) {
    const auto frame = message_frame(1, std::vector<uint8_t>(8, 'r'));
    with_frames.insert(with_frames.end(), frame.begin(), frame.end());
  }
  BOOST_TEST(write_all(frames_instead, with_frames));
  wire::header_writer<wire::schema::TcpProof> proof;
  proof.fields().setMagic(0x434f4d4d54435050ull);
  proof.fields().setProof0(0x0123456789abcdefull);
  auto with_proof = hello_for(*server, 78);
  const auto proof_bytes = bytes_of(proof);
  with_proof.insert(with_proof.end(), proof_bytes.begin(), proof_bytes.end());
  const auto more = message_frame(1, std::vector<uint8_t>(8, 'r'));
  with_proof.insert(with_proof.end(), more.begin(), more.end());
  BOOST_TEST(write_all(random_proof, with_proof));

  std::initializer_list<tl::iface*> all = {server.get(), good.get(), wrong.get(), none.get()};
  BOOST_TEST(progress_until(all, [&] {
    return !wrong_failures.entries.empty() && !none_failures.entries.empty() &&
           count_tagged(at_server, 'g') == 20 &&
           info_number(*server, "authentication refused ") == 4 && peer_closed(frames_instead) &&
           peer_closed(random_proof);
  }));
  BOOST_REQUIRE(wrong_failures.entries.size() == 1u);
  BOOST_REQUIRE(none_failures.entries.size() == 1u);
  BOOST_TEST(wrong_failures.entries[0].reason == status::rejected);
  BOOST_TEST(none_failures.entries[0].reason == status::rejected);
  BOOST_TEST(from_wrong->am_short(1, nullptr, 0, nullptr, 0) == status::rejected);
  BOOST_TEST(good_failures.entries.empty());
  // Nothing but the good client's messages was delivered.
  BOOST_TEST(at_server.messages.size() == 20u);
  BOOST_TEST(count_tagged(at_server, 'g') == 20u);
  // The server keeps serving the good client, both ways.
  recorder at_good;
  at_good.install(*good, 1);
  auto back = connect(*server, *good);
  BOOST_TEST(queue_tagged(*from_good, 'g', 5));
  BOOST_TEST(queue_tagged(*back, 'b', 5));
  BOOST_TEST(progress_until(all, [&] {
    return count_tagged(at_server, 'g') == 25 && count_tagged(at_good, 'b') == 5;
  }));
  BOOST_TEST(at_server.messages.size() == 25u);
  BOOST_TEST(info_number(*server, "connections ") == 1);
  ::close(frames_instead);
  ::close(random_proof);
}

BOOST_AUTO_TEST_CASE(keyed_connector_refuses_an_acceptor_that_cannot_prove_the_key) {
  // An acceptor without a key: the connector refuses it before sending anything.
  auto keyed = open_iface("lo", 0, "cluster secret");
  auto open_one = open_iface();
  recorder at_open;
  at_open.install(*open_one, 1);
  failure_log failures;
  failures.install(*keyed);
  auto ep = connect(*keyed, *open_one);
  BOOST_TEST(queue_tagged(*ep, 'k', 5));
  BOOST_TEST(progress_until({keyed.get(), open_one.get()},
                            [&] { return !failures.entries.empty(); }));
  BOOST_REQUIRE(failures.entries.size() == 1u);
  BOOST_TEST(failures.entries[0].reason == status::rejected);
  progress_for({keyed.get(), open_one.get()}, 20ms);
  BOOST_TEST(at_open.messages.empty());

  // A forged acceptor that claims a key but cannot prove it: the connector delivers nothing from
  // it. The test plays the acceptor on a raw socket.
  uint16_t port = 0;
  const int listener = raw_listen(&port);
  BOOST_REQUIRE(listener >= 0);
  recorder at_keyed;
  at_keyed.install(*keyed, 1);
  const uint64_t forged_id = 0x5eed5eed5eedull;
  std::vector<uint8_t> address(14);
  const uint32_t window = 64;
  std::memcpy(address.data(), &port, 2);
  std::memcpy(address.data() + 2, &forged_id, 8);
  std::memcpy(address.data() + 10, &window, 4);
  auto to_forged = connect(*keyed, keyed->device_address(), address);
  int fd = -1;
  BOOST_TEST(progress_until({keyed.get()}, [&] {
    fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return fd >= 0;
  }));
  BOOST_REQUIRE(fd >= 0);
  std::vector<uint8_t> got;
  BOOST_TEST(read_exactly(*keyed, fd, wire::header_size<wire::schema::TcpHello>(), &got));
  wire::header_writer<wire::schema::TcpChallenge> challenge;
  challenge.fields().setMagic(0x434f4d4d54435043ull);
  challenge.fields().setVersion(tl::tcp::hello_version);
  challenge.fields().setKeyed(true);
  challenge.fields().setIfaceId(forged_id);
  challenge.fields().setNonce0(42);
  BOOST_TEST(write_all(fd, bytes_of(challenge)));
  BOOST_TEST(read_exactly(*keyed, fd, wire::header_size<wire::schema::TcpProof>(), &got));
  wire::header_writer<wire::schema::TcpWelcome> welcome;
  welcome.fields().setMagic(0x434f4d4d54435057ull);
  welcome.fields().setOutcome(wire::schema::TcpOutcome::ACCEPTED);
  welcome.fields().setProof0(7);  // not the HMAC
  auto forged = bytes_of(welcome);
  const auto frame = message_frame(1, pattern(16, 5));
  forged.insert(forged.end(), frame.begin(), frame.end());
  BOOST_TEST(write_all(fd, forged));
  BOOST_TEST(progress_until({keyed.get()}, [&] { return failures.entries.size() == 2; }));
  BOOST_REQUIRE(failures.entries.size() == 2u);
  BOOST_TEST(failures.entries[1].ep == to_forged.get());
  BOOST_TEST(failures.entries[1].reason == status::rejected);
  BOOST_TEST(at_keyed.messages.empty());
  BOOST_TEST(progress_until({keyed.get()}, [&] { return peer_closed(fd); }));
  ::close(fd);
  ::close(listener);
}

BOOST_AUTO_TEST_CASE(authentication_across_processes) {
  // A keyed child serves; the parent's wrong key is refused, the right one gets through.
  channel to_child, to_parent;
  const pid_t child = fork_child([&]() -> int {
    auto iface = open_iface("lo", 0, "across processes");
    recorder got;
    got.install(*iface, 1);
    send_addresses(to_parent, *iface);
    CHILD_CHECK(progress_until({iface.get()}, [&] {
      return count_tagged(got, 'r') == 10 && info_number(*iface, "authentication refused ") == 1;
    }));
    CHILD_CHECK(count_tagged(got, 'w') == 0);
    CHILD_CHECK(got.messages.size() == 10);
    to_parent.send({1});
    std::vector<uint8_t> verdict;
    CHILD_CHECK(to_child.receive(&verdict));
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  std::vector<uint8_t> device, address, done;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  auto wrong = open_iface("lo", 0, "not it");
  auto right = open_iface("lo", 0, "across processes");
  failure_log failures;
  failures.install(*wrong);
  auto bad = connect(*wrong, device, address);
  BOOST_TEST(queue_tagged(*bad, 'w', 10));
  BOOST_TEST(progress_until({wrong.get()}, [&] { return !failures.entries.empty(); }));
  BOOST_REQUIRE(failures.entries.size() == 1u);
  BOOST_TEST(failures.entries[0].reason == status::rejected);
  auto good = connect(*right, device, address);
  BOOST_TEST(queue_tagged(*good, 'r', 10));
  BOOST_TEST(progress_until({right.get()}, [&] { return good->flush(nullptr) == status::ok; }));
  BOOST_TEST(to_parent.receive(&done));
  to_child.send({1});
  BOOST_TEST(wait_child(child) == 0);
}

// -- put and get ----------------------------------------------------------------------------------

/// `size` bytes of `owner` (a pattern from `seed`) registered for RMA, the key unpacked by `user`.
struct rma_region {
  tl::iface& owner;
  tl::iface& user;
  std::vector<uint8_t> bytes;
  tl::mem_handle* handle = nullptr;
  tl::remote_key key;
  std::vector<uint8_t> packed;

  rma_region(tl::iface& o, tl::iface& u, size_t size, uint8_t seed)
      : owner(o), user(u), bytes(pattern(size, seed)) {
    BOOST_REQUIRE(owner.memory_domain()->mem_reg(bytes.data(), bytes.size(), &handle) ==
                  status::ok);
    BOOST_REQUIRE(owner.memory_domain()->rkey_pack(handle, packed) == status::ok);
    BOOST_REQUIRE(user.memory_domain()->rkey_unpack(packed.data(), packed.size(), &key) ==
                  status::ok);
  }
  ~rma_region() {
    user.memory_domain()->rkey_release(&key);
    if (handle != nullptr) owner.memory_domain()->mem_dereg(handle);
  }
  uint64_t at(size_t offset) const { return reinterpret_cast<uintptr_t>(bytes.data()) + offset; }
};

/// A completion that records the order in which operations finished.
struct ordered_completion : tl::completion {
  size_t index = 0;
  std::vector<size_t>* order = nullptr;
  status got = status::in_progress;
  ordered_completion() {
    count = 1;
    func = [](tl::completion* self) {
      auto* c = static_cast<ordered_completion*>(self);
      c->got = c->result;
      c->order->push_back(c->index);
    };
  }
};

BOOST_AUTO_TEST_CASE(gets_and_puts_beyond_the_in_flight_bound_move_the_right_bytes_in_order) {
  auto a = open_iface();
  auto b = open_iface();
  auto ep = connect(*a, *b);
  constexpr size_t chunk = 65536, count = 3 * tl::tcp::max_rma_in_flight;
  rma_region region(*b, *a, count * chunk, 21);
  std::vector<uint8_t> local(count * chunk, 0);
  std::vector<size_t> order;
  std::vector<ordered_completion> done(count + 1);
  done.reserve(count + 16);  // the puts' completions are added below without moving these
  for (size_t i = 0; i < done.size(); ++i) {
    done[i].index = i;
    done[i].order = &order;
  }
  // More gets than may be unanswered at once (they wait in the connection's queue), each into
  // its own slice; then gets of 4 MiB scattered over 16 entries of odd sizes.
  for (size_t i = 0; i < count; ++i) {
    const tl::iov entry{local.data() + i * chunk, chunk};
    BOOST_TEST(ep->get_zcopy(&entry, 1, region.at(i * chunk), region.key, &done[i]) ==
               status::in_progress);
  }
  std::vector<uint8_t> scattered(2 * tl::tcp::max_rma_bytes + 4096, 0xee);
  std::vector<tl::iov> entries;
  size_t offset = 0, total = 0;
  for (size_t i = 0; i < tl::tcp::max_iov; ++i) {
    const size_t length = i + 1 == tl::tcp::max_iov
                              ? tl::tcp::max_rma_bytes - total
                              : tl::tcp::max_rma_bytes / tl::tcp::max_iov - 5 + i;
    entries.push_back({scattered.data() + offset, length});
    total += length;
    offset += length + 3;  // gaps of 3 bytes stay untouched
  }
  BOOST_TEST(ep->get_zcopy(entries.data(), entries.size(), region.at(1), region.key,
                           &done[count]) == status::in_progress);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return order.size() == count + 1; }, 30s));
  BOOST_REQUIRE(order.size() == count + 1);
  for (size_t i = 0; i < order.size(); ++i) BOOST_TEST(order[i] == i);
  BOOST_TEST((local == region.bytes));
  size_t from = 1;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto* bytes = static_cast<const uint8_t*>(entries[i].buffer);
    BOOST_TEST(std::equal(bytes, bytes + entries[i].length, region.bytes.begin() + from));
    BOOST_TEST(bytes[entries[i].length] == 0xee);
    from += entries[i].length;
  }
  // Puts of several sizes (an odd length leaves padding on the wire), then a get of everything.
  const auto fresh = pattern(region.bytes.size(), 22);
  size_t at = 0, puts = 0;
  for (; at < region.bytes.size(); ++puts) {
    const size_t length = std::min(region.bytes.size() - at, tl::tcp::max_rma_bytes - 1 - puts);
    done.emplace_back();
    done.back().index = count + 1 + puts;
    done.back().order = &order;
    const tl::iov entry{fresh.data() + at, length};
    BOOST_TEST(ep->put_zcopy(&entry, 1, region.at(at), region.key, &done.back()) ==
               status::in_progress);
    at += length;
  }
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return order.size() == done.size(); },
                            30s));
  for (size_t i = count + 1; i < done.size(); ++i) BOOST_TEST(done[i].got == status::ok);
  BOOST_TEST((region.bytes == fresh));
  BOOST_TEST(info_number(*a, "puts and gets sent ") == static_cast<long>(done.size()));
  BOOST_TEST(info_number(*b, "answered for peers ") == static_cast<long>(done.size()));
}

BOOST_AUTO_TEST_CASE(a_get_sees_the_bytes_from_before_a_put_issued_after_it) {
  auto a = open_iface();
  auto b = open_iface();
  auto ep = connect(*a, *b);
  rma_region region(*b, *a, tl::tcp::max_rma_bytes, 23);
  const auto before = region.bytes;
  const auto after = pattern(region.bytes.size(), 24);
  std::vector<uint8_t> read(region.bytes.size());
  // Several gets are answered from the region without a copy; the put behind them on the
  // connection lands before their answers are all written, so the owner keeps the old bytes.
  completion_probe got[3];
  for (auto& g : got) {
    const tl::iov entry{read.data(), read.size()};
    BOOST_TEST(ep->get_zcopy(&entry, 1, region.at(0), region.key, &g) == status::in_progress);
  }
  completion_probe put;
  const tl::iov entry{after.data(), after.size()};
  BOOST_TEST(ep->put_zcopy(&entry, 1, region.at(0), region.key, &put) == status::in_progress);
  BOOST_TEST(progress_until({b.get(), a.get()}, [&] {
    return put.calls == 1 && got[0].calls + got[1].calls + got[2].calls == 3;
  }));
  for (const auto& g : got) BOOST_TEST(g.result == status::ok);
  BOOST_TEST(put.result == status::ok);
  BOOST_TEST((read == before));
  BOOST_TEST((region.bytes == after));
}

BOOST_AUTO_TEST_CASE(the_data_of_a_destroyed_endpoints_get_is_dropped) {
  auto a = open_iface();
  auto b = open_iface();
  auto doomed = connect(*a, *b);
  auto kept = connect(*a, *b);  // the same connection
  rma_region region(*b, *a, tl::tcp::max_rma_bytes, 25);
  std::vector<uint8_t> target(region.bytes.size(), 0x77);
  completion_probe never;
  const tl::iov entry{target.data(), target.size()};
  BOOST_TEST(doomed->get_zcopy(&entry, 1, region.at(0), region.key, &never) ==
             status::in_progress);
  progress_for({b.get()}, 5ms);  // the answer is on its way
  doomed.reset();
  std::vector<uint8_t> read(4096);
  completion_probe later;
  const tl::iov small{read.data(), read.size()};
  BOOST_TEST(kept->get_zcopy(&small, 1, region.at(100), region.key, &later) ==
             status::in_progress);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return later.calls == 1; }));
  BOOST_TEST(later.result == status::ok);
  BOOST_TEST(std::equal(read.begin(), read.end(), region.bytes.begin() + 100));
  BOOST_TEST(never.calls == 0);
  BOOST_TEST(std::all_of(target.begin(), target.end(), [](uint8_t v) { return v == 0x77; }));
}

BOOST_AUTO_TEST_CASE(deregistering_a_region_under_its_answers_touches_it_no_more) {
  auto a = open_iface();
  auto b = open_iface();
  recorder got;
  got.install(*b, 1);
  auto ep = connect(*a, *b);
  // Memory the owner unmaps right after deregistering it: an answer still read from it would
  // fail the connection (EFAULT) or crash.
  const size_t size = tl::tcp::max_rma_bytes;
  void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  BOOST_REQUIRE(mapped != MAP_FAILED);
  const auto content = pattern(size, 26);
  std::memcpy(mapped, content.data(), size);
  tl::mem_handle* handle = nullptr;
  BOOST_REQUIRE(b->memory_domain()->mem_reg(mapped, size, &handle) == status::ok);
  std::vector<uint8_t> packed;
  BOOST_REQUIRE(b->memory_domain()->rkey_pack(handle, packed) == status::ok);
  tl::remote_key key;
  BOOST_REQUIRE(a->memory_domain()->rkey_unpack(packed.data(), packed.size(), &key) == status::ok);
  const uint64_t value = 9;  // the connection is open first
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return got.size() == 1; }));
  // Four answers of 4 MiB: more than the kernel buffers hold while `a` does not read.
  std::vector<std::vector<uint8_t>> reads(4, std::vector<uint8_t>(size));
  completion_probe done[4];
  for (size_t i = 0; i < 4; ++i) {
    const tl::iov entry{reads[i].data(), size};
    BOOST_TEST(ep->get_zcopy(&entry, 1, reinterpret_cast<uintptr_t>(mapped), key, &done[i]) ==
               status::in_progress);
  }
  BOOST_TEST(progress_until({b.get()}, [&] { return info_number(*b, "answered for peers ") > 0; }));
  BOOST_TEST(b->memory_domain()->mem_dereg(handle) == status::ok);
  BOOST_REQUIRE(::munmap(mapped, size) == 0);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] {
    return done[0].calls + done[1].calls + done[2].calls + done[3].calls == 4;
  }, 30s));
  size_t refused = 0;
  for (size_t i = 0; i < 4; ++i) {
    BOOST_TEST((done[i].result == status::ok || done[i].result == status::protection_error));
    if (done[i].result == status::ok) BOOST_TEST((reads[i] == content));
    refused += done[i].result == status::protection_error ? 1 : 0;
  }
  BOOST_TEST_MESSAGE(refused << " of 4 answers refused after the deregistration");
  // The connection is intact.
  BOOST_TEST(ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok);
  BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return got.size() == 2; }));
  a->memory_domain()->rkey_release(&key);
}

BOOST_AUTO_TEST_CASE(outstanding_gets_and_puts_fail_with_their_peer) {
  auto a = open_iface();
  auto b = open_iface();
  failure_log failures;
  failures.install(*a);
  auto ep = connect(*a, *b);
  rma_region region(*b, *a, 1 << 20, 27);
  std::vector<uint8_t> local(region.bytes.size());
  completion_probe get, put;
  const tl::iov entry{local.data(), local.size()};
  BOOST_TEST(ep->get_zcopy(&entry, 1, region.at(0), region.key, &get) == status::in_progress);
  BOOST_TEST(ep->put_zcopy(&entry, 1, region.at(0), region.key, &put) == status::in_progress);
  region.handle = nullptr;  // goes with b
  b.reset();
  BOOST_TEST(progress_until({a.get()}, [&] { return failures.entries.size() == 1; }));
  BOOST_TEST(get.calls == 1);
  BOOST_TEST(put.calls == 1);
  BOOST_TEST(is_error(get.result));
  BOOST_TEST(is_error(put.result));
  BOOST_TEST(is_error(ep->get_zcopy(&entry, 1, region.at(0), region.key, &get)));
}

BOOST_AUTO_TEST_CASE(rma_is_offered_by_default_and_says_its_get_needs_the_peer) {
  tl::iface_params params;
  params.device = "lo";
  std::unique_ptr<tl::iface> iface;
  BOOST_REQUIRE(tcp_component().open(params, iface) == status::ok);
  const uint64_t rma = tl::cap_put_zcopy | tl::cap_get_zcopy | tl::cap_get_needs_peer;
  BOOST_TEST((iface->attr().caps & rma) == rma);
  BOOST_TEST(iface->memory_domain() != nullptr);
}

BOOST_AUTO_TEST_CASE(without_comm_tcp_rma_there_is_no_put_get_or_memory_domain) {
  // COMM_TCP_RMA=0: no put, get or memory domain (the protocol layer's rendezvous and RMA go by
  // messages); a peer's rma frames find no region and are refused.
  tl::iface_params params;
  params.device = "lo";
  params.opts["COMM_TCP_RMA"] = "0";
  std::unique_ptr<tl::iface> off;
  BOOST_REQUIRE(tcp_component().open(params, off) == status::ok);
  BOOST_TEST((off->attr().caps & (tl::cap_put_zcopy | tl::cap_get_zcopy)) == 0u);
  BOOST_TEST(off->attr().max_get_zcopy == 0u);
  BOOST_TEST(off->memory_domain() == nullptr);
  auto on = open_iface();
  auto ep = connect(*off, *on);
  rma_region region(*on, *on, 4096, 51);
  uint8_t local[64];
  const tl::iov entry{local, sizeof(local)};
  BOOST_TEST(ep->get_zcopy(&entry, 1, region.at(0), region.key, nullptr) == status::unsupported);
  BOOST_TEST(ep->put_zcopy(&entry, 1, region.at(0), region.key, nullptr) == status::unsupported);
  const int fd = raw_connect(port_of(*off));
  BOOST_REQUIRE(fd >= 0);
  std::vector<uint8_t> bytes = hello_for(*off);
  tl::tcp::parsed_rma rma;
  rma.op = 1;
  rma.address = region.at(0);
  rma.length = 64;
  const auto get = rma_frame(tl::tcp::frame_kind::rma_get, rma);
  bytes.insert(bytes.end(), get.begin(), get.end());
  BOOST_TEST(write_all(fd, bytes));
  BOOST_TEST(progress_until({off.get()}, [&] {
    return info_number(*off, "accesses refused ") == 1;
  }));
  BOOST_TEST(!peer_closed(fd));
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(forged_and_stale_keys_get_errors_and_touch_no_memory) {
  // The owner's buffer: a registered middle page between two pages nobody registered. Keys that
  // unpack (the requester checks an access only against the key's own base and length) but name
  // memory the owner never registered, or a registration that is gone, must be refused by the
  // owner: the get's target and the owner's memory stay as they were.
  auto a = open_iface();
  auto b = open_iface();
  auto ep = connect(*a, *b);
  constexpr size_t page = 4096;
  std::vector<uint8_t> owner = pattern(3 * page, 31);
  const std::vector<uint8_t> owner_before = owner;
  tl::md& md = *b->memory_domain();
  tl::mem_handle* handle = nullptr;
  BOOST_REQUIRE(md.mem_reg(owner.data() + page, page, &handle) == status::ok);
  std::vector<uint8_t> packed;
  BOOST_REQUIRE(md.rkey_pack(handle, packed) == status::ok);
  tl::packed_rkey good;
  BOOST_REQUIRE(packed.size() >= sizeof(good));
  std::memcpy(&good, packed.data(), sizeof(good));
  // Runs `start` with the forged key and waits for its result (returned at once or completed).
  auto access = [&](const tl::packed_rkey& k, bool write, uint64_t address, size_t length) {
    tl::remote_key key;
    BOOST_REQUIRE(a->memory_domain()->rkey_unpack(&k, sizeof(k), &key) == status::ok);
    std::vector<uint8_t> local(length, 0x5a);
    const auto local_before = local;
    const std::vector<uint8_t> source = pattern(length, 99);
    completion_probe done;
    const tl::iov entry{write ? const_cast<uint8_t*>(source.data()) : local.data(), length};
    status st = write ? ep->put_zcopy(&entry, 1, address, key, &done)
                      : ep->get_zcopy(&entry, 1, address, key, &done);
    if (st == status::in_progress) {
      BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return done.calls == 1; }));
      st = done.result;
    }
    a->memory_domain()->rkey_release(&key);
    if (st != status::ok) BOOST_TEST((local == local_before));
    return st;
  };
  const uint64_t base = good.base;
  for (const bool write : {false, true}) {
    BOOST_TEST_CONTEXT((write ? "put" : "get")) {
      tl::packed_rkey k = good;
      k.base -= page;  // the unregistered page before
      k.length += 2 * page;
      BOOST_TEST(access(k, write, base - page, 64) == status::protection_error);
      BOOST_TEST(access(k, write, base - 8, 16) == status::protection_error);
      BOOST_TEST(access(k, write, base + page - 8, 16) == status::length_error);
      BOOST_TEST(access(k, write, base + page, 64) == status::protection_error);
      k = good;
      k.generation += 1;
      BOOST_TEST(access(k, write, base, 64) == status::protection_error);
      k = good;
      k.index += 1;
      BOOST_TEST(access(k, write, base, 64) == status::protection_error);
      k.index = tl::tcp::max_tcp_regions - 1;
      BOOST_TEST(access(k, write, base, 64) == status::protection_error);
      // A key naming memory of the test itself, never registered with the owner.
      std::vector<uint8_t> elsewhere = pattern(page, 77);
      const auto elsewhere_before = elsewhere;
      k = good;
      k.base = reinterpret_cast<uintptr_t>(elsewhere.data());
      BOOST_TEST(access(k, write, k.base, 64) == status::protection_error);
      BOOST_TEST((elsewhere == elsewhere_before));
    }
  }
  BOOST_TEST((owner == owner_before));
  // The real key works; after deregistration it does not, also once the slot holds a new region.
  BOOST_TEST(access(good, false, base, 64) == status::ok);
  BOOST_REQUIRE(md.mem_dereg(handle) == status::ok);
  BOOST_TEST(access(good, false, base, 64) == status::protection_error);
  BOOST_TEST(access(good, true, base, 64) == status::protection_error);
  tl::mem_handle* again = nullptr;
  BOOST_REQUIRE(md.mem_reg(owner.data() + page, page, &again) == status::ok);
  std::vector<uint8_t> packed_again;
  BOOST_REQUIRE(md.rkey_pack(again, packed_again) == status::ok);
  tl::packed_rkey fresh;
  std::memcpy(&fresh, packed_again.data(), sizeof(fresh));
  const uint32_t fresh_slot = fresh.index, old_slot = good.index;
  BOOST_TEST(fresh_slot == old_slot);  // the slot is reused, with a new generation
  BOOST_TEST(access(good, false, base, 64) == status::protection_error);
  BOOST_TEST(access(good, true, base, 64) == status::protection_error);
  BOOST_TEST(access(fresh, false, base, 64) == status::ok);
  BOOST_TEST((owner == owner_before));
  BOOST_TEST(md.mem_dereg(again) == status::ok);
  BOOST_TEST(info_number(*b, "accesses refused ") == 20);
}

// -- bad peers ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(garbage_from_raw_sockets_closes_only_that_connection) {
  auto sender = open_iface();
  auto receiver = open_iface();
  recorder got;
  got.install(*receiver, 1);
  auto ep = connect(*sender, *receiver);
  const uint16_t port = port_of(*receiver);

  const std::vector<uint8_t> junk = pattern(100, 77);
  const auto hello = hello_for(*receiver);
  auto with = [](std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  auto bad_hello = hello;
  bad_hello[8] ^= 0xff;  // the magic
  tl::tcp::parsed_rma rma;
  rma.op = 1;
  rma.length = 16;
  tl::tcp::parsed_rma too_long = rma;
  too_long.length = tl::tcp::max_rma_bytes + 1;
  tl::tcp::parsed_rma unnumbered = rma;
  unnumbered.op = 0;
  const std::vector<std::pair<const char*, std::vector<uint8_t>>> cases = {
      {"random bytes instead of a hello", junk},
      {"a hello with the wrong magic", bad_hello},
      {"a frame with an unknown am id", with(hello, frame_header(200, 8))},
      {"a frame announcing 4 GiB", with(hello, frame_header(1, 0xffffffffu))},
      {"a frame header with pointers", with(hello, std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 1, 0})},
      {"an acknowledgement of messages never sent", with(hello, frame_header(1, 0, 5))},
      {"an unknown frame kind",
       with(hello, frame_header(1, 0, 0, static_cast<wire::schema::TcpFrameKind>(9)))},
      {"an ack with a payload",
       with(hello, frame_header(1, 8, 0, wire::schema::TcpFrameKind::ACK))},
      {"a message after bye",
       with(with(hello, frame_header(0, 0, 0, wire::schema::TcpFrameKind::BYE)),
            message_frame(1, pattern(8, 1)))},
      {"an rma frame with an am id",
       with(hello, frame_header(1, tl::tcp::rma_header_size, 0,
                                wire::schema::TcpFrameKind::RMA_GET))},
      {"an answer to no put or get", with(hello, rma_frame(tl::tcp::frame_kind::rma_reply, rma))},
      {"a get of more than max_rma_bytes",
       with(hello, rma_frame(tl::tcp::frame_kind::rma_get, too_long))},
      {"a put whose data is not its length",
       with(hello, rma_frame(tl::tcp::frame_kind::rma_put, rma, pattern(7, 3)))},
      {"an rma operation numbered 0",
       with(hello, rma_frame(tl::tcp::frame_kind::rma_get, unnumbered))},
  };
  long closed_before = info_number(*receiver, "malformed connections closed ");
  for (const auto& [what, bytes] : cases) {
    BOOST_TEST_CONTEXT(what) {
      const int fd = raw_connect(port);
      BOOST_REQUIRE(fd >= 0);
      BOOST_TEST(write_all(fd, bytes));
      // Meanwhile the good endpoint keeps being served.
      const uint64_t seq = got.messages.size();
      BOOST_TEST(ep->am_short(1, &seq, sizeof(seq), nullptr, 0) == status::ok);
      BOOST_TEST(progress_until({receiver.get(), sender.get()},
                                [&] { return peer_closed(fd) && got.messages.size() == seq + 1; }));
      ::close(fd);
      BOOST_TEST(info_number(*receiver, "malformed connections closed ") == ++closed_before);
    }
  }
  // A connection that never says hello is dropped after the hello timeout; one that says hello
  // and sends half a frame is kept (it may finish later) until it closes.
  const int half = raw_connect(port);
  BOOST_TEST(write_all(half, with(hello, frame_header(1, 100))));
  progress_for({receiver.get()}, 50ms);
  BOOST_TEST(!peer_closed(half));
  ::close(half);
  BOOST_TEST(progress_until({receiver.get()}, [&] {
    return info_number(*receiver, "connections ") == 1;  // only the good one is left
  }));
  BOOST_TEST(got.messages.size() == cases.size());
}

BOOST_AUTO_TEST_CASE(puts_and_gets_of_a_raw_peer_are_checked_and_bounded) {
  auto owner = open_iface();
  auto other = open_iface();
  rma_region region(*owner, *other, tl::tcp::max_rma_bytes, 28);
  tl::packed_rkey key;
  std::memcpy(&key, region.packed.data(), sizeof(key));
  const auto hello = hello_for(*owner);
  // Puts and gets outside the region, of a stale generation or an unknown slot are answered with
  // an error (the put's data is read and dropped) and the connection stays; a put inside lands.
  const int fd = raw_connect(port_of(*owner));
  BOOST_REQUIRE(fd >= 0);
  std::vector<uint8_t> bytes = hello;
  auto add = [&](const std::vector<uint8_t>& more) {
    bytes.insert(bytes.end(), more.begin(), more.end());
  };
  tl::tcp::parsed_rma rma;
  rma.slot = key.index;
  rma.generation = key.generation;
  rma.address = key.base + key.length - 8;
  rma.length = 16;
  rma.op = 1;
  add(rma_frame(tl::tcp::frame_kind::rma_get, rma));  // runs past the end
  rma.op = 2;
  rma.generation = key.generation + 1;
  rma.address = key.base;
  add(rma_frame(tl::tcp::frame_kind::rma_put, rma, pattern(16, 5)));  // stale
  rma.op = 3;
  rma.slot = key.index + 1000;
  add(rma_frame(tl::tcp::frame_kind::rma_get, rma));  // no such slot
  rma.op = 4;
  rma.slot = key.index;
  rma.generation = key.generation;
  rma.address = key.base + 100;
  rma.length = 5;
  add(rma_frame(tl::tcp::frame_kind::rma_put, rma, pattern(5, 6)));  // lands
  BOOST_TEST(write_all(fd, bytes));
  BOOST_TEST(progress_until({owner.get()}, [&] {
    return info_number(*owner, "answered for peers ") == 4;
  }));
  BOOST_TEST(info_number(*owner, "accesses refused ") == 3);
  BOOST_TEST(info_number(*owner, "puts taken ") == 1);
  const auto five = pattern(5, 6);
  BOOST_TEST(std::equal(five.begin(), five.end(), region.bytes.begin() + 100));
  BOOST_TEST(region.bytes[105] == pattern(tl::tcp::max_rma_bytes, 28)[105]);
  BOOST_TEST(!peer_closed(fd));
  // Asking for more answers than max_rma_in_flight while reading none closes the connection: the
  // answers of 4 MiB fill the kernel's buffers and the owner keeps at most that many queued.
  bytes.clear();
  rma.length = tl::tcp::max_rma_bytes;
  rma.address = key.base;
  for (size_t i = 0; i < 2 * tl::tcp::max_rma_in_flight; ++i) {
    rma.op = 5 + i;
    add(rma_frame(tl::tcp::frame_kind::rma_get, rma));
  }
  BOOST_TEST(write_all(fd, bytes));
  const long closed_before = info_number(*owner, "malformed connections closed ");
  BOOST_TEST(progress_until({owner.get()}, [&] {
    return info_number(*owner, "malformed connections closed ") == closed_before + 1;
  }));
  ::close(fd);
  BOOST_TEST(
      progress_until({owner.get()}, [&] { return info_number(*owner, "connections ") == 0; }));
}

BOOST_AUTO_TEST_CASE(a_raw_peer_asking_for_unregistered_memory_reads_only_refusals) {
  // A hostile peer names a deregistered region, memory around a registered one, and memory never
  // registered at all: every answer on the socket is a refusal without data, in the order asked,
  // and no byte of the owner's changes.
  auto owner = open_iface();
  auto other = open_iface();
  constexpr size_t page = 4096;
  std::vector<uint8_t> memory = pattern(3 * page, 41);
  const std::vector<uint8_t> before = memory;
  tl::md& md = *owner->memory_domain();
  tl::mem_handle* live = nullptr;
  tl::mem_handle* gone = nullptr;
  BOOST_REQUIRE(md.mem_reg(memory.data() + page, page, &live) == status::ok);
  BOOST_REQUIRE(md.mem_reg(memory.data() + 2 * page, page, &gone) == status::ok);
  std::vector<uint8_t> live_packed, gone_packed;
  BOOST_REQUIRE(md.rkey_pack(live, live_packed) == status::ok);
  BOOST_REQUIRE(md.rkey_pack(gone, gone_packed) == status::ok);
  tl::packed_rkey live_key, gone_key;
  std::memcpy(&live_key, live_packed.data(), sizeof(live_key));
  std::memcpy(&gone_key, gone_packed.data(), sizeof(gone_key));
  BOOST_REQUIRE(md.mem_dereg(gone) == status::ok);

  struct ask {
    tl::tcp::frame_kind kind;
    uint32_t slot;
    uint64_t generation;
    uint64_t address;
    uint64_t length;
    status expected;
  };
  const uint64_t base = live_key.base;
  const uint64_t never = reinterpret_cast<uintptr_t>(memory.data());  // the first page
  const std::vector<ask> asks = {
      {tl::tcp::frame_kind::rma_get, gone_key.index, gone_key.generation, gone_key.base, 64,
       status::protection_error},
      {tl::tcp::frame_kind::rma_put, gone_key.index, gone_key.generation, gone_key.base, 64,
       status::protection_error},
      {tl::tcp::frame_kind::rma_get, live_key.index, live_key.generation, never, 64,
       status::protection_error},
      {tl::tcp::frame_kind::rma_put, live_key.index, live_key.generation, never, 64,
       status::protection_error},
      {tl::tcp::frame_kind::rma_get, live_key.index, live_key.generation, base - 1, 2,
       status::protection_error},
      {tl::tcp::frame_kind::rma_put, live_key.index, live_key.generation, base + page - 1, 2,
       status::length_error},
      {tl::tcp::frame_kind::rma_get, live_key.index, live_key.generation, base + page, 8,
       status::protection_error},
      {tl::tcp::frame_kind::rma_get, live_key.index, live_key.generation, ~uint64_t{0} - 7, 64,
       status::protection_error},
      {tl::tcp::frame_kind::rma_put, live_key.index, live_key.generation + 1, base, 64,
       status::protection_error},
      {tl::tcp::frame_kind::rma_get, 1u << 19, 1, base, 64, status::protection_error},
  };
  const int fd = raw_connect(port_of(*owner));
  BOOST_REQUIRE(fd >= 0);
  std::vector<uint8_t> bytes = hello_for(*owner);
  for (size_t i = 0; i < asks.size(); ++i) {
    tl::tcp::parsed_rma rma;
    rma.op = i + 1;
    rma.slot = asks[i].slot;
    rma.generation = asks[i].generation;
    rma.address = asks[i].address;
    rma.length = asks[i].length;
    const bool put = asks[i].kind == tl::tcp::frame_kind::rma_put;
    const auto data = put ? pattern(rma.length, 9) : std::vector<uint8_t>{};
    const auto frame = rma_frame(asks[i].kind, rma, data);
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  BOOST_TEST(write_all(fd, bytes));
  // The challenge and the welcome, then one record-only answer per operation.
  constexpr size_t handshake = tl::tcp::challenge_size + tl::tcp::welcome_size;
  constexpr size_t answer_size = tl::tcp::frame_header_size + tl::tcp::rma_header_size;
  std::vector<uint8_t> got;
  BOOST_REQUIRE(read_exactly(*owner, fd, handshake + asks.size() * answer_size, &got));
  for (size_t i = 0; i < asks.size(); ++i) {
    BOOST_TEST_CONTEXT("answer " << i + 1) {
      alignas(8) uint8_t answer[answer_size];
      std::memcpy(answer, got.data() + handshake + i * answer_size, answer_size);
      tl::tcp::parsed_frame frame;
      BOOST_REQUIRE(tl::tcp::parse_frame_header(answer, answer_size, &frame) ==
                    tl::tcp::parse_result::frame);
      BOOST_TEST((frame.kind == tl::tcp::frame_kind::rma_reply));
      tl::tcp::parsed_rma rma;
      BOOST_REQUIRE(tl::tcp::parse_rma(answer + frame.header_bytes,
                                       answer_size - frame.header_bytes, &frame,
                                       &rma) == tl::tcp::parse_result::frame);
      BOOST_TEST(rma.op == i + 1);
      BOOST_TEST(rma.result == asks[i].expected);
      BOOST_TEST(rma.data_bytes == 0u);
    }
  }
  BOOST_TEST(info_number(*owner, "accesses refused ") == static_cast<long>(asks.size()));
  BOOST_TEST(info_number(*owner, "puts taken ") == 0);
  BOOST_TEST(info_number(*owner, "gets served ") == 0);
  BOOST_TEST((memory == before));
  BOOST_TEST(!peer_closed(fd));
  ::close(fd);
  BOOST_TEST(md.mem_dereg(live) == status::ok);
  BOOST_TEST(
      progress_until({owner.get()}, [&] { return info_number(*owner, "connections ") == 0; }));
}

// -- blocking progress ----------------------------------------------------------------------------

// -- leaks ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(no_descriptor_leaks) {
  const size_t before = comm::test::open_fds();
  for (int round = 0; round < 3; ++round) {
    auto a = open_iface();
    auto b = open_iface();
    three_recorders got(*b);
    auto ab = connect(*a, *b);
    auto ba = connect(*b, *a);
    BOOST_TEST(send_three({a.get(), b.get()}, *ab) == status::ok);
    BOOST_TEST(progress_until({a.get(), b.get()}, [&] { return got.all_arrived(); }));
    // A raw connection that sends garbage, one that stays silent, and a destroyed endpoint with
    // bytes buffered.
    const int garbage = raw_connect(port_of(*b));
    write_all(garbage, pattern(64, 1));
    const int silent = raw_connect(port_of(*a));
    progress_for({a.get(), b.get()}, 20ms);
    ::close(garbage);
    ::close(silent);
    ab.reset();
    ba.reset();
  }
  BOOST_TEST(comm::test::open_fds() == before);
}
