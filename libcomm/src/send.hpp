// The send engine, a worker-level service for the protocol modules: a module's message goes out
// eager short, bcopy or zcopy, whole or in fragments (or by the module's rendezvous), framed by
// the module's own headers; later fragments carry a FragmentMiddle header with the module's
// fragment id, and accept_fragment checks them on arrival. Also the worker's own requests:
// control messages, flush and close.
#pragma once

#include "worker_impl.hpp"

#include <cstddef>
#include <cstdint>

namespace comm::detail {

/// How a message send moves its data.
enum class send_protocol : uint8_t { short_, bcopy, zcopy, rndv };

/// The send engine's part of a message send (inside the module's request state).
struct send_progress {
  send_protocol proto = send_protocol::bcopy; ///< chosen at the first attempt
  size_t length = 0;                        ///< data bytes of the message
  size_t offset = 0;                        ///< data bytes handed to the transport so far
  uint64_t msg_id = 0;                      ///< identifies its fragments (0 while sent whole)
  bool preset = false;                      ///< the module set `proto` itself: it is kept
  /// A large eager copy: bcopy fragments in the rendezvous range, counted against the peer's
  /// eager window (endpoint_impl::eager_credit), which its first fragment says.
  bool windowed = false;
};

/// How a module frames its messages for the send engine (a static table in the module's file).
struct message_framing {
  /// Encodes into `out` the protocol header of the message sent whole (`whole`) or of its first
  /// fragment; returns its length and sets `*id` to the wire id to send it with.
  size_t (*encode_first)(request* req, const send_progress& s, bool whole, uint8_t* out,
                         tl::am_id* id);
  /// Encoded size of the protocol header of the message sent whole.
  size_t (*whole_header_size)(const request* req);
  /// Sends the message by rendezvous; null when the module has none.
  status (*send_rndv)(request* req);
  /// Wire id of the later fragments.
  tl::am_id fragment_id;
  /// The module sends by copies what the lane prefers copies for (endpoint_impl::copies_below),
  /// in the rendezvous range within the peer's eager window: its receiver gives the window back.
  bool copies_preferred = false;
};

/// Largest encoded protocol header of any data message.
inline constexpr size_t max_proto_header = 64;

/// Gives `bytes` of the peer's eager window back to the sender side of `ep` (a large eager copy
/// that never went out: cancelled before its first fragment).
inline void refund_window(endpoint_impl& ep, const send_progress& s) {
  if (s.windowed) ep.eager_credit += s.length;
}

/// Sends as much of the message `req` as the transport takes, in order: its protocol header, its
/// user header (request::header) and its data (request::iov, or params.pack). The first call
/// picks short, bcopy, zcopy or rendezvous. Returns ok when all of it went out (zcopy and
/// rendezvous sends complete later), no_resource when the rest must wait, or an error.
status send_message(request* req, send_progress& s, const message_framing& f);

/// True when a message of `bytes` (protocol header and data) may go to the transport of `ep` at
/// once as one short message without a request (the fast path of tag_send and stream_send): the
/// endpoint is connected, no send waits before it (in the pending queue or behind a fence), and
/// the message fits.
inline bool short_path_open(const endpoint_impl& ep, size_t bytes) {
  return ep.state == endpoint_impl::phase::connected && ep.pending_head == nullptr &&
         ep.fence_req == nullptr && bytes <= ep.short_limit;
}

/// Sends the encoded protocol header (`header_length` bytes at `header`) and `length` bytes of
/// `data` as one short message with wire id `id` on `ep`, after short_path_open said yes. True
/// when that settled the send, with the outcome in `*result` (done, or the transport's error;
/// no_resource too under request_force_immediate in `flags`); false when the transport has no
/// room now and the caller sends the message with a request.
inline bool try_send_short(endpoint_impl& ep, tl::am_id id, const void* header,
                           size_t header_length, const void* data, size_t length,
                           uint32_t flags, op* result) {
  const status st = ep.lane->am_short(id, header, header_length, data, length);
  if (st == status::ok) {
    ++ep.counters_.messages_sent;
    ep.counters_.bytes_sent += length;
    *result = op{};
    return true;
  }
  if (st == status::no_resource && !(flags & request_force_immediate)) return false;
  *result = op{st, nullptr};
  return true;
}

/// True when a message of `bytes` (protocol header and data) may go to the transport of `ep` at
/// once as one bcopy without a request (stream_send's path for what is too long for a short
/// message): as short_path_open, for the lane's max_bcopy.
inline bool bcopy_path_open(const endpoint_impl& ep, size_t bytes) {
  return ep.state == endpoint_impl::phase::connected && ep.pending_head == nullptr &&
         ep.fence_req == nullptr && bytes <= ep.lane_attr->max_bcopy;
}

/// Sends the encoded protocol header and `length` bytes of `data` as one bcopy with wire id `id`
/// on `ep`, after bcopy_path_open said yes; the outcome as try_send_short's.
bool try_send_bcopy(endpoint_impl& ep, tl::am_id id, const void* header, size_t header_length,
                    const void* data, size_t length, uint32_t flags, op* result);

/// Checks a later fragment (FragmentMiddle) of the message `owner` is receiving: the endpoint
/// must be receiving one from `owner` with that id, at that offset, with room for the payload.
/// Returns the endpoint with the payload in `*payload`, `*payload_length` (counted as received),
/// or null: dropped (a failed endpoint), or a protocol error (counted, the endpoint failed).
endpoint_impl* accept_fragment(worker_impl& w, const protocol& owner, const uint8_t* data,
                               size_t length, const uint8_t** payload, size_t* payload_length);

/// The transport completion of a send's zcopy fragments or of a flush.
void on_send_done(tl::completion* comp);

/// Tells the peer of `ep` that it is closing; ok, no_resource or an error.
status send_close_notice(endpoint_impl* ep);

/// State of a control request (role control): the message's wire id; its bytes are in
/// request::wire.
struct control_state {
  tl::am_id id = 0;  ///< wire id to send it with
};

/// The worker's own kinds of request.
extern const request_ops flush_ops;    ///< endpoint flush (and immediate completions)
extern const request_ops close_ops;    ///< endpoint close
extern const request_ops control_ops;  ///< control message (queue_control)

}  // namespace comm::detail
