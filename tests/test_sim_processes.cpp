// comm_phold as a job of several processes, started the ways a user starts one: by hand (the
// address bootstrap), under mpirun and under srun (PMIx), and on two network-namespace hosts over
// tcp. The digest must be the one this test computes in one process, whatever the number of
// processes (1, 2, 4: four are more than the cores) and partitions. A process killed with SIGKILL
// mid-run makes the others stop with an error within a second.
#define BOOST_TEST_MODULE sim_processes
#include <boost/test/unit_test.hpp>

#include "comm_phold_model.hpp"
#include "launch.hpp"
#include "netns.hpp"
#include "test_util.hpp"

#include <comm/sim/cluster.hpp>
#include <comm/sim/engine.hpp>

#include <signal.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

using namespace comm;
using namespace comm::sim;
using namespace comm::test;

namespace {

const std::string program = COMM_PHOLD_PROGRAM;

/// A PHOLD model: parameters, LPs in all, end time and seed.
struct model_case {
  phold::parameters p;
  uint64_t lps;
  double end;
  uint64_t seed;
};

model_case ross_defaults(uint64_t seed) { return {phold::parameters{}, 48, 1500, seed}; }

model_case spread_delays() {
  phold::parameters p;
  p.lookahead = 0.5;
  p.mean = 2.0;
  p.remote = 0.5;
  p.start_events = 2;
  return {p, 48, 400, 7};
}

/// comm_phold's command line for `m` on `processes` processes.
std::vector<std::string> phold_command(const model_case& m, int processes, unsigned partitions) {
  const auto text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  return {program,
          "--nlp", std::to_string(m.lps / processes),
          "--start-events", std::to_string(m.p.start_events),
          "--remote", text(m.p.remote),
          "--lookahead", text(m.p.lookahead),
          "--mean", text(m.p.mean),
          "--end", text(m.end),
          "--seed", std::to_string(m.seed),
          "--partitions", std::to_string(partitions),
          "--json", "--quiet", "--no-progress"};
}

/// The digest of `m` run in this process, as comm_phold prints it.
std::string local_digest(const model_case& m) {
  auto c = cluster::local();
  const run_config cfg = phold::configuration(m.lps, 1, m.p, m.end, m.seed);
  phold::model model{m.p};
  engine<phold::model> e(*c, cfg, model);
  run_result r;
  std::string why;
  BOOST_REQUIRE_MESSAGE(e.run(&r, &why) == status::ok, why);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, r.digest);
  return hex;
}

/// A string field of comm_phold's JSON line in `output` ("" when missing).
std::string json_field(const std::string& output, const std::string& name) {
  const std::string key = "\"" + name + "\":";
  const size_t at = output.rfind(key);
  if (at == std::string::npos) return "";
  size_t from = at + key.size();
  if (output[from] == '"') ++from;
  const size_t to = output.find_first_of(",\"}", from);
  return output.substr(from, to - from);
}

launch_options limited(int ms = 60000) {
  launch_options opt;
  opt.timeout_ms = ms;
  opt.env = {"COMM_LOG_LEVEL=error"};
  return opt;
}

/// limited(), and for AddressSanitizer builds a suppression of what libpmix itself leaks
/// (PMIx_Init keeps two strdup'ed strings; the same two as tests/pmix_leaks.hpp), so that leaks
/// of ours still fail the run.
launch_options under_launcher() {
  static const std::string file = [] {
    const std::string path = "/tmp/comm-sim-lsan-" + std::to_string(::getpid()) + ".supp";
    std::ofstream(path) << "leak:pmix_rte_init\nleak:pmix_bfrops_base_value_load\n";
    std::atexit([] { ::unlink(("/tmp/comm-sim-lsan-" + std::to_string(::getpid()) + ".supp").c_str()); });
    return path;
  }();
  launch_options opt = limited();
  opt.env.push_back("LSAN_OPTIONS=suppressions=" + file);
  return opt;
}

/// Checks one launch: success, the expected digest, the process count (and transport).
void expect_run(const launch_result& r, const std::string& digest, int processes,
                const std::string& transport = "") {
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(json_field(r.output, "digest") == digest);
    BOOST_TEST(json_field(r.output, "processes") == std::to_string(processes));
    if (!transport.empty()) BOOST_TEST(json_field(r.output, "transports") == transport);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(by_hand_every_layout_gives_the_one_process_digest) {
  struct layout {
    int processes;
    unsigned partitions;
  };
  for (const model_case& m : {ross_defaults(1), spread_delays()}) {
    const std::string want = local_digest(m);
    expect_run(run_command(phold_command(m, 1, 3), limited()), want, 1, "local");
    for (const layout& l : {layout{2, 1}, layout{2, 3}, layout{4, 1}, layout{4, 2}}) {
      BOOST_TEST_CONTEXT(l.processes << " processes x " << l.partitions << " partitions") {
        expect_run(run_by_hand(l.processes, phold_command(m, l.processes, l.partitions), limited()),
                   want, l.processes, "shm");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(every_lp_ends_the_same_on_one_and_on_four_processes) {
  const model_case m = spread_delays();
  const std::string prefix = "/tmp/comm-sim-lps-" + std::to_string(::getpid());
  const auto lines = [&](const std::string& tag, int processes) {
    std::string all;
    for (int r = 0; r < processes; ++r) {
      const std::string path = prefix + tag + "." + std::to_string(r);
      std::ifstream in(path);
      all += std::string(std::istreambuf_iterator<char>(in), {});
      ::unlink(path.c_str());
    }
    return all;
  };
  std::vector<std::string> one = phold_command(m, 1, 1), four = phold_command(m, 4, 2);
  one.insert(one.end(), {"--lp-digests", prefix + "a"});
  four.insert(four.end(), {"--lp-digests", prefix + "b"});
  BOOST_REQUIRE_EQUAL(run_command(one, limited()).exit_code, 0);
  BOOST_REQUIRE_EQUAL(run_by_hand(4, four, limited()).exit_code, 0);
  const std::string alone = lines("a", 1), spread = lines("b", 4);
  BOOST_TEST(std::count(alone.begin(), alone.end(), '\n') == static_cast<long>(m.lps));
  BOOST_TEST(alone == spread);
}

BOOST_AUTO_TEST_CASE(another_seed_gives_another_digest) {
  const std::string one = local_digest(ross_defaults(1));
  const launch_result r = run_by_hand(2, phold_command(ross_defaults(2), 2, 1), limited());
  expect_run(r, local_digest(ross_defaults(2)), 2);
  BOOST_TEST(json_field(r.output, "digest") != one);
}

BOOST_AUTO_TEST_CASE(under_mpirun) {
  const model_case m = ross_defaults(3);
  const std::string want = local_digest(m);
  for (int n : {2, 4}) {
    BOOST_TEST_CONTEXT(n << " ranks") {
      expect_run(run_mpirun(n, phold_command(m, n, 2), under_launcher()), want, n);
    }
  }
}

BOOST_AUTO_TEST_CASE(under_slurm) {
  slurm_cluster& slurm = shared_slurm();
  BOOST_REQUIRE_MESSAGE(slurm.ok(), slurm.why());
  const model_case m = spread_delays();
  const std::string want = local_digest(m);
  for (int n : {2, 4}) {
    BOOST_TEST_CONTEXT(n << " tasks") {
      expect_run(slurm.srun(n, phold_command(m, n, 1), under_launcher()), want, n);
    }
  }
}

BOOST_AUTO_TEST_CASE(two_network_namespace_hosts_over_tcp) {
  netns_pair hosts;
  BOOST_REQUIRE_MESSAGE(hosts.ok(), "cannot create network namespaces (root and ip(8) are needed)");
  hand_options hand;
  hand.address = hosts.address(0) + ":" + std::to_string(comm::test::detail::free_port());
  hand.setup = [&hosts](size_t index) { return hosts.enter(index == 0 ? 0 : 1); };
  launch_options opt = limited();
  opt.env.push_back("COMM_AUTH_KEY=simulation hosts");
  const model_case m = spread_delays();
  expect_run(run_by_hand(2, phold_command(m, 2, 2), opt, hand), local_digest(m), 2, "tcp");
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused_with_a_reason) {
  struct bad_option {
    std::vector<std::string> args;
    const char* reason;
  };
  // Numbers the option's type cannot hold used to wrap (4294967297 partitions ran as 1), and an
  // --nlp near 2^64 wrapped to a small model once multiplied by the process count.
  const bad_option cases[] = {
      {{"--partitions", "4294967297"}, "--partitions needs a number"},
      {{"--synch", "4294967298"}, "--synch needs a number"},
      {{"--start-events", "99999999999"}, "--start-events needs a number"},
      {{"--nlp", "99999999999999999999"}, "--nlp needs a number"},
      {{"--nlp", "4294967296"}, "--nlp must be between 1 and 2^32 - 1"},
      {{"--nlp", " -1"}, "--nlp needs a number"},
      {{"--nlp", "x"}, "--nlp needs a number"},
      {{"--remote", "2"}, "--remote must be within [0, 1]"},
      {{"--frobnicate", "1"}, "unknown option --frobnicate"},
  };
  for (const bad_option& b : cases) {
    std::vector<std::string> argv = {program, "--end", "10", "--quiet"};
    argv.insert(argv.end(), b.args.begin(), b.args.end());
    const launch_result r = run_command(argv, limited());
    BOOST_TEST_CONTEXT(b.args[0] << " " << b.args[1] << "\n" << r.output) {
      BOOST_TEST(r.exit_code == 2);
      BOOST_TEST(r.count(b.reason) == 1u);
    }
  }
}

// -- failures --------------------------------------------------------------------------------------

namespace {

/// Three processes by hand on a run that would last for hours; process `victim` is killed with
/// SIGKILL once the run is under way. Returns the launch and the seconds from the kill until every
/// other process had exited.
launch_result kill_mid_run(int victim, double* seconds_to_stop) {
  const std::string pid_file = "/tmp/comm-sim-victim-" + std::to_string(::getpid());
  ::unlink(pid_file.c_str());
  hand_options hand;
  hand.setup = [&](size_t index) {
    if (static_cast<int>(index) == victim) std::ofstream(pid_file) << ::getpid() << "\n";
    return true;
  };
  model_case m = ross_defaults(4);
  m.end = 1e12;
  launch_result r;
  auto done = std::chrono::steady_clock::now();
  std::thread launcher([&] {
    r = run_by_hand(3, phold_command(m, 3, 1), limited(30000), hand);
    done = std::chrono::steady_clock::now();
  });
  pid_t pid = 0;
  for (int i = 0; i < 1000 && pid == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream(pid_file) >> pid;
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // joined and running by now
  const auto killed = std::chrono::steady_clock::now();
  if (pid > 0) ::kill(pid, SIGKILL);
  launcher.join();
  ::unlink(pid_file.c_str());
  BOOST_REQUIRE(pid > 0);
  *seconds_to_stop = std::chrono::duration<double>(done - killed).count();
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_killed_process_stops_the_others_within_a_second) {
  for (int victim : {1, 0}) {
    double seconds = 0;
    const launch_result r = kill_mid_run(victim, &seconds);
    BOOST_TEST_MESSAGE("rank " << victim << " killed: the others stopped " << seconds << " s later");
    BOOST_TEST_CONTEXT("rank " << victim << " killed\n" << r.output) {
      BOOST_TEST(!r.timed_out);
      BOOST_TEST(r.exit_code != 0);
      BOOST_TEST(r.count("process " + std::to_string(victim) + " (") >= 1u);
      BOOST_TEST(r.count("is gone: CONNECTION_RESET") >= 1u);
      BOOST_TEST(r.count("comm_phold: rank") == 2u);  // both survivors said why they stopped
      BOOST_TEST(seconds < 1.0);
    }
  }
}
