// Payload serialisation with CAF's binary serializers (see payload.hpp).
#include "payload.hpp"

#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/detail/dynamic_message_data.hpp>
#include <caf/sec.hpp>
#include <caf/uniform_type_info_map.hpp>

#include <algorithm>
#include <exception>

namespace comm::actors::detail {

namespace {

/// Name lists a content_reader remembers at most (then it starts over).
constexpr size_t max_known_lists = 256;

/// The name list of a message without elements.
constexpr const char* empty_names = "@<>";

/// True for the types whose large contents are read from their attachments straight into the
/// message's element: std::vector<char> and std::string.
bool is_byte_run(caf::rtti_pair rtti) {
  return rtti.first == caf::type_nr<std::vector<char>>::value ||
         rtti.first == caf::type_nr<std::string>::value;
}

/// Reads a std::vector<char> or std::string element into `value`, from its attachment when it
/// has one (one copy, no zero fill before it).
caf::error read_byte_run(detail::frame_deserializer& source, caf::type_erased_value& value) {
  size_t size = 0;
  if (auto err = source.begin_sequence(size)) return err;
  const bool attached = source.attachments().has(size);
  if (!attached && size > source.remaining()) return caf::sec::end_of_stream;
  const char* from = attached ? source.attachments().next(size) : nullptr;
  void* x = value.get_mutable();
  if (value.type().first == caf::type_nr<std::string>::value) {
    auto& str = *static_cast<std::string*>(x);
    if (attached) {
      str.assign(from, size);
    } else {
      str.resize(size);
      if (auto err = source.apply_raw(size, str.data())) return err;
    }
  } else {
    auto& vec = *static_cast<std::vector<char>*>(x);
    if (attached) {
      vec.assign(from, from + size);
    } else {
      vec.resize(size);
      if (auto err = source.apply_raw(size, vec.data())) return err;
    }
  }
  return source.end_sequence();
}

}  // namespace

// -- content_writer ------------------------------------------------------------------------------

caf::error content_writer::write(caf::serializer& sink, const caf::type_erased_tuple& x) {
  if (sink.context() == nullptr) return caf::sec::no_context;
  const size_t n = x.size();
  bool same = types_.size() == n && !names_.empty();
  for (size_t i = 0; same && i < n; ++i) same = x.type(i) == types_[i];
  if (!same) {
    if (auto err = name(sink.context()->system(), x)) return err;
  }
  uint16_t zero = 0;
  if (auto err = sink.begin_object(zero, names_)) return err;
  for (size_t i = 0; i < n; ++i) {
    if (auto err = x.save(i, sink)) return err;
  }
  return sink.end_object();
}

caf::error content_writer::name(caf::actor_system& sys, const caf::type_erased_tuple& x) {
  auto& types = sys.types();
  types_.clear();
  names_ = empty_names;
  for (size_t i = 0; i < x.size(); ++i) {
    const auto rtti = x.type(i);
    const std::string& portable = types.portable_name(rtti);
    if (portable == types.default_type_name()) {
      names_.clear();
      return caf::make_error(caf::sec::unknown_type,
                             rtti.second != nullptr ? rtti.second->name() : "-not-available-");
    }
    types_.push_back(rtti);
    names_ += '+';
    names_ += portable;
  }
  return caf::error{};
}

// -- content_reader ------------------------------------------------------------------------------

caf::error content_reader::read(caf::deserializer& source, caf::message& out,
                                frame_deserializer* frame) {
  if (source.context() == nullptr) return caf::sec::no_context;
  uint16_t zero = 0;
  if (auto err = source.begin_object(zero, names_)) return err;
  if (zero != 0) return caf::sec::unknown_type;
  if (names_ == empty_names) {
    out = caf::message{};
    return source.end_object();
  }
  caf::error err;
  const prototypes* protos = lookup(source.context()->system(), err);
  if (protos == nullptr) return err;
  caf::detail::dynamic_message_data::elements values;
  values.reserve(protos->size());
  const bool attached = frame != nullptr && frame->attachments().remaining() != 0;
  for (const auto& proto : *protos) {
    values.push_back(proto->copy());
    auto e = attached && is_byte_run(proto->type()) ? read_byte_run(*frame, *values.back())
                                                     : values.back()->load(source);
    if (e) return e;
  }
  if (auto e = source.end_object()) return e;
  out = caf::message{caf::detail::message_data::cow_ptr{
      caf::make_counted<caf::detail::dynamic_message_data>(std::move(values))}};
  return caf::error{};
}

const content_reader::prototypes* content_reader::lookup(caf::actor_system& sys,
                                                         caf::error& err) {
  auto it = known_.find(names_);
  if (it != known_.end()) return &it->second;
  if (names_.compare(0, 4, "@<>+") != 0) {
    err = caf::sec::unknown_type;
    return nullptr;
  }
  prototypes made;
  for (size_t begin = 4; begin <= names_.size();) {
    size_t end = std::min(names_.find('+', begin), names_.size());
    const std::string name = names_.substr(begin, end - begin);
    auto proto = sys.types().make_value(name);
    if (!proto) {
      err = caf::make_error(caf::sec::unknown_type, name);
      return nullptr;
    }
    made.push_back(std::move(proto));
    begin = end + 1;
  }
  if (known_.size() >= max_known_lists) known_.clear();
  return &known_.emplace(names_, std::move(made)).first->second;
}

// -- frames --------------------------------------------------------------------------------------

caf::error write_message_payload(caf::execution_unit* ctx, content_writer& writer,
                                 const caf::mailbox_element& what, bool with_sender,
                                 bool with_stages, std::vector<char>& buf,
                                 attachment_list& attached) {
  frame_serializer sink{ctx, buf, attached};
  if (with_sender) {
    caf::strong_actor_ptr sender = what.sender;
    if (auto err = sink(sender)) return err;
  }
  if (with_stages) {
    auto stages = what.stages;
    if (auto err = sink(stages)) return err;
  }
  return writer.write(sink, what.content());
}

caf::error write_content_payload(caf::execution_unit* ctx, const caf::message& content,
                                 std::vector<char>& buf) {
  caf::binary_serializer sink{ctx, buf};
  return caf::message::save(sink, content);
}

caf::error read_message_payload(caf::execution_unit* ctx, content_reader& reader,
                                const void* data, size_t length, attachment_source& attached,
                                bool with_sender, bool with_stages, size_t type_count,
                                message_payload& out) {
  // CAF sizes containers from lengths on the wire: a forged one may throw (bad_alloc), which
  // must not cross libcomm's callback.
  try {
    return read_parts(ctx, reader, data, length, attached, with_sender, with_stages, type_count,
                      out);
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::invalid_argument, e.what());
  }
}

caf::error read_parts(caf::execution_unit* ctx, content_reader& reader, const void* data,
                      size_t length, attachment_source& attached, bool with_sender,
                      bool with_stages, size_t type_count, message_payload& out) {
  frame_deserializer source{ctx, data, length, attached};
  if (with_sender) {
    if (auto err = source(out.sender)) return err;
  }
  if (with_stages) {
    if (auto err = source(out.stages)) return err;
  }
  if (auto err = reader.read(source, out.content, &source)) return err;
  if (source.remaining() != 0 || attached.remaining() != 0 || out.content.size() != type_count) {
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
  try {
    if (auto err = source(reason)) return err;
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::invalid_argument, e.what());
  }
  if (source.remaining() != 0) {
    return caf::make_error(caf::sec::invalid_argument, "malformed down payload");
  }
  return caf::error{};
}

}  // namespace comm::actors::detail
