// The endpoint actor: active-message and tagged sends, flush and close on one libcomm endpoint,
// and this endpoint's AM routes. It exits when the endpoint is closed, fails (exit reason: the
// failure's status) or is released with its worker.
#include "io_actor_common.hpp"
#include "io_actors_impl.hpp"

#include <caf/actor_system.hpp>

namespace comm::actors::io::detail {

namespace {

/// State of an endpoint actor.
struct endpoint_state : io_state {
  static inline const char* name = "comm_io_endpoint";
  bool released = false;   ///< the engine closed the endpoint or is closing it
  uint64_t close_id = 0;   ///< the operation id of a requested close

  ~endpoint_state() {
    if (!eng || released) return;
    eng->post([slot = slot](engine& e) { e.close_endpoint(slot, notice{}); });
  }
};

using endpoint_actor_type = io_actor<endpoint_state>;

/// Ends the actor once its endpoint is gone: pending requests fail with not_connected.
void end(endpoint_actor_type* self, caf::error reason) {
  self->state.replies.fail_all(make_error(status::not_connected));
  self->quit(std::move(reason));
}

caf::message_handler send_handlers(endpoint_actor_type* self) {
  const uint64_t slot = self->state.slot;
  return {
      [=](am_send_atom, uint16_t id, bytes& header, bytes& payload) {
        start(self, reply_shape::ok,
              [slot, id, h = std::move(header), p = std::move(payload)](engine& e,
                                                                         notice n) mutable {
                e.am_send(slot, id, std::move(h), std::move(p), n);
              });
      },
      [=](tag_send_atom, uint64_t tag, bytes& payload) {
        start(self, reply_shape::ok, [slot, tag, p = std::move(payload)](engine& e,
                                                                         notice n) mutable {
          e.tag_send(slot, tag, std::move(p), n);
        });
      },
      [=](flush_atom) {
        start(self, reply_shape::ok, [slot](engine& e, notice n) { e.flush(slot, n); });
      },
      [=](info_atom) {
        start(self, reply_shape::endpoint_info,
              [slot](engine& e, notice n) { e.endpoint_info(slot, n); });
      },
  };
}

caf::message_handler lifecycle_handlers(endpoint_actor_type* self) {
  const uint64_t slot = self->state.slot;
  return {
      [=](close_atom) -> caf::result<ok_atom> {
        if (self->state.released) return ok_atom::value;
        self->state.released = true;
        self->state.close_id =
            start(self, reply_shape::ok, [slot](engine& e, notice n) { e.close_endpoint(slot, n); });
        if (self->state.close_id == 0) end(self, caf::error{});
        return caf::delegated<ok_atom>{};
      },
      [=](op_done& done) {
        self->state.replies.complete(done);
        if (done.id != 0 && done.id == self->state.close_id) end(self, caf::error{});
      },
      [=](gone& g) {
        // Released with the worker: nothing left to close. Failed: the endpoint still has to be
        // closed to be freed, which the state's destructor asks for.
        if (g.reason == status::ok) {
          self->state.released = true;
          end(self, caf::error{});
        } else {
          end(self, make_error(g.reason));
        }
      },
  };
}

caf::behavior endpoint_actor(endpoint_actor_type* self, std::shared_ptr<engine> eng, uint64_t slot) {
  self->state.eng = std::move(eng);
  self->state.slot = slot;
  forget_handlers_when_down(self);
  return lifecycle_handlers(self).or_else(send_handlers(self)).or_else(common_handlers(self));
}

}  // namespace

caf::actor spawn_endpoint_actor(std::shared_ptr<engine> eng, uint64_t slot) {
  caf::actor_system& sys = eng->system();
  return sys.spawn(endpoint_actor, std::move(eng), slot);
}

}  // namespace comm::actors::io::detail
