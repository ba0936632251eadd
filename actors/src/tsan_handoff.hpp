// Hand-offs through CAF told to ThreadSanitizer. Debian's libcaf_core is not instrumented, so TSan
// does not see the release and acquire with which CAF's mailbox passes a message from the thread
// that made it to the thread that runs its receiver: without a word from us, every read of the
// message by the receiver is reported (and suppressed by tests/tsan_caf.supp, at a cost of several
// milliseconds per report, which made a flood of 40,000 messages take minutes). The node states
// the hand-off itself: `handed_over(p)` right before the object at `p` enters CAF, `taken_over(p)`
// before the receiving side touches it. Writes made after `handed_over` are still reported.
// Outside a ThreadSanitizer build both are empty.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define COMM_ACTORS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define COMM_ACTORS_TSAN 1
#endif
#endif

#ifdef COMM_ACTORS_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace comm::actors::detail {

/// Marks every write to the object at `p` so far as visible to a thread that later calls
/// `taken_over(p)` (ThreadSanitizer builds; empty otherwise).
inline void handed_over(const void* p) noexcept {
#ifdef COMM_ACTORS_TSAN
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

/// The calling thread has received the object at `p` that another thread `handed_over`.
inline void taken_over(const void* p) noexcept {
#ifdef COMM_ACTORS_TSAN
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

}  // namespace comm::actors::detail
