// Vocabulary types of libcomm's public API: tags, requests, callbacks, operation results.
#pragma once

#include <comm/status.hpp>

#include <cstddef>
#include <cstdint>

namespace comm {

/// A message tag, matched against a receive's tag under its mask.
using tag_t = uint64_t;

/// A mask that matches every bit of a tag exactly.
inline constexpr tag_t tag_mask_full = ~tag_t{0};

class request;
class endpoint;
class worker;
class memh;
class rkey;

/// One scatter/gather entry of a send or receive buffer.
struct iov_entry {
  void* buffer = nullptr;  ///< start of the entry
  size_t length = 0;       ///< bytes in the entry
};

/// A remote segment (DAT's RMR triplet): `length` bytes at `address` in the region of `key`.
struct remote_segment {
  rkey* key = nullptr;    ///< the peer's unpacked key
  uint64_t address = 0;   ///< start of the segment, in the peer's address space
  uint64_t length = 0;    ///< bytes in the segment
};

/// What a completed tagged receive got.
struct tag_recv_info {
  tag_t sender_tag = 0;  ///< the tag the sender used
  size_t length = 0;     ///< bytes of the message (what was written if truncated: see status)
  uint64_t imm = 0;      ///< the sender's immediate value (request_params::imm), else 0
};

/// Called when a send completes (status ok) or fails.
using send_callback = void (*)(request* req, status st, void* user_data);

/// Called when a tagged receive completes, is truncated (message_truncated) or canceled.
using tag_recv_callback = void (*)(request* req, status st, const tag_recv_info& info,
                                   void* user_data);

/// Called when a stream receive completes (ok), fails (the endpoint's error) or is canceled;
/// `length` is what it wrote into the buffer.
using stream_recv_callback = void (*)(request* req, status st, size_t length, void* user_data);

/// Packs bytes [offset, offset + max) of a generic send into `dest`; returns bytes written.
using pack_callback = size_t (*)(void* dest, size_t offset, size_t max, void* user_data);

/// Flags of request_params.
enum request_flags : uint32_t {
  /// Fail with no_resource instead of creating a request or queuing the operation.
  request_force_immediate = 1u << 0,
  /// Always return a request, even when the operation completed at once.
  request_no_immediate_completion = 1u << 1,
  /// `imm` is valid and travels with the message (tagged sends).
  request_immediate_value = 1u << 2,
  /// The sender wants the receiver's AM handler to get a reply endpoint.
  request_reply_endpoint = 1u << 3,
  /// Use the eager zero-copy protocol whatever the thresholds say (tagged sends and active
  /// messages).
  request_force_zcopy = 1u << 4,
  /// Use the eager bcopy protocol whatever the thresholds say (tagged sends and active messages).
  request_force_bcopy = 1u << 5,
  /// Use rendezvous whatever the thresholds say (tagged sends and active messages).
  request_force_rndv = 1u << 6,
  /// RMA (DAT completion suppression, 0x01): no request for the caller, and a success runs no
  /// callback; a failure still reports its error through send_cb (with user_data, the cookie),
  /// and is logged and counted on the endpoint. The operation counts for flush.
  request_completion_suppressed = 1u << 8,
  /// RMA (DAT barrier fence, 0x08): start only after every earlier put and get on the endpoint
  /// completed.
  request_fence = 1u << 9,
  /// RMA (DAT unsignalled notification, 0x04): the caller gets its request and the completion
  /// is recorded in it (worker::request_status), but a success does not notify: send_cb is not
  /// called. A failure notifies as usual.
  request_unsignalled = 1u << 10,
  /// Stream receives (UCP_STREAM_RECV_FLAG_WAITALL): complete only once the whole buffer is full.
  request_stream_waitall = 1u << 11,
};

/// Access rights of a registration (worker::mem_map), as DAT's LMR and RMR privileges.
enum mem_access : uint32_t {
  mem_local_read = 1u << 0,    ///< local sends and puts may read the region
  mem_local_write = 1u << 1,   ///< local gets may write into the region
  mem_remote_read = 1u << 2,   ///< peers may get from the region
  mem_remote_write = 1u << 3,  ///< peers may put into the region
  /// Every right (the default).
  mem_access_all = mem_local_read | mem_local_write | mem_remote_read | mem_remote_write,
};

/// Optional parameters of a nonblocking operation (mirrors ucp_request_param_t). `flags` comes
/// last: a compiler then zeroes the pointers with aligned 16-byte stores, each of which a later
/// 8-byte load reads back at once (with `flags` first they were zeroed from offset 4, and reading
/// `pack` straddled two stores: a store-forwarding stall on every send built from a fresh one).
struct request_params {
  send_callback send_cb = nullptr;         ///< for sends
  tag_recv_callback recv_cb = nullptr;     ///< for tagged receives
  stream_recv_callback stream_recv_cb = nullptr; ///< for stream receives
  void* user_data = nullptr;               ///< passed to the callbacks
  uint64_t imm = 0;                        ///< immediate value, with request_immediate_value
  pack_callback pack = nullptr;            ///< generic send: pack instead of reading the buffer
  void* pack_arg = nullptr;                ///< passed to `pack`
  /// Receives: filled when the receive completes at once (no request, no callback).
  tag_recv_info* recv_info = nullptr;
  uint32_t flags = 0;                      ///< request_flags
};

/// Result of a nonblocking operation: done (ok, no request), failed (an error, no request), or in
/// progress with a request that the callback will be called for, to be released with
/// worker::release.
struct [[nodiscard]] op {
  status st = status::ok;    ///< ok, in_progress, or an error
  request* req = nullptr;    ///< set while in progress

  /// True when the operation completed at once.
  bool done() const noexcept { return st == status::ok && req == nullptr; }
  /// True when a request is outstanding.
  bool pending() const noexcept { return req != nullptr; }
  /// True when the operation failed at once.
  bool failed() const noexcept { return is_error(st); }
};

/// How cancel treats a request.
enum class cancel_mode {
  report,  ///< complete the request with status::canceled and call its callback
  force,   ///< release it without calling the callback
};

}  // namespace comm
