// Scoped flag types of the C++ face, one per kind of operation: a flag of one kind cannot be
// passed to an operation of another (an AM flag to a put does not compile), and flags of one
// kind combine with | and &. Each value is the request_flags bit (or am_cb_flags bit) the
// low-level API uses for it, so the C++ face passes them on unchanged.
#pragma once

#include <comm/am.hpp>
#include <comm/types.hpp>

#include <cstdint>
#include <type_traits>

namespace comm {

/// Flags of endpoint::tag_send and tag_send_iov.
enum class send_flags : uint32_t {
  none = 0,                                    ///< the protocol chosen by size and thresholds
  force_immediate = request_force_immediate,   ///< fail with no_resource rather than queue
  force_zcopy = request_force_zcopy,           ///< eager zero copy whatever the thresholds
  force_bcopy = request_force_bcopy,           ///< eager bcopy whatever the thresholds
  force_rndv = request_force_rndv,             ///< rendezvous whatever the thresholds
};

/// Flags of endpoint::stream_send and stream_send_iov.
enum class stream_send_flags : uint32_t {
  none = 0,                                    ///< the protocol chosen by size and thresholds
  force_immediate = request_force_immediate,   ///< fail with no_resource rather than queue
  force_zcopy = request_force_zcopy,           ///< eager zero copy whatever the thresholds
  force_bcopy = request_force_bcopy,           ///< eager bcopy whatever the thresholds
  /// Rendezvous: the peer reads the bytes straight into its posted receives (see the low-level
  /// stream_send).
  force_rndv = request_force_rndv,
};

/// Flags of endpoint::am_send.
enum class am_send_flags : uint32_t {
  none = 0,                                    ///< the protocol chosen by size and thresholds
  force_immediate = request_force_immediate,   ///< fail with no_resource rather than queue
  reply_endpoint = request_reply_endpoint,     ///< the peer's handler gets a reply endpoint
  force_zcopy = request_force_zcopy,           ///< eager zero copy whatever the thresholds
  force_bcopy = request_force_bcopy,           ///< eager bcopy whatever the thresholds
  force_rndv = request_force_rndv,             ///< rendezvous whatever the thresholds
};

/// Flags of endpoint::put and endpoint::get (DAT's completion flags, see request_flags).
enum class rma_flags : uint32_t {
  none = 0,  ///< a request that notifies every outcome
  /// No operation for the caller (the returned one is done) and no callback on success; a
  /// failure still runs the completion.
  completion_suppressed = request_completion_suppressed,
  /// Start only after every earlier put and get on the endpoint completed.
  fence = request_fence,
  /// The operation records its completion but a success runs no completion; a failure does.
  unsignalled = request_unsignalled,
};

/// Flags of worker::set_am_handler (the bits of am_cb_flags).
enum class am_handler_flags : unsigned {
  none = 0,                                 ///< per-fragment delivery, data lent for the call
  whole_msg = am_flag_whole_msg,            ///< one call with the whole message
  persistent_data = am_flag_persistent_data, ///< data the handler may keep (returns in_progress)
  fetch_rndv = am_flag_fetch_rndv,          ///< rendezvous data fetched before the handler runs
};

/// True for the scoped flag types above, which combine with |, &, |= and &=.
template <class E>
inline constexpr bool is_flag_set_v = false;
/// send_flags combine.
template <>
inline constexpr bool is_flag_set_v<send_flags> = true;
/// stream_send_flags combine.
template <>
inline constexpr bool is_flag_set_v<stream_send_flags> = true;
/// am_send_flags combine.
template <>
inline constexpr bool is_flag_set_v<am_send_flags> = true;
/// rma_flags combine.
template <>
inline constexpr bool is_flag_set_v<rma_flags> = true;
/// am_handler_flags combine.
template <>
inline constexpr bool is_flag_set_v<am_handler_flags> = true;

/// The union of two flag sets of one kind.
template <class E>
  requires is_flag_set_v<E>
constexpr E operator|(E a, E b) noexcept {
  using bits = std::underlying_type_t<E>;
  return static_cast<E>(static_cast<bits>(a) | static_cast<bits>(b));
}

/// The intersection of two flag sets of one kind (compare with E::none to test a flag).
template <class E>
  requires is_flag_set_v<E>
constexpr E operator&(E a, E b) noexcept {
  using bits = std::underlying_type_t<E>;
  return static_cast<E>(static_cast<bits>(a) & static_cast<bits>(b));
}

/// Adds the flags of `b` to `a`.
template <class E>
  requires is_flag_set_v<E>
constexpr E& operator|=(E& a, E b) noexcept {
  return a = a | b;
}

/// Keeps only the flags of `a` that are in `b`.
template <class E>
  requires is_flag_set_v<E>
constexpr E& operator&=(E& a, E b) noexcept {
  return a = a & b;
}

/// The low-level bits of a flag set (request_flags, or am_cb_flags for am_handler_flags).
template <class E>
  requires is_flag_set_v<E>
constexpr std::underlying_type_t<E> to_bits(E flags) noexcept {
  return static_cast<std::underlying_type_t<E>>(flags);
}

}  // namespace comm
