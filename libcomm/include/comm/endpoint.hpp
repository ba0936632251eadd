// An endpoint: the sending side of a connection from a worker to a peer worker.
#pragma once

#include <comm/types.hpp>

#include <cstdint>
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

/// An endpoint (ucp_ep): create it with worker::connect, close it with close(). Owned by its
/// worker; a pointer stays valid until close() completes or the worker is destroyed.
///
/// A request's callback may run before the call that started it returns (the operation finished
/// inside it, e.g. a send whose peer acknowledged at once): whatever the callback frees must not
/// be used after the call.
class endpoint {
public:
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

  /// The whole region of `key` (DAT's RMR triplet: the key, the region's address, its length).
  remote_segment rkey_segment(rkey* key) const noexcept;

  /// Writes the local iov to the peer's memory at `remote_address` (inside `key`'s region).
  /// Completes once the data is in the peer's memory. Out-of-region addresses give
  /// PROTECTION_ERROR, a range running past the region LENGTH_ERROR, a region the peer did not
  /// open to remote writes PRIVILEGES_VIOLATION. On an endpoint that failed or is closing the
  /// put is flushed: its request completes with FLUSHED and its callback runs.
  op put(const iov_entry* local, size_t count, uint64_t remote_address, rkey* key,
         const request_params& params = {});

  /// Reads the peer's memory at `remote_address` into the local iov, filled in order (DAT's
  /// dat_ep_post_rdma_read): front entries full, at most one partial, the rest untouched.
  /// params.user_data is the cookie passed back to send_cb; request_completion_suppressed,
  /// request_unsignalled and request_fence follow DAT (see request_flags); reads in flight on the
  /// endpoint never exceed what the peer accepts (advertised in its address at connection, at
  /// most COMM_RMA_READS_IN) nor what the local transport allows: the rest wait in order.
  /// Errors as put (PRIVILEGES_VIOLATION: the region is closed to remote reads); flushed as put.
  op get(const iov_entry* local, size_t count, uint64_t remote_address, rkey* key,
         const request_params& params = {});

  /// Reads the whole remote segment `remote` (its length, not the iov's, says how much) into the
  /// local iov, filled in order: the entries before the segment's end are filled, the one where
  /// it ends partially, the rest untouched. LENGTH_ERROR when the iov is shorter than the segment.
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

}  // namespace comm
