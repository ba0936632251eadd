// The bootstrap's pmix backend under the launchers clusters use: Open MPI's mpirun and Slurm's
// srun --mpi=pmix (a single-node Slurm this suite starts and stops, tests/slurm_cluster.sh). Jobs
// of 1, 2 and 4 processes exchange binary values and worker addresses and message each other; a
// rank SIGKILLed during a fence fails the others' fence, one that does not come times it out;
// srun without --mpi=pmix fails loudly.
#define BOOST_TEST_MODULE bootstrap_launchers
#include <boost/test/unit_test.hpp>

#include "launch.hpp"

using namespace comm::test;

namespace {

const std::string probe = COMM_TESTS_BINARY_DIR "/comm_bootstrap_probe";

launch_options limited(int timeout_ms = 90000) {
  launch_options opt;
  opt.timeout_ms = timeout_ms;
  return opt;
}

/// The shared Slurm, or a failed requirement saying why it did not start.
slurm_cluster& slurm() {
  slurm_cluster& cluster = shared_slurm();
  BOOST_REQUIRE_MESSAGE(cluster.ok(), cluster.why());
  return cluster;
}

/// Checks a job of `n` processes of the probe's "exchange" (values and worker addresses).
void check_exchange(const launch_result& r, int n) {
  BOOST_TEST_CONTEXT(n << " processes:\n" << r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("of " + std::to_string(n) + " (pmix) exchange ok") ==
               static_cast<size_t>(n));
  }
}

/// Checks a job of 3 whose last rank was SIGKILLed in a fence limited to 30 s: the launcher told
/// the two others long before that.
void check_killed_in_fence(const launch_result& r) {
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(!r.timed_out);
    BOOST_TEST(r.exit_code != 0);
    BOOST_TEST(r.seconds < 20.0);
    BOOST_TEST(r.count("fence CONNECTION_RESET after") == 2u);
    BOOST_TEST(r.count("a rank of the job is gone") >= 2u);
  }
}

/// Checks a job of 3 whose last rank sleeps 4 s before a fence limited to 2 s: the others' fence
/// times out.
void check_late_for_fence(const launch_result& r) {
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(!r.timed_out);
    BOOST_TEST(r.count("fence ENDPOINT_TIMEOUT after") >= 2u);
    BOOST_TEST(r.count("did not enter it within 2 s") >= 2u);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(mpirun_exchange_1_2_4) {
  for (int n : {1, 2, 4}) check_exchange(run_mpirun(n, {probe, "exchange", "30000"}, limited()), n);
}

BOOST_AUTO_TEST_CASE(srun_exchange_1_2_4) {
  slurm_cluster& cluster = slurm();
  for (int n : {1, 2, 4}) {
    check_exchange(cluster.srun(n, {probe, "exchange", "30000"}, limited()), n);
  }
}

BOOST_AUTO_TEST_CASE(srun_without_pmix_fails_loudly) {
  const launch_result r =
      slurm().srun(2, {probe, "join", "5000"}, limited(), {"--mpi=none"});
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code != 0);
    BOOST_TEST(r.count("probe: create failed: UNREACHABLE") == 2u);
    BOOST_TEST(r.count("SLURM_STEP_NUM_TASKS=2") >= 2u);
    BOOST_TEST(r.count("srun --mpi=pmix") >= 2u);
    BOOST_TEST(r.count("joined") == 0u);
  }
}

BOOST_AUTO_TEST_CASE(mpirun_rank_killed_in_a_fence) {
  check_killed_in_fence(run_mpirun(3, {probe, "kill-in-fence", "30000"}, limited()));
}

BOOST_AUTO_TEST_CASE(srun_rank_killed_in_a_fence) {
  check_killed_in_fence(slurm().srun(3, {probe, "kill-in-fence", "30000"}, limited()));
}

BOOST_AUTO_TEST_CASE(mpirun_rank_late_for_a_fence) {
  check_late_for_fence(run_mpirun(3, {probe, "stall-in-fence", "2000"}, limited()));
}

BOOST_AUTO_TEST_CASE(srun_rank_late_for_a_fence) {
  check_late_for_fence(slurm().srun(3, {probe, "stall-in-fence", "2000"}, limited()));
}
