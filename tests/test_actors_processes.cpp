// Remote actors between processes over shared memory: a service node and a client node, each in
// a forked child (the parent stays single-threaded, so it can fork again at any time, and only
// coordinates). Children report failures on stderr and through their exit code.
#define BOOST_TEST_MODULE actors_processes
#include <boost/test/unit_test.hpp>

#include "test_actors_scenarios.hpp"

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
