// The worker actor: connects, listens, routes AMs and tagged messages, and owns the engine, which
// it stops (releasing every listener and endpoint) when it exits.
#include "io_actor_common.hpp"
#include "io_actors_impl.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>

namespace comm::actors::io::detail {

namespace {

/// State of a worker actor.
struct worker_state : io_state {
  static inline const char* name = "comm_io_worker";

  ~worker_state() {
    if (eng) eng->stop();
  }
};

using worker_actor_type = io_actor<worker_state>;

/// Answers every pending request with status::canceled and stops the engine.
void shut_down(worker_actor_type* self) {
  self->state.replies.fail_all(make_error(status::canceled));
  self->state.eng->stop();
}

caf::message_handler worker_handlers(worker_actor_type* self) {
  return {
      [=](listen_atom, std::string& address, caf::actor& owner) {
        start(self, reply_shape::actor,
              [a = std::move(address), o = std::move(owner)](engine& e, notice n) {
                e.listen(a, o, n);
              });
      },
      [=](connect_atom, std::string& address, bytes& private_data) {
        start(self, reply_shape::actor_and_data,
              [a = std::move(address), d = std::move(private_data)](engine& e, notice n) mutable {
                e.connect(a, std::move(d), n);
              });
      },
      [=](info_atom) {
        start(self, reply_shape::text, [](engine& e, notice n) { e.worker_info(n); });
      },
      [=](close_atom) {
        shut_down(self);
        self->quit();
        return ok_atom::value;
      },
  };
}

caf::behavior worker_actor(worker_actor_type* self, std::shared_ptr<engine> eng) {
  self->state.eng = std::move(eng);
  forget_handlers_when_down(self);
  self->set_exit_handler([=](caf::exit_msg& msg) {
    if (!msg.reason) return;  // a linked actor ended normally
    shut_down(self);
    self->quit(msg.reason);
  });
  return worker_handlers(self).or_else(common_handlers(self));
}

}  // namespace

caf::actor spawn_worker_actor(std::shared_ptr<engine> eng) {
  caf::actor_system& sys = eng->system();
  return sys.spawn(worker_actor, std::move(eng));
}

}  // namespace comm::actors::io::detail
