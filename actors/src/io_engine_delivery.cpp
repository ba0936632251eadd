// The engine's worker-level side: routes of active messages to handler actors (worker-wide or per
// endpoint), tag receives and tag routes (matched by probing the unexpected queue, so a message of
// any size gets a buffer of its size), and dropping the routes of handlers that terminated.
#include "io_engine.hpp"

#include <comm/log.hpp>

#include <caf/send.hpp>

#include <algorithm>

namespace comm::actors::io::detail {

namespace {

/// Messages one tag route takes per loop turn, so one busy route cannot starve the rest.
constexpr int max_per_route = 64;

}  // namespace

// -- active messages -------------------------------------------------------------------------------

void engine::register_am(uint64_t slot, uint16_t id, caf::actor handler, notice n) {
  if (!handler) return report(n, status::invalid_param);
  endpoint_slot* ep = nullptr;
  if (slot != 0 && (ep = find_endpoint(slot, n)) == nullptr) return;
  const bool fresh = am_routes_.find(id) == am_routes_.end();
  am_route& route = am_routes_[id];
  if (fresh) {
    route.owner = this;
    route.id = id;
    const status st =
        worker_->set_am_handler(id, &engine::on_am, &route,
                                am_handler_flags::whole_msg | am_handler_flags::fetch_rndv);
    if (st != status::ok) {
      am_routes_.erase(id);
      return report(n, st);
    }
  }
  if (ep == nullptr) {
    route.handler = std::move(handler);
  } else if (ep->am_routes.insert_or_assign(id, std::move(handler)).second) {
    ++route.endpoint_routes;
  }
  report(n, status::ok);
}

void engine::unregister_am(uint64_t slot, uint16_t id, notice n) {
  auto route = am_routes_.find(id);
  if (slot == 0) {
    if (route == am_routes_.end() || !route->second.handler) return report(n, status::no_elem);
    route->second.handler = caf::actor{};
  } else {
    endpoint_slot* ep = find_endpoint(slot, n);
    if (ep == nullptr) return;
    if (ep->am_routes.erase(id) == 0) return report(n, status::no_elem);
    --route->second.endpoint_routes;
  }
  release_route(id);
  report(n, status::ok);
}

void engine::release_route(uint16_t id) {
  auto it = am_routes_.find(id);
  if (it == am_routes_.end() || it->second.handler || it->second.endpoint_routes != 0) return;
  (void)worker_->set_am_handler(id, nullptr, nullptr);
  am_routes_.erase(it);
}

status engine::on_am(void* arg, const void* header, size_t header_length, void* data,
                     size_t length, const am_recv_params& params) {
  auto* route = static_cast<am_route*>(arg);
  route->owner->deliver_am(*route, header, header_length, data, length, params);
  return status::ok;
}

void engine::deliver_am(am_route& route, const void* header, size_t header_length,
                        const void* data, size_t length, const am_recv_params& params) {
  if (shutting_down_) return;
  caf::actor reply_endpoint;
  const caf::actor* handler = &route.handler;
  if (params.attr & am_recv_reply_ep) {
    if (auto slot = slot_of_.find(params.reply_ep); slot != slot_of_.end()) {
      endpoint_slot& ep = endpoints_[slot->second];
      reply_endpoint = ep.actor;
      if (auto own = ep.am_routes.find(route.id); own != ep.am_routes.end()) handler = &own->second;
    }
  }
  if (!*handler) {
    COMM_LOG(warn, "io", "active message %u arrived on an endpoint without a route; dropped",
             route.id);
    return;
  }
  const auto* h = static_cast<const uint8_t*>(header);
  const auto* d = static_cast<const uint8_t*>(data);
  caf::anon_send(*handler, am_atom::value, route.id, bytes(h, h + header_length),
                 bytes(d, d + length), std::move(reply_endpoint));
}

// -- tagged messages -------------------------------------------------------------------------------

void engine::tag_recv(tag_t tag, tag_t mask, notice n) {
  tag_wait w;
  w.tag = tag;
  w.mask = mask;
  w.reply = std::move(n);
  waits_.push_back(std::move(w));
}

void engine::expire_tag_recv(const notice& n) {
  auto it = std::find_if(waits_.begin(), waits_.end(), [&](const tag_wait& w) {
    return w.reply.id == n.id && w.reply.to == n.to;
  });
  if (it == waits_.end()) return;
  report(it->reply, status::timed_out);
  waits_.erase(it);
}

void engine::register_tag(tag_t tag, tag_t mask, caf::actor handler, notice n) {
  if (!handler) return report(n, status::invalid_param);
  tag_wait w;
  w.tag = tag;
  w.mask = mask;
  w.handler = std::move(handler);
  tag_routes_.push_back(std::move(w));
  report(n, status::ok);
}

void engine::unregister_tag(tag_t tag, tag_t mask, const caf::actor& handler, notice n) {
  auto it = std::find_if(tag_routes_.begin(), tag_routes_.end(), [&](const tag_wait& w) {
    return w.tag == tag && w.mask == mask && w.handler == handler;
  });
  if (it == tag_routes_.end()) return report(n, status::no_elem);
  tag_routes_.erase(it);
  report(n, status::ok);
}

size_t engine::match_tags() {
  size_t matched = 0;
  for (auto it = waits_.begin(); it != waits_.end();) {
    if (receive_matching(*it)) {
      it = waits_.erase(it);
      ++matched;
    } else {
      ++it;
    }
  }
  for (const tag_wait& route : tag_routes_) {
    for (int i = 0; i < max_per_route && receive_matching(route); ++i) ++matched;
  }
  return matched;
}

bool engine::receive_matching(const tag_wait& w) {
  tag_recv_info info;
  comm::message* msg = nullptr;
  if (!worker_->tag_probe(w.tag, w.mask, &info, &msg)) return false;
  flight* f = new_flight(w.reply);
  f->handler = w.handler;
  if (f->handler) route_order_[f->handler.address()].push_back(f->key);
  f->data.resize(info.length);
  const uint64_t key = f->key;
  worker_->tag_recv_message(msg, f->data, [this, key](status st, const tag_recv_info& got) {
    finish_receive(key, st, got.sender_tag, got.length);
  }).detach();
  return true;
}

void engine::finish_receive(uint64_t key, status st, tag_t tag, size_t length) {
  auto it = flights_.find(key);
  if (it == flights_.end()) return;
  if (it->second->handler) {
    flight& routed = *it->second;
    routed.data.resize(std::min(length, routed.data.size()));
    routed.received = true;
    routed.outcome = st;
    routed.tag = tag;
    deliver_in_order(routed.handler.address());
    return;
  }
  std::unique_ptr<flight> f = std::move(it->second);
  flights_.erase(it);
  f->data.resize(std::min(length, f->data.size()));
  op_done done;
  done.st = st;
  done.tag = tag;
  done.data = std::move(f->data);
  report(f->reply, std::move(done));
}

void engine::deliver_in_order(const caf::actor_addr& handler) {
  auto order = route_order_.find(handler);
  if (order == route_order_.end()) return;
  std::deque<uint64_t>& keys = order->second;
  while (!keys.empty()) {
    auto it = flights_.find(keys.front());
    if (it != flights_.end() && !it->second->received) break;  // an earlier one still arrives
    keys.pop_front();
    if (it == flights_.end()) continue;
    std::unique_ptr<flight> f = std::move(it->second);
    flights_.erase(it);
    if (f->outcome == status::ok) {
      caf::anon_send(f->handler, tag_atom::value, f->tag, std::move(f->data));
    } else {
      COMM_LOG(warn, "io", "tagged message %#llx for a route: %s", (unsigned long long)f->tag,
               to_string(f->outcome));
    }
  }
  if (keys.empty()) route_order_.erase(order);
}

// -- handlers that terminated, and info ------------------------------------------------------------

void engine::forget(const caf::actor_addr& whom) {
  auto is_whom = [&](const caf::actor& a) { return a && a.address() == whom; };
  std::vector<uint16_t> emptied;
  for (auto& [id, route] : am_routes_) {
    if (is_whom(route.handler)) {
      route.handler = caf::actor{};
      emptied.push_back(id);
    }
  }
  for (auto& [slot, ep] : endpoints_) {
    for (auto it = ep.am_routes.begin(); it != ep.am_routes.end();) {
      if (!is_whom(it->second)) {
        ++it;
        continue;
      }
      --am_routes_[it->first].endpoint_routes;
      emptied.push_back(it->first);
      it = ep.am_routes.erase(it);
    }
  }
  for (uint16_t id : emptied) release_route(id);
  std::erase_if(tag_routes_, [&](const tag_wait& w) { return is_whom(w.handler); });
}

void engine::worker_info(notice n) {
  op_done done;
  done.text.push_back(worker_->info());
  report(n, std::move(done));
}

}  // namespace comm::actors::io::detail
