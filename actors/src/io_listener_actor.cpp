// The listener actor: asks its owner about each connection request and accepts or rejects it by
// the answer; tells the owner the endpoint actor of each accepted connection. It closes when asked,
// when its owner terminates, or when its worker is released.
#include "io_actor_common.hpp"
#include "io_actors_impl.hpp"

#include <caf/actor_system.hpp>

#include <unordered_map>

namespace comm::actors::io::detail {

namespace {

/// State of a listener actor.
struct listener_state : io_state {
  static inline const char* name = "comm_io_listener";
  caf::actor owner;                                  ///< decides the connection requests
  std::chrono::milliseconds answer_timeout{0};       ///< limit on the owner's answer
  bool released = false;                             ///< the listener is closed or closing
  uint64_t close_id = 0;                             ///< the operation id of a requested close
  std::unordered_map<uint64_t, uint64_t> accepting;  ///< accept operation id -> request id

  ~listener_state() {
    if (!eng || released) return;
    eng->post([slot = slot](engine& e) { e.close_listener(slot, notice{}); });
  }
};

using listener_actor_type = io_actor<listener_state>;

/// Accepts request `request` with `data` for the client; the outcome goes to the owner.
void accept(listener_actor_type* self, uint64_t request, bytes data) {
  const uint64_t id = self->state.replies.reserve_id();
  self->state.accepting[id] = request;
  notice n{self->address(), id};
  const uint64_t slot = self->state.slot;
  self->state.eng->post([slot, request, d = std::move(data), n](engine& e) mutable {
    e.accept(slot, request, std::move(d), n);
  });
}

/// Asks the owner about `info` and accepts or rejects by the answer.
void ask_owner(listener_actor_type* self, conn_request_info& info) {
  const uint64_t request = info.id;
  const uint64_t slot = self->state.slot;
  self->request(self->state.owner, self->state.answer_timeout, conn_request_atom::value,
                std::move(info))
      .then([=](accept_atom, bytes& data) { accept(self, request, std::move(data)); },
            [=](caf::error&) {
              self->state.eng->post([=](engine& e) { e.reject(slot, request); });
            });
}

/// Tells the owner how accepting a request ended, or answers a request of this actor.
void on_done(listener_actor_type* self, op_done& done) {
  auto it = self->state.accepting.find(done.id);
  if (it == self->state.accepting.end()) {
    self->state.replies.complete(done);
    if (done.id != 0 && done.id == self->state.close_id) self->quit();
    return;
  }
  const uint64_t request = it->second;
  self->state.accepting.erase(it);
  if (is_error(done.st)) {
    self->send(self->state.owner, accepted_atom::value, request, make_error(done.st));
  } else {
    self->send(self->state.owner, accepted_atom::value, request, std::move(done.actor));
  }
}

/// Closes the listener; the actor exits once it is closed (or at once for a plain send).
caf::result<ok_atom> close(listener_actor_type* self) {
  if (self->state.released) return ok_atom::value;
  self->state.released = true;
  const uint64_t slot = self->state.slot;
  self->state.close_id =
      start(self, reply_shape::ok, [slot](engine& e, notice n) { e.close_listener(slot, n); });
  if (self->state.close_id == 0) self->quit();
  return caf::delegated<ok_atom>{};
}

caf::behavior listener_actor(listener_actor_type* self, std::shared_ptr<engine> eng, uint64_t slot,
                             caf::actor owner, std::chrono::milliseconds answer_timeout) {
  self->state.eng = std::move(eng);
  self->state.slot = slot;
  self->state.owner = std::move(owner);
  self->state.answer_timeout = answer_timeout;
  self->monitor(self->state.owner);
  self->set_down_handler([=](caf::down_msg& down) {
    if (down.source != self->state.owner.address()) return;
    self->state.released = true;
    self->state.eng->post([slot](engine& e) { e.close_listener(slot, notice{}); });
    self->quit();
  });
  return {
      [=](conn_request_info& info) { ask_owner(self, info); },
      [=](op_done& done) { on_done(self, done); },
      [=](address_atom) {
        start(self, reply_shape::text, [slot](engine& e, notice n) { e.listener_address(slot, n); });
      },
      [=](close_atom) { return close(self); },
      [=](gone&) {
        self->state.released = true;
        self->state.replies.fail_all(make_error(status::not_connected));
        self->quit();
      },
  };
}

}  // namespace

caf::actor spawn_listener_actor(std::shared_ptr<engine> eng, uint64_t slot, caf::actor owner,
                                std::chrono::milliseconds answer_timeout) {
  caf::actor_system& sys = eng->system();
  return sys.spawn(listener_actor, std::move(eng), slot, std::move(owner), answer_timeout);
}

}  // namespace comm::actors::io::detail
