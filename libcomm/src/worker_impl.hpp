// Internal state of workers and endpoints: the protocol layer's core types.
#pragma once

#include <comm/context.hpp>
#include <comm/endpoint.hpp>
#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>
#include <comm/worker.hpp>

#include "request_impl.hpp"
#include "tag_matcher.hpp"

#include <array>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace comm::detail {

/// Transport-level AM ids used by the protocol layer.
enum class proto_id : tl::am_id {
  wireup_request = 1,
  wireup_reply = 2,
  ep_close = 3,
  tag_eager = 4,
  tag_eager_imm = 5,
  tag_eager_first = 6,
  tag_fragment = 7,
  am_single = 8,
  am_first = 9,
  am_fragment = 10,
  rndv_rts = 11,
  rndv_ats = 12,
  rndv_rtr = 13,
  rndv_data = 14,
  rndv_cancel = 15,
  rma_request = 16,
  rma_reply = 17,
  rndv_refuse = 18,
};

/// Wire flag of ActiveMessage.flags: the sender wants a reply endpoint passed to the handler.
inline constexpr uint16_t am_wire_reply_ep = 1u << 0;

/// An unexpected (arrived, not yet matched) tagged message, with its data.
struct unexpected_msg : tag_unexpected {
  bool rndv = false;         ///< a rendezvous announcement: data still at the sender
  endpoint_impl* ep = nullptr; ///< rendezvous: endpoint back to the sender
  /// The endpoint whose limits it counts against (it always counts for the worker's); null once
  /// that endpoint is gone or the user took the message with tag_probe.
  endpoint_impl* from = nullptr;
  uint64_t sreq = 0;         ///< rendezvous: the sender's request id
  uint64_t address = 0;      ///< rendezvous: where the data is
  std::vector<uint8_t> rkey; ///< rendezvous: the sender's packed key
  uint64_t imm = 0;          ///< the sender's immediate value
  size_t length = 0;         ///< total data bytes
  size_t received = 0;       ///< data bytes arrived so far
  uint8_t* data = nullptr;   ///< the data: inline after the descriptor, or `grown`
  uint8_t* grown = nullptr;  ///< a fragmented message's own buffer, grown as fragments arrive
  size_t capacity = 0;       ///< bytes `grown` holds
  int8_t pool_tier = -1;     ///< the worker's pool tier the descriptor came from, or -1
  size_t charged = 0;        ///< bytes counted against the unexpected limits (all of its memory)
};

/// A rendezvous active message waiting for room under the AM receive limits
/// (COMM_AM_RX_MAX_BYTES, COMM_AM_RX_EP_MAX_BYTES): fetched once earlier ones are delivered.
struct deferred_am {
  uint64_t sreq = 0;           ///< the sender's request id
  uint64_t address = 0;        ///< where the data is
  size_t length = 0;           ///< data bytes
  uint16_t am_id = 0;          ///< its id
  uint16_t am_flags = 0;       ///< its wire flags
  std::vector<uint8_t> rkey;   ///< the sender's packed key
  std::vector<uint8_t> header; ///< the user header
  size_t charged = 0;          ///< bytes counted against the unexpected limits while it waits
};

/// A multi-fragment message arriving on an endpoint (fragments of one endpoint arrive in order).
struct rx_fragments {
  bool active = false;              ///< a message is being received
  bool is_tag = true;               ///< tagged message, else active message
  uint64_t msg_id = 0;              ///< its id
  size_t total = 0;                 ///< data bytes of the whole message
  size_t received = 0;              ///< data bytes received so far
  request* recv = nullptr;          ///< matched receive, or
  unexpected_msg* unexpected = nullptr; ///< unexpected descriptor being filled
  // Active messages:
  uint16_t am_id = 0;               ///< its id
  uint16_t am_flags = 0;            ///< its wire flags
  std::vector<uint8_t> am_header;   ///< copy of the user header
  uint8_t* am_buffer = nullptr;     ///< reassembly buffer (whole-message handlers)
};

class worker_impl;

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
  unsigned reads_in_flight = 0;             ///< RMA reads outstanding on the lane

  request* pending_head = nullptr;          ///< sends waiting for resources or wireup, in order
  request* pending_tail = nullptr;
  request* outstanding_head = nullptr;      ///< started requests, completed in this order
  request* outstanding_tail = nullptr;
  /// Our single entry in the transport's pending queue.
  struct resume_entry : tl::pending_req {
    endpoint_impl* ep = nullptr;            ///< the endpoint to resume
  } tl_pending;
  bool tl_pending_queued = false;           ///< tl_pending is queued in the transport

  rx_fragments rx;                          ///< multi-fragment message arriving

  // What the peer makes us hold, against config::limits (limits.cpp).
  size_t unexpected_bytes = 0;              ///< bytes of its unexpected messages
  size_t unexpected_msgs = 0;               ///< their number (deferred AMs included)
  size_t am_rx_bytes = 0;                   ///< bytes held for its AMs before delivery
  size_t control_bytes = 0;                 ///< bytes of control messages queued to it
  std::list<deferred_am> deferred_ams;      ///< its rendezvous AMs waiting for room, in order

  /// Appends `req` to the pending queue (a control message counts in control_bytes).
  void push_pending(request* req);
  /// Frees a control request that left the pending queue (sent or purged).
  void drop_control(request* req);
  /// Frees what the message being reassembled holds (its receive, if matched, is not completed).
  void drop_rx();
  /// Appends `req` to the ordered completion queue.
  void push_outstanding(request* req);
  /// Unlinks `req` from the ordered completion queue (a send canceled by force).
  void remove_outstanding(request* req);
  /// Completes finished requests at the head of the completion queue, in order.
  void complete_in_order();
  /// Retries pending requests until one cannot proceed; true if the queue drained.
  bool dispatch_pending();
  /// Parks the endpoint on the transport's pending queue.
  void wait_for_resources();
  /// Fails the endpoint: every pending and outstanding request completes with `reason`.
  void fail(status reason);
};

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
    uint8_t skip = 0;                       ///< progress calls to skip while idle
    uint8_t backoff = 0;                    ///< current idle backoff
  };
  std::vector<lane_iface> ifaces;           ///< one per enabled transport, in preference order
  int epoll_fd = -1;                        ///< event fd: every interface's event fd

  std::vector<endpoint_impl*> ep_table;     ///< endpoints by id (low bits), or null
  std::vector<uint32_t> free_ep_slots;      ///< free indices of ep_table
  uint32_t ep_generation = 1;               ///< high bits of the next endpoint id
  std::vector<endpoint_impl*> doomed;       ///< endpoints to delete at the next progress
  unsigned progress_depth = 0;              ///< progress() calls under way (nested from callbacks)

  tag_matcher matcher;                      ///< expected and unexpected queues

  struct am_handler {
    am_callback cb = nullptr;
    void* arg = nullptr;
    unsigned flags = 0;
  };
  /// User AM handlers: ids below am_table_size in a flat table, the rest in a map.
  static constexpr uint16_t am_table_size = 256;
  am_handler am_table[am_table_size];
  std::unordered_map<uint16_t, am_handler> am_handlers;
  /// The handler of AM `id`, or null.
  const am_handler* find_am_handler(uint16_t id) const {
    if (id < am_table_size) return am_table[id].cb != nullptr ? &am_table[id] : nullptr;
    auto it = am_handlers.find(id);
    return it == am_handlers.end() ? nullptr : &it->second;
  }
  std::unordered_map<void*, void*> persistent_data;     ///< data given to handlers -> block

  std::vector<void*> unexpected_pool[2];    ///< free unexpected-message blocks, per size tier
  /// Rendezvous AM receive blocks kept for reuse. They come from comm::mem_alloc (shareable, so
  /// an echo of the block is a mapped copy for its next receiver) and go back with comm::mem_free;
  /// keeping a few here saves the shared heap's lock.
  struct large_block {
    void* block = nullptr;
    size_t capacity = 0;
  };
  std::vector<large_block> large_free;      ///< blocks ready for reuse
  std::unordered_map<void*, size_t> large_out; ///< blocks handed out -> capacity
  size_t large_free_bytes = 0;              ///< bytes held by large_free
  /// A block of at least `length` bytes aligned for AM handlers; null without memory.
  uint8_t* take_large(size_t length);
  /// Returns a block from take_large (kept for reuse within bounds, else comm::mem_free) or frees
  /// any other block (aligned_block's, std::free).
  void release_large(void* block);
  std::vector<request*> free_requests;      ///< the request pool
  std::vector<std::unique_ptr<request[]>> request_chunks;

  std::unordered_map<uint64_t, request*> rndv_sends; ///< rendezvous sends awaiting the peer
  std::unordered_map<uint64_t, request*> rndv_recvs; ///< software-rendezvous receives by id
  uint64_t next_rndv_id = 1;                ///< next id in those tables (and rma_ops)
  std::unordered_map<uint64_t, request*> rma_ops;     ///< software RMA awaiting the owner's reply
  std::unordered_map<uint64_t, memh*> sw_regions;     ///< our registrations by software-RMA token
  size_t short_thresh = 0;                  ///< eager short limit (protocol header included)
  size_t max_am_header_ = 0;                ///< largest AM user header (worker::max_am_header)
  size_t zcopy_thresh = 0;                  ///< eager zcopy from this size
  uint64_t protocol_errors = 0;             ///< malformed messages that named no valid endpoint
  /// Ids of the endpoints destroyed last: messages still in flight to them are expected after a
  /// close and dropped quietly (counted in late_messages), not reported as malformed.
  std::array<uint32_t, 64> closed_ids{};
  unsigned closed_next = 0;
  uint64_t late_messages = 0;               ///< messages dropped for a recently closed endpoint

  // -- limits on what peers make us hold (limits.cpp) -------------------------------------------
  size_t unexpected_bytes = 0;              ///< bytes of unexpected messages, every endpoint's
  size_t am_rx_bytes = 0;                   ///< bytes held for AMs before delivery
  size_t peer_eps = 0;                      ///< live endpoints created by peers' wireup requests
  size_t deferred_ams = 0;                  ///< rendezvous AMs waiting for room, all endpoints
  bool starting_deferred = false;           ///< inside start_deferred_ams
  uint64_t limit_errors = 0;                ///< endpoints failed or requests refused for a limit
  /// Counts `bytes` and `msgs` unexpected messages from `ep` (COMM_UNEXPECTED_*); false, with
  /// `ep` failed, when that would pass a limit.
  bool charge_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs);
  /// Undoes charge_unexpected; `ep` may be null (the endpoint is gone).
  void uncharge_unexpected(endpoint_impl* ep, size_t bytes, size_t msgs);
  /// Stops counting `msg` against its endpoint's limits; it still counts for the worker's.
  static void detach_unexpected(unexpected_msg* msg);
  /// The variable of the AM receive limit that `bytes` more from `ep` would pass, or null;
  /// `limit` gets its value.
  const char* am_rx_limit(const endpoint_impl* ep, size_t bytes, size_t* limit) const;
  /// Counts `bytes` held for an AM of `ep`; false, with `ep` failed, past a limit.
  bool charge_am_rx(endpoint_impl* ep, size_t bytes);
  /// Undoes charge_am_rx (or a fetch's count).
  void release_am_rx(endpoint_impl* ep, size_t bytes);
  /// Fails `ep` for passing the limit `variable` = `limit`: counted, logged at warn, its
  /// unexpected messages dropped, the peer told (its endpoint closes).
  void exceed_limit(endpoint_impl* ep, const char* variable, size_t limit);
  /// Fails `ep` if `cost` more bytes of control messages would pass COMM_REPLY_EP_MAX_BYTES.
  bool reply_fits(endpoint_impl* ep, size_t cost);
  /// Releases failed endpoints created by peers; true when another one may be created.
  bool make_room_for_peer_ep();
  /// Answers a wireup request beyond COMM_PEER_EP_MAX with EXCEEDS_LIMIT.
  void refuse_wireup(const std::vector<uint8_t>& address, uint32_t src_ep);
  /// A rendezvous AM from `ep`: fetched now, deferred until it fits, or refused when it never can.
  void on_rndv_am(endpoint_impl* ep, deferred_am&& am);
  /// Refuses a rendezvous AM larger than the limit `variable` = `limit`: the sender's request
  /// completes with EXCEEDS_LIMIT, the endpoint stays up.
  void refuse_am(endpoint_impl* ep, const deferred_am& am, const char* variable, size_t limit);
  /// Allocates the receive buffer of a rendezvous AM and fetches it.
  void fetch_am(endpoint_impl* ep, deferred_am& am);
  /// Fetches deferred rendezvous AMs that fit now, in order per endpoint.
  void start_deferred_ams();

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

  // Long-lived header builders (one per header type, see comm/wire/codec.hpp).
  wire::header_writer<wire::schema::TagEager> hdr_tag;
  wire::header_writer<wire::schema::TagEagerImm> hdr_tag_imm;
  wire::header_writer<wire::schema::TagEagerFirst> hdr_tag_first;
  wire::header_writer<wire::schema::FragmentMiddle> hdr_fragment;
  wire::header_writer<wire::schema::ActiveMessage> hdr_am;
  wire::header_writer<wire::schema::ActiveMessageFirst> hdr_am_first;
  wire::header_writer<wire::schema::EndpointClose> hdr_close;
  wire::header_writer<wire::schema::RndvData> hdr_rndv_data;

  // -- requests --------------------------------------------------------------------------------
  request* alloc_request(request::kind type, const request_params& params);
  void free_request(request* req);
  /// Finishes `req` with `st`: calls its callback and frees it if released.
  void complete(request* req, status st);
  /// Makes an op for a request that is still running.
  op in_progress(request* req);
  /// The op of an operation that completed at once with `st` (a completed request when the
  /// caller asked for request_no_immediate_completion).
  op immediate(const request_params& p, status st);
  /// Receives an unexpected message into `req` (matched by a receive or a probe).
  op receive_unexpected(request* req, unexpected_msg* found);

  // -- endpoints -------------------------------------------------------------------------------
  endpoint_impl* find_ep(uint32_t id) const;
  /// The endpoint a received message is addressed to. Null when the id names no endpoint (a
  /// protocol error: `what` is logged and counted) and, silently, when the endpoint has already
  /// failed: whatever its peer still sends is dropped.
  endpoint_impl* receiving_ep(uint32_t id, const char* what);
  status create_ep(const void* address, size_t length, bool by_peer, endpoint_impl** out);
  /// A new endpoint with an id but no lane yet (client-server connections pick it later).
  status new_ep(bool by_peer, endpoint_impl** out);
  /// Picks and creates the lane to the worker whose packed address is given, in preference
  /// order; unreachable when no transport reaches it, invalid_addr for bad bytes.
  status connect_lane(endpoint_impl* ep, const void* address, size_t length);
  void destroy_ep(endpoint_impl* ep);
  std::vector<uint8_t> packed_address() const;

  // -- receive handlers (one per proto_id) -----------------------------------------------------
  void install_handlers();
  void on_wireup_request(const uint8_t* data, size_t length);
  void on_wireup_reply(const uint8_t* data, size_t length);
  void on_ep_close(const uint8_t* data, size_t length);
  void on_tag_eager(const uint8_t* data, size_t length, bool with_imm);
  void on_tag_eager_first(const uint8_t* data, size_t length);
  void on_fragment(const uint8_t* data, size_t length, bool is_tag);
  void finish_tag_fragments(endpoint_impl* ep);
  void on_am_fragment(endpoint_impl* ep, const uint8_t* data, size_t length);
  void on_am_single(const uint8_t* data, size_t length);
  void on_am_first(const uint8_t* data, size_t length);
  void on_rndv_rts(const uint8_t* data, size_t length);
  void on_rndv_ats(const uint8_t* data, size_t length);
  void on_rndv_rtr(const uint8_t* data, size_t length);
  void on_rndv_data(const uint8_t* data, size_t length);
  void on_rndv_cancel(const uint8_t* data, size_t length);
  void on_rndv_refuse(const uint8_t* data, size_t length);
  void on_rma_request(const uint8_t* data, size_t length);
  void on_rma_reply(const uint8_t* data, size_t length);
  /// Queues a control message with `bytes` on `ep` (sent in order after earlier sends).
  void queue_control(endpoint_impl* ep, proto_id id, std::vector<uint8_t> bytes);
  /// Starts fetching a rendezvous message into the matched receive `req`.
  void start_fetch(request* req, endpoint_impl* ep, uint64_t sreq, uint64_t address,
                   size_t length, const uint8_t* rkey, size_t rkey_length);
  /// Ends a fetch: releases the key, acknowledges the sender, completes the receive.
  void finish_fetch(request* req);
  /// Cancels an announced rendezvous send: the peer drops the announcement if still unmatched.
  status cancel_rndv_send(request* req, cancel_mode mode);
  /// Releases what a rendezvous send holds (table entry, registration).
  void release_rndv_send(request* req);
  /// Drops the rendezvous announcement `sreq` of `ep` (its sender cancelled it).
  void drop_announcement(endpoint_impl* ep, uint64_t sreq);
  /// What forget_unexpected_from does with an endpoint's eager unexpected messages.
  enum class eager_fate {
    keep,    ///< they stay tied to the endpoint (it failed but still exists)
    detach,  ///< they stay receivable, tied to no endpoint (it is going away)
    drop,    ///< they are freed (the peer passed a limit)
  };
  /// Drops every rendezvous announcement and deferred AM of `ep` (their data stays at the peer)
  /// and keeps, detaches or drops its eager messages.
  void forget_unexpected_from(endpoint_impl* ep, eager_fate eager);
  /// Counts and logs malformed input; fails `ep` when it is known.
  void protocol_error(endpoint_impl* ep, const char* what);

  // -- tag matching ----------------------------------------------------------------------------
  /// Delivers `length` bytes at `offset` of a matched receive; returns bytes copied.
  static void copy_to_recv(request* req, size_t offset, const uint8_t* data, size_t length);
  void finish_recv(request* req);
  /// A descriptor for an unexpected message from `ep` with room for `length` data bytes, counted
  /// with `extra` bytes more against the unexpected limits. Null when a limit fails `ep`, or
  /// (logged) without memory.
  unexpected_msg* new_unexpected(endpoint_impl* ep, tag_t tag, uint64_t imm, size_t length,
                                 size_t extra = 0);
  void free_unexpected(unexpected_msg* msg);
  /// Makes room for `needed` bytes in a fragmented unexpected message (doubling, so a header
  /// that announces a huge message costs nothing until its data arrives); false when a limit
  /// failed its endpoint, or without memory.
  bool reserve_unexpected(unexpected_msg* msg, size_t needed);
  /// After new_unexpected or reserve_unexpected said no for a fragmented message of `ep`: fails
  /// `ep` for lack of memory unless a limit failed it already.
  void out_of_room(endpoint_impl* ep);

  // -- active messages -------------------------------------------------------------------------
  void deliver_am(endpoint_impl* ep, uint16_t id, uint16_t wire_flags, const uint8_t* header,
                  size_t header_length, uint8_t* data, size_t length, unsigned attr,
                  size_t offset, size_t total, uint64_t msg_id, bool data_is_ours);

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

/// The worker_impl behind a public worker.
inline worker_impl& impl(worker& w) { return static_cast<worker_impl&>(w); }
inline const worker_impl& impl(const worker& w) { return static_cast<const worker_impl&>(w); }
/// The endpoint_impl behind a public endpoint.
inline endpoint_impl& impl(endpoint& e) { return static_cast<endpoint_impl&>(e); }
inline const endpoint_impl& impl(const endpoint& e) { return static_cast<const endpoint_impl&>(e); }

// -- send protocols (tag.cpp, am.cpp) ----------------------------------------------------------

/// Sends as much of `req` as the transport takes; ok when all of it went out, no_resource when it
/// must wait, or an error.
status progress_send(request* req);

/// Tells the peer of `ep` that it is closing; ok, no_resource or an error.
status send_close_notice(endpoint_impl* ep);

/// Starts a send request: sends what can go now, queues the rest, and returns its op.
op start_send(endpoint_impl& ep, request* req);

/// Rendezvous send steps (rndv.cpp): announce, then push data for a software rendezvous.
status send_rndv(request* req);

/// RMA steps (rma.cpp).
status send_rma(request* req);

/// Called when the transport completes a zcopy, get or flush of `req`.
void on_zcopy_done(tl::completion* comp);


}  // namespace comm::detail
