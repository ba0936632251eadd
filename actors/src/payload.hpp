// Payloads of frames, written and read with CAF's binary serializers: a message's optional sender
// handle and forwarding stack followed by the CAF message (type names, then values), and the exit
// reason of a down frame.
#pragma once

#include <caf/error.hpp>
#include <caf/execution_unit.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message.hpp>

#include <cstddef>
#include <vector>

namespace comm::actors::detail {

/// What a message frame's payload holds once read.
struct message_payload {
  caf::strong_actor_ptr sender;                   ///< with a sender handle in the payload
  caf::mailbox_element::forwarding_stack stages;  ///< with a forwarding stack
  caf::message content;                           ///< the message
};

/// Appends the payload of a message frame for `what` to `buf`: its sender's handle when
/// `with_sender`, its forwarding stack when `with_stages`, then its content. Local actor handles
/// written here become reachable by id (CAF puts them in the actor registry).
/// @returns an empty error, or why the content cannot be serialised (sec::unknown_type)
caf::error write_message_payload(caf::execution_unit* ctx, const caf::mailbox_element& what,
                                 bool with_sender, bool with_stages, std::vector<char>& buf);

/// Appends the payload of a message frame whose content is `content` and nothing else.
caf::error write_content_payload(caf::execution_unit* ctx, const caf::message& content,
                                 std::vector<char>& buf);

/// Reads a message frame's payload. Remote handles inside become proxies through ctx's proxy
/// registry. Every byte must be used, and the message must have `type_count` elements.
/// @returns an empty error, or what is wrong (sec::unknown_type for a type this node lacks)
caf::error read_message_payload(caf::execution_unit* ctx, const void* data, size_t length,
                                bool with_sender, bool with_stages, size_t type_count,
                                message_payload& out);

/// Appends the payload of a down frame: the exit reason.
caf::error write_reason_payload(caf::execution_unit* ctx, const caf::error& reason,
                                std::vector<char>& buf);

/// Reads a down frame's payload.
caf::error read_reason_payload(caf::execution_unit* ctx, const void* data, size_t length,
                               caf::error& reason);

}  // namespace comm::actors::detail
