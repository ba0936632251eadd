// A CAF message of a few plain values (see payload.hpp) in one allocation: the values live inside
// the message data instead of one heap object each behind a vector, as in CAF's
// dynamic_message_data. It behaves as dynamic_message_data does towards CAF (same type numbers,
// type token, strings and serialisation), so handlers cannot tell the two apart.
#pragma once

#include <caf/atom.hpp>
#include <caf/deep_to_string.hpp>
#include <caf/deserializer.hpp>
#include <caf/detail/message_data.hpp>
#include <caf/make_type_erased_value.hpp>
#include <caf/rtti_pair.hpp>
#include <caf/serializer.hpp>
#include <caf/type_nr.hpp>

#include "tsan_handoff.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace comm::actors::detail {

/// One plain value.
using plain_value =
    std::variant<int8_t, uint8_t, int16_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t, bool,
                 float, double, caf::atom_value, std::string, std::vector<char>>;

/// Makes `v` a default value of CAF builtin type number `nr`.
/// @returns false when `nr` is not a plain type
inline bool emplace_plain(plain_value& v, uint16_t nr) {
  switch (nr) {
    case caf::type_nr<int8_t>::value: v.emplace<int8_t>(); return true;
    case caf::type_nr<uint8_t>::value: v.emplace<uint8_t>(); return true;
    case caf::type_nr<int16_t>::value: v.emplace<int16_t>(); return true;
    case caf::type_nr<uint16_t>::value: v.emplace<uint16_t>(); return true;
    case caf::type_nr<int32_t>::value: v.emplace<int32_t>(); return true;
    case caf::type_nr<uint32_t>::value: v.emplace<uint32_t>(); return true;
    case caf::type_nr<int64_t>::value: v.emplace<int64_t>(); return true;
    case caf::type_nr<uint64_t>::value: v.emplace<uint64_t>(); return true;
    case caf::type_nr<bool>::value: v.emplace<bool>(); return true;
    case caf::type_nr<float>::value: v.emplace<float>(); return true;
    case caf::type_nr<double>::value: v.emplace<double>(); return true;
    case caf::type_nr<caf::atom_value>::value: v.emplace<caf::atom_value>(); return true;
    case caf::type_nr<std::string>::value: v.emplace<std::string>(); return true;
    case caf::type_nr<std::vector<char>>::value: v.emplace<std::vector<char>>(); return true;
    default: return false;
  }
}

/// The message data of up to `capacity` plain values.
class plain_message_data final : public caf::detail::message_data {
public:
  /// Values this data holds at most.
  static constexpr size_t capacity = 4;

  /// No values yet.
  plain_message_data() = default;
  plain_message_data(const plain_message_data&) = default;

  /// Destroyed by the thread that received it. This and every member CAF calls begin with
  /// `taken_over(this)`: the node hands the data over as it enqueues the message (see
  /// tsan_handoff.hpp).
  ~plain_message_data() override { taken_over(this); }

  /// Appends a default value of builtin type number `nr` (which must be plain, with fewer than
  /// `capacity` values held) and returns it.
  void* append(uint16_t nr) {
    emplace_plain(values_[size_], nr);
    token_ = (token_ << 6) | nr;  // as dynamic_message_data::add_to_type_token
    return get_mutable(size_++);
  }

  /// A copy (CAF copies shared data before handing a value out mutably).
  plain_message_data* copy() const override {
    taken_over(this);
    auto* made = new plain_message_data(*this);
    handed_over(made);
    return made;
  }

  /// The value at `pos`.
  void* get_mutable(size_t pos) override {
    taken_over(this);
    return std::visit([](auto& x) -> void* { return &x; }, values_[pos]);
  }

  /// Reads the value at `pos` from `source`.
  caf::error load(size_t pos, caf::deserializer& source) override {
    taken_over(this);
    return std::visit([&](auto& x) { return source(x); }, values_[pos]);
  }

  /// Values held.
  size_t size() const noexcept override {
    taken_over(this);
    return size_;
  }

  /// The type token CAF matches handlers with.
  uint32_t type_token() const noexcept override {
    taken_over(this);
    return token_;
  }

  /// The type number of the value at `pos`.
  caf::rtti_pair type(size_t pos) const noexcept override {
    taken_over(this);
    return std::visit(
        [](const auto& x) { return caf::make_rtti_pair<std::decay_t<decltype(x)>>(); },
        values_[pos]);
  }

  /// The value at `pos`.
  const void* get(size_t pos) const noexcept override {
    taken_over(this);
    return std::visit([](const auto& x) -> const void* { return &x; }, values_[pos]);
  }

  /// The value at `pos` as CAF prints it.
  std::string stringify(size_t pos) const override {
    taken_over(this);
    return std::visit([](const auto& x) { return caf::deep_to_string(x); }, values_[pos]);
  }

  /// A type-erased copy of the value at `pos`.
  caf::type_erased_value_ptr copy(size_t pos) const override {
    taken_over(this);
    return std::visit([](const auto& x) { return caf::make_type_erased_value<std::decay_t<decltype(x)>>(x); },
                      values_[pos]);
  }

  /// Writes the value at `pos` to `sink`.
  caf::error save(size_t pos, caf::serializer& sink) const override {
    taken_over(this);
    return std::visit([&](const auto& x) { return sink(const_cast<std::decay_t<decltype(x)>&>(x)); },
                      values_[pos]);
  }

private:
  std::array<plain_value, capacity> values_;
  size_t size_ = 0;
  uint32_t token_ = 0xFFFFFFFF;  ///< as dynamic_message_data starts it
};

}  // namespace comm::actors::detail
