// The node's internals: the libcomm context, worker and listener, the connections to other nodes,
// the proxies of their actors, the names this node publishes, and the progress thread that drives
// it all.
//
// Threads. The worker is single-threaded; a "turn lock" (a flag taken with try_acquire, which
// no thread waits for beyond a bound) says which thread may use it and the connection state
// below: the progress thread takes it for each progress call, and a thread that sends too. A proxy
// serialises a message on the sending actor's thread and sends it right there when it gets the
// lock: at once, or by waiting a little (wait_for_turn) while the progress thread, which sees a
// sender waiting, lets its next turn pass. A sender that waited in vain (the holder is not
// running: preempted, or busy with many frames) leaves the frame in the outbox, which the lock's
// holder empties before it lets go, so frames leave in the order they were made; later senders
// then go to the outbox at once until the lock changed hands. A sender (not the progress
// thread) that leaves more than max_backlog frames to one connection, in libcomm's queue or in
// the outbox, waits, progressing the worker and sleeping briefly, until the peer took half of
// them (wait_for_backlog). Work that may not run where it is made (under actor locks) is posted to
// the outbox and the progress thread woken. Frames arriving from a peer are handled in sequence
// order inside the progress call; actors they make ready run on the progress thread after it
// (delivery::progress_thread) or go to CAF's scheduler (delivery::scheduler). Nothing is sent
// from inside a libcomm callback: frames made there wait in the holder's queue.
#pragma once

#include "frame.hpp"
#include "lend_keeper.hpp"
#include "outbox.hpp"
#include "payload.hpp"
#include "peer.hpp"
#include "progress_unit.hpp"

#include <comm/actors/node.hpp>
#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <caf/proxy_registry.hpp>
#include <caf/scoped_execution_unit.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace comm::actors::detail {

/// A counter that only the progress thread changes and any thread reads: plain loads and
/// stores, no locked instructions on the hot path.
class gauge {
public:
  /// Adds `n`.
  void add(uint64_t n = 1) noexcept { v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  /// Subtracts `n`.
  void sub(uint64_t n = 1) noexcept { v_.store(v_.load(std::memory_order_relaxed) - n, std::memory_order_relaxed); }
  /// Sets the value to `n`.
  void set(uint64_t n) noexcept { v_.store(n, std::memory_order_relaxed); }
  /// The value.
  uint64_t get() const noexcept { return v_.load(std::memory_order_relaxed); }

private:
  std::atomic<uint64_t> v_{0};
};

/// State and behaviour of a node (see the file comment).
class node_state final : public caf::proxy_registry::backend {
public:
  /// A node of `sys`; nothing runs until start().
  node_state(caf::actor_system& sys, node_params params);
  ~node_state() noexcept override;
  node_state(const node_state&) = delete;
  node_state& operator=(const node_state&) = delete;

  // -- lifecycle (the module) --------------------------------------------------------------------

  /// Creates the libcomm context, worker and listener and starts the progress thread.
  void start();

  /// Closes every connection, stops the progress thread and releases proxies and names (after
  /// every actor of the system is done).
  void stop();

  // -- the public API (comm::actors::node) -------------------------------------------------------

  /// See node::address.
  std::string address() const;
  /// See node::listen_error.
  caf::error listen_error() const;
  /// The actor system.
  caf::actor_system& system() const noexcept { return sys_; }
  /// See node::publish; `ifs` is the interface of a typed actor (empty for caf::actor).
  caf::error publish(const caf::actor& whom, const std::string& name, interface ifs = {});
  /// See node::unpublish.
  caf::error unpublish(const std::string& name);
  /// See node::lookup; an actor whose interface `expected` may not be assigned from is refused
  /// (no check when it is empty).
  caf::expected<caf::actor> lookup(const std::string& address, const std::string& name,
                                   std::chrono::milliseconds timeout,
                                   const interface& expected = {});
  /// See node::disconnect.
  caf::error disconnect(const std::string& address);
  /// See node::stats.
  node_stats stats() const;
  /// The timeout node::lookup uses by default.
  std::chrono::milliseconds connect_timeout() const noexcept { return params_.connect_timeout; }

  // -- caf::proxy_registry::backend --------------------------------------------------------------

  /// Makes the proxy of actor `aid` on node `nid` (with the registry's lock held) and asks that
  /// node to report the actor's termination. Null when no connection leads to `nid`.
  caf::strong_actor_ptr make_proxy(caf::node_id nid, caf::actor_id aid) override;

  /// Nothing: messages are never routed through intermediate nodes.
  void set_last_hop(caf::node_id*) override;

  // -- used by proxies and remote monitors (any thread) ------------------------------------------

  /// Sends `what` to actor `receiver` through `to`. Bounces a request whose content cannot be
  /// serialised with the serialiser's error.
  void forward(const std::shared_ptr<peer>& to, caf::actor_id receiver, caf::mailbox_element& what,
               caf::execution_unit* ctx);

  /// Tells `to` that local actor `local` linked itself to (or unlinked from) its actor `remote`.
  /// Safe with actor locks held: the frame is only queued.
  void announce_link(const std::shared_ptr<peer>& to, bool linked, caf::strong_actor_ptr local,
                     caf::actor_id remote);

  /// Tells `to` (if still connected) that local actor `aid` terminated for `reason`.
  void report_down(const std::weak_ptr<peer>& to, caf::actor_id aid, const caf::error& reason);

  /// The count of this node's proxies alive, which proxies keep up to date (and alive: a user
  /// may drop a proxy handle after the node is gone).
  std::shared_ptr<std::atomic<size_t>> proxy_counter() const { return proxies_alive_; }

private:
  // -- progress thread (node_state.cpp) ----------------------------------------------------------

  void run();
  bool on_progress_thread() const noexcept;
  size_t turn();
  size_t progress_locked();
  bool sleep();
  void wake();
  void shut_down();
  bool try_acquire() noexcept;
  bool wait_for_turn() noexcept;
  bool holds_lock() const noexcept;
  void release() noexcept;
  void submit(outgoing* item);
  void post(outgoing* item);
  void post_task(std::function<void()> task);
  void enqueue_local(outgoing* item);
  size_t drain();
  void handle(outgoing* item);

  // -- connections (connections.cpp) -------------------------------------------------------------

  void open_listener();
  /// Opens the wake-up eventfd and the epoll set the idle progress thread sleeps on.
  /// @returns false when either cannot be made (errno says why)
  bool open_wakeup();
  /// Gives up a start whose worker or wake-up fds could not be made: logs it, closes what was
  /// opened and leaves listen_error() set, so every later call fails instead of waiting.
  void fail_start();
  static void on_conn_request(void* arg, comm::conn_request* request);
  static void on_ep_connect(void* arg, comm::endpoint* ep, const uint8_t* data, size_t length);
  static void on_ep_error(void* arg, comm::endpoint* ep, comm::status reason);
  comm::endpoint_params endpoint_settings();
  void accept(comm::conn_request* request);
  std::shared_ptr<peer> dial(const std::string& address, comm::status* failure);
  void introduce(const std::shared_ptr<peer>& p, const node_hello& hello);
  std::shared_ptr<peer> dialled_peer_of(const caf::node_id& id, const peer& other) const;
  void fold(const std::shared_ptr<peer>& dup, const std::shared_ptr<peer>& known);
  std::shared_ptr<peer> peer_of(comm::endpoint* ep) const;
  std::shared_ptr<peer> peer_at(const std::string& address) const;
  void fail_peer(const std::shared_ptr<peer>& p, comm::status reason);
  void forget(const std::shared_ptr<peer>& p);
  void fail_lookups(peer& p, bool was_ready, comm::status reason);
  void unmap(const std::shared_ptr<peer>& p);
  void fail_requests(peer& p);
  void release_watched(peer& p);
  void close_endpoints();
  void start_lookup(const std::shared_ptr<lookup_call>& call);
  void retry_lookup(const std::shared_ptr<lookup_call>& call, comm::status reason);
  void send_lookup(const std::shared_ptr<peer>& p, const std::shared_ptr<lookup_call>& call);
  void disconnect_now(const std::string& address, const std::shared_ptr<lookup_call>& done);

  // -- frames in (inbound.cpp) -------------------------------------------------------------------

  static comm::status on_frame(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const comm::am_recv_params& params);
  void receive(const std::shared_ptr<peer>& p, const frame_header& h, frame_parts& parts);
  void hold(const std::shared_ptr<peer>& p, const frame_header& h, frame_parts& parts);
  void dispatch(const std::shared_ptr<peer>& p, const frame_header& h, frame_parts& parts);
  void on_message(const std::shared_ptr<peer>& p, const frame_header& h, frame_parts& parts);
  void fail_response(peer& p, const frame_header& h, const caf::error& err);
  void drop_unreadable(const peer& p, const frame_header& h, const caf::error& err);
  caf::strong_actor_ptr sender_of(peer& p, const frame_header& h);
  caf::strong_actor_ptr receiver_of(peer& p, caf::actor_id aid);
  void on_monitor(const std::shared_ptr<peer>& p, caf::actor_id aid);
  void on_down(const peer& p, const frame_header& h, const void* data, size_t length);
  void on_link(const peer& p, const frame_header& h, bool linked);
  void on_lookup(const std::shared_ptr<peer>& p, const frame_header& h, const void* data,
                 size_t length);
  void on_lookup_reply(const std::shared_ptr<peer>& p, const frame_header& h, const void* data,
                       size_t length);
  caf::expected<caf::actor> checked(const caf::actor& found, const interface& published,
                                    const lookup_call& call) const;
  void reply_error(const std::shared_ptr<peer>& p, const frame_header& h, const caf::error& err);
  void violation(const std::shared_ptr<peer>& p, const char* what);
  caf::execution_unit* delivery_unit() noexcept;

  // -- lent blobs (node_lending.cpp, lending.hpp) -------------------------------------------------

  /// Lends the attachments of `item` to `p` when it can (flag_lent set, `item.lends` filled);
  /// over shm, attachments borrowed from elsewhere become copies first.
  bool lend_attached(peer& p, outgoing& item);
  /// Finds out which process borrows from `p` (its pidfd), and what is kept for it already.
  void watch_borrower(peer& p);
  /// Registers `run` for remote reads only, packs its key into `d` and enters it in `p`'s table.
  bool lend_one(peer& p, const blob& run, lend_descriptor& d);
  /// Forgets lend `id` of `p`'s table; false when there is none.
  bool take_back(peer& p, uint64_t id);
  /// The AM header (envelope and payload) and data (the lends) of a lent frame.
  void lay_out_lent(outgoing& item, const void*& head, size_t& head_length, const void*& data,
                    size_t& length);
  /// Forgets every lend of `p` and closes its release sink (the connection ended); the blobs of
  /// a borrower process that lives go to the lend_keeper until it exits.
  void drop_lends(peer& p);
  /// Handles a message frame whose attachments are lent.
  void receive_lent(const std::shared_ptr<peer>& p, const frame_header& h, const void* header,
                    size_t header_length, const void* data, size_t length);
  /// Appends the blob of lend `d` to `runs`; null, or what is wrong with the lend.
  const char* borrow(const std::shared_ptr<peer>& p, const lend_descriptor& d,
                     std::vector<blob>& runs);
  /// Appends a copy of lend `d` (which cannot be mapped) and releases the lend.
  const char* copy_lent(const std::shared_ptr<peer>& p, const lend_descriptor& d, comm::rkey& key,
                        std::vector<blob>& runs);
  std::shared_ptr<release_sink> make_release_sink(const std::shared_ptr<peer>& p);
  /// Sends `p` the ids its sink collected.
  void send_releases(const std::shared_ptr<peer>& p);
  /// Handles a release frame.
  void on_release(const std::shared_ptr<peer>& p, const void* data, size_t length);

  // -- frames out (outbound.cpp) -----------------------------------------------------------------

  void transmit(outgoing* item);
  bool transmit(peer& p, outgoing& item, bool immediate);
  void lay_out_attached(outgoing& item, const void*& head, size_t& head_length,
                        const void*& data, size_t& length);
  bool send_now(const std::shared_ptr<peer>& to, const frame_header& h);
  frame_header message_header(const peer& to, caf::actor_id receiver,
                              const caf::mailbox_element& what);
  void sent_frame(peer& p, const frame_header& h);
  void queue_up(outgoing& item);
  void unqueue(peer& p, const outgoing& item);
  void wait_for_backlog(peer& p);
  /// Frames to `p` that count against max_backlog: in libcomm's queue, or left by senders for
  /// the lock holder.
  static size_t backlog_of(const peer& p) noexcept;
  static void on_sent(comm::request* req, comm::status st, void* user_data);
  void track_request(peer& p, const frame_header& h);
  void prune_requests(peer& p);
  void bounce(peer& p, const frame_header& h);
  void make_reachable(const caf::strong_actor_ptr& local);
  void make_sender_reachable(const caf::strong_actor_ptr& sender);
  outgoing* new_frame(const std::shared_ptr<peer>& to, frame_kind kind);
  content_writer& writer();

  // -- members -----------------------------------------------------------------------------------

  caf::actor_system& sys_;
  const node_params params_;
  caf::proxy_registry proxies_;
  caf::scoped_execution_unit serializer_unit_;  ///< context of serialisers on any thread
  progress_unit unit_;                          ///< the progress thread as an execution unit
  envelope_writer envelope_;                    ///< the lock holder's envelope encoder
  std::vector<char> joined_;                    ///< the lock holder's envelope-and-payload header
  content_reader reader_;                       ///< the progress thread's message reader

  std::unique_ptr<comm::context> context_;
  std::unique_ptr<comm::worker> worker_;
  std::unique_ptr<comm::listener> listener_;
  std::vector<uint8_t> hello_;                  ///< this node's hello (private data)

  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};     ///< the progress thread's (set by it)
  std::atomic<bool> busy_{false};                ///< the turn lock (see the file comment)
  std::atomic<std::thread::id> holder_{};       ///< the thread holding it
  std::atomic<unsigned> turn_wanted_{0};        ///< senders waiting for the lock
  std::atomic<bool> holder_stalled_{false};     ///< a sender waited in vain since the last release
  std::atomic<bool> stopping_{false};
  std::atomic<bool> sleeping_{false};
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  outbox outbox_;
  outgoing* queue_head_ = nullptr;              ///< progress thread's FIFO of items to handle
  outgoing* queue_tail_ = nullptr;
  bool draining_ = false;                       ///< inside drain()
  bool in_callback_ = false;                    ///< inside the worker's progress call
  std::vector<comm::endpoint*> closing_;        ///< endpoints to close after the progress call

  mutable std::mutex mtx_;                      ///< guards what other threads read below
  std::string address_;
  caf::error listen_error_;
  /// A published actor and its interface (empty: not typed).
  struct published_actor {
    caf::actor handle;
    interface ifs;
  };
  std::unordered_map<std::string, published_actor> names_;
  std::unordered_map<caf::node_id, std::shared_ptr<peer>> by_node_;  ///< the mapped connections

  std::unordered_map<comm::endpoint*, std::shared_ptr<peer>> by_ep_;  ///< progress thread
  comm::endpoint* rx_ep_ = nullptr;             ///< endpoint of the last frame received
  std::shared_ptr<peer> rx_peer_;               ///< its peer (valid while rx_ep_ is set)
  std::unordered_map<std::string, std::weak_ptr<peer>> by_address_;   ///< progress thread
  uint64_t serial_ = 0;
  uint64_t lookups_ = 0;
  const uint64_t generation_;                   ///< unique per node of the process

  std::shared_ptr<std::atomic<size_t>> proxies_alive_;
  gauge peers_;
  gauge pending_gauge_;
  gauge watched_gauge_;
  gauge sent_;
  gauge received_;
  gauge bytes_sent_;
  gauge bytes_received_;
  gauge frames_held_;
  gauge unreadable_;
  gauge in_flight_;  ///< frames in libcomm's hands whose send has not completed (lock holder's)
  /// Shortest time between two warnings about dropped unreadable messages.
  static constexpr std::chrono::seconds unreadable_report_interval{1};
  std::chrono::steady_clock::time_point last_unreadable_report_{};  ///< lock holder's
  uint64_t unreported_unreadable_ = 0;  ///< dropped since that warning (lock holder's)
  gauge peak_bytes_held_;
  gauge peak_frames_queued_;                ///< lock holder's
  std::atomic<uint64_t> backlog_waits_{0};  ///< any sender's
  std::atomic<uint64_t> backlog_stalls_{0};  ///< any sender's
  gauge blobs_lent_;
  gauge lent_now_;
  gauge lent_bytes_now_;
  /// Lends of closed connections the lend_keeper holds for this node (it may outlive the node).
  std::shared_ptr<kept_lends> kept_ = std::make_shared<kept_lends>();
  gauge borrowed_;
  gauge borrowed_copied_;
};

}  // namespace comm::actors::detail
