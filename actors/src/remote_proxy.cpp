// Proxies of remote actors (see remote_proxy.hpp).
#include "remote_proxy.hpp"

#include "node_state.hpp"

#include <caf/system_messages.hpp>

namespace comm::actors::detail {

remote_proxy::remote_proxy(caf::actor_config& cfg, node_state* node, std::shared_ptr<peer> link)
    : caf::actor_proxy(cfg), node_(node), link_(std::move(link)), count_(node->proxy_counter()) {
  count_->fetch_add(1, std::memory_order_relaxed);
  link_->proxies.fetch_add(1, std::memory_order_relaxed);
}

remote_proxy::~remote_proxy() {
  count_->fetch_sub(1, std::memory_order_relaxed);
  link_->proxies.fetch_sub(1, std::memory_order_relaxed);
}

void remote_proxy::enqueue(caf::mailbox_element_ptr what, caf::execution_unit* ctx) {
  if (killed_.load(std::memory_order_acquire)) {
    bounce(what, fail_state());
    return;
  }
  // A local actor linked to this proxy terminated: the link is gone on this side too.
  if (what->content().type_token() == caf::make_type_token<caf::exit_msg>()) {
    unlink_from(what->content().get_as<caf::exit_msg>(0).source);
  }
  node_->forward(link_, id(), *what, ctx);
}

bool remote_proxy::add_backlink(caf::abstract_actor* x) {
  if (!caf::actor_proxy::add_backlink(x)) return false;
  announce_link(true, x);
  return true;
}

bool remote_proxy::remove_backlink(caf::abstract_actor* x) {
  if (!caf::actor_proxy::remove_backlink(x)) return false;
  announce_link(false, x);
  return true;
}

void remote_proxy::kill_proxy(caf::execution_unit* ctx, caf::error reason) {
  killed_.store(true, std::memory_order_release);
  cleanup(std::move(reason), ctx);
}

const char* remote_proxy::name() const { return "comm_proxy"; }

void remote_proxy::announce_link(bool linked, caf::abstract_actor* x) {
  if (killed_.load(std::memory_order_acquire)) return;
  node_->announce_link(link_, linked, caf::strong_actor_ptr{x->ctrl()}, id());
}

}  // namespace comm::actors::detail
