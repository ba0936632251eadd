// Fuzzes the verbs transport's wire parsers (transports/verbs/verbs_wire.hpp): the header in front
// of every SEND a peer posts, the handshake in a peer's rdmacm private data, an interface address
// from the bootstrap, and a message with a TM header (TMH, and the RVH of a rendezvous) as it
// lands in a receive buffer of a tag-matching SRQ. They need no device: the bytes are what the
// wire or the address exchange delivered.
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
              h->kind == message_kind::release || h->kind == message_kind::rndv_fin,
          "a header of an unknown kind");
  require(h->kind != message_kind::am || h->am_id < am_ids, "an am header with a bad am id");
  alignas(8) uint8_t again[message_header_size];
  message_header_writer writer;
  require(writer.write(again, h->kind, h->am_id, h->credits) == message_header_size,
          "the writer wrote another size");
  require(h->kind != message_kind::rndv_fin || h->op_id != 0, "an rndv_fin without an op id");
  alignas(8) uint8_t again2[message_header_size];
  writer.write(again2, h->kind, h->am_id, h->credits, h->op_id);
  const auto back = parse_message_header(again2, sizeof(again2), am_ids);
  require(back && back->kind == h->kind && back->am_id == h->am_id &&
              back->credits == h->credits && back->op_id == h->op_id,
          "a header does not survive its round trip");
}

void fuzz_tagged(const uint8_t* data, size_t size) {
  const auto m = parse_tagged(data, size);
  if (!m) return;
  require(size >= tmh_size, "a TM message accepted from fewer bytes than a TMH");
  require(m->payload >= data && m->payload + m->payload_length == data + size,
          "a TM message's payload outside its bytes");
  const bool rndv = m->opcode == IBV_TMH_RNDV;
  require(!rndv || (m->payload_length + tmh_size + rvh_size == size &&
                    m->address + m->length >= m->address && m->app_ctx != 0),
          "a rendezvous accepted without its RVH or with a wrapping range");
  require(m->opcode != IBV_TMH_FIN || (size == tmh_size && m->app_ctx != 0),
          "a FIN accepted with a payload or no operation");
  std::vector<uint8_t> again(size);
  write_tmh(again.data(), m->opcode, m->app_ctx, m->tag);
  if (rndv) write_rvh(again.data() + tmh_size, m->address, m->rkey, m->length);
  std::memcpy(again.data() + size - m->payload_length, m->payload, m->payload_length);
  const auto back = parse_tagged(again.data(), again.size());
  require(back && back->opcode == m->opcode && back->app_ctx == m->app_ctx &&
              back->tag == m->tag && back->address == m->address && back->rkey == m->rkey &&
              back->length == m->length && back->payload_length == m->payload_length,
          "a TM message does not survive its round trip");
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
         a.tag_matching == b.tag_matching &&
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
  v6.tag_matching = true;
  for (const iface_address_record& rec : {v4, v6}) {
    comm::fuzz::seed s{2};
    const std::vector<uint8_t> bytes = encode_iface_address(rec);
    comm::fuzz::append(s, bytes.data(), bytes.size());
    seeds.push_back(s);
  }
  // TM messages: an eager one, a rendezvous with its RVH and a header, a FIN, and an active
  // message behind a NO_TAG TMH; then an rndv_fin header.
  const uint8_t payload[] = {'t', 'a', 'g', 'g', 'e', 'd', 0, 1};
  for (ibv_tmh_op op : {IBV_TMH_EAGER, IBV_TMH_RNDV, IBV_TMH_FIN, IBV_TMH_NO_TAG}) {
    comm::fuzz::seed s{3};
    uint8_t bytes[tmh_size + rvh_size];
    write_tmh(bytes, op, op == IBV_TMH_EAGER ? 0 : 7, 0x1234567890abcdefull);
    comm::fuzz::append(s, bytes, tmh_size);
    if (op == IBV_TMH_RNDV) {
      write_rvh(bytes + tmh_size, 0x7f0000001000ull, 0x1234, 300000);
      comm::fuzz::append(s, bytes + tmh_size, rvh_size);
    }
    if (op == IBV_TMH_NO_TAG) {
      alignas(8) uint8_t header[message_header_size];
      writer.write(header, message_kind::am, 3, 1);
      comm::fuzz::append(s, header, sizeof(header));
    }
    if (op != IBV_TMH_FIN) comm::fuzz::append(s, payload, sizeof(payload));
    seeds.push_back(s);
  }
  comm::fuzz::seed fin{0};
  alignas(8) uint8_t header[message_header_size];
  writer.write(header, message_kind::rndv_fin, 0, 2, 99);
  comm::fuzz::append(fin, header, sizeof(header));
  seeds.push_back(fin);
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t choice = data[0] % 4;
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
    case 2:
      fuzz_iface_address(data + 1, length);
      break;
    default:
      std::memcpy(aligned, data + 1, length);
      fuzz_tagged(aligned, length);
      break;
  }
  return 0;
}
