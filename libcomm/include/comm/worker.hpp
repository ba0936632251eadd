// The worker: libcomm's progress engine (ucp_worker).
#pragma once

#include <comm/am.hpp>
#include <comm/endpoint.hpp>
#include <comm/listener.hpp>
#include <comm/memory.hpp>
#include <comm/types.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace comm {

class context;

/// Thread safety of a worker (ucs_thread_mode_t).
enum class thread_mode {
  single,  ///< one thread uses the worker
  multi,   ///< any thread may call any function; calls are serialised by a lock
};

/// Parameters of worker::create (ucp_worker_params_t).
struct worker_params {
  thread_mode mode = thread_mode::single;  ///< thread safety
  /// Cores (OS indices) the worker is used from, as UCX's cpu_mask: its resources are placed
  /// for them (shared-memory segments on their NUMA nodes, network devices nearest them tried
  /// first; info() shows the outcome). No thread is pinned: a caller that wants pinning pins its
  /// own threads. Empty: no placement.
  std::vector<int> cpus;
  std::string name;                        ///< name shown in logs and info; default "<host>:<pid>"
  size_t am_alignment = 1;                 ///< alignment of AM data passed to handlers
  uint64_t client_id = 0;                  ///< sent to servers on connection
  bool wakeup = true;                      ///< provide event_fd/arm/wait
};

/// What a packed worker address says (ucp_worker_address_attr_t).
struct worker_address_attr {
  uint64_t uid = 0;                     ///< unique id of the worker
  std::string name;                     ///< its name
  uint64_t client_id = 0;               ///< its client id
  std::vector<std::string> transports;  ///< transports it can be reached on, each named once
};

/// A message found by tag_probe with remove, received later with tag_recv_message.
class message;

/// A worker: owns one interface per enabled transport, endpoints, the tag matching queues, AM
/// handlers and requests, and progresses them all. Not thread-safe unless thread_mode::multi.
///
/// What peers can make a worker hold is bounded by config::limits (unexpected messages, active
/// messages before delivery, replies a peer does not take, endpoints peers create); a peer that passes one fails the endpoint it came through with exceeds_limit.
class worker {
public:
  /// Creates a worker on `ctx`, which must outlive it.
  static std::unique_ptr<worker> create(context& ctx, const worker_params& params = {});
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
  /// Largest user header of an active message.
  size_t max_am_header() const noexcept;
  /// The packed address of this worker, to give to peers (ucp_worker_get_address; the vector's
  /// destruction is the release).
  std::vector<uint8_t> address() const;
  /// Decodes a packed worker address; invalid bytes give status::invalid_addr.
  static status query_address(const void* address, size_t length, worker_address_attr* out);

  // -- progress ----------------------------------------------------------------------------------

  /// Progresses every transport and protocol; returns the number of events handled.
  unsigned progress();
  /// File descriptor that becomes readable when progress has work after arm() returned ok.
  int event_fd() const noexcept;
  /// Arms the event fd; busy means events are pending (progress, do not sleep).
  status arm();
  /// Sleeps on the event fd up to `timeout_ms` (negative: no limit) unless events are pending,
  /// then progresses once. Returns ok, or timed_out.
  status wait(int timeout_ms);

  /// Completes once every operation started on every endpoint has completed.
  op flush(const request_params& params = {});
  /// Orders operations issued after the fence after those issued before.
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

  /// Registers [address, address + length) with every transport of the worker. Returns
  /// invalid_param for a null range, or the transport's error.
  status mem_map(void* address, size_t length, memh** out);
  /// Releases a registration; remote keys packed from it stop working (PROTECTION_ERROR).
  status mem_unmap(memh* handle);
  /// Appends the packed remote key of `handle` to `out`, for a peer's endpoint::rkey_unpack.
  status rkey_pack(const memh* handle, std::vector<uint8_t>& out) const;

  // -- active messages ---------------------------------------------------------------------------

  /// Installs (or with a null callback removes) the handler of AM `id`; flags are
  /// am_handler_flags.
  status set_am_handler(uint16_t id, am_callback cb, void* arg, unsigned flags = 0);
  /// Releases data a handler kept by returning in_progress.
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

  // -- requests ----------------------------------------------------------------------------------

  /// in_progress while `req` runs, else its final status.
  status request_status(const request* req) const noexcept;
  /// Releases a request; one still running is released when it completes (its callback still
  /// runs).
  void release(request* req);
  /// Cancels a receive or a send not yet started: report completes it with status::canceled
  /// and calls its callback; force releases it silently. Returns busy if it is past cancelling.
  status cancel(request* req, cancel_mode mode = cancel_mode::report);
  /// Progresses until `o` is done or `timeout_ms` passed (negative: no limit), then releases its
  /// request. Returns the operation's final status, or timed_out (the request is then canceled).
  status wait(op o, int timeout_ms = -1);

protected:
  worker() = default;
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
};

}  // namespace comm
