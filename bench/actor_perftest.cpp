// Actor ping-pong and one-way throughput between two CAF actor systems, run alternately over
//   inproc  both actors in one actor system (CAF's floor: no serialisation, no transport),
//   caf     CAF 0.17.6's own middleman (publish / remote_actor over loopback TCP),
//   comm    libcomm's node (shared memory between processes on one host; COMM_TLS applies),
// with the server in a forked process pinned to core 0 and the client pinned to core 1. Every
// round runs every mode once; the medians over rounds and their ratios are printed, and the
// 1 MiB round trip is compared with a plain memcpy of 1 MiB each way. Payloads are
// std::vector<char>, which CAF serialises as one block, and for the "blob" column
// comm::actors::blob, which the node moves without serialising (one copy per hop over shm).
//
//   actor_perftest [-r rounds] [-n round trips] [-w one-way messages] [-m modes] [-l] [-s]
//     -m  comma-separated modes (default inproc,caf,comm)
//     -l  large only: skip the 8-byte tests
//     -s  small only: skip the 1 MiB tests
#include <comm/actors/node.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pong_atom = caf::atom_constant<caf::atom("pong")>;
using oneway_atom = caf::atom_constant<caf::atom("oneway")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using clock_type = std::chrono::steady_clock;

constexpr size_t large_size = 1 << 20;

void pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

/// Answers every ping with a pong carrying the same payload; counts one-way messages and says
/// done to the sender after the last one.
caf::behavior ponger(caf::event_based_actor* self) {
  auto received = std::make_shared<int64_t>(0);
  return {
    [](ping_atom, int64_t i, std::vector<char>& payload) {
      return caf::make_message(pong_atom::value, i, std::move(payload));
    },
    [](ping_atom, int64_t i, comm::actors::blob& payload) {
      return caf::make_message(pong_atom::value, i, std::move(payload));
    },
    [self, received](oneway_atom, int64_t i, int64_t total) {
      ++*received;
      if (i + 1 == total) {
        self->send(caf::actor_cast<caf::actor>(self->current_sender()), done_atom::value,
                   *received);
        *received = 0;
      }
    },
  };
}

/// Sends `n` pings one after the other (each after the previous pong) and tells `report`.
template <class Payload>
caf::behavior pinger(caf::event_based_actor* self, caf::actor pong, int64_t n, Payload payload,
                     caf::actor report) {
  self->send(pong, ping_atom::value, int64_t{0}, std::move(payload));
  return {
    [=](pong_atom, int64_t i, Payload& p) {
      if (i + 1 >= n) {
        self->send(report, done_atom::value, i + 1);
        self->quit();
        return;
      }
      self->send(pong, ping_atom::value, i + 1, std::move(p));
    },
  };
}

/// Sends `n` one-way messages as fast as it can, then waits for the ponger's done.
caf::behavior streamer(caf::event_based_actor* self, caf::actor pong, int64_t n,
                       caf::actor report) {
  for (int64_t i = 0; i < n; ++i) self->send(pong, oneway_atom::value, i, n);
  return {
    [=](done_atom, int64_t count) {
      self->send(report, done_atom::value, count);
      self->quit();
    },
  };
}

/// Configuration shared by every mode: two scheduler threads (one per core).
void common_config(caf::actor_system_config& cfg) {
  cfg.set("scheduler.max-threads", 2);
  cfg.set("logger.verbosity", caf::atom("quiet"));
  cfg.add_message_type<comm::actors::blob>(comm::actors::blob_type_name);
}

struct results {
  double rtt_us = 0;       ///< 8-byte round trip
  double rtt_large_us = 0; ///< 1 MiB round trip
  double rtt_blob_us = 0;  ///< 1 MiB round trip as a blob
  double oneway_per_s = 0; ///< 8-byte one-way messages per second
};

/// Runs the client side against `pong` in `sys`.
bool measure(caf::actor_system& sys, const caf::actor& pong, int64_t trips, int64_t oneway,
             bool large_only, bool small_only, results* out) {
  caf::scoped_actor self{sys};
  auto run = [&](auto&& spawn_it, int64_t expected) {
    const auto start = clock_type::now();
    spawn_it();
    bool ok = false;
    self->receive(
      [&](done_atom, int64_t count) { ok = count == expected; },
      caf::after(std::chrono::seconds(60)) >> [&] { ok = false; });
    return ok ? std::chrono::duration<double>(clock_type::now() - start).count() : -1.0;
  };
  auto ping = [&](size_t size, int64_t n) {
    return run([&] { sys.spawn(pinger<std::vector<char>>, pong, n, std::vector<char>(size, 'x'),
                               self); }, n);
  };
  auto ping_blob = [&](size_t size, int64_t n) {
    comm::actors::blob payload(size);
    std::memset(payload.mutable_data(), 'x', size);
    return run([&] { sys.spawn(pinger<comm::actors::blob>, pong, n, payload, self); }, n);
  };
  if (!large_only) {
    if (ping(8, std::max<int64_t>(trips / 10, 10)) < 0) return false;  // warm up
    const double t = ping(8, trips);
    if (t < 0) return false;
    out->rtt_us = t / trips * 1e6;
    const double s = run([&] { sys.spawn(streamer, pong, oneway, self); }, oneway);
    if (s < 0) return false;
    out->oneway_per_s = oneway / s;
  }
  if (small_only) return true;
  const int64_t large_trips = std::max<int64_t>(trips / 100, 20);
  if (ping(large_size, 5) < 0) return false;
  const double t = ping(large_size, large_trips);
  if (t < 0) return false;
  out->rtt_large_us = t / large_trips * 1e6;
  if (ping_blob(large_size, 5) < 0) return false;
  const double tb = ping_blob(large_size, large_trips);
  if (tb < 0) return false;
  out->rtt_blob_us = tb / large_trips * 1e6;
  return true;
}

/// In one process: both actors in one system.
bool run_inproc(int64_t trips, int64_t oneway, bool large_only, bool small_only, results* out) {
  pin_to(1);
  caf::actor_system_config cfg;
  common_config(cfg);
  caf::actor_system sys{cfg};
  auto pong = sys.spawn(ponger);
  const bool ok = measure(sys, pong, trips, oneway, large_only, small_only, out);
  caf::anon_send_exit(pong, caf::exit_reason::user_shutdown);
  return ok;
}

/// The server process of the two-process modes: publishes a ponger, writes where to `fd`, and
/// runs until killed.
[[noreturn]] void serve(const std::string& mode, int fd) {
  pin_to(0);
  caf::actor_system_config cfg;
  common_config(cfg);
  if (mode == "caf") {
    cfg.load<caf::io::middleman>();
  } else {
    comm::actors::node::load(cfg);
  }
  caf::actor_system sys{cfg};
  auto pong = sys.spawn(ponger);
  std::string where;
  if (mode == "caf") {
    auto port = sys.middleman().publish(pong, 0, "127.0.0.1");
    if (port) where = "127.0.0.1:" + std::to_string(*port);
  } else {
    auto* n = comm::actors::node::get(sys);
    if (n != nullptr && !n->publish(pong, "pong")) where = n->address();
  }
  where += "\n";
  (void)!::write(fd, where.data(), where.size());
  ::close(fd);
  for (;;) ::pause();
}

/// Reads the server's "host:port" line.
std::string read_line(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

/// Two processes: a forked server, this process the client.
bool run_remote(const std::string& mode, int64_t trips, int64_t oneway, bool large_only,
                bool small_only, results* out) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  std::fflush(nullptr);
  const pid_t server = ::fork();
  if (server == 0) {
    ::close(fds[0]);
    serve(mode, fds[1]);
  }
  ::close(fds[1]);
  const std::string where = read_line(fds[0]);
  ::close(fds[0]);
  bool ok = false;
  if (!where.empty()) {
    pin_to(1);
    caf::actor_system_config cfg;
    common_config(cfg);
    if (mode == "caf") {
      cfg.load<caf::io::middleman>();
    } else {
      comm::actors::node_params params;
      params.listen_address.clear();
      comm::actors::node::load(cfg, params);
    }
    caf::actor_system sys{cfg};
    const auto colon = where.rfind(':');
    caf::expected<caf::actor> pong =
        mode == "caf" ? sys.middleman().remote_actor(where.substr(0, colon),
                                                     static_cast<uint16_t>(
                                                         std::stoi(where.substr(colon + 1))))
                      : comm::actors::node::get(sys)->lookup(where, "pong");
    if (pong) {
      ok = measure(sys, *pong, trips, oneway, large_only, small_only, out);
    } else {
      std::fprintf(stderr, "%s: cannot reach the server at %s: %s\n", mode.c_str(),
                   where.c_str(), sys.render(pong.error()).c_str());
    }
    ::kill(server, SIGKILL);
    ::waitpid(server, nullptr, 0);
    return ok;
  }
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  return false;
}

/// Microseconds of one memcpy of `size` bytes between two buffers, best of several.
double memcpy_us(size_t size) {
  std::vector<char> a(size, 1), b(size, 2);
  double best = 1e9;
  for (int i = 0; i < 50; ++i) {
    const auto start = clock_type::now();
    std::memcpy(b.data(), a.data(), size);
    asm volatile("" : : "r"(b.data()) : "memory");
    best = std::min(best, std::chrono::duration<double, std::micro>(clock_type::now() - start)
                              .count());
    a[i % size] = static_cast<char>(i);
  }
  return best;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  int64_t trips = 20000;
  int64_t oneway = 200000;
  bool large_only = false;
  bool small_only = false;
  std::vector<std::string> modes = {"inproc", "caf", "comm"};
  for (int opt; (opt = ::getopt(argc, argv, "r:n:w:m:lsh")) != -1;) {
    switch (opt) {
      case 'r': rounds = std::atoi(optarg); break;
      case 'n': trips = std::atoll(optarg); break;
      case 'w': oneway = std::atoll(optarg); break;
      case 'l': large_only = true; break;
      case 's': small_only = true; break;
      case 'm': {
        modes.clear();
        std::stringstream list(optarg);
        for (std::string m; std::getline(list, m, ',');) modes.push_back(m);
        break;
      }
      default:
        std::fprintf(stderr, "usage: %s [-r rounds] [-n trips] [-w oneway] [-m modes] [-l] [-s]\n",
                     argv[0]);
        return 2;
    }
  }
  std::map<std::string, std::vector<results>> all;
  for (int r = 0; r < rounds; ++r) {
    for (const auto& mode : modes) {
      results res;
      // CAF's middleman needs far fewer iterations to take as long.
      const int64_t n = mode == "caf" ? std::max<int64_t>(trips / 20, 50) : trips;
      const int64_t w = mode == "caf" ? std::max<int64_t>(oneway / 10, 1000) : oneway;
      const bool ok = mode == "inproc" ? run_inproc(n, w, large_only, small_only, &res)
                                       : run_remote(mode, n, w, large_only, small_only, &res);
      if (!ok) {
        std::fprintf(stderr, "round %d: %s failed\n", r, mode.c_str());
        continue;
      }
      std::printf("round %d %-6s rtt 8 B %8.2f us   rtt 1 MiB %8.1f us   blob %8.1f us   "
                  "one-way 8 B %10.0f msg/s\n",
                  r, mode.c_str(), res.rtt_us, res.rtt_large_us, res.rtt_blob_us,
                  res.oneway_per_s);
      std::fflush(stdout);
      all[mode].push_back(res);
    }
  }
  std::printf("\nmedians over %d rounds\n%-8s %12s %14s %14s %16s\n", rounds, "mode",
              "rtt 8 B us", "rtt 1 MiB us", "blob 1 MiB us", "one-way msg/s");
  std::map<std::string, results> med;
  for (const auto& [mode, list] : all) {
    std::vector<double> a, b, d, c;
    for (const auto& x : list) {
      a.push_back(x.rtt_us);
      b.push_back(x.rtt_large_us);
      d.push_back(x.rtt_blob_us);
      c.push_back(x.oneway_per_s);
    }
    med[mode] = {median(a), median(b), median(d), median(c)};
    std::printf("%-8s %12.2f %14.1f %14.1f %16.0f\n", mode.c_str(), med[mode].rtt_us,
                med[mode].rtt_large_us, med[mode].rtt_blob_us, med[mode].oneway_per_s);
  }
  const double copy = memcpy_us(large_size);
  std::printf("memcpy 1 MiB: %.1f us (each way: %.1f us per round trip)\n", copy, 2 * copy);
  if (med.count("comm")) {
    const results& c = med["comm"];
    if (med.count("inproc") && c.rtt_us > 0) {
      std::printf("comm rtt 8 B / in-process CAF rtt: %.2f (goal: at most 3)\n",
                  c.rtt_us / med["inproc"].rtt_us);
    }
    if (med.count("caf") && c.rtt_us > 0) {
      std::printf("CAF middleman rtt 8 B / comm rtt: %.1f (goal: at least 50)\n",
                  med["caf"].rtt_us / c.rtt_us);
    }
    std::printf("comm one-way 8 B: %.2f M msg/s (goal: at least 2)\n", c.oneway_per_s / 1e6);
    std::printf("comm rtt 1 MiB / (2 x memcpy 1 MiB): %.2f as std::vector<char>, %.2f as blob "
                "(goal: at most 2)\n",
                c.rtt_large_us / (2 * copy), c.rtt_blob_us / (2 * copy));
  }
  return 0;
}
