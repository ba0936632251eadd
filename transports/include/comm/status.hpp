// Status codes shared by every layer of libcomm, mirroring the seeds' ucs_status_t values.
#pragma once

#include <cstdint>

namespace comm {

/// Outcome of an operation. `ok` and `in_progress` are not errors; every negative value is.
enum class status : int16_t {
  ok = 0,                  ///< done
  in_progress = 1,         ///< started; completion is reported later
  no_message = -1,         ///< nothing to receive or match
  no_resource = -2,        ///< no send resources now: retry, or park on the pending queue
  io_error = -3,
  no_memory = -4,
  invalid_param = -5,
  unreachable = -6,        ///< no transport reaches the peer, or nobody listens
  invalid_addr = -7,
  not_implemented = -8,
  message_truncated = -9,  ///< the receive buffer is shorter than the message
  no_progress = -10,
  buffer_too_small = -11,
  no_elem = -12,           ///< no such element (handler id, name, endpoint)
  busy = -15,              ///< events are pending, or the resource is in use
  canceled = -16,
  shmem_segment = -17,
  already_exists = -20,
  out_of_range = -21,
  timed_out = -22,
  exceeds_limit = -23,
  unsupported = -24,
  rejected = -25,          ///< the server rejected the connection request
  not_connected = -26,
  connection_reset = -27,  ///< the peer went away or reset the connection
  endpoint_timeout = -80,  ///< the peer stopped answering
  protocol_error = -90,    ///< the peer sent bytes that are not a valid message
  protection_error = -91,  ///< the remote key does not grant access to that address
  length_error = -92,      ///< the access runs past the end of the registered region
};

/// Readable name of a status, e.g. "MESSAGE_TRUNCATED".
const char* to_string(status s) noexcept;

/// True for every error value (negative statuses).
constexpr bool is_error(status s) noexcept { return static_cast<int16_t>(s) < 0; }

}  // namespace comm
