// The progress threads' idle policy (actors/src/idle_spin.hpp) alone: when an idle turn says
// sleep, that work starts the idle time again, and what the policy learns from offers of the core.
// How long an offer takes depends on the machine, so offers are fed to it with chosen durations
// (idle_spin::offered) where it matters; with spin_time 0 no offer is made.
#define BOOST_TEST_MODULE actors_idle
#include <boost/test/unit_test.hpp>

#include "idle_spin.hpp"

#include <chrono>

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
