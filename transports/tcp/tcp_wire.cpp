#include "tcp/tcp_wire.hpp"

#include "base/host_identity.hpp"

#include <arpa/inet.h>

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

device_addr device_addr::local(uint32_t ipv4) {
  device_addr addr;
  addr.ipv4 = ipv4;
  const host_identity& me = local_host_identity();
  std::memcpy(addr.boot_id, me.boot_id, sizeof(addr.boot_id));
  addr.net_ns = me.net_ns;
  return addr;
}

std::vector<uint8_t> device_addr::pack() const { return to_bytes(*this); }

std::optional<device_addr> device_addr::unpack(const std::vector<uint8_t>& bytes) {
  auto addr = from_bytes<device_addr>(bytes);
  if (addr && addr->ipv4 == 0) return std::nullopt;
  return addr;
}

bool device_addr::loopback() const { return (ntohl(ipv4) >> 24) == 127; }

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
  if (id >= am_id_count) {
    out->problem = "unknown am id";
    return parse_result::garbage;
  }
  if (length > max_frame_payload) {
    out->problem = "frame length beyond max_zcopy";
    return parse_result::garbage;
  }
  out->id = id;
  out->ack = header->getAckRequested();
  out->header_bytes = bytes;
  out->length = length;
  out->total = bytes + pad8(length);
  return parse_result::frame;
}

parse_result parse_ack(const uint8_t* data, size_t available, size_t* consumed,
                       uint64_t* delivered) {
  size_t bytes = 0;
  const parse_result extent = check_extent<wire::schema::TcpAck>(data, available, &bytes);
  if (extent != parse_result::frame) return extent;
  const auto ack = wire::read_header<wire::schema::TcpAck>(data, available);
  if (!ack) return parse_result::garbage;
  *consumed = bytes;
  *delivered = ack->getDelivered();
  return parse_result::frame;
}

parse_result parse_hello(const uint8_t* data, size_t available, uint64_t own_id, size_t* consumed,
                         uint16_t* peer_port, uint32_t* peer_ipv4, const char** problem) {
  size_t bytes = 0;
  const parse_result extent = check_extent<wire::schema::TcpHello>(data, available, &bytes);
  if (extent != parse_result::frame) {
    if (extent == parse_result::garbage) *problem = "not a hello";
    return extent;
  }
  const auto hello = wire::read_header<wire::schema::TcpHello>(data, available);
  if (!hello || hello->getMagic() != hello_magic) {
    *problem = "not a hello";
    return parse_result::garbage;
  }
  if (hello->getVersion() != hello_version) {
    *problem = "unsupported protocol version";
    return parse_result::garbage;
  }
  if (hello->getDstIfaceId() != own_id) {
    *problem = "hello for another interface";
    return parse_result::garbage;
  }
  *consumed = bytes;
  *peer_port = hello->getSrcPort();
  *peer_ipv4 = hello->getSrcAddress();
  return parse_result::frame;
}

}  // namespace comm::tl::tcp
