// Payload serialisation with CAF's binary serializers (see payload.hpp).
#include "payload.hpp"
#include "plain_message.hpp"

#include <caf/actor_system.hpp>
#include <caf/detail/dynamic_message_data.hpp>
#include <caf/detail/ieee_754.hpp>
#include <caf/downstream_msg.hpp>
#include <caf/duration.hpp>
#include <caf/sec.hpp>
#include <caf/system_messages.hpp>
#include <caf/type_nr.hpp>
#include <caf/uniform_type_info_map.hpp>
#include <caf/upstream_msg.hpp>

#include <algorithm>
#include <cstring>
#include <exception>

namespace comm::actors::detail {

namespace {

/// Name lists a content_reader remembers at most (then it starts over), and the most types a list
/// it remembers may name (longer ones are looked up for each message): the names come from peers,
/// and this keeps what is remembered under 256 x 64 prototypes (about 1 MiB) whatever they send.
constexpr size_t max_known_lists = 256;
constexpr size_t max_known_types = 64;

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
  if (!attached && size > source.remaining()) return source.fail(caf::sec::end_of_stream);
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

// -- plain values --------------------------------------------------------------------------------

/// How CAF's binary format writes a plain type (see payload.hpp); none for the others.
enum class plain_kind : uint8_t { none, int8, int16, int32, int64, boolean, real32, real64, run };

/// The plain kind of CAF builtin type number `nr`.
plain_kind kind_of(uint16_t nr) noexcept {
  switch (nr) {
    case caf::type_nr<int8_t>::value:
    case caf::type_nr<uint8_t>::value:
      return plain_kind::int8;
    case caf::type_nr<int16_t>::value:
    case caf::type_nr<uint16_t>::value:
      return plain_kind::int16;
    case caf::type_nr<int32_t>::value:
    case caf::type_nr<uint32_t>::value:
      return plain_kind::int32;
    case caf::type_nr<int64_t>::value:
    case caf::type_nr<uint64_t>::value:
    case caf::type_nr<caf::atom_value>::value:
      return plain_kind::int64;
    case caf::type_nr<bool>::value:
      return plain_kind::boolean;
    case caf::type_nr<float>::value:
      return plain_kind::real32;
    case caf::type_nr<double>::value:
      return plain_kind::real64;
    case caf::type_nr<std::string>::value:
    case caf::type_nr<std::vector<char>>::value:
      return plain_kind::run;
    default:
      return plain_kind::none;
  }
}

/// Appends `x` in network byte order, as CAF's binary serialiser writes integers.
template <class T>
void put_int(std::vector<char>& buf, T x) {
  char bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) {
    bytes[i] = static_cast<char>(x >> (8 * (sizeof(T) - 1 - i)));
  }
  buf.insert(buf.end(), bytes, bytes + sizeof(T));
}

/// Appends a sequence length in CAF's varbyte encoding (of its low 32 bits, as CAF does).
void put_size(std::vector<char>& buf, size_t size) {
  auto x = static_cast<uint32_t>(size);
  while (x > 0x7f) {
    buf.push_back(static_cast<char>((x & 0x7f) | 0x80));
    x >>= 7;
  }
  buf.push_back(static_cast<char>(x));
}

/// Appends a byte run (a std::string or std::vector<char>) as its length and bytes.
void put_run(std::vector<char>& buf, const char* data, size_t size) {
  put_size(buf, size);
  buf.insert(buf.end(), data, data + size);
}

/// Appends the plain value `x` of builtin type number `nr`.
/// @returns false when it is not plain (a run too long to stay inline, or another type)
bool put_value(std::vector<char>& buf, uint16_t nr, const void* x) {
  switch (kind_of(nr)) {
    case plain_kind::int8:
      buf.push_back(*static_cast<const char*>(x));
      return true;
    case plain_kind::int16:
      put_int(buf, *static_cast<const uint16_t*>(x));
      return true;
    case plain_kind::int32:
      put_int(buf, *static_cast<const uint32_t*>(x));
      return true;
    case plain_kind::int64:
      put_int(buf, *static_cast<const uint64_t*>(x));
      return true;
    case plain_kind::boolean:
      buf.push_back(*static_cast<const bool*>(x) ? 1 : 0);
      return true;
    case plain_kind::real32:
      put_int(buf, pack_real(*static_cast<const float*>(x)));
      return true;
    case plain_kind::real64:
      put_int(buf, pack_real(*static_cast<const double*>(x)));
      return true;
    case plain_kind::run:
      break;
    case plain_kind::none:
      return false;
  }
  if (nr == caf::type_nr<std::string>::value) {
    const auto& str = *static_cast<const std::string*>(x);
    if (str.size() >= attach_threshold) return false;
    put_run(buf, str.data(), str.size());
  } else {
    const auto& vec = *static_cast<const std::vector<char>*>(x);
    if (vec.size() >= attach_threshold) return false;
    put_run(buf, vec.data(), vec.size());
  }
  return true;
}

/// Reads CAF's binary format from a byte range; every read fails past its end.
class plain_cursor {
public:
  /// Reads the `length` bytes at `data`.
  plain_cursor(const char* data, size_t length) noexcept : at_(data), end_(data + length) {}

  /// Bytes not read yet.
  size_t left() const noexcept { return static_cast<size_t>(end_ - at_); }

  /// Reads an integer in network byte order.
  template <class T>
  bool get_int(T& x) noexcept {
    if (left() < sizeof(T)) return false;
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>((v << 8) | static_cast<uint8_t>(at_[i]));
    at_ += sizeof(T);
    x = v;
    return true;
  }

  /// Reads a varbyte sequence length (at most five bytes, as CAF writes them).
  bool get_size(size_t& size) noexcept {
    uint32_t x = 0;
    for (int shift = 0; shift < 35; shift += 7) {
      if (at_ == end_) return false;
      const auto byte = static_cast<uint8_t>(*at_++);
      x |= static_cast<uint32_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        size = x;
        return true;
      }
    }
    return false;
  }

  /// Takes a byte run's length and bytes (left in place).
  bool get_run(const char*& data, size_t& size) noexcept {
    if (!get_size(size) || size > left()) return false;
    data = at_;
    at_ += size;
    return true;
  }

  /// Reads the plain value of builtin type number `nr` into `x`.
  bool get_value(uint16_t nr, void* x);

private:
  const char* at_;
  const char* end_;
};

bool plain_cursor::get_value(uint16_t nr, void* x) {
  switch (kind_of(nr)) {
    case plain_kind::int8:
      return get_int(*static_cast<uint8_t*>(x));
    case plain_kind::int16:
      return get_int(*static_cast<uint16_t*>(x));
    case plain_kind::int32:
      return get_int(*static_cast<uint32_t*>(x));
    case plain_kind::int64:
      return get_int(*static_cast<uint64_t*>(x));
    case plain_kind::boolean: {
      uint8_t b = 0;
      if (!get_int(b)) return false;
      *static_cast<bool*>(x) = b != 0;
      return true;
    }
    case plain_kind::real32: {
      uint32_t packed = 0;
      if (!get_int(packed)) return false;
      *static_cast<float*>(x) = caf::detail::unpack754(packed);
      return true;
    }
    case plain_kind::real64: {
      uint64_t packed = 0;
      if (!get_int(packed)) return false;
      *static_cast<double*>(x) = caf::detail::unpack754(packed);
      return true;
    }
    case plain_kind::run:
      break;
    case plain_kind::none:
      return false;
  }
  const char* data = nullptr;
  size_t size = 0;
  if (!get_run(data, size)) return false;
  if (nr == caf::type_nr<std::string>::value) {
    static_cast<std::string*>(x)->assign(data, size);
  } else {
    static_cast<std::vector<char>*>(x)->assign(data, data + size);
  }
  return true;
}

/// A CAF message of `values`, in CAF's own message data for any number of values.
caf::message dynamic_message(caf::detail::dynamic_message_data::elements values) {
  return caf::message{caf::detail::message_data::cow_ptr{
      caf::make_counted<caf::detail::dynamic_message_data>(std::move(values))}};
}

/// Reads values of the types of `protos` (plain, at most plain_message_data::capacity of them)
/// from `in`, which they must use up, into one plain_message_data.
bool read_values(plain_cursor& in, const std::vector<caf::type_erased_value_ptr>& protos,
                 caf::message& out) {
  auto data = caf::make_counted<plain_message_data>();
  for (const auto& proto : protos) {
    const uint16_t nr = proto->type().first;
    if (!in.get_value(nr, data->append(nr))) return false;
  }
  if (in.left() != 0) return false;
  out = caf::message{caf::detail::message_data::cow_ptr{std::move(data)}};
  return true;
}

/// The context of `err`, empty for no error (CAF 0.17's error::context() needs one).
caf::message context_of(const caf::error& err) {
  return err ? err.context() : caf::message{};
}

/// Adds the messages inside element `i` of `msg` to `todo` (a nested message, an error's context,
/// a down or exit reason's context, what a stream handshake or stream frame carries): CAF prints
/// them with the element.
/// @returns false for a caf::duration whose unit CAF 0.17.6 cannot print: to_string indexes its
/// table of unit names with it, and CAF prints every message an actor does not expect
bool check_element(const caf::message& msg, size_t i, std::vector<caf::message>& todo) {
  switch (msg.type(i).first) {
    case caf::type_nr<caf::duration>::value:
      return msg.get_as<caf::duration>(i).unit <= caf::time_unit::nanoseconds;
    case caf::type_nr<caf::message>::value:
      todo.push_back(msg.get_as<caf::message>(i));
      break;
    case caf::type_nr<caf::error>::value:
      todo.push_back(context_of(msg.get_as<caf::error>(i)));
      break;
    case caf::type_nr<caf::down_msg>::value:
      todo.push_back(context_of(msg.get_as<caf::down_msg>(i).reason));
      break;
    case caf::type_nr<caf::exit_msg>::value:
      todo.push_back(context_of(msg.get_as<caf::exit_msg>(i).reason));
      break;
    case caf::type_nr<caf::open_stream_msg>::value:
      todo.push_back(msg.get_as<caf::open_stream_msg>(i).msg);
      break;
    case caf::type_nr<caf::downstream_msg>::value: {
      const auto& content = msg.get_as<caf::downstream_msg>(i).content;
      if (const auto* batch = caf::get_if<caf::downstream_msg::batch>(&content)) {
        todo.push_back(batch->xs);
      } else if (const auto* closed = caf::get_if<caf::downstream_msg::forced_close>(&content)) {
        todo.push_back(context_of(closed->reason));
      }
      break;
    }
    case caf::type_nr<caf::upstream_msg>::value: {
      const auto& content = msg.get_as<caf::upstream_msg>(i).content;
      if (const auto* dropped = caf::get_if<caf::upstream_msg::forced_drop>(&content)) {
        todo.push_back(context_of(dropped->reason));
      }
      break;
    }
    default:
      break;
  }
  return true;
}

/// Refuses a message holding, at any depth, a caf::duration with a time unit CAF does not know
/// (iterative: the depth is the peer's).
caf::error check_durations(const caf::message& msg) {
  std::vector<caf::message> todo;  // allocates only for a message with messages inside
  caf::message next = msg;
  for (;;) {
    for (size_t i = 0; i < next.size(); ++i) {
      if (!check_element(next, i, todo)) {
        return caf::make_error(caf::sec::invalid_argument, "a duration of an unknown time unit");
      }
    }
    if (todo.empty()) return caf::error{};
    next = std::move(todo.back());
    todo.pop_back();
  }
}

}  // namespace

// -- content_writer ------------------------------------------------------------------------------

caf::error content_writer::write(caf::serializer& sink, const caf::type_erased_tuple& x) {
  if (sink.context() == nullptr) return caf::sec::no_context;
  if (auto err = prepare(sink.context()->system(), x)) return err;
  const size_t n = x.size();
  uint16_t zero = 0;
  if (auto err = sink.begin_object(zero, names_)) return err;
  for (size_t i = 0; i < n; ++i) {
    if (auto err = x.save(i, sink)) return err;
  }
  return sink.end_object();
}

bool content_writer::write_plain(caf::actor_system& sys, const caf::type_erased_tuple& x,
                                 std::vector<char>& buf) {
  if (prepare(sys, x)) return false;
  const size_t start = buf.size();
  put_int(buf, uint16_t{0});
  put_run(buf, names_.data(), names_.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!put_value(buf, types_[i].first, x.get(i))) {
      buf.resize(start);
      return false;
    }
  }
  return true;
}

caf::error content_writer::prepare(caf::actor_system& sys, const caf::type_erased_tuple& x) {
  const size_t n = x.size();
  bool same = types_.size() == n && !names_.empty();
  for (size_t i = 0; same && i < n; ++i) same = x.type(i) == types_[i];
  return same ? caf::error{} : name(sys, x);
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
  values.reserve(protos->values.size());
  const bool attached = frame != nullptr && frame->attachments().remaining() != 0;
  for (const auto& proto : protos->values) {
    values.push_back(proto->copy());
    auto e = attached && is_byte_run(proto->type()) ? read_byte_run(*frame, *values.back())
                                                     : values.back()->load(source);
    if (e) return e;
  }
  if (auto e = source.end_object()) return e;
  out = dynamic_message(std::move(values));
  return caf::error{};
}

bool content_reader::read_plain(caf::actor_system& sys, const char* data, size_t length,
                                caf::message& out) {
  plain_cursor in{data, length};
  uint16_t zero = 0;
  const char* names = nullptr;
  size_t names_length = 0;
  if (!in.get_int(zero) || zero != 0 || !in.get_run(names, names_length)) return false;
  const prototypes* protos = lookup(sys, names, names_length);
  if (protos == nullptr || !protos->plain) return false;
  if (protos->values.size() <= plain_message_data::capacity) {
    return read_values(in, protos->values, out);
  }
  caf::detail::dynamic_message_data::elements values;
  values.reserve(protos->values.size());
  for (const auto& proto : protos->values) {
    values.push_back(proto->copy());
    if (!in.get_value(proto->type().first, values.back()->get_mutable())) return false;
  }
  if (in.left() != 0) return false;
  out = dynamic_message(std::move(values));
  return true;
}

size_t content_reader::remembered_values() const noexcept {
  size_t n = 0;
  for (const auto& [names, protos] : known_) n += protos.values.size();
  return n;
}

const content_reader::prototypes* content_reader::lookup(caf::actor_system& sys,
                                                         const char* names, size_t length) {
  if (last_ != nullptr && last_names_.size() == length &&
      std::memcmp(last_names_.data(), names, length) == 0) {
    return last_;
  }
  names_.assign(names, length);
  caf::error ignored;
  return lookup(sys, ignored);
}

const content_reader::prototypes* content_reader::lookup(caf::actor_system& sys,
                                                         caf::error& err) {
  if (last_ != nullptr && names_ == last_names_) return last_;
  auto it = known_.find(names_);
  if (it != known_.end()) {
    last_names_ = names_;
    return last_ = &it->second;
  }
  if (names_.compare(0, 4, "@<>+") != 0) {
    err = caf::sec::unknown_type;
    return nullptr;
  }
  prototypes made;
  made.plain = true;
  for (size_t begin = 4; begin <= names_.size();) {
    size_t end = std::min(names_.find('+', begin), names_.size());
    const std::string name = names_.substr(begin, end - begin);
    auto proto = sys.types().make_value(name);
    if (!proto) {
      err = caf::make_error(caf::sec::unknown_type, name);
      return nullptr;
    }
    made.plain = made.plain && kind_of(proto->type().first) != plain_kind::none;
    made.values.push_back(std::move(proto));
    begin = end + 1;
  }
  if (made.values.size() > max_known_types) {
    long_list_ = std::move(made);
    last_ = nullptr;
    return &long_list_;
  }
  if (known_.size() >= max_known_lists) known_.clear();
  last_names_ = names_;
  return last_ = &known_.emplace(names_, std::move(made)).first->second;
}

// -- frames --------------------------------------------------------------------------------------

caf::error write_message_payload(caf::execution_unit* ctx, content_writer& writer,
                                 const caf::mailbox_element& what, bool with_sender,
                                 bool with_stages, std::vector<char>& buf,
                                 attachment_list& attached) {
  if (!with_sender && !with_stages && ctx != nullptr &&
      writer.write_plain(ctx->system(), what.content(), buf)) {
    return caf::error{};
  }
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
  frame_serializer sink{ctx, buf};
  return caf::message::save(sink, content);
}

bool split_frame(const frame_header& h, const void* header, size_t header_length, void* data,
                 size_t length, comm::worker* owner, frame_parts& out) {
  if (header_length < envelope_writer::size()) return false;
  const size_t inline_length = header_length - envelope_writer::size();
  if (h.attached == 0) {
    out.payload = data;
    out.length = length;
    return inline_length == 0;
  }
  if (h.kind != frame_kind::message) return false;
  auto* bytes = static_cast<const char*>(data);
  if (inline_length != 0) {
    // The payload came in the AM header; the data holds the attachments only.
    if (h.attached != length) return false;
    out.payload = static_cast<const char*>(header) + envelope_writer::size();
    out.length = inline_length;
    out.attached = attachment_source(bytes, length, owner, data);
    return true;
  }
  if (h.attached > length) return false;
  out.payload = bytes;
  out.length = length - h.attached;
  out.attached = attachment_source(bytes + out.length, h.attached, owner, data);
  return true;
}

caf::error read_message_payload(caf::execution_unit* ctx, content_reader& reader,
                                const void* data, size_t length, attachment_source& attached,
                                bool with_sender, bool with_stages, size_t type_count,
                                message_payload& out) {
  try {  // the direct reader allocates too (bad_alloc must not cross libcomm's callback)
    const bool plain = !with_sender && !with_stages && attached.remaining() == 0 &&
                       ctx != nullptr &&
                       reader.read_plain(ctx->system(), static_cast<const char*>(data), length,
                                         out.content);
    if (!plain) {
      auto err = read_guarded(ctx, data, length, attached, [&](frame_deserializer& source) {
        if (with_sender) {
          if (auto e = source(out.sender)) return e;
        }
        if (with_stages) {
          if (auto e = source(out.stages)) return e;
        }
        return reader.read(source, out.content, &source);
      });
      if (err) return err;
      if (auto bad = check_durations(out.content)) return bad;
    }
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::invalid_argument, e.what());
  }
  if (out.content.size() != type_count) {
    return caf::make_error(caf::sec::invalid_argument, "message of another length than announced");
  }
  return caf::error{};
}

caf::error write_reason_payload(caf::execution_unit* ctx, const caf::error& reason,
                                std::vector<char>& buf) {
  frame_serializer sink{ctx, buf};
  caf::error copy = reason;
  return sink(copy);
}

caf::error read_reason_payload(caf::execution_unit* ctx, const void* data, size_t length,
                               caf::error& reason) {
  attachment_source none;
  if (auto err = read_guarded(ctx, data, length, none,
                              [&](frame_deserializer& source) { return source(reason); })) {
    return err;
  }
  return check_durations(context_of(reason));
}

}  // namespace comm::actors::detail
