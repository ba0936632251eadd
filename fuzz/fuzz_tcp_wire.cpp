// Fuzzes the tcp transport's frame and handshake parsers and its address decoders
// (transports/tcp/tcp_wire.hpp), the functions a data connection runs on every byte a peer sends.
//
// Input: one byte choosing the parser, then the bytes as they arrived (copied 8-byte aligned, as in
// the connection's receive buffer). Whatever a parser accepts must be consistent: the record lies
// inside the bytes, record_extent agrees on its size, its fields are inside the documented bounds,
// and a stream of frames is walked the way tcp_conn walks it without running past the input.
#include "check.hpp"
#include "seeds.hpp"
#include "tcp/tcp_wire.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

namespace {

using comm::fuzz::require;

using namespace comm::tl::tcp;

/// The interface id a hello must name to be accepted (the corpus's hellos name it).
constexpr uint64_t own_iface_id = 0x1122334455667788ull;

/// A record the parser accepted: inside the bytes, and of the size record_extent gives it.
void check_extent(const uint8_t* data, size_t available, parse_result r, size_t consumed,
                  const char* problem) {
  if (r == parse_result::garbage) require(problem != nullptr, "garbage without a reason");
  if (r != parse_result::frame) return;
  require(consumed >= 8 && consumed <= available && consumed % 8 == 0,
          "an accepted record does not lie inside the bytes");
  size_t bytes = 0;
  require(record_extent(data, available, &bytes) == parse_result::frame && bytes == consumed,
          "record_extent disagrees with the parser");
}

/// Walks the bytes as a stream of frames, as tcp_conn does.
void walk_frames(const uint8_t* data, size_t available) {
  size_t at = 0;
  while (at < available) {
    parsed_frame f;
    const parse_result r = parse_frame_header(data + at, available - at, &f);
    if (r != parse_result::frame) {
      if (r == parse_result::garbage) require(f.problem != nullptr, "garbage without a reason");
      return;
    }
    require(f.header_bytes >= 8 && f.header_bytes <= available - at, "header outside the bytes");
    require(f.length <= max_frame_payload, "frame longer than max_frame_payload");
    require(f.kind == frame_kind::message || f.length == 0, "control frame with a payload");
    require(f.kind != frame_kind::message || f.id < comm::tl::am_id_count, "am id out of range");
    require(f.total == f.header_bytes + pad8(f.length), "total is not header + padded length");
    if (f.total > available - at) return;  // the payload has not all arrived: wait for it
    at += f.total;
  }
}

/// A hello for own_iface_id.
void check_hello(const uint8_t* data, size_t available) {
  size_t consumed = 0;
  parsed_hello hello;
  const char* problem = nullptr;
  const parse_result r = parse_hello(data, available, own_iface_id, &consumed, &hello, &problem);
  check_extent(data, available, r, consumed, problem);
  if (r != parse_result::frame) return;
  require(hello.src_iface_id != 0, "a hello from interface 0");
  require(hello.window >= min_window && hello.window <= max_window, "window out of bounds");
  require(hello.src_address.is_v4() || hello.src_address.is_v6(),
          "a hello whose source address has no family");
  require(hello.src_address.scope == 0, "a hello carried a scope");
}

/// A challenge.
void check_challenge(const uint8_t* data, size_t available) {
  size_t consumed = 0;
  uint64_t id = 0;
  bool keyed = false;
  uint8_t nonce[16];
  const char* problem = nullptr;
  const parse_result r = parse_challenge(data, available, &consumed, &id, &keyed, nonce, &problem);
  check_extent(data, available, r, consumed, problem);
}

/// A proof record.
void check_proof(const uint8_t* data, size_t available) {
  size_t consumed = 0;
  uint8_t proof[32];
  const char* problem = nullptr;
  const parse_result r = parse_proof(data, available, &consumed, proof, &problem);
  check_extent(data, available, r, consumed, problem);
}

/// A welcome: a known outcome.
void check_welcome(const uint8_t* data, size_t available) {
  size_t consumed = 0;
  outcome result = outcome::refused;
  uint8_t proof[32];
  const char* problem = nullptr;
  const parse_result r = parse_welcome(data, available, &consumed, &result, proof, &problem);
  check_extent(data, available, r, consumed, problem);
  if (r == parse_result::frame) {
    require(result == outcome::accepted || result == outcome::duplicate ||
                result == outcome::refused,
            "an unknown outcome");
  }
}

/// A device address that unpacked: a unicast address of a known family, its unused bytes zero.
void check_device(const device_addr& device, const std::vector<uint8_t>& bytes) {
  require(device.pack() == bytes, "a device address does not round-trip");
  const ip_address address = device.address();
  require(device.family == device_family_ipv4 || device.family == device_family_ipv6,
          "a device address of an unknown family");
  require((device.family == device_family_ipv6) == address.is_v6(),
          "a device address whose family byte and address disagree");
  require(!address.unspecified() && address.scope == 0, "an unspecified or scoped address");
  require(address.is_v6() ? address.bytes[0] != 0xff : address.bytes[0] < 224,
          "a multicast device address");
  for (size_t i = 4; address.is_v4() && i < 16; ++i) {
    require(device.ip[i] == 0, "an IPv4 device address with bytes past its 4");
  }
  require(device.reserved[0] == 0 && device.reserved[1] == 0 && device.reserved[2] == 0,
          "a device address with reserved bytes set");
  require(device.loopback() == address.loopback(), "loopback() disagrees with the address");
}

/// Device and interface addresses: what unpacks packs back to the same bytes.
void check_addresses(const uint8_t* data, size_t available) {
  const std::vector<uint8_t> bytes(data, data + available);
  if (auto device = device_addr::unpack(bytes)) check_device(*device, bytes);
  if (auto iface = iface_addr::unpack(bytes)) {
    const uint64_t id = iface->iface_id;
    const uint32_t window = iface->window;
    require(iface->port != 0 && id != 0, "an interface address with port or id 0");
    require(window >= min_window && window <= max_window, "window out of bounds");
    require(iface->pack() == bytes, "an interface address does not round-trip");
  }
}

using checker = void (*)(const uint8_t*, size_t);
constexpr checker checkers[] = {walk_frames,   check_hello,   check_challenge,
                                check_proof,   check_welcome, check_addresses};
constexpr size_t checker_count = std::size(checkers);

// -- seeds -----------------------------------------------------------------------------------------

using comm::fuzz::seed;

/// The IPv6 loopback address.
ip_address ipv6_loopback() {
  const uint8_t one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return ip_address::v6(one);
}

/// Seeds: a stream of frames (a message, an ack, a bye), each handshake record (a hello from an
/// IPv4 and from an IPv6 interface), and addresses (IPv4 and IPv6 device addresses).
std::vector<seed> make_seeds() {
  record_writer w;
  const uint8_t nonce[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const uint8_t proof[32] = {0xaa, 0xbb, 0xcc};
  std::vector<seed> seeds(checker_count + 3);
  uint8_t record[max_header_bytes] = {};
  seeds[0] = {0};
  const char payload[13] = "hello, frame";
  comm::fuzz::append(seeds[0], record, w.frame(frame_kind::message, 3, 12, true, 5, record));
  comm::fuzz::append(seeds[0], payload, 12);
  seeds[0].resize(seeds[0].size() + 4);  // padding to 8
  comm::fuzz::append(seeds[0], record, w.frame(frame_kind::ack, 0, 0, false, 9, record));
  comm::fuzz::append(seeds[0], record, w.frame(frame_kind::bye, 0, 0, false, 9, record));
  seeds[1] = {1};
  w.hello(4242, ip_address::v4(0x0100007f), 77, own_iface_id, 1024, nonce, record);
  comm::fuzz::append(seeds[1], record, hello_size);
  seeds[2] = {2};
  w.challenge(own_iface_id, true, nonce, record);
  comm::fuzz::append(seeds[2], record, challenge_size);
  seeds[3] = {3};
  w.proof(proof, record);
  comm::fuzz::append(seeds[3], record, proof_record_size);
  seeds[4] = {4};
  w.welcome(outcome::accepted, proof, record);
  comm::fuzz::append(seeds[4], record, welcome_size);
  seeds[5] = {5};
  const auto device = device_addr::local(ip_address::v4(0x0100007f)).pack();
  seeds[5].insert(seeds[5].end(), device.begin(), device.end());
  seeds[6] = {5};
  iface_addr iface;
  iface.port = 4242;
  iface.iface_id = own_iface_id;
  iface.window = 1024;
  const auto packed = iface.pack();
  seeds[6].insert(seeds[6].end(), packed.begin(), packed.end());
  seeds[7] = {1};
  w.hello(4242, ipv6_loopback(), 77, own_iface_id, 1024, nonce, record);
  comm::fuzz::append(seeds[7], record, hello_size);
  seeds[8] = {5};
  const auto device6 = device_addr::local(ipv6_loopback()).pack();
  seeds[8].insert(seeds[8].end(), device6.begin(), device6.end());
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t length = size - 1;
  std::vector<uint64_t> words(length / 8 + 1);
  std::memcpy(words.data(), data + 1, length);
  checkers[data[0] % checker_count](reinterpret_cast<const uint8_t*>(words.data()), length);
  return 0;
}
