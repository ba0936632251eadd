// Requests: the state of one nonblocking operation, pooled per worker.
#pragma once

#include <comm/transport/transport.hpp>
#include <comm/types.hpp>

#include "tag_matcher.hpp"

#include <cstdint>
#include <vector>

namespace comm {

namespace detail {
class endpoint_impl;
class worker_impl;
}

/// One nonblocking operation (send, receive, flush, close). Allocated from the worker's pool.
class request {
public:
  /// What the request does.
  enum class kind : uint8_t { tag_send, am_send, tag_recv, flush, close, control };

  /// How a send moves its data.
  enum class protocol : uint8_t { short_, bcopy, zcopy };

  kind type = kind::tag_send;             ///< what the request does
  protocol proto = protocol::bcopy;       ///< send protocol
  status st = status::in_progress;        ///< in_progress, or the final status
  bool finished = false;                  ///< the operation is over (completion may wait for order)
  bool released = false;                  ///< the user released it; free once finished
  bool user_visible = false;              ///< handed to the user (must not be freed by us)
  bool has_started = false;               ///< a fragment reached the transport (no cancel)
  bool issuing = false;                   ///< inside progress_send (defer ordered completion)

  detail::worker_impl* owner = nullptr;   ///< the worker whose pool holds it
  detail::endpoint_impl* ep = nullptr;    ///< endpoint of a send, flush or close

  request_params params;                  ///< callbacks and flags

  // -- send state ----------------------------------------------------------------------------
  tag_t tag = 0;                          ///< tag of a tagged send
  uint16_t am_id = 0;                     ///< id of an AM send
  uint16_t am_flags = 0;                  ///< wire flags of an AM send
  const uint8_t* am_header = nullptr;     ///< user header of an AM send
  size_t am_header_length = 0;            ///< its length
  std::vector<iov_entry> iov;             ///< data of a send or receive, in order
  size_t length = 0;                      ///< total data bytes
  size_t offset = 0;                      ///< data bytes handed to the transport so far
  uint64_t msg_id = 0;                    ///< identifies fragments of one message
  int zcopy_outstanding = 0;              ///< transport zcopy operations not yet complete
  tl::completion zcopy_done;              ///< transport completion of zcopy fragments / flush
  tl::am_id control_id = 0;               ///< protocol id of a control message
  std::vector<uint8_t> control;           ///< bytes of a control message (wireup, close)
  request* next_pending = nullptr;        ///< in the endpoint's pending queue
  request* next_outstanding = nullptr;    ///< in the endpoint's ordered completion queue

  // -- receive state -------------------------------------------------------------------------
  detail::tag_expected expected;          ///< the posted receive in the matcher
  bool matched = false;                   ///< matched to a message (no longer cancellable)
  tag_recv_info info;                     ///< what was received
  size_t received = 0;                    ///< data bytes that arrived so far

  /// Resets every field for reuse from the pool.
  void reset();
};

}  // namespace comm
