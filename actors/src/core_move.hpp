// Moving the node's progress thread off a core it shares with the thread that feeds it work.
//
// The kernel places a thread when it starts or wakes up. Progress threads spin while messages
// flow, so they stay where they were placed: when the two progress threads of a ping-pong between
// two processes were put on one core (one woke while the other core ran something), every hop is
// a hand-over by sched_yield (idle_spin's sharing), about 2 us each in this VM, while the other
// core may be idle or shared with a program of less weight. The kernel's periodic balancing does
// not split such a pair: the threads are always runnable and cache-hot, and moving one does not
// change the number of runnable threads per core when the other core is busy.
//
// So when idle_spin has said for a while that the thread shares its core with whoever sends it
// work, or that its offers of the core keep giving another thread a time slice (a CAF worker
// streaming to this process from the same core, another program), the thread moves itself to
// another core of its affinity mask (the mask stays what it was: the thread is only placed) and
// counts the turns that did work per unit of time there. It stays when that rate is at least the
// rate before the move, and goes back otherwise (the other core was held by a program that leaves
// it a smaller share than the hand-overs cost, or the peer moved at the same time). A failed move
// doubles the wait before the next attempt (with a jitter, so that the two progress threads of a
// pair do not keep moving together); after a move that paid, the thread stays at least
// min_backoff. A thread pinned to one core, by node_params::cpus or by its process's mask, never
// moves; a thread that slept is placed anew by the kernel when it wakes, which ends a trial
// without going back.
#pragma once

#include <chrono>
#include <cstdint>

namespace comm::actors::detail {

/// When to move the progress thread to another core and whether to stay there (see the file
/// comment). The policy is fed turns and times; the moves are move_off() and move_back(). One per
/// thread, not thread-safe.
class core_move {
public:
  using clock = std::chrono::steady_clock;

  /// What the thread should do after a turn.
  enum class action {
    stay,     ///< nothing
    leave,    ///< move to another core of the mask (move_off)
    go_back,  ///< return to the core it left (move_back)
  };

  /// How long the thread must share its core before it moves, and how long a trial counts.
  static constexpr std::chrono::milliseconds window{10};
  /// The wait after a failed move, doubled by each further failure up to max_backoff.
  static constexpr std::chrono::milliseconds min_backoff{20};
  /// The longest wait between two attempts.
  static constexpr std::chrono::milliseconds max_backoff{5000};
  /// Turns between two looks at the clock.
  static constexpr unsigned check_every = 64;
  /// How long a time slice another program took counts as sharing the core: a thread that
  /// offers its core every 20 us (idle_spin) and keeps losing it shares it with that program.
  static constexpr std::chrono::milliseconds long_offer_memory{2};

  /// `seed` varies the jitter between threads.
  explicit core_move(uint64_t seed = 0) noexcept;

  /// A turn ended; `busy`: it did work, `sharing`: idle_spin::sharing(), `long_offers`:
  /// idle_spin::long_offers(). Cheap while the thread does not share its core.
  action turn(bool busy, bool sharing, uint64_t long_offers) {
    if (state_ == state::settled && !watching_ && !sharing && long_offers == long_offers_) {
      return action::stay;
    }
    busy_turns_ += busy ? 1 : 0;
    if (++turns_ % check_every != 0) return action::stay;
    const auto now = clock::now();
    return look(now, sharing || contended(now, long_offers));
  }

  /// Decides at `now` from the turns counted so far; `shared`: the thread shares its core (what
  /// turn() does every check_every turns; public for tests).
  action look(clock::time_point now, bool shared);

  /// Counts `n` turns that did work (for tests: turn() counts them itself).
  void count_busy(uint64_t n) noexcept { busy_turns_ += n; }

  /// The thread slept: the kernel placed it when it woke, and what was counted means nothing.
  void slept() noexcept;

  /// True during a trial on another core.
  bool trying() const noexcept { return state_ == state::trial; }

  /// The wait after the next failed move (for tests).
  std::chrono::milliseconds backoff() const noexcept { return backoff_; }

private:
  enum class state : uint8_t { settled, trial };

  /// True when another program took the core for a time slice within long_offer_memory.
  bool contended(clock::time_point now, uint64_t long_offers) noexcept;

  /// A random duration in [0, max) (the jitter).
  clock::duration jitter(clock::duration max) noexcept;

  state state_ = state::settled;
  bool watching_ = false;              ///< counting while sharing, before a move
  clock::time_point since_{};          ///< start of the count
  clock::time_point until_{};          ///< end of the count
  clock::time_point next_try_{};       ///< no move before this
  uint64_t busy_turns_ = 0;            ///< turns that did work since since_
  uint64_t turns_ = 0;                 ///< every turn (for check_every)
  uint64_t long_offers_ = 0;           ///< idle_spin::long_offers() at the last look
  clock::time_point long_offer_at_{};  ///< the last look that saw it grow
  double rate_before_ = 0;             ///< busy turns per second before the move
  std::chrono::milliseconds backoff_ = min_backoff;
  uint64_t random_;                    ///< xorshift state of the jitter
};

/// Moves the calling thread to another core of its affinity mask (the next one after the current
/// core), leaving the mask as it was. Returns the core it left, or -1 when it did not move (a mask
/// of one core, or an error).
int move_off() noexcept;

/// Moves the calling thread back to `cpu` (what move_off returned), leaving the mask as it was.
void move_back(int cpu) noexcept;

/// True when the calling thread may run on more than one core.
bool may_move() noexcept;

}  // namespace comm::actors::detail
