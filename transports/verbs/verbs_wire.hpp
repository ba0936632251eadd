// What the verbs transport puts on the wire, as described by its schema (verbs.capnp): the
// VerbsMessageHeader in front of every SEND, the VerbsHandshake carried in rdmacm private data, and
// the VerbsIfaceAddress. All three are data-only Cap'n Proto structs: a sender encodes them with a
// long-lived wire::header_writer, a receiver reads them in place with wire::read_header (root
// pointer word and data length checked) and then validates every field before use.
#pragma once

#include <comm/wire/codec.hpp>
#include <endian.h>
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "verbs/verbs.capnp.h"

namespace comm::verbs {

/// What a SEND carries (VerbsMessageHeader.kind).
enum class message_kind : uint8_t {
  am = 1,     ///< an active message: header, then the payload
  grant = 2,  ///< credits only (sent when the receiver has nothing to piggy-back them on)
  release = 3,  ///< credits, and: the sender has no endpoint on this connection any more
  rndv_fin = 4,  ///< credits, and: the rendezvous op_id was fetched (the receiver's software did)
};

/// Bytes of the encoded VerbsMessageHeader in front of every SEND; the AM payload follows at this
/// offset (a multiple of 8, so it stays 8-byte aligned in a receive buffer).
inline constexpr size_t message_header_size =
    wire::header_size<wire::schema::VerbsMessageHeader>();
static_assert(message_header_size % 8 == 0);

/// A SEND header as read from the wire, after validation.
struct message_header {
  uint8_t am_id = 0;     ///< active-message id (kind am)
  message_kind kind = message_kind::am;  ///< what the SEND carries
  uint16_t credits = 0;  ///< receive buffers the sender reposted for the receiver since last
  uint32_t op_id = 0;    ///< the rendezvous a rndv_fin ends
};

/// Encodes SEND headers with one long-lived builder (one per interface; not thread-safe).
class message_header_writer {
public:
  /// Writes the header of a SEND to `dst` (message_header_size bytes) and returns that size.
  size_t write(void* dst, message_kind kind, uint8_t am_id, uint16_t credits,
               uint32_t op_id = 0) {
    auto& f = writer_.fields();
    f.setAmId(am_id);
    f.setKind(static_cast<uint8_t>(kind));
    f.setCredits(credits);
    f.setOpId(op_id);
    return writer_.copy_to(dst);
  }

private:
  wire::header_writer<wire::schema::VerbsMessageHeader> writer_;
};

/// Validates the first `length` bytes of a received SEND (8-byte aligned) as a header: a
/// well-formed root pointer with exactly our data section (the payload's offset is fixed), a known
/// kind, and an am id below `am_id_count` for an active message. Nothing when they are not one.
inline std::optional<message_header> parse_message_header(const void* data, size_t length,
                                                          unsigned am_id_count) {
  size_t consumed = 0;
  const auto reader = wire::read_header<wire::schema::VerbsMessageHeader>(data, length, &consumed);
  if (!reader || consumed != message_header_size) return std::nullopt;
  message_header h;
  h.am_id = reader->getAmId();
  h.credits = reader->getCredits();
  h.op_id = reader->getOpId();
  const uint8_t kind = reader->getKind();
  if (kind == static_cast<uint8_t>(message_kind::am)) {
    if (h.am_id >= am_id_count) return std::nullopt;
  } else if (kind == static_cast<uint8_t>(message_kind::rndv_fin)) {
    if (h.op_id == 0) return std::nullopt;
  } else if (kind != static_cast<uint8_t>(message_kind::grant) &&
             kind != static_cast<uint8_t>(message_kind::release)) {
    return std::nullopt;
  }
  h.kind = static_cast<message_kind>(kind);
  return h;
}

// -- tag matching: the TM headers rdma-core defines (infiniband/tm_types.h) --------------------
//
// With tag-matching SRQs every SEND starts with a 16-byte TMH (opcode, 3 reserved bytes that must
// be zero, app_ctx and tag, big-endian): NO_TAG in front of the VerbsMessageHeader of a grant,
// release or rndv_fin; EAGER with tag am_tag and app_ctx am_app_ctx, without an immediate value, in
// front of the VerbsMessageHeader of an active message (an active message may carry a tagged
// message the protocol layer matches in software, so it must count as unexpected on the
// receiver's device, as a NO_TAG one would not: the device then stops matching until the
// software has seen it); EAGER in front of a tagged eager payload (app_ctx: the high half of a
// non-zero immediate value, whose low half is the SEND's imm_data; or sw_rndv_app_ctx for a
// software rendezvous request); RNDV in front of a 16-byte RVH (the sender's address, rkey and
// length) and the rendezvous header (app_ctx: the sender's operation id); FIN, sent by the
// receiver's device, with the app_ctx of the RNDV it ends.

/// Bytes of a TMH.
inline constexpr size_t tmh_size = sizeof(ibv_tmh);
/// Bytes of an RVH.
inline constexpr size_t rvh_size = sizeof(ibv_rvh);
static_assert(tmh_size == 16 && rvh_size == 16);
/// app_ctx of a software rendezvous request (an EAGER TMH sent without an immediate value);
/// rendezvous operation ids never take it.
inline constexpr uint32_t sw_rndv_app_ctx = UINT32_MAX;
/// app_ctx of an active message's EAGER TMH (sent without an immediate value).
inline constexpr uint32_t am_app_ctx = UINT32_MAX - 1;
/// Tag of an active message's EAGER TMH. Posted receives that would accept it are never given to
/// the device (verbs_tag.hpp), so the device never matches an active message.
inline constexpr uint64_t am_tag = 0xa11c'e5e7'a6f0'0d1eull;

/// Writes a TMH to `dst` (tmh_size bytes).
inline void write_tmh(void* dst, ibv_tmh_op opcode, uint32_t app_ctx, uint64_t tag) {
  ibv_tmh h{};
  h.opcode = static_cast<uint8_t>(opcode);
  h.app_ctx = htobe32(app_ctx);
  h.tag = htobe64(tag);
  std::memcpy(dst, &h, sizeof(h));
}

/// Writes an RVH to `dst` (rvh_size bytes).
inline void write_rvh(void* dst, uint64_t address, uint32_t rkey, uint32_t length) {
  ibv_rvh h{};
  h.va = htobe64(address);
  h.rkey = htobe32(rkey);
  h.len = htobe32(length);
  std::memcpy(dst, &h, sizeof(h));
}

/// A message with a TMH as it landed in an ordinary receive buffer, after validation.
struct tagged_message {
  ibv_tmh_op opcode = IBV_TMH_NO_TAG;  ///< what follows the TMH
  uint32_t app_ctx = 0;                ///< the TMH's app_ctx
  uint64_t tag = 0;                    ///< the TMH's tag
  const uint8_t* payload = nullptr;    ///< after the TMH (and the RVH of a RNDV)
  size_t payload_length = 0;           ///< its bytes
  uint64_t address = 0;                ///< RNDV: the sender's buffer
  uint32_t rkey = 0;                   ///< RNDV: its rkey
  uint32_t length = 0;                 ///< RNDV: its length
};

/// Validates the `length` bytes at `data` as a message with a TMH: at least a TMH, reserved bytes
/// zero, a known opcode, a RNDV long enough for its RVH, a FIN with nothing after the TMH and a
/// non-zero app_ctx. Nothing when they are not one.
inline std::optional<tagged_message> parse_tagged(const void* data, size_t length) {
  if (data == nullptr || length < tmh_size) return std::nullopt;
  ibv_tmh h;
  std::memcpy(&h, data, sizeof(h));
  if (h.reserved[0] != 0 || h.reserved[1] != 0 || h.reserved[2] != 0) return std::nullopt;
  tagged_message m;
  m.app_ctx = be32toh(h.app_ctx);
  m.tag = be64toh(h.tag);
  m.payload = static_cast<const uint8_t*>(data) + tmh_size;
  m.payload_length = length - tmh_size;
  switch (h.opcode) {
    case IBV_TMH_NO_TAG:
    case IBV_TMH_EAGER:
      break;
    case IBV_TMH_FIN:
      if (m.payload_length != 0 || m.app_ctx == 0 || m.app_ctx == sw_rndv_app_ctx) {
        return std::nullopt;
      }
      break;
    case IBV_TMH_RNDV: {
      if (m.payload_length < rvh_size || m.app_ctx == 0 || m.app_ctx == sw_rndv_app_ctx) {
        return std::nullopt;
      }
      ibv_rvh r;
      std::memcpy(&r, m.payload, sizeof(r));
      m.address = be64toh(r.va);
      m.rkey = be32toh(r.rkey);
      m.length = be32toh(r.len);
      if (m.address + m.length < m.address) return std::nullopt;
      m.payload += rvh_size;
      m.payload_length -= rvh_size;
      break;
    }
    default:
      return std::nullopt;
  }
  m.opcode = static_cast<ibv_tmh_op>(h.opcode);
  return m;
}

/// One side's half of a connection handshake (client: in CONNECT; server: in ACCEPT), decoded.
struct handshake {
  uint32_t qp_num = 0;      ///< the sender's QP
  uint32_t psn = 0;         ///< the sender's starting PSN (24 bits)
  uint16_t lid = 0;         ///< the sender's LID (InfiniBand)
  uint8_t rd_atom = 0;      ///< RDMA READs the sender answers at once (its max_dest_rd_atomic)
  uint8_t mtu = 0;          ///< the sender's active MTU (ibv_mtu)
  uint8_t gid[16] = {};     ///< the sender's GID (RoCE)
  uint64_t iface_id = 0;    ///< the sender's interface
  uint16_t credits = 0;     ///< receive buffers the sender grants its peer
  uint8_t link_layer = 0;   ///< IBV_LINK_LAYER_*
};

/// Bytes of private data an rdmacm CONNECT carries (the smallest of connect, accept and reject).
inline constexpr size_t max_handshake_size = 56;
/// Bytes of an encoded handshake (root pointer and data section).
inline constexpr size_t handshake_size = wire::header_size<wire::schema::VerbsHandshake>();
static_assert(handshake_size <= max_handshake_size, "a handshake fits in a CONNECT's private data");

/// An encoded handshake, ready for rdma_conn_param::private_data.
struct encoded_handshake {
  alignas(8) uint8_t bytes[handshake_size] = {};  ///< the encoding
};

/// Encodes `h` (a builder per call: twice per connection, off the hot path).
inline encoded_handshake encode_handshake(const handshake& h) {
  wire::header_writer<wire::schema::VerbsHandshake> writer;
  auto& f = writer.fields();
  f.setQpNum(h.qp_num);
  f.setPsn(h.psn);
  f.setLid(h.lid);
  f.setRdAtom(h.rd_atom);
  f.setMtu(h.mtu);
  uint64_t gid[2];
  std::memcpy(gid, h.gid, sizeof(gid));
  f.setGid0(gid[0]);
  f.setGid1(gid[1]);
  f.setIfaceId(h.iface_id);
  f.setCredits(h.credits);
  f.setLinkLayer(h.link_layer);
  encoded_handshake out;
  writer.copy_to(out.bytes);
  return out;
}

/// Validates `length` bytes of private data (rdmacm zero-pads them to the field's size) as a
/// handshake; false when they are not one (bad root pointer, data short of the struct, or a field
/// out of range).
inline bool parse_handshake(const void* data, size_t length, handshake* out) {
  if (data == nullptr) return false;
  alignas(8) uint8_t copy[max_handshake_size * 4];  // private data carries no alignment promise
  length = std::min(length, sizeof(copy));          // the rest is the field's zero padding
  std::memcpy(copy, data, length);
  const auto r = wire::read_header<wire::schema::VerbsHandshake>(copy, length);
  if (!r) return false;
  out->qp_num = r->getQpNum();
  out->psn = r->getPsn();
  out->lid = r->getLid();
  out->rd_atom = r->getRdAtom();
  out->mtu = r->getMtu();
  const uint64_t gid[2] = {r->getGid0(), r->getGid1()};
  std::memcpy(out->gid, gid, sizeof(gid));
  out->iface_id = r->getIfaceId();
  out->credits = r->getCredits();
  out->link_layer = r->getLinkLayer();
  return out->qp_num != 0 && out->qp_num <= 0xffffff && out->psn <= 0xffffff &&
         out->iface_id != 0 && out->credits != 0 && out->mtu >= IBV_MTU_256 &&
         out->mtu <= IBV_MTU_4096;
}

/// The interface address, decoded: where the interface's connection listener is, and who it is.
struct iface_address_record {
  uint8_t link_layer = 0;      ///< IBV_LINK_LAYER_*
  uint64_t iface_id = 0;       ///< the interface
  sockaddr_in6 listener{};     ///< its rdmacm listener (a sockaddr_in in the first bytes for IPv4)
  bool tag_matching = false;   ///< its SRQ matches tags: SENDs to it start with a TMH
};

/// Encodes an interface address.
inline std::vector<uint8_t> encode_iface_address(const iface_address_record& rec) {
  wire::header_writer<wire::schema::VerbsIfaceAddress> writer;
  auto& f = writer.fields();
  f.setIfaceId(rec.iface_id);
  f.setLinkLayer(rec.link_layer);
  f.setTagMatching(rec.tag_matching);
  const bool ipv6 = rec.listener.sin6_family == AF_INET6;
  f.setIpv6(ipv6);
  f.setPort(rec.listener.sin6_port);
  uint64_t address6[2] = {0, 0};
  if (ipv6) {
    std::memcpy(address6, &rec.listener.sin6_addr, sizeof(address6));
    f.setScopeId(rec.listener.sin6_scope_id);
    f.setAddress4(0);
  } else {
    sockaddr_in v4;
    std::memcpy(&v4, &rec.listener, sizeof(v4));
    f.setAddress4(v4.sin_addr.s_addr);
    f.setScopeId(0);
  }
  f.setAddress6a(address6[0]);
  f.setAddress6b(address6[1]);
  std::vector<uint8_t> out(writer.size());
  writer.copy_to(out.data());
  return out;
}

/// Validates an interface address (exactly one encoded VerbsIfaceAddress, an interface id and a
/// listener port); false when it is not one.
inline bool parse_iface_address(const std::vector<uint8_t>& bytes, iface_address_record* out) {
  constexpr size_t size = wire::header_size<wire::schema::VerbsIfaceAddress>();
  if (bytes.size() != size) return false;
  alignas(8) uint8_t copy[size];
  std::memcpy(copy, bytes.data(), size);
  const auto r = wire::read_header<wire::schema::VerbsIfaceAddress>(copy, size);
  if (!r) return false;
  *out = iface_address_record{};
  out->iface_id = r->getIfaceId();
  out->link_layer = r->getLinkLayer();
  out->tag_matching = r->getTagMatching();
  if (r->getIpv6()) {
    out->listener.sin6_family = AF_INET6;
    out->listener.sin6_port = r->getPort();
    out->listener.sin6_scope_id = r->getScopeId();
    const uint64_t address6[2] = {r->getAddress6a(), r->getAddress6b()};
    std::memcpy(&out->listener.sin6_addr, address6, sizeof(address6));
  } else {
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    v4.sin_port = r->getPort();
    v4.sin_addr.s_addr = r->getAddress4();
    std::memcpy(&out->listener, &v4, sizeof(v4));
  }
  return out->iface_id != 0 && r->getPort() != 0;
}

}  // namespace comm::verbs
