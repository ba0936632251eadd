// result<T>: a value or the status that says why there is none, returned by libcomm's factory
// functions (worker::create, connect, accept, listen, mem_map, rkey_unpack, rkey_pack). It plays
// the part of C++23's std::expected<T, status>, which C++20 lacks.
#pragma once

#include <comm/status.hpp>

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace comm {

/// Thrown by result::value() when the result holds an error.
class bad_result_access : public std::logic_error {
public:
  /// @param why the status the result held
  explicit bad_result_access(comm::status why)
      : std::logic_error(std::string("libcomm: result holds an error: ") + to_string(why)),
        why_(why) {}

  /// The status the result held.
  comm::status error() const noexcept { return why_; }

private:
  comm::status why_;
};

/// Either a value of type T or an error status (never status::ok, never in_progress).
///
/// @code
/// comm::result<comm::endpoint_ptr> ep = w->connect(peer_address);
/// if (!ep) return ep.error();            // why it failed
/// (*ep)->tag_send(7, bytes);             // or ep.value(), which throws bad_result_access
/// @endcode
template <class T>
class [[nodiscard]] result {
public:
  static_assert(!std::is_reference_v<T> && !std::is_same_v<std::remove_cv_t<T>, comm::status>,
                "result<T> holds a value type other than status");

  /// A result holding `value`.
  result(T value) noexcept(std::is_nothrow_move_constructible_v<T>) : has_(true) {
    ::new (static_cast<void*>(&value_)) T(std::move(value));
  }

  /// A result holding the error `why`. An `why` that is not an error (ok, in_progress) becomes
  /// status::invalid_param: a result without a value always says what went wrong.
  result(comm::status why) noexcept : why_(is_error(why) ? why : comm::status::invalid_param) {}

  /// Moves the value or the error of `other`.
  result(result&& other) noexcept(std::is_nothrow_move_constructible_v<T>)
      : has_(other.has_), why_(other.why_) {
    if (has_) ::new (static_cast<void*>(&value_)) T(std::move(other.value_));
  }

  /// Replaces the content with that of `other`.
  result& operator=(result&& other) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (this != &other) {
      destroy();
      has_ = other.has_;
      why_ = other.why_;
      if (has_) ::new (static_cast<void*>(&value_)) T(std::move(other.value_));
    }
    return *this;
  }

  /// Copies the value or the error of `other` (when T is copyable).
  result(const result& other) requires std::is_copy_constructible_v<T>
      : has_(other.has_), why_(other.why_) {
    if (has_) ::new (static_cast<void*>(&value_)) T(other.value_);
  }

  /// Replaces the content with a copy of that of `other` (when T is copyable).
  result& operator=(const result& other) requires std::is_copy_constructible_v<T> {
    if (this != &other) {
      destroy();
      has_ = other.has_;
      why_ = other.why_;
      if (has_) ::new (static_cast<void*>(&value_)) T(other.value_);
    }
    return *this;
  }

  /// Destroys the value, if any.
  ~result() { destroy(); }

  /// True when the result holds a value.
  explicit operator bool() const noexcept { return has_; }
  /// True when the result holds a value.
  bool has_value() const noexcept { return has_; }

  /// status::ok with a value, else the error.
  comm::status error() const noexcept { return why_; }

  /// The value; throws bad_result_access when the result holds an error.
  T& value() & {
    check();
    return value_;
  }
  /// The value; throws bad_result_access when the result holds an error.
  const T& value() const& {
    check();
    return value_;
  }
  /// The value, moved out; throws bad_result_access when the result holds an error.
  T&& value() && {
    check();
    return std::move(value_);
  }

  /// The value (the result must hold one).
  T& operator*() & noexcept { return value_; }
  /// The value (the result must hold one).
  const T& operator*() const& noexcept { return value_; }
  /// The value, moved out (the result must hold one).
  T&& operator*() && noexcept { return std::move(value_); }
  /// Member access to the value (the result must hold one).
  T* operator->() noexcept { return &value_; }
  /// Member access to the value (the result must hold one).
  const T* operator->() const noexcept { return &value_; }

private:
  void check() const {
    if (!has_) throw bad_result_access(why_);
  }
  void destroy() noexcept {
    if (has_) value_.~T();
    has_ = false;
  }

  bool has_ = false;
  comm::status why_ = comm::status::ok;
  union {
    T value_;
  };
};

}  // namespace comm
