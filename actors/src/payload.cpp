// Payload serialisation with CAF's binary serializers (see payload.hpp).
#include "payload.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/sec.hpp>

namespace comm::actors::detail {

caf::error write_message_payload(caf::execution_unit* ctx, const caf::mailbox_element& what,
                                 bool with_sender, bool with_stages, std::vector<char>& buf) {
  caf::binary_serializer sink{ctx, buf};
  if (with_sender) {
    caf::strong_actor_ptr sender = what.sender;
    if (auto err = sink(sender)) return err;
  }
  if (with_stages) {
    auto stages = what.stages;
    if (auto err = sink(stages)) return err;
  }
  return caf::message::save(sink, what.content());
}

caf::error write_content_payload(caf::execution_unit* ctx, const caf::message& content,
                                 std::vector<char>& buf) {
  caf::binary_serializer sink{ctx, buf};
  return caf::message::save(sink, content);
}

caf::error read_message_payload(caf::execution_unit* ctx, const void* data, size_t length,
                                bool with_sender, bool with_stages, size_t type_count,
                                message_payload& out) {
  caf::binary_deserializer source{ctx, static_cast<const char*>(data), length};
  if (with_sender) {
    if (auto err = source(out.sender)) return err;
  }
  if (with_stages) {
    if (auto err = source(out.stages)) return err;
  }
  if (auto err = out.content.load(source)) return err;
  if (source.remaining() != 0 || out.content.size() != type_count) {
    return caf::make_error(caf::sec::invalid_argument, "malformed message payload");
  }
  return caf::error{};
}

caf::error write_reason_payload(caf::execution_unit* ctx, const caf::error& reason,
                                std::vector<char>& buf) {
  caf::binary_serializer sink{ctx, buf};
  caf::error copy = reason;
  return sink(copy);
}

caf::error read_reason_payload(caf::execution_unit* ctx, const void* data, size_t length,
                               caf::error& reason) {
  caf::binary_deserializer source{ctx, static_cast<const char*>(data), length};
  if (auto err = source(reason)) return err;
  if (source.remaining() != 0) {
    return caf::make_error(caf::sec::invalid_argument, "malformed down payload");
  }
  return caf::error{};
}

}  // namespace comm::actors::detail
