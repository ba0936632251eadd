// Running actors on the node's progress thread (see progress_unit.hpp).
#include "progress_unit.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/defaults.hpp>
#include <caf/scheduler/abstract_coordinator.hpp>

namespace comm::actors::detail {

progress_unit::progress_unit(caf::actor_system& sys)
    : caf::execution_unit(&sys),
      max_throughput_(caf::get_or(sys.config(), "scheduler.max-throughput",
                                  caf::defaults::scheduler::max_throughput)) {
  if (max_throughput_ == 0) max_throughput_ = 1;
}

progress_unit::~progress_unit() { hand_over(); }

void progress_unit::exec_later(caf::resumable* job) { ready_.push_back(job); }

size_t progress_unit::run() {
  if (ready_.empty()) return 0;
  running_.swap(ready_);
  for (caf::resumable* job : running_) resume(job);
  const size_t n = running_.size();
  running_.clear();
  return n;
}

void progress_unit::resume(caf::resumable* job) {
  switch (job->resume(this, max_throughput_)) {
    case caf::resumable::resume_later:
      ready_.push_back(job);  // keeps its reference
      break;
    case caf::resumable::done:
    case caf::resumable::awaiting_message:
    case caf::resumable::shutdown_execution_unit:
      caf::intrusive_ptr_release(job);
      break;
  }
}

void progress_unit::hand_over() {
  for (caf::resumable* job : ready_) system().scheduler().enqueue(job);
  ready_.clear();
}

}  // namespace comm::actors::detail
