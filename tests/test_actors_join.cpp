// An actor node joining a job (node::join) under each launcher: by hand (the address bootstrap),
// under mpirun and under srun --mpi=pmix (a single-node Slurm this suite starts and stops). Every
// rank's node ends up connected to every other exactly once, and finds every rank's published
// actor by rank (tests/actors_join_probe.cpp).
#define BOOST_TEST_MODULE actors_join
#include <boost/test/unit_test.hpp>

#include "launch.hpp"

using namespace comm::test;

namespace {

const std::string probe = COMM_TESTS_BINARY_DIR "/comm_actors_join_probe";

launch_options limited() {
  launch_options opt;
  opt.timeout_ms = 90000;
  return opt;
}

/// Checks that every one of `n` ranks joined and was answered by every rank.
void check_joined(const launch_result& r, int n) {
  BOOST_TEST_CONTEXT(n << " processes:\n" << r.output) {
    BOOST_TEST(r.exit_code == 0);
    const std::string line = "of " + std::to_string(n) + ": joined, connected to " +
                             std::to_string(n - 1) + " nodes, every rank answered";
    BOOST_TEST(r.count(line) == static_cast<size_t>(n));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(by_hand_1_and_3) {
  for (int n : {1, 3}) check_joined(run_by_hand(n, {probe, "20000"}, limited()), n);
}

BOOST_AUTO_TEST_CASE(mpirun_3) { check_joined(run_mpirun(3, {probe, "20000"}, limited()), 3); }

BOOST_AUTO_TEST_CASE(srun_3) {
  slurm_cluster& slurm = shared_slurm();
  BOOST_REQUIRE_MESSAGE(slurm.ok(), slurm.why());
  check_joined(slurm.srun(3, {probe, "20000"}, limited()), 3);
}
