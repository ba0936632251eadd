// What the actor harnesses decode with: an actor system with the node's message types (and an
// application type holding bytes) and an execution unit with a proxy registry, as the node's
// progress thread has.
#pragma once

#include <comm/actors/blob.hpp>

#include <caf/all.hpp>
#include <caf/proxy_registry.hpp>

#include <vector>

namespace comm::fuzz {

/// A user type with a byte vector inside, as applications send.
struct packet {
  std::vector<char> bytes;
};

/// Serialisation of packet.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, packet& x) {
  return f(caf::meta::type_name("packet"), x.bytes);
}

/// Remote actor handles in a payload resolve to no proxy (no other node is reachable here).
struct no_proxies final : caf::proxy_registry::backend {
  caf::strong_actor_ptr make_proxy(caf::node_id, caf::actor_id) override { return nullptr; }
  void set_last_hop(caf::node_id*) override {}
};

/// The actor system and execution unit of a harness, made once and never destroyed.
struct actor_env {
  actor_env()
      : sys(cfg.add_message_type<comm::actors::blob>(comm::actors::blob_type_name)
                .add_message_type<packet>("packet")),
        proxies(sys, backend),
        ctx(&sys) {
    ctx.proxy_registry_ptr(&proxies);
  }
  caf::actor_system_config cfg;
  caf::actor_system sys;
  no_proxies backend;
  caf::proxy_registry proxies;
  caf::scoped_execution_unit ctx;
};

/// The harness's environment.
inline actor_env& env() {
  static auto* made = new actor_env;
  return *made;
}

}  // namespace comm::fuzz
