// Envelope and hello codecs (see frame.hpp).
#include "frame.hpp"
#include "payload.hpp"

#include <caf/binary_serializer.hpp>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

namespace comm::actors::detail {

namespace {

/// "COMMACT" and protocol version 1.
constexpr uint64_t hello_magic = 0x434f4d4d41435401ull;

/// The largest frame kind.
constexpr uint8_t last_kind = static_cast<uint8_t>(frame_kind::release);

}  // namespace

const void* envelope_writer::encode(const frame_header& h) {
  auto f = writer_.fields();
  f.setKind(static_cast<uint8_t>(h.kind));
  f.setFlags(h.flags);
  f.setStatus(h.status);
  f.setSeq(h.seq);
  f.setSender(h.sender);
  f.setReceiver(h.receiver);
  f.setMessageId(h.message_id);
  f.setTypeCount(h.type_count);
  f.setAttached(h.attached);
  return writer_.bytes();
}

std::optional<frame_header> decode_envelope(const void* data, size_t length) {
  // The header arrives wherever the transport put it: copy it to aligned words first.
  alignas(8) uint8_t words[envelope_writer::size()];
  if (data == nullptr || length != sizeof(words)) return std::nullopt;
  std::memcpy(words, data, sizeof(words));
  auto r = wire::read_header<wire::schema::ActorEnvelope>(words, sizeof(words));
  if (!r || r->getKind() == 0 || r->getKind() > last_kind) return std::nullopt;
  frame_header h;
  h.kind = static_cast<frame_kind>(r->getKind());
  h.flags = r->getFlags();
  h.status = r->getStatus();
  h.seq = r->getSeq();
  h.sender = r->getSender();
  h.receiver = r->getReceiver();
  h.message_id = r->getMessageId();
  h.type_count = r->getTypeCount();
  h.attached = r->getAttached();
  return h;
}

std::vector<uint8_t> encode_hello(caf::actor_system& sys, const node_hello& hello) {
  std::vector<char> id;
  caf::binary_serializer sink{sys, id};
  if (sink(const_cast<caf::node_id&>(hello.id))) return {};
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<wire::schema::ActorNodeHello>();
  root.setMagic(hello_magic);
  root.setNodeId(kj::arrayPtr(reinterpret_cast<const uint8_t*>(id.data()), id.size()));
  root.setAddress(hello.address);
  const auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

std::optional<node_hello> decode_hello(caf::actor_system& sys, const uint8_t* data,
                                       size_t length) {
  std::optional<node_hello> out;
  std::vector<char> id;
  const bool valid = wire::read_checked_message<wire::schema::ActorNodeHello>(
      data, length, [&](wire::schema::ActorNodeHello::Reader root) {
        if (root.getMagic() != hello_magic) return;
        auto bytes = root.getNodeId();
        id.assign(bytes.begin(), bytes.end());
        out = node_hello{caf::node_id{}, std::string(root.getAddress().cStr())};
      });
  if (!valid || !out) return std::nullopt;
  attachment_source none;
  if (read_guarded(sys.dummy_execution_unit(), id.data(), id.size(), none,
                   [&](frame_deserializer& source) { return source(out->id); }) ||
      !out->id) {
    return std::nullopt;
  }
  return out;
}

void encode_interface(const interface& ifs, std::vector<char>& buf) {
  for (const auto& signature : ifs) {
    const auto n = static_cast<uint32_t>(signature.size());
    for (int shift = 0; shift < 32; shift += 8) buf.push_back(static_cast<char>(n >> shift));
    buf.insert(buf.end(), signature.begin(), signature.end());
  }
}

bool decode_interface(const void* data, size_t length, interface& out) {
  if (length > max_interface_bytes) return false;
  const auto* bytes = static_cast<const unsigned char*>(data);
  size_t at = 0;
  while (at < length) {
    if (length - at < 4) return false;
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(bytes[at + i]) << (8 * i);
    at += 4;
    if (n > length - at) return false;
    out.emplace(reinterpret_cast<const char*>(bytes + at), n);
    at += n;
  }
  return true;
}

}  // namespace comm::actors::detail
