// The progress threads' idle policy (actors/src/idle_spin.hpp) alone: when an idle turn says
// sleep, and that work starts the idle time again. How long an offer of the core takes depends on
// the machine, so only what does not depend on it is checked: with spin_time 0 no offer is made.
#define BOOST_TEST_MODULE actors_idle
#include <boost/test/unit_test.hpp>

#include "idle_spin.hpp"

#include <chrono>

using comm::actors::detail::idle_spin;

namespace {

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
