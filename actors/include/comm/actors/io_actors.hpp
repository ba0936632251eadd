// libcomm as actors: a worker, its listeners and its endpoints, each reachable as a CAF actor whose
// messages map onto libcomm's active messages, tagged messages and client-server connections.
//
//   caf::actor_system sys{cfg};
//   auto worker = *comm::actors::io::spawn_worker(sys);
//   caf::scoped_actor self{sys};
//   // server: a listener forwards each connection request to `owner`, which accepts or rejects
//   self->request(worker, timeout, listen_atom::value, "127.0.0.1:0", owner).receive(
//       [&](caf::actor listener) { ... }, [&](caf::error& err) { ... });
//   // client: an endpoint actor once the server accepted
//   self->request(worker, timeout, connect_atom::value, "127.0.0.1:7000", bytes{}).receive(
//       [&](caf::actor ep, bytes& server_data) { ... }, [&](caf::error& err) { ... });
//   self->request(ep, timeout, am_send_atom::value, uint16_t{7}, header, payload).receive(...);
//
// The actors and their messages (the full protocol is in actors/README.md, "libcomm as actors"):
//
// worker actor (spawn_worker): owns a libcomm context and worker, and a thread that progresses it.
//   (listen_atom, std::string address, caf::actor owner)        -> caf::actor listener
//   (connect_atom, std::string address, bytes private_data)     -> (caf::actor endpoint, bytes)
//   (register_am_atom, uint16_t id, caf::actor handler)         -> ok_atom
//   (unregister_am_atom, uint16_t id)                           -> ok_atom
//   (tag_recv_atom, uint64_t tag, uint64_t mask [, caf::timespan limit])
//                                                               -> (tag_atom, uint64_t, bytes)
//   (register_tag_atom, uint64_t tag, uint64_t mask, caf::actor handler)   -> ok_atom
//   (unregister_tag_atom, uint64_t tag, uint64_t mask, caf::actor handler) -> ok_atom
//   (info_atom)                                                 -> std::string
//   (close_atom)                                                -> ok_atom, then it exits
// endpoint actor (from connect, or sent to a listener's owner on accept):
//   (am_send_atom, uint16_t id, bytes header, bytes payload)    -> ok_atom
//   (tag_send_atom, uint64_t tag, bytes payload)                -> ok_atom
//   (flush_atom)                                                -> ok_atom
//   (register_am_atom, uint16_t id, caf::actor handler)         -> ok_atom (this endpoint only)
//   (unregister_am_atom, uint16_t id)                           -> ok_atom
//   (info_atom)                -> (std::string peer_name, std::string transport, std::string info)
//   (close_atom)                                                -> ok_atom, then it exits
//   tag_recv_atom, register_tag_atom and unregister_tag_atom as on the worker (matching is
//   worker-wide, as in libcomm)
// listener actor (from listen):
//   to its owner: request (conn_request_atom, conn_request_info), answered with
//   accept_connection(...) or reject_connection(); then (accepted_atom, uint64_t request_id,
//   caf::actor endpoint) after an accept, or (accepted_atom, uint64_t request_id, caf::error).
//   (address_atom)                                              -> std::string "ip:port"
//   (close_atom)                                                -> ok_atom, then it exits
// delivered to handlers:
//   (am_atom, uint16_t id, bytes header, bytes payload, caf::actor reply_endpoint)
//   (tag_atom, uint64_t tag, bytes payload)
//
// Errors are caf::errors made by comm::actors::make_error(status) (node.hpp): the status of the
// libcomm call that failed (rejected, unreachable, invalid_param, not_connected, ...).
#pragma once

#include <comm/actors/node.hpp>
#include <comm/config.hpp>
#include <comm/worker.hpp>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/result.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace comm::actors::io {

// -- atoms ---------------------------------------------------------------------------------------

// CAF's own atoms, used here as: close an endpoint, listener or worker; connect to a listener;
// flush an endpoint; an operation succeeded.
using caf::close_atom;
using caf::connect_atom;
using caf::flush_atom;
using caf::ok_atom;

/// Asks an endpoint actor to send an active message.
using am_send_atom = caf::atom_constant<caf::atom("am_send")>;
/// Asks an endpoint actor to send a tagged message.
using tag_send_atom = caf::atom_constant<caf::atom("tag_send")>;
/// Asks for the next tagged message matching a tag and mask.
using tag_recv_atom = caf::atom_constant<caf::atom("tag_recv")>;
/// Routes an active message id to a handler actor.
using register_am_atom = caf::atom_constant<caf::atom("reg_am")>;
/// Removes the route of an active message id.
using unregister_am_atom = caf::atom_constant<caf::atom("unreg_am")>;
/// Routes every tagged message matching a tag and mask to a handler actor.
using register_tag_atom = caf::atom_constant<caf::atom("reg_tag")>;
/// Removes a route made with register_tag_atom.
using unregister_tag_atom = caf::atom_constant<caf::atom("unreg_tag")>;
/// Marks an active message delivered to a handler.
using am_atom = caf::atom_constant<caf::atom("am")>;
/// Marks a tagged message delivered to a handler or a receiver.
using tag_atom = caf::atom_constant<caf::atom("tag")>;
/// Asks a worker actor for a listener actor.
using listen_atom = caf::atom_constant<caf::atom("listen")>;
/// Marks a connection request sent to a listener's owner.
using conn_request_atom = caf::atom_constant<caf::atom("conn_req")>;
/// An owner's answer accepting a connection request.
using accept_atom = caf::atom_constant<caf::atom("accept")>;
/// Tells a listener's owner the outcome of an accepted request.
using accepted_atom = caf::atom_constant<caf::atom("accepted")>;
/// Asks for a description (worker, endpoint).
using info_atom = caf::atom_constant<caf::atom("info")>;
/// Asks a listener actor for the address it is bound to.
using address_atom = caf::atom_constant<caf::atom("address")>;

// -- message types -------------------------------------------------------------------------------

/// Bytes of a header, a payload or private data.
using bytes = std::vector<uint8_t>;

/// A client's connection request, as a listener actor shows it to its owner.
struct conn_request_info {
  uint64_t id = 0;             ///< identifies the request in the listener's accepted_atom message
  std::string client_address;  ///< "ip:port" of the client's socket
  uint64_t client_id = 0;      ///< the client worker's worker_params::client_id
  std::string client_name;     ///< the client worker's name
  bytes private_data;          ///< what the client passed to connect
};

/// Makes conn_request_info inspectable (and serialisable) for CAF.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, conn_request_info& x) {
  return f(caf::meta::type_name("comm_conn_request_info"), x.id, x.client_address, x.client_id,
           x.client_name, x.private_data);
}

/// What an owner answers to (conn_request_atom, conn_request_info): accept_connection(...) or
/// reject_connection(). Any other answer, an error, or no answer in time rejects the request.
using conn_reply = caf::result<accept_atom, bytes>;

/// Accepts a connection request, sending `private_data` to the client (its connect reply).
/// @param private_data at most comm::max_private_data bytes for the client
/// @returns the answer to give the listener
conn_reply accept_connection(bytes private_data = {});

/// Rejects a connection request: the client's connect fails with status::rejected.
/// @returns the answer to give the listener
conn_reply reject_connection();

// -- spawning ------------------------------------------------------------------------------------

/// How spawn_worker builds a worker actor.
struct worker_config {
  /// libcomm configuration: transports (COMM_TLS), thresholds, the cluster secret.
  comm::config transport = comm::config::from_environment();
  /// The libcomm worker's parameters (name, client id, cpus: where its resources go; the
  /// progress thread is not pinned). Its thread mode is ignored: only the worker actor's progress
  /// thread uses the worker.
  comm::worker_params worker;
  /// How long the progress thread keeps polling after its last event before it sleeps on the
  /// worker's event fd.
  std::chrono::microseconds spin_time{100};
  /// Limit on establishing a client connection (connect_atom): status::endpoint_timeout after.
  std::chrono::milliseconds connect_timeout{10000};
  /// How long a listener waits for its owner's answer to a connection request before rejecting.
  std::chrono::milliseconds answer_timeout{10000};
  /// How long closing the worker waits for its endpoints to flush before dropping them.
  std::chrono::milliseconds close_timeout{1000};
};

/// Spawns a worker actor: creates a libcomm context and worker from `cfg` and starts the thread
/// that progresses them. The worker, its listeners and its endpoints are released when the worker
/// actor exits (close_atom, an exit message, or its last handle dropped); its listener and
/// endpoint actors then exit too.
/// @param sys the actor system to spawn in
/// @param cfg transports and timing
/// @returns the worker actor, or the error that kept the worker from being created
caf::expected<caf::actor> spawn_worker(caf::actor_system& sys, worker_config cfg = {});

/// Registers the types of these protocols (bytes as "comm_bytes", conn_request_info) and the
/// rendering of comm errors with `cfg`, for actor systems whose messages cross nodes or that
/// print errors. Call before constructing the system.
/// @param cfg the configuration of the actor system to be
void add_message_types(caf::actor_system_config& cfg);

}  // namespace comm::actors::io
