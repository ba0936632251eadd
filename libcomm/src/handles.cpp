// The library's side of the C++ face's owning objects: comm::operation (owns a request),
// endpoint_ptr (closes its endpoint), memh_ptr (unmaps its registration), rkey_ptr (destroys its
// key). Each owned object points back at its owner (request::handle, endpoint_impl::handle,
// memh::handle, rkey::handle), which a move updates, so that the worker can empty the owner when
// it releases the object first (a forced cancel, an endpoint closed by hand, worker teardown).
#include "rma.hpp"
#include "worker_impl.hpp"

#include "protocols.hpp"

#include <chrono>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::module_of;
using detail::rma_protocol;
using detail::worker_impl;

// -- operation -----------------------------------------------------------------------------------

bool operation::request_finished() const noexcept {
  worker_impl::guard g(*req_->owner);
  return req_->finished;
}

status operation::request_status() const noexcept {
  worker_impl::guard g(*req_->owner);
  return req_->finished ? req_->st : status::in_progress;
}

void operation::link() noexcept { req_->handle = this; }

void operation::relink(operation& other) noexcept {
  req_->handle = this;
  other.req_ = nullptr;
  other.st_ = comm::status::ok;
}

void operation::release() noexcept {
  request* req = req_;
  worker_impl& w = *req->owner;
  req_ = nullptr;
  st_ = comm::status::ok;
  worker_impl::guard g(w);
  // The common case, a finished operation whose completion is not running, frees its request
  // here; one still running (or notifying) is released quietly.
  if (req->finished && !req->notifying) {
    req->handle = nullptr;
    w.free_request(req);
  } else {
    w.release_quietly(req);
  }
}

void operation::detach() noexcept {
  if (req_ != nullptr) {
    worker_impl& w = *req_->owner;
    worker_impl::guard g(w);
    req_->handle = nullptr;
    w.release(req_);
  }
  req_ = nullptr;
  st_ = comm::status::ok;
}

comm::status operation::cancel(cancel_mode mode) {
  if (req_ == nullptr) return comm::status::invalid_param;
  // A forced cancel frees the request, which empties this object (worker_impl::free_request).
  return req_->owner->cancel(req_, mode);
}

comm::status operation::wait(int timeout_ms) {
  if (req_ == nullptr) return st_;
  worker& w = *req_->owner;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  comm::status st;
  for (unsigned spins = 0; (st = status()) == comm::status::in_progress; ++spins) {
    w.progress();
    if (timeout_ms >= 0 && (spins & 255) == 255 && std::chrono::steady_clock::now() > deadline) {
      return comm::status::timed_out;
    }
  }
  return st;
}

// -- endpoint_ptr --------------------------------------------------------------------------------

void endpoint_ptr::link() noexcept {
  endpoint_impl& ep = impl(*ep_);
  worker_impl::guard g(ep.owner);
  ep.handle = this;
}

void endpoint_ptr::relink(endpoint_ptr& other) noexcept {
  endpoint_impl& ep = impl(*ep_);
  worker_impl::guard g(ep.owner);
  ep.handle = this;
  other.ep_ = nullptr;
}

endpoint* endpoint_ptr::release() noexcept {
  endpoint* ep = ep_;
  if (ep != nullptr) {
    worker_impl::guard g(impl(*ep).owner);
    impl(*ep).handle = nullptr;
  }
  ep_ = nullptr;
  return ep;
}

void endpoint_ptr::close_detached() noexcept {
  endpoint_impl& ep = impl(*release());
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  const op o = ep.close();
  if (o.req != nullptr) w.release(o.req);  // the worker finishes the close
}

// -- memh_ptr ------------------------------------------------------------------------------------

void memh_ptr::link() noexcept {
  worker_impl::guard g(*h_->owner);
  h_->handle = this;
}

void memh_ptr::relink(memh_ptr& other) noexcept {
  worker_impl::guard g(*h_->owner);
  h_->handle = this;
  other.h_ = nullptr;
}

memh* memh_ptr::release() noexcept {
  memh* h = h_;
  if (h != nullptr) {
    worker_impl::guard g(*h->owner);
    h->handle = nullptr;
  }
  h_ = nullptr;
  return h;
}

void memh_ptr::unmap() noexcept {
  worker_impl& w = *h_->owner;
  worker_impl::guard g(w);
  (void)module_of<rma_protocol>(w).unmap(h_);  // empties this handle
}

// -- rkey_ptr ------------------------------------------------------------------------------------

void rkey_ptr::link() noexcept {
  worker_impl::guard g(k_->ep->owner);
  k_->handle = this;
}

void rkey_ptr::relink(rkey_ptr& other) noexcept {
  worker_impl::guard g(k_->ep->owner);
  k_->handle = this;
  other.k_ = nullptr;
}

rkey* rkey_ptr::release() noexcept {
  rkey* k = k_;
  if (k != nullptr) {
    worker_impl::guard g(k->ep->owner);
    k->handle = nullptr;
  }
  k_ = nullptr;
  return k;
}

void rkey_ptr::destroy() noexcept {
  worker_impl& w = k_->ep->owner;
  worker_impl::guard g(w);
  module_of<rma_protocol>(w).destroy_key(k_);  // empties this handle
}

}  // namespace comm
