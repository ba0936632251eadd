// The C++ face of workers and endpoints: byte spans, a flag type per kind of operation, owning
// results (comm::operation, result<T>, the handles) and completions that capture. Each entry point
// runs the low-level one it mirrors.
//
// A completion reaches the low-level call as a C callback: the run-once entry of the callable's
// type (callback_ops_of::complete, made in callback.hpp where the type is known, so that a
// completion is one call, as a low-level callback is) whose user_data is the callable's slot:
// first the caller's argument, so that an operation that completes inside the call runs it from
// there; once the call returned with the operation still running, the callable moves into the
// request (request::completion) and user_data follows it. Nothing is allocated. An outcome known
// when the call returns (done or failed at once, no request) runs the callable before returning.
// Each callable runs at most once: the entry destroys it once it returned. While it runs its
// request cannot be freed (worker_impl::complete defers a release made from inside it), so the
// callable may drop or reassign its operation.
//
// The most common calls (tag_send, tag_send_iov, tag_recv, tag_recv_iov) are inline
// (comm/face_call.hpp): without a completion they are the low-level call alone; an outcome known
// at once runs the completion there; one still running calls keep_completion here.
#include "rma.hpp"
#include "worker_impl.hpp"

#include "protocols.hpp"

#include <utility>

namespace comm {

namespace detail {

namespace {

/// Moves the callable in `slot` into `req`, which goes on after the call that started it (its
/// slot is empty: a request's is whenever it is free).
inline void keep(request* req, callback_slot& slot) {
  req->completion.take_into_empty(slot);
  req->has_completion = true;
  req->params.user_data = &req->completion;
  req->params.recv_info = nullptr;  // filled during the call only
}

/// The operation of the low-level outcome `o`, whose completion was bound to `slot`. A callable
/// still in the slot has not run: it goes with a request that still runs, runs now (`now`) when
/// the outcome was known at once, and is dropped when the request finished without notifying
/// (a success of an unsignalled RMA operation).
template <class Now>
operation finish(op o, callback_slot& slot, Now&& now) {
  if (o.req == nullptr) {
    if (slot) now(o.st);
  } else if (!o.req->finished && slot) {
    keep(o.req, slot);
  }
  return operation_access::adopt(o);
}

/// Starts a send-like operation with `call(params)` and the completion `on_done`. With
/// `failures_only` (DAT's suppressed and unsignalled RMA) a success known at once is not told.
template <class Call>
operation start_send_like(worker_impl& w, send_completion& on_done, request_params& p,
                          Call&& call, bool failures_only = false) {
  if (!on_done) return operation(call(p));
  worker_impl::guard g(w);
  callback_slot& slot = callback_access::slot(on_done);
  const send_callback entry = slot.completion_entry<void(status)>();
  p.send_cb = entry;
  p.user_data = &slot;
  return finish(call(p), slot, [&](status st) {
    if (is_error(st) || !failures_only) entry(nullptr, st, &slot);
  });
}

/// Starts a tagged receive with `call(params)` and the completion `on_done`, which is told what
/// arrived (inside the call when the message was here already).
template <class Call>
operation start_tag_recv(worker& w, tag_recv_completion& on_done, Call&& call) {
  request_params p;
  if (!on_done) return operation(call(p));
  worker_impl::guard g(impl(w));
  tag_recv_info info;
  callback_slot& slot = callback_access::slot(on_done);
  const tag_recv_callback entry = slot.completion_entry<void(status, const tag_recv_info&)>();
  p.recv_info = &info;
  p.recv_cb = entry;
  p.user_data = &slot;
  return finish(call(p), slot, [&](status st) { entry(nullptr, st, info, &slot); });
}

/// Request parameters with the low-level bits of `flags`.
template <class Flags>
request_params params_with(Flags flags) {
  request_params p;
  p.flags = to_bits(flags);
  return p;
}

/// Starts a put or get with DAT's flags. A suppressed operation with a completion runs as an
/// unsignalled one whose request the worker keeps (its completion is told of a failure only),
/// so that the callable has a request to live in; a failure is counted and logged as for any
/// suppressed operation.
template <class Call>
operation start_rma(worker_impl& w, send_completion& on_done, rma_flags flags, Call&& call) {
  request_params p = params_with(flags);
  const bool suppressed = (flags & rma_flags::completion_suppressed) != rma_flags::none;
  const bool failures_only =
      suppressed || (flags & rma_flags::unsignalled) != rma_flags::none;
  if (!suppressed || !on_done) return start_send_like(w, on_done, p, call, failures_only);
  worker_impl::guard g(w);
  p.flags = (p.flags & ~uint32_t{request_completion_suppressed}) | request_unsignalled;
  operation o = start_send_like(w, on_done, p, call, true);
  request* req = operation_access::request_of(o);
  if (req == nullptr) return o;
  req->params.flags |= request_completion_suppressed;
  const status so_far = req->finished ? req->st : status::ok;
  o.detach();
  return operation(op{is_error(so_far) ? so_far : status::ok, nullptr});
}

}  // namespace

}  // namespace detail

using detail::callback_access;
using detail::callback_slot;
using detail::endpoint_impl;
using detail::impl;
using detail::module_of;
using detail::params_with;
using detail::worker_impl;

// -- endpoint ------------------------------------------------------------------------------------

operation endpoint::am_send(uint16_t id, const_bytes header, const_bytes data,
                            send_completion on_done, am_send_flags flags) {
  request_params p = params_with(flags);
  return detail::start_send_like(impl(*this).owner, on_done, p, [&](const request_params& rp) {
    return am_send(id, header.data(), header.size(), data.data(), data.size(), rp);
  });
}

operation endpoint::stream_send(const_bytes data, send_completion on_done,
                                stream_send_flags flags) {
  request_params p = params_with(flags);
  return detail::start_send_like(impl(*this).owner, on_done, p, [&](const request_params& rp) {
    return stream_send(data.data(), data.size(), rp);
  });
}

operation endpoint::stream_send_iov(std::span<const iov_entry> entries, send_completion on_done,
                                    stream_send_flags flags) {
  request_params p = params_with(flags);
  return detail::start_send_like(impl(*this).owner, on_done, p, [&](const request_params& rp) {
    return stream_send_iov(entries.data(), entries.size(), rp);
  });
}

operation endpoint::stream_recv(mutable_bytes buffer, length_completion on_done,
                                size_t min_length) {
  size_t received = 0;
  request_params p;
  if (!on_done) {
    return operation(stream_recv(buffer.data(), buffer.size(), min_length, &received, p));
  }
  worker_impl::guard g(impl(*this).owner);
  callback_slot& slot = callback_access::slot(on_done);
  const stream_recv_callback entry = slot.completion_entry<void(status, size_t)>();
  p.stream_recv_cb = entry;
  p.user_data = &slot;
  const op o = stream_recv(buffer.data(), buffer.size(), min_length, &received, p);
  return detail::finish(o, slot, [&](status st) {
    entry(nullptr, st, st == status::ok ? received : size_t{0}, &slot);
  });
}

result<rkey_ptr> endpoint::rkey_unpack(const_bytes packed) {
  rkey* key = nullptr;
  const status st = rkey_unpack(packed.data(), packed.size(), &key);
  if (st != status::ok) return st;
  return rkey_ptr(key);
}

operation endpoint::put(const_bytes local, uint64_t remote_address, rkey& key,
                        send_completion on_done, rma_flags flags) {
  const iov_entry entry = iov_of(local);
  return detail::start_rma(impl(*this).owner, on_done, flags, [&](const request_params& rp) {
    return put(&entry, 1, remote_address, &key, rp);
  });
}

operation endpoint::put(std::span<const iov_entry> local, uint64_t remote_address, rkey& key,
                        send_completion on_done, rma_flags flags) {
  return detail::start_rma(impl(*this).owner, on_done, flags, [&](const request_params& rp) {
    return put(local.data(), local.size(), remote_address, &key, rp);
  });
}

operation endpoint::get(mutable_bytes local, uint64_t remote_address, rkey& key,
                        send_completion on_done, rma_flags flags) {
  const iov_entry entry{local.data(), local.size()};
  return detail::start_rma(impl(*this).owner, on_done, flags, [&](const request_params& rp) {
    return get(&entry, 1, remote_address, &key, rp);
  });
}

operation endpoint::get(std::span<const iov_entry> local, uint64_t remote_address, rkey& key,
                        send_completion on_done, rma_flags flags) {
  return detail::start_rma(impl(*this).owner, on_done, flags, [&](const request_params& rp) {
    return get(local.data(), local.size(), remote_address, &key, rp);
  });
}

operation endpoint::get(mutable_bytes local, const remote_segment& remote,
                        send_completion on_done, rma_flags flags) {
  const iov_entry entry{local.data(), local.size()};
  return detail::start_rma(impl(*this).owner, on_done, flags, [&](const request_params& rp) {
    return get(&entry, 1, remote, rp);
  });
}

operation endpoint::get(std::span<const iov_entry> local, const remote_segment& remote,
                        send_completion on_done, rma_flags flags) {
  return detail::start_rma(impl(*this).owner, on_done, flags, [&](const request_params& rp) {
    return get(local.data(), local.size(), remote, rp);
  });
}

operation endpoint::flush(send_completion on_done) {
  request_params p;
  return detail::start_send_like(impl(*this).owner, on_done, p,
                                 [&](const request_params& rp) { return flush(rp); });
}

operation endpoint_ptr::close(send_completion on_done) {
  if (ep_ == nullptr) {
    if (on_done) on_done(status::ok);
    return operation();
  }
  endpoint_impl& ep = impl(*release());
  request_params p;
  return detail::start_send_like(ep.owner, on_done, p,
                                 [&](const request_params& rp) { return ep.close(rp); });
}

// -- worker --------------------------------------------------------------------------------------

result<endpoint_ptr> worker::connect(const std::vector<uint8_t>& peer_address) {
  endpoint* ep = nullptr;
  const status st = connect(peer_address, &ep);
  if (st != status::ok) return st;
  return endpoint_ptr(ep);
}

result<endpoint_ptr> worker::connect(const std::string& address, const endpoint_params& params) {
  endpoint* ep = nullptr;
  const status st = connect(address, params, &ep);
  if (st != status::ok) return st;
  return endpoint_ptr(ep);
}

result<endpoint_ptr> worker::accept(conn_request* request, const endpoint_params& params) {
  endpoint* ep = nullptr;
  const status st = accept(request, params, &ep);
  if (st != status::ok) return st;
  return endpoint_ptr(ep);
}

result<std::unique_ptr<listener>> worker::listen(const listener_params& params) {
  std::unique_ptr<listener> out;
  const status st = listen(params, &out);
  if (st != status::ok) return st;
  return out;
}

result<memh_ptr> worker::mem_map(mutable_bytes region, uint32_t access) {
  if (region.empty()) return status::invalid_param;
  memh* handle = nullptr;
  const status st = mem_map(region.data(), region.size(), &handle, access);
  if (st != status::ok) return st;
  return memh_ptr(handle);
}

result<std::vector<uint8_t>> worker::rkey_pack(const memh& handle) const {
  std::vector<uint8_t> packed;
  const status st = rkey_pack(&handle, packed);
  if (st != status::ok) return st;
  return packed;
}

namespace detail {
namespace {
/// keep_completion's work: keeps the callable in a request still running, or drops it.
operation keep_or_drop(op o, callback_slot& slot) noexcept {
  if (!o.req->finished) {
    keep(o.req, slot);
  } else {
    slot.reset();  // finished without notifying (or it ran, and the slot is empty already)
  }
  return operation_access::adopt(o);
}

/// keep_completion in thread_mode::multi, under the worker's lock (apart, so that the common
/// case saves no registers for the lock).
[[gnu::noinline]] operation keep_completion_locked(op o, callback_slot& slot) noexcept {
  worker_impl::guard g(*o.req->owner);
  return keep_or_drop(o, slot);
}
}  // namespace
}  // namespace detail

operation detail::keep_completion(op o, callback_slot& slot) noexcept {
  if (o.req->owner->params.mode == thread_mode::multi) return keep_completion_locked(o, slot);
  return keep_or_drop(o, slot);
}

operation worker::tag_recv_message(message* msg, mutable_bytes buffer,
                                   tag_recv_completion on_done) {
  return detail::start_tag_recv(*this, on_done, [&](const request_params& rp) {
    return tag_recv_message(msg, buffer.data(), buffer.size(), rp);
  });
}

status worker::set_am_handler(uint16_t id, am_callback cb, void* arg, am_handler_flags flags) {
  return set_am_handler(id, cb, arg, to_bits(flags));
}

operation worker::am_recv_data(void* desc, mutable_bytes buffer, length_completion on_done) {
  request_params p;
  if (!on_done) {
    return operation(am_recv_data(desc, buffer.data(), buffer.size(), nullptr, p));
  }
  worker_impl::guard g(impl(*this));
  callback_slot& slot = callback_access::slot(on_done);
  // A request even for an outcome known at once, whose completion tells the length.
  p.flags = request_no_immediate_completion;
  p.user_data = &slot;
  const am_recv_data_callback entry = slot.completion_entry<void(status, size_t)>();
  const op o = am_recv_data(desc, buffer.data(), buffer.size(), entry, p);
  return detail::finish(o, slot, [&](status st) { entry(nullptr, st, 0, &slot); });
}

operation worker::flush(send_completion on_done) {
  request_params p;
  return detail::start_send_like(impl(*this), on_done, p,
                                 [&](const request_params& rp) { return flush(rp); });
}

size_t worker::stream_poll(std::span<stream_poll_entry> out) {
  return stream_poll(out.data(), out.size());
}

}  // namespace comm
