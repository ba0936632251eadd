// PHOLD, the benchmark model of parallel discrete-event simulation, with ROSS's semantics (its
// models/phold/phold.c): each LP starts with `start_events` events to itself; handling an event
// picks, with probability `remote`, a destination uniformly among all LPs (itself included), else
// the LP itself, and schedules one event there after lookahead + exponential(mean - lookahead).
// With ROSS's defaults (mean = lookahead = 1) every delay is exactly 1.0, so events are
// simultaneous everywhere. The state records an order-sensitive trace of what the LP handled, so
// that the run's digest changes if any LP saw its events in another order.
#pragma once

#include <comm/sim/engine.hpp>

#include <bit>
#include <cstdint>

namespace comm::sim::phold {

/// PHOLD's parameters (ROSS's option names: --remote, --lookahead, --mean, --start-events).
struct parameters {
  double remote = 0.25;       ///< probability of a destination drawn among all LPs
  double lookahead = 1.0;     ///< the least delay
  double mean = 1.0;          ///< the mean delay, lookahead included (>= lookahead)
  unsigned start_events = 1;  ///< events each LP starts with
};

/// The engine's configuration for PHOLD on `lps` LPs in all: its lookahead is the model's least
/// delay.
inline run_config configuration(uint64_t lps, unsigned partitions, const parameters& p,
                                double end, uint64_t seed) {
  run_config cfg;
  cfg.lp_count = lps;
  cfg.partitions = partitions;
  cfg.lookahead = p.lookahead;
  cfg.end_time = end;
  cfg.seed = seed;
  return cfg;
}

/// The PHOLD model (see the file comment).
struct model {
  /// An LP's state.
  struct state {
    uint64_t handled = 0;  ///< events handled
    uint64_t picked = 0;   ///< destinations drawn among all LPs
    uint64_t trace = 0;    ///< order-sensitive hash of (time, sender) of every event handled
  };
  /// An event's payload: the id of the LP that sent it (ROSS's message is one long).
  struct message {
    uint64_t from = 0;
  };

  parameters p;

  /// Schedules the LP's start events, up to the first the engine refuses (which fails the run).
  void init(lp_context<model>& lp) const {
    for (unsigned i = 0; i < p.start_events; ++i) {
      if (lp.schedule(lp.id(), delay(lp), message{lp.id()}) != status::ok) return;
    }
  }

  /// Handles one event: one new event, here or at a random LP.
  void handle(lp_context<model>& lp, const message& m) const {
    state& s = lp.state();
    ++s.handled;
    s.trace = mix64(s.trace ^ (std::bit_cast<uint64_t>(lp.now()) + m.from));
    lp_id dest = lp.id();
    if (lp.rng().uniform() < p.remote) {
      dest = static_cast<lp_id>(lp.rng().integer(0, lp.lp_count() - 1));
      ++s.picked;
    }
    lp.schedule(dest, delay(lp), message{lp.id()});
  }

  /// Digest of an LP's final state.
  uint64_t digest(const state& s) const { return mix64(s.handled ^ mix64(s.picked ^ mix64(s.trace))); }

private:
  double delay(lp_context<model>& lp) const {
    return p.lookahead + lp.rng().exponential(p.mean - p.lookahead);
  }
};

}  // namespace comm::sim::phold
