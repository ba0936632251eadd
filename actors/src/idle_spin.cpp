// The progress thread's idle policy (see idle_spin.hpp).
#include "idle_spin.hpp"

#include <thread>

namespace comm::actors::detail {

void idle_spin::busy() noexcept {
  // Did the work follow letting another thread run on this core?
  if (last_ == last_offer::taken) {
    sharing_ = true;
    quick_offers_ = 0;
  } else if (last_ == last_offer::quick) {
    sharing_ = false;  // it came from another core while nobody else ran on this one
  }
  idle_turns_ = 0;
  last_ = last_offer::none;
}

idle_spin::action idle_spin::idle(std::chrono::microseconds spin_time) {
  last_ = last_offer::none;
  if (idle_turns_++ == 0) idle_since_ = clock::now();
  // Spinning must stay cheap: unless sharing, the clock is read every idle_check turns.
  if (!sharing_ && idle_turns_ % idle_check != 0) return action::poll;
  const auto now = clock::now();
  if (now - idle_since_ >= spin_time) {
    idle_turns_ = 0;
    return action::sleep;
  }
  if (sharing_ || now - offered_ >= offer_interval) offer(now);
  return action::poll;
}

void idle_spin::offer(clock::time_point now) {
  std::this_thread::yield();
  offered_ = clock::now();
  offered(offered_ - now);
}

void idle_spin::offered(std::chrono::nanoseconds took) noexcept {
  if (took > long_offer) {
    // Another program's time slice: offering often would only give it more.
    ++long_offers_;
    sharing_ = false;
    quick_offers_ = 0;
    last_ = last_offer::none;
  } else if (took < quick_offer) {
    last_ = last_offer::quick;
    if (sharing_ && ++quick_offers_ >= quick_offers_to_stop) sharing_ = false;
  } else {
    last_ = last_offer::taken;
    quick_offers_ = 0;
  }
}

}  // namespace comm::actors::detail
