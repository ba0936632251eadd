// Requests: the state of one nonblocking operation, pooled per worker.
#pragma once

#include <comm/transport/transport.hpp>
#include <comm/types.hpp>

#include "tag_matcher.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace comm {

namespace detail {
class endpoint_impl;
class worker_impl;
}

/// The plain fields of a request, reset in one assignment when the pool hands it out again.
struct request_fields {
  /// What the request does.
  enum class kind : uint8_t { tag_send, am_send, tag_recv, flush, close, control, get, put };

  /// How a send moves its data.
  enum class protocol : uint8_t { short_, bcopy, zcopy, rndv };

  /// Where a rendezvous send stands.
  enum class rndv_phase : uint8_t { none, announced, pushing };

  kind type = kind::tag_send;             ///< what the request does
  protocol proto = protocol::bcopy;       ///< send protocol
  status st = status::in_progress;        ///< in_progress, or the final status
  bool finished = false;                  ///< the operation is over (callback called)
  bool released = false;                  ///< the user released it; free once finished
  bool user_visible = false;              ///< handed to the user (must not be freed by us)
  bool has_started = false;               ///< a fragment reached the transport (no cancel)
  bool issuing = false;                   ///< inside progress_send (defer ordered completion)

  detail::worker_impl* owner = nullptr;   ///< the worker whose pool holds it
  detail::endpoint_impl* ep = nullptr;    ///< endpoint of a send, flush, close or fetch

  request_params params;                  ///< callbacks and flags

  // -- send state ----------------------------------------------------------------------------
  tag_t tag = 0;                          ///< tag of a tagged send
  uint16_t am_id = 0;                     ///< id of an AM
  uint16_t am_flags = 0;                  ///< wire flags of an AM
  size_t length = 0;                      ///< total data bytes
  size_t offset = 0;                      ///< data bytes handed to the transport so far
  uint64_t msg_id = 0;                    ///< identifies fragments of one message
  int zcopy_outstanding = 0;              ///< transport zcopy operations not yet complete
  tl::completion zcopy_done;              ///< transport completion of zcopy fragments / flush
  tl::am_id control_id = 0;               ///< protocol id of a control message
  request* next_pending = nullptr;        ///< in the endpoint's pending queue
  request* next_outstanding = nullptr;    ///< in the endpoint's ordered completion queue

  // -- rendezvous and RMA state --------------------------------------------------------------
  rndv_phase phase = rndv_phase::none;    ///< rendezvous send progress
  uint64_t rndv_id = 0;                   ///< our id in the worker's rendezvous table
  uint64_t rndv_peer_id = 0;              ///< the peer's request id (sreq or rreq)
  tl::md* rndv_md = nullptr;              ///< memory domain of a registration made for rendezvous
  tl::mem_handle* rndv_reg = nullptr;     ///< that registration
  size_t rndv_limit = 0;                  ///< bytes to push (software rendezvous)
  detail::endpoint_impl* rndv_ep = nullptr; ///< receiver: endpoint back to the sender
  tl::remote_key remote;                  ///< receiver: unpacked key of the sender's buffer
  bool remote_valid = false;              ///< `remote` must be released
  bool am_rndv = false;                   ///< receiver: fetching an active message
  uint64_t remote_address = 0;            ///< RMA / fetch: remote address
  comm::rkey* key = nullptr;              ///< RMA: the key
  unsigned reads = 0;                     ///< RMA: reads this request has in flight

  // -- receive state -------------------------------------------------------------------------
  detail::tag_expected expected;          ///< the posted receive in the matcher
  bool matched = false;                   ///< matched to a message (no longer cancellable)
  tag_recv_info info;                     ///< what was received
  size_t received = 0;                    ///< data bytes that arrived so far
};

static_assert(std::is_trivially_copyable_v<request_fields> && sizeof(request_fields) % 8 == 0 &&
                  offsetof(request_fields, received) + sizeof(size_t) == sizeof(request_fields),
              "request::reset copies it in 16- and 8-byte words and it has no tail padding");

/// One nonblocking operation (send, receive, flush, close, RMA). Allocated from the worker's
/// pool; its buffers keep their capacity across reuse.
class request : public request_fields {
public:
  std::vector<iov_entry> iov;             ///< data of a send or receive, in order
  std::vector<uint8_t> control;           ///< AM user header, or bytes of a control message
  std::vector<uint8_t> wire;              ///< an encoded rendezvous message

  /// Resets every field for reuse from the pool.
  void reset() {
    // A copy from a blank template in straight-line 16-byte moves: assigning a temporary, a
    // memcpy of the whole, or even a loop of vector moves compiles to `rep stos`/`rep movs`,
    // whose start-up cost dominated the per-message path.
    static const request_fields blank{};
    copy_words(reinterpret_cast<char*>(static_cast<request_fields*>(this)),
               reinterpret_cast<const char*>(&blank),
               std::make_index_sequence<sizeof(request_fields) / 16>{});
    if constexpr (sizeof(request_fields) % 16 != 0) {
      constexpr size_t last = sizeof(request_fields) - 8;
      std::memcpy(reinterpret_cast<char*>(static_cast<request_fields*>(this)) + last,
                  reinterpret_cast<const char*>(&blank) + last, 8);
    }
    iov.clear();
    control.clear();
    wire.clear();
  }

  /// Copies 16-byte word I of `from` to `to`, for every I, as separate fixed-size copies: one
  /// 16-byte load and store each (g++ 12 and clang 14 for x86-64, clang 14 for aarch64).
  template <size_t... I>
  static void copy_words(char* to, const char* from, std::index_sequence<I...>) {
    (std::memcpy(to + 16 * I, from + 16 * I, 16), ...);
  }

  /// The request whose posted-receive entry is `e`.
  static request* of_expected(detail::tag_expected* e) {
    return static_cast<request*>(reinterpret_cast<request_fields*>(
        reinterpret_cast<char*>(e) - offsetof(request_fields, expected)));
  }

  /// The request whose transport completion is `c`.
  static request* of_completion(tl::completion* c) {
    return static_cast<request*>(reinterpret_cast<request_fields*>(
        reinterpret_cast<char*>(c) - offsetof(request_fields, zcopy_done)));
  }
};

}  // namespace comm
