// The command-line tools as a user meets them: comm_info and comm_perftest run as processes (each
// launch bounded in time), their help, their refusals of bad options, and a client that finds no
// server.
#define BOOST_TEST_MODULE tools
#include <boost/test/unit_test.hpp>

#include "launch.hpp"

#include <string>
#include <vector>

using namespace comm::test;

namespace {

const std::string comm_info = COMM_TESTS_BINARY_DIR "/../libcomm/comm_info";

/// Options with a time limit far above what any of these runs needs.
launch_options limited() {
  launch_options opt;
  opt.timeout_ms = 60000;
  opt.env = {"COMM_LOG_LEVEL=warn"};
  return opt;
}

}  // namespace

BOOST_AUTO_TEST_CASE(comm_info_help_prints_the_usage_and_succeeds) {
  for (const char* flag : {"--help", "-h"}) {
    const launch_result r = run_command({comm_info, flag}, limited());
    BOOST_TEST_CONTEXT(flag << ":\n" << r.output) {
      BOOST_TEST(r.exit_code == 0);
      BOOST_TEST(r.count("Usage: comm_info") == 1u);
      BOOST_TEST(r.count("--tls") == 1u);
      BOOST_TEST(r.count("# transport") == 0u);  // help only, no report
    }
  }
}

/// Runs `comm_info -l` and a `comm_info -c` to it with the client's transports `client_tls` (the
/// server has shm, tcp and self); the output of both ends with "client <rc> server <rc>".
launch_result run_comm_info_pair(const std::string& client_tls) {
  const std::string script =
      "COMM_TLS=shm,tcp,self \"$0\" -l 127.0.0.1:0 >\"$1\" 2>&1 & server=$!\n"
      "for i in $(seq 200); do grep -q 'listening on port' \"$1\" && break; sleep 0.05; done\n"
      "port=$(sed -n 's/^# listening on port //p' \"$1\")\n"
      "COMM_TLS=$2 \"$0\" -c 127.0.0.1:$port; client=$?\n"
      "wait $server; server_rc=$?; cat \"$1\"; rm -f \"$1\"\n"
      "echo \"client $client server $server_rc\"\n";
  char scratch[] = "/tmp/comm-info-server.XXXXXX";
  const int fd = ::mkstemp(scratch);
  BOOST_REQUIRE(fd >= 0);
  ::close(fd);
  const launch_result r =
      run_command({"bash", "-c", script, comm_info, scratch, client_tls}, limited());
  ::unlink(scratch);
  return r;
}

BOOST_AUTO_TEST_CASE(comm_info_shows_the_lane_chosen_to_a_peer_and_why) {
  // Both sides on this host with shm: shm wins over tcp on cost, and both sides say so.
  launch_result r = run_comm_info_pair("shm,tcp,self");
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("client 0 server 0") == 1u);
    BOOST_TEST(r.count("# client: lane to the peer") == 1u);
    BOOST_TEST(r.count("# server: lane to the peer") == 1u);
    BOOST_TEST(r.count("; lane shm/") == 2u);
    BOOST_TEST(r.count("): lower cost, of ") == 2u);
  }
  // A client without shm: only tcp reaches the server, on both sides.
  r = run_comm_info_pair("tcp,self");
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("client 0 server 0") == 1u);
    BOOST_TEST(r.count("; lane tcp/") == 2u);
    BOOST_TEST(r.count("; lane shm/") == 0u);
  }
}

BOOST_AUTO_TEST_CASE(comm_info_refuses_unknown_transports_and_options) {
  launch_result r = run_command({comm_info, "-t", "bogus"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.count("comm_info: unknown transport 'bogus' (known: ") == 1u);
    BOOST_TEST(r.count("# transport") == 0u);
  }
  r = run_command({comm_info, "--tls=shm,tpc"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.count("unknown transport 'tpc'") == 1u);
  }
  r = run_command({comm_info, "-t", ","}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.count("-t names no transport") == 1u);
  }
  for (const char* bad : {"--bogus", "-x"}) {
    r = run_command({comm_info, bad}, limited());
    BOOST_TEST_CONTEXT(bad << ":\n" << r.output) {
      BOOST_TEST(r.exit_code == 2);
      BOOST_TEST(r.count("Usage: comm_info") == 1u);
    }
  }
  r = run_command({comm_info, "stray"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.count("unexpected argument 'stray'") == 1u);
  }
}

BOOST_AUTO_TEST_CASE(comm_info_reports_the_transports_it_is_given) {
  const launch_result r = run_command({comm_info, "--tls", "self"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("# transport self") == 1u);
    BOOST_TEST(r.count("# transport shm") == 0u);
  }
}

#ifdef COMM_PERFTEST_PROGRAM

namespace {

const std::string perftest = COMM_PERFTEST_PROGRAM;

}  // namespace

BOOST_AUTO_TEST_CASE(comm_perftest_help_prints_the_usage_and_succeeds) {
  for (const char* flag : {"--help", "-h"}) {
    const launch_result r = run_command({perftest, flag}, limited());
    BOOST_TEST_CONTEXT(flag << ":\n" << r.output) {
      BOOST_TEST(r.exit_code == 0);
      BOOST_TEST(r.count("Usage: comm_perftest") == 1u);
      BOOST_TEST(r.count("Waiting for connection") == 0u);  // it did not start a server
    }
  }
  const launch_result r = run_command({perftest, "--bogus"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.count("Usage: comm_perftest") == 1u);
  }
}

BOOST_AUTO_TEST_CASE(comm_perftest_against_a_closed_port_fails_at_once) {
  const std::string port = std::to_string(detail::free_port());
  const launch_result r =
      run_command({perftest, "127.0.0.1", "-p", port, "-t", "tag_lat", "-n", "10"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 1);
    BOOST_TEST(r.count("cannot connect to 127.0.0.1:" + port + ": Connection refused") == 1u);
    // Before, it retried for 10 s; a refusal is final. The bound is loose for a loaded machine.
    BOOST_TEST(r.seconds < 5.0);
  }
}

/// Runs a comm_perftest server and a client of `test` (8 B, 2000 iterations) over shm; the output
/// of both ends with "client <rc> server <rc>".
launch_result run_perftest_pair(const std::string& test) {
  const std::string port = std::to_string(detail::free_port());
  // The server first; the client once the server says it listens (bounded), as a user would.
  const std::string script =
      "\"$0\" -p " + port + " >\"$1\" 2>&1 & server=$!\n"
      "for i in $(seq 200); do grep -q 'Waiting for connection' \"$1\" && break; sleep 0.05; done\n"
      "\"$0\" 127.0.0.1 -p " + port + " -t " + test + " -s 8 -n 2000 -w 100 -f; client=$?\n"
      "wait $server; server_rc=$?; cat \"$1\"; rm -f \"$1\"\n"
      "echo \"client $client server $server_rc\"\n";
  char scratch[] = "/tmp/comm-perftest-server.XXXXXX";
  const int fd = ::mkstemp(scratch);
  BOOST_REQUIRE(fd >= 0);
  ::close(fd);
  launch_options opt = limited();
  opt.env.push_back("COMM_TLS=shm,self");
  const launch_result r = run_command({"bash", "-c", script, perftest, scratch}, opt);
  ::unlink(scratch);
  return r;
}

BOOST_AUTO_TEST_CASE(comm_perftest_client_and_server_run_a_short_test) {
  const launch_result r = run_perftest_pair("tag_lat");
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("client 0 server 0") == 1u);
    BOOST_TEST(r.count("Accepted connection from 127.0.0.1") == 1u);
  }
}

BOOST_AUTO_TEST_CASE(comm_perftest_runs_the_stream_tests) {
  for (const char* test : {"stream_lat", "stream_bw"}) {
    const launch_result r = run_perftest_pair(test);
    BOOST_TEST_CONTEXT(test << ": " << r.output) {
      BOOST_TEST(r.exit_code == 0);
      BOOST_TEST(r.count("client 0 server 0") == 1u);
      BOOST_TEST(r.count("                        2000 ") == 1u);  // the final row (-f)
    }
  }
}

#endif  // COMM_PERFTEST_PROGRAM
