// The processes of one simulation job and the per-round exchange that synchronises them.
//
// The engine (engine.hpp) calls exchange() once per round with the events it has for each other
// process and the earliest event time it still holds; every process gets back the same global
// minimum, which starts the next window. One implementation runs alone (cluster::local), the
// other over libcomm's active messages between the processes of a job found by comm::bootstrap
// (cluster::join). Users never touch a transport.
#pragma once

#include <comm/bootstrap.hpp>
#include <comm/config.hpp>
#include <comm/sim/config.hpp>
#include <comm/status.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace comm::sim {

/// Receives the events other processes send this one. Called inside cluster::exchange.
class event_sink {
public:
  /// Takes `bytes` bytes of packed events from process `from`. An error status (bytes that are
  /// not events of this run) fails the run with `*why` set.
  virtual status deliver(int from, const void* data, size_t bytes, std::string* why) = 0;

protected:
  ~event_sink() = default;
};

/// One process's events for one other process in one round.
struct outgoing_batch {
  const void* data = nullptr;  ///< packed events
  size_t bytes = 0;            ///< their length
};

/// What one process brings to a round's exchange.
struct round_input {
  /// batches[r]: the events for process r (size() entries; this process's own is ignored).
  const outgoing_batch* batches = nullptr;
  sim_time local_min = no_event;  ///< earliest event time this process holds or sends
  uint64_t committed = 0;         ///< events this process committed so far
  /// Identifies the run's configuration: processes with different ones fail the first round.
  uint64_t fingerprint = 0;
};

/// What a round's exchange tells every process (the same everywhere).
struct round_outcome {
  sim_time global_min = no_event;  ///< earliest pending event time of the whole job
  uint64_t committed = 0;          ///< events committed so far by all processes
};

/// The value of environment variable `name` as microseconds (0 to 10^7), else `fallback` (a
/// malformed value is reported at level warn).
int env_microseconds(const char* name, int fallback);

/// How cluster::join finds and connects the job's processes.
struct cluster_params {
  /// How to find the job: COMM_BOOTSTRAP, COMM_BOOTSTRAP_ADDRESS, COMM_RANK and COMM_SIZE, or
  /// PMIx under mpirun and srun (see comm/bootstrap.hpp).
  bootstrap_params bootstrap;
  /// libcomm's configuration (transports); COMM_ variables by default.
  config comm = config::from_environment();
  /// While waiting for other processes: microseconds of busy polling, then of polling with
  /// sched_yield in between (which costs nothing when no other thread wants the core, and hands
  /// it over when one does), then sleep on the worker's event fd. So processes sharing a core do
  /// not keep each other out. COMM_SIM_SPIN_US, default 2.
  int spin_us = env_microseconds("COMM_SIM_SPIN_US", 2);
  /// See spin_us. COMM_SIM_YIELD_US, default 2000.
  int yield_us = env_microseconds("COMM_SIM_YIELD_US", 2000);
  /// Name of this process's worker in logs (default "<host>:<pid>").
  std::string name;
};

/// The processes of one job. Every collective call is made by every process in the same order.
class cluster {
public:
  /// A one-process cluster: exchange() returns the local minimum.
  static std::unique_ptr<cluster> local();

  /// Joins the job that params.bootstrap finds and connects to every other process (shared
  /// memory on this host, tcp to other hosts). A job of one process gives local(). On failure
  /// `*why` says what went wrong.
  static status join(const cluster_params& params, std::unique_ptr<cluster>* out,
                     std::string* why);

  /// The same with a bootstrap the caller made, which must outlive the cluster.
  static status join(comm::bootstrap& boot, const cluster_params& params,
                     std::unique_ptr<cluster>* out, std::string* why);

  virtual ~cluster() = default;

  /// This process's rank, in [0, size()).
  virtual int rank() const noexcept = 0;

  /// The number of processes.
  virtual int size() const noexcept = 0;

  /// How processes talk: "local", or the transports of the endpoints ("shm", "tcp", ...).
  virtual std::string transports() const = 0;

  /// Collective, once per round: ships in.batches[r] to every other process r, hands what the
  /// others send this process to `sink`, and returns the minimum of every process's local_min
  /// and the sum of their committed counts. Fails (with `*why`) when a process died, aborted,
  /// sent malformed data or runs another configuration; the others then fail too, within about a
  /// millisecond (a dead peer is noticed by its endpoint).
  virtual status exchange(const round_input& in, event_sink& sink, round_outcome* out,
                          std::string* why) = 0;

  /// Collective, once at the end: the sum of every process's counters (nanoseconds: the maximum).
  virtual status reduce(const run_counters& mine, run_counters* all, std::string* why) = 0;

  /// Tells the other processes that this one stops because of `reason` (they fail with it).
  virtual void abort(std::string_view reason) = 0;

protected:
  cluster() = default;
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;
};

}  // namespace comm::sim
