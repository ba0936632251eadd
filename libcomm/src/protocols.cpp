// The worker's side of the protocol modules: making them, their receive handlers, their hooks.
#include "protocols.hpp"

#include <comm/log.hpp>

#include <cstdlib>
#include <memory>

namespace comm::detail {
namespace {

/// Makes one module of each type of `list`, in order.
template <class... P>
void make_all(worker_impl& w, module_list<P...>) {
  unsigned i = 0;
  ((w.protocols[i] = std::make_unique<P>(w, i), ++i), ...);
  w.protocol_count = i;
}

void on_transport_error(void* arg, tl::ep* failed, status reason) {
  auto* ep = static_cast<endpoint_impl*>(failed->user_data);
  if (ep != nullptr) ep->fail(reason);
}

}  // namespace

void worker_impl::make_protocols() { make_all(*this, protocol_list{}); }

void worker_impl::add_receiver(tl::am_id id, tl::am_handler_fn fn, void* arg,
                               const protocol& owner, bool per_iface) {
  if (id == 0 || id >= receivers.size() || receivers[id].fn != nullptr) {
    COMM_LOG(error, "worker", "module %s claims wire id %u, which is %s",
             std::string(owner.name()).c_str(), static_cast<unsigned>(id),
             id == 0 || id >= receivers.size() ? "out of range" : "taken");
    std::abort();  // a programming error: two modules, one id
  }
  receiver& r = receivers[id];
  r.fn = fn;
  r.arg = arg;
  if (per_iface) {
    r.per_iface = true;
    r.direct = desc_source{static_cast<protocol*>(arg), nullptr};
    r.arg = &r.direct;
  }
}

void worker_impl::install_handlers() {
  for (auto& li : ifaces) {
    for (size_t id = 0; id < receivers.size(); ++id) {
      const receiver& r = receivers[id];
      if (r.fn == nullptr) continue;
      void* arg = r.arg;
      if (r.per_iface) {
        desc_sources.push_back(std::make_unique<desc_source>(desc_source{r.direct.module,
                                                                         li.iface.get()}));
        arg = desc_sources.back().get();
      }
      li.iface->set_am_handler(static_cast<tl::am_id>(id), r.fn, arg);
    }
    li.iface->set_error_handler(on_transport_error, this);
  }
}

void worker_impl::deliver(tl::am_id id, const uint8_t* data, size_t length) {
  if (id >= receivers.size() || receivers[id].fn == nullptr) return;
  (void)receivers[id].fn(receivers[id].arg, const_cast<uint8_t*>(data), length, 0);
}

std::vector<tl::am_id> worker_impl::wire_ids() const {
  std::vector<tl::am_id> ids;
  for (size_t id = 0; id < receivers.size(); ++id) {
    if (receivers[id].fn != nullptr) ids.push_back(static_cast<tl::am_id>(id));
  }
  return ids;
}

void worker_impl::progress_modules() {
  for (size_t i = 0; i < protocol_count; ++i) {
    if (progress_wanted & (1u << i)) protocols[i]->progress();
  }
}

void worker_impl::forget_peer(endpoint_impl& ep, held_fate fate) {
  for (size_t i = 0; i < protocol_count; ++i) protocols[i]->forget_peer(ep, fate);
}

void protocol::add_receiver(tl::am_id id, tl::am_handler_fn fn, void* arg, bool per_iface) {
  w.add_receiver(id, fn, arg, *this, per_iface);
}

void protocol::want_progress(bool wanted) {
  if (wanted) {
    w.progress_wanted |= 1u << index_;
  } else {
    w.progress_wanted &= ~(1u << index_);
  }
}

}  // namespace comm::detail
