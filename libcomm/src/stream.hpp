// The stream module: an ordered byte stream per endpoint pair (ucp_stream_*). Message boundaries
// mean nothing to the receiver, which appends every payload to the endpoint's stream in arrival
// order. A stream send goes through the send engine (send.hpp) eager bcopy, whole (StreamData) or
// in fragments (StreamFirst, then FragmentMiddle); a send that asks for it (request_force_rndv)
// goes by rendezvous (the rndv module's announcement with isStream): the receiver reads the bytes
// straight into the receives posted on the endpoint (the rest into the stream's buffer) and
// acknowledges, which completes the send. Rendezvous is not chosen by size: on shm, where the read
// is a cross-memory read, it loses to two copies through the FIFO at every size up to 1 MiB
// (measured, issue 14), and UCX's streams are eager too.
//
// Bytes fill the receives posted on the endpoint in posting order; what no receive waits for is
// buffered: the transport's descriptor is kept when it lends one (no copy), else the bytes are
// copied into blocks. Buffered bytes count against COMM_STREAM_RX_EP_MAX_BYTES and
// COMM_STREAM_RX_MAX_BYTES (a peer that passes one fails its endpoint with EXCEEDS_LIMIT), and
// worker::stream_poll reports them until they are received. While a rendezvous read is under way
// on an endpoint (a transport whose reads complete later), what arrives after it waits, counted
// the same way, and is appended once the read ended.
#pragma once

#include "rndv.hpp"
#include "send.hpp"
#include "worker_impl.hpp"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>

namespace comm::detail {

/// Wire ids of the stream module (its rendezvous goes as the rndv module's messages).
enum class stream_msg : tl::am_id {
  data = 19,      ///< StreamData: stream bytes sent whole
  first = 20,     ///< StreamFirst: the first fragment of a fragmented stream send
  fragment = 21,  ///< FragmentMiddle: a later fragment
};

/// Rendezvous bytes an endpoint reads into its buffer before any receive asks for them (at most
/// half of COMM_STREAM_RX_EP_MAX_BYTES): sends that fit complete without waiting for their
/// receive, as into a socket's buffer. Beyond it, an announcement waits (parked) until a receive
/// is posted, stream_recv_data asks for it, or the endpoint goes; so does what arrives after it.
inline constexpr size_t stream_read_ahead = size_t{4} << 20;

/// State of a stream send.
struct stream_send_state {
  send_progress send;  ///< the send engine's part
  rndv_send rndv;      ///< the rendezvous part, when it goes by rendezvous
};

/// State of a stream receive.
struct stream_recv_state {
  size_t length = 0;          ///< bytes of the user's buffer
  size_t min_length = 0;      ///< completes once it holds this many
  size_t received = 0;        ///< bytes written so far
  size_t reserved = 0;        ///< bytes a rendezvous read under way writes after `received`
  request* next = nullptr;    ///< the next receive posted on the endpoint
};

/// Buffered stream bytes: [begin, end) of a block of `capacity` bytes that we allocated, or of a
/// descriptor the transport lent (`desc_iface` set; `data` is what its handler was given).
struct stream_block {
  uint8_t* data = nullptr;          ///< the block, or the descriptor
  size_t capacity = 0;              ///< bytes allocated (0 for a descriptor)
  size_t begin = 0;                 ///< first byte not yet received
  size_t end = 0;                   ///< one past the last byte
  tl::iface* desc_iface = nullptr;  ///< the interface a kept descriptor goes back to
  size_t cost = 0;                  ///< what it counts against the stream limits
  /// Stream bytes it holds.
  size_t bytes() const { return end - begin; }
};

/// State of the module's own request that reads a rendezvous into the stream.
struct stream_fetch_state {
  rndv_fetch fetch;             ///< the rndv module's part
  stream_block block;           ///< where the bytes no receive took go (null data: none)
  size_t targets = 0;           ///< posted receives it writes into, from the first one
  bool drop_block = false;      ///< the peer's bytes were dropped meanwhile: free `block`
};

/// Counts of how stream bytes moved (worker::info), to see copies and fragments.
struct stream_counters {
  uint64_t fragments = 0;         ///< eager messages and fragments received
  uint64_t direct_bytes = 0;      ///< copied from the transport into posted receives
  uint64_t copied_bytes = 0;      ///< copied from the transport into blocks
  uint64_t kept_descs = 0;        ///< transport descriptors kept instead of a copy
  uint64_t kept_bytes = 0;        ///< their bytes
  uint64_t drained_bytes = 0;     ///< copied from the buffer into receives
  uint64_t fetches = 0;           ///< rendezvous reads
  uint64_t fetched_direct = 0;    ///< bytes they read into posted receives
  uint64_t fetched_buffered = 0;  ///< bytes they read into blocks
  uint64_t held = 0;              ///< messages that arrived behind a read under way
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
  /// Removes `req` from the receives posted on its endpoint; false if it is not there, or a
  /// rendezvous read is writing into it.
  bool unpost(request* req);

  // -- for the rndv module --
  /// A rendezvous announcement of stream bytes arrived on `ep`: reads them now (or once the read
  /// under way ended).
  void on_announcement(endpoint_impl& ep, rndv_announcement&& a);
  /// A read started by on_announcement ended with `outcome` (the sender was answered).
  void end_fetch(request* fetch, status outcome);

  void forget_peer(endpoint_impl& ep, held_fate fate) override;
  void endpoint_failed(endpoint_impl& ep, status reason) override;
  void endpoint_deleted(endpoint_impl& ep) override;
  void info(std::ostream& out) const override;

  /// How stream bytes moved so far.
  const stream_counters& counters() const noexcept { return counters_; }
  /// Transport descriptors kept now, in the buffer or lent to the user.
  size_t kept_descs() const noexcept { return kept_descs_; }

  // Long-lived header builders (one per header type, see comm/wire/codec.hpp).
  wire::header_writer<wire::schema::StreamData> hdr_data;
  wire::header_writer<wire::schema::StreamFirst> hdr_first;

private:
  struct ep_state;
  /// Something that arrived while a rendezvous read was under way, appended once it ended.
  struct held_item {
    stream_block bytes;                          ///< eager bytes (none for an announcement)
    size_t cost = 0;                             ///< what it counts against the limits
    std::unique_ptr<rndv_announcement> announced; ///< a later rendezvous announcement
    /// It arrived behind a read, not behind a parked announcement: it may still be read ahead
    /// into the buffer, as it would have been had the read ended first.
    bool may_read_ahead = false;
  };
  /// Where the payload of a transport message came from, to keep it as a descriptor (handlers
  /// pass one only when the transport lends the data).
  struct arrival {
    tl::iface* from = nullptr;  ///< the delivering interface (null: cannot be kept)
    uint8_t* desc = nullptr;    ///< what its handler was given
    unsigned flags = 0;         ///< the handler's flags (tl::am_flag_desc)
  };

  status on_data(tl::iface* from, uint8_t* data, size_t length, unsigned flags);
  status on_first(tl::iface* from, uint8_t* data, size_t length, unsigned flags);
  status on_fragment(tl::iface* from, uint8_t* data, size_t length, unsigned flags);
  /// Appends `length` bytes that arrived on `ep` to its stream: into the posted receives, then
  /// into the buffer (or held behind a read under way). in_progress when the descriptor was kept.
  status take(endpoint_impl* ep, const uint8_t* data, size_t length, const arrival* from);
  /// Fills the receives posted on `ep` from `data`; returns the bytes they took. False in
  /// `*alive` when a completion callback closed or failed the endpoint.
  size_t fill_receives(endpoint_impl* ep, ep_state& s, const uint8_t* data, size_t length,
                       bool* alive);
  /// Buffers `length` bytes for `ep` within the limits (else fails it): keeps the descriptor
  /// when it may, else copies. in_progress when the descriptor was kept.
  status buffer(endpoint_impl* ep, ep_state& s, const uint8_t* data, size_t length,
                const arrival* from);
  /// Holds `length` bytes that arrived while a read is under way on `ep`.
  status hold(endpoint_impl* ep, ep_state& s, const uint8_t* data, size_t length,
              const arrival* from);
  /// Makes a block for `length` bytes at `data`: the descriptor when it may be kept, else a
  /// copy; false when no memory.
  bool make_block(const uint8_t* data, size_t length, const arrival* from, stream_block* out);
  /// True when the descriptor `from` came in may be kept for `length` of its bytes: the
  /// transport lent it, its descriptors are small, and at least half of one is stream bytes
  /// (smaller payloads are copied into shared blocks instead).
  static bool keepable(size_t length, const arrival* from);
  /// Charges `cost` bytes for `ep` against the stream limits; false, with `ep` failed, when that
  /// would pass one.
  bool charge(endpoint_impl* ep, ep_state& s, size_t cost);
  /// Undoes charge.
  void uncharge(ep_state& s, size_t cost);
  /// Starts the rendezvous read of `a` on `ep` into its posted receives and the buffer.
  void start_fetch(endpoint_impl& ep, ep_state& s, rndv_announcement&& a);
  /// Moves the stream of `ep` on after a read ended, a receive was posted or the endpoint
  /// failed: the receives posted take the buffer, then what was held arrives in order, up to an
  /// announcement no receive wants (parked; `force`: read into the buffer when it is empty).
  void advance(endpoint_impl* ep, ep_state& s, bool force);
  /// advance() without the guard and the ready list.
  void advance_held(endpoint_impl* ep, ep_state& s, bool force);
  /// Frees what `ep` holds behind a read or a parked announcement.
  void drop_held(ep_state& s);
  /// True when an announcement held on `s` waits for a receive (what comes after it does too).
  static bool parked_behind(const ep_state& s);
  /// Rendezvous bytes `ep` reads into its buffer ahead of any receive.
  size_t read_ahead(const endpoint_impl& ep) const;
  /// Moves up to `length` buffered bytes of `ep` into `entries` at `offset`; returns how many.
  size_t drain(endpoint_impl& ep, ep_state& s, std::span<const iov_entry> entries,
               size_t offset, size_t length);
  /// Serves the receives posted on `ep` from its buffer, in order, while it has bytes. False
  /// when a completion callback closed or failed the endpoint.
  bool serve_from_buffer(endpoint_impl* ep, ep_state& s);
  /// Completes every receive posted on `ep` with `st`.
  void complete_recvs(endpoint_impl& ep, ep_state& s, status st);
  /// Frees every buffered block of `ep`, and what it holds behind a read.
  void free_blocks(endpoint_impl& ep, ep_state& s);
  /// Keeps the ready list in step with what `ep` buffers.
  void update_ready(endpoint_impl& ep, ep_state& s);
  /// Appends `s` to the ready list.
  void link_ready(ep_state& s);
  /// Takes `s` out of the ready list.
  void unlink_ready(ep_state& s);
  /// A block of `capacity` bytes (the spare one when it fits), or null.
  uint8_t* take_block(size_t capacity);
  /// Gives back what `b` holds: frees its block (or keeps it as the spare) or its descriptor.
  void drop_block(const stream_block& b);

  /// What stream_recv_data lent: the block or descriptor to give back.
  struct lent_block {
    uint8_t* start = nullptr;         ///< the block, or the descriptor
    tl::iface* desc_iface = nullptr;  ///< set for a descriptor
  };

  ep_state* ready_head_ = nullptr;                 ///< endpoints with buffered data, oldest first
  ep_state* ready_tail_ = nullptr;
  size_t ready_count_ = 0;                         ///< endpoints in the ready list
  uint8_t* spare_ = nullptr;                       ///< a freed smallest block, kept for reuse
  std::unordered_map<void*, lent_block> lent_;     ///< data lent to the user -> its block
  size_t buffered_total_ = 0;                      ///< bytes counted against the worker's limit
  size_t kept_descs_ = 0;                          ///< transport descriptors kept (lent included)
  stream_counters counters_;                       ///< how bytes moved
};

}  // namespace comm::detail
