// Remote actors between two actor systems of one process: each has its own node, and they talk
// through libcomm's client-server connections exactly as two processes would (the lane between
// two workers of one process is the self transport). The process suites repeat the scenarios
// over shared memory.
#define BOOST_TEST_MODULE actors
#include <boost/test/unit_test.hpp>

#include "test_actors_scenarios.hpp"

#include <memory>

using namespace comm::test::actors;

namespace {

/// A service node and a client node in this process, delivering with `mode`.
struct two_nodes {
  caf::actor_system_config service_cfg;
  caf::actor_system_config client_cfg;
  std::unique_ptr<caf::actor_system> service_sys;
  std::unique_ptr<caf::actor_system> client_sys;
  caf::actor svc;

  explicit two_nodes(comm::actors::delivery mode = comm::actors::delivery::progress_thread) {
    const node_tweak tweak = [mode](comm::actors::node_params& p) { p.mode = mode; };
    configure(service_cfg, "127.0.0.1:0", false, tweak);
    configure(client_cfg, "127.0.0.1:0", true, tweak);
    service_sys = std::make_unique<caf::actor_system>(service_cfg);
    client_sys = std::make_unique<caf::actor_system>(client_cfg);
    svc = start_service(*service_sys);
  }

  ~two_nodes() {
    caf::anon_send_exit(svc, caf::exit_reason::user_shutdown);
    svc = nullptr;
    client_sys.reset();
    service_sys.reset();
  }

  /// Where the service node listens.
  std::string address() const { return node_of(*service_sys).address(); }

  /// The service, looked up from the client node.
  caf::actor lookup() {
    auto found = node_of(*client_sys).lookup(address(), service_name);
    BOOST_REQUIRE_MESSAGE(found, "lookup: " << (found ? "" : client_sys->render(found.error())));
    return *found;
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(in_process, two_nodes)

BOOST_AUTO_TEST_CASE(node_has_an_address_and_an_id) {
  BOOST_TEST(!address().empty());
  BOOST_TEST(!node_of(*service_sys).listen_error());
  BOOST_TEST(static_cast<bool>(service_sys->node()));
  BOOST_TEST((service_sys->node() != client_sys->node()));
}

BOOST_AUTO_TEST_CASE(lookup_gives_a_proxy) {
  auto proxy = lookup();
  BOOST_TEST((proxy.node() == service_sys->node()));
  BOOST_TEST(proxy.id() == svc.id());
}

BOOST_AUTO_TEST_CASE(request_response) {
  auto proxy = lookup();
  BOOST_TEST(check_request(*client_sys, proxy) == "");
}

BOOST_AUTO_TEST_CASE(error_response) {
  BOOST_TEST(check_error_response(*client_sys, lookup()) == "");
}

BOOST_AUTO_TEST_CASE(unknown_type_is_answered_with_an_error) {
  BOOST_TEST(check_unknown_type(*client_sys, lookup()) == "");
}

BOOST_AUTO_TEST_CASE(remote_actor_requests_from_its_sender) {
  BOOST_TEST(check_callback(*client_sys, lookup()) == "");
}

BOOST_AUTO_TEST_CASE(large_payload) {
  auto proxy = lookup();
  BOOST_TEST(check_echo(*client_sys, proxy, 100) == "");
  BOOST_TEST(check_echo(*client_sys, proxy, 64 * 1024) == "");
  BOOST_TEST(check_echo(*client_sys, proxy, 4 * 1024 * 1024 + 3) == "");
}

BOOST_AUTO_TEST_CASE(blobs_and_large_runs_travel_as_attachments) {
  BOOST_TEST(check_attachments(*client_sys, lookup()) == "");
}

BOOST_AUTO_TEST_CASE(ordering_per_sender) {
  BOOST_TEST(check_ordering(*client_sys, lookup(), 4, 20000) == "");
}

BOOST_AUTO_TEST_CASE(small_messages_do_not_overtake_large_ones) {
  BOOST_TEST(check_mixed_ordering(*client_sys, lookup(), 2000, 100, 1 << 20) == "");
}

BOOST_AUTO_TEST_CASE(lookup_of_this_node_gives_the_local_actor) {
  auto found = node_of(*service_sys).lookup(address(), service_name);
  BOOST_REQUIRE(found);
  BOOST_TEST((*found == svc));
}

BOOST_AUTO_TEST_CASE(remote_actor_exit) {
  BOOST_TEST(check_remote_exit(*client_sys, lookup()) == "");
}

BOOST_AUTO_TEST_CASE(local_actor_exit_reaches_remote_link) {
  BOOST_TEST(check_local_exit(*client_sys, lookup()) == "");
}

BOOST_AUTO_TEST_CASE(unknown_name) {
  BOOST_TEST(check_unknown_name(*client_sys, address()) == "");
}

BOOST_AUTO_TEST_CASE(unreachable_node) {
  auto found = node_of(*client_sys).lookup("127.0.0.1:1", service_name);
  BOOST_REQUIRE(!found);
  BOOST_TEST((comm::actors::status_of(found.error()) == comm::status::unreachable));
}

BOOST_AUTO_TEST_CASE(listening_on_a_busy_address_fails_cleanly) {
  caf::actor_system_config cfg;
  configure(cfg, address(), false);
  caf::actor_system sys{cfg};
  auto& n = node_of(sys);
  BOOST_TEST((comm::actors::status_of(n.listen_error()) == comm::status::busy));
  BOOST_TEST(n.address().empty());
  // It can still reach others.
  auto found = n.lookup(address(), service_name);
  BOOST_REQUIRE(found);
  BOOST_TEST(check_request(sys, *found) == "");
}

BOOST_AUTO_TEST_CASE(publish_rules) {
  auto& n = node_of(*service_sys);
  BOOST_TEST((comm::actors::status_of(n.publish(caf::actor{}, "x")) == comm::status::invalid_param));
  auto other = service_sys->spawn(victim);
  BOOST_TEST((comm::actors::status_of(n.publish(other, service_name)) ==
             comm::status::already_exists));
  BOOST_TEST(!n.publish(other, "other"));
  BOOST_TEST(!n.unpublish("other"));
  BOOST_TEST((comm::actors::status_of(n.unpublish("other")) == comm::status::no_elem));
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(disconnect_kills_proxies_and_fails_requests) {
  auto proxy = lookup();
  caf::scoped_actor self{*client_sys};
  self->monitor(proxy);
  auto& client = node_of(*client_sys);
  BOOST_TEST(client.stats().peers == 1u);
  // A request the service holds, then the connection goes.
  auto pending = self->request(proxy, std::chrono::seconds(10), hold_atom::value);
  BOOST_TEST(check_request(*client_sys, proxy) == "");  // the hold arrived before this answer
  BOOST_REQUIRE(!client.disconnect(address()));
  bool failed = false;
  std::move(pending).receive([](int32_t) {},
                             [&](caf::error& e) { failed = e == caf::sec::request_receiver_down; });
  BOOST_TEST(failed);
  bool down = false;
  self->receive([&](caf::down_msg& dm) {
                  down = dm.reason == caf::exit_reason::remote_link_unreachable;
                },
                caf::after(std::chrono::seconds(5)) >> [] {});
  BOOST_TEST(down);
  BOOST_TEST(client.stats().peers == 0u);
  BOOST_TEST((comm::actors::status_of(client.disconnect(address())) == comm::status::no_elem));
}

BOOST_AUTO_TEST_CASE(no_growth_over_connect_disconnect_cycles) {
  auto& client = node_of(*client_sys);
  auto& server = node_of(*service_sys);
  for (int cycle = 0; cycle < 20; ++cycle) {
    {
      auto proxy = lookup();
      BOOST_REQUIRE(check_request(*client_sys, proxy) == "");
      BOOST_REQUIRE(!client.disconnect(address()));
    }
    // The service node notices the close asynchronously.
    for (int i = 0; i < 500 && server.stats().peers != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    BOOST_REQUIRE_EQUAL(client.stats().peers, 0u);
    BOOST_REQUIRE_EQUAL(client.stats().proxies, 0u);
    BOOST_REQUIRE_EQUAL(client.stats().pending_requests, 0u);
    BOOST_REQUIRE_EQUAL(server.stats().peers, 0u);
    BOOST_REQUIRE_EQUAL(server.stats().remote_monitors, 0u);
  }
  BOOST_TEST(server.stats().proxies == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

/// Two nodes that hand arriving messages to CAF's scheduler.
struct two_scheduled_nodes : two_nodes {
  two_scheduled_nodes() : two_nodes(comm::actors::delivery::scheduler) {}
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(scheduler_delivery, two_scheduled_nodes)

BOOST_AUTO_TEST_CASE(request_response_and_errors) {
  auto proxy = lookup();
  BOOST_TEST(check_request(*client_sys, proxy) == "");
  BOOST_TEST(check_error_response(*client_sys, proxy) == "");
  BOOST_TEST(check_unknown_type(*client_sys, proxy) == "");
  BOOST_TEST(check_callback(*client_sys, proxy) == "");
}

BOOST_AUTO_TEST_CASE(ordering_and_large_payload) {
  auto proxy = lookup();
  BOOST_TEST(check_ordering(*client_sys, proxy, 2, 20000) == "");
  BOOST_TEST(check_echo(*client_sys, proxy, 2 * 1024 * 1024) == "");
}

BOOST_AUTO_TEST_CASE(exits_both_ways) {
  auto proxy = lookup();
  BOOST_TEST(check_remote_exit(*client_sys, proxy) == "");
  BOOST_TEST(check_local_exit(*client_sys, proxy) == "");
}

BOOST_AUTO_TEST_SUITE_END()
