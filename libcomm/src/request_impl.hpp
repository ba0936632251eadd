// Requests: the state of one nonblocking operation, pooled per worker.
//
// A request is a common header, which the worker, the endpoint queues and completion use, plus the
// state of the protocol module that runs it. That state lives in the request's `state` storage as
// a type only its module knows (request::init<S>, request::as<S>), so a new protocol adds its own
// state type without touching this file (unless that type outgrows `state_capacity`). Requests
// come from the worker's pool and are reused: resetting one copies the header from a blank
// template, and init<S> copies S's blank over the state storage, both in fixed 16-byte moves.
#pragma once

#include <comm/callback.hpp>
#include <comm/operation.hpp>
#include <comm/transport/transport.hpp>
#include <comm/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

// Sanitizer and debug builds check that a request's state is read as the type it was made with.
#if !defined(NDEBUG) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COMM_CHECK_REQUEST_STATE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define COMM_CHECK_REQUEST_STATE 1
#endif
#endif
#ifndef COMM_CHECK_REQUEST_STATE
#define COMM_CHECK_REQUEST_STATE 0
#endif

namespace comm {

namespace detail {
class endpoint_impl;
class worker_impl;
struct request_ops;
}  // namespace detail

namespace detail {

/// The library's side of comm::operation: empties an operation whose request goes away.
struct operation_access {
  /// `o` no longer owns a request; it reports `final` from now on.
  static void empty(operation& o, status final) noexcept {
    o.req_ = nullptr;
    o.st_ = final;
  }
  /// The request `o` owns, or null.
  static request* request_of(const operation& o) noexcept { return o.req_; }
  /// The operation owning the request of `o` (if any): operation(o) with the link inline.
  static operation adopt(op o) noexcept;
};

}  // namespace detail

/// The plain fields of a request: the common header, then the storage of its module's state.
struct request_fields {
  /// What the worker itself does with a request; everything else is its module's business.
  enum class role : uint8_t {
    operation,  ///< a protocol module's operation (send, receive, RMA, ...)
    flush,      ///< an endpoint flush (also the request of an immediate completion)
    close,      ///< an endpoint close: the notice to the peer, then a flush
    control,    ///< a protocol message queued for the peer (acknowledgement, reply, wireup)
    fence,      ///< worker::fence: later sends wait until earlier ones completed
  };

  role type = role::operation;            ///< what the worker does with it
  bool finished = false;                  ///< the operation is over (callback called)
  bool released = false;                  ///< the user released it; free once finished
  bool user_visible = false;              ///< handed to the user (must not be freed by us)
  bool has_started = false;               ///< something reached the transport (no cancel)
  bool issuing = false;                   ///< its module is issuing it (defer ordered completion)
  bool holds = false;                     ///< its module keeps something to release at completion
  bool silenced = false;                  ///< released by its operation: no notification
  bool has_completion = false;            ///< `completion` may hold the user's callable
  bool notifying = false;                 ///< its completion runs: a release frees it after
  status st = status::in_progress;        ///< in_progress, or the final status
  int tl_in_flight = 0;                   ///< transport operations (zcopy, get, flush) under way

  // The structs copied whole sit on 16-byte boundaries, so that no 16-byte move of theirs
  // straddles a cache line.
  request_params params;                  ///< callbacks and flags
  alignas(16) tl::completion tl_completion; ///< transport completion of zcopy, get, put, flush
  const detail::request_ops* ops = nullptr; ///< its module's functions
  detail::worker_impl* owner = nullptr;   ///< the worker whose pool holds it
  detail::endpoint_impl* ep = nullptr;    ///< the endpoint it runs on, if any
  request* next_pending = nullptr;        ///< in the endpoint's pending queue
  request* next_outstanding = nullptr;    ///< in the endpoint's ordered completion queue
  operation* handle = nullptr;            ///< the comm::operation that owns it, if any
#if COMM_CHECK_REQUEST_STATE
  const void* state_type = nullptr;       ///< identifies the type in `state` (checked builds)
#endif

  /// Bytes of module state a request holds.
  static constexpr size_t state_capacity = 272;
  /// The module's state (request::init<S>).
  alignas(16) unsigned char state[state_capacity];
};

static_assert(std::is_trivially_copyable_v<request_fields> &&
                  std::is_standard_layout_v<request_fields> &&
                  offsetof(request_fields, params) % 16 == 0 &&
                  offsetof(request_fields, tl_completion) % 16 == 0 &&
                  offsetof(request_fields, state) % 16 == 0,
              "request::reset copies the header in 16-byte words up to the state storage");

/// One nonblocking operation (send, receive, flush, close, control message, RMA). Allocated from
/// the worker's pool; its buffers keep their capacity across reuse.
class request : public request_fields {
public:
  /// iov entries every pooled request has room for from its creation, so that a post of up to
  /// that many entries allocates nothing whichever free request it gets.
  static constexpr size_t reserved_iov_entries = 4;

  std::vector<iov_entry> iov;             ///< the user's data: what is sent, received or moved
  std::vector<uint8_t> header;            ///< an active message's user header (sent or received)
  std::vector<uint8_t> wire;              ///< an encoded protocol message kept until it is sent
  /// The C++ face's completion callable, moved here when the operation outlives its call;
  /// params.user_data then points at it (has_completion set). Empty whenever the request is free.
  detail::callback_slot completion;

  /// Resets the header for reuse from the pool (the state is set by init).
  void reset() {
    // Copies from a blank template in straight-line 16-byte moves: assigning a temporary, a memcpy
    // of the whole, or even a loop of vector moves compiles to `rep stos`/`rep movs`, whose
    // start-up cost dominated the per-message path.
    static const request_fields blank{};
    copy_blank<offsetof(request_fields, state)>(static_cast<request_fields*>(this), &blank);
    iov.clear();
    header.clear();
    wire.clear();
  }

  /// Sets the data entries (the list is empty after reset); one entry goes in without a call.
  void set_iov(const iov_entry* entries, size_t count) {
    if (count == 1) {
      iov.push_back(*entries);
    } else {
      iov.assign(entries, entries + count);
    }
  }

  /// Gives the request a blank state of type S (its module's) and returns it.
  template <class S>
  S& init() {
    static_assert(std::is_trivially_copyable_v<S> && std::is_trivially_destructible_v<S>,
                  "request state is copied and dropped as bytes");
    static_assert(sizeof(S) <= state_capacity && alignof(S) <= 16,
                  "request state too large: raise request_fields::state_capacity");
    static const S blank{};
    copy_blank<sizeof(S)>(state, &blank);
#if COMM_CHECK_REQUEST_STATE
    state_type = &type_id<S>;
#endif
    return as<S>();
  }

  /// The state of type S that init<S> made.
  template <class S>
  S& as() {
#if COMM_CHECK_REQUEST_STATE
    if (state_type != &type_id<S>) wrong_state();
#endif
    return *std::launder(reinterpret_cast<S*>(state));
  }

  /// The request whose state (or the part of it at `member_offset`) is at `part`.
  static request* of_state(void* part, size_t member_offset = 0) {
    auto* fields = reinterpret_cast<request_fields*>(static_cast<char*>(part) - member_offset -
                                                     offsetof(request_fields, state));
    return static_cast<request*>(fields);
  }

  /// The request whose transport completion is `c`.
  static request* of_completion(tl::completion* c) {
    return static_cast<request*>(reinterpret_cast<request_fields*>(
        reinterpret_cast<char*>(c) - offsetof(request_fields, tl_completion)));
  }

private:
  /// Copies `Bytes` bytes from `from` to `to` as fixed-size copies: one 16-byte load and store
  /// each (g++ 12 and clang 14 for x86-64, clang 14 for aarch64), then the tail.
  template <size_t Bytes>
  static void copy_blank(void* to, const void* from) {
    copy_words(static_cast<char*>(to), static_cast<const char*>(from),
               std::make_index_sequence<Bytes / 16>{});
    if constexpr (Bytes % 16 != 0) {
      std::memcpy(static_cast<char*>(to) + Bytes / 16 * 16,
                  static_cast<const char*>(from) + Bytes / 16 * 16, Bytes % 16);
    }
  }

  /// Copies 16-byte word I of `from` to `to`, for every I.
  template <size_t... I>
  static void copy_words(char* to, const char* from, std::index_sequence<I...>) {
    (std::memcpy(to + 16 * I, from + 16 * I, 16), ...);
  }

#if COMM_CHECK_REQUEST_STATE
  /// One address per state type.
  template <class S>
  static constexpr char type_id = 0;
  /// A module read a request's state as another type than it was made with.
  [[noreturn]] static void wrong_state() {
    std::fputs("libcomm: a request's state was read as another type than it holds\n", stderr);
    std::abort();
  }
#endif
};

namespace detail {

inline operation operation_access::adopt(op o) noexcept {
  operation adopted;  // returned in place (the move constructor would relink it otherwise)
  adopted.st_ = o.st;
  adopted.req_ = o.req;
  if (o.req != nullptr) o.req->handle = &adopted;
  return adopted;
}

}  // namespace detail

}  // namespace comm
