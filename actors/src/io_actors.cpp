// The public entry points of libcomm as actors (comm/actors/io_actors.hpp).
#include "io_actors_impl.hpp"

#include <comm/actors/io_actors.hpp>

#include <caf/actor_system_config.hpp>

namespace comm::actors::io {

conn_reply accept_connection(bytes private_data) {
  return conn_reply{accept_atom::value, std::move(private_data)};
}

conn_reply reject_connection() { return conn_reply{make_error(status::rejected)}; }

caf::expected<caf::actor> spawn_worker(caf::actor_system& sys, worker_config cfg) {
  auto eng = detail::engine::start(sys, std::move(cfg));
  if (!eng) return std::move(eng.error());
  return detail::spawn_worker_actor(std::move(*eng));
}

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<bytes>("comm_bytes");
  cfg.add_message_type<conn_request_info>("comm_conn_request_info");
  cfg.add_error_category(error_category, [](uint8_t code, caf::atom_value, const caf::message&) {
    return std::string("comm::") + to_string(static_cast<status>(-int{code}));
  });
}

}  // namespace comm::actors::io
