// The inline part of the C++ face's most common calls (endpoint::tag_send, tag_send_iov,
// worker::tag_recv, tag_recv_iov, defined at the end of endpoint.hpp and worker.hpp). Inline so
// that the face costs what the low-level call does: without a completion the call is the
// low-level one and the operation adopts its request; with one, the compiler sees the callable's
// type, so a completion known at once is a direct call of it, and only an operation still
// running leaves the inline code, to keep its callable in its request (keep_completion, api.cpp).
#pragma once

#include <comm/callback.hpp>
#include <comm/flags.hpp>
#include <comm/operation.hpp>
#include <comm/types.hpp>

namespace comm::detail {

/// The parameters of a C++ face call without completion or flags: one constant that the inline
/// calls pass, instead of zeroing a request_params on the stack for each.
inline constexpr request_params no_request_params{};

/// The request_params of a call with `flags` (a flag set of flags.hpp).
template <class Flags>
  requires is_flag_set_v<Flags>
request_params params_of(Flags flags) noexcept {
  request_params p;
  p.flags = to_bits(flags);
  return p;
}

/// The operation of `o`, a C++ face call still running with a request whose completion was
/// bound to `slot` (the caller's): the callable moves into the request unless the request
/// finished meanwhile (another thread's progress ran it; a callable still there then is
/// destroyed). The slot is empty afterwards. Out of line (api.cpp), under the worker's lock in
/// thread_mode::multi.
operation keep_completion(op o, callback_slot& slot) noexcept;

/// keep_completion, telling the compiler that the slot is empty afterwards (so that the
/// caller's completion argument needs no destruction).
[[gnu::always_inline]] inline operation keep_completion_inline(op o, callback_slot& slot) {
  operation running = keep_completion(o, slot);
  slot.forget();
  return running;
}

/// Runs a C++ face call: `call(params)` is the low-level call, told the completion in `on_done`
/// (if any) through `params` (`bind(entry, slot)` sets its callback and user_data, and for a
/// receive recv_info). An outcome known at once runs the completion here (`now`); one still
/// running keeps it in its request. The worker's lock is not held from the call to the keep: a
/// request that another thread's progress finishes in between runs the callable from the
/// caller's slot, still there, and keep_completion then finds it finished and moves nothing.
template <class Sig, class Bind, class Now, class Call>
[[gnu::always_inline]] inline operation run_face_call(inline_callback<Sig>& on_done,
                                                      request_params& params, Bind&& bind,
                                                      Now&& now, Call&& call) {
  if (!on_done) return operation(call(params));
  callback_slot& slot = callback_access::slot(on_done);
  const auto entry = slot.template completion_entry<Sig>();
  bind(entry, &slot);
  const op o = call(params);
  if (o.req != nullptr) return keep_completion_inline(o, slot);
  if (slot) now(entry, o.st, &slot);  // (an empty slot: the call ran it already)
  slot.forget();
  return operation(o);
}

/// Runs a send-like C++ face call (see run_face_call) with `params` (flags set).
template <class Call>
[[gnu::always_inline]] inline operation run_send_call(send_completion& on_done,
                                                      request_params& params, Call&& call) {
  return run_face_call(
      on_done, params,
      [&](send_callback entry, void* slot) {
        params.send_cb = entry;
        params.user_data = slot;
      },
      [](send_callback entry, status st, void* slot) { entry(nullptr, st, slot); }, call);
}

/// Runs a tagged-receive C++ face call (see run_face_call): the completion is told what
/// arrived.
template <class Call>
[[gnu::always_inline]] inline operation run_tag_recv_call(tag_recv_completion& on_done,
                                                          Call&& call) {
  if (!on_done) return operation(call(no_request_params));
  request_params params;
  tag_recv_info info;
  return run_face_call(
      on_done, params,
      [&](tag_recv_callback entry, void* slot) {
        params.recv_cb = entry;
        params.user_data = slot;
        params.recv_info = &info;
      },
      [&](tag_recv_callback entry, status st, void* slot) { entry(nullptr, st, info, slot); },
      call);
}

}  // namespace comm::detail
