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
  io_error = -3,           ///< a system call failed (the log says which)
  no_memory = -4,          ///< an allocation failed
  invalid_param = -5,      ///< an argument or option is invalid
  unreachable = -6,        ///< no transport reaches the peer, or nobody listens
  invalid_addr = -7,       ///< an address that does not parse, resolve or decode
  not_implemented = -8,    ///< the operation is not implemented
  message_truncated = -9,  ///< the receive buffer is shorter than the message
  no_progress = -10,       ///< no progress can be made (UCS_ERR_NO_PROGRESS)
  buffer_too_small = -11,  ///< an output buffer is too small (UCS_ERR_BUFFER_TOO_SMALL)
  no_elem = -12,           ///< no such element (handler id, name, endpoint)
  busy = -15,              ///< events are pending, or the resource is in use
  canceled = -16,          ///< the request was canceled
  shmem_segment = -17,     ///< a shared-memory segment cannot be created, mapped or checked
  already_exists = -20,    ///< the name or element is taken
  out_of_range = -21,      ///< a value lies outside what is allowed
  timed_out = -22,         ///< the time limit passed
  exceeds_limit = -23,     ///< a configured limit would be exceeded
  unsupported = -24,       ///< not supported by this transport or configuration
  rejected = -25,          ///< the server rejected the connection request
  not_connected = -26,     ///< the endpoint is closed or was disconnected by the peer
  connection_reset = -27,  ///< the peer went away or reset the connection
  endpoint_timeout = -80,  ///< the peer stopped answering
  protocol_error = -90,    ///< the peer sent bytes that are not a valid message
  protection_error = -91,  ///< the remote key does not grant access to that address
  length_error = -92,      ///< the access runs past the end of the registered region
  /// The registration does not grant that access (DAT's PRIVILEGES_VIOLATION): a remote read or
  /// write the region's rights exclude, or a local buffer used against its local rights
  privileges_violation = -93,
  /// Posted on a disconnected endpoint: completed without running (DAT's DTO_ERR_FLUSHED)
  flushed = -94,
};

/// Readable name of a status, e.g. "MESSAGE_TRUNCATED".
const char* to_string(status s) noexcept;

/// True for every error value (negative statuses).
constexpr bool is_error(status s) noexcept { return static_cast<int16_t>(s) < 0; }

}  // namespace comm
