// Internal state of workers and endpoints: what the worker owns and the services it gives the
// protocol modules (protocol.hpp says how the layer is divided).
#pragma once

#include <comm/context.hpp>
#include <comm/endpoint.hpp>
#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>
#include <comm/worker.hpp>

#include "placement.hpp"
#include "protocol.hpp"
#include "request_impl.hpp"
#include "tag_matcher.hpp"

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace comm::detail {

/// The multi-fragment message arriving on an endpoint. Fragments of one endpoint arrive in
/// order, one message at a time, whichever module sends them; the module keeps what it
/// reassembles in its own endpoint state (send.hpp checks each fragment).
struct rx_message {
  const protocol* owner = nullptr;  ///< the module receiving it; null while none is under way
  uint64_t msg_id = 0;              ///< its id
  size_t total = 0;                 ///< data bytes of the whole message
  size_t received = 0;              ///< data bytes received so far
};

class worker_impl;
struct peer_address;

/// The library's side of the owning handles (endpoint_ptr, memh_ptr, rkey_ptr): empties a handle
/// whose object the worker releases first.
struct handle_access {
  /// `h` no longer holds its endpoint.
  static void empty(endpoint_ptr& h) noexcept { h.ep_ = nullptr; }
  /// `h` no longer holds its registration.
  static void empty(memh_ptr& h) noexcept { h.h_ = nullptr; }
  /// `h` no longer holds its key.
  static void empty(rkey_ptr& h) noexcept { h.k_ = nullptr; }
};

/// An endpoint's state. `id` indexes the worker's endpoint table (with a generation in the high
/// bits), `remote_id` is the peer's endpoint for the same connection.
class endpoint_impl final : public endpoint {
public:
  /// Connection state.
  enum class phase : uint8_t { wireup, connected, closing, failed };

  endpoint_impl(worker_impl& owner, uint32_t id, bool created_by_peer);
  ~endpoint_impl();

  /// Gives the endpoint its transport lane and derives the protocol thresholds from it.
  void attach_lane(std::unique_ptr<tl::ep> lane, tl::iface* lane_iface);

  worker_impl& owner;                       ///< the worker
  uint32_t id;                              ///< our id, sent to the peer
  uint32_t remote_id = 0;                   ///< the peer's id, used as dstEp
  phase state = phase::wireup;              ///< connection state
  status failure = status::ok;              ///< why the endpoint failed
  bool created_by_peer;                     ///< made on a wireup request (freed on peer close)
  std::unique_ptr<tl::ep> lane;             ///< transport endpoint (null until chosen)
  tl::iface* lane_iface = nullptr;          ///< its interface
  const tl::iface_attr* lane_attr = nullptr; ///< its capabilities
  tl::cm_conn* cm_conn = nullptr;           ///< client-server handshake under way
  connect_callback on_connect = nullptr;    ///< told once the handshake completes
  void* connect_arg = nullptr;              ///< passed to on_connect
  uint64_t peer_uid_ = 0;                   ///< peer worker uid
  std::string peer_name_;                   ///< peer worker name
  endpoint_counters counters_;              ///< counters
  endpoint_error_callback error_cb = nullptr; ///< user error handler
  void* error_arg = nullptr;                ///< its argument
  uint64_t next_msg_id = 1;                 ///< id of the next multi-fragment message
  size_t short_limit = 0;                   ///< largest eager-short message, header included
  size_t rndv_thresh = 0;                   ///< messages at least this large use rendezvous
  /// Tagged messages shorter than this whose buffer the peer does not map go by copies, also in
  /// the zcopy and rendezvous ranges (the latter within the peer's eager window): the lane's
  /// iface_attr::copies_preferred_below while COMM_ZCOPY_THRESH and COMM_RNDV_THRESH are at their
  /// defaults, else 0.
  size_t copies_below = 0;
  // The eager window (config::limits::eager_window_ep_bytes; tag.hpp).
  size_t eager_window = 0;                  ///< the peer's window (0: none, no large copies)
  size_t eager_credit = 0;                  ///< of it, bytes we may send now
  size_t eager_held = 0;                    ///< receiver: the peer's bytes not given back yet
  size_t eager_freed = 0;                   ///< of those, bytes receives took (to give back)
  uint64_t eager_copies = 0;                ///< large eager copies sent
  uint64_t eager_window_full = 0;           ///< sends that went by rendezvous: window too full
  bool close_notice_sent = false;           ///< our close notice went: nothing more is sent
  endpoint_ptr* handle = nullptr;           ///< the user's owning handle, emptied at deletion
  bool peer_closed_too = false;             ///< the peer's close notice crossed our close

  request* pending_head = nullptr;          ///< sends waiting for resources or wireup, in order
  request* pending_tail = nullptr;
  request* fence_req = nullptr;             ///< the fence that later sends wait behind, if any
  request* held_head = nullptr;             ///< sends issued after it, in order (and fences)
  request* held_tail = nullptr;
  request* outstanding_head = nullptr;      ///< started requests, completed in this order
  request* outstanding_tail = nullptr;
  /// Our single entry in the transport's pending queue.
  struct resume_entry : tl::pending_req {
    endpoint_impl* ep = nullptr;            ///< the endpoint to resume
  } tl_pending;
  bool tl_pending_queued = false;           ///< tl_pending is queued in the transport

  rx_message rx;                            ///< multi-fragment message arriving
  /// Each module's state on this endpoint, by module index (protocol::state_of).
  std::array<std::unique_ptr<endpoint_state>, max_protocols> module_state;

  // What the peer makes us hold, against config::limits (limits.cpp).
  size_t unexpected_bytes = 0;              ///< bytes of its unexpected messages
  size_t unexpected_msgs = 0;               ///< their number (deferred AMs included)
  size_t am_rx_bytes = 0;                   ///< bytes held for its AMs before delivery
  size_t control_bytes = 0;                 ///< bytes of control messages queued to it

  std::string lane_choice;                  ///< which lane was chosen and why (info)
  uint32_t peer_iface = 0;                  ///< the peer's interface the lane reaches (its
                                            ///< position in the peer's address)

  /// Appends `req` to the pending queue (a control message counts in control_bytes).
  void push_pending(request* req);
  /// Frees a control request that left the pending queue (sent or purged).
  void drop_control(request* req);
  /// Appends `req` to the ordered completion queue.
  void push_outstanding(request* req);
  /// Unlinks `req` from the ordered completion queue (a send canceled by force).
  void remove_outstanding(request* req);
  /// Cancels a send that has not reached the transport: it leaves the pending queue and is freed
  /// (force) or completes with canceled after the sends before it (report); busy once it started.
  status cancel_pending(request* req, cancel_mode mode);
  /// Completes finished requests at the head of the completion queue, in order.
  void complete_in_order();
  /// Retries pending requests until one cannot proceed; true if the queue drained.
  bool dispatch_pending();
  /// Retries the pending queue if it waits and nothing else will retry it (an RMA reply or a get
  /// completion freed room).
  void resume_pending();
  /// Parks the endpoint on the transport's pending queue.
  void wait_for_resources();
  /// Fails the endpoint: every pending and outstanding request completes with `reason`, and every
  /// module finishes what it holds for the peer.
  void fail(status reason);

  // -- fence --------------------------------------------------------------------------------------
  /// Fences the endpoint (worker::fence): sends issued from now on are held until everything
  /// outstanding now completed. Messages the protocols send for requests issued before (control
  /// messages, a rendezvous's data) are not held.
  void push_fence();
  /// Holds `req`, a send issued while a fence waits, behind it (start_send).
  op hold_behind_fence(request* req);
  /// Releases what the fence at the head of the completion queue held (complete_in_order).
  void pass_fence();
  /// Takes a held `req` out of the held queue; false if it is not there (cancel).
  bool unhold(request* req);
  /// Forgets the fence and what it holds, which stay in the completion queue (failure).
  void drop_fence() {
    fence_req = nullptr;
    held_head = held_tail = nullptr;
  }
  /// The peer's close notice arrived: the endpoint fails with not_connected, except that a close
  /// of ours under way ends well (both sides closed).
  void peer_closed();
  /// True while a module has an operation on this endpoint a close must wait for
  /// (protocol::busy_on).
  bool modules_busy() const;
  /// A close whose flush completed after everything before it: queues it again to send the close
  /// notice, then flush that (send.cpp's close_ops).
  void send_close_notice_of(request* close);
};

/// Transport entries a worker address may hold: the interfaces a worker opens, and what a peer's
/// address may list. It bounds the lanes tried per connection (ours times its entries), so a
/// forged address cannot make a worker try thousands of connections.
inline constexpr size_t max_address_entries = 128;

/// The worker's state.
class worker_impl final : public worker {
public:
  worker_impl(context& ctx, const worker_params& params);
  ~worker_impl() noexcept override;

  context& ctx;                             ///< the context
  worker_params params;                     ///< creation parameters
  uint64_t uid_;                            ///< unique id
  std::recursive_mutex lock;                ///< taken in thread_mode::multi

  struct lane_iface {
    tl::component* component;               ///< the transport
    std::unique_ptr<tl::iface> iface;       ///< its interface
    bool costly = false;                    ///< progress() makes a system call
    /// Polled with the idle backoff: costly, or no endpoint of ours has a lane on it (what
    /// arrives then is a peer's first message, which resets the backoff).
    bool throttled = false;
    uint8_t skip = 0;                       ///< progress calls to skip while idle
    uint8_t backoff = 0;                    ///< current idle backoff
    uint32_t endpoints = 0;                 ///< our endpoints whose lane is on it
    std::string device;                     ///< the device it is open on
  };
  /// One per device of each enabled transport: transports in registration order, each one's
  /// devices nearest to params.cpus first.
  std::vector<lane_iface> ifaces;
  /// Counts an endpoint's lane on `iface` (+1 when attached, -1 when it goes): an interface
  /// without endpoints is polled with the idle backoff.
  void count_lane(const tl::iface* iface, int change);

  // -- wakeup (worker.cpp) ----------------------------------------------------------------------
  int epoll_fd = -1;                        ///< the event set: ours, or the user's (external)
  bool external_set = false;                ///< epoll_fd is worker_params::event_fd
  int signal_fd = -1;                       ///< eventfd written by worker::signal
  std::vector<int> watched;                 ///< fds we added to epoll_fd
  unsigned events_seen = 0;                 ///< wakeup_event kinds since wait() began
  status init_status = status::ok;          ///< what went wrong in the constructor
  /// Makes or takes the event set and the signal fd; invalid_param for a bad external set.
  status open_wakeup();
  /// Removes our fds from the event set, closes the signal fd and our own set.
  void close_wakeup();
  /// Adds `fd` to the event set with `tag` as its data (user_data in an external set).
  bool watch(int fd, uint64_t tag);
  /// Removes `fd` from the event set.
  void unwatch(int fd);
  /// Consumes the signals sent so far; true if there was one.
  bool take_signal();
  /// Arms every interface's event fd: ok, busy (events pending) or an error.
  status arm_ifaces();
  /// Sleeps on the event set up to `timeout_ms` (negative: no limit) and marks the sources that
  /// woke it (wake_source); returns what epoll_wait or poll returned.
  int sleep_on_events(int timeout_ms);
  /// The source with epoll data `tag` woke the worker: it is polled at the next progress.
  void wake_source(uint64_t tag);
  /// True when what happened since wait() began ends it (worker_params::events).
  bool wait_is_over();
  /// Records that events of the wakeup_event `kinds` happened (wait() checks them).
  void note_events(unsigned kinds) { events_seen |= kinds; }
  /// Warns about requests the user never released (destruction).
  void report_leaked_requests();

  std::vector<endpoint_impl*> ep_table;     ///< endpoints by id (low bits), or null
  std::vector<uint32_t> free_ep_slots;      ///< free indices of ep_table
  uint32_t ep_generation = 1;               ///< high bits of the next endpoint id
  std::vector<endpoint_impl*> doomed;       ///< endpoints to delete at the next progress
  unsigned progress_depth = 0;              ///< progress() calls under way (nested from callbacks)

  tag_matcher matcher;                      ///< expected and unexpected queues

  // -- protocol modules (protocols.cpp) ---------------------------------------------------------
  /// The modules, in protocols.hpp's order (module_of<P> finds one).
  std::array<std::unique_ptr<protocol>, max_protocols> protocols;
  size_t protocol_count = 0;                ///< modules in `protocols`
  uint32_t progress_wanted = 0;             ///< modules that asked for progress(), by index bit
  /// The receive handler of one wire id.
  struct receiver {
    tl::am_handler_fn fn = nullptr;         ///< the module's trampoline
    void* arg = nullptr;                    ///< the module, or `direct` (per_iface)
    bool per_iface = false;                 ///< fn takes a desc_source per interface
    desc_source direct;                     ///< per_iface: the module, no interface (deliver)
  };
  std::array<receiver, tl::am_id_count> receivers{}; ///< by wire id
  /// The desc_source of each per_iface receiver on each interface (install_handlers).
  std::vector<std::unique_ptr<desc_source>> desc_sources;
  /// Makes the modules (protocols.cpp).
  void make_protocols();
  /// Registers a module's handler for wire id `id` (per_iface: protocol::receive_desc); a second
  /// handler for one id is a programming error (logged, then abort).
  void add_receiver(tl::am_id id, tl::am_handler_fn fn, void* arg, const protocol& owner,
                    bool per_iface = false);
  /// Installs the registered handlers (and the error handler) on every interface.
  void install_handlers();
  /// Hands `data` to the handler of wire id `id` as a transport would (tests, tools).
  void deliver(tl::am_id id, const uint8_t* data, size_t length);
  /// The wire ids that have a handler, in increasing order.
  std::vector<tl::am_id> wire_ids() const;
  /// Runs the progress() of the modules that asked for it.
  void progress_modules();
  /// Every module's forget_peer(ep, fate), in order.
  void forget_peer(endpoint_impl& ep, held_fate fate);

  // -- requests --------------------------------------------------------------------------------
  std::vector<request*> free_requests;      ///< the request pool
  std::vector<std::unique_ptr<request[]>> request_chunks; ///< of request_chunk_size each
  static constexpr size_t request_chunk_size = 64;       ///< requests the pool grows by
  /// A request of the kind `ops` describes (role `type`), from the pool; its state is set by the
  /// module (request::init).
  request* alloc_request(const request_ops& ops, const request_params& params,
                         request::role type = request::role::operation);
  /// Returns `req` to the pool: destroys a completion callable it still holds, and empties the
  /// operation that owned it (which keeps the final status, or canceled if it never finished).
  void free_request(request* req);
  /// Releases `req` for its operation that goes away (UCX's request_free): freed if finished,
  /// else it completes without notifying anyone and is freed then; its callable goes now.
  void release_quietly(request* req);
  /// Worker teardown: empties every operation object still owning one of our requests.
  void detach_operations();
  /// Finishes `req` with `st`: releases what its module holds for it, tells the user, and frees
  /// it unless the user holds it.
  void complete(request* req, status st);
  /// Makes an op for a request that is still running.
  op in_progress(request* req) {
    req->user_visible = true;
    return op{status::in_progress, req};
  }
  /// The op of an operation that completed at once with `st` (a completed request when the
  /// caller asked for request_no_immediate_completion).
  op immediate(const request_params& p, status st);

  size_t short_thresh = 0;                  ///< eager short limit (protocol header included)
  size_t zcopy_thresh = 0;                  ///< eager zcopy from this size

  // -- malformed and late input ----------------------------------------------------------------
  uint64_t protocol_errors = 0;             ///< malformed messages that named no valid endpoint
  /// Ids of the endpoints destroyed last: messages still in flight to them are expected after a
  /// close and dropped quietly (counted in late_messages), not reported as malformed.
  std::array<uint32_t, 64> closed_ids{};
  unsigned closed_next = 0;
  uint64_t late_messages = 0;               ///< messages dropped for a recently closed endpoint
  /// Counts and logs malformed input; fails `ep` when it is known.
  void protocol_error(endpoint_impl* ep, const char* what);

  // -- limits on what peers make us hold (limits.cpp) -------------------------------------------
  size_t unexpected_bytes = 0;              ///< bytes of unexpected messages, every endpoint's
  size_t am_rx_bytes = 0;                   ///< bytes held for AMs before delivery
  size_t peer_eps = 0;                      ///< live endpoints created by peers' wireup requests
  uint64_t limit_errors = 0;                ///< endpoints failed or requests refused for a limit
  worker_placement placement;               ///< where params.cpus puts the worker's resources
  /// Counts `bytes` and `msgs` unexpected messages from `ep` (COMM_UNEXPECTED_*); false, with
  /// `ep` failed, when that would pass a limit.
  bool charge_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs);
  /// Undoes charge_unexpected; `ep` may be null (the endpoint is gone).
  void uncharge_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs);
  /// Stops counting `bytes` and `msgs` against the limits of `ep`; they still count for the
  /// worker's (the user or the worker holds them now, not the peer).
  static void detach_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs);
  /// The variable of the AM receive limit that `bytes` more from `ep` would pass, or null;
  /// `limit` gets its value.
  const char* am_rx_limit(const endpoint_impl* ep, size_t bytes, size_t* limit) const;
  /// Counts `bytes` held for an AM of `ep`; false, with `ep` failed, past a limit.
  bool charge_am_rx(endpoint_impl* ep, size_t bytes);
  /// Undoes charge_am_rx (or a fetch's count).
  void release_am_rx(endpoint_impl* ep, size_t bytes);
  /// Fails `ep` for passing the limit `variable` = `limit`: counted, logged at warn, what its peer
  /// sent dropped, the peer told (its endpoint closes).
  void exceed_limit(endpoint_impl* ep, const char* variable, size_t limit);
  /// Counts one more limit error (limit_errors); true when it should be logged: the first ones,
  /// then every power of two, so that a hostile peer cannot flood the log.
  bool count_limit_error();
  /// Fails `ep` if `cost` more bytes of control messages would pass COMM_REPLY_EP_MAX_BYTES.
  bool reply_fits(endpoint_impl* ep, size_t cost);
  /// Releases failed endpoints created by peers; true when another one may be created.
  bool make_room_for_peer_ep();

  // -- endpoints (address.cpp) -----------------------------------------------------------------
  /// The endpoint with id `id`, or null. Inline: every received message looks one up.
  endpoint_impl* find_ep(uint32_t id) const {
    const uint32_t index = id & 0xFFFFFu;
    if (index >= ep_table.size()) return nullptr;
    endpoint_impl* ep = ep_table[index];
    return (ep != nullptr && ep->id == id) ? ep : nullptr;
  }
  /// The endpoint a received message is addressed to. Null when the id names no endpoint (a
  /// protocol error: `what` is logged and counted) and, silently, when the endpoint has already
  /// failed: whatever its peer still sends is dropped.
  endpoint_impl* receiving_ep(uint32_t id, const char* what) {
    endpoint_impl* ep = find_ep(id);
    if (ep == nullptr) [[unlikely]] return unknown_receiving_ep(id, what);
    return ep->state == endpoint_impl::phase::failed ? nullptr : ep;
  }
  /// receiving_ep's answer for an id that names no endpoint: a late message for a closed one
  /// (dropped, counted) or a protocol error.
  endpoint_impl* unknown_receiving_ep(uint32_t id, const char* what);
  status create_ep(const void* address, size_t length, bool by_peer, endpoint_impl** out);
  /// A new endpoint with an id but no lane yet (client-server connections pick it later).
  status new_ep(bool by_peer, endpoint_impl** out);
  /// Our interfaces that reach the peer, paired with its address entries, best first
  /// (placement.hpp: better_lane).
  std::vector<lane_candidate> lane_candidates(const peer_address& peer) const;
  /// Creates the lane to the worker whose packed address is given: the best candidate that can be
  /// created (ep->lane_choice says which and why); unreachable when no transport reaches it,
  /// invalid_addr for bad bytes.
  status connect_lane(endpoint_impl* ep, const void* address, size_t length);
  void destroy_ep(endpoint_impl* ep);
  std::vector<uint8_t> packed_address(unsigned flags = 0) const;
  /// RDMA reads a peer may have outstanding per endpoint on an interface with `attr`
  /// (advertised in our address).
  uint32_t reads_accepted(const tl::iface_attr& attr) const;
  /// Bytes of large eager copies a peer may have outstanding per endpoint (advertised in our
  /// address): config::limits::eager_window_ep_bytes, lowered to half of the unexpected limits.
  size_t eager_window_accepted() const;

  // -- control messages and the send engine (send.cpp) -----------------------------------------
  /// Queues a control message with `bytes` and wire id `id` on `ep` (sent in order after earlier
  /// sends), within COMM_REPLY_EP_MAX_BYTES.
  void queue_control(endpoint_impl* ep, tl::am_id id, std::vector<uint8_t> bytes);
  /// Sends the `length` bytes of a control message at `bytes` with wire id `id` on `ep`: straight
  /// to the transport as one short message when nothing waits before it and the transport takes
  /// it (no request, no copy), else queued as queue_control does.
  void send_control(endpoint_impl* ep, tl::am_id id, const void* bytes, size_t length);
  /// Long-lived header builders of the send engine (see comm/wire/codec.hpp).
  wire::header_writer<wire::schema::FragmentMiddle> hdr_fragment;
  wire::header_writer<wire::schema::EndpointClose> hdr_close;

  // -- client-server (listener.cpp) -------------------------------------------------------------
  std::unique_ptr<tl::cm_handler> cm_events; ///< receives the connection manager's events
  std::unique_ptr<tl::cm> cm;               ///< connection manager, opened on first use
  uint8_t cm_skip = 0;                      ///< progress calls to skip while it is idle
  uint8_t cm_backoff = 0;                   ///< current idle backoff
  std::vector<listener*> listeners;          ///< listeners of this worker (listener_impl)
  /// Opens the connection manager if needed; unsupported when no transport has one.
  status open_cm();
  /// Progresses the connection manager, less often while it is idle: on the hot path this is a
  /// test and a decrement.
  unsigned progress_cm() {
    if (!cm) return 0;
    if (cm_skip != 0) {
      --cm_skip;
      return 0;
    }
    return poll_cm();
  }
  /// One connection manager poll; sets the idle backoff.
  unsigned poll_cm();
  /// Closes listeners and the connection manager (worker teardown).
  void close_cm();

  /// Takes the lock in thread_mode::multi.
  struct guard {
    explicit guard(worker_impl& w) : w_(w.params.mode == thread_mode::multi ? &w : nullptr) {
      if (w_) w_->lock.lock();
    }
    ~guard() {
      if (w_) w_->lock.unlock();
    }
    worker_impl* w_;
  };
};

/// True for the epoll data of the connection manager's fd in a worker's event set.
bool is_cm_event(uint64_t tag);
/// Name of a thread mode, for info().
const char* mode_name(thread_mode mode);

/// The worker_impl behind a public worker.
inline worker_impl& impl(worker& w) { return static_cast<worker_impl&>(w); }
inline const worker_impl& impl(const worker& w) { return static_cast<const worker_impl&>(w); }
/// The endpoint_impl behind a public endpoint.
inline endpoint_impl& impl(endpoint& e) { return static_cast<endpoint_impl&>(e); }
inline const endpoint_impl& impl(const endpoint& e) { return static_cast<const endpoint_impl&>(e); }

/// Starts a send request on `ep`: sends what can go now, queues the rest, and returns its op
/// (endpoint.cpp).
op start_send(endpoint_impl& ep, request* req);

// -- protocol templates that need the endpoint ---------------------------------------------------

template <class S>
S& protocol::state_of(endpoint_impl& ep) {
  std::unique_ptr<endpoint_state>& slot = ep.module_state[index_];
  if (!slot) slot = std::make_unique<S>();
  return static_cast<S&>(*slot);
}

template <class S>
S* protocol::find_state(const endpoint_impl& ep) const {
  return static_cast<S*>(ep.module_state[index_].get());
}

}  // namespace comm::detail
