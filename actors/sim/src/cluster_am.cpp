// The cluster of several processes: one libcomm worker per process, an endpoint to every other
// process (shared memory on this host, tcp to others), and one active message per peer per round.
//
// A round's message carries the sender's events for the receiver, its earliest pending time and
// its committed count: the exchange of events is also the min-reduction, and since every process
// waits for a message from every other one, nothing is in flight when a round ends. A process can
// be at most one round ahead of another (it needs everybody's message to leave a round), so two
// slots, by round parity, hold what arrives.
//
// Waiting: busy progress for spin_us, then progress and sched_yield in turn for yield_us, then sleep
// on the worker's event fd (bounded, so failures are seen even without a wake-up). A dead peer fails its
// endpoint (about a millisecond over shm and tcp) and the run with it; a process that stops on an
// error tells the others first (an abort message).
#include "cluster_am.hpp"
#include "wire.hpp"

#include <comm/context.hpp>
#include <comm/sim/cluster.hpp>
#include <comm/worker.hpp>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

namespace comm::sim {
namespace {

using clock_type = std::chrono::steady_clock;

/// Bootstrap key of every process's worker address.
constexpr const char* address_key = "comm.sim.worker";

/// Longest bounded sleep on the event fd, in milliseconds.
constexpr int sleep_ms = 50;

/// Longest wait for an abort notice to leave, in milliseconds.
constexpr int abort_flush_ms = 200;

/// What arrived for one round.
struct round_slot {
  int arrived = 0;                 ///< processes heard from
  sim_time min = no_event;         ///< minimum of their local minima
  uint64_t committed = 0;          ///< sum of their committed counts
  std::vector<uint8_t> seen;       ///< seen[r]: process r's message arrived
};

/// The processes of a job, over libcomm.
class am_cluster final : public cluster {
public:
  am_cluster(bootstrap& boot, std::unique_ptr<bootstrap> owned, const cluster_params& params)
      : owned_boot_(std::move(owned)), boot_(boot), rank_(boot.rank()), size_(boot.size()),
        spin_(std::chrono::microseconds(std::max(params.spin_us, 0))),
        yield_(spin_ + std::chrono::microseconds(std::max(params.yield_us, 0))), ctx_(params.comm),
        name_(params.name) {}

  /// The worker goes first: its endpoints' error handlers point into peers_.
  ~am_cluster() override {
    finished_ = true;
    worker_.reset();
  }

  /// Creates the worker, exchanges addresses through the bootstrap and connects to every other
  /// process; `*why` says what failed.
  status connect(std::string* why);

  // -- cluster (see cluster.hpp) -----------------------------------------------------------------

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string transports() const override;
  status exchange(const round_input& in, event_sink& sink, round_outcome* out,
                  std::string* why) override;
  status reduce(const run_counters& mine, run_counters* all, std::string* why) override;
  void abort(std::string_view reason) override;

private:
  /// Another process: its endpoint, and what its error handler is given.
  struct peer {
    am_cluster* owner = nullptr;
    int rank = 0;
    endpoint_ptr ep;  ///< empty once the worker is gone
  };

  // -- arrivals ----------------------------------------------------------------------------------

  /// The worker's handler of the simulator's active message: checks the header, then handles.
  static status on_message(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const am_recv_params& params);
  /// A peer's endpoint failed: the run fails, naming the peer.
  static void on_endpoint_error(void* arg, endpoint* ep, status reason);
  /// Dispatches a checked message by kind.
  void handle(const wire::header& h, const void* data, size_t length);
  /// A round's message: minimum, count and events (to the sink).
  void handle_round(const wire::header& h, const void* data, size_t length);
  /// A peer's totals at the end.
  void handle_totals(const wire::header& h, const void* data, size_t length);
  /// A peer stopped on an error.
  void handle_abort(const wire::header& h, const void* data, size_t length);
  /// Keeps a message that came before this process's first round (no sink yet).
  void stash(const void* header, size_t header_length, const void* data, size_t length);
  /// Handles the kept messages once the first round starts.
  void replay_stashed();
  /// Records the first failure; later ones, and any once the results are in, are ignored.
  void set_failure(status st, std::string text);

  // -- sending and waiting -----------------------------------------------------------------------

  /// Allgathers the worker addresses and connects an endpoint to every other process.
  status publish_and_connect(std::string* why);
  /// Sends a message to process `to`; false (and a failure recorded) when it cannot.
  bool send(int to, const wire::header& h, const void* data, size_t bytes);
  /// True once every send of this process has completed (a failed one records a failure).
  bool sends_done();
  /// Progresses until done() or a failure: spin, then yield, then sleep (see the file comment).
  template <class Done>
  status wait_until(Done done, std::string* why);

  std::unique_ptr<bootstrap> owned_boot_;
  bootstrap& boot_;
  const int rank_;
  const int size_;
  const clock_type::duration spin_;            ///< busy polling before yielding
  const clock_type::duration yield_;           ///< polling (yielding) before sleeping
  context ctx_;
  std::string name_;
  std::unique_ptr<worker> worker_;
  std::vector<peer> peers_;                    ///< peers_[r]; this process's entry has no ep
  round_slot slots_[2];                        ///< by round parity
  uint64_t round_ = 0;                         ///< the round this process exchanges next
  uint64_t fingerprint_ = 0;                   ///< this process's run configuration
  event_sink* sink_ = nullptr;                 ///< set once the first round starts
  std::vector<std::vector<uint8_t>> stashed_;  ///< messages that came before it did
  std::vector<run_counters> totals_;
  std::vector<uint8_t> totals_seen_;
  int totals_arrived_ = 0;
  bool reducing_ = false;                      ///< rounds are over
  bool finished_ = false;                      ///< results are in: failures no longer matter
  bool aborted_ = false;
  std::vector<operation> in_flight_;           ///< sends not complete yet
  status failure_ = status::ok;
  std::string failure_text_;
};

// -- joining ---------------------------------------------------------------------------------------

status am_cluster::connect(std::string* why) {
  worker_params wp;
  wp.name = name_;
  if (auto made = worker::create(ctx_, wp)) worker_ = std::move(*made);
  if (!worker_) {
    *why = "cannot create a libcomm worker (no transport works here?)";
    return status::no_resource;
  }
  if (worker_->max_am_header() < sizeof(wire::header)) {
    *why = "the transports' active-message header limit (" +
           std::to_string(worker_->max_am_header()) + " bytes) is below the simulator's";
    return status::unsupported;
  }
  status st = worker_->set_am_handler(wire::am_id, on_message, this,
                                      am_flag_whole_msg | am_flag_fetch_rndv);
  if (st != status::ok) {
    *why = std::string("cannot install the simulator's message handler: ") + to_string(st);
    return st;
  }
  for (auto& slot : slots_) slot.seen.assign(size_, 0);
  totals_.assign(size_, {});
  totals_seen_.assign(size_, 0);
  return publish_and_connect(why);
}

status am_cluster::publish_and_connect(std::string* why) {
  std::vector<std::vector<uint8_t>> addresses;
  status st = boot_.allgather(address_key, worker_->address(), addresses);
  if (st != status::ok) {
    *why = std::string("exchanging worker addresses through the bootstrap (") +
           std::string(boot_.backend_name()) + ") failed: " + to_string(st);
    return st;
  }
  peers_.resize(size_);
  for (int r = 0; r < size_; ++r) {
    peers_[r].owner = this;
    peers_[r].rank = r;
    if (r == rank_) continue;
    auto ep = worker_->connect(addresses[r]);
    if (!ep) {
      *why = "cannot reach process " + std::to_string(r) + ": " + to_string(ep.error());
      return ep.error();
    }
    peers_[r].ep = std::move(*ep);
    peers_[r].ep->set_error_handler(on_endpoint_error, &peers_[r]);
  }
  st = boot_.barrier();
  if (st != status::ok) *why = std::string("the bootstrap's barrier failed: ") + to_string(st);
  return st;
}

std::string am_cluster::transports() const {
  std::vector<std::string> names;
  for (const peer& p : peers_) {
    if (!p.ep) continue;
    std::string t(p.ep->transport());
    if (std::find(names.begin(), names.end(), t) == names.end()) names.push_back(t);
  }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

// -- rounds ----------------------------------------------------------------------------------------

status am_cluster::exchange(const round_input& in, event_sink& sink, round_outcome* out,
                            std::string* why) {
  const bool first = sink_ == nullptr;
  sink_ = &sink;
  fingerprint_ = in.fingerprint;
  if (first) replay_stashed();
  wire::header h;
  h.what = static_cast<uint16_t>(wire::kind::round);
  h.sender = static_cast<uint32_t>(rank_);
  h.round = round_;
  h.fingerprint = in.fingerprint;
  h.local_min = in.local_min;
  h.committed = in.committed;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && !send(r, h, in.batches[r].data, in.batches[r].bytes)) break;
  }
  round_slot& slot = slots_[round_ & 1];
  const status st = wait_until([&] { return slot.arrived == size_ - 1 && sends_done(); }, why);
  if (st != status::ok) return st;
  out->global_min = std::min(in.local_min, slot.min);
  out->committed = in.committed + slot.committed;
  slot.arrived = 0;
  slot.min = no_event;
  slot.committed = 0;
  std::fill(slot.seen.begin(), slot.seen.end(), 0);
  ++round_;
  return status::ok;
}

status am_cluster::reduce(const run_counters& mine, run_counters* all, std::string* why) {
  reducing_ = true;
  wire::header h;
  h.what = static_cast<uint16_t>(wire::kind::totals);
  h.sender = static_cast<uint32_t>(rank_);
  const wire::totals packed = wire::pack(mine);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && !send(r, h, &packed, sizeof(packed))) break;
  }
  status st = wait_until([&] { return totals_arrived_ == size_ - 1 && sends_done(); }, why);
  if (st != status::ok) return st;
  *all = mine;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const run_counters& t = totals_[r];
    all->committed += t.committed;
    all->processed += t.processed;
    all->rollbacks += t.rollbacks;
    all->remote += t.remote;
    all->cross_partition += t.cross_partition;
    all->digest += t.digest;
    all->nanoseconds = std::max(all->nanoseconds, t.nanoseconds);
  }
  // Everybody has everything once everybody is here; endpoints closing afterwards are no error.
  st = boot_.barrier();
  finished_ = true;
  if (st != status::ok) {
    *why = std::string("the final barrier failed: ") + to_string(st);
    return st;
  }
  return status::ok;
}

void am_cluster::abort(std::string_view reason) {
  if (aborted_ || finished_ || !worker_) return;
  aborted_ = true;
  wire::header h;
  h.what = static_cast<uint16_t>(wire::kind::abort);
  h.sender = static_cast<uint32_t>(rank_);
  const size_t n = std::min(reason.size(), wire::max_reason);
  for (const peer& p : peers_) {
    if (!p.ep || p.ep->state() != status::ok) continue;
    p.ep->am_send(wire::am_id, std::span(&h, 1), std::span(reason.data(), n)).detach();
  }
  (void)operation(worker_->flush()).wait(abort_flush_ms);
}

bool am_cluster::send(int to, const wire::header& h, const void* data, size_t bytes) {
  operation o = peers_[to].ep->am_send(wire::am_id, std::span(&h, 1), const_bytes(data, bytes));
  if (is_error(o.status())) {
    set_failure(o.status(),
                "cannot send to process " + std::to_string(to) + ": " + to_string(o.status()));
    return false;
  }
  if (!o.done()) in_flight_.push_back(std::move(o));
  return true;
}

bool am_cluster::sends_done() {
  for (size_t i = 0; i < in_flight_.size();) {
    const status st = in_flight_[i].status();
    if (st == status::in_progress) {
      ++i;
      continue;
    }
    in_flight_[i] = std::move(in_flight_.back());
    in_flight_.pop_back();
    if (is_error(st)) set_failure(st, std::string("a send to another process failed: ") + to_string(st));
  }
  return in_flight_.empty();
}

template <class Done>
status am_cluster::wait_until(Done done, std::string* why) {
  clock_type::time_point idle_since{};  // zero while progress finds work
  for (;;) {
    if (failure_ != status::ok) {
      *why = failure_text_;
      return failure_;
    }
    if (done()) return status::ok;
    if (worker_->progress() != 0) {
      idle_since = {};
      continue;
    }
    const clock_type::time_point now = clock_type::now();
    if (idle_since == clock_type::time_point{}) idle_since = now;
    const clock_type::duration waited = now - idle_since;
    if (waited < spin_) continue;
    if (waited < yield_) {
      ::sched_yield();
      continue;
    }
    if (worker_->wait(sleep_ms) == status::ok) idle_since = {};
  }
}

// -- arrivals --------------------------------------------------------------------------------------

status am_cluster::on_message(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const am_recv_params&) {
  auto* self = static_cast<am_cluster*>(arg);
  if (self->sink_ == nullptr) {
    self->stash(header, header_length, data, length);
    return status::ok;
  }
  wire::header h;
  std::string why;
  if (!wire::check_header(header, header_length, self->size_, self->rank_, &h, &why)) {
    self->set_failure(status::protocol_error, "received " + why);
    return status::ok;
  }
  self->handle(h, data, length);
  return status::ok;
}

void am_cluster::handle(const wire::header& h, const void* data, size_t length) {
  switch (static_cast<wire::kind>(h.what)) {
    case wire::kind::round: handle_round(h, data, length); break;
    case wire::kind::totals: handle_totals(h, data, length); break;
    case wire::kind::abort: handle_abort(h, data, length); break;
  }
}

/// "process <rank>", for failure messages.
std::string process_name(uint32_t rank) { return "process " + std::to_string(rank); }

void am_cluster::handle_round(const wire::header& h, const void* data, size_t length) {
  if (reducing_ || (h.round != round_ && h.round != round_ + 1)) {
    set_failure(status::protocol_error,
                process_name(h.sender) + " sent round " + std::to_string(h.round) +
                    " while this one is in round " + std::to_string(round_) +
                    (reducing_ ? " (finished)" : ""));
    return;
  }
  if (h.fingerprint != fingerprint_) {
    set_failure(status::invalid_param,
                process_name(h.sender) +
                    " runs another configuration (LPs, partitions, lookahead, end, seed, "
                    "synchronisation or model differ)");
    return;
  }
  if (h.round != round_ && !slots_[round_ & 1].seen[h.sender]) {
    set_failure(status::protocol_error, process_name(h.sender) + " sent round " +
                                            std::to_string(h.round) + " before round " +
                                            std::to_string(round_));
    return;
  }
  round_slot& slot = slots_[h.round & 1];
  if (slot.seen[h.sender] || std::isnan(h.local_min)) {
    set_failure(status::protocol_error,
                process_name(h.sender) + " sent a duplicate or malformed round message");
    return;
  }
  slot.seen[h.sender] = 1;
  ++slot.arrived;
  slot.min = std::min(slot.min, h.local_min);
  slot.committed += h.committed;
  if (length == 0) return;
  std::string why;
  const status st = sink_->deliver(static_cast<int>(h.sender), data, length, &why);
  if (st != status::ok) set_failure(st, why);
}

void am_cluster::handle_totals(const wire::header& h, const void* data, size_t length) {
  if (!reducing_ && !slots_[round_ & 1].seen[h.sender]) {
    set_failure(status::protocol_error, "process " + std::to_string(h.sender) +
                                            " sent its totals in round " + std::to_string(round_) +
                                            " before that round's message");
    return;
  }
  if (length != sizeof(wire::totals) || totals_seen_[h.sender]) {
    set_failure(status::protocol_error,
                "process " + std::to_string(h.sender) + " sent malformed or duplicate totals");
    return;
  }
  wire::totals t;
  std::memcpy(&t, data, sizeof(t));
  totals_[h.sender] = wire::unpack(t);
  totals_seen_[h.sender] = 1;
  ++totals_arrived_;
}

void am_cluster::handle_abort(const wire::header& h, const void* data, size_t length) {
  std::string reason(static_cast<const char*>(data), std::min(length, wire::max_reason));
  for (char& c : reason) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  set_failure(status::canceled, "process " + std::to_string(h.sender) + " stopped: " + reason);
}

void am_cluster::stash(const void* header, size_t header_length, const void* data,
                       size_t length) {
  // Only before the first round, when at most one message per process can come (bounded).
  wire::header h;
  std::string why;
  if (stashed_.size() >= static_cast<size_t>(size_) ||
      !wire::check_header(header, header_length, size_, rank_, &h, &why)) {
    set_failure(status::protocol_error, "an unexpected simulator message before the first round");
    return;
  }
  std::vector<uint8_t> bytes(sizeof(wire::header) + length);
  std::memcpy(bytes.data(), header, sizeof(wire::header));
  if (length != 0) std::memcpy(bytes.data() + sizeof(wire::header), data, length);
  stashed_.push_back(std::move(bytes));
}

void am_cluster::replay_stashed() {
  for (const std::vector<uint8_t>& bytes : stashed_) {
    wire::header h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    handle(h, bytes.data() + sizeof(h), bytes.size() - sizeof(h));
  }
  stashed_.clear();
}

void am_cluster::set_failure(status st, std::string text) {
  if (finished_ || failure_ != status::ok) return;
  failure_ = st;
  failure_text_ = std::move(text);
}

void am_cluster::on_endpoint_error(void* arg, endpoint* ep, status reason) {
  auto* p = static_cast<peer*>(arg);
  p->owner->set_failure(reason, "process " + std::to_string(p->rank) + " (" + ep->peer_name() +
                                    ") is gone: " + to_string(reason));
}

}  // namespace

status connect_cluster(bootstrap& boot, std::unique_ptr<bootstrap> owned,
                       const cluster_params& params, std::unique_ptr<cluster>* out,
                       std::string* why) {
  std::string ignored;
  if (why == nullptr) why = &ignored;
  if (boot.size() == 1) {
    *out = cluster::local();
    return status::ok;
  }
  auto c = std::make_unique<am_cluster>(boot, std::move(owned), params);
  const status st = c->connect(why);
  if (st != status::ok) return st;
  *out = std::move(c);
  return status::ok;
}

status cluster::join(bootstrap& boot, const cluster_params& params,
                     std::unique_ptr<cluster>* out, std::string* why) {
  return connect_cluster(boot, nullptr, params, out, why);
}

}  // namespace comm::sim
