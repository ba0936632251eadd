// What the progress thread tells the io actors (never sent by anyone else: the types are private
// to this library), and the table of requests an io actor still has to answer.
#pragma once

#include <comm/actors/io_actors.hpp>
#include <comm/status.hpp>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/response_promise.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace comm::actors::io::detail {

/// The outcome of an operation an actor handed to the engine, sent back to that actor.
struct op_done {
  uint64_t id = 0;                 ///< the actor's id of the operation
  comm::status st = status::ok;    ///< ok or the error of the libcomm call
  uint64_t tag = 0;                ///< tag receives: the sender's tag
  bytes data;                      ///< tag receives: the message; connects: the server's data
  std::vector<std::string> text;   ///< descriptions, a listener's address
  caf::actor actor;                ///< the endpoint or listener actor an operation made
};

/// Tells an endpoint or listener actor that its libcomm object is gone: failed (`reason` an
/// error) or released with its worker (`reason` ok).
struct gone {
  comm::status reason = status::ok;
};

/// Tells a worker actor that a tag receive it bounded in time expired.
struct expired {
  uint64_t id = 0;  ///< the operation id of the receive
};

/// How a completed operation is answered.
enum class reply_shape {
  ok,              ///< ok_atom
  text,            ///< text[0]
  actor,           ///< actor
  actor_and_data,  ///< (actor, data)
  tag_message,     ///< (tag_atom, tag, data)
  endpoint_info,   ///< (text[0], text[1], text[2])
};

/// Requests an actor accepted and answers once the engine reports their operation's outcome.
class pending_replies {
public:
  /// Keeps `rp` until complete() or fail_all().
  /// @returns the operation id to pass to the engine
  uint64_t add(caf::response_promise rp, reply_shape shape);

  /// A fresh operation id tied to no request, for operations the actor handles itself.
  uint64_t reserve_id() noexcept { return next_id_++; }

  /// Answers the request of `done.id` with the outcome; unknown ids are ignored.
  void complete(op_done& done);

  /// Answers the request of `id` with `err` (when it is still pending).
  void fail(uint64_t id, const caf::error& err);

  /// Answers every pending request with `err`.
  void fail_all(const caf::error& err);

private:
  struct entry {
    caf::response_promise rp;
    reply_shape shape;
  };

  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, entry> entries_;
};

}  // namespace comm::actors::io::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(comm::actors::io::detail::op_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(comm::actors::io::detail::gone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(comm::actors::io::detail::expired)
