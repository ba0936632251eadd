// Active messages: handler registration flags and what a handler is told.
#pragma once

#include <comm/status.hpp>
#include <comm/types.hpp>

#include <cstddef>
#include <cstdint>

namespace comm {

class endpoint;

/// Flags of the low-level worker::set_am_handler (ucp_am_cb_flags); the C++ face takes them as
/// am_handler_flags (comm/flags.hpp).
enum am_cb_flags : unsigned {
  /// Call the handler once with the whole message, never per fragment.
  am_flag_whole_msg = 1u << 0,
  /// Always pass data the handler may keep (am_recv_data_persistent set) until
  /// worker::am_data_release.
  am_flag_persistent_data = 1u << 1,
  /// libcomm extension: fetch a rendezvous AM into a block of the worker's before calling the
  /// handler, under the COMM_AM_RX_* limits (waiting in order per endpoint for room). The handler
  /// then sees its data (am_recv_data_persistent), never a descriptor. Without this flag a
  /// rendezvous AM reaches the handler as a descriptor (am_recv_rndv), as in UCP.
  am_flag_fetch_rndv = 1u << 2,
};

/// Attributes of a received active message (ucp_am_recv_attr_t).
enum am_recv_attr : unsigned {
  /// `data` stays valid after the handler returns in_progress, until worker::am_data_release
  /// (UCP_AM_RECV_ATTR_FLAG_DATA). Kept data is also a descriptor for worker::am_recv_data.
  am_recv_data_persistent = 1u << 0,
  /// This call carries the first fragment of the message.
  am_recv_first = 1u << 1,
  /// More fragments of this message follow in later calls.
  am_recv_more = 1u << 2,
  /// `reply_ep` is valid.
  am_recv_reply_ep = 1u << 3,
  /// The message came by rendezvous (UCP_AM_RECV_ATTR_FLAG_RNDV): its data is still at the
  /// sender, `data` is a descriptor of it (not the data) and `length` its size in bytes. The
  /// receiver fetches it into a buffer of its own with worker::am_recv_data, or drops it unread
  /// with worker::am_data_release (the sender's request completes with ok either way). The
  /// handler may do either inside the call; to do it later it returns in_progress and keeps the
  /// descriptor. Returning anything else without either releases it.
  am_recv_rndv = 1u << 4,
};

/// What an active-message handler is told besides header and data.
struct am_recv_params {
  unsigned attr = 0;           ///< am_recv_attr flags
  endpoint* reply_ep = nullptr;///< where to reply, with am_recv_reply_ep
  size_t offset = 0;           ///< offset of `data` in the message, for fragments
  size_t total_length = 0;     ///< data bytes of the whole message
  uint64_t message_id = 0;     ///< identifies the fragments of one message
};

/// Handles an active message. `header` is only valid during the call. Return ok, or in_progress
/// to keep persistent data (am_recv_data_persistent) or a rendezvous descriptor (am_recv_rndv)
/// until worker::am_data_release(data) or worker::am_recv_data(data, ...). What handlers keep is
/// bounded by peer_limits::am_held_max and am_held_max_bytes (see worker::set_am_handler).
using am_callback = status (*)(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const am_recv_params& params);

/// Called when worker::am_recv_data completes: `st` is ok, message_truncated (the buffer was
/// shorter than the message: it holds the first `length` bytes), or why the data could not be
/// fetched (the endpoint's failure when the sender is gone, canceled when the sender cancelled
/// its send, or the transport's error). `length` is the number of bytes written.
using am_recv_data_callback = void (*)(request* req, status st, size_t length, void* user_data);

}  // namespace comm
