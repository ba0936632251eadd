// What the worker, endpoint and listener actors share: their state's core, handing an operation
// to the engine for the current request, and the handlers of registrations and tag receives.
#pragma once

#include "io_engine.hpp"
#include "io_replies.hpp"
#include "tsan_handoff.hpp"

#include <comm/log.hpp>

#include <caf/event_based_actor.hpp>
#include <caf/message_handler.hpp>
#include <caf/stateful_actor.hpp>

#include <memory>
#include <utility>

namespace comm::actors::io::detail {

#ifdef COMM_ACTORS_TSAN
/// What every io actor is in a ThreadSanitizer build: an event-based actor that states the
/// hand-off of each message through its mailbox (the sender's writes, such as the bytes of a
/// send, happen before the handler that passes them to the engine; see tsan_handoff.hpp).
class handoff_actor : public caf::event_based_actor {
public:
  using caf::event_based_actor::event_based_actor;

  /// Runs once CAF has dropped the last reference (in uninstrumented code), so ThreadSanitizer
  /// would take its one write, the vtable pointer set on entry, for a race with the last sender's
  /// virtual call to enqueue; it is left uninstrumented (the base classes' are in libcaf_core).
  __attribute__((no_sanitize("thread"))) ~handoff_actor() override {}

  /// Takes a message on the sender's thread.
  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* ctx) override {
    comm::actors::detail::handed_over(this);
    caf::event_based_actor::enqueue(std::move(what), ctx);
  }

  /// Handles a message on the thread that runs this actor.
  caf::invoke_message_result consume(caf::mailbox_element& what) override {
    comm::actors::detail::taken_over(this);
    return caf::event_based_actor::consume(what);
  }
};
#else
/// What every io actor is in other builds: a plain event-based actor.
using handoff_actor = caf::event_based_actor;
#endif

/// An io actor with state `State`.
template <class State>
using io_actor = caf::stateful_actor<State, handoff_actor>;

/// The core of every io actor's state.
struct io_state {
  std::shared_ptr<engine> eng;  ///< the engine of the worker
  uint64_t slot = 0;            ///< the endpoint or listener slot; 0 for the worker
  pending_replies replies;      ///< requests waiting for the engine
};

/// Hands `op` (called on the progress thread as op(engine&, notice)) to the engine for the
/// current message. A request is answered in `shape` once the engine reports; an asynchronous
/// message gets no answer, and operations whose answer is their whole point (shape other than
/// ok) are not started for one.
/// @returns the operation id (0 when nobody is told)
template <class State, class Op>
uint64_t start(io_actor<State>* self, reply_shape shape, Op op) {
  auto rp = self->make_response_promise();
  notice n;
  if (rp.async()) {
    if (shape != reply_shape::ok) {
      COMM_LOG(warn, "io", "%s: a message that must be a request arrived as a plain send; ignored",
               self->name());
      return 0;
    }
  } else {
    n.to = self->address();
    n.id = self->state.replies.add(std::move(rp), shape);
  }
  auto task = [op = std::move(op), n](engine& e) mutable { op(e, std::move(n)); };
  if (!self->state.eng->post(std::move(task))) {
    self->state.replies.fail(n.id, make_error(status::not_connected));
  }
  return n.id;
}

/// Handlers every io actor has: engine reports, AM routes (worker-wide for the worker actor,
/// this endpoint's for an endpoint actor) and tag receives and routes (worker-wide).
template <class State>
caf::message_handler common_handlers(io_actor<State>* self) {
  return {
      [=](op_done& done) { self->state.replies.complete(done); },
      [=](register_am_atom, uint16_t id, caf::actor& handler) {
        if (handler) self->monitor(handler);
        start(self, reply_shape::ok, [slot = self->state.slot, id, h = std::move(handler)](
                                         engine& e, notice n) { e.register_am(slot, id, h, n); });
      },
      [=](unregister_am_atom, uint16_t id) {
        start(self, reply_shape::ok, [slot = self->state.slot, id](engine& e, notice n) {
          e.unregister_am(slot, id, n);
        });
      },
      [=](tag_recv_atom, uint64_t tag, uint64_t mask) {
        start(self, reply_shape::tag_message,
              [tag, mask](engine& e, notice n) { e.tag_recv(tag, mask, n); });
      },
      [=](tag_recv_atom, uint64_t tag, uint64_t mask, caf::timespan limit) {
        const uint64_t id = start(self, reply_shape::tag_message,
                                  [tag, mask](engine& e, notice n) { e.tag_recv(tag, mask, n); });
        if (id != 0) self->delayed_send(self, limit, expired{id});
      },
      [=](expired x) {
        notice n{self->address(), x.id};
        self->state.eng->post([n](engine& e) { e.expire_tag_recv(n); });
      },
      [=](register_tag_atom, uint64_t tag, uint64_t mask, caf::actor& handler) {
        if (handler) self->monitor(handler);
        start(self, reply_shape::ok, [tag, mask, h = std::move(handler)](engine& e, notice n) {
          e.register_tag(tag, mask, h, n);
        });
      },
      [=](unregister_tag_atom, uint64_t tag, uint64_t mask, caf::actor& handler) {
        start(self, reply_shape::ok, [tag, mask, h = std::move(handler)](engine& e, notice n) {
          e.unregister_tag(tag, mask, h, n);
        });
      },
  };
}

/// Makes a down message of a handler drop that handler's routes.
template <class State>
void forget_handlers_when_down(io_actor<State>* self) {
  self->set_down_handler([=](caf::down_msg& down) {
    self->state.eng->post([whom = down.source](engine& e) { e.forget(whom); });
  });
}

}  // namespace comm::actors::io::detail
