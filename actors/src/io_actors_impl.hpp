// The behaviours of the io actors, as the engine and spawn_worker start them.
#pragma once

#include "io_engine.hpp"

#include <caf/actor.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

namespace comm::actors::io::detail {

/// Spawns the worker actor owning `eng` (stopped when the actor exits).
caf::actor spawn_worker_actor(std::shared_ptr<engine> eng);

/// Spawns the actor of endpoint `slot` of `eng`.
caf::actor spawn_endpoint_actor(std::shared_ptr<engine> eng, uint64_t slot);

/// Spawns the actor of listener `slot` of `eng`, which asks `owner` about each connection request
/// and rejects those not answered within `answer_timeout`.
caf::actor spawn_listener_actor(std::shared_ptr<engine> eng, uint64_t slot, caf::actor owner,
                                std::chrono::milliseconds answer_timeout);

}  // namespace comm::actors::io::detail
