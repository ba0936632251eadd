// The node: one per caf::actor_system, carrying CAF messages to actors in other processes and on
// other hosts over libcomm (shared memory on one host, tcp across hosts).
//
// Usage:
//
//   caf::actor_system_config cfg;
//   comm::actors::node_params params;
//   params.listen_address = "127.0.0.1:7000";
//   comm::actors::node::load(cfg, params);
//   caf::actor_system sys{cfg};
//   auto& n = *comm::actors::node::get(sys);
//   n.publish(sys.spawn(server), "kv");                  // on one process
//   auto kv = n.lookup("127.0.0.1:7000", "kv");           // on another: a caf::actor proxy
//   self->request(*kv, std::chrono::seconds(1), get_atom::value, "key").then(...);
//
// A proxy behaves like a local actor: send, request/response (and error responses), monitor and
// link work across nodes, the sender's identity travels with every message, and messages from one
// sender to one receiver arrive in the order they were sent. When the remote actor terminates its
// monitors get a down_msg (links an exit_msg) with its exit reason; when its node dies, becomes
// unreachable or is disconnected they get one with exit_reason::remote_link_unreachable, and every
// request still waiting for that node fails with sec::request_receiver_down.
//
// Message types other than CAF's builtins must be registered on every node with the same name
// (caf::actor_system_config::add_message_type). A message the receiving node cannot read is never
// a crash and never silent: a request is answered with the error (sec::unknown_type naming the
// type), a response fails its request at once, anything else is counted (stats) and logged.
//
// Typed actors: publish(caf::typed_actor<...>) records the interface, lookup<Handle>(...) checks
// it and returns a Handle.
#pragma once

#include <comm/actors/blob.hpp>
#include <comm/config.hpp>
#include <comm/status.hpp>

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/node_id.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace comm {
class bootstrap;
}

namespace comm::actors {

namespace detail {
class node_state;
struct job_table;
}

/// How a message arriving from another node reaches the receiving actor.
enum class delivery {
  /// The receiving (event-based) actor runs on the node's progress thread as soon as the message
  /// arrived, as if that thread were one of CAF's workers: no thread hand-off and no scheduler
  /// wake-up. Actors it wakes in turn run there too, so handlers should be short; long-running
  /// work belongs on actors reached from elsewhere. The default.
  progress_thread,
  /// The message goes to CAF's scheduler as a message from a non-CAF thread does (what CAF's own
  /// middleman does): one hand-off, plus a wake-up when the scheduler's workers sleep.
  scheduler,
};

/// The delivery mode named by COMM_ACTORS_DELIVERY ("progress" or "scheduler"), else
/// delivery::progress_thread.
delivery default_delivery();

/// The spin time named by COMM_ACTORS_SPIN_US (microseconds), else 200 us.
std::chrono::microseconds default_spin_time();

/// The limit named by COMM_ACTORS_MAX_HELD (bytes; a k, m or g suffix multiplies by 2^10, 2^20,
/// 2^30), else 64 MiB: see node_params::max_held_bytes.
size_t default_max_held_bytes();

/// The limit named by COMM_ACTORS_MAX_PROXIES (a count; k, m, g multiply as for sizes), else
/// 2^18: see node_params::max_proxies.
size_t default_max_proxies();

/// The limit named by COMM_ACTORS_MAX_QUEUED (bytes, as COMM_ACTORS_MAX_HELD), else 256 MiB: see
/// node_params::max_queued_bytes.
size_t default_max_queued_bytes();

/// The backlog named by COMM_ACTORS_MAX_BACKLOG (a count, as COMM_ACTORS_MAX_PROXIES), else
/// 1024: see node_params::max_backlog.
size_t default_max_backlog();

/// Parameters of a node (node::load). Defaults come from the environment where noted; a field
/// set in code wins.
struct node_params {
  /// Address to listen on: "host:port", ":port", port 0 for a free port (see node::address).
  /// Empty: do not listen; the node can still look up actors on others. Without a cluster
  /// secret (transport.auth_key) a wildcard address is narrowed to loopback.
  std::string listen_address = "127.0.0.1:0";
  /// libcomm configuration: transports (COMM_TLS), thresholds, the cluster secret (auth_key).
  comm::config transport = comm::config::from_environment();
  /// How arriving messages reach their actors (COMM_ACTORS_DELIVERY).
  delivery mode = default_delivery();
  /// How long the progress thread keeps polling after its last event before it sleeps on the
  /// worker's event fd (COMM_ACTORS_SPIN_US). Longer: lower latency for bursts and ping-pongs,
  /// more CPU when idle.
  std::chrono::microseconds spin_time = default_spin_time();
  /// Limit on establishing a connection and on the answer to a lookup.
  std::chrono::milliseconds connect_timeout{5000};
  /// Cores the progress thread is pinned to, and the worker's resources placed for
  /// (worker_params::cpus); empty: not pinned, not placed. A progress thread allowed more than one
  /// core (by this list or its process's mask) moves itself to another of them when it finds it
  /// shares its core with the thread that sends it work, and stays there only if it does more
  /// work per second (actors/README.md, "Delivery"); its mask is never changed.
  std::vector<int> cpus;
  /// Bytes of frames one connection may have waiting for an earlier frame of it (a large one
  /// still being fetched), counted with their attachments and a bookkeeping overhead per frame
  /// (COMM_ACTORS_MAX_HELD). A peer that makes the node hold more is closed: its proxies go down
  /// as for any lost peer.
  size_t max_held_bytes = default_max_held_bytes();
  /// Proxies of one connection's actors that may be alive at once (COMM_ACTORS_MAX_PROXIES). A
  /// peer makes the node create one for every actor of its own that it names (as a sender, in a
  /// message, in a lookup's answer); one that names more is closed as for max_held_bytes.
  size_t max_proxies = default_max_proxies();
  /// Bytes of frames to one connection that may wait in libcomm's send queue (because the peer
  /// does not take them as fast as they come), counted with a bookkeeping overhead per frame;
  /// the attachments of large messages, which live in the sender's own buffers anyway, are not
  /// counted (COMM_ACTORS_MAX_QUEUED). A peer that falls further behind (one that sends requests
  /// and lookups but never reads the answers, or one stopped while local actors send to it) is
  /// closed as for max_held_bytes.
  size_t max_queued_bytes = default_max_queued_bytes();
  /// Frames to one connection that may wait in libcomm's send queue, or for the thread that holds
  /// the worker to send them, before a sending actor's thread waits for the peer to take some
  /// (COMM_ACTORS_MAX_BACKLOG). Above it, a thread other than the progress thread that sends to
  /// that connection sleeps briefly and progresses the worker, in turns, until half of them left,
  /// as long as the peer takes any: a flood from one actor then goes at the peer's pace instead of
  /// piling up in memory (a burst of 200,000 messages on one core had queued 180,000 of them, 180
  /// MB, whose freed blocks later cost a single allocation 13 ms). A peer that takes nothing for
  /// 100 ms is left to max_queued_bytes (node_stats::backlog_stalls).
  size_t max_backlog = default_max_backlog();
  /// Lend blobs to peers that can map this process's memory (over shm): a blob of
  /// comm::mem_alloc memory travels as a reference the receiver reads in place, with no copy,
  /// and the sender keeps the block until the receiver's last copy of the blob is gone, or its
  /// process when the connection closed first (actors/README.md, "Lent blobs"). The receiver maps
  /// the bytes read-only (a write through them faults there) but sees bytes this node controls,
  /// as with any shared memory; a receiver that does not trust its peers to leave blobs they lent
  /// alone copies those it must keep stable (blob::copy), or the peers set this to false.
  bool lend_blobs = true;
  /// Bytes of blobs one connection may have lent at once (kept alive for the receiver), counting
  /// those still kept for its borrower process from connections closed before it began lending
  /// (node_stats::lent_kept_bytes_now); a blob beyond it is copied to the peer as when lending is
  /// off.
  size_t max_lent_bytes = size_t{256} << 20;
};

/// Counters of a node (node::stats), for tests and tools.
struct node_stats {
  size_t peers = 0;              ///< connected nodes
  size_t proxies = 0;            ///< proxies of remote actors alive on this node
  size_t published = 0;          ///< names published
  size_t pending_requests = 0;   ///< requests sent to other nodes and not yet answered
  size_t remote_monitors = 0;    ///< local actors that other nodes watch for termination
  uint64_t messages_sent = 0;    ///< frames sent to other nodes
  uint64_t messages_received = 0;///< frames received from other nodes
  uint64_t bytes_sent = 0;       ///< payload bytes of those sent
  uint64_t bytes_received = 0;   ///< payload bytes of those received
  uint64_t frames_held = 0;      ///< frames that arrived before an earlier one (kept for order)
  uint64_t peak_bytes_held = 0;  ///< most bytes one connection held for order at once
  /// Most frames one connection had waiting in libcomm's send queue at once (see
  /// node_params::max_backlog).
  uint64_t peak_frames_queued = 0;
  /// Times a sending thread waited for a connection's backlog to shrink (node_params::max_backlog).
  uint64_t backlog_waits = 0;
  /// Of those, waits given up because the peer took no frame for 100 ms: until it takes one,
  /// senders do not wait and only max_queued_bytes bounds the backlog.
  uint64_t backlog_stalls = 0;
  /// Messages from other nodes this node could not read (a type it has not registered, or bytes
  /// that do not parse): a request is answered with the error, a response fails its request at
  /// once with it, any other message is dropped with a warning (at most one a second).
  uint64_t unreadable_messages = 0;
  uint64_t blobs_lent = 0;       ///< blobs lent to other nodes so far (node_params::lend_blobs)
  size_t lent_now = 0;           ///< of those, lends the receivers have not released yet
  size_t lent_bytes_now = 0;     ///< bytes of those
  /// Of lent_now, lends whose connection closed while the borrower process lives: their blobs
  /// stay allocated until it exits (actors/README.md, "Lent blobs").
  size_t lent_kept_now = 0;
  size_t lent_kept_bytes_now = 0;  ///< bytes of those
  uint64_t blobs_borrowed = 0;   ///< blobs from other nodes read in place (lent to this node)
  uint64_t borrowed_copied = 0;  ///< lent blobs this node could not map and copied instead
};

/// The CAF error category of libcomm statuses (errors made by make_error(comm::status)).
inline constexpr caf::atom_value error_category = caf::atom("comm");

/// A CAF error carrying a libcomm status (category error_category, code -status).
caf::error make_error(comm::status st);

/// What status_of returns for an error that does not carry a libcomm status (one of CAF's own,
/// or of an application's category): an error value no libcomm call returns ("UNKNOWN_STATUS").
inline constexpr comm::status foreign_error = static_cast<comm::status>(-127);

/// The libcomm status carried by `err`: status::ok for an empty error, foreign_error for an
/// error of another category than error_category (never mistaken for success).
comm::status status_of(const caf::error& err);

/// A node: this process's endpoint in a cluster of actor systems. Owns a libcomm context and
/// worker, a listener, the connections to other nodes and the thread that progresses them. One
/// per caf::actor_system, created with it (node::load) and stopped after all its actors are done.
/// Every member function is thread-safe.
class node {
public:
  /// Adds a node to `cfg`: the actor system built from it gets a node, which also gives the
  /// system a valid node id. Call once per config, before constructing the system. Unless `cfg`
  /// sets it, also sets CAF's `work-stealing.moderate-poll-attempts` to 0: idle CAF workers then
  /// sleep at once instead of waking every 50 us for a while, which preempted the progress thread
  /// (see actors/README.md, "Delivery, threads, and what was measured").
  /// @param cfg the configuration of the actor system to be
  /// @param params how the node listens, which transports it uses, how it delivers
  static void load(caf::actor_system_config& cfg, node_params params = {});

  /// The node of `sys`, or nullptr when `sys` was not configured with load().
  static node* get(caf::actor_system& sys) noexcept;

  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  // -- identity ----------------------------------------------------------------------------------

  /// The address other nodes reach this one at ("ip:port"); empty when not listening.
  std::string address() const;

  /// Why listening failed (a make_error(status)), or an empty error.
  caf::error listen_error() const;

  /// This node's CAF node id (that of its actor system).
  caf::node_id id() const;

  /// The actor system this node belongs to.
  caf::actor_system& system() const noexcept;

  // -- publishing and lookup ---------------------------------------------------------------------

  /// Makes `whom` reachable by other nodes under `name` until it terminates or is unpublished.
  /// @returns an empty error, or status::invalid_param for an invalid handle or empty name,
  ///          status::already_exists when another actor holds the name
  caf::error publish(const caf::actor& whom, const std::string& name);

  /// Makes the typed actor `whom` reachable under `name` together with its messaging interface,
  /// which lookup<Handle> checks on the looking node. Otherwise as publish(caf::actor, name).
  template <class... Sigs>
  caf::error publish(const caf::typed_actor<Sigs...>& whom, const std::string& name) {
    return publish_typed(caf::actor_cast<caf::actor>(whom), name, system().message_types(whom));
  }

  /// Withdraws `name`. @returns an empty error, or status::no_elem when it is not published.
  caf::error unpublish(const std::string& name);

  /// Blocks until the node at `address` ("host:port") answers whether it publishes `name`,
  /// connecting to it first when needed, for at most node_params::connect_timeout.
  /// Must not be called from an actor that runs on the node's progress thread (status::busy).
  /// @returns a proxy for the remote actor, or an error: status::no_elem for an unknown name,
  ///          unreachable / rejected / endpoint_timeout / connection_reset when the node cannot be
  ///          reached, timed_out when it does not answer in time
  caf::expected<caf::actor> lookup(const std::string& address, const std::string& name);

  /// As lookup(address, name), waiting at most `timeout`.
  caf::expected<caf::actor> lookup(const std::string& address, const std::string& name,
                                   std::chrono::milliseconds timeout);

  /// As lookup(address, name), giving a handle of type `Handle`: a caf::typed_actor<...> or
  /// caf::actor. A typed handle is given only for an actor published with publish(typed_actor)
  /// whose interface a `Handle` may be assigned from (as CAF's remote_actor checks it);
  /// otherwise the error is sec::unexpected_actor_messaging_interface, naming the interface
  /// published and the one expected.
  template <class Handle>
  caf::expected<Handle> lookup(const std::string& address, const std::string& name) {
    return lookup<Handle>(address, name, default_timeout());
  }

  /// As lookup<Handle>(address, name), waiting at most `timeout`.
  template <class Handle>
  caf::expected<Handle> lookup(const std::string& address, const std::string& name,
                               std::chrono::milliseconds timeout) {
    auto found = lookup_as(address, name, timeout, system().message_types<Handle>());
    if (!found) return std::move(found.error());
    return caf::actor_cast<Handle>(std::move(*found));
  }

  // -- connections -------------------------------------------------------------------------------

  /// Closes the connection to the node at `address` (as given to lookup, or as it listens):
  /// its proxies die with exit_reason::remote_link_unreachable and its pending requests fail.
  /// @returns an empty error, or status::no_elem when no such node is connected
  caf::error disconnect(const std::string& address);

  /// Counters of this node.
  node_stats stats() const;

  // -- joining a job (node_join.cpp) -------------------------------------------------------------

  /// Joins the job `boot` belongs to (collective: every rank calls it): the ranks exchange their
  /// nodes' addresses through `boot`, each connects to the nodes of the ranks below its own, and
  /// a barrier ends it, so that every node is connected to every other. The node must listen at
  /// an address the others reach (node_params::listen_address; across hosts an interface's
  /// address and a cluster key). Each step is bounded by `timeout`.
  /// @returns an empty error, or status::invalid_param when the node does not listen,
  ///          already_exists when it joined before, the bootstrap's status when the exchange or
  ///          the barrier fails, the connection's when a node cannot be reached
  caf::error join(comm::bootstrap& boot,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

  /// This node's rank in the job it joined, or -1.
  int rank() const;

  /// The number of ranks of the job it joined, or 0.
  int job_size() const;

  /// As lookup(address, name), for the node of rank `rank` of the joined job.
  /// @returns as lookup, or status::not_connected before join, invalid_param for a rank outside
  ///          the job
  caf::expected<caf::actor> lookup(int rank, const std::string& name);

  /// As lookup(rank, name), waiting at most `timeout`.
  caf::expected<caf::actor> lookup(int rank, const std::string& name,
                                   std::chrono::milliseconds timeout);

  /// As lookup<Handle>(address, name), for the node of rank `rank` of the joined job.
  template <class Handle>
  caf::expected<Handle> lookup(int rank, const std::string& name) {
    return lookup<Handle>(rank, name, default_timeout());
  }

  /// As lookup<Handle>(rank, name), waiting at most `timeout`.
  template <class Handle>
  caf::expected<Handle> lookup(int rank, const std::string& name,
                               std::chrono::milliseconds timeout) {
    auto where = address_of(rank);
    if (!where) return std::move(where.error());
    return lookup<Handle>(*where, name, timeout);
  }

private:
  friend class caf::net::middleman;  // the actor-system module that load() installs owns the node

  node(caf::actor_system& sys, node_params params);

  /// The address of rank `rank`'s node in the joined job, or the error lookup(rank) returns.
  caf::expected<std::string> address_of(int rank) const;

  /// node_params::connect_timeout, the default limit of a lookup.
  std::chrono::milliseconds default_timeout() const noexcept;

  /// publish(whom, name), recording the interface `ifs` for lookups to check.
  caf::error publish_typed(const caf::actor& whom, const std::string& name,
                           std::set<std::string> ifs);

  /// lookup(address, name, timeout), refusing an actor whose published interface `expected`
  /// may not be assigned from (no check when `expected` is empty: a caf::actor).
  caf::expected<caf::actor> lookup_as(const std::string& address, const std::string& name,
                                      std::chrono::milliseconds timeout,
                                      const std::set<std::string>& expected);

  std::unique_ptr<detail::node_state> state_;
  mutable std::mutex job_mtx_;                   ///< guards job_
  std::shared_ptr<const detail::job_table> job_; ///< the job joined, or null
};

}  // namespace comm::actors
