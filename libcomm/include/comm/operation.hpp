// operation: the owning result of a nonblocking operation of the C++ face. It holds the
// operation's request, if it has one, and gives it back to the worker when it goes.
#pragma once

#include <comm/status.hpp>
#include <comm/types.hpp>

namespace comm {

class operation;

namespace detail {
/// Links an operation to its request, and unlinks it (the library's side, operation.cpp).
struct operation_access;
}  // namespace detail

/// A nonblocking operation started through the C++ face (or adopted from a low-level `op`):
/// done at once (no request), or running with a request that this object owns. Move-only.
///
/// Lifetime of the request:
/// - destroying (or assigning over) an operation that is still running releases its request as
///   UCX's ucp_request_free does: the operation goes on inside the worker and completes, but
///   its completion callable (or C callback) is not called, and the callable is destroyed at
///   once. Its buffers stay in use until it completes: cancel() first to stop a receive, or
///   keep the operation until done(). A finished operation's request is simply freed;
/// - detach() gives the request to the worker instead: the completion still runs, then the
///   worker frees the request;
/// - when the worker is destroyed first, every operation it still runs completes (with
///   status::canceled unless it ended before) and each operation object becomes done, keeping
///   that final status; destroying it afterwards touches nothing.
///
/// An operation is used by one thread at a time; in thread_mode::multi its calls take the
/// worker's lock.
class [[nodiscard]] operation {
public:
  /// A finished operation with status::ok.
  operation() noexcept = default;
  /// Takes over `o`, an op of the low-level API: its request (if any) is owned from now on and
  /// must not be released through worker::release or worker::wait any more.
  explicit operation(op o) noexcept : st_(o.st), req_(o.req) {
    if (req_ != nullptr) link();
  }
  /// Takes the request of `other`, which becomes empty (done, status::ok).
  operation(operation&& other) noexcept : st_(other.st_), req_(other.req_) {
    if (req_ != nullptr) relink(other);
  }
  /// Releases this operation's request (see the class comment) and takes that of `other`.
  operation& operator=(operation&& other) noexcept {
    if (this != &other) {
      drop();
      st_ = other.st_;
      req_ = other.req_;
      if (req_ != nullptr) relink(other);
    }
    return *this;
  }
  operation(const operation&) = delete;
  operation& operator=(const operation&) = delete;
  /// Releases the request, if any (see the class comment).
  ~operation() { drop(); }

  /// True once the operation is over: it completed at once, or its request finished (its
  /// completion has run, unless it was silenced).
  bool done() const noexcept { return req_ == nullptr || request_finished(); }

  /// status::in_progress while running, then the final status: ok or the error.
  comm::status status() const noexcept { return req_ == nullptr ? st_ : request_status(); }

  /// Progresses the worker until the operation is over or `timeout_ms` passed (negative: no
  /// limit). Returns the final status, or status::timed_out with the operation still running
  /// (wait again, cancel it, or let it go).
  comm::status wait(int timeout_ms = -1);

  /// Cancels the operation (worker::cancel): report completes it with status::canceled and
  /// runs its completion; force ends it without, and this object becomes done (canceled). Returns
  /// ok, busy when it is past cancelling, or invalid_param when it is over already.
  comm::status cancel(cancel_mode mode = cancel_mode::report);

  /// Lets the worker finish the operation on its own: the completion still runs, the worker frees
  /// the request afterwards. This object becomes empty (done, status::ok), as a moved-from one.
  void detach() noexcept;

  /// The request, for the low-level API (worker::request_status, worker::cancel); null when the
  /// operation completed at once. Stays this object's: never pass it to worker::release.
  request* native_handle() const noexcept { return req_; }

private:
  friend struct detail::operation_access;

  /// True when the request finished (its completion ran).
  bool request_finished() const noexcept;
  /// The request's status: in_progress, or its final one.
  comm::status request_status() const noexcept;
  /// Makes the request point at this object.
  void link() noexcept;
  /// Moves the link of `other`'s request to this object; `other` becomes empty.
  void relink(operation& other) noexcept;
  /// Releases the request as the class comment says.
  void drop() noexcept {
    if (req_ != nullptr) release();
  }
  /// The out-of-line part of drop().
  void release() noexcept;

  comm::status st_ = comm::status::ok;
  request* req_ = nullptr;
};

}  // namespace comm
