// inline_callback: the completion callable of the C++ face. A lambda (or any callable) that
// captures what it needs is stored inside the object, and from there inside the operation's
// request, never on the heap: starting an operation with a capturing completion allocates
// nothing. The capacity is fixed (inline_callback_capacity, six pointers); a callable that does
// not fit is refused at compile time.
#pragma once

#include <comm/status.hpp>
#include <comm/types.hpp>

#include <cstddef>
#include <cstring>
#include <functional>
#include <new>
#include <type_traits>
#include <utility>

namespace comm {

/// Bytes a completion callable may occupy (its captures): six pointers.
inline constexpr size_t inline_callback_capacity = 6 * sizeof(void*);

namespace detail {

/// How to move and destroy a stored callable of some type (null: trivially, as bytes).
struct callback_ops {
  void (*relocate)(void* to, void* from) noexcept;  ///< move-constructs at `to`, destroys `from`
  void (*destroy)(void* self) noexcept;             ///< destroys the callable at `self`
};

/// callback_ops plus the calls of a callable with signature Sig.
template <class Sig>
struct callback_ops_of;

template <class F, class R, class... A>
struct callback_table;

/// callback_ops plus the calls of a callable taking A... and returning R.
template <class R, class... A>
struct callback_ops_of<R(A...)> : callback_ops {
  R (*invoke)(void* self, A... args);  ///< calls the callable at `self`
  /// Calls the callable in the callback_slot `slot` once, then destroys it and empties the slot.
  /// Shaped as the low-level C callback of the same arguments (send_callback,
  /// tag_recv_callback, stream_recv_callback, am_recv_data_callback), so that the library hands
  /// it to an operation directly, with the slot as user_data: a completion costs one call.
  void (*complete)(request* req, A... args, void* slot);
};

/// Storage for one callable of any signature: what an inline_callback holds, and what a
/// request holds once it has taken a completion over. Moving it moves the callable.
class callback_slot {
public:
  /// Empty. User-provided, so that a value-initialised slot (a defaulted completion argument,
  /// `= {}`) sets the table pointer alone rather than zeroing the whole storage too.
  callback_slot() noexcept {}
  /// Takes the callable of `other`, which becomes empty.
  callback_slot(callback_slot&& other) noexcept { take(other); }
  /// Destroys this callable and takes that of `other`, which becomes empty.
  callback_slot& operator=(callback_slot&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  callback_slot(const callback_slot&) = delete;
  callback_slot& operator=(const callback_slot&) = delete;
  /// Destroys the callable.
  ~callback_slot() { reset(); }

  /// True when a callable is stored.
  explicit operator bool() const noexcept { return ops_ != nullptr; }

  /// Destroys the callable; the slot is empty afterwards.
  void reset() noexcept {
    if (ops_ == nullptr) return;
    if (ops_->destroy != nullptr) ops_->destroy(buffer_);
    ops_ = nullptr;
  }

  /// Stores `f` (a callable of signature R(A...)).
  template <class R, class... A, class F>
  void emplace(F&& f) {
    using stored = std::decay_t<F>;
    static_assert(sizeof(stored) <= inline_callback_capacity,
                  "completion callable too large for inline storage: capture at most six "
                  "pointers' worth (capture a pointer to a larger object instead)");
    static_assert(alignof(stored) <= alignof(std::max_align_t),
                  "completion callable over-aligned for inline storage");
    static_assert(std::is_nothrow_move_constructible_v<stored>,
                  "completion callable must be nothrow move constructible (it is relocated)");
    reset();
    ::new (static_cast<void*>(buffer_)) stored(std::forward<F>(f));
    ops_ = &callback_table<stored, R, A...>::ops;
  }

  /// Calls the stored callable, which was stored with signature Sig.
  template <class Sig, class... Args>
  decltype(auto) invoke(Args&&... args) {
    return static_cast<const callback_ops_of<Sig>*>(ops_)->invoke(buffer_,
                                                                   std::forward<Args>(args)...);
  }

  /// The run-once entry (callback_ops_of::complete) of the stored callable, which was stored
  /// with signature Sig; called with this slot as its last argument.
  template <class Sig>
  auto completion_entry() const noexcept {
    return static_cast<const callback_ops_of<Sig>*>(ops_)->complete;
  }

  /// Moves the callable of `other` into this slot, which must be empty (a free request's):
  /// `other` becomes empty.
  void take_into_empty(callback_slot& other) noexcept { take(other); }

  /// The callable's storage.
  void* storage() noexcept { return buffer_; }
  /// Forgets the callable without destroying it (its complete entry destroyed it).
  void forget() noexcept { ops_ = nullptr; }

private:
  void take(callback_slot& other) noexcept {
    ops_ = other.ops_;
    if (ops_ == nullptr) return;
    if (ops_->relocate != nullptr) {
      ops_->relocate(buffer_, other.buffer_);
    } else {
      std::memcpy(buffer_, other.buffer_, inline_callback_capacity);
    }
    other.ops_ = nullptr;
  }

  alignas(std::max_align_t) unsigned char buffer_[inline_callback_capacity];
  const callback_ops* ops_ = nullptr;
};

/// The operations of callable type F with signature R(A...).
template <class F, class R, class... A>
struct callback_table {
  static void relocate(void* to, void* from) noexcept {
    F* source = std::launder(static_cast<F*>(from));
    ::new (to) F(std::move(*source));
    source->~F();
  }
  static void destroy(void* self) noexcept { std::launder(static_cast<F*>(self))->~F(); }
  static R invoke(void* self, A... args) {
    return std::invoke(*std::launder(static_cast<F*>(self)), std::forward<A>(args)...);
  }
  static void complete(request*, A... args, void* slot) {
    auto& s = *static_cast<callback_slot*>(slot);
    F& f = *std::launder(static_cast<F*>(s.storage()));
    std::invoke(f, std::forward<A>(args)...);
    if constexpr (!std::is_trivially_destructible_v<F>) f.~F();
    s.forget();
  }
  /// Trivially copyable callables (the usual lambda capturing pointers, references and numbers)
  /// move as bytes and need no destruction.
  static constexpr bool trivial = std::is_trivially_copyable_v<F>;
  static constexpr callback_ops_of<R(A...)> ops{
      {trivial ? nullptr : &relocate, trivial ? nullptr : &destroy}, &invoke, &complete};
};

/// Reaches the slot of an inline_callback (the library moves it into the request).
struct callback_access;

}  // namespace detail

/// True for a callable type that inline_callback can store: its captures fit in
/// inline_callback_capacity bytes, it is not over-aligned, and it moves without throwing. A
/// completion that fails this does not compile; capture a pointer to a larger object instead.
template <class F>
concept fits_inline_callback = sizeof(std::decay_t<F>) <= inline_callback_capacity &&
                               alignof(std::decay_t<F>) <= alignof(std::max_align_t) &&
                               std::is_nothrow_move_constructible_v<std::decay_t<F>>;

/// A callable with signature Sig stored inline (see the top of this file).
template <class Sig>
class inline_callback;

/// A move-only callable of signature R(A...) whose captures live inside the object: at most
/// inline_callback_capacity bytes, nothrow movable (a larger callable is a compile-time error).
/// Empty when default-constructed or made from nullptr.
template <class R, class... A>
class inline_callback<R(A...)> {
public:
  /// No callable. (User-provided: value-initialising it, as a defaulted completion argument
  /// does, writes one pointer, not the whole storage.)
  inline_callback() noexcept {}
  /// No callable.
  inline_callback(std::nullptr_t) noexcept {}
  /// Stores `f`, a callable taking A... and returning R that fits inline
  /// (fits_inline_callback).
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, inline_callback> &&
             !std::is_same_v<std::remove_cvref_t<F>, std::nullptr_t> &&
             std::is_invocable_r_v<R, std::decay_t<F>&, A...> && fits_inline_callback<F>)
  inline_callback(F&& f) {
    slot_.template emplace<R, A...>(std::forward<F>(f));
  }
  /// Takes the callable of `other`, which becomes empty.
  inline_callback(inline_callback&& other) noexcept = default;
  /// Takes the callable of `other`, which becomes empty.
  inline_callback& operator=(inline_callback&& other) noexcept = default;

  /// True when a callable is stored.
  explicit operator bool() const noexcept { return static_cast<bool>(slot_); }

  /// Calls the callable (which must be there).
  R operator()(A... args) { return slot_.template invoke<R(A...)>(std::forward<A>(args)...); }

private:
  friend struct detail::callback_access;
  detail::callback_slot slot_;
};

namespace detail {
/// Reaches the slot inside an inline_callback (the library moves it into the request).
struct callback_access {
  /// The slot of `cb`.
  template <class Sig>
  static callback_slot& slot(inline_callback<Sig>& cb) noexcept {
    return cb.slot_;
  }
};
}  // namespace detail

/// What a send, put, get, flush or close completion is told: the outcome (ok or an error).
using send_completion = inline_callback<void(status)>;

/// What a tagged receive's completion is told: ok, message_truncated or an error, and what
/// arrived (sender's tag, bytes written, immediate value).
using tag_recv_completion = inline_callback<void(status, const tag_recv_info&)>;

/// What a stream receive's or worker::am_recv_data's completion is told: the outcome and the
/// bytes written into the buffer.
using length_completion = inline_callback<void(status, size_t)>;

}  // namespace comm
