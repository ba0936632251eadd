// Moving the progress thread off a shared core (see core_move.hpp).
#include "core_move.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace comm::actors::detail {

namespace {

/// Busy turns per second between `from` and `to`.
double rate(uint64_t busy_turns, core_move::clock::time_point from,
            core_move::clock::time_point to) {
  const double seconds = std::chrono::duration<double>(to - from).count();
  return seconds > 0 ? static_cast<double>(busy_turns) / seconds : 0.0;
}

/// The calling thread's affinity mask; false on error.
bool mask_of_thread(cpu_set_t* set) noexcept {
  CPU_ZERO(set);
  return pthread_getaffinity_np(pthread_self(), sizeof(*set), set) == 0;
}

/// Runs the calling thread on `cpu` now, then gives it `mask` back (which does not move it).
bool place_on(int cpu, const cpu_set_t& mask) noexcept {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  const bool moved = pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0;
  pthread_setaffinity_np(pthread_self(), sizeof(mask), &mask);
  return moved;
}

}  // namespace

core_move::core_move(uint64_t seed) noexcept : random_(seed * 0x9e3779b97f4a7c15ull | 1) {}

core_move::clock::duration core_move::jitter(clock::duration max) noexcept {
  random_ ^= random_ << 13;
  random_ ^= random_ >> 7;
  random_ ^= random_ << 17;
  const auto ticks = static_cast<uint64_t>(std::max<clock::rep>(max.count(), 1));
  return clock::duration(static_cast<clock::rep>(random_ % ticks));
}

bool core_move::contended(clock::time_point now, uint64_t long_offers) noexcept {
  if (long_offers != long_offers_) {
    long_offers_ = long_offers;
    long_offer_at_ = now;
  }
  return long_offer_at_ != clock::time_point{} && now - long_offer_at_ < long_offer_memory;
}

core_move::action core_move::look(clock::time_point now, bool shared) {
  if (state_ == state::trial) {
    if (now < until_) return action::stay;
    const double after = rate(busy_turns_, since_, now);
    state_ = state::settled;
    watching_ = false;
    if (after >= rate_before_) {
      // Stays a while: the threads around it need time to settle after a move.
      backoff_ = min_backoff;
      next_try_ = now + min_backoff + jitter(min_backoff);
      return action::stay;
    }
    next_try_ = now + backoff_ + jitter(backoff_);
    backoff_ = std::min(backoff_ * 2, max_backoff);
    return action::go_back;
  }
  if (!shared) {
    watching_ = false;
    return action::stay;
  }
  if (!watching_) {
    watching_ = true;
    since_ = now;
    until_ = now + window + jitter(window);
    busy_turns_ = 0;
    return action::stay;
  }
  if (now < until_ || now < next_try_) return action::stay;
  rate_before_ = rate(busy_turns_, since_, now);
  state_ = state::trial;
  watching_ = false;
  since_ = now;
  until_ = now + window;
  busy_turns_ = 0;
  return action::leave;
}

void core_move::slept() noexcept {
  state_ = state::settled;
  watching_ = false;
}

bool may_move() noexcept {
  cpu_set_t mask;
  return mask_of_thread(&mask) && CPU_COUNT(&mask) > 1;
}

int move_off() noexcept {
  cpu_set_t mask;
  const int here = sched_getcpu();
  if (here < 0 || !mask_of_thread(&mask) || CPU_COUNT(&mask) < 2) return -1;
  for (int step = 1; step < CPU_SETSIZE; ++step) {
    const int cpu = (here + step) % CPU_SETSIZE;
    if (CPU_ISSET(cpu, &mask)) return place_on(cpu, mask) ? here : -1;
  }
  return -1;
}

void move_back(int cpu) noexcept {
  cpu_set_t mask;
  if (cpu < 0 || !mask_of_thread(&mask) || !CPU_ISSET(cpu, &mask)) return;
  place_on(cpu, mask);
}

}  // namespace comm::actors::detail
