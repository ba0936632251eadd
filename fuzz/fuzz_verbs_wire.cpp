// Fuzzes the verbs transport's wire parsers (transports/verbs/verbs_wire.hpp): the header in front
// of every SEND a peer posts, the handshake in a peer's rdmacm private data, and an interface
// address from the bootstrap. They need no device: the bytes are what the wire or the address
// exchange delivered.
//
// Input: one byte choosing the parser, then the bytes as they arrived (copied 8-byte aligned, as in
// a receive buffer; the handshake parser promises to cope without alignment and gets them one byte
// off). Whatever a parser accepts must be inside its documented bounds, and must survive a round
// trip: encoded again with the sender's encoder and parsed again, it gives the same fields.
#include "check.hpp"
#include "seeds.hpp"
#include "verbs/verbs_wire.hpp"

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using comm::fuzz::require;

using namespace comm::verbs;

constexpr unsigned am_ids = comm::tl::am_id_count;

void fuzz_message_header(const uint8_t* data, size_t size) {
  const auto h = parse_message_header(data, size, am_ids);
  if (!h) return;
  require(size >= message_header_size, "a header accepted from fewer bytes than it has");
  require(h->kind == message_kind::am || h->kind == message_kind::grant ||
              h->kind == message_kind::release,
          "a header of an unknown kind");
  require(h->kind != message_kind::am || h->am_id < am_ids, "an am header with a bad am id");
  alignas(8) uint8_t again[message_header_size];
  message_header_writer writer;
  require(writer.write(again, h->kind, h->am_id, h->credits) == message_header_size,
          "the writer wrote another size");
  const auto back = parse_message_header(again, sizeof(again), am_ids);
  require(back && back->kind == h->kind && back->am_id == h->am_id && back->credits == h->credits,
          "a header does not survive its round trip");
}

bool same_handshake(const handshake& a, const handshake& b) {
  return a.qp_num == b.qp_num && a.psn == b.psn && a.lid == b.lid && a.rd_atom == b.rd_atom &&
         a.mtu == b.mtu && std::memcmp(a.gid, b.gid, sizeof(a.gid)) == 0 &&
         a.iface_id == b.iface_id && a.credits == b.credits && a.link_layer == b.link_layer;
}

void fuzz_handshake(const uint8_t* data, size_t size) {
  handshake h;
  if (!parse_handshake(data, size, &h)) return;
  require(h.qp_num != 0 && h.qp_num <= 0xffffff && h.psn <= 0xffffff && h.iface_id != 0 &&
              h.credits != 0 && h.mtu >= IBV_MTU_256 && h.mtu <= IBV_MTU_4096,
          "a handshake accepted with a field out of range");
  const encoded_handshake again = encode_handshake(h);
  handshake back;
  require(parse_handshake(again.bytes, sizeof(again.bytes), &back) && same_handshake(h, back),
          "a handshake does not survive its round trip");
}

bool same_address(const iface_address_record& a, const iface_address_record& b) {
  return a.link_layer == b.link_layer && a.iface_id == b.iface_id &&
         std::memcmp(&a.listener, &b.listener, sizeof(a.listener)) == 0;
}

void fuzz_iface_address(const uint8_t* data, size_t size) {
  iface_address_record rec;
  if (!parse_iface_address(std::vector<uint8_t>(data, data + size), &rec)) return;
  require(rec.iface_id != 0 && rec.listener.sin6_port != 0,
          "an address accepted without an id or a port");
  require(rec.listener.sin6_family == AF_INET6 || rec.listener.sin6_family == AF_INET,
          "an address of an unknown family");
  iface_address_record back;
  require(parse_iface_address(encode_iface_address(rec), &back) && same_address(rec, back),
          "an address does not survive its round trip");
}

handshake sample_handshake() {
  handshake h;
  h.qp_num = 0x1234;
  h.psn = 0xabcdef;
  h.lid = 7;
  h.rd_atom = 16;
  h.mtu = IBV_MTU_4096;
  for (uint8_t i = 0; i < 16; ++i) h.gid[i] = i;
  h.iface_id = 0x1122334455667788ull;
  h.credits = 64;
  h.link_layer = IBV_LINK_LAYER_ETHERNET;
  return h;
}

/// The seeds: each parser's input as its encoder writes it.
std::vector<comm::fuzz::seed> make_seeds() {
  std::vector<comm::fuzz::seed> seeds;
  message_header_writer writer;
  for (message_kind kind : {message_kind::am, message_kind::grant, message_kind::release}) {
    comm::fuzz::seed s{0};
    alignas(8) uint8_t header[message_header_size];
    writer.write(header, kind, kind == message_kind::am ? 3 : 0, 17);
    comm::fuzz::append(s, header, sizeof(header));
    if (kind == message_kind::am) s.insert(s.end(), {'p', 'a', 'y', 'l', 'o', 'a', 'd', 0});
    seeds.push_back(s);
  }
  comm::fuzz::seed hs{1};
  const encoded_handshake encoded = encode_handshake(sample_handshake());
  comm::fuzz::append(hs, encoded.bytes, sizeof(encoded.bytes));
  hs.resize(1 + max_handshake_size, 0);  // rdmacm's zero padding
  seeds.push_back(hs);
  iface_address_record v4;
  v4.iface_id = 42;
  v4.link_layer = IBV_LINK_LAYER_ETHERNET;
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(4791);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::memcpy(&v4.listener, &in, sizeof(in));
  iface_address_record v6;
  v6.iface_id = 43;
  v6.link_layer = IBV_LINK_LAYER_INFINIBAND;
  v6.listener.sin6_family = AF_INET6;
  v6.listener.sin6_port = htons(4792);
  v6.listener.sin6_addr = in6addr_loopback;
  v6.listener.sin6_scope_id = 2;
  for (const iface_address_record& rec : {v4, v6}) {
    comm::fuzz::seed s{2};
    const std::vector<uint8_t> bytes = encode_iface_address(rec);
    comm::fuzz::append(s, bytes.data(), bytes.size());
    seeds.push_back(s);
  }
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t choice = data[0] % 3;
  const size_t length = size - 1;
  // 8-byte aligned, as in a receive buffer (one byte more for the unaligned handshake).
  std::vector<uint64_t> words(length / 8 + 2);
  auto* aligned = reinterpret_cast<uint8_t*>(words.data());
  switch (choice) {
    case 0:
      std::memcpy(aligned, data + 1, length);
      fuzz_message_header(aligned, length);
      break;
    case 1:
      std::memcpy(aligned + 1, data + 1, length);
      fuzz_handshake(aligned + 1, length);
      break;
    default:
      fuzz_iface_address(data + 1, length);
      break;
  }
  return 0;
}
