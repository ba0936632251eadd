// What a person watches: a progress line while a run goes, and ROSS's figures at the end.
#pragma once

#include <comm/sim/config.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace comm::sim {

/// A progress line (simulated time, committed events, events/s) rewritten in place about every
/// interval. Cheap to call once per round: the clock is read only every few calls.
class progress_meter {
public:
  /// Writes to `out` every `interval` seconds; a null `out` disables the meter.
  progress_meter(std::FILE* out, double interval);

  /// Reports the state at the end of a round.
  void update(sim_time now, uint64_t committed) {
    if (out_ == nullptr || ++calls_ < next_check_) return;
    check(now, committed);
  }

  /// Ends the line (once anything was printed).
  void finish();

private:
  void check(sim_time now, uint64_t committed);

  using clock = std::chrono::steady_clock;
  std::FILE* out_;
  double interval_;
  clock::time_point start_;
  clock::time_point last_print_;
  uint64_t last_committed_ = 0;
  uint64_t calls_ = 0;
  uint64_t next_check_ = 1;
  uint64_t stride_ = 1;
  bool printed_ = false;
};

/// True when `stream` is a terminal (where a progress line belongs by default).
bool is_terminal(std::FILE* stream);

/// Prints ROSS's end-of-run figures: committed events, events/s, efficiency, rollbacks, remote
/// events and their fraction, rounds, processes, partitions, LPs and the digest.
void print_summary(std::FILE* out, const run_result& r);

}  // namespace comm::sim
