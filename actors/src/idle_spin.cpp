// The progress thread's idle policy (see idle_spin.hpp).
#include "idle_spin.hpp"

#include <thread>

namespace comm::actors::detail {

idle_spin::action idle_spin::idle(std::chrono::microseconds spin_time) {
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
  const auto took = offered_ - now;
  if (took > long_offer) {
    sharing_ = false;  // another program's time slice: offering often would only give it more
    quick_offers_ = 0;
  } else if (took < quick_offer) {
    if (sharing_ && ++quick_offers_ >= quick_offers_to_stop) sharing_ = false;
  } else {
    sharing_ = true;
    quick_offers_ = 0;
  }
}

}  // namespace comm::actors::detail
