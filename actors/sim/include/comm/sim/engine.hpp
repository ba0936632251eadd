// The simulation engine: runs a model's logical processes (LPs) over the partitions of every
// process of a cluster, in conservative windows.
//
// A model is a type with
//   using state = ...;    // one per LP, default-constructible
//   using message = ...;  // an event's payload, trivially copyable
//   void init(lp_context<Model>& lp);                    // schedules the LP's first events
//   void handle(lp_context<Model>& lp, const message&);  // one event
//   uint64_t digest(const state&) const;                 // for the run's digest
// A handler reads lp.now(), changes lp.state(), draws from lp.rng() and calls lp.schedule(target,
// delay, message) with delay >= the lookahead (init: delay >= 0).
//
// Each round, every process handles its events in [T, T + lookahead), T the earliest pending
// event time of the whole job; no event scheduled inside the window can land in it, so the
// partitions run it without talking to anyone. Then the processes exchange the events they made
// for each other and the earliest time each still holds (cluster::exchange), which gives the next
// T. An LP handles its events in (time, sender, sender's sequence) order and draws from its own
// random stream keyed by (seed, LP id), so the results do not depend on the layout.
#pragma once

#include <comm/sim/cluster.hpp>
#include <comm/sim/config.hpp>
#include <comm/sim/detail/future_events.hpp>
#include <comm/sim/event.hpp>
#include <comm/sim/random.hpp>
#include <comm/sim/report.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace comm::sim {

template <class Model>
class engine;

/// What a handler is given: its LP's id, state, random stream and the current time, and the
/// means to schedule events.
template <class Model>
class lp_context {
public:
  using state_type = typename Model::state;      ///< the state of an LP
  using message_type = typename Model::message;  ///< what an event carries

  /// The LP's global id.
  lp_id id() const noexcept { return id_; }
  /// The time of the event being handled (0 in init).
  sim_time now() const noexcept { return now_; }
  /// The LP's state.
  state_type& state() noexcept { return record_->state; }
  /// The LP's random stream.
  random_stream& rng() noexcept { return record_->rng; }
  /// Number of LPs in the model.
  uint64_t lp_count() const noexcept { return engine_->config_.lp_count; }
  /// The smallest delay schedule() accepts outside init.
  sim_time lookahead() const noexcept { return engine_->config_.lookahead; }

  /// Schedules `message` for LP `target` at now() + delay. Refused (and the run fails with a
  /// message naming the LP) with invalid_param for a delay below the lookahead (below 0 in init)
  /// or a target out of range, exceeds_limit beyond run_config::max_events. Events at or after
  /// the end time are dropped (ok).
  status schedule(lp_id target, sim_time delay, const message_type& message) {
    return engine_->schedule(*this, target, delay, message);
  }

private:
  friend class engine<Model>;
  struct record {
    state_type state{};
    random_stream rng;
    uint64_t processed = 0;  ///< events handled
    uint64_t sent = 0;       ///< events scheduled (the sequence of the next one)
  };

  engine<Model>* engine_ = nullptr;
  record* record_ = nullptr;
  sim_time now_ = 0;
  lp_id id_ = 0;
};

/// The requirements on a model (see the file comment).
template <class M>
concept model = std::default_initializable<typename M::state> &&
                std::is_trivially_copyable_v<typename M::message> &&
                requires(M& m, lp_context<M>& lp, const typename M::message& msg,
                         const typename M::state& s) {
                  m.init(lp);
                  m.handle(lp, msg);
                  { m.digest(s) } -> std::convertible_to<uint64_t>;
                };

/// Runs a model (see the file comment) on this process's share of the LPs, in step with the
/// other processes of `cluster`. Construct it on every process with the same configuration.
template <class Model>
class engine : private event_sink {
public:
  static_assert(model<Model>, "see engine.hpp for what a model provides");
  using event_type = event<typename Model::message>;  ///< an event of the model
  using state_type = typename Model::state;           ///< the state of one LP

  /// An engine for `model` (which must outlive it) on `c` (likewise).
  engine(cluster& c, const run_config& cfg, Model& model)
      : cluster_(c), config_(cfg), model_(model) {}

  /// Runs the whole simulation, once per engine; a collective call. Fills `*out` (the same on every process) and
  /// returns ok, or an error with `*why` saying what went wrong: invalid_param (a bad
  /// configuration, or a handler broke the rules), exceeds_limit (max_events), unsupported
  /// (optimistic), or what the cluster reports (a process died, aborted or sent bad data).
  status run(run_result* out, std::string* why);

  /// Calls f(id, state, events handled) for every LP of this process, after run().
  template <class F>
  void for_each_lp(F&& f) const {
    for (const partition& p : partitions_) {
      for (size_t i = 0; i < p.lps.size(); ++i) {
        f(static_cast<lp_id>(p.first + i), p.lps[i].state, p.lps[i].processed);
      }
    }
  }

private:
  friend class lp_context<Model>;
  using record = typename lp_context<Model>::record;

  /// A block of LPs with its own event queue.
  struct partition {
    partition(lp_id first_id, size_t count, sim_time width)
        : first(first_id), lps(count), queue(width) {}
    lp_id first;                                                ///< id of lps[0]
    std::vector<record> lps;                                    ///< the LPs
    detail::future_events<typename Model::message> queue;       ///< their pending events
  };

  // -- set-up ------------------------------------------------------------------------------------

  /// False (with `*why`) for a configuration the engine cannot run.
  bool check_config(std::string* why) const;
  /// This process's LP blocks, partitions, random streams and outboxes.
  void make_partitions();
  /// A hash of everything that must agree between processes.
  uint64_t fingerprint() const;

  // -- rounds ------------------------------------------------------------------------------------

  /// Calls the model's init for every LP of this process; false when one broke a rule.
  bool init_lps();
  /// Handles partition p's events before `end`, in (LP, time, sender, sequence) order.
  void run_window(partition& p, sim_time end);
  /// Sorts window_ in that order.
  void sort_window(const partition& p);
  /// The earliest event time this process holds or sends.
  sim_time local_min() const;
  /// The round's exchange with the other processes; fills `*outcome`.
  status exchange(round_outcome* outcome, std::string* why);
  /// Tells the others and returns `st` with `message` in `*why`.
  status fail(status st, std::string message, std::string* why);

  // -- events ------------------------------------------------------------------------------------

  /// lp_context::schedule: checks the rules, then queues the event or puts it in an outbox.
  status schedule(lp_context<Model>& from, lp_id target, sim_time delay,
                  const typename Model::message& message);
  /// Records why a schedule call is refused (the first one fails the run) and returns the status.
  [[gnu::cold, gnu::noinline]] status refuse(const lp_context<Model>& from, lp_id target,
                                             sim_time delay);
  /// event_sink: checks and queues the events another process sent.
  status deliver(int from, const void* data, size_t bytes, std::string* why) override;
  /// The partition of this process that holds LP `target`.
  partition& owner_partition(lp_id target) noexcept;
  /// The process that holds LP `target`.
  size_t owner_process(lp_id target) const noexcept;

  // -- results -----------------------------------------------------------------------------------

  /// This process's contribution to run_result, its LPs' digests included.
  run_counters counters(uint64_t nanoseconds) const;

  cluster& cluster_;
  const run_config config_;
  Model& model_;

  std::vector<partition> partitions_;
  std::vector<uint32_t> local_partition_;        ///< partition of each local LP (several only)
  std::vector<uint64_t> first_lp_;               ///< first LP id of each process, and lp_count
  double owner_scale_ = 0;                       ///< processes / lp_count
  lp_id local_first_ = 0;                        ///< first LP id of this process
  uint64_t local_count_ = 0;                     ///< LPs of this process
  partition* current_ = nullptr;                 ///< the partition whose window runs
  sim_time min_delay_ = 0;                       ///< lookahead (0 during init)
  sim_time window_end_ = 0;                      ///< end of the current window
  std::vector<event_type> window_;               ///< events of the window being handled
  std::vector<event_type> sorted_;               ///< counting-sort target
  std::vector<uint32_t> group_;                  ///< counting-sort offsets per LP
  std::vector<std::vector<event_type>> outbox_;  ///< events for each process this round
  std::vector<outgoing_batch> batches_;          ///< outbox_ as bytes
  sim_time outbox_min_ = no_event;               ///< earliest event in outbox_
  uint64_t fingerprint_ = 0;                     ///< of the configuration (see fingerprint())
  size_t held_ = 0;                              ///< events this process holds
  uint64_t processed_ = 0;
  uint64_t remote_ = 0;
  uint64_t cross_partition_ = 0;
  uint64_t rounds_ = 0;
  status error_ = status::ok;                    ///< first rule a handler broke
  std::string error_text_;
};

// -- implementation ------------------------------------------------------------------------------

template <class Model>
status engine<Model>::run(run_result* out, std::string* why) {
  if (!check_config(why)) return status::invalid_param;
  if (config_.sync == sync_mode::optimistic) {
    if (why != nullptr) *why = "optimistic (Time Warp) synchronisation is not available; use conservative (2)";
    return status::unsupported;
  }
  make_partitions();
  fingerprint_ = fingerprint();
  const auto start = std::chrono::steady_clock::now();
  progress_meter meter(config_.progress && cluster_.rank() == 0 ? stderr : nullptr,
                       config_.progress_interval);
  if (!init_lps()) return fail(error_, error_text_, why);
  round_outcome outcome;
  if (status st = exchange(&outcome, why); st != status::ok) return st;
  min_delay_ = config_.lookahead;
  while (outcome.global_min < config_.end_time) {
    const sim_time end = std::min(outcome.global_min + config_.lookahead, config_.end_time);
    if (!(end > outcome.global_min)) {
      return fail(status::invalid_param, "time " + std::to_string(outcome.global_min) +
                  " plus the lookahead rounds to itself: raise the lookahead", why);
    }
    window_end_ = end;
    for (partition& p : partitions_) run_window(p, end);
    if (error_ != status::ok) return fail(error_, error_text_, why);
    ++rounds_;
    if (status st = exchange(&outcome, why); st != status::ok) return st;
    if (outcome.global_min < end) {
      return fail(status::protocol_error, "the job's earliest event time went back from " +
                  std::to_string(end) + " to " + std::to_string(outcome.global_min), why);
    }
    meter.update(outcome.global_min, outcome.committed);
  }
  meter.finish();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  run_counters all;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
  if (status st = cluster_.reduce(counters(static_cast<uint64_t>(ns)), &all, why);
      st != status::ok) {
    return st;
  }
  *out = run_result{all.committed, all.processed, all.rollbacks, all.remote, all.cross_partition,
                    rounds_, all.digest, all.nanoseconds * 1e-9, cluster_.size(),
                    config_.partitions, config_.lp_count};
  return status::ok;
}

template <class Model>
bool engine<Model>::check_config(std::string* why) const {
  const uint64_t blocks = static_cast<uint64_t>(cluster_.size()) * config_.partitions;
  std::string problem;
  if (config_.lp_count == 0 || config_.lp_count > 0xffffffffull) {
    problem = "the LP count must be between 1 and 2^32 - 1";
  } else if (config_.partitions == 0 || config_.lp_count < blocks) {
    problem = "every partition needs an LP: " + std::to_string(config_.lp_count) + " LPs for " +
              std::to_string(cluster_.size()) + " processes x " +
              std::to_string(config_.partitions) + " partitions";
  } else if (!(config_.lookahead > 0) || !std::isfinite(config_.lookahead)) {
    problem = "the lookahead must be positive and finite";
  } else if (!(config_.end_time > 0)) {
    problem = "the end time must be positive";
  } else if (config_.sync == sync_mode::sequential && cluster_.size() > 1) {
    problem = "sequential runs take one process; use conservative (2) for " +
              std::to_string(cluster_.size());
  }
  if (problem.empty()) return true;
  if (why != nullptr) *why = problem;
  return false;
}

template <class Model>
void engine<Model>::make_partitions() {
  const uint64_t n = config_.lp_count;
  const uint64_t procs = static_cast<uint64_t>(cluster_.size());
  const uint64_t r = static_cast<uint64_t>(cluster_.rank());
  first_lp_.resize(procs + 1);
  for (uint64_t i = 0; i <= procs; ++i) first_lp_[i] = i * n / procs;
  owner_scale_ = static_cast<double>(procs) / static_cast<double>(n);
  local_first_ = static_cast<lp_id>(first_lp_[r]);
  local_count_ = first_lp_[r + 1] - first_lp_[r];
  const uint64_t k = config_.partitions;
  partitions_.clear();
  partitions_.reserve(k);
  if (k > 1) local_partition_.resize(local_count_);
  for (uint64_t i = 0; i < k; ++i) {
    const uint64_t lo = i * local_count_ / k, hi = (i + 1) * local_count_ / k;
    partitions_.emplace_back(static_cast<lp_id>(local_first_ + lo), hi - lo, config_.lookahead);
    for (uint64_t j = lo; j < hi && k > 1; ++j) local_partition_[j] = static_cast<uint32_t>(i);
  }
  for (partition& p : partitions_) {
    for (size_t i = 0; i < p.lps.size(); ++i) {
      p.lps[i].rng = random_stream(config_.seed, p.first + i);
    }
  }
  outbox_.assign(cluster_.size(), {});
  batches_.assign(cluster_.size(), {});
}

template <class Model>
uint64_t engine<Model>::fingerprint() const {
  uint64_t h = mix64(config_.lp_count) ^ mix64(config_.partitions * 0x100000001b3ull);
  h = mix64(h ^ std::bit_cast<uint64_t>(config_.lookahead));
  h = mix64(h ^ std::bit_cast<uint64_t>(config_.end_time));
  h = mix64(h ^ config_.seed);
  h = mix64(h ^ static_cast<uint64_t>(config_.sync));
  return mix64(h ^ sizeof(event_type));
}

template <class Model>
bool engine<Model>::init_lps() {
  lp_context<Model> ctx;
  ctx.engine_ = this;
  ctx.now_ = 0;
  min_delay_ = 0;
  window_end_ = 0;
  for (partition& p : partitions_) {
    current_ = &p;
    for (size_t i = 0; i < p.lps.size(); ++i) {
      ctx.record_ = &p.lps[i];
      ctx.id_ = static_cast<lp_id>(p.first + i);
      model_.init(ctx);
      if (error_ != status::ok) return false;
    }
  }
  return true;
}

template <class Model>
void engine<Model>::run_window(partition& p, sim_time end) {
  window_.clear();
  p.queue.take_before(end, window_);
  if (window_.empty()) return;
  sort_window(p);
  current_ = &p;
  lp_context<Model> ctx;
  ctx.engine_ = this;
  for (const event_type& e : window_) {
    record& r = p.lps[e.target - p.first];
    ctx.record_ = &r;
    ctx.now_ = e.time;
    ctx.id_ = e.target;
    model_.handle(ctx, e.message);
    ++r.processed;
  }
  processed_ += window_.size();
  held_ -= window_.size();
}

template <class Model>
void engine<Model>::sort_window(const partition& p) {
  const auto by_target = [](const event_type& a, const event_type& b) {
    return a.target != b.target ? a.target < b.target : key_less(a, b);
  };
  const size_t n = window_.size();
  if (std::is_sorted(window_.begin(), window_.end(), by_target)) return;
  if (n * 4 < p.lps.size()) {
    std::sort(window_.begin(), window_.end(), by_target);
    return;
  }
  // Dense window: a counting sort by LP, then each LP's few events by key.
  group_.assign(p.lps.size() + 1, 0);
  for (const event_type& e : window_) ++group_[e.target - p.first + 1];
  for (size_t i = 1; i < group_.size(); ++i) group_[i] += group_[i - 1];
  sorted_.resize(n);
  for (const event_type& e : window_) sorted_[group_[e.target - p.first]++] = e;
  window_.swap(sorted_);
  for (size_t lo = 0; lo < n;) {
    size_t hi = lo + 1;
    while (hi < n && window_[hi].target == window_[lo].target) ++hi;
    if (hi - lo > 1) {
      std::sort(window_.begin() + lo, window_.begin() + hi, key_less<typename Model::message>);
    }
    lo = hi;
  }
}

template <class Model>
sim_time engine<Model>::local_min() const {
  sim_time m = outbox_min_;
  for (const partition& p : partitions_) m = std::min(m, p.queue.min_time());
  return m;
}

template <class Model>
status engine<Model>::exchange(round_outcome* outcome, std::string* why) {
  for (size_t r = 0; r < outbox_.size(); ++r) {
    batches_[r] = {outbox_[r].data(), outbox_[r].size() * sizeof(event_type)};
  }
  round_input in;
  in.batches = batches_.data();
  in.local_min = local_min();
  in.committed = processed_;
  in.fingerprint = fingerprint_;
  const status st = cluster_.exchange(in, *this, outcome, why);
  for (auto& box : outbox_) {
    held_ -= box.size();
    box.clear();
  }
  outbox_min_ = no_event;
  if (st != status::ok) cluster_.abort(why != nullptr ? *why : "exchange failed");
  return st;
}

template <class Model>
status engine<Model>::fail(status st, std::string message, std::string* why) {
  cluster_.abort(message);
  if (why != nullptr) *why = std::move(message);
  return st;
}

template <class Model>
typename engine<Model>::partition& engine<Model>::owner_partition(lp_id target) noexcept {
  if (partitions_.size() == 1) return partitions_[0];
  return partitions_[local_partition_[target - local_first_]];
}

template <class Model>
size_t engine<Model>::owner_process(lp_id target) const noexcept {
  // A multiplication instead of a division per remote event; rounding is corrected by the block
  // boundaries (first_lp_[p] = p * lp_count / processes).
  const size_t last = first_lp_.size() - 2;
  size_t p = std::min(static_cast<size_t>(target * owner_scale_), last);
  while (target < first_lp_[p]) --p;
  while (p < last && target >= first_lp_[p + 1]) ++p;
  return p;
}

template <class Model>
status engine<Model>::schedule(lp_context<Model>& from, lp_id target, sim_time delay,
                               const typename Model::message& message) {
  if (!(delay >= min_delay_) || target >= config_.lp_count) return refuse(from, target, delay);
  const event_type e{from.now_ + delay, target, from.id_, from.record_->sent++, message};
  if (!(e.time < config_.end_time)) return status::ok;
  if (held_ >= config_.max_events) return refuse(from, target, delay);
  ++held_;
  if (target - local_first_ < local_count_) {
    partition& p = owner_partition(target);
    cross_partition_ += &p != current_;
    p.queue.push(e);
    return status::ok;
  }
  outbox_[owner_process(target)].push_back(e);
  outbox_min_ = std::min(outbox_min_, e.time);
  ++remote_;
  return status::ok;
}

template <class Model>
status engine<Model>::refuse(const lp_context<Model>& from, lp_id target, sim_time delay) {
  status st = status::invalid_param;
  std::string what;
  if (!(delay >= min_delay_)) {
    what = "scheduled an event with delay " + std::to_string(delay) + ", below the " +
           (min_delay_ > 0 ? "lookahead " + std::to_string(min_delay_) : "minimum 0");
  } else if (target >= config_.lp_count) {
    what = "scheduled an event for LP " + std::to_string(target) + " of " +
           std::to_string(config_.lp_count);
  } else {
    st = status::exceeds_limit;
    what = "went past the limit of " + std::to_string(config_.max_events) +
           " events held by a process (run_config::max_events)";
  }
  if (error_ == status::ok) {
    error_ = st;
    error_text_ = "LP " + std::to_string(from.id_) + " at time " + std::to_string(from.now_) +
                  " " + what;
  }
  return st;
}

template <class Model>
status engine<Model>::deliver(int from, const void* data, size_t bytes, std::string* why) {
  const auto sender = [from] { return "process " + std::to_string(from); };  // failures only
  if (bytes % sizeof(event_type) != 0) {
    *why = sender() + " sent " + std::to_string(bytes) + " bytes, not a whole number of events";
    return status::protocol_error;
  }
  const size_t n = bytes / sizeof(event_type);
  if (held_ + n > config_.max_events) {
    *why = sender() + "'s " + std::to_string(n) + " events go past the limit of " +
           std::to_string(config_.max_events) + " events held by a process";
    return status::exceeds_limit;
  }
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    event_type e;
    std::memcpy(&e, p + i * sizeof(event_type), sizeof(event_type));
    if (e.target - local_first_ >= local_count_ || e.sender >= config_.lp_count ||
        !(e.time >= window_end_ && e.time < config_.end_time)) {
      *why = sender() + " sent an event that cannot be ours: LP " + std::to_string(e.target) +
             " from LP " + std::to_string(e.sender) + " at time " + std::to_string(e.time) +
             " (window end " + std::to_string(window_end_) + ")";
      return status::protocol_error;
    }
    owner_partition(e.target).queue.push(e);
  }
  held_ += n;
  return status::ok;
}

template <class Model>
run_counters engine<Model>::counters(uint64_t nanoseconds) const {
  run_counters c;
  c.committed = processed_;
  c.processed = processed_;
  c.remote = remote_;
  c.cross_partition = cross_partition_;
  c.nanoseconds = nanoseconds;
  for_each_lp([&](lp_id id, const state_type& s, uint64_t processed) {
    const uint64_t state_digest = static_cast<uint64_t>(model_.digest(s));
    c.digest += mix64(mix64(id + 0x9e3779b97f4a7c15ull) ^ mix64(state_digest ^ mix64(processed)));
  });
  return c;
}

}  // namespace comm::sim
