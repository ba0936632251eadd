// comm_actors_join_probe: one process of a job whose actor node joins it (node::join), started by
// test_actors_join under mpirun, srun or by hand. Every rank publishes "rank-service" (an actor
// that answers n with n * 1000 + its rank), joins, checks that its node is connected to every
// other (and only once), then looks up every rank's service by rank and asks it.
//
//   comm_actors_join_probe [timeout_ms]
//
// Prints "probe: rank R of N: joined, connected to P nodes, every rank answered" and exits 0, or
// says what failed and exits 1 (2 when the bootstrap cannot be created).
#include <comm/actors/node.hpp>
#include <comm/bootstrap.hpp>

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "pmix_leaks.hpp"

namespace {

/// Answers n with n * 1000 + rank.
caf::behavior rank_service(caf::event_based_actor*, int32_t rank) {
  return {
    [rank](int32_t n) { return n * 1000 + rank; },
  };
}

/// Asks rank r's service through a lookup by rank; true when it answered right.
bool ask(caf::actor_system& sys, comm::actors::node& node, int r, std::chrono::milliseconds limit) {
  auto service = node.lookup(r, "rank-service", limit);
  if (!service) {
    std::printf("probe: rank %d: lookup of rank %d failed: %s\n", node.rank(), r,
                sys.render(service.error()).c_str());
    return false;
  }
  bool right = false;
  caf::scoped_actor self{sys};
  self->request(*service, limit, int32_t{r + 1})
      .receive([&](int32_t answer) { right = answer == (r + 1) * 1000 + r; },
               [&](caf::error& err) {
                 std::printf("probe: rank %d: rank %d did not answer: %s\n", node.rank(), r,
                             sys.render(err).c_str());
               });
  return right;
}

/// Publishes `service`, joins, checks the connections and asks every rank; 0 when all of it
/// worked.
int run(caf::actor_system& sys, comm::bootstrap& boot, const caf::actor& service,
        std::chrono::milliseconds limit) {
  auto& node = *comm::actors::node::get(sys);
  const int me = boot.rank();
  const int n = boot.size();
  node.publish(service, "rank-service");
  if (auto err = node.join(boot, limit)) {
    std::printf("probe: rank %d: join failed: %s\n", me, sys.render(err).c_str());
    return 1;
  }
  const size_t peers = node.stats().peers;
  bool ok = node.rank() == me && node.job_size() == n && peers == static_cast<size_t>(n - 1);
  ok = ok && comm::actors::status_of(node.join(boot, limit)) == comm::status::already_exists;
  ok = ok && comm::actors::status_of(node.lookup(n, "rank-service").error()) ==
                 comm::status::invalid_param;
  for (int r = 0; r < n && ok; ++r) ok = ask(sys, node, r, limit);
  // The lookups went over the join's connections: no new one.
  ok = ok && node.stats().peers == peers;
  // Nobody's node goes away while another still asks.
  const comm::status st = boot.barrier(static_cast<int>(limit.count()));
  if (!ok || st != comm::status::ok) {
    std::printf("probe: rank %d of %d: failed (rank %d, size %d, %zu peers, barrier %s)\n", me, n,
                node.rank(), node.job_size(), node.stats().peers, comm::to_string(st));
    return 1;
  }
  std::printf("probe: rank %d of %d: joined, connected to %zu nodes, every rank answered\n", me,
              n, peers);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  comm::bootstrap_params params;
  if (argc > 1) params.timeout_ms = std::atoi(argv[1]);
  std::unique_ptr<comm::bootstrap> boot;
  std::string why;
  if (comm::bootstrap::create(params, &boot, &why) != comm::status::ok) {
    std::printf("probe: create failed: %s\n", why.c_str());
    return 2;
  }
  caf::actor_system_config cfg;
  comm::actors::node::load(cfg);
  int rc = 1;
  {
    caf::actor_system sys{cfg};
    auto service = sys.spawn(rank_service, int32_t{boot->rank()});
    rc = run(sys, *boot, service, std::chrono::milliseconds(params.timeout_ms));
    caf::anon_send_exit(service, caf::exit_reason::user_shutdown);
  }
  return rc;
}
