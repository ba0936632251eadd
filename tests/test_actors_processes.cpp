// Remote actors between processes over shared memory: a service node and a client node, each in
// a forked child (the parent stays single-threaded, so it can fork again at any time, and only
// coordinates). Children report failures on stderr and through their exit code.
#define BOOST_TEST_MODULE actors_processes
#include <boost/test/unit_test.hpp>

#include "test_actors_scenarios.hpp"

#include <sched.h>
#include <signal.h>

#include <cstring>

using namespace comm::test::actors;
using comm::test::fork_child;
using comm::test::wait_child;

namespace {

int run_client(const service_child& service, const client_body& body) {
  const std::string address = service.address;
  return wait_child(fork_child([&] { return client_process(address, body); }));
}

/// The first core this process may run on.
int first_allowed_core() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) return cpu;
  }
  return 0;
}

/// Pins the calling process (and the threads it makes later) to `core`.
bool pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return ::sched_setaffinity(0, sizeof(set), &set) == 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(send_request_response_error) {
  service_child service;
  BOOST_REQUIRE(!service.address.empty());
  BOOST_TEST(run_client(service, [](caf::actor_system& sys, const std::string& address) {
               return run_checks(sys, address,
                                 {check_request, check_error_response, check_callback,
                                  check_unknown_type, check_unknown_reply,
                                  check_unknown_send});
             }) == 0);
  BOOST_TEST(service.stop() == 0);
}

BOOST_AUTO_TEST_CASE(unknown_name) {
  service_child service;
  BOOST_TEST(run_client(service, [](caf::actor_system& sys, const std::string& address) {
               return check_unknown_name(sys, address);
             }) == 0);
  BOOST_TEST(service.stop() == 0);
}

BOOST_AUTO_TEST_CASE(ordering_under_load) {
  service_child service;
  BOOST_TEST(run_client(service, [](caf::actor_system& sys, const std::string& address) {
               return run_checks(sys, address, {[](caf::actor_system& s, const caf::actor& svc) {
                                   return check_ordering(s, svc, 4, 100000);
                                 }});
             }) == 0);
  BOOST_TEST(service.stop() == 0);
}

// Both nodes on one core, as taskset or a loaded machine puts them: an actor that sends 100,000
// messages in one go outpaces the service, which only runs when the sender lets it. The frames
// the service cannot take yet wait in libcomm's queue; without a bound they all did (180,000 of
// 200,000 in actor_perftest's one-way test, 180 MB, whose freed blocks made one later allocation
// in a send cost 13 ms and stalled the peer). The sender's thread now waits for the backlog
// (node_params::max_backlog) and the service gets the core.
BOOST_AUTO_TEST_CASE(flood_on_one_core_keeps_the_backlog_bounded) {
  const int core = first_allowed_core();
  service_child service("127.0.0.1:0", {}, [core] { return pin_to(core); });
  BOOST_REQUIRE(!service.address.empty());
  const std::string address = service.address;
  const pid_t client = fork_child([&] {
    if (!pin_to(core)) return 3;
    return client_process(address, [](caf::actor_system& sys, const std::string& at) {
      std::string failure =
          run_checks(sys, at, {[](caf::actor_system& s, const caf::actor& svc) {
                       return check_ordering(s, svc, 1, 100000);
                     }});
      if (!failure.empty()) return failure;
      const comm::actors::node_stats stats = node_of(sys).stats();
      std::printf("client: peak backlog %llu frames, %llu waits\n",
                  static_cast<unsigned long long>(stats.peak_frames_queued),
                  static_cast<unsigned long long>(stats.backlog_waits));
      // One sender adds at most one frame beyond the limit before it waits.
      const size_t bound = comm::actors::default_max_backlog() + 1;
      if (stats.peak_frames_queued > bound) {
        return "the backlog reached " + std::to_string(stats.peak_frames_queued) +
               " frames, more than " + std::to_string(bound);
      }
      return std::string();
    });
  });
  BOOST_TEST(wait_child(client) == 0);
  BOOST_TEST(service.stop() == 0);
}

// Several actors flood the service at once. A sender that finds the worker held by another
// thread leaves its frame for the holder, and until the lock changes hands every later frame goes
// the same way; those frames were not counted against max_backlog, so while the holder sent (or
// was preempted holding the lock) the senders piled up frames without bound (95,000 to 180,000
// in actor_perftest's one-way test on a loaded machine). They count now: each sender adds at
// most one frame beyond the limit before it waits, whichever thread sends its frames.
BOOST_AUTO_TEST_CASE(frames_left_for_the_lock_holder_count_against_the_backlog) {
  constexpr size_t backlog = 64;
  constexpr int senders = 4;
  service_child service;
  BOOST_REQUIRE(!service.address.empty());
  const std::string address = service.address;
  const pid_t client = fork_child([&] {
    const auto small_backlog = [](comm::actors::node_params& p) { p.max_backlog = backlog; };
    const auto body = [](caf::actor_system& sys, const std::string& at) {
      std::string failure =
          run_checks(sys, at, {[](caf::actor_system& s, const caf::actor& svc) {
                       return check_ordering(s, svc, senders, 20000);
                     }});
      if (!failure.empty()) return failure;
      const comm::actors::node_stats stats = node_of(sys).stats();
      std::printf("client: peak backlog %llu frames, %llu waits, %llu given up\n",
                  static_cast<unsigned long long>(stats.peak_frames_queued),
                  static_cast<unsigned long long>(stats.backlog_waits),
                  static_cast<unsigned long long>(stats.backlog_stalls));
      if (stats.backlog_waits == 0) return std::string("the senders never waited");
      // A service starved of the cores for 100 ms lets the senders go on (backlog_stalls).
      if (stats.backlog_stalls == 0 && stats.peak_frames_queued > backlog + senders) {
        return "the backlog reached " + std::to_string(stats.peak_frames_queued) +
               " frames, more than " + std::to_string(backlog + senders);
      }
      return std::string();
    };
    return client_process(address, body, "127.0.0.1:0", small_backlog);
  });
  BOOST_TEST(wait_child(client) == 0);
  BOOST_TEST(service.stop() == 0);
}

BOOST_AUTO_TEST_CASE(small_messages_do_not_overtake_large_ones) {
  service_child service;
  BOOST_TEST(run_client(service, [](caf::actor_system& sys, const std::string& address) {
               return run_checks(sys, address, {[](caf::actor_system& s, const caf::actor& svc) {
                                   return check_mixed_ordering(s, svc, 5000, 50, 1 << 20);
                                 }});
             }) == 0);
  BOOST_TEST(service.stop() == 0);
}

BOOST_AUTO_TEST_CASE(large_payloads) {
  service_child service;
  BOOST_TEST(run_client(service, [](caf::actor_system& sys, const std::string& address) {
               return run_checks(sys, address, {[](caf::actor_system& s, const caf::actor& svc) {
                                   std::string failure;
                                   for (size_t size : {size_t{1} << 20, size_t{4} << 20,
                                                       (size_t{16} << 20) + 5}) {
                                     if (failure.empty()) failure = check_echo(s, svc, size);
                                   }
                                   return failure;
                                 }});
             }) == 0);
  BOOST_TEST(service.stop() == 0);
}

BOOST_AUTO_TEST_CASE(blobs_and_large_runs) {
  service_child service;
  BOOST_TEST(run_client(service, [](caf::actor_system& sys, const std::string& address) {
               return run_checks(sys, address, {check_attachments});
             }) == 0);
  BOOST_TEST(service.stop() == 0);
}

BOOST_AUTO_TEST_CASE(remote_actor_exits) {
  service_child service;
  BOOST_TEST(run_client(service, [](caf::actor_system& sys, const std::string& address) {
               return run_checks(sys, address, {check_remote_exit});
             }) == 0);
  BOOST_TEST(service.stop() == 0);
}

BOOST_AUTO_TEST_CASE(node_killed) {
  service_child service;
  channel report;
  const std::string address = service.address;
  const pid_t client = fork_child([&] {
    return client_process(address, [&](caf::actor_system& sys, const std::string& at) {
      return check_node_killed(sys, at, report, 3);
    });
  });
  const auto ms = ms_until_failures_seen(report, [&] { service.kill(); });
  BOOST_REQUIRE(ms.has_value());
  BOOST_TEST_MESSAGE("down message and failed requests " << *ms << " ms after SIGKILL");
  BOOST_TEST(*ms < 1000.0);
  BOOST_TEST(wait_child(client) == 0);
}

BOOST_AUTO_TEST_CASE(reconnect_after_restart) {
  auto first = std::make_unique<service_child>();
  const std::string address = first->address;
  channel to_client, from_client;
  const pid_t client = fork_child([&] {
    return client_process(address, [&](caf::actor_system& sys, const std::string& at) {
      std::string failure = run_checks(sys, at, {check_request});
      from_client.send(bytes_of(failure.empty() ? "up" : failure));
      if (!failure.empty()) return failure;
      // The parent restarts the service node at the same address.
      if (receive_string(to_client) != "restarted") return std::string("no restart");
      failure = run_checks(sys, at, {check_request, check_callback});
      if (failure.empty() && node_of(sys).stats().peers != 1) failure = "stale connections";
      return failure;
    });
  });
  BOOST_REQUIRE(receive_string(from_client) == "up");
  first->kill();
  first.reset();
  service_child second(address);
  BOOST_REQUIRE(second.address == address);
  to_client.send(bytes_of("restarted"));
  BOOST_TEST(wait_child(client) == 0);
  BOOST_TEST(second.stop() == 0);
}
