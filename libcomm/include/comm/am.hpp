// Active messages: handler registration flags and what a handler is told.
#pragma once

#include <comm/status.hpp>

#include <cstddef>
#include <cstdint>

namespace comm {

class endpoint;

/// Flags of worker::set_am_handler (ucp_am_cb_flags).
enum am_handler_flags : unsigned {
  /// Call the handler once with the whole message, never per fragment.
  am_flag_whole_msg = 1u << 0,
  /// Always pass data the handler may keep (am_recv_data_persistent set) until
  /// worker::am_data_release.
  am_flag_persistent_data = 1u << 1,
};

/// Attributes of a received active message (ucp_am_recv_attr_t).
enum am_recv_attr : unsigned {
  /// `data` stays valid after the handler returns in_progress, until worker::am_data_release.
  am_recv_data_persistent = 1u << 0,
  /// This call carries the first fragment of the message.
  am_recv_first = 1u << 1,
  /// More fragments of this message follow in later calls.
  am_recv_more = 1u << 2,
  /// `reply_ep` is valid.
  am_recv_reply_ep = 1u << 3,
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
/// to keep persistent data (am_recv_data_persistent) until worker::am_data_release(data).
using am_callback = status (*)(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const am_recv_params& params);

}  // namespace comm
