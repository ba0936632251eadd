// Remote actors between two actor systems of one process: each has its own node, and they talk
// through libcomm's client-server connections exactly as two processes would (the lane between
// two workers of one process is the self transport). The process suites repeat the scenarios
// over shared memory.
#define BOOST_TEST_MODULE actors
#include <boost/test/unit_test.hpp>

#include "test_actors_scenarios.hpp"

#include <memory>
#include <thread>

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

/// A typed interface: adds two ints.
using adder = caf::typed_actor<caf::replies_to<add_atom, int32_t, int32_t>::with<int32_t>>;

/// A wider one: adds, and fails on request.
using calculator = caf::typed_actor<caf::replies_to<add_atom, int32_t, int32_t>::with<int32_t>,
                                    caf::replies_to<fail_atom>::with<int32_t>>;

/// An interface the calculator does not have.
using echoer = caf::typed_actor<caf::replies_to<echo_atom, std::vector<char>>::with<
    std::vector<char>>>;

calculator::behavior_type typed_calculator() {
  return {
      [](add_atom, int32_t a, int32_t b) { return a + b; },
      [](fail_atom) -> caf::result<int32_t> { return caf::sec::invalid_argument; },
  };
}

/// The rendering of a failed lookup's error, or "found".
template <class T>
std::string failure_of(caf::actor_system& sys, const caf::expected<T>& found) {
  return found ? "found" : sys.render(found.error());
}

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

BOOST_AUTO_TEST_CASE(answer_of_an_unknown_type_fails_the_request_at_once) {
  BOOST_TEST(check_unknown_reply(*client_sys, lookup()) == "");
  BOOST_TEST(node_of(*client_sys).stats().unreadable_messages == 1u);
}

BOOST_AUTO_TEST_CASE(send_of_an_unknown_type_is_counted) {
  BOOST_TEST(check_unknown_send(*client_sys, lookup()) == "");
}

BOOST_AUTO_TEST_CASE(status_of_tells_comm_errors_from_others) {
  using comm::actors::status_of;
  BOOST_TEST((status_of(caf::error{}) == comm::status::ok));
  BOOST_TEST((status_of(comm::actors::make_error(comm::status::rejected)) ==
              comm::status::rejected));
  const comm::status foreign = status_of(caf::make_error(caf::sec::request_timeout));
  BOOST_TEST((foreign == comm::actors::foreign_error));
  BOOST_TEST(comm::is_error(foreign));
  BOOST_TEST((foreign != comm::status::ok));
}

BOOST_AUTO_TEST_CASE(load_turns_off_cafs_moderate_polling_unless_configured) {
  const char* key = "work-stealing.moderate-poll-attempts";
  caf::actor_system_config plain;
  comm::actors::node::load(plain);
  BOOST_TEST(caf::get_or(plain, key, size_t{500}) == 0u);
  caf::actor_system_config chosen;
  chosen.set(key, size_t{20});
  comm::actors::node::load(chosen);
  BOOST_TEST(caf::get_or(chosen, key, size_t{500}) == 20u);
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

BOOST_AUTO_TEST_CASE(one_connection_per_node_whatever_the_address) {
  const std::string port = address().substr(address().rfind(':'));
  auto& client = node_of(*client_sys);
  auto& server = node_of(*service_sys);
  auto by_number = client.lookup("127.0.0.1" + port, service_name);
  auto by_name = client.lookup("localhost" + port, service_name);
  BOOST_REQUIRE(by_number);
  BOOST_REQUIRE(by_name);
  BOOST_TEST((*by_number == *by_name));
  BOOST_TEST(client.stats().peers == 1u);
  BOOST_TEST(client.stats().proxies == 1u);
  // The service node sees the second connection close (asynchronously; at most 5 s).
  for (int i = 0; i < 2500 && server.stats().peers != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  BOOST_TEST(server.stats().peers == 1u);
  BOOST_TEST(check_request(*client_sys, *by_name) == "");
  // Either name reaches the one connection.
  BOOST_REQUIRE(!client.disconnect("localhost" + port));
  BOOST_TEST(client.stats().peers == 0u);
  BOOST_TEST((comm::actors::status_of(client.disconnect("127.0.0.1" + port)) ==
              comm::status::no_elem));
}

BOOST_AUTO_TEST_CASE(typed_actors_are_looked_up_by_interface) {
  auto& server = node_of(*service_sys);
  auto& client = node_of(*client_sys);
  auto calc = service_sys->spawn(typed_calculator);
  BOOST_REQUIRE(!server.publish(calc, "calc"));
  // The same interface, and a narrower one (as CAF's remote_actor allows).
  auto as_calculator = client.lookup<calculator>(address(), "calc");
  BOOST_REQUIRE_MESSAGE(as_calculator, failure_of(*client_sys, as_calculator));
  auto as_adder = client.lookup<adder>(address(), "calc");
  BOOST_REQUIRE_MESSAGE(as_adder, failure_of(*client_sys, as_adder));
  caf::scoped_actor self{*client_sys};
  int32_t sum = 0;
  self->request(*as_adder, std::chrono::seconds(5), add_atom::value, int32_t{2}, int32_t{3})
      .receive([&](int32_t r) { sum = r; }, [](caf::error&) {});
  BOOST_TEST(sum == 5);
  // Any actor may still be looked up as a caf::actor.
  BOOST_TEST(static_cast<bool>(client.lookup(address(), "calc")));
  // A handle whose interface the actor lacks is refused, naming both.
  auto as_echoer = client.lookup<echoer>(address(), "calc");
  BOOST_REQUIRE(!as_echoer);
  BOOST_TEST((as_echoer.error() == caf::sec::unexpected_actor_messaging_interface));
  BOOST_TEST(failure_of(*client_sys, as_echoer).find("published as") != std::string::npos);
  BOOST_TEST(failure_of(*client_sys, as_echoer).find("echo") != std::string::npos);
  // So is a typed handle to an actor published without an interface.
  auto untyped = client.lookup<adder>(address(), service_name);
  BOOST_REQUIRE(!untyped);
  BOOST_TEST((untyped.error() == caf::sec::unexpected_actor_messaging_interface));
  BOOST_TEST(failure_of(*client_sys, untyped).find("not published as a typed actor") !=
             std::string::npos);
  // The node's own names are checked alike.
  BOOST_TEST(static_cast<bool>(server.lookup<adder>(address(), "calc")));
  BOOST_TEST(!server.lookup<echoer>(address(), "calc"));
  caf::anon_send_exit(calc, caf::exit_reason::user_shutdown);
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
  BOOST_TEST(check_unknown_reply(*client_sys, proxy) == "");
  BOOST_TEST(check_unknown_send(*client_sys, proxy) == "");
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
