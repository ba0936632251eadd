// Payloads of frames, written and read with CAF's binary serializers: a message's optional sender
// handle and forwarding stack followed by the CAF message in CAF's own format (a list of type
// names, then the values), and the exit reason of a down frame.
//
// Finding a message's type names costs CAF more than its values: message::save builds the name
// list per message, and message::load looks every name up among all types by string comparison.
// content_writer and content_reader produce and read the same bytes but remember the names of the
// message types they saw, so a stream of messages of one type pays for its names once.
//
// Messages made only of "plain" values (CAF's builtin integers, bool, float, double, atoms,
// std::string and std::vector<char> shorter than attach_threshold) are also written and read
// directly, byte for byte as CAF's binary serialiser does (floats and doubles as pack_real
// writes them), without a serialiser's virtual calls and per-value error objects; anything else
// takes the generic path.
//
// Bytes from peers are read here (read_message_payload, read_reason_payload, split_frame) and by
// decode_envelope and decode_hello (frame.hpp): each works on a byte buffer, with an actor
// system's execution unit but no running node, and all CAF-format reading goes through
// read_guarded.
#pragma once

#include "attachments.hpp"
#include "frame.hpp"

#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/execution_unit.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include <cstddef>
#include <exception>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace comm::actors::detail {

/// Writes a CAF message as message::save does, remembering the type names of the last type.
class content_writer {
public:
  /// Writes `x` to `sink`.
  /// @returns an empty error, or sec::unknown_type for a type the system has no name for
  caf::error write(caf::serializer& sink, const caf::type_erased_tuple& x);

  /// Appends `x` to `buf` directly when all its values are plain (see the file comment).
  /// @returns true when written; false (with `buf` unchanged) when `x` needs write()
  bool write_plain(caf::actor_system& sys, const caf::type_erased_tuple& x,
                   std::vector<char>& buf);

private:
  /// Makes names_ name the types of `x` (rebuilding it when they differ from the last ones).
  caf::error prepare(caf::actor_system& sys, const caf::type_erased_tuple& x);

  /// Rebuilds names_ for the types of `x`.
  caf::error name(caf::actor_system& sys, const caf::type_erased_tuple& x);

  std::vector<std::pair<uint16_t, const std::type_info*>> types_;  ///< of the last message
  std::string names_;  ///< their names, as CAF writes them ("@<>+@atom+@i64")
};

/// Reads a CAF message as message::load does, remembering a default value of every type per
/// list of type names seen (up to a bound), to copy instead of looking names up.
class content_reader {
public:
  /// Reads a message from `source` into `out`. With `frame` (which must be `source`), large
  /// std::vector<char> and std::string elements are filled from their attachments directly.
  /// @returns an empty error, or sec::unknown_type (with the name) for a type this system lacks
  caf::error read(caf::deserializer& source, caf::message& out,
                  frame_deserializer* frame = nullptr);

  /// Reads a message that is all of `data`/`length` directly when all its values are plain
  /// (see the file comment).
  /// @returns true when read into `out`; false (with `out` unchanged) when the bytes need read(),
  ///          which also reports what is wrong with them
  bool read_plain(caf::actor_system& sys, const char* data, size_t length, caf::message& out);

  /// Default values this reader keeps for the name lists it remembers.
  size_t remembered_values() const noexcept;

private:
  /// Default values of the types of one name list.
  struct prototypes {
    std::vector<caf::type_erased_value_ptr> values;  ///< one per type, in order
    bool plain = false;                              ///< all of plain types
  };

  /// The prototypes of the types named by names_, made on first use and remembered unless the
  /// list is long; null when a name is unknown (`err` then says which).
  const prototypes* lookup(caf::actor_system& sys, caf::error& err);

  /// The prototypes of the `length` names at `names`: the last list's without looking further
  /// when they are the same; null when not known to this system.
  const prototypes* lookup(caf::actor_system& sys, const char* names, size_t length);

  std::string names_;  ///< the names just read
  std::unordered_map<std::string, prototypes> known_;
  std::string last_names_;           ///< the names of the list read last
  const prototypes* last_ = nullptr;  ///< its prototypes (an entry of known_), or null
  prototypes long_list_;              ///< those of the last list too long to remember
};

/// What a message frame's payload holds once read.
struct message_payload {
  caf::strong_actor_ptr sender;                   ///< with a sender handle in the payload
  caf::mailbox_element::forwarding_stack stages;  ///< with a forwarding stack
  caf::message content;                           ///< the message
};

/// Appends the payload of a message frame for `what` to `buf`: its sender's handle when
/// `with_sender`, its forwarding stack when `with_stages`, then its content; large raw runs go to
/// `attached` (see attachments.hpp). Local actor handles written here become reachable by id (CAF
/// puts them in the actor registry).
/// @returns an empty error, or why the content cannot be serialised (sec::unknown_type)
caf::error write_message_payload(caf::execution_unit* ctx, content_writer& writer,
                                 const caf::mailbox_element& what, bool with_sender,
                                 bool with_stages, std::vector<char>& buf,
                                 attachment_list& attached);

/// Appends the payload of a message frame whose content is `content` and nothing else.
caf::error write_content_payload(caf::execution_unit* ctx, const caf::message& content,
                                 std::vector<char>& buf);

/// A received frame's payload and attachments (split_frame).
struct frame_parts {
  const void* payload = nullptr;
  size_t length = 0;
  attachment_source attached;
};

/// Finds the payload and the attachments of a frame with envelope `h`, received as an AM with
/// `header` (the envelope, then the payload when the frame has one attachment) and `data`: the
/// payload, then `h.attached` bytes of attachments. `owner`: the worker whose persistent AM data
/// `data` is (attachments taken by reference then detach it), or null.
/// @returns false when the lengths do not add up or a frame other than a message has attachments
bool split_frame(const frame_header& h, const void* header, size_t header_length, void* data,
                 size_t length, comm::worker* owner, frame_parts& out);

/// The one way the node reads CAF's binary format from bytes a peer sent (message payloads, exit
/// reasons, node ids): `read(source)` on a frame_deserializer of `data`/`length` and `attached`,
/// so that no sequence claims more than the bytes left and no nesting takes more than
/// max_read_stack; an error CAF dropped still fails the read; what CAF throws (bad_alloc, a variant
/// index out of range) becomes an error; and every byte, attachments included, must be used.
/// @returns an empty error, or what is wrong with the bytes
template <class Read>
caf::error read_guarded(caf::execution_unit* ctx, const void* data, size_t length,
                        attachment_source& attached, Read&& read) {
  try {
    frame_deserializer source{ctx, data, length, attached};
    if (auto err = read(source)) return err;
    if (source.failure()) return source.failure();
    if (source.remaining() == 0 && attached.remaining() == 0) return caf::error{};
    return caf::make_error(caf::sec::invalid_argument, "bytes left over in a payload");
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::invalid_argument, e.what());
  }
}

/// Reads a message frame's payload, taking its large runs from `attached`. Remote handles inside
/// become proxies through ctx's proxy registry. Messages of plain values take a direct reader
/// (iterative, every read checked against the bytes left), others read_guarded. Every byte,
/// attachments included, must be used, and the message must have `type_count` elements. A
/// caf::duration of a time unit CAF does not know (its to_string would read out of bounds) makes
/// the payload unreadable, at any depth.
/// @returns an empty error, or what is wrong (sec::unknown_type for a type this node lacks)
caf::error read_message_payload(caf::execution_unit* ctx, content_reader& reader,
                                const void* data, size_t length, attachment_source& attached,
                                bool with_sender, bool with_stages, size_t type_count,
                                message_payload& out);

/// Appends the payload of a down frame: the exit reason.
caf::error write_reason_payload(caf::execution_unit* ctx, const caf::error& reason,
                                std::vector<char>& buf);

/// Reads a down frame's payload (read_guarded); durations are checked as in read_message_payload.
caf::error read_reason_payload(caf::execution_unit* ctx, const void* data, size_t length,
                               caf::error& reason);

}  // namespace comm::actors::detail
