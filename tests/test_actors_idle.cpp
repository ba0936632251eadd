// The progress threads' idle policy (actors/src/idle_spin.hpp) alone: when an idle turn says
// sleep, that work starts the idle time again, and what the policy learns from offers of the core.
// How long an offer takes depends on the machine, so offers are fed to it with chosen durations
// (idle_spin::offered) where it matters; with spin_time 0 no offer is made.
// Then the policy that moves a progress thread off a shared core (actors/src/core_move.hpp), fed
// chosen times and counts, and the moves themselves on this machine's cores.
#define BOOST_TEST_MODULE actors_idle
#include <boost/test/unit_test.hpp>

#include "core_move.hpp"
#include "idle_spin.hpp"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <thread>

using comm::actors::detail::core_move;
using comm::actors::detail::idle_spin;

namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;

/// An offer nobody took, one another thread of the core took, and another program's slice.
constexpr nanoseconds quick = idle_spin::quick_offer / 2;
constexpr nanoseconds taken = idle_spin::quick_offer * 4;
constexpr nanoseconds slice = idle_spin::long_offer * 4;

/// Idle turns until the policy says sleep, at most `limit`.
unsigned turns_until_sleep(idle_spin& spin, std::chrono::microseconds spin_time, unsigned limit) {
  for (unsigned n = 1; n <= limit; ++n) {
    if (spin.idle(spin_time) == idle_spin::action::sleep) return n;
  }
  return 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(without_spin_time_the_thread_sleeps_at_the_first_look_at_the_clock) {
  idle_spin spin;
  BOOST_TEST(turns_until_sleep(spin, std::chrono::microseconds(0), 1000) == idle_spin::idle_check);
  // Sleeping starts the idle time again, and so does a busy turn.
  BOOST_TEST(turns_until_sleep(spin, std::chrono::microseconds(0), 1000) == idle_spin::idle_check);
  for (unsigned i = 0; i < idle_spin::idle_check / 2; ++i) {
    BOOST_TEST((spin.idle(std::chrono::microseconds(0)) == idle_spin::action::poll));
  }
  spin.busy();
  BOOST_TEST(turns_until_sleep(spin, std::chrono::microseconds(0), 1000) == idle_spin::idle_check);
}

BOOST_AUTO_TEST_CASE(the_thread_spins_for_spin_time_then_sleeps) {
  idle_spin spin;
  const auto spin_time = std::chrono::milliseconds(20);
  const auto start = std::chrono::steady_clock::now();
  // Bounded: 200,000,000 idle turns take far longer than 20 ms.
  const unsigned turns = turns_until_sleep(spin, spin_time, 200'000'000);
  const auto took = std::chrono::steady_clock::now() - start;
  BOOST_TEST(turns != 0u);
  BOOST_TEST((took >= spin_time));
  // Work in between keeps it awake.
  for (int i = 0; i < 1000; ++i) {
    spin.busy();
    BOOST_TEST_REQUIRE((spin.idle(spin_time) == idle_spin::action::poll));
  }
}

BOOST_AUTO_TEST_CASE(work_after_another_thread_ran_starts_sharing_the_core) {
  idle_spin spin;
  BOOST_TEST(!spin.sharing());
  spin.offered(taken);
  spin.busy();
  BOOST_TEST(spin.sharing());
  // While sharing, busy turns in a row and idle turns with taken offers keep it.
  spin.busy();
  spin.offered(taken);
  spin.offered(taken);
  spin.busy();
  BOOST_TEST(spin.sharing());
}

BOOST_AUTO_TEST_CASE(an_offer_taken_without_work_after_it_teaches_nothing) {
  // A CAF worker woken by its timer runs during an offer; the next turns find nothing.
  idle_spin spin;
  spin.offered(taken);
  spin.offered(quick);
  spin.busy();
  BOOST_TEST(!spin.sharing());
}

BOOST_AUTO_TEST_CASE(work_after_a_quick_offer_ends_sharing) {
  // The peer moved to another core: its message came while nobody ran on this one.
  idle_spin spin;
  spin.offered(taken);
  spin.busy();
  BOOST_TEST_REQUIRE(spin.sharing());
  spin.offered(quick);
  spin.busy();
  BOOST_TEST(!spin.sharing());
}

BOOST_AUTO_TEST_CASE(another_programs_slice_ends_sharing_and_teaches_nothing) {
  idle_spin spin;
  spin.offered(taken);
  spin.busy();
  BOOST_TEST_REQUIRE(spin.sharing());
  spin.offered(slice);
  BOOST_TEST(!spin.sharing());
  spin.busy();
  BOOST_TEST(!spin.sharing());
}

BOOST_AUTO_TEST_CASE(a_run_of_quick_offers_ends_sharing) {
  idle_spin spin;
  spin.offered(taken);
  spin.busy();
  BOOST_TEST_REQUIRE(spin.sharing());
  for (unsigned i = 1; i < idle_spin::quick_offers_to_stop; ++i) spin.offered(quick);
  BOOST_TEST(spin.sharing());
  spin.offered(quick);
  BOOST_TEST(!spin.sharing());
}

BOOST_AUTO_TEST_CASE(a_taken_offer_restarts_the_run_of_quick_ones) {
  idle_spin spin;
  spin.offered(taken);
  spin.busy();
  for (unsigned i = 1; i < idle_spin::quick_offers_to_stop; ++i) spin.offered(quick);
  spin.offered(taken);
  for (unsigned i = 1; i < idle_spin::quick_offers_to_stop; ++i) spin.offered(quick);
  BOOST_TEST(spin.sharing());
}

BOOST_AUTO_TEST_CASE(while_sharing_every_idle_turn_offers) {
  // Sharing reads the clock on every idle turn, so with spin_time 0 the first turn sleeps.
  idle_spin spin;
  spin.offered(taken);
  spin.busy();
  BOOST_TEST_REQUIRE(spin.sharing());
  BOOST_TEST((spin.idle(microseconds(0)) == idle_spin::action::sleep));
}

BOOST_AUTO_TEST_CASE(an_offer_that_gave_another_program_its_slice_is_counted) {
  idle_spin spin;
  spin.offered(quick);
  spin.offered(taken);
  BOOST_TEST(spin.long_offers() == 0u);
  spin.offered(slice);
  spin.offered(slice);
  BOOST_TEST(spin.long_offers() == 2u);
}

// -- core_move ------------------------------------------------------------------------------------

namespace {

using move = core_move::action;
using clock_type = core_move::clock;
using std::chrono::milliseconds;

/// The latest a thread sharing its core since `start` moves: a window and its largest jitter.
clock_type::time_point latest_leave(clock_type::time_point start) {
  return start + 2 * core_move::window + milliseconds(1);
}

/// Puts `m` into a trial that began at `t` after `before` busy turns while sharing since `start`.
void start_trial(core_move& m, clock_type::time_point start, uint64_t before,
                 clock_type::time_point* t) {
  BOOST_TEST_REQUIRE((m.look(start, true) == move::stay));
  m.count_busy(before);
  *t = latest_leave(start);
  BOOST_TEST_REQUIRE((m.look(*t, true) == move::leave));
  BOOST_TEST_REQUIRE(m.trying());
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_thread_that_does_not_share_its_core_stays) {
  core_move m(1);
  const auto start = clock_type::now();
  for (int i = 0; i <= 1000; ++i) {
    BOOST_TEST_REQUIRE((m.look(start + milliseconds(i), false) == move::stay));
  }
  // turn() without sharing or another program's slices never looks at all.
  for (int i = 0; i < 100000; ++i) BOOST_TEST_REQUIRE((m.turn(true, false, 0) == move::stay));
}

BOOST_AUTO_TEST_CASE(a_thread_sharing_for_a_window_leaves_and_not_before) {
  core_move m(2);
  const auto start = clock_type::now();
  BOOST_TEST((m.look(start, true) == move::stay));
  BOOST_TEST((m.look(start + core_move::window - milliseconds(1), true) == move::stay));
  BOOST_TEST((m.look(latest_leave(start), true) == move::leave));
  BOOST_TEST(m.trying());
}

BOOST_AUTO_TEST_CASE(a_pause_in_sharing_starts_the_window_again) {
  core_move m(3);
  const auto start = clock_type::now();
  BOOST_TEST((m.look(start, true) == move::stay));
  BOOST_TEST((m.look(start + core_move::window, false) == move::stay));
  const auto again = start + core_move::window + milliseconds(1);
  BOOST_TEST((m.look(again, true) == move::stay));
  BOOST_TEST((m.look(again + core_move::window - milliseconds(1), true) == move::stay));
  BOOST_TEST((m.look(latest_leave(again), true) == move::leave));
}

BOOST_AUTO_TEST_CASE(a_trial_that_does_more_work_per_second_stays) {
  core_move m(4);
  clock_type::time_point t;
  const auto start = clock_type::now();
  start_trial(m, start, 1000, &t);  // about 50,000 busy turns a second
  m.count_busy(10000);               // 1,000,000 a second over the trial
  const auto end = t + core_move::window;
  BOOST_TEST((m.look(end - milliseconds(1), false) == move::stay));
  BOOST_TEST(m.trying());
  BOOST_TEST((m.look(end, false) == move::stay));
  BOOST_TEST(!m.trying());
  BOOST_TEST((m.backoff() == core_move::min_backoff));
}

BOOST_AUTO_TEST_CASE(a_trial_that_does_less_goes_back_and_waits_longer_each_time) {
  core_move m(5);
  auto start = clock_type::now();
  auto wait = core_move::min_backoff;
  for (int attempt = 0; attempt < 12; ++attempt) {
    clock_type::time_point t;
    start_trial(m, start, 100000, &t);
    m.count_busy(10);
    const auto end = t + core_move::window;
    BOOST_TEST_REQUIRE((m.look(end, false) == move::go_back));
    BOOST_TEST(!m.trying());
    BOOST_TEST((m.backoff() == std::min(2 * wait, core_move::max_backoff)));
    // Sharing again at once: no move before the wait (plus at most as much jitter) is over.
    BOOST_TEST_REQUIRE((m.look(end + milliseconds(1), true) == move::stay));
    BOOST_TEST_REQUIRE((m.look(end + wait - milliseconds(1), true) == move::stay));
    start = end + 2 * wait + milliseconds(1);
    BOOST_TEST_REQUIRE((m.look(start, false) == move::stay));  // ends that count
    wait = m.backoff();
  }
  BOOST_TEST((m.backoff() == core_move::max_backoff));
}

BOOST_AUTO_TEST_CASE(sleeping_ends_a_trial_without_going_back) {
  core_move m(6);
  clock_type::time_point t;
  start_trial(m, clock_type::now(), 100000, &t);
  m.slept();
  BOOST_TEST(!m.trying());
  BOOST_TEST((m.look(t + 2 * core_move::window, false) == move::stay));
}

BOOST_AUTO_TEST_CASE(another_programs_slices_count_as_sharing) {
  // turn() reads the clock itself: turns with a growing count of long offers, bounded in number
  // and time, must lead to a move.
  core_move m(7);
  const auto until = clock_type::now() + std::chrono::seconds(10);
  uint64_t long_offers = 0;
  bool left = false;
  for (uint64_t i = 0; !left && clock_type::now() < until; ++i) {
    if (i % core_move::check_every == 0) ++long_offers;
    left = m.turn(true, false, long_offers) == move::leave;
  }
  BOOST_TEST(left);
}

BOOST_AUTO_TEST_CASE(a_move_changes_the_core_and_keeps_the_mask) {
  // In a thread of its own, so that the test's main thread keeps its placement.
  std::thread([] {
    cpu_set_t before;
    BOOST_TEST_REQUIRE(pthread_getaffinity_np(pthread_self(), sizeof(before), &before) == 0);
    const int from = comm::actors::detail::move_off();
    cpu_set_t after;
    BOOST_TEST_REQUIRE(pthread_getaffinity_np(pthread_self(), sizeof(after), &after) == 0);
    BOOST_TEST(CPU_EQUAL(&before, &after));
    if (CPU_COUNT(&before) < 2) {
      BOOST_TEST(!comm::actors::detail::may_move());
      BOOST_TEST(from == -1);  // nowhere to go
      return;
    }
    BOOST_TEST(comm::actors::detail::may_move());
    // The kernel may place the thread again right after a move (its mask allows that), so a
    // move counts when it was seen in one of a few attempts.
    bool moved = false;
    bool back = false;
    for (int attempt = 0; attempt < 5 && !(moved && back); ++attempt) {
      const int left = attempt == 0 ? from : comm::actors::detail::move_off();
      BOOST_TEST_REQUIRE(left >= 0);
      moved = moved || sched_getcpu() != left;  // the mask of one core made the kernel move it
      comm::actors::detail::move_back(left);
      back = back || sched_getcpu() == left;
    }
    BOOST_TEST(moved);
    BOOST_TEST(back);
    BOOST_TEST_REQUIRE(pthread_getaffinity_np(pthread_self(), sizeof(after), &after) == 0);
    BOOST_TEST(CPU_EQUAL(&before, &after));
  }).join();
}
