// Byte views of the C++ face: what a send reads (const_bytes) and what a receive writes
// (mutable_bytes). Each is a std::span of bytes that can also be made, without a cast, from any
// contiguous range of trivially copyable values the caller keeps alive: a std::vector, a
// std::array, a std::string, a C array, a std::span.
#pragma once

#include <comm/types.hpp>

#include <cstddef>
#include <ranges>
#include <span>
#include <type_traits>

namespace comm {

namespace detail {

/// The element type of range R.
template <class R>
using range_element_t = std::remove_reference_t<std::ranges::range_reference_t<R>>;

/// A contiguous range whose bytes an operation may use past the call: its elements are
/// trivially copyable, and it is not a temporary container that would die at the end of the
/// caller's statement (an lvalue, or a view such as std::span). Lists of iov_entry are gather
/// lists, not bytes, and are left out.
template <class R>
concept byte_range =
    std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    std::is_trivially_copyable_v<range_element_t<R>> &&
    !std::is_same_v<std::remove_cv_t<range_element_t<R>>, iov_entry> &&
    (std::is_lvalue_reference_v<R> || std::ranges::borrowed_range<R>);

}  // namespace detail

/// Bytes an operation reads (a send's data, an active message's header): a std::span of const
/// bytes, made from a span, a contiguous range of trivially copyable values, or a pointer and a
/// length. The bytes must stay valid until the operation completes.
class const_bytes : public std::span<const std::byte> {
public:
  /// No bytes.
  constexpr const_bytes() noexcept = default;
  /// The bytes of `bytes`.
  constexpr const_bytes(std::span<const std::byte> bytes) noexcept
      : std::span<const std::byte>(bytes) {}
  /// The bytes of `bytes`.
  constexpr const_bytes(std::span<std::byte> bytes) noexcept
      : std::span<const std::byte>(bytes) {}
  /// The object representation of the elements of `range` (std::as_bytes of it).
  template <detail::byte_range R>
    requires(!std::is_convertible_v<R, std::span<const std::byte>>)
  const_bytes(R&& range) noexcept
      : std::span<const std::byte>(
            reinterpret_cast<const std::byte*>(std::ranges::data(range)),
            std::ranges::size(range) * sizeof(detail::range_element_t<R>)) {}
  /// `length` bytes at `data` (for buffers known by address, such as mem_alloc's).
  const_bytes(const void* data, size_t length) noexcept
      : std::span<const std::byte>(static_cast<const std::byte*>(data), length) {}
};

/// Bytes an operation writes (a receive's buffer, a get's destination, a region to register): a
/// std::span of bytes, made from a span, a contiguous range of non-const trivially copyable
/// values, or a pointer and a length. The bytes must stay valid until the operation completes.
class mutable_bytes : public std::span<std::byte> {
public:
  /// No bytes.
  constexpr mutable_bytes() noexcept = default;
  /// The bytes of `bytes`.
  constexpr mutable_bytes(std::span<std::byte> bytes) noexcept : std::span<std::byte>(bytes) {}
  /// The object representation of the elements of `range` (std::as_writable_bytes of it).
  template <detail::byte_range R>
    requires(!std::is_const_v<detail::range_element_t<R>> &&
             !std::is_convertible_v<R, std::span<std::byte>>)
  mutable_bytes(R&& range) noexcept
      : std::span<std::byte>(reinterpret_cast<std::byte*>(std::ranges::data(range)),
                             std::ranges::size(range) * sizeof(detail::range_element_t<R>)) {}
  /// `length` bytes at `data` (for buffers known by address, such as mem_alloc's).
  mutable_bytes(void* data, size_t length) noexcept
      : std::span<std::byte>(static_cast<std::byte*>(data), length) {}
};

/// The iov entry that covers `bytes` (for the gather lists of the *_iov operations and put).
inline iov_entry iov_of(const_bytes bytes) noexcept {
  return iov_entry{const_cast<std::byte*>(bytes.data()), bytes.size()};
}

}  // namespace comm
