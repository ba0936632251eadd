// comm_bootstrap_probe: one process of a job, started by the launcher tests (test_bootstrap*.cpp)
// under mpirun, srun or by hand. Every line it prints starts with "probe: ".
//
//   comm_bootstrap_probe exchange [timeout_ms]
//       put/commit/fence/get of binary values (sizes and contents per rank, a 1 MiB value from
//       the last rank, two rounds), then an allgather of worker
//       addresses and a tagged message from every rank to every other over libcomm endpoints.
//       Prints "probe: rank R of N (backend) exchange ok", exits 0; else says what failed, 1.
//   comm_bootstrap_probe join [timeout_ms]
//       create() only: "probe: rank R of N (backend) joined", or "probe: create failed: STATUS:
//       why" and exit code 2.
//   comm_bootstrap_probe kill-in-fence [timeout_ms]
//       after a barrier the last rank SIGKILLs itself 300 ms into the next fence; every other
//       prints "probe: rank R fence STATUS after T ms: last_error" (exit 0 for CONNECTION_RESET).
//   comm_bootstrap_probe stall-in-fence [timeout_ms]
//       after a barrier the last rank sleeps twice the limit before the next fence; every rank
//       prints "probe: rank R fence STATUS after T ms: last_error" (exit 0 for ENDPOINT_TIMEOUT).
#include <comm/bootstrap.hpp>
#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pmix_leaks.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

/// Rank `rank`'s value of round `round`: its length and contents depend on both, with zeros in it.
std::vector<uint8_t> value_of(int rank, int round) {
  std::vector<uint8_t> v(static_cast<size_t>(17 + 1000 * rank + round));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7 + rank * 31 + round);
  return v;
}

/// The large value of the last rank.
std::vector<uint8_t> big_value() {
  std::vector<uint8_t> v(size_t{1} << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i ^ (i >> 11));
  return v;
}

/// Prints a failed step and returns 1.
int failed(comm::bootstrap& boot, const char* step, comm::status st) {
  std::printf("probe: rank %d %s failed: %s: %s\n", boot.rank(), step, comm::to_string(st),
              boot.last_error().c_str());
  return 1;
}

/// Puts this rank's values for `round`, commits, fences, and checks every rank's. Each round has
/// its own key: under PMIx a value put again may be read before the next fence.
int exchange_values(comm::bootstrap& boot, int round, int timeout_ms) {
  const int me = boot.rank();
  const int last = boot.size() - 1;
  const std::string key = "probe.value." + std::to_string(round);
  std::vector<uint8_t> mine = value_of(me, round);
  if (auto st = boot.put(key, mine.data(), mine.size()); st != comm::status::ok) {
    return failed(boot, "put", st);
  }
  if (round == 0 && me == last) {
    const auto big = big_value();
    if (auto st = boot.put("probe.big", big.data(), big.size()); st != comm::status::ok) {
      return failed(boot, "put of 1 MiB", st);
    }
  }
  if (auto st = boot.commit(); st != comm::status::ok) return failed(boot, "commit", st);
  if (auto st = boot.fence(timeout_ms); st != comm::status::ok) return failed(boot, "fence", st);
  for (int r = 0; r < boot.size(); ++r) {
    std::vector<uint8_t> got;
    const comm::status st = boot.get(r, key, got);
    if (st != comm::status::ok || got != value_of(r, round)) {
      std::printf("probe: rank %d round %d: rank %d's value is wrong (%s, %zu bytes)\n", me, round,
                  r, comm::to_string(st), got.size());
      return 1;
    }
  }
  std::vector<uint8_t> big;
  if (boot.get(last, "probe.big", big) != comm::status::ok || big != big_value()) {
    std::printf("probe: rank %d: the 1 MiB value of rank %d is wrong\n", me, last);
    return 1;
  }
  return 0;
}

/// Unknown keys and ranks are refused with the documented statuses.
int check_refusals(comm::bootstrap& boot) {
  std::vector<uint8_t> out;
  const comm::status missing = boot.get(0, "probe.nobody-put-this", out);
  const comm::status outside = boot.get(boot.size(), "probe.value.0", out);
  std::vector<uint8_t> too_big((size_t{1} << 20) + 1);
  const comm::status oversized = boot.put("probe.too-big", too_big.data(), too_big.size());
  if (missing != comm::status::no_elem || outside != comm::status::invalid_param ||
      oversized != comm::status::exceeds_limit) {
    std::printf("probe: rank %d: refusals %s %s %s\n", boot.rank(), comm::to_string(missing),
                comm::to_string(outside), comm::to_string(oversized));
    return 1;
  }
  return 0;
}

/// Allgathers worker addresses, connects to every other rank and exchanges a tagged message with
/// each (tag: the sender's rank; contents: sender and receiver).
int exchange_messages(comm::bootstrap& boot, int timeout_ms) {
  comm::context ctx;
  auto w = comm::worker::create(ctx).value();
  std::vector<std::vector<uint8_t>> addresses;
  if (auto st = boot.allgather("probe.worker", w->address(), addresses, timeout_ms);
      st != comm::status::ok) {
    return failed(boot, "allgather", st);
  }
  const int me = boot.rank();
  const int n = boot.size();
  std::vector<std::string> out(static_cast<size_t>(n)), in(static_cast<size_t>(n));
  std::vector<comm::op> sends, receives;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    comm::endpoint* ep = nullptr;
    if (auto st = w->connect(addresses[static_cast<size_t>(r)], &ep); st != comm::status::ok) {
      return failed(boot, "connect", st);
    }
    out[static_cast<size_t>(r)] = "from " + std::to_string(me) + " to " + std::to_string(r);
    in[static_cast<size_t>(r)].resize(64);
    receives.push_back(w->tag_recv(in[static_cast<size_t>(r)].data(), 64,
                                   static_cast<comm::tag_t>(r), comm::tag_mask_full));
    sends.push_back(ep->tag_send(static_cast<comm::tag_t>(me), out[static_cast<size_t>(r)].data(),
                                 out[static_cast<size_t>(r)].size()));
  }
  for (comm::op& o : receives) {
    const comm::status st = w->wait(o, timeout_ms);
    if (st != comm::status::ok) return failed(boot, "receive", st);
  }
  for (comm::op& o : sends) {
    if (auto st = w->wait(o, timeout_ms); st != comm::status::ok) return failed(boot, "send", st);
  }
  for (int r = 0; r < n; ++r) {
    const std::string expected = "from " + std::to_string(r) + " to " + std::to_string(me);
    if (r != me && std::strcmp(in[static_cast<size_t>(r)].c_str(), expected.c_str()) != 0) {
      std::printf("probe: rank %d got \"%s\" from rank %d\n", me,
                  in[static_cast<size_t>(r)].c_str(), r);
      return 1;
    }
  }
  // Nobody destroys its worker before every rank received.
  const comm::status st = boot.barrier(timeout_ms);
  if (st != comm::status::ok) return failed(boot, "barrier", st);
  return 0;
}

int exchange(comm::bootstrap& boot, int timeout_ms) {
  int rc = exchange_values(boot, 0, timeout_ms);
  if (rc == 0) rc = exchange_values(boot, 1, timeout_ms);
  if (rc == 0) rc = check_refusals(boot);
  if (rc == 0) rc = exchange_messages(boot, timeout_ms);
  if (rc == 0) {
    std::printf("probe: rank %d of %d (%s) exchange ok\n", boot.rank(), boot.size(),
                std::string(boot.backend_name()).c_str());
  }
  return rc;
}

/// After a barrier, the last rank misbehaves (`culprit`) while the others time a fence.
int misbehave_in_fence(comm::bootstrap& boot, int timeout_ms, const std::function<void()>& culprit,
                       comm::status expected) {
  const comm::status ready = boot.barrier(timeout_ms);
  if (ready != comm::status::ok) return failed(boot, "barrier", ready);
  if (boot.rank() == boot.size() - 1) culprit();
  const auto start = clock_type::now();
  const comm::status st = boot.fence(timeout_ms);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
  std::printf("probe: rank %d fence %s after %lld ms: %s\n", boot.rank(), comm::to_string(st),
              static_cast<long long>(ms.count()), boot.last_error().c_str());
  return st == expected ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  comm::bootstrap_params params;
  if (argc > 2) params.timeout_ms = std::atoi(argv[2]);
  std::unique_ptr<comm::bootstrap> boot;
  std::string why;
  const comm::status made = comm::bootstrap::create(params, &boot, &why);
  if (made != comm::status::ok) {
    std::printf("probe: create failed: %s: %s\n", comm::to_string(made), why.c_str());
    return 2;
  }
  if (mode == "exchange") return exchange(*boot, params.timeout_ms);
  const int limit = params.timeout_ms;
  if (mode == "kill-in-fence") {
    const auto die = [] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::raise(SIGKILL);
    };
    return misbehave_in_fence(*boot, limit, die, comm::status::connection_reset);
  }
  if (mode == "stall-in-fence") {
    const auto stall = [limit] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * limit));
    };
    return misbehave_in_fence(*boot, limit, stall, comm::status::endpoint_timeout);
  }
  if (mode == "join") {
    std::printf("probe: rank %d of %d (%s) joined\n", boot->rank(), boot->size(),
                std::string(boot->backend_name()).c_str());
    return 0;
  }
  std::printf("probe: unknown mode \"%s\" (exchange, join, kill-in-fence, stall-in-fence)\n",
              mode.c_str());
  return 64;
}
