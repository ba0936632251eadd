// The pending events of a partition: a calendar of buckets one lookahead wide (a window of the
// conservative protocol spans at most three of them), unsorted inside, plus a heap for events
// beyond the calendar's horizon. Windows take whole buckets at a time; the engine then sorts a
// window's events, so each event costs an append, a scan and its share of a small sort instead of
// a heap's O(log n) cache misses, and no allocation once the buckets have grown.
#pragma once

#include <comm/sim/config.hpp>
#include <comm/sim/event.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace comm::sim::detail {

/// Pending events ordered by time for window extraction (see the file comment).
template <class Message>
class future_events {
public:
  using event_type = event<Message>;

  /// A calendar of `ring` buckets (a power of two) of `width` time units each (width > 0).
  explicit future_events(sim_time width, size_t ring = 256)
      : inverse_width_(1.0 / width), buckets_(ring), mask_(ring - 1) {}

  /// Adds an event. Its time must not be before the start of the last window taken.
  void push(const event_type& e) {
    const uint64_t b = std::max(bucket_of(e.time), base_);
    if (b - base_ > mask_) {
      far_.push_back(e);
      std::push_heap(far_.begin(), far_.end(), later);
      return;
    }
    bucket& k = buckets_[b & mask_];
    if (k.events.empty()) give_storage(k);
    k.events.push_back(e);
    k.min = std::min(k.min, e.time);
    k.max = std::max(k.max, e.time);
    ++ring_count_;
  }

  /// Number of pending events.
  size_t size() const noexcept { return ring_count_ + far_.size(); }

  /// The earliest pending time, no_event when empty.
  sim_time min_time() const noexcept {
    if (ring_count_ > 0) {
      for (uint64_t b = base_;; ++b) {
        const bucket& k = buckets_[b & mask_];
        if (!k.events.empty()) return k.min;
      }
    }
    return far_.empty() ? no_event : far_.front().time;
  }

  /// Moves every event whose time is before `end` to `out` (in no particular order). Events
  /// pushed afterwards must not be before `end`.
  void take_before(sim_time end, std::vector<event_type>& out) {
    const uint64_t target = bucket_of(end);
    const uint64_t last = std::min(target, base_ + mask_);
    for (uint64_t b = base_; b <= last && ring_count_ > 0; ++b) take_from(b, end, out);
    base_ = std::max(base_, target);
    while (!far_.empty() && bucket_of(far_.front().time) <= base_ + mask_) {
      std::pop_heap(far_.begin(), far_.end(), later);
      const event_type e = far_.back();
      far_.pop_back();
      if (e.time < end) {
        out.push_back(e);
      } else {
        push(e);
      }
    }
  }

private:
  struct bucket {
    std::vector<event_type> events;
    sim_time min = no_event;   ///< earliest event time in the bucket
    sim_time max = -no_event;  ///< latest event time in the bucket
  };

  /// The bucket number of a time: floor(time / width), monotonic in time; times too large for
  /// the calendar get a number that sends them to the far heap.
  uint64_t bucket_of(sim_time t) const noexcept {
    const double b = t * inverse_width_;
    return b < 0x1.0p62 ? static_cast<uint64_t>(b) : (uint64_t{1} << 62);
  }

  /// Heap order of far_: the earliest event on top.
  static bool later(const event_type& a, const event_type& b) noexcept { return a.time > b.time; }

  /// Moves bucket b's events before `end` to `out`, keeping the rest.
  void take_from(uint64_t b, sim_time end, std::vector<event_type>& out) {
    bucket& k = buckets_[b & mask_];
    if (k.events.empty() || k.min >= end) return;
    if (k.max < end && out.empty()) {  // the whole bucket, the usual case: swap storage
      ring_count_ -= k.events.size();
      out.swap(k.events);
      k.events.clear();
      k.min = no_event;
      k.max = -no_event;
      keep_storage(k);
      return;
    }
    size_t kept = 0;
    sim_time min = no_event;
    for (const event_type& e : k.events) {
      if (e.time < end) {
        out.push_back(e);
      } else {
        k.events[kept++] = e;
        min = std::min(min, e.time);
      }
    }
    ring_count_ -= k.events.size() - kept;
    k.events.resize(kept);
    k.min = min;
    if (kept == 0) k.max = -no_event;
    if (kept == 0) keep_storage(k);
  }

  /// An emptied bucket's storage goes to the spares, so that only the few buckets in use hold
  /// memory, however many the calendar has.
  void keep_storage(bucket& k) {
    if (spares_.size() < max_spares && k.events.capacity() > 0) {
      spares_.push_back(std::move(k.events));
      k.events = {};
    }
  }

  /// An empty bucket about to be filled takes a spare's storage.
  void give_storage(bucket& k) {
    if (k.events.capacity() == 0 && !spares_.empty()) {
      k.events = std::move(spares_.back());
      spares_.pop_back();
    }
  }

  static constexpr size_t max_spares = 8;

  double inverse_width_;
  std::vector<bucket> buckets_;        ///< buckets_[b & mask_] holds bucket b, base_ <= b <= base_ + mask_
  uint64_t mask_;
  uint64_t base_ = 0;                  ///< no pending event is in a bucket before this one
  size_t ring_count_ = 0;              ///< events in the buckets
  std::vector<event_type> far_;        ///< min-heap by time of events beyond the calendar
  std::vector<std::vector<event_type>> spares_;
};

}  // namespace comm::sim::detail
