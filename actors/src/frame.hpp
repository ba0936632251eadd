// Frames between nodes: the envelope fields (schema ActorEnvelope) with their encoder and checked
// decoder, and the hello each side of a connection puts in the connection manager's private data
// (schema ActorNodeHello).
#pragma once

#include <comm/wire/codec.hpp>

#include <caf/actor_system.hpp>
#include <caf/node_id.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "schema/actor.capnp.h"

namespace comm::actors::detail {

/// Active-message id of every frame of the actor protocol.
inline constexpr uint16_t frame_am_id = 0xAC70;

/// What a frame asks of its receiver.
enum class frame_kind : uint8_t {
  message = 1,      ///< deliver a CAF message to `receiver`
  monitor = 2,      ///< the sender made a proxy of `receiver`: report its termination
  down = 3,         ///< actor `sender` terminated; the payload is the reason
  link = 4,         ///< `sender` (on the sending node) linked itself to `receiver`
  unlink = 5,       ///< `sender` removed that link
  lookup = 6,       ///< which actor is published under the name in the payload?
  lookup_reply = 7, ///< the answer: `receiver` (0: none, `status` says why)
  release = 8,      ///< the sender lets go of blobs lent to it (lending.hpp): the ids in the payload
};

/// Where the sender of a message lives (the low two bits of the envelope's flags).
enum class sender_location : uint8_t {
  none = 0,            ///< anonymous message
  sending_node = 1,    ///< an actor of the node that sent the frame; `sender` is its id
  receiving_node = 2,  ///< an actor of the receiving node; `sender` is its id
  in_payload = 3,      ///< elsewhere: its handle (node id and actor id) leads the payload
};

/// Envelope flag: the payload carries a forwarding stack after the sender's handle.
inline constexpr uint8_t flag_stages = 1u << 2;

/// Envelope flag of a message: its attachments are lent (lending.hpp); the payload follows the
/// envelope in the AM header and the AM's data describes the lends (schema ActorLends).
inline constexpr uint8_t flag_lent = 1u << 3;

/// The fields of an envelope.
struct frame_header {
  frame_kind kind = frame_kind::message;
  uint8_t flags = 0;
  int16_t status = 0;
  uint32_t seq = 0;
  uint64_t sender = 0;
  uint64_t receiver = 0;
  uint64_t message_id = 0;
  uint16_t type_count = 0;
  uint64_t attached = 0;  ///< bytes of attachments at the end of the frame's data

  /// Where the sender lives.
  sender_location location() const noexcept {
    return static_cast<sender_location>(flags & 3u);
  }
  /// Sets where the sender lives.
  void set_location(sender_location where) noexcept {
    flags = static_cast<uint8_t>((flags & ~3u) | static_cast<uint8_t>(where));
  }
};

/// Encodes envelopes without constructing a Cap'n Proto builder per frame. One per thread.
class envelope_writer {
public:
  /// Encodes `h`; the bytes stay valid until the next call.
  const void* encode(const frame_header& h);
  /// Encoded length in bytes.
  static constexpr size_t size() { return wire::header_writer<wire::schema::ActorEnvelope>::size(); }

private:
  wire::header_writer<wire::schema::ActorEnvelope> writer_;
};

/// Decodes an envelope received from a peer (any alignment). Nothing for bytes that are not a
/// well-formed envelope or name an unknown kind.
std::optional<frame_header> decode_envelope(const void* data, size_t length);

/// The hello of a node: what a connection's private data says about its sender.
struct node_hello {
  caf::node_id id;      ///< the sender's node id
  std::string address;  ///< where it listens, or empty
};

/// Encodes the hello of this node for the connection manager's private data.
std::vector<uint8_t> encode_hello(caf::actor_system& sys, const node_hello& hello);

/// Decodes a peer's hello; nothing when the bytes are not one (or another protocol version's).
std::optional<node_hello> decode_hello(caf::actor_system& sys, const uint8_t* data, size_t length);

/// A typed actor's messaging interface as CAF describes it (actor_system::message_types).
using interface = std::set<std::string>;

/// Longest interface a lookup reply may carry, in bytes.
inline constexpr size_t max_interface_bytes = size_t{1} << 20;

/// Appends `ifs` to `buf` (the payload of a lookup reply): each signature as a 4-byte
/// little-endian length and its bytes.
void encode_interface(const interface& ifs, std::vector<char>& buf);

/// Decodes a lookup reply's payload into `out`.
/// @returns false when the bytes are not an interface (lengths that do not add up, more than
///          max_interface_bytes)
bool decode_interface(const void* data, size_t length, interface& out);

}  // namespace comm::actors::detail
