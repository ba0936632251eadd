// The pending queue of one endpoint: operations parked after status::no_resource, retried in
// order when the transport thinks resources may have freed up. Intrusive (uses pending_req::next),
// so parking never allocates. Shared by every transport under transports/.
#pragma once

#include <comm/transport/transport.hpp>

#include <cstddef>

namespace comm::tl {

class pending_queue {
public:
  /// True when nothing is parked.
  bool empty() const { return head_ == nullptr; }

  /// True while dispatch() runs; sends from a dispatched request must not be refused because
  /// the queue is not empty.
  bool dispatching() const { return dispatching_; }

  /// True when a new send must answer no_resource to keep the parked requests first.
  bool blocks_sends() const { return head_ != nullptr && !dispatching_; }

  /// Parks `req` at the tail.
  void push_back(pending_req* req) {
    req->next = nullptr;
    if (tail_ == nullptr) {
      head_ = req;
    } else {
      tail_->next = req;
    }
    tail_ = req;
    ++size_;
  }

  /// Removes every parked request, handing each to `cb` in order.
  void purge(void (*cb)(pending_req* req, void* arg), void* arg) {
    while (pending_req* req = pop_front()) {
      if (cb != nullptr) cb(req, arg);
    }
  }

  /// Retries the requests parked when the call started, in order, until one answers no_resource
  /// (it stays at the head). A request answering in_progress re-added itself; one answering an
  /// error is dropped (the request reported it). Returns the number of requests that ran to ok or
  /// in_progress.
  unsigned dispatch() {
    unsigned done = 0;
    size_t budget = size_;
    dispatching_ = true;
    while (budget-- > 0) {
      pending_req* req = pop_front();
      if (req == nullptr) break;
      const status st = req->func(req);
      if (st == status::no_resource) {
        push_front(req);
        break;
      }
      ++done;
    }
    dispatching_ = false;
    return done;
  }

private:
  pending_req* pop_front() {
    pending_req* req = head_;
    if (req == nullptr) return nullptr;
    head_ = req->next;
    if (head_ == nullptr) tail_ = nullptr;
    req->next = nullptr;
    --size_;
    return req;
  }

  void push_front(pending_req* req) {
    req->next = head_;
    head_ = req;
    if (tail_ == nullptr) tail_ = req;
    ++size_;
  }

  pending_req* head_ = nullptr;
  pending_req* tail_ = nullptr;
  size_t size_ = 0;
  bool dispatching_ = false;
};

}  // namespace comm::tl
