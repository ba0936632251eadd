// The engine's connections: client connects, listeners and their requests, and the operations of
// endpoints (sends, flush, close), each endpoint and listener represented by an actor.
#include "io_actors_impl.hpp"
#include "io_engine.hpp"

#include <comm/log.hpp>

#include <caf/send.hpp>

namespace comm::actors::io::detail {

// -- endpoints -------------------------------------------------------------------------------------

comm::endpoint_params engine::endpoint_params_for(bytes private_data) const {
  comm::endpoint_params p;
  p.private_data = std::move(private_data);
  p.on_error = &engine::on_endpoint_error;
  p.error_arg = const_cast<engine*>(this);
  p.on_connect = &engine::on_connected;
  p.connect_arg = const_cast<engine*>(this);
  p.timeout_ms = static_cast<int>(cfg_.connect_timeout.count());
  return p;
}

uint64_t engine::add_endpoint(comm::endpoint_ptr ep) {
  const uint64_t id = next_key_++;
  endpoint_slot& slot = endpoints_[id];
  slot_of_[ep.get()] = id;
  slot.ep = std::move(ep);
  slot.actor = spawn_endpoint_actor(shared_from_this(), id);
  return id;
}

void engine::drop_endpoint(uint64_t id) {
  auto it = endpoints_.find(id);
  if (it == endpoints_.end()) return;
  std::erase_if(slot_of_, [id](const auto& entry) { return entry.second == id; });
  std::vector<uint16_t> routes;
  for (auto& [am_id, handler] : it->second.am_routes) routes.push_back(am_id);
  endpoints_.erase(it);
  for (uint16_t am_id : routes) {
    --am_routes_[am_id].endpoint_routes;
    release_route(am_id);
  }
}

engine::endpoint_slot* engine::find_endpoint(uint64_t id, const notice& n) {
  auto it = endpoints_.find(id);
  if (it == endpoints_.end() || it->second.closing) {
    report(n, status::not_connected);
    return nullptr;
  }
  return &it->second;
}

void engine::on_connected(void* arg, comm::endpoint* ep, const uint8_t* data, size_t length) {
  auto* self = static_cast<engine*>(arg);
  auto it = self->slot_of_.find(ep);
  if (it == self->slot_of_.end()) return;
  endpoint_slot& slot = self->endpoints_[it->second];
  if (!slot.connecting.to) return;
  op_done done;
  done.data.assign(data, data + length);
  done.actor = slot.actor;
  report(std::exchange(slot.connecting, notice{}), std::move(done));
}

void engine::on_endpoint_error(void* arg, comm::endpoint* ep, status reason) {
  auto* self = static_cast<engine*>(arg);
  if (self->shutting_down_) return;
  auto it = self->slot_of_.find(ep);
  if (it == self->slot_of_.end()) return;
  endpoint_slot& slot = self->endpoints_[it->second];
  report(std::exchange(slot.connecting, notice{}), reason);
  if (!slot.closing) caf::anon_send(slot.actor, gone{reason});
}

void engine::connect(const std::string& address, bytes private_data, notice n) {
  auto ep = worker_->connect(address, endpoint_params_for(std::move(private_data)));
  if (!ep) return report(n, ep.error());
  endpoints_[add_endpoint(std::move(*ep))].connecting = std::move(n);
}

void engine::am_send(uint64_t slot, uint16_t id, bytes header, bytes payload, notice n) {
  endpoint_slot* s = find_endpoint(slot, n);
  if (s == nullptr) return;
  flight* f = new_flight(std::move(n));
  f->header = std::move(header);
  f->data = std::move(payload);
  s->ep->am_send(id, f->header, f->data, finisher(f->key), am_send_flags::reply_endpoint)
      .detach();
}

void engine::tag_send(uint64_t slot, tag_t tag, bytes payload, notice n) {
  endpoint_slot* s = find_endpoint(slot, n);
  if (s == nullptr) return;
  flight* f = new_flight(std::move(n));
  f->data = std::move(payload);
  s->ep->tag_send(tag, f->data, finisher(f->key)).detach();
}

void engine::flush(uint64_t slot, notice n) {
  endpoint_slot* s = find_endpoint(slot, n);
  if (s == nullptr) return;
  flight* f = new_flight(std::move(n));
  s->ep->flush(finisher(f->key)).detach();
}

void engine::endpoint_info(uint64_t slot, notice n) {
  endpoint_slot* s = find_endpoint(slot, n);
  if (s == nullptr) return;
  op_done done;
  done.text = {s->ep->peer_name(), std::string(s->ep->transport()), s->ep->info()};
  report(n, std::move(done));
}

void engine::close_endpoint(uint64_t slot, notice n) {
  auto it = endpoints_.find(slot);
  if (it == endpoints_.end()) return report(n, status::ok);
  endpoint_slot& s = it->second;
  if (s.closing) return report(n, status::ok);
  s.closing = true;
  flight* f = new_flight(std::move(n));
  f->endpoint = slot;
  s.ep.close(finisher(f->key)).detach();
}

// -- listeners -------------------------------------------------------------------------------------

void engine::listen(const std::string& address, caf::actor owner, notice n) {
  if (!owner) return report(n, status::invalid_param);
  const uint64_t id = next_key_++;
  listener_slot& slot = listeners_[id];
  listener_params lp;
  lp.address = address;
  lp.on_request = &engine::on_conn_request;
  lp.arg = &slot;
  auto made = worker_->listen(lp);
  if (!made) {
    listeners_.erase(id);
    return report(n, made.error());
  }
  slot.listener = std::move(*made);
  slot.actor = spawn_listener_actor(shared_from_this(), id, std::move(owner), cfg_.answer_timeout);
  op_done done;
  done.actor = slot.actor;
  done.text.push_back(slot.listener->address());
  report(n, std::move(done));
}

void engine::on_conn_request(void* arg, comm::conn_request* request) {
  auto* slot = static_cast<listener_slot*>(arg);
  conn_request_attr attr;
  if (slot->listener->query(request, &attr) != status::ok) {
    (void)slot->listener->reject(request);
    return;
  }
  conn_request_info info;
  info.id = slot->next_request++;
  info.client_address = std::move(attr.client_address);
  info.client_id = attr.client_id;
  info.client_name = std::move(attr.client_name);
  info.private_data = std::move(attr.private_data);
  slot->requests[info.id] = request;
  caf::anon_send(slot->actor, std::move(info));
}

void engine::accept(uint64_t slot, uint64_t request, bytes private_data, notice n) {
  auto l = listeners_.find(slot);
  if (l == listeners_.end()) return report(n, status::not_connected);
  auto r = l->second.requests.find(request);
  if (r == l->second.requests.end()) return report(n, status::no_elem);
  comm::conn_request* req = r->second;
  l->second.requests.erase(r);
  auto ep = worker_->accept(req, endpoint_params_for(std::move(private_data)));
  if (!ep) return report(n, ep.error());
  op_done done;
  done.actor = endpoints_[add_endpoint(std::move(*ep))].actor;
  report(n, std::move(done));
}

void engine::reject(uint64_t slot, uint64_t request) {
  auto l = listeners_.find(slot);
  if (l == listeners_.end()) return;
  auto r = l->second.requests.find(request);
  if (r == l->second.requests.end()) return;
  comm::conn_request* req = r->second;
  l->second.requests.erase(r);
  const status st = l->second.listener->reject(req);
  if (st != status::ok) COMM_LOG(warn, "io", "rejecting a connection request: %s", to_string(st));
}

void engine::listener_address(uint64_t slot, notice n) {
  auto l = listeners_.find(slot);
  if (l == listeners_.end()) return report(n, status::not_connected);
  op_done done;
  done.text.push_back(l->second.listener->address());
  report(n, std::move(done));
}

void engine::close_listener(uint64_t slot, notice n) {
  listeners_.erase(slot);
  report(n, status::ok);
}

}  // namespace comm::actors::io::detail
