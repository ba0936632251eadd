// What every transport's interface keeps alike: the table of active-message handlers and the error
// handler, with the two setters of the iface interface that fill them. A transport's iface derives
// from iface_base instead of iface and reads handlers_, error_fn_ and error_arg_ when it delivers a
// message or reports a failed endpoint.
#pragma once

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace comm::tl {

/// An iface with its active-message and error handlers kept (see the file comment).
class iface_base : public iface {
public:
  /// Sets the handler of active messages `id`; ids past am_id_count are ignored.
  void set_am_handler(am_id id, am_handler_fn fn, void* arg) override {
    if (id < am_id_count) handlers_[id] = {fn, arg};
  }

  /// Sets the handler of failed endpoints.
  void set_error_handler(error_handler_fn fn, void* arg) override {
    error_fn_ = fn;
    error_arg_ = arg;
  }

protected:
  /// One active-message handler and its argument (fn null: none set).
  struct handler {
    am_handler_fn fn = nullptr;  ///< called with each message of its id
    void* arg = nullptr;         ///< its first argument
  };

  handler handlers_[am_id_count];        ///< by active-message id
  error_handler_fn error_fn_ = nullptr;  ///< called for a failed endpoint, or null
  void* error_arg_ = nullptr;            ///< its first argument
};

/// Counters of the RMA operations an interface ran, for its info().
struct rma_counters {
  uint64_t gets = 0;    ///< gets that succeeded
  uint64_t puts = 0;    ///< puts that succeeded
  uint64_t bytes = 0;   ///< bytes moved by them
  uint64_t errors = 0;  ///< operations that failed

  /// Counts one operation (a put when `put`) of `length` bytes that ended with `result`.
  void count(bool put, size_t length, status result) {
    if (result != status::ok) {
      ++errors;
    } else {
      ++(put ? puts : gets);
      bytes += length;
    }
  }

  /// "G gets, P puts, B bytes, E errors".
  std::string text() const {
    return std::to_string(gets) + " gets, " + std::to_string(puts) + " puts, " +
           std::to_string(bytes) + " bytes, " + std::to_string(errors) + " errors";
  }
};

}  // namespace comm::tl
