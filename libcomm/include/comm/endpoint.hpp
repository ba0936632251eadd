// An endpoint: the sending side of a connection from a worker to a peer worker.
#pragma once

#include <comm/bytes.hpp>
#include <comm/callback.hpp>
#include <comm/face_call.hpp>
#include <comm/flags.hpp>
#include <comm/memory.hpp>
#include <comm/operation.hpp>
#include <comm/result.hpp>
#include <comm/types.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace comm {

/// Per-endpoint counters, shown by worker::info and the tools.
struct endpoint_counters {
  uint64_t messages_sent = 0;       ///< messages handed to the transport
  uint64_t bytes_sent = 0;          ///< payload bytes of those
  /// Messages addressed to this endpoint: those the peer sent on the endpoint paired with it
  /// (a peer's connect() creates its partner here, marked peer-created in info()).
  uint64_t messages_received = 0;
  uint64_t bytes_received = 0;      ///< payload bytes of those
  uint64_t retries = 0;             ///< operations parked on the pending queue (NO_RESOURCE)
  uint64_t errors = 0;              ///< malformed input and failed operations
};

/// Called when an endpoint fails (the peer died, reset, or sent malformed bytes). Its sends fail
/// with `reason`; tag receives posted on the worker do not (they belong to the worker, not to an
/// endpoint, and wait for a message from any peer): cancel those meant for this peer with
/// worker::cancel_tag_recvs or worker::cancel.
using endpoint_error_callback = void (*)(void* arg, endpoint* ep, status reason);

/// An endpoint (ucp_ep), owned by its worker. The C++ face hands it out as an endpoint_ptr
/// (worker::connect, worker::accept), whose destruction closes it; the low-level API as a pointer
/// that stays valid until close() completes or the worker is destroyed.
///
/// The operations come in two forms. The C++ face (first section below) takes byte spans, a flag
/// type per kind of operation and a completion callable that may capture (stored inside the
/// request, never on the heap), and returns an owning comm::operation; its completion runs
/// exactly once: inside the call when the operation completes (or fails) at once, else from
/// worker::progress, unless the operation object is dropped while it runs. The low-level form
/// (UCP's shape: pointer and length, request_params with C callbacks, a plain `op` whose request
/// is released by hand) stays for code ported from UCX and for the test suites.
///
/// A completion may run before the call that started it returns (the operation finished inside
/// it, e.g. a send whose peer acknowledged at once): whatever it frees must not be used after
/// the call.
class endpoint {
public:
  // -- C++ face (the low-level form of these operations follows) ----------------------------------

  /// Sends `data` tagged `tag`, as the low-level tag_send (protocol by size, completions in the
  /// order of the sends). `on_done` (may be empty) is told ok or the error once the buffer may
  /// be reused; `flags` force a protocol, or make the send fail with no_resource rather than
  /// queue. Returns the operation, done at once or running.
  operation tag_send(tag_t tag, const_bytes data, send_completion on_done = {},
                     send_flags flags = send_flags::none);

  /// Sends the concatenation of `entries` tagged `tag` (see tag_send).
  operation tag_send_iov(tag_t tag, std::span<const iov_entry> entries,
                         send_completion on_done = {}, send_flags flags = send_flags::none);

  /// Sends active message `id` with `header` (at most worker::max_am_header bytes) and `data` to
  /// the peer's handler for `id`. am_send_flags::reply_endpoint gives that handler a reply
  /// endpoint. `on_done` as tag_send's.
  operation am_send(uint16_t id, const_bytes header, const_bytes data,
                    send_completion on_done = {}, am_send_flags flags = am_send_flags::none);

  /// Sends `data` on this endpoint's byte stream (see the low-level stream_send). `on_done` is
  /// told when the buffer may be reused (with stream_send_flags::force_rndv: once the peer read
  /// it).
  operation stream_send(const_bytes data, send_completion on_done = {},
                        stream_send_flags flags = stream_send_flags::none);

  /// Sends the concatenation of `entries` on the byte stream.
  operation stream_send_iov(std::span<const iov_entry> entries, send_completion on_done = {},
                            stream_send_flags flags = stream_send_flags::none);

  /// Receives from the byte stream into `buffer` once at least `min_length` bytes (1 to its
  /// size; its size for UCP's WAITALL) are there, taking what arrived up to its size (see the
  /// low-level stream_recv). `on_done` is told the outcome and the bytes written, inside this
  /// call when enough was buffered already. invalid_param: an empty buffer, or `min_length` 0 or
  /// above the buffer's size.
  operation stream_recv(mutable_bytes buffer, length_completion on_done, size_t min_length = 1);

  /// Unpacks a key packed by the peer's worker::rkey_pack (see the low-level rkey_unpack); the
  /// key is destroyed with the returned handle, or with this endpoint if that goes first.
  result<rkey_ptr> rkey_unpack(const_bytes packed);

  /// Writes `local` to the peer's memory at `remote_address` in `key`'s region (see the
  /// low-level put for errors, flushing and the iov array, copied at the call). `on_done` is told once the data is there; `flags`
  /// are DAT's completion suppression, fence and unsignalled completion (rma_flags).
  operation put(const_bytes local, uint64_t remote_address, rkey& key,
                send_completion on_done = {}, rma_flags flags = rma_flags::none);

  /// Writes the concatenation of `local` to the peer's memory (see put).
  operation put(std::span<const iov_entry> local, uint64_t remote_address, rkey& key,
                send_completion on_done = {}, rma_flags flags = rma_flags::none);

  /// Reads the peer's memory at `remote_address` into `local` (see the low-level get).
  operation get(mutable_bytes local, uint64_t remote_address, rkey& key,
                send_completion on_done = {}, rma_flags flags = rma_flags::none);

  /// Reads the peer's memory at `remote_address` into `local`, filled in order.
  operation get(std::span<const iov_entry> local, uint64_t remote_address, rkey& key,
                send_completion on_done = {}, rma_flags flags = rma_flags::none);

  /// Reads the whole segment `remote` into `local` (length_error when `local` is shorter).
  operation get(mutable_bytes local, const remote_segment& remote, send_completion on_done = {},
                rma_flags flags = rma_flags::none);

  /// Reads the whole segment `remote` into `local`, filled in order (see the low-level get).
  operation get(std::span<const iov_entry> local, const remote_segment& remote,
                send_completion on_done = {}, rma_flags flags = rma_flags::none);

  /// Completes once every operation started on this endpoint has completed; `on_done` is told.
  /// (flush() without a completion is the low-level form; comm::operation{ep->flush()} owns it.)
  operation flush(send_completion on_done);

  // -- tagged messages ---------------------------------------------------------------------------

  /// Sends `length` bytes tagged `tag`. Eager short, bcopy or zcopy is chosen by size and the
  /// thresholds; request_params::flags can force bcopy or zcopy. Returns done, an error, or a
  /// request whose send_cb runs when the buffer may be reused (zcopy: once the peer holds the
  /// data). Completions on one endpoint happen in the order of the sends.
  op tag_send(tag_t tag, const void* buffer, size_t length, const request_params& params = {});

  /// Sends the concatenation of `count` entries tagged `tag`.
  op tag_send_iov(tag_t tag, const iov_entry* entries, size_t count,
                  const request_params& params = {});

  // -- active messages ---------------------------------------------------------------------------

  /// Sends active message `id` with a user header and data to the peer's handler for `id`.
  op am_send(uint16_t id, const void* header, size_t header_length, const void* data,
             size_t length, const request_params& params = {});

  // -- streams (ucp_stream_*) --------------------------------------------------------------------

  /// Sends `length` bytes on this endpoint's byte stream (ucp_stream_send_nbx). The peer's
  /// endpoint paired with this one receives the bytes of all stream sends in order, without
  /// their boundaries; a large send goes in fragments, or by rendezvous when params.flags has
  /// request_force_rndv (the peer reads the bytes straight into its posted receives). Completes
  /// (send_cb) when the buffer may be reused: a rendezvous send once the peer read it, into a
  /// receive or ahead of one into its stream buffer while that has room (a few MiB), else when a
  /// receive takes it. Empty sends complete at once and carry nothing.
  op stream_send(const void* buffer, size_t length, const request_params& params = {});

  /// Sends the concatenation of `count` entries on the byte stream.
  op stream_send_iov(const iov_entry* entries, size_t count, const request_params& params = {});

  /// Receives from this endpoint's byte stream into `buffer` (ucp_stream_recv_nbx): completes
  /// once at least `min_length` bytes (1 to `length`) are in it, having taken what had arrived
  /// up to `length`. Bytes buffered before the call are taken first; receives complete in the
  /// order they were posted. Done at once when enough had arrived (`*received`, if not null,
  /// is then set); otherwise params.stream_recv_cb gets the length. On a failed endpoint the
  /// bytes that arrived before the failure can still be received, then receives fail with its
  /// error; a receive waiting when it fails completes with that error, and one still waiting
  /// when the endpoint is closed with canceled (each with the bytes it got so far). cancel
  /// completes it with canceled and the bytes it got so far (they are not returned to the
  /// stream). invalid_param: `min_length` is 0 or above `length`, or a null buffer.
  op stream_recv(void* buffer, size_t length, size_t min_length, size_t* received,
                 const request_params& params = {});

  /// stream_recv with `min_length` 1, or `length` when params.flags has request_stream_waitall
  /// (UCP_STREAM_RECV_FLAG_WAITALL).
  op stream_recv(void* buffer, size_t length, size_t* received,
                 const request_params& params = {});

  /// Takes the oldest block of buffered stream bytes without copying
  /// (ucp_stream_recv_data_nb): returns its start and sets `*length`, or null (and 0) when
  /// nothing is buffered or receives are posted. The block belongs to the caller until
  /// stream_data_release; it no longer counts against the stream limits.
  void* stream_recv_data(size_t* length);

  /// Gives back a block from stream_recv_data (ucp_stream_data_release); invalid_param for any
  /// other pointer. Blocks not given back are freed with the worker.
  status stream_data_release(void* data);

  // -- RMA ---------------------------------------------------------------------------------------

  /// Unpacks a key packed by the peer's worker::rkey_pack for use on this endpoint. Bytes that
  /// are not a key give invalid_param.
  status rkey_unpack(const void* data, size_t length, rkey** out);

  /// Releases an unpacked key.
  void rkey_destroy(rkey* key);

  /// The `length` bytes at `remote_address` in `key`'s region, read in place: where they lie in
  /// this process when the endpoint's transport has the peer's memory mapped here (shm, for a
  /// region in the peer's comm::mem_alloc memory; self). Checked as get checks the range. A
  /// region its owner mapped for remote reads only (worker::mem_map without mem_remote_write)
  /// is handed out read-only where the transport enforces that (shm: a PROT_READ mapping, so a
  /// write through the address faults; see local_memory). Errors: unsupported when the
  /// transport or this region cannot be mapped (get still reads it); invalid_param for a key of
  /// another endpoint; privileges_violation for a region closed to remote reads;
  /// protection_error, length_error as get; not_connected, connection_reset on an endpoint that
  /// is not (or no longer) connected.
  result<local_memory> rkey_local_address(rkey& key, uint64_t remote_address, size_t length);

  /// A new pidfd (pidfd_open(2)) of the peer's process, when the endpoint's transport reaches a
  /// process on this host it has identified (shm: the pidfd it opened before trusting the peer's
  /// pid): it polls readable once that process has exited, e.g. to keep memory a peer still
  /// maps until it is gone. The caller owns the descriptor and closes it. Errors: unsupported
  /// when the transport knows no peer process (self, tcp, verbs); not_connected before the
  /// connection is up; connection_reset once it failed; no_resource without free descriptors.
  result<int> peer_process_fd();

  /// The whole region of `key` (DAT's RMR triplet: the key, the region's address, its length).
  remote_segment rkey_segment(rkey* key) const noexcept;

  /// Writes the local iov to the peer's memory at `remote_address` (inside `key`'s region).
  /// Completes once the data is in the peer's memory. Out-of-region addresses give
  /// PROTECTION_ERROR, a range running past the region LENGTH_ERROR, a region the peer did not
  /// open to remote writes PRIVILEGES_VIOLATION. On an endpoint that failed or is closing the
  /// put is flushed: its request completes with FLUSHED and its callback runs. The array `local`
  /// is copied at the call (the caller may reuse or free it on return); the buffers it points
  /// to belong to the operation until it completes. A post allocates nothing once the worker's
  /// request pool is warm.
  op put(const iov_entry* local, size_t count, uint64_t remote_address, rkey* key,
         const request_params& params = {});

  /// Reads the peer's memory at `remote_address` into the local iov, filled in order (DAT's
  /// dat_ep_post_rdma_read): front entries full, at most one partial, the rest untouched.
  /// params.user_data is the cookie passed back to send_cb; request_completion_suppressed,
  /// request_unsignalled and request_fence follow DAT (see request_flags); reads in flight on the
  /// endpoint never exceed what the peer accepts (advertised in its address at connection, at
  /// most COMM_RMA_READS_IN) nor what the local transport allows: the rest wait in order.
  /// Errors as put (PRIVILEGES_VIOLATION: the region is closed to remote reads); flushed as put.
  /// As put, the array `local` is copied at the call, its buffers are the operation's until it
  /// completes, and a post allocates nothing once the pool is warm.
  op get(const iov_entry* local, size_t count, uint64_t remote_address, rkey* key,
         const request_params& params = {});

  /// Reads the whole remote segment `remote` (its length, not the iov's, says how much) into the
  /// local iov, filled in order: the entries before the segment's end are filled, the one where
  /// it ends partially, the rest untouched. LENGTH_ERROR when the iov is shorter than the segment.
  /// The array is copied at the call, as above.
  op get(const iov_entry* local, size_t count, const remote_segment& remote,
         const request_params& params = {});

  // -- completion and teardown -------------------------------------------------------------------

  /// Completes once every operation started on this endpoint has completed.
  op flush(const request_params& params = {});

  /// Flushes, then tells the peer and releases the endpoint. The flush waits for every send before
  /// the close (a rendezvous send until its receiver fetched it) and for the rendezvous messages
  /// this endpoint is fetching; a close that crosses the peer's completes ok, one ended by the
  /// endpoint's failure with that error (the endpoint is released either way). A peer that never
  /// answers holds the close without a bound: worker::cancel of its request (as worker::wait's
  /// timeout does) fails the endpoint with canceled, tells the peer, and releases the endpoint. The
  /// pointer is invalid once the returned operation is done (or at once if it is done
  /// immediately), or once its request was cancelled.
  op close(const request_params& params = {});

  /// Installs the callback told when this endpoint fails.
  void set_error_handler(endpoint_error_callback cb, void* arg);

  // -- query -------------------------------------------------------------------------------------

  /// ok while the endpoint works, else the error that failed it.
  status state() const noexcept;

  /// Unique id of the peer worker.
  uint64_t peer_uid() const noexcept;

  /// Name of the peer worker.
  const std::string& peer_name() const noexcept;

  /// Transport the endpoint's lane uses: "self", "shm", "tcp" or "verbs"; "none" while a
  /// client-server endpoint waits for the server's answer (or failed before it came).
  std::string_view transport() const noexcept;

  /// Counters of this endpoint.
  const endpoint_counters& counters() const noexcept;

  /// One line describing the endpoint: peer, lane, state, counters, and which lane was chosen
  /// over the other candidates and why.
  std::string info() const;

protected:
  endpoint() = default;
  ~endpoint() = default;
  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;
};

/// An owning handle of an endpoint the user made (worker::connect, worker::accept). Move-only.
/// Destroying it starts the endpoint's close and the worker finishes it by itself during its
/// progress: nothing to release or wait for (a peer that never answers holds that close, and the
/// endpoint, until the worker is destroyed). close() does the same and returns the close as an
/// operation to wait for. If the worker is destroyed first, the handle becomes empty (the worker
/// closed the endpoint) and its destruction does nothing.
///
/// Endpoints the worker owns (reply endpoints, those stream_poll reports, peer-created ones) are
/// not to be put in a handle.
class endpoint_ptr {
public:
  /// No endpoint.
  endpoint_ptr() noexcept = default;
  /// Takes over `ep`, an endpoint of the low-level worker::connect or worker::accept, which must
  /// not be closed by hand any more.
  explicit endpoint_ptr(endpoint* ep) noexcept : ep_(ep) {
    if (ep_ != nullptr) link();
  }
  /// Takes the endpoint of `other`, which becomes empty.
  endpoint_ptr(endpoint_ptr&& other) noexcept : ep_(other.ep_) {
    if (ep_ != nullptr) relink(other);
  }
  /// Closes this handle's endpoint (as the destructor) and takes that of `other`.
  endpoint_ptr& operator=(endpoint_ptr&& other) noexcept {
    if (this != &other) {
      reset();
      ep_ = other.ep_;
      if (ep_ != nullptr) relink(other);
    }
    return *this;
  }
  endpoint_ptr(const endpoint_ptr&) = delete;
  endpoint_ptr& operator=(const endpoint_ptr&) = delete;
  /// Starts the endpoint's close, which the worker finishes by itself.
  ~endpoint_ptr() { reset(); }

  /// The endpoint, or null.
  endpoint* get() const noexcept { return ep_; }
  /// The endpoint (the handle must hold one).
  endpoint* operator->() const noexcept { return ep_; }
  /// The endpoint (the handle must hold one).
  endpoint& operator*() const noexcept { return *ep_; }
  /// True while the handle holds an endpoint.
  explicit operator bool() const noexcept { return ep_ != nullptr; }

  /// Closes the endpoint as endpoint::close does (flush, tell the peer, release) and returns the
  /// close; the handle is empty afterwards. `on_done` is told ok, or the error that ended the
  /// endpoint. An empty handle gives a done operation (ok).
  operation close(send_completion on_done = {});

  /// Starts the close of the endpoint (the worker finishes it) and empties the handle.
  void reset() noexcept {
    if (ep_ != nullptr) close_detached();
  }

  /// Gives the endpoint up without closing it: the caller closes it by hand (endpoint::close).
  endpoint* release() noexcept;

private:
  friend struct detail::handle_access;

  void link() noexcept;
  void relink(endpoint_ptr& other) noexcept;
  void close_detached() noexcept;

  endpoint* ep_ = nullptr;
};

// The C++ face's tagged sends are inline (comm/face_call.hpp): without a completion they cost
// the low-level call alone; a completion known at once runs here, one still running is kept by
// its request.

[[gnu::always_inline]] inline operation endpoint::tag_send(tag_t tag, const_bytes data,
                                                           send_completion on_done,
                                                           send_flags flags) {
  if (!on_done && flags == send_flags::none) {
    return operation(tag_send(tag, data.data(), data.size(), detail::no_request_params));
  }
  request_params p = detail::params_of(flags);
  return detail::run_send_call(on_done, p, [&](const request_params& rp) {
    return tag_send(tag, data.data(), data.size(), rp);
  });
}

[[gnu::always_inline]] inline operation endpoint::tag_send_iov(tag_t tag,
                                                               std::span<const iov_entry> entries,
                                                               send_completion on_done,
                                                               send_flags flags) {
  if (!on_done && flags == send_flags::none) {
    return operation(tag_send_iov(tag, entries.data(), entries.size(), detail::no_request_params));
  }
  request_params p = detail::params_of(flags);
  return detail::run_send_call(on_done, p, [&](const request_params& rp) {
    return tag_send_iov(tag, entries.data(), entries.size(), rp);
  });
}

}  // namespace comm
