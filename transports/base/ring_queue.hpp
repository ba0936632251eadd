// A first-in first-out queue on a circular buffer that keeps its storage: once it has held n
// elements, holding n again allocates nothing. std::deque allocates and frees a block every few
// elements as a queue moves along, which puts an allocation in the post of an operation (DAT: a
// post allocates no resources). Grows by doubling when full; never shrinks.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace comm::tl {

/// A FIFO queue of T (default-constructible, copy-assignable) whose storage is reused.
template <class T>
class ring_queue {
public:
  /// Iterates from the front to the back.
  template <class Q, class V>
  class basic_iterator {
  public:
    basic_iterator(Q* queue, size_t index) : queue_(queue), index_(index) {}
    /// The element.
    V& operator*() const { return queue_->at(index_); }
    /// Its members.
    V* operator->() const { return &queue_->at(index_); }
    /// Moves to the next element.
    basic_iterator& operator++() {
      ++index_;
      return *this;
    }
    /// True when both point at the same element.
    bool operator==(const basic_iterator& other) const { return index_ == other.index_; }

  private:
    Q* queue_;
    size_t index_;
  };
  using iterator = basic_iterator<ring_queue, T>;
  using const_iterator = basic_iterator<const ring_queue, const T>;

  /// True when it holds nothing.
  bool empty() const { return size_ == 0; }
  /// Elements held.
  size_t size() const { return size_; }
  /// The oldest element (not empty).
  T& front() { return at(0); }
  /// The oldest element (not empty).
  const T& front() const { return at(0); }

  /// Appends a default-constructed element and returns it.
  T& emplace_back() {
    if (size_ == slots_.size()) grow();
    T& slot = slots_[(head_ + size_) & (slots_.size() - 1)];
    slot = T{};
    ++size_;
    return slot;
  }
  /// Appends a copy of `value`.
  void push_back(const T& value) { emplace_back() = value; }
  /// Drops the oldest element (not empty).
  void pop_front() {
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }
  /// Drops every element (the storage stays).
  void clear() {
    head_ = 0;
    size_ = 0;
  }
  /// Drops the elements `drop` holds for, keeping the others in order.
  template <class Pred>
  void remove_if(Pred drop) {
    size_t kept = 0;
    for (size_t i = 0; i < size_; ++i) {
      if (drop(std::as_const(at(i)))) continue;
      if (kept != i) at(kept) = at(i);
      ++kept;
    }
    size_ = kept;
  }

  /// From the front.
  iterator begin() { return {this, 0}; }
  /// Past the back.
  iterator end() { return {this, size_}; }
  /// From the front.
  const_iterator begin() const { return {this, 0}; }
  /// Past the back.
  const_iterator end() const { return {this, size_}; }

  /// The element `index` places behind the front.
  T& at(size_t index) { return slots_[(head_ + index) & (slots_.size() - 1)]; }
  /// The element `index` places behind the front.
  const T& at(size_t index) const { return slots_[(head_ + index) & (slots_.size() - 1)]; }

private:
  /// Doubles the storage (at least 4 slots), moving the elements to its start in order.
  void grow() {
    std::vector<T> bigger(slots_.empty() ? 4 : slots_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(at(i));
    slots_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;  ///< a power of two in size
  size_t head_ = 0;       ///< index of the front
  size_t size_ = 0;       ///< elements held
};

}  // namespace comm::tl
