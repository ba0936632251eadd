// What a simulation run is given (run_config) and what it reports (run_result).
#pragma once

#include <comm/sim/event.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace comm::sim {

/// How processes synchronise (ROSS's --synch numbers).
enum class sync_mode {
  sequential = 1,    ///< one process: events in windows, nothing to exchange
  conservative = 2,  ///< windows [T, T + lookahead), T the global minimum of pending events
  optimistic = 3,    ///< Time Warp: not available (run() refuses it with unsupported)
};

/// The parameters of one run, the same on every process of the job.
struct run_config {
  /// LPs of the whole model; ids 0 .. lp_count - 1 are split into equal contiguous blocks over
  /// the processes, then over each process's partitions. At most 2^32 - 1.
  uint64_t lp_count = 0;
  /// Partitions per process (each has its own event queue and LPs).
  unsigned partitions = 1;
  /// Smallest delay a handler may schedule an event with (> 0).
  sim_time lookahead = 1.0;
  /// Events at or after this time are not processed; the run ends when none is left before it.
  sim_time end_time = 100000;
  /// Chooses every LP's random stream (stream i of the seed is LP i's).
  uint64_t seed = 1;
  /// The synchronisation protocol.
  sync_mode sync = sync_mode::conservative;
  /// Most events a process may hold (queued, in a window, or waiting to be sent): the memory
  /// bound. A schedule beyond it fails the run with exceeds_limit.
  size_t max_events = size_t{1} << 26;
  /// Print a progress line on `progress_stream` (rank 0 only) about every progress_interval s.
  bool progress = false;
  /// Seconds between progress lines.
  double progress_interval = 0.5;
};

/// What a run did, summed over every process (ROSS's end-of-run figures).
struct run_result {
  uint64_t committed = 0;        ///< events processed and never rolled back
  uint64_t processed = 0;        ///< events processed, rolled back ones included
  uint64_t rollbacks = 0;        ///< events rolled back (0 in conservative runs)
  uint64_t remote = 0;           ///< events sent to an LP of another process
  uint64_t cross_partition = 0;  ///< events sent to another partition of the same process
  uint64_t rounds = 0;           ///< synchronisation rounds (windows)
  uint64_t digest = 0;           ///< combination of every LP's id, final state and event count
  double seconds = 0;            ///< wall time of the run on the slowest process
  int processes = 1;             ///< processes of the job
  unsigned partitions = 1;       ///< partitions per process
  uint64_t lp_count = 0;         ///< LPs of the model

  /// Committed events per second of wall time.
  double events_per_second() const noexcept { return seconds > 0 ? committed / seconds : 0; }
  /// Committed / processed (1 without rollbacks).
  double efficiency() const noexcept {
    return processed > 0 ? static_cast<double>(committed) / processed : 1.0;
  }
  /// Fraction of committed events that crossed to another process.
  double remote_fraction() const noexcept {
    return committed > 0 ? static_cast<double>(remote) / committed : 0.0;
  }
};

/// Counters one process contributes to run_result; the cluster adds them up.
struct run_counters {
  uint64_t committed = 0;        ///< see run_result
  uint64_t processed = 0;        ///< see run_result
  uint64_t rollbacks = 0;        ///< see run_result
  uint64_t remote = 0;           ///< see run_result
  uint64_t cross_partition = 0;  ///< see run_result
  uint64_t digest = 0;           ///< sum of this process's LP digests (mod 2^64)
  uint64_t nanoseconds = 0;      ///< wall time (the maximum is kept)
};

/// No pending event: the minimum of an empty set.
inline constexpr sim_time no_event = std::numeric_limits<sim_time>::infinity();

}  // namespace comm::sim
