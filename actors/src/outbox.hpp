// What other threads hand to the node's progress thread: frames to send and tasks to run, in a
// lock-free multi-producer queue the progress thread empties in one step.
#pragma once

#include "attachments.hpp"
#include "frame.hpp"

#include <caf/actor_control_block.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace comm::actors::detail {

struct peer;

/// Large payload buffers kept for reuse, process-wide: a big message then neither allocates nor
/// faults in fresh memory (which costs more than copying it).
class buffer_pool {
public:
  /// Buffers at least this large are kept...
  static constexpr size_t large = 64 * 1024;

  /// ...and at most this large (larger ones, and a scratch buffer grown larger, are freed).
  static constexpr size_t max_kept = 16 * 1024 * 1024;

  /// An empty buffer, with the capacity of a kept one when there is one.
  static std::vector<char> take();

  /// Keeps `buffer` (emptied) when it is large and the pool has room, else frees it.
  static void give(std::vector<char>&& buffer) noexcept;

  /// Moves what a serialiser wrote into `scratch` to a buffer of its own: small payloads are
  /// copied (scratch keeps its capacity), large ones swapped with a kept buffer.
  static std::vector<char> detach(std::vector<char>& scratch);
};

class node_state;

/// One frame to send (with `to` set) or one task to run on the progress thread.
struct outgoing {
  outgoing* next = nullptr;            ///< the queue's link
  node_state* owner = nullptr;         ///< the node sending it, once in libcomm's hands
  std::shared_ptr<peer> to;            ///< the connection the frame goes to
  frame_header header;                 ///< its envelope (seq is set when it is sent)
  std::vector<char> payload;           ///< its payload
  attachment_list attached;            ///< a message's attachments, kept until it is sent
  std::vector<char> lends;             ///< with flag_lent: the AM's data (schema ActorLends)
  caf::strong_actor_ptr local;         ///< link/unlink: the local actor, made reachable first
  std::function<void()> task;          ///< set: run this instead of sending
  bool unsent = false;                 ///< counted in its peer's unsent_frames until sent

  outgoing() = default;
  outgoing(const outgoing&) = delete;
  outgoing& operator=(const outgoing&) = delete;
  ~outgoing() { buffer_pool::give(std::move(payload)); }
};

/// What a frame waiting in libcomm's send queue counts for against node_params::max_queued_bytes:
/// its payload buffer and itself (attachments are the sender's buffers).
inline size_t queued_cost(const outgoing& item) noexcept {
  return item.payload.capacity() + sizeof(outgoing);
}

/// A multi-producer, single-consumer queue of outgoing items. push is lock-free; the consumer
/// takes everything at once, in the order it was pushed per producer.
class outbox {
public:
  outbox() = default;
  outbox(const outbox&) = delete;
  outbox& operator=(const outbox&) = delete;
  ~outbox() { delete_all(take_all()); }

  /// Appends `item` (any thread). Sequentially consistent, so that a consumer that announced it
  /// will sleep either sees the item or is seen sleeping.
  void push(outgoing* item) noexcept {
    outgoing* head = head_.load(std::memory_order_relaxed);
    do {
      item->next = head;
    } while (!head_.compare_exchange_weak(head, item, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
  }

  /// True when nothing waits (sequentially consistent: see push).
  bool empty() const noexcept { return head_.load(std::memory_order_seq_cst) == nullptr; }

  /// Takes every waiting item, oldest first (consumer only).
  outgoing* take_all() noexcept {
    outgoing* head = head_.exchange(nullptr, std::memory_order_acquire);
    outgoing* fifo = nullptr;
    while (head != nullptr) {
      outgoing* next = head->next;
      head->next = fifo;
      fifo = head;
      head = next;
    }
    return fifo;
  }

  /// Deletes a list of items.
  static void delete_all(outgoing* list) noexcept {
    while (list != nullptr) {
      outgoing* next = list->next;
      delete list;
      list = next;
    }
  }

private:
  std::atomic<outgoing*> head_{nullptr};
};

}  // namespace comm::actors::detail
