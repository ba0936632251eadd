// The node's progress thread as a CAF execution unit: actors that a frame from another node makes
// ready are run right there, after the worker's progress call, instead of waiting for one of the
// scheduler's (possibly sleeping) workers.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/execution_unit.hpp>
#include <caf/resumable.hpp>

#include <cstddef>
#include <vector>

namespace comm::actors::detail {

/// An execution unit owned by one thread (the node's progress thread). CAF calls exec_later on it
/// only from that thread: when a message is enqueued with it as context, or when an actor it runs
/// sends to or spawns another.
class progress_unit final : public caf::execution_unit {
public:
  /// A unit of `sys`, running each actor for at most the system's max throughput per turn.
  explicit progress_unit(caf::actor_system& sys);
  ~progress_unit() override;

  /// Takes a job made ready (with the reference CAF added for it).
  void exec_later(caf::resumable* job) override;

  /// Runs every job that was ready when called, once each.
  /// @returns the number of jobs run
  size_t run();

  /// True when no job waits.
  bool idle() const noexcept { return ready_.empty(); }

  /// Hands every waiting job to CAF's scheduler (when the thread stops).
  void hand_over();

private:
  /// Runs one job and drops or keeps it by what it returned.
  void resume(caf::resumable* job);

  size_t max_throughput_;
  std::vector<caf::resumable*> ready_;    ///< jobs waiting for their turn
  std::vector<caf::resumable*> running_;  ///< the jobs of the current turn
};

}  // namespace comm::actors::detail
