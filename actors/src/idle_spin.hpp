// What the node's progress thread does when a turn found nothing to do: poll again, offer its
// core to another thread, or sleep on the worker's event fd.
//
// Spinning keeps the latency of the next message at a poll's, but holds a core. On a machine
// with a core per busy thread that costs nothing; when the peer's progress thread, a sending
// actor or a CAF worker shares the core, every microsecond spun is one they wait. So the thread
// offers its core (sched_yield) and times the offer: one that comes back at once (about 0.4 us
// here) found nobody waiting; one that took a few microseconds let a thread run that needed the
// core briefly: from then on the thread offers its core on every idle turn, which hands a
// ping-pong between two threads of one core over in a context switch instead of a time slice.
// A very long offer (another program's time slice) ends offering on every turn (that would
// only hand the other program more slices), and so do many quick offers in a row: the thread
// spins freely again. After spin_time idle it sleeps.
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

  /// A turn did work: the idle time starts again.
  void busy() noexcept { idle_turns_ = 0; }

  /// A turn found nothing to do; may offer the core first.
  /// @param spin_time how long idle turns may go on before the thread sleeps
  action idle(std::chrono::microseconds spin_time);

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
  /// Offers the core and learns from how long that took (`now`: the time just before).
  void offer(clock::time_point now);

  clock::time_point idle_since_{};
  clock::time_point offered_{};
  unsigned idle_turns_ = 0;
  unsigned quick_offers_ = 0;
  bool sharing_ = false;
};

}  // namespace comm::actors::detail
