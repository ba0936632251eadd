// The stream module: an ordered byte stream per endpoint pair (ucp_stream_*). A stream send goes
// eager through the send engine (send.hpp), whole (StreamData) or in fragments (StreamFirst, then
// FragmentMiddle); message boundaries mean nothing to the receiver, which appends every payload
// to the endpoint's stream in arrival order. Bytes fill the receives posted on the endpoint in
// posting order; what no receive waits for is buffered in blocks, counted against
// COMM_STREAM_RX_EP_MAX_BYTES and COMM_STREAM_RX_MAX_BYTES (a peer that passes one fails its
// endpoint with EXCEEDS_LIMIT), and reported by worker::stream_poll until it is received.
#pragma once

#include "send.hpp"
#include "worker_impl.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>

namespace comm::detail {

/// Wire ids of the stream module.
enum class stream_msg : tl::am_id {
  data = 19,      ///< StreamData: stream bytes sent whole
  first = 20,     ///< StreamFirst: the first fragment of a fragmented stream send
  fragment = 21,  ///< FragmentMiddle: a later fragment
};

/// State of a stream send.
struct stream_send_state {
  send_progress send;  ///< the send engine's part
};

/// State of a stream receive.
struct stream_recv_state {
  size_t length = 0;          ///< bytes of the user's buffer
  size_t min_length = 0;      ///< completes once it holds this many
  size_t received = 0;        ///< bytes written so far
  request* next = nullptr;    ///< the next receive posted on the endpoint
};

/// The stream module (see the top of this file).
class stream_protocol final : public protocol {
public:
  stream_protocol(worker_impl& w, unsigned index);
  ~stream_protocol() noexcept override;
  std::string_view name() const noexcept override { return "stream"; }

  // -- for the public API (stream.cpp) --
  /// Posts the receive `req` (state made) on `ep`, or completes it from buffered bytes.
  op post_recv(endpoint_impl& ep, request* req);
  /// Copies buffered bytes of `ep` into `buffer` when at least `min_length` are there and no
  /// receive waits; returns how many (0: not enough).
  size_t recv_now(endpoint_impl& ep, void* buffer, size_t length, size_t min_length);
  /// Lends the oldest buffered block of `ep` to the user (endpoint::stream_recv_data).
  void* lend_block(endpoint_impl& ep, size_t* length);
  /// Frees a block lent by lend_block; false if `data` is not one.
  bool release_block(void* data);
  /// Fills `out` with up to `max` endpoints with data ready (worker::stream_poll).
  size_t poll(stream_poll_entry* out, size_t max);
  /// Stream bytes buffered on `ep`.
  size_t buffered(const endpoint_impl& ep) const;
  /// Removes `req` from the receives posted on its endpoint; false if it is not there.
  bool unpost(request* req);

  void forget_peer(endpoint_impl& ep, held_fate fate) override;
  void endpoint_failed(endpoint_impl& ep, status reason) override;
  void endpoint_deleted(endpoint_impl& ep) override;
  void info(std::ostream& out) const override;

  // Long-lived header builders (one per header type, see comm/wire/codec.hpp).
  wire::header_writer<wire::schema::StreamData> hdr_data;
  wire::header_writer<wire::schema::StreamFirst> hdr_first;

private:
  struct ep_state;
  void on_data(const uint8_t* data, size_t length);
  void on_first(const uint8_t* data, size_t length);
  void on_fragment(const uint8_t* data, size_t length);
  /// Appends `length` bytes that arrived on `ep` to its stream: into the posted receives, then
  /// into the buffer.
  void take(endpoint_impl* ep, const uint8_t* data, size_t length);
  /// Buffers `length` bytes for `ep` within the limits (else fails it).
  void buffer(endpoint_impl* ep, ep_state& s, const uint8_t* data, size_t length);
  /// Moves up to `length` buffered bytes of `ep` into `entries` at `offset`; returns how many.
  size_t drain(endpoint_impl& ep, ep_state& s, std::span<const iov_entry> entries,
               size_t offset, size_t length);
  /// Completes every receive posted on `ep` with `st`.
  void complete_recvs(endpoint_impl& ep, ep_state& s, status st);
  /// Frees every buffered block of `ep`.
  void free_blocks(endpoint_impl& ep, ep_state& s);
  /// Keeps the ready list in step with what `ep` buffers.
  void update_ready(endpoint_impl& ep, ep_state& s);
  /// Appends `s` to the ready list.
  void link_ready(ep_state& s);
  /// Takes `s` out of the ready list.
  void unlink_ready(ep_state& s);
  /// A block of `capacity` bytes (the spare one when it fits), or null.
  uint8_t* take_block(size_t capacity);
  /// Frees a block of `capacity` bytes (or keeps it as the spare).
  void drop_block(uint8_t* data, size_t capacity);

  ep_state* ready_head_ = nullptr;                 ///< endpoints with buffered data, oldest first
  ep_state* ready_tail_ = nullptr;
  size_t ready_count_ = 0;                         ///< endpoints in the ready list
  uint8_t* spare_ = nullptr;                       ///< a freed smallest block, kept for reuse
  std::unordered_map<void*, void*> lent_;          ///< data lent to the user -> its block
  size_t buffered_total_ = 0;                      ///< bytes counted against the worker's limit
};

}  // namespace comm::detail
