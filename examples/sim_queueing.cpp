// A closed queueing network on libcomm's simulation engine: a model of the user's own kind, the
// way the README's "Writing a simulation model" section explains.
//
// `stations` service stations (single server, first come first served) hold `jobs` jobs each at
// the start. A job served at a station travels to the next station on the ring with probability
// 1 - `scatter`, else to a station drawn at random, and arrives after a transit time (at least
// the lookahead). Each station is an LP; its events are a job's arrival and the end of a service.
//
//   sim_queueing [--stations N] [--jobs N] [--end T] [--partitions N] [--seed N]
//
// Alone it runs the model twice (1 and 3 partitions), checks that both runs agree, that no job
// was lost, and that every station obeys the utilisation law (busy fraction = throughput x mean
// service time), then prints the busiest stations. Under mpirun or srun (or by hand with
// COMM_BOOTSTRAP_ADDRESS, COMM_RANK, COMM_SIZE) it runs once across the processes and rank 0
// prints the summary and its own stations. Exit status 0 means every check held.
#include <comm/sim/cluster.hpp>
#include <comm/sim/engine.hpp>
#include <comm/sim/report.hpp>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace comm::sim;

/// The network's parameters.
struct network_parameters {
  double transit_min = 0.5;   ///< least transit time between stations: the lookahead
  double transit_mean = 1.0;  ///< mean transit time
  double service_min = 0.5;   ///< least service time (a station's own events obey the lookahead too)
  double service_mean = 1.0;  ///< mean service time
  double scatter = 0.2;       ///< probability that a job goes to a random station
  unsigned jobs = 4;          ///< jobs per station at the start
};

/// The model: what an LP (a station) holds, what an event carries, and how a station reacts.
struct queueing_network {
  /// A station.
  struct state {
    uint32_t queue = 0;          ///< jobs here, the one in service included
    uint64_t served = 0;         ///< services completed
    uint64_t arrived = 0;        ///< arrivals handled
    uint64_t sent = 0;           ///< jobs sent on (arrivals scheduled, start jobs included)
    double busy_time = 0;        ///< time the server was busy
    double queue_area = 0;       ///< integral of the queue length over time
    double last_change = 0;      ///< time of the last event
  };
  /// An event: a job arrives, or the station's service ends.
  struct message {
    enum kind_type : uint8_t { arrival, service_end } kind;
  };

  network_parameters p;

  /// The station's start jobs arrive during the first transit time; the first the engine refuses
  /// (past run_config::max_events) fails the run, so the rest are not tried.
  void init(lp_context<queueing_network>& lp) {
    for (unsigned i = 0; i < p.jobs; ++i) {
      if (send_job(lp, lp.id()) != comm::status::ok) return;
    }
  }

  /// One event at a station.
  void handle(lp_context<queueing_network>& lp, const message& m) {
    state& s = lp.state();
    account(s, lp.now());
    if (m.kind == message::arrival) {
      ++s.arrived;
      if (++s.queue == 1) start_service(lp);
      return;
    }
    ++s.served;
    --s.queue;
    send_job(lp, next_station(lp));
    if (s.queue > 0) start_service(lp);
  }

  /// What the run's digest takes from a station.
  uint64_t digest(const state& s) const {
    uint64_t h = mix64(s.served) ^ mix64(s.arrived + 0x51) ^ mix64(s.queue + 0x7f);
    return mix64(h ^ std::bit_cast<uint64_t>(s.busy_time) ^ std::bit_cast<uint64_t>(s.queue_area));
  }

private:
  void account(state& s, double now) const {
    const double dt = now - s.last_change;
    s.queue_area += s.queue * dt;
    if (s.queue > 0) s.busy_time += dt;
    s.last_change = now;
  }

  void start_service(lp_context<queueing_network>& lp) {
    const double t = p.service_min + lp.rng().exponential(p.service_mean - p.service_min);
    lp.schedule(lp.id(), t, message{message::service_end});
  }

  comm::status send_job(lp_context<queueing_network>& lp, lp_id to) {
    const double t = p.transit_min + lp.rng().exponential(p.transit_mean - p.transit_min);
    ++lp.state().sent;
    return lp.schedule(to, t, message{message::arrival});
  }

  lp_id next_station(lp_context<queueing_network>& lp) {
    if (lp.rng().uniform() < p.scatter) {
      return static_cast<lp_id>(lp.rng().integer(0, lp.lp_count() - 1));
    }
    return static_cast<lp_id>((lp.id() + 1) % lp.lp_count());
  }
};

/// Command-line settings.
struct options {
  uint64_t stations = 64;
  double end = 20000;
  unsigned partitions = 1;
  uint64_t seed = 1;
  network_parameters network;
};

bool parse(int argc, char** argv, options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const char* value = argv[i + 1];
    if (name == "--stations") o->stations = std::strtoull(value, nullptr, 10);
    else if (name == "--jobs") o->network.jobs = static_cast<unsigned>(std::atoi(value));
    else if (name == "--end") o->end = std::atof(value);
    else if (name == "--partitions") o->partitions = static_cast<unsigned>(std::atoi(value));
    else if (name == "--seed") o->seed = std::strtoull(value, nullptr, 10);
    else return false;
  }
  return argc % 2 == 1 && o->stations > 0;
}

/// One run's outcome, with the stations this process held.
struct outcome {
  comm::status st = comm::status::ok;
  std::string why;
  run_result result;
  std::vector<std::pair<lp_id, queueing_network::state>> stations;
};

outcome run(cluster& c, const options& o, unsigned partitions) {
  run_config cfg;
  cfg.lp_count = o.stations;
  cfg.partitions = partitions;
  cfg.lookahead = o.network.transit_min;
  cfg.end_time = o.end;
  cfg.seed = o.seed;
  queueing_network model{o.network};
  engine<queueing_network> e(c, cfg, model);
  outcome out;
  out.st = e.run(&out.result, &out.why);
  e.for_each_lp([&](lp_id id, const queueing_network::state& s, uint64_t) {
    out.stations.emplace_back(id, s);
  });
  return out;
}

void print_stations(const outcome& r, double end, size_t count) {
  std::vector<std::pair<lp_id, queueing_network::state>> busiest = r.stations;
  std::sort(busiest.begin(), busiest.end(),
            [](auto& a, auto& b) { return a.second.busy_time > b.second.busy_time; });
  std::printf("station  served  utilisation  mean queue\n");
  for (size_t i = 0; i < std::min(count, busiest.size()); ++i) {
    const auto& [id, s] = busiest[i];
    std::printf("%7u %7" PRIu64 " %12.3f %11.2f\n", id, s.served, s.busy_time / end,
                s.queue_area / end);
  }
}

/// The checks of a one-process run: no job lost, the utilisation law at every station.
bool check_stations(const outcome& r, const options& o) {
  uint64_t queued = 0, sent = 0, arrived = 0;
  bool ok = true;
  for (const auto& [id, s] : r.stations) {
    queued += s.queue;
    sent += s.sent;
    arrived += s.arrived;
    const double utilisation = s.busy_time / s.last_change;
    const double law = s.served * o.network.service_mean / s.last_change;
    if (std::abs(utilisation - law) > 0.05) {
      std::printf("station %u: utilisation %.3f but throughput x service time %.3f\n", id,
                  utilisation, law);
      ok = false;
    }
  }
  const uint64_t jobs = o.stations * o.network.jobs;
  if (queued + (sent - arrived) != jobs) {
    std::printf("jobs lost: %" PRIu64 " queued + %" PRIu64 " travelling != %" PRIu64 "\n", queued,
                sent - arrived, jobs);
    ok = false;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: sim_queueing [--stations N] [--jobs N] [--end T] [--partitions N] "
                 "[--seed N]\n");
    return 2;
  }
  std::unique_ptr<cluster> c;
  std::string why;
  if (cluster::join({}, &c, &why) != comm::status::ok) {
    std::fprintf(stderr, "sim_queueing: %s\n", why.c_str());
    return 1;
  }
  const outcome first = run(*c, o, o.partitions);
  if (first.st != comm::status::ok) {
    std::fprintf(stderr, "sim_queueing: rank %d: %s\n", c->rank(), first.why.c_str());
    return 1;
  }
  if (c->rank() == 0) {
    print_summary(stdout, first.result);
    print_stations(first, o.end, 5);
  }
  if (c->size() > 1) return 0;
  const outcome again = run(*c, o, 3);
  bool ok = again.st == comm::status::ok && again.result.digest == first.result.digest;
  std::printf("1 and 3 partitions agree: %s\n", ok ? "yes" : "NO");
  ok = check_stations(first, o) && ok;
  std::printf("%s\n", ok ? "all checks passed" : "CHECKS FAILED");
  return ok ? 0 : 1;
}
