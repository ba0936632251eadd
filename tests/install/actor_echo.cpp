// Built against an installed libcomm (tests/install/check_install.sh): two actor systems in one
// process, each with a libcomm node; one publishes an echo actor, the other looks it up by the
// first node's address and gets an answer to a request through the proxy.
#include <comm/actors/node.hpp>

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

/// Answers every string with the same string.
caf::behavior echo(caf::event_based_actor*) {
  return {[](const std::string& text) { return text; }};
}

/// `cfg` with a node added, listening on a free loopback port.
caf::actor_system_config& with_node(caf::actor_system_config& cfg) {
  comm::actors::node::load(cfg);
  return cfg;
}

/// An actor system with a node.
struct system_with_node {
  caf::actor_system_config cfg;
  caf::actor_system sys{with_node(cfg)};

  /// The system's node.
  comm::actors::node& node() { return *comm::actors::node::get(sys); }
};

/// Sends "ping" to the actor published as "echo" at `address`; true when "ping" comes back.
bool request_echo(system_with_node& client, const std::string& address) {
  auto proxy = client.node().lookup(address, "echo");
  if (!proxy) {
    std::fprintf(stderr, "actor_echo: lookup failed: %s\n",
                 client.sys.render(proxy.error()).c_str());
    return false;
  }
  caf::scoped_actor self{client.sys};
  bool echoed = false;
  self->request(*proxy, std::chrono::seconds(10), std::string{"ping"})
      .receive([&](const std::string& reply) { echoed = reply == "ping"; },
               [&](caf::error& e) {
                 std::fprintf(stderr, "actor_echo: %s\n", client.sys.render(e).c_str());
               });
  return echoed;
}

}  // namespace

int main() {
  system_with_node server;
  system_with_node client;
  auto echo_actor = server.sys.spawn(echo);
  bool ok = !server.node().publish(echo_actor, "echo") &&
            request_echo(client, server.node().address());
  // The actor systems wait for their actors when destroyed.
  caf::anon_send_exit(echo_actor, caf::exit_reason::user_shutdown);
  if (ok) std::puts("actor_echo: ok");
  return ok ? 0 : 1;
}
