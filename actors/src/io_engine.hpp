// The libcomm side of the io actors: one engine per worker actor owns a libcomm context, worker,
// listeners and endpoints, and the thread that progresses them.
//
// Threads. Only the progress thread touches libcomm. Actors hand it work with post(); every
// other member function runs on the progress thread, inside a posted task or a libcomm callback.
// The progress thread answers with messages: an op_done to the actor that started an operation,
// gone to an endpoint or listener actor whose object failed or was released, and deliveries
// (am_atom, tag_atom) to handler actors. It never touches an actor's state or response promises.
#pragma once

#include "io_replies.hpp"

#include <comm/actors/io_actors.hpp>
#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/actor_system.hpp>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace comm::actors::io::detail {

/// Where the engine reports an operation's outcome. The handle is weak: an actor that is gone
/// is not told, and a pending operation does not keep its actor alive.
struct notice {
  caf::actor_addr to;  ///< null: nobody is told
  uint64_t id = 0;     ///< the operation id `to` gave
};

/// Owns one libcomm worker and progresses it on its own thread (see the file comment).
class engine : public std::enable_shared_from_this<engine> {
public:
  /// Work for the progress thread.
  using task = std::function<void(engine&)>;

  /// Creates the context and worker and starts the progress thread.
  /// @returns the engine, or make_error of the status that kept the worker from being created
  static caf::expected<std::shared_ptr<engine>> start(caf::actor_system& sys, worker_config cfg);

  engine(caf::actor_system& sys, worker_config cfg);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // -- any thread ----------------------------------------------------------------------------------

  /// Runs `t` on the progress thread, in the order posted.
  /// @returns false (and drops `t`) once the engine stops
  bool post(task t);

  /// Tells every endpoint and listener actor that its object is gone, closes the endpoints
  /// (flushing them for at most close_timeout), releases listeners, worker and context, and
  /// stops the progress thread. Waits for all that unless called on the progress thread.
  void stop();

  /// The actor system the engine's actors live in.
  caf::actor_system& system() const noexcept { return sys_; }

  // -- progress thread: worker level (io_engine_delivery.cpp) -----------------------------------

  /// Routes AM `id` arriving on endpoint `slot` (0: on any endpoint) to `handler`.
  void register_am(uint64_t slot, uint16_t id, caf::actor handler, notice n);
  /// Removes the route of AM `id` on endpoint `slot` (0: the worker-wide route).
  void unregister_am(uint64_t slot, uint16_t id, notice n);
  /// Receives the next message matching `tag` under `mask` and reports it as op_done to `n`.
  void tag_recv(tag_t tag, tag_t mask, notice n);
  /// Withdraws the waiting tag receive reported to `n` (with status::timed_out) if unmatched.
  void expire_tag_recv(const notice& n);
  /// Delivers every message matching `tag` under `mask` to `handler` as (tag_atom, tag, bytes).
  void register_tag(tag_t tag, tag_t mask, caf::actor handler, notice n);
  /// Removes a route made by register_tag.
  void unregister_tag(tag_t tag, tag_t mask, const caf::actor& handler, notice n);
  /// Drops every route to `whom` (a handler that terminated).
  void forget(const caf::actor_addr& whom);
  /// Reports worker::info() as text[0].
  void worker_info(notice n);

  // -- progress thread: connections (io_engine_connections.cpp) ---------------------------------

  /// Connects to a listener at `address`; reports (endpoint actor, server data) once accepted.
  void connect(const std::string& address, bytes private_data, notice n);
  /// Listens on `address`; reports the listener actor, which asks `owner` about each request.
  void listen(const std::string& address, caf::actor owner, notice n);
  /// Accepts request `request` of listener `slot`; reports the new endpoint actor.
  void accept(uint64_t slot, uint64_t request, bytes private_data, notice n);
  /// Rejects request `request` of listener `slot`.
  void reject(uint64_t slot, uint64_t request);
  /// Reports the bound address of listener `slot` as text[0].
  void listener_address(uint64_t slot, notice n);
  /// Releases listener `slot`, rejecting its unanswered requests.
  void close_listener(uint64_t slot, notice n);

  // -- progress thread: endpoints (io_engine_connections.cpp) -----------------------------------

  /// Sends AM `id` on endpoint `slot`; reports once libcomm completed the send.
  void am_send(uint64_t slot, uint16_t id, bytes header, bytes payload, notice n);
  /// Sends a tagged message on endpoint `slot`; reports once libcomm completed the send.
  void tag_send(uint64_t slot, tag_t tag, bytes payload, notice n);
  /// Flushes endpoint `slot`.
  void flush(uint64_t slot, notice n);
  /// Reports (peer name, transport, info line) of endpoint `slot` as text.
  void endpoint_info(uint64_t slot, notice n);
  /// Closes endpoint `slot` (flushing it first).
  void close_endpoint(uint64_t slot, notice n);

private:
  /// An endpoint and the actor that represents it.
  struct endpoint_slot {
    comm::endpoint_ptr ep;        ///< empty once its close started
    caf::actor actor;
    std::unordered_map<uint16_t, caf::actor> am_routes;  ///< this endpoint's AM handlers
    notice connecting;            ///< a client connect waiting for the server's answer
    bool closing = false;
  };

  /// A listener, the actor that represents it, and its unanswered requests.
  struct listener_slot {
    std::unique_ptr<comm::listener> listener;
    caf::actor actor;
    uint64_t next_request = 1;
    std::unordered_map<uint64_t, comm::conn_request*> requests;
  };

  /// The libcomm handler of one AM id: the worker-wide route and the count of endpoint routes.
  struct am_route {
    engine* owner = nullptr;
    uint16_t id = 0;
    caf::actor handler;          ///< worker-wide handler, may be null
    size_t endpoint_routes = 0;  ///< endpoint slots with a route for this id
  };

  /// A waiting tag receive (one message) or a tag route (every message).
  struct tag_wait {
    tag_t tag = 0;
    tag_t mask = 0;
    notice reply;        ///< one-shot receives
    caf::actor handler;  ///< routes
  };

  /// An operation libcomm completes later, and what it keeps alive until then.
  struct flight {
    uint64_t key = 0;
    notice reply;        ///< told the outcome (op_done)
    caf::actor handler;  ///< tag route receives: gets (tag_atom, tag, data)
    bytes header;
    bytes data;          ///< sent payload, or the receive buffer
    uint64_t endpoint = 0;  ///< close: the slot to drop once closed
    bool received = false;  ///< route receive: done, waiting for earlier ones to be delivered
    comm::status outcome = comm::status::ok;  ///< route receive: how it ended
    tag_t tag = 0;                            ///< route receive: the message's tag
  };

  // -- progress loop (io_engine.cpp) ---------------------------------------------------------------

  void run();
  size_t run_tasks();
  void sleep();
  void wake();
  void shut_down();
  void close_all_endpoints();

  // -- helpers ------------------------------------------------------------------------------------

  /// Sends op_done{n.id, st} (or `done` with id n.id) to n.to, when set.
  static void report(const notice& n, comm::status st);
  static void report(const notice& n, op_done done);
  endpoint_slot* find_endpoint(uint64_t slot, const notice& n);
  uint64_t add_endpoint(comm::endpoint_ptr ep);
  void drop_endpoint(uint64_t slot);
  comm::endpoint_params endpoint_params_for(bytes private_data) const;
  flight* new_flight(notice n);
  void finish(uint64_t key, comm::status st);
  /// The completion of an operation whose outcome finishes flight `key`.
  comm::send_completion finisher(uint64_t key);
  am_route& route_for(uint16_t id);
  void release_route(uint16_t id);
  size_t match_tags();
  bool receive_matching(const tag_wait& w);
  void finish_receive(uint64_t key, comm::status st, tag_t tag, size_t length);
  /// Hands `handler` its finished route receives, oldest first, up to the first unfinished one.
  void deliver_in_order(const caf::actor_addr& handler);
  void deliver_am(am_route& route, const void* header, size_t header_length, const void* data,
                  size_t length, const am_recv_params& params);

  // -- libcomm callbacks ---------------------------------------------------------------------------

  static status on_am(void* arg, const void* header, size_t header_length, void* data,
                      size_t length, const am_recv_params& params);
  static void on_endpoint_error(void* arg, comm::endpoint* ep, status reason);
  static void on_connected(void* arg, comm::endpoint* ep, const uint8_t* data, size_t length);
  static void on_conn_request(void* arg, comm::conn_request* request);

  caf::actor_system& sys_;
  const worker_config cfg_;

  // Shared with posting threads.
  std::mutex mtx_;
  std::vector<task> tasks_;          ///< guarded by mtx_
  std::atomic<bool> stopping_{false};  ///< set under mtx_
  std::atomic<bool> sleeping_{false};
  int wake_fd_ = -1;
  std::thread thread_;

  // Progress thread only.
  std::unique_ptr<comm::context> ctx_;
  std::unique_ptr<comm::worker> worker_;
  bool shutting_down_ = false;
  uint64_t next_key_ = 1;
  std::unordered_map<uint64_t, endpoint_slot> endpoints_;
  std::unordered_map<comm::endpoint*, uint64_t> slot_of_;
  std::unordered_map<uint64_t, listener_slot> listeners_;
  std::unordered_map<uint16_t, am_route> am_routes_;
  std::deque<tag_wait> waits_;
  std::vector<tag_wait> tag_routes_;
  std::unordered_map<uint64_t, std::unique_ptr<flight>> flights_;
  /// Per route handler, its receives in the order they matched: a rendezvous receive completing
  /// after a later eager one still reaches the handler first.
  std::unordered_map<caf::actor_addr, std::deque<uint64_t>> route_order_;
};

}  // namespace comm::actors::io::detail
