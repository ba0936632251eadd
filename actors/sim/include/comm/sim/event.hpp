// Events: a timestamp, a target LP, a small payload, and the ordering key that makes a run
// deterministic whatever the layout.
#pragma once

#include <cstdint>
#include <type_traits>

namespace comm::sim {

/// Global id of a logical process, in [0, lp_count). Ids are global: the same model has the same
/// ids whatever the number of processes and partitions.
using lp_id = uint32_t;

/// Simulated time.
using sim_time = double;

/// An event as the engine stores and ships it. Simultaneous events are ordered by (time, sender,
/// sequence): the sending LP's id and its own count of events sent, which do not depend on where
/// anything ran. `Message` is the model's payload; it must be trivially copyable, since events
/// travel between processes as bytes.
template <class Message>
struct event {
  static_assert(std::is_trivially_copyable_v<Message>, "an event payload is copied as bytes");

  sim_time time;     ///< when the event happens
  lp_id target;      ///< the LP that handles it
  lp_id sender;      ///< the LP that scheduled it
  uint64_t sequence; ///< the sender's count of events scheduled before this one
  Message message;   ///< the model's payload
};

/// True when `a` comes before `b` in the deterministic order (time, sender, sequence).
template <class Message>
constexpr bool key_less(const event<Message>& a, const event<Message>& b) noexcept {
  if (a.time != b.time) return a.time < b.time;
  if (a.sender != b.sender) return a.sender < b.sender;
  return a.sequence < b.sequence;
}

}  // namespace comm::sim
