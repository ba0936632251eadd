#include "tcp/tcp_wire.hpp"

#include "base/host_identity.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <initializer_list>

namespace comm::tl::tcp {
namespace {

template <class T>
std::vector<uint8_t> to_bytes(const T& value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);
  return std::vector<uint8_t>(p, p + sizeof(T));
}

template <class T>
std::optional<T> from_bytes(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != sizeof(T)) return std::nullopt;
  T value;
  std::memcpy(&value, bytes.data(), sizeof(T));
  return value;
}

/// Size of the data-only struct whose root pointer starts `data`, or 0 when the root pointer is
/// not one of a data-only struct at offset 0 (or announces more than max_header_bytes).
size_t header_extent(const uint8_t* data) {
  uint64_t root;
  std::memcpy(&root, data, sizeof(root));
  const uint32_t low = static_cast<uint32_t>(root);
  const uint16_t data_words = static_cast<uint16_t>(root >> 32);
  const uint16_t pointer_words = static_cast<uint16_t>(root >> 48);
  const size_t bytes = (1 + size_t{data_words}) * sizeof(uint64_t);
  if (low != 0 || pointer_words != 0 || bytes > max_header_bytes) return 0;
  return bytes;
}

/// Checks the root word of a `Struct` header at `data`: garbage, incomplete, or a header of
/// `*bytes` bytes that is all there.
template <class Struct>
parse_result check_extent(const uint8_t* data, size_t available, size_t* bytes) {
  if (available < sizeof(uint64_t)) return parse_result::incomplete;
  *bytes = header_extent(data);
  if (*bytes < wire::header_size<Struct>()) return parse_result::garbage;
  return available < *bytes ? parse_result::incomplete : parse_result::frame;
}

}  // namespace

// -- addresses ------------------------------------------------------------------------------------

device_addr device_addr::local(const ip_address& address) {
  device_addr addr;
  addr.family = address.is_v6() ? device_family_ipv6 : device_family_ipv4;
  std::memcpy(addr.ip, address.bytes, address.is_v6() ? 16 : 4);
  const host_identity& me = local_host_identity();
  std::memcpy(addr.boot_id, me.boot_id, sizeof(addr.boot_id));
  addr.net_ns = me.net_ns;
  return addr;
}

std::vector<uint8_t> device_addr::pack() const { return to_bytes(*this); }

namespace {

/// True when the address bytes of `addr` are a unicast address of its family that a device may
/// have: not unspecified, multicast or broadcast, IPv4 with its unused bytes zero, IPv6 not an
/// IPv4-mapped one (those travel as IPv4).
bool usable_unicast(const device_addr& addr) {
  const uint8_t* ip = addr.ip;
  const auto zero = [](const uint8_t* from, const uint8_t* to) {
    return std::all_of(from, to, [](uint8_t b) { return b == 0; });
  };
  if (addr.family == device_family_ipv4) {
    const bool broadcast = ip[0] == 255 && ip[1] == 255 && ip[2] == 255 && ip[3] == 255;
    return zero(ip + 4, ip + 16) && !zero(ip, ip + 4) && ip[0] < 224 && !broadcast;
  }
  if (addr.family != device_family_ipv6) return false;
  const ip_address v6 = ip_address::v6(ip);
  return v6.is_v6() && !zero(ip, ip + 16) && ip[0] != 0xff;
}

}  // namespace

std::optional<device_addr> device_addr::unpack(const std::vector<uint8_t>& bytes) {
  auto addr = from_bytes<device_addr>(bytes);
  if (!addr) return std::nullopt;
  const device_addr& a = *addr;
  if (a.reserved[0] != 0 || a.reserved[1] != 0 || a.reserved[2] != 0 || !usable_unicast(a)) {
    return std::nullopt;
  }
  return addr;
}

ip_address device_addr::address() const {
  if (family == device_family_ipv6) return ip_address::v6(ip);
  uint32_t ipv4 = 0;
  std::memcpy(&ipv4, ip, sizeof(ipv4));
  return ip_address::v4(ipv4);
}

bool device_addr::loopback() const { return address().loopback(); }

std::vector<uint8_t> iface_addr::pack() const { return to_bytes(*this); }

std::optional<iface_addr> iface_addr::unpack(const std::vector<uint8_t>& bytes) {
  auto addr = from_bytes<iface_addr>(bytes);
  if (addr && (addr->port == 0 || addr->iface_id == 0 || addr->window < min_window ||
               addr->window > max_window)) {
    return std::nullopt;
  }
  return addr;
}

// -- parsing --------------------------------------------------------------------------------------

namespace {

/// Reads a checked record of type `Struct` at `data`: garbage (with `*problem` set to `what`),
/// incomplete, or a record of `*consumed` bytes in `*out`.
template <class Struct>
parse_result read_record(const uint8_t* data, size_t available, const char* what,
                         size_t* consumed, typename Struct::Reader* out, const char** problem) {
  size_t bytes = 0;
  const parse_result extent = check_extent<Struct>(data, available, &bytes);
  if (extent == parse_result::incomplete) return extent;
  if (extent == parse_result::garbage) {
    *problem = what;
    return extent;
  }
  const auto record = wire::read_header<Struct>(data, available);
  if (!record) {
    *problem = what;
    return parse_result::garbage;
  }
  *consumed = bytes;
  *out = *record;
  return parse_result::frame;
}

void words_to_bytes(std::initializer_list<uint64_t> words, uint8_t* out) {
  for (uint64_t word : words) {
    std::memcpy(out, &word, sizeof(word));
    out += sizeof(word);
  }
}

}  // namespace

parse_result record_extent(const uint8_t* data, size_t available, size_t* bytes) {
  if (available < sizeof(uint64_t)) return parse_result::incomplete;
  *bytes = header_extent(data);
  if (*bytes == 0) return parse_result::garbage;
  return available < *bytes ? parse_result::incomplete : parse_result::frame;
}

static_assert(static_cast<int>(frame_kind::ack) ==
              static_cast<int>(wire::schema::TcpFrameKind::ACK));
static_assert(static_cast<int>(frame_kind::bye) ==
              static_cast<int>(wire::schema::TcpFrameKind::BYE));
static_assert(static_cast<int>(outcome::duplicate) ==
              static_cast<int>(wire::schema::TcpOutcome::DUPLICATE));
static_assert(static_cast<int>(outcome::refused) ==
              static_cast<int>(wire::schema::TcpOutcome::REFUSED));

parse_result parse_frame_header(const uint8_t* data, size_t available, parsed_frame* out) {
  size_t bytes = 0;
  const parse_result extent = check_extent<wire::schema::TcpFrame>(data, available, &bytes);
  if (extent != parse_result::frame) {
    if (extent == parse_result::garbage) out->problem = "not a frame header";
    return extent;
  }
  const auto header = wire::read_header<wire::schema::TcpFrame>(data, available);
  if (!header) {
    out->problem = "not a frame header";
    return parse_result::garbage;
  }
  const uint8_t id = header->getAmId();
  const uint32_t length = header->getLength();
  const auto kind = header->getKind();
  if (kind == wire::schema::TcpFrameKind::MESSAGE) {
    if (id >= am_id_count) {
      out->problem = "unknown am id";
      return parse_result::garbage;
    }
    if (length > max_frame_payload) {
      out->problem = "frame length beyond max_zcopy";
      return parse_result::garbage;
    }
    out->kind = frame_kind::message;
  } else if (kind == wire::schema::TcpFrameKind::ACK || kind == wire::schema::TcpFrameKind::BYE) {
    if (length != 0) {
      out->problem = "a control frame with a payload";
      return parse_result::garbage;
    }
    out->kind = kind == wire::schema::TcpFrameKind::ACK ? frame_kind::ack : frame_kind::bye;
  } else {
    out->problem = "unknown frame kind";
    return parse_result::garbage;
  }
  out->id = id;
  out->ack = header->getAckRequested();
  out->delivered = header->getDelivered();
  out->header_bytes = bytes;
  out->length = length;
  out->total = bytes + pad8(length);
  return parse_result::frame;
}

parse_result parse_hello(const uint8_t* data, size_t available, uint64_t own_id, size_t* consumed,
                         parsed_hello* out, const char** problem) {
  wire::schema::TcpHello::Reader hello;
  const parse_result r = read_record<wire::schema::TcpHello>(data, available, "not a hello",
                                                            consumed, &hello, problem);
  if (r != parse_result::frame) return r;
  if (hello.getMagic() != hello_magic) {
    *problem = "not a hello";
    return parse_result::garbage;
  }
  if (hello.getVersion() != hello_version) {
    *problem = "unsupported protocol version";
    return parse_result::garbage;
  }
  if (hello.getDstIfaceId() != own_id) {
    *problem = "hello for another interface";
    return parse_result::garbage;
  }
  const uint32_t window = hello.getWindow();
  if (hello.getSrcIfaceId() == 0 || window < min_window || window > max_window) {
    *problem = "a hello with a bad interface id or window";
    return parse_result::garbage;
  }
  out->src_iface_id = hello.getSrcIfaceId();
  if (hello.getSrcIpv6()) {
    uint8_t ip[16];
    words_to_bytes({hello.getSrcAddress6a(), hello.getSrcAddress6b()}, ip);
    out->src_address = ip_address::v6(ip);
  } else {
    out->src_address = ip_address::v4(hello.getSrcAddress());
  }
  out->src_port = hello.getSrcPort();
  out->window = window;
  words_to_bytes({hello.getNonce0(), hello.getNonce1()}, out->nonce);
  return parse_result::frame;
}

parse_result parse_challenge(const uint8_t* data, size_t available, size_t* consumed,
                             uint64_t* iface_id, bool* keyed, uint8_t nonce[16],
                             const char** problem) {
  wire::schema::TcpChallenge::Reader challenge;
  const parse_result r = read_record<wire::schema::TcpChallenge>(
      data, available, "not a challenge", consumed, &challenge, problem);
  if (r != parse_result::frame) return r;
  if (challenge.getMagic() != challenge_magic) {
    *problem = "not a challenge";
    return parse_result::garbage;
  }
  if (challenge.getVersion() != hello_version) {
    *problem = "unsupported protocol version";
    return parse_result::garbage;
  }
  *iface_id = challenge.getIfaceId();
  *keyed = challenge.getKeyed();
  words_to_bytes({challenge.getNonce0(), challenge.getNonce1()}, nonce);
  return parse_result::frame;
}

parse_result parse_proof(const uint8_t* data, size_t available, size_t* consumed,
                         uint8_t proof[32], const char** problem) {
  wire::schema::TcpProof::Reader record;
  const parse_result r = read_record<wire::schema::TcpProof>(data, available, "not a proof",
                                                            consumed, &record, problem);
  if (r != parse_result::frame) return r;
  if (record.getMagic() != proof_magic) {
    *problem = "not a proof";
    return parse_result::garbage;
  }
  words_to_bytes({record.getProof0(), record.getProof1(), record.getProof2(), record.getProof3()},
                 proof);
  return parse_result::frame;
}

parse_result parse_welcome(const uint8_t* data, size_t available, size_t* consumed,
                           outcome* result, uint8_t proof[32], const char** problem) {
  wire::schema::TcpWelcome::Reader welcome;
  const parse_result r = read_record<wire::schema::TcpWelcome>(
      data, available, "not a welcome", consumed, &welcome, problem);
  if (r != parse_result::frame) return r;
  if (welcome.getMagic() != welcome_magic) {
    *problem = "not a welcome";
    return parse_result::garbage;
  }
  switch (welcome.getOutcome()) {
    case wire::schema::TcpOutcome::ACCEPTED:
      *result = outcome::accepted;
      break;
    case wire::schema::TcpOutcome::DUPLICATE:
      *result = outcome::duplicate;
      break;
    case wire::schema::TcpOutcome::REFUSED:
      *result = outcome::refused;
      break;
    default:
      *problem = "a welcome with an unknown outcome";
      return parse_result::garbage;
  }
  words_to_bytes(
      {welcome.getProof0(), welcome.getProof1(), welcome.getProof2(), welcome.getProof3()}, proof);
  return parse_result::frame;
}

// -- writing --------------------------------------------------------------------------------------

namespace {

uint64_t word_at(const uint8_t* bytes, size_t index) {
  uint64_t word = 0;
  if (bytes != nullptr) std::memcpy(&word, bytes + index * sizeof(word), sizeof(word));
  return word;
}

}  // namespace

void record_writer::hello(uint16_t src_port, const ip_address& src_address, uint64_t src_id,
                          uint64_t dst_id, uint32_t window, const uint8_t nonce[16], void* dest) {
  auto& h = hello_.fields();
  h.setMagic(hello_magic);
  h.setVersion(hello_version);
  h.setSrcPort(src_port);
  h.setSrcAddress(src_address.ipv4());
  h.setSrcIpv6(src_address.is_v6());
  h.setSrcAddress6a(src_address.is_v6() ? word_at(src_address.bytes, 0) : 0);
  h.setSrcAddress6b(src_address.is_v6() ? word_at(src_address.bytes, 1) : 0);
  h.setSrcIfaceId(src_id);
  h.setDstIfaceId(dst_id);
  h.setWindow(window);
  h.setNonce0(word_at(nonce, 0));
  h.setNonce1(word_at(nonce, 1));
  hello_.copy_to(dest);
}

void record_writer::challenge(uint64_t own_id, bool keyed, const uint8_t nonce[16], void* dest) {
  auto& c = challenge_.fields();
  c.setMagic(challenge_magic);
  c.setVersion(hello_version);
  c.setKeyed(keyed);
  c.setIfaceId(own_id);
  c.setNonce0(word_at(nonce, 0));
  c.setNonce1(word_at(nonce, 1));
  challenge_.copy_to(dest);
}

void record_writer::proof(const uint8_t proof[32], void* dest) {
  auto& p = proof_.fields();
  p.setMagic(proof_magic);
  p.setProof0(word_at(proof, 0));
  p.setProof1(word_at(proof, 1));
  p.setProof2(word_at(proof, 2));
  p.setProof3(word_at(proof, 3));
  proof_.copy_to(dest);
}

void record_writer::welcome(outcome result, const uint8_t* proof, void* dest) {
  auto& w = welcome_.fields();
  w.setMagic(welcome_magic);
  w.setOutcome(static_cast<wire::schema::TcpOutcome>(result));
  w.setProof0(word_at(proof, 0));
  w.setProof1(word_at(proof, 1));
  w.setProof2(word_at(proof, 2));
  w.setProof3(word_at(proof, 3));
  welcome_.copy_to(dest);
}

}  // namespace comm::tl::tcp
