// What the node's progress thread does when a turn found nothing to do: poll again, offer its
// core to another thread, or sleep on the worker's event fd.
//
// Spinning keeps the latency of the next message at a poll's, but holds a core. On a machine
// with a core per busy thread that costs nothing; when the peer's progress thread shares the
// core, it cannot answer until this one lets go. So the thread offers its core (sched_yield)
// now and then and learns from what follows whether offering pays:
//
// - an offer that let another thread run (it took a few microseconds) and was followed by work
//   means the work came from a thread of this core (the peer's progress thread placed here, a
//   sending actor): from then on the thread offers its core on every idle turn, which hands a
//   ping-pong between two threads of one core over in one context switch instead of a time
//   slice;
// - work that follows an offer nobody took (a bare system call, about 0.5 us) came from another
//   core: offering on every turn only delays noticing it, and stops at once. So does a run of
//   quick offers, and an offer that gave another program its time slice (longer than long_offer:
//   offering often would only hand it more slices);
// - otherwise the thread spins and offers its core every offer_interval, to find out.
//
// After spin_time idle it sleeps. Deciding by what followed an offer, not by how long it took
// alone, keeps a thread alone on its core from offering on every turn whenever a CAF worker woke
// up during one of its offers (such a worker runs a few microseconds and sleeps again).
#pragma once

#include <chrono>
#include <cstdint>

namespace comm::actors::detail {

/// The progress thread's idle policy (see the file comment). One per thread, not thread-safe.
class idle_spin {
public:
  using clock = std::chrono::steady_clock;

  /// What to do after an idle turn.
  enum class action {
    poll,   ///< run the next turn
    sleep,  ///< spin_time passed: sleep on the event fds
  };

  /// A turn did work: the idle time starts again, and the offer just before it (if any) tells
  /// whether offering pays.
  void busy() noexcept;

  /// A turn found nothing to do; may offer the core first.
  /// @param spin_time how long idle turns may go on before the thread sleeps
  action idle(std::chrono::microseconds spin_time);

  /// Learns from an offer of the core that took `took` (what offer() does after yielding; public
  /// for tests).
  void offered(std::chrono::nanoseconds took) noexcept;

  /// True while the thread offers its core on every idle turn.
  bool sharing() const noexcept { return sharing_; }

  /// Offers so far that gave another program its time slice (longer than long_offer).
  uint64_t long_offers() const noexcept { return long_offers_; }

  /// An offer that returns within this found nobody waiting for the core.
  static constexpr std::chrono::nanoseconds quick_offer{1000};
  /// An offer that takes longer than this was another program's time slice.
  static constexpr std::chrono::microseconds long_offer{50};
  /// Quick offers in a row after which the thread stops offering on every turn.
  static constexpr unsigned quick_offers_to_stop = 64;
  /// Idle turns between looks at the clock while not sharing.
  static constexpr unsigned idle_check = 64;
  /// Time between two offers while not sharing.
  static constexpr std::chrono::microseconds offer_interval{20};

private:
  /// What the last idle turn's offer showed.
  enum class last_offer : uint8_t {
    none,   ///< no offer (or another program's time slice: nothing to learn)
    quick,  ///< nobody took the core
    taken,  ///< another thread ran briefly
  };

  /// Offers the core and learns from how long that took (`now`: the time just before).
  void offer(clock::time_point now);

  clock::time_point idle_since_{};
  clock::time_point offered_{};
  unsigned idle_turns_ = 0;
  unsigned quick_offers_ = 0;
  uint64_t long_offers_ = 0;
  last_offer last_ = last_offer::none;
  bool sharing_ = false;
};

}  // namespace comm::actors::detail
