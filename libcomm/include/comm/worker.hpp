// The worker: libcomm's progress engine (ucp_worker).
#pragma once

#include <comm/am.hpp>
#include <comm/bytes.hpp>
#include <comm/callback.hpp>
#include <comm/endpoint.hpp>
#include <comm/flags.hpp>
#include <comm/listener.hpp>
#include <comm/memory.hpp>
#include <comm/operation.hpp>
#include <comm/result.hpp>
#include <comm/types.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace comm {

class context;

/// Thread safety of a worker (ucs_thread_mode_t). In every mode worker::signal may be called
/// from any thread at any time.
enum class thread_mode {
  /// One thread uses the worker (it may be created on another, before that thread starts). No
  /// lock is taken.
  single,
  /// Several threads use the worker, never two at once: the user serialises the calls (a mutex,
  /// a hand-off) and that ordering is what makes one thread's effects visible to the next. No
  /// lock is taken; the worker keeps no per-thread state. Callbacks run on the calling thread.
  serialized,
  /// Any thread may call any function at any time: each call takes the worker's lock.
  multi,
};

// -- wakeup (worker::signal, arm, wait) -----------------------------------------------------------

/// Kinds of event that end a worker::wait (ucp_wakeup_event_t), for worker_params::events. The
/// event fd cannot be narrowed by kind (each transport has one event source for all its
/// traffic): it may become readable for an event outside the mask, and the user who polls it
/// calls progress() and arm() again. A signal, a connection request to a listener and an
/// endpoint failure end a wait whatever the mask.
enum wakeup_event : unsigned {
  wakeup_rma = 1u << 0,       ///< a put or get of this worker completed
  wakeup_tag_send = 1u << 2,  ///< a tagged send completed
  /// A tagged receive completed, or a tagged message arrived that no receive was posted for.
  wakeup_tag_recv = 1u << 3,
  wakeup_am = 1u << 4,        ///< an active message reached its handler, or its data a receive
  /// A send-side operation completed: any send, put, get, endpoint flush or close.
  wakeup_tx = 1u << 10,
  /// Something arrived for the user: a receive completed, an unexpected tagged message, an
  /// active message.
  wakeup_rx = 1u << 11,
  /// Every kind (the default).
  wakeup_all = wakeup_rma | wakeup_tag_send | wakeup_tag_recv | wakeup_am | wakeup_tx | wakeup_rx,
};

/// Flags of worker_params::flags (ucp_worker_flags_t).
enum worker_flags : uint64_t {
  /// No warning at destruction for requests the user never released (they are freed anyway).
  worker_ignore_request_leak = 1u << 0,
};

/// Flags of worker::address (ucp_worker_address_flags_t).
enum address_flags : unsigned {
  /// Only the network transports (not self or shm, which reach this machine alone): for a peer
  /// that is known to run elsewhere, or to force a network lane between workers of one machine.
  address_net_only = 1u << 0,
};

/// Parameters of worker::create (ucp_worker_params_t).
struct worker_params {
  thread_mode mode = thread_mode::single;  ///< thread safety
  /// Cores (OS indices) the worker is used from, as UCX's cpu_mask: its resources are placed
  /// for them (shared-memory segments on their NUMA nodes, network devices nearest them tried
  /// first; info() shows the outcome). No thread is pinned: a caller that wants pinning pins its
  /// own threads. Empty: no placement.
  std::vector<int> cpus;
  /// Name shown in logs, info() and the worker's address. Default: "<host>:<pid>:<n>", n
  /// counting the workers this process made, so that no two workers of a process share one.
  std::string name;
  size_t am_alignment = 1;                 ///< alignment of AM data passed to handlers
  uint64_t client_id = 0;                  ///< sent to servers on connection
  bool wakeup = true;                      ///< provide event_fd/arm/wait/signal

  // -- wakeup --
  /// wakeup_event kinds that end wait(); see wakeup_event.
  unsigned events = wakeup_all;
  /// An epoll set of the user's (epoll_create1) that the worker adds its event sources to instead
  /// of making its own (its interfaces, its signal, its connection manager), each with
  /// `user_data` as the event's data.ptr, and removes them from at destruction. event_fd() is
  /// then -1; arm(), wait() and signal() work as usual, except that wait() only polls the set
  /// for readability (the events of the user's own sources stay the user's) and returns ok when
  /// the set is readable for a source of the user's. -1: the worker's own set.
  int event_fd = -1;
  /// The user's pointer: worker::user_data(), and the epoll data of the worker's sources in an
  /// external event_fd.
  void* user_data = nullptr;
  uint64_t flags = 0;                      ///< worker_flags
};

/// What a packed worker address says (ucp_worker_address_attr_t).
struct worker_address_attr {
  uint64_t uid = 0;                     ///< unique id of the worker
  std::string name;                     ///< its name
  uint64_t client_id = 0;               ///< its client id
  std::vector<std::string> transports;  ///< transports it can be reached on, each named once
};

/// An endpoint whose byte stream has data ready (worker::stream_poll).
struct stream_poll_entry {
  endpoint* ep = nullptr;  ///< the endpoint
  size_t length = 0;       ///< stream bytes buffered on it, ready to be received
};

/// A message found by tag_probe with remove, received later with tag_recv_message.
class message;

/// A worker: owns one interface per enabled transport, endpoints, the tag matching queues, AM
/// handlers and requests, and progresses them all. Not thread-safe unless thread_mode::multi
/// (see thread_mode; signal() is safe from any thread).
///
/// Its operations come in the two forms endpoint describes: the C++ face (result<T>, owning
/// handles and operations, spans, scoped flags, capturing completions) and the low-level form
/// (out-parameters, `op` released by hand, C callbacks).
///
/// What peers can make a worker hold is bounded by config::limits (unexpected messages, active
/// messages before delivery, replies a peer does not take, endpoints peers create); a peer that
/// passes one fails the endpoint it came through with exceeds_limit.
class worker {
public:
  /// Creates a worker on `ctx`, which must outlive it. Errors: invalid_param when event_fd is
  /// neither -1 nor an epoll set that takes the worker's sources; no_resource when, with wakeup,
  /// its event set or signal fd cannot be made (out of file descriptors).
  static result<std::unique_ptr<worker>> create(context& ctx, const worker_params& params = {});
  /// The low-level form of create, into `out` (null on error), for code ported from UCX.
  static status create(context& ctx, const worker_params& params, std::unique_ptr<worker>* out);
  /// Destroys the worker. Its endpoints fail (canceled) and close, operations still running
  /// complete (canceled: their completions run), and registrations still mapped are unmapped.
  /// What the C++ face's owners hold becomes empty: each comm::operation is done with its final
  /// status, each endpoint_ptr, memh_ptr and rkey_ptr holds nothing, and destroying them later
  /// touches nothing. Requests of the low-level API the user never released are freed, with one
  /// warning on stderr naming how many of each kind (the first few workers of a process, then
  /// every power of two), unless worker_ignore_request_leak is set.
  virtual ~worker() = default;

  // -- query -------------------------------------------------------------------------------------

  /// Thread mode in force.
  thread_mode mode() const noexcept;
  /// Name of the worker.
  const std::string& name() const noexcept;
  /// Unique id of the worker.
  uint64_t uid() const noexcept;
  /// Client id the worker was created with.
  uint64_t client_id() const noexcept;
  /// worker_params::user_data.
  void* user_data() const noexcept;
  /// wakeup_event kinds that end wait().
  unsigned wakeup_events() const noexcept;
  /// Largest user header of an active message.
  size_t max_am_header() const noexcept;
  /// The packed address of this worker, to give to peers (ucp_worker_get_address; the vector's
  /// destruction is the release). `flags` (address_flags) narrow what it offers.
  std::vector<uint8_t> address(unsigned flags = 0) const;
  /// The alignment (a power of two, in bytes) at which the buffers of sends, receives, puts and
  /// gets move best (DAT's optimal buffer alignment): the cache line of this machine, on which
  /// copies and the transports' transfers never split a line at either end.
  size_t optimal_alignment() const noexcept;
  /// Decodes a packed worker address; invalid bytes give status::invalid_addr.
  static status query_address(const void* address, size_t length, worker_address_attr* out);

  // -- C++ face (see endpoint for the conventions) -----------------------------------------------

  /// Creates an endpoint to the worker whose packed address is given (see the low-level
  /// connect). Errors: unreachable, invalid_addr.
  result<endpoint_ptr> connect(const std::vector<uint8_t>& peer_address);
  /// Connects to a listener at "host:port" (see the low-level connect): the endpoint comes at
  /// once, its sends wait for the server's answer. Error: invalid_addr, busy.
  result<endpoint_ptr> connect(const std::string& address, const endpoint_params& params = {});
  /// Accepts a connection request on this worker (see the low-level accept). Error: unreachable.
  result<endpoint_ptr> accept(conn_request* request, const endpoint_params& params = {});
  /// Listens on params.address (see the low-level listen). Errors: invalid_addr, busy.
  result<std::unique_ptr<listener>> listen(const listener_params& params);

  /// Registers `region` with the rights `access` (mem_access flags; see the low-level mem_map).
  /// Errors: invalid_param for an empty region or unknown flags, or the transport's error.
  result<memh_ptr> mem_map(mutable_bytes region, uint32_t access = mem_access_all);
  /// The packed remote key of `handle`, for a peer's endpoint::rkey_unpack (see the low-level
  /// rkey_pack). Error: privileges_violation for a region without remote rights.
  result<std::vector<uint8_t>> rkey_pack(const memh& handle) const;

  /// Posts a receive into `buffer` for a message whose tag matches `tag` under `mask` (see the
  /// low-level tag_recv). `on_done` is told ok, message_truncated or canceled with what arrived,
  /// inside this call when the message was here already.
  operation tag_recv(mutable_bytes buffer, tag_t tag, tag_t mask,
                     tag_recv_completion on_done = {});
  /// Posts a receive into `entries`, filled in order (see tag_recv).
  operation tag_recv_iov(std::span<const iov_entry> entries, tag_t tag, tag_t mask,
                         tag_recv_completion on_done = {});
  /// Receives a message taken by tag_probe into `buffer` (see tag_recv).
  operation tag_recv_message(message* msg, mutable_bytes buffer,
                             tag_recv_completion on_done = {});

  /// Installs the handler of AM `id` with scoped flags (see the low-level set_am_handler).
  status set_am_handler(uint16_t id, am_callback cb, void* arg, am_handler_flags flags);
  /// Receives the message of `desc` (a rendezvous descriptor or kept data, see the low-level
  /// am_recv_data) into `buffer`. `on_done` is told the outcome and the bytes written, inside
  /// this call when that is known at once.
  operation am_recv_data(void* desc, mutable_bytes buffer, length_completion on_done = {});

  /// Completes once every operation started on every endpoint has completed; `on_done` is told.
  /// (flush() without a completion is the low-level form; comm::operation{w->flush()} owns it.)
  operation flush(send_completion on_done);

  /// Fills `out` with endpoints whose byte stream has data no receive waits for (see the
  /// low-level stream_poll); returns how many.
  size_t stream_poll(std::span<stream_poll_entry> out);

  // -- progress ----------------------------------------------------------------------------------

  /// Progresses every transport and protocol; returns the number of events handled.
  unsigned progress();
  /// File descriptor (an epoll set) that becomes readable when progress has work, or a signal
  /// came, after arm() returned ok. -1 without wakeup or with an external worker_params::event_fd.
  int event_fd() const noexcept;
  /// Arms the event fd. busy means events are pending or a signal came since the last arm (which
  /// this call consumes): progress, do not sleep. unsupported without wakeup.
  status arm();
  /// Sleeps on the event fd up to `timeout_ms` (negative: no limit) unless events are pending,
  /// progressing whenever it wakes, until an event of a kind in worker_params::events happened
  /// (any wakeup with the default wakeup_all), a signal came, or the time is up. Returns ok, or
  /// timed_out. A signal sent before the call makes it return at once.
  status wait(int timeout_ms);
  /// Wakes the thread blocked in wait(), or makes the event fd readable; when nobody waits, the
  /// next wait() returns at once (signals do not accumulate: one wait consumes all before it).
  /// Safe from any thread, in every thread mode, concurrently with any call but the destructor.
  /// Returns ok, or unsupported without wakeup.
  status signal();

  /// Completes once every operation started on every endpoint has completed.
  op flush(const request_params& params = {});
  /// Orders operations (sends, puts, gets, flushes) issued on each endpoint after the fence
  /// after those issued on it before: the later ones wait, unissued, until the earlier ones
  /// completed (a strong fence, as UCX's strong fence mode: it costs a round trip where
  /// something is outstanding). An endpoint with nothing outstanding is only told to order its
  /// transport's traffic. Per operation, request_fence orders a read after earlier reads alone.
  status fence();

  /// Multi-line description: transports, interfaces, endpoints and their counters, and what the
  /// worker holds for peers against its limits.
  std::string info() const;
  /// Writes info() to `stream`.
  void print_info(std::FILE* stream) const;

  // -- endpoints ---------------------------------------------------------------------------------

  /// Creates an endpoint to the worker whose packed address is given, on the best transport that
  /// reaches it. Returns unreachable when none does, invalid_addr for bad bytes. The peer creates
  /// an endpoint back (the reply endpoint of our messages there); a peer holding
  /// peer_limits::peer_ep_max of those already fails ours with exceeds_limit. A peer-created
  /// endpoint is the worker's: it is released when its peer closes, or once it failed and room is
  /// needed for a new peer, so a reply endpoint must not be kept past its failure.
  status connect(const std::vector<uint8_t>& peer_address, endpoint** out);

  // -- client-server (comm/listener.hpp) ---------------------------------------------------------

  /// Listens on a socket address; each client's request reaches params.on_request during
  /// progress(). Returns invalid_addr for an address that does not parse or resolve (a host name
  /// is resolved here, blocking), busy when it is in use. The socket is the tcp transport's
  /// connection manager, which is built in whatever the context's transports (COMM_TLS): it only
  /// carries the handshake. The connection's lane comes from the transports both sides enabled
  /// (see accept): with COMM_TLS=self only clients in this process can be accepted, with shm
  /// only clients on this host.
  status listen(const listener_params& params, std::unique_ptr<listener>* out);

  /// Connects to a listener at "host:port". The endpoint is returned at once; sends wait until
  /// the server accepts. A host name is resolved on another thread, never blocking the worker.
  /// A refusal fails the endpoint with rejected, nobody listening or a name that does not resolve
  /// (within params.timeout_ms) with unreachable, no answer within params.timeout_ms with
  /// endpoint_timeout (each through params.on_error). invalid_addr: the address does not parse;
  /// busy: 64 host names are being resolved already.
  status connect(const std::string& address, const endpoint_params& params, endpoint** out);

  /// Accepts a connection request on this worker (any worker of the listener's context); the
  /// request is released. The client learns it through its on_connect, and this side's on_connect
  /// runs once the client confirmed. Returns unreachable when no transport of this worker reaches
  /// the client (e.g. COMM_TLS=self and a client in another process): the request is refused and
  /// the client's endpoint fails with unreachable too. Disconnection: endpoint::close on either
  /// side; the other side's on_error is told not_connected (or connection_reset if the peer died).
  status accept(conn_request* request, const endpoint_params& params, endpoint** out);

  // -- memory ------------------------------------------------------------------------------------

  /// Registers [address, address + length) with the rights `access` (mem_access flags). With
  /// every remote right the region is registered with every transport (zero-copy RMA). A region
  /// peers may only read (mem_remote_read without mem_remote_write) is registered read-only with
  /// the transports that enforce it (shm: a peer's put into it fails with PRIVILEGES_VIOLATION
  /// whatever its key claims, and endpoint::rkey_local_address maps it read-only, so a write
  /// through that address faults in the peer). Any other region that withholds a remote right,
  /// and a read-only one on the other transports, is served by the owner's worker, which checks
  /// every access against the rights (PRIVILEGES_VIOLATION), whatever key a peer presents. A
  /// local buffer inside a region used against its local rights fails with PRIVILEGES_VIOLATION
  /// too. Returns invalid_param for a null range or unknown flags, or the transport's error.
  status mem_map(void* address, size_t length, memh** out, uint32_t access = mem_access_all);
  /// Releases a registration; remote keys packed from it stop working (PROTECTION_ERROR).
  status mem_unmap(memh* handle);
  /// Allocates as comm::mem_alloc (host-shareable, page aligned, freed with comm::mem_free), with
  /// the pages bound to the NUMA nodes of this worker's cpus (worker_params::cpus), as its shm
  /// receive segments are. Without cpus, or cores this machine lacks, it is comm::mem_alloc. A
  /// placement the kernel refuses leaves a valid block where the kernel puts it (logged).
  /// Thread-safe; null without memory.
  void* mem_alloc(size_t length) const noexcept;
  /// Appends the packed remote key of `handle` to `out`, for a peer's endpoint::rkey_unpack. The
  /// key carries the region (address and length: the segment a peer reads, endpoint::rkey_segment)
  /// and its remote rights; PRIVILEGES_VIOLATION for a region without remote rights.
  status rkey_pack(const memh* handle, std::vector<uint8_t>& out) const;

  // -- active messages ---------------------------------------------------------------------------

  /// Installs (or with a null callback removes) the handler of AM `id`; flags are
  /// am_handler_flags. A rendezvous AM reaches a handler as a descriptor (am_recv_rndv) unless
  /// it was installed with am_flag_fetch_rndv.
  ///
  /// What handlers keep past their call (rendezvous descriptors and data kept by returning
  /// in_progress) is bounded by peer_limits::am_held_max (how many) and am_held_max_bytes (bytes
  /// of data). Beyond them a rendezvous AM is refused before any handler sees it (its sender's
  /// request completes with exceeds_limit), and eager data is passed without
  /// am_recv_data_persistent (valid only during the call); both are logged and counted.
  /// Whatever is still kept when the worker is destroyed is reported (log level warn) and freed.
  status set_am_handler(uint16_t id, am_callback cb, void* arg, unsigned flags = 0);
  /// Receives the message of `desc` into `buffer` (ucp_am_recv_data_nbx): `desc` is the `data`
  /// a handler got with am_recv_rndv (the data is fetched from the sender), or data a handler
  /// kept with am_recv_data_persistent (it is copied). Callable inside the handler or after it
  /// returned in_progress. The descriptor is used up by the call, whatever its outcome, except
  /// for invalid_param (`desc` is not a descriptor the worker holds, or was used already), which
  /// changes nothing. Completes (through `cb` with params.user_data, or at once with no request
  /// and no callback unless request_no_immediate_completion) with ok, message_truncated (the
  /// first `length` bytes are written; the sender still completes with ok), or an error: the
  /// endpoint's failure when the sender is gone (before or during the fetch), canceled when the
  /// sender cancelled, or the transport's (a sender that announced more than it registered).
  op am_recv_data(void* desc, void* buffer, size_t length, am_recv_data_callback cb,
                  const request_params& params = {});
  /// am_recv_data into `count` entries, filled in order.
  op am_recv_data_iov(void* desc, const iov_entry* entries, size_t count,
                      am_recv_data_callback cb, const request_params& params = {});
  /// Releases data a handler kept by returning in_progress, or drops a rendezvous descriptor
  /// unread (ucp_am_data_release): the sender's request completes with ok. Anything else is
  /// logged and ignored.
  void am_data_release(void* data);
  /// Takes data a handler kept by returning in_progress away from the worker: neither
  /// am_data_release nor the worker's destruction frees it any more; comm::mem_free does, from
  /// any thread. False (and nothing changes) for data the worker does not hold.
  bool am_data_detach(void* data);

  // -- tag matching ------------------------------------------------------------------------------

  /// Posts a receive for a message whose tag matches `tag` under `mask`. Completes with ok,
  /// message_truncated (the buffer was short: it holds the first `length` bytes), or canceled.
  /// A posted receive belongs to the worker, not to an endpoint (as in UCX): a peer that dies
  /// or fails its endpoint leaves it posted, to be matched by a message from any other peer or
  /// cancelled (cancel, cancel_tag_recvs). Only a receive already matched to that peer's message
  /// (its fragments or rendezvous data still arriving) completes with the endpoint's error.
  op tag_recv(void* buffer, size_t length, tag_t tag, tag_t mask,
              const request_params& params = {});
  /// Posts a receive into `count` entries, filled in order.
  op tag_recv_iov(const iov_entry* entries, size_t count, tag_t tag, tag_t mask,
                  const request_params& params = {});
  /// Cancels every posted receive not yet matched to a message whose posted tag equals `tag` in
  /// the bits of `mask` (mask 0: every posted receive), e.g. all those waiting for a sender whose
  /// rank the tag's high bits carry once that sender is gone. Each completes with canceled and
  /// its callback runs, in posting order; their requests stay the caller's to release.
  /// @returns how many were cancelled
  size_t cancel_tag_recvs(tag_t tag, tag_t mask);
  /// Looks for an arrived, unmatched message matching `tag` under `mask`. With `out` set the
  /// message is removed from the unexpected queue and must be received with tag_recv_message
  /// (until then it counts against peer_limits::unexpected_max_bytes, no longer against its
  /// endpoint's limits).
  bool tag_probe(tag_t tag, tag_t mask, tag_recv_info* info, message** out = nullptr);
  /// Receives a message taken by tag_probe.
  op tag_recv_message(message* msg, void* buffer, size_t length,
                      const request_params& params = {});

  // -- streams ---------------------------------------------------------------------------------

  /// Writes up to `max` endpoints whose byte stream has buffered data that no posted receive
  /// waits for (ucp_stream_worker_poll), oldest first; returns how many. An endpoint reported
  /// goes to the back of the list while it keeps data, so a bounded poll reaches every one.
  /// Endpoints peers created (the partners of their connect) are reported too: this is how a
  /// receiver finds the endpoint a peer's stream arrives on.
  size_t stream_poll(stream_poll_entry* out, size_t max);

  // -- requests ----------------------------------------------------------------------------------

  /// in_progress while `req` runs, else its final status.
  status request_status(const request* req) const noexcept;
  /// One line describing `req` for logs and debugging (ucp_request_query's debug string): its
  /// kind (tag_send, tag_recv, am_send, get, put, stream_send, flush, ...), its endpoint and
  /// peer, its bytes and iov entries, and its status. "null request" for a null `req`.
  std::string request_info(const request* req) const;
  /// Releases a request; one still running is released when it completes (its callback still
  /// runs). A request owned by a comm::operation is released by that object instead.
  void release(request* req);
  /// Cancels a receive or a send not yet started: report completes it with status::canceled
  /// and calls its callback; force releases it silently. Returns busy if it is past cancelling.
  /// A rendezvous send already announced can be cancelled too: reported, it completes (canceled)
  /// only once the receiver answered, since a receiver that matched may be reading its buffer
  /// until then (or when the endpoint fails); forced, its buffer is withdrawn at once and a
  /// receiver's fetch racing with the cancel fails. A close is cancelled at any time: its endpoint
  /// fails with canceled and is released (endpoint::close).
  status cancel(request* req, cancel_mode mode = cancel_mode::report);
  /// Progresses until `o` is done or `timeout_ms` passed (negative: no limit), then releases its
  /// request. Returns the operation's final status, or timed_out (the request is then canceled).
  /// A comm::operation waits with operation::wait.
  status wait(op o, int timeout_ms = -1);

protected:
  worker() = default;
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
};

// The C++ face's tagged receives are inline, as the sends (comm/face_call.hpp).

[[gnu::always_inline]] inline operation worker::tag_recv(mutable_bytes buffer, tag_t tag,
                                                         tag_t mask, tag_recv_completion on_done) {
  const iov_entry entry{buffer.data(), buffer.size()};
  return detail::run_tag_recv_call(on_done, [&](const request_params& rp) {
    return tag_recv_iov(&entry, 1, tag, mask, rp);
  });
}

[[gnu::always_inline]] inline operation worker::tag_recv_iov(std::span<const iov_entry> entries,
                                                             tag_t tag, tag_t mask,
                                                             tag_recv_completion on_done) {
  return detail::run_tag_recv_call(on_done, [&](const request_params& rp) {
    return tag_recv_iov(entries.data(), entries.size(), tag, mask, rp);
  });
}

}  // namespace comm
