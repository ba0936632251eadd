// The shm transport: a lock-free multi-producer FIFO of cells in a memfd segment per receiving
// interface (see shm_segment.hpp for the layout and the FIFO protocol).
//
//   am_short  copies into the cell (max_short = cell_size - 16);
//   am_bcopy  packs straight into the receiver's buffer of that cell (max_bcopy = segment_size);
//   am_zcopy  writes a ShmZcopyDescriptor + the protocol header into that buffer; the receiver pulls
//             the payload from the sender with process_vm_readv into a private buffer, calls the
//             handler, then sets the cell's ack word, which the sender's progress() sees.
// A handler may keep a bcopy or zcopy message (am_flag_desc, at most max_am_descs at once): a
// bcopy's receive buffer is lent and its cell gets a spare buffer of the segment; a zcopy's private
// buffer is lent and replaced from a desc_pool. am_short messages live in the cell itself and
// arrive without the flag (as in UCX's mm transport).
// Blocking progress: the event fd is an epoll fd with an abstract-namespace datagram socket (woken
// by the sender that clears head_armed, and by a receiver acking a zcopy whose ack word we marked
// with ack_wake) and a pidfd of every peer (so a dead peer wakes us too). Parked requests keep
// event_arm() busy: room in a peer's FIFO comes without a wakeup.
// Peers: the endpoints to one peer interface share its mapped segment and a pidfd of its process
// (shm_peer.hpp), released with the last of them; a peer's segment is only mapped once it proved
// to be that peer's sealed memfd (shm_peer_fd.hpp).
// Peer failure: pidfds and the peer segment's `closed` flag, checked every few milliseconds; a
// failed peer fails every endpoint to it.
// Memory domain and RMA: shm_md.hpp (a region table in the segment, CMA get/put, or memcpy through
// peers' shared-heap segments mapped here: shm_mapped.hpp).
// Tag matching (cap_tag_*) happens here, in the receiving interface (base/tag_offload.hpp), on cell
// kinds of their own that the AM path only meets in its switch's default branch:
//   tag_eager_short  a ShmTagHeader (tag, imm) and the message in the cell;
//   tag_eager_bcopy  the header in the cell, the message packed into the cell's receive buffer;
//   tag_eager_zcopy  a ShmTagZcopyDescriptor in the buffer, acked as am_zcopy: the receiver pulls
//                    the payload with CMA straight into a matching posted receive, or into its
//                    zcopy buffer and hands it to the unexpected handler in fragments of a receive
//                    buffer's size (tag_flag_first/more), nothing of it when the pull fails;
//   tag_rndv_zcopy   a ShmTagRndvDescriptor (the sender's interface address, its operation word,
//                    the buffer's address, length and key) and the header in the buffer. The
//                    receiver maps the sender's segment through an endpoint of its own (kept per
//                    sender, never reported to the error handler), claims the operation word,
//                    and either fetches the data into the posted receive with that endpoint's
//                    get_zcopy and marks the word done (the sender's progress completes it), or
//                    marks it unexpected and hands address, length and key to the handler;
//   tag_rndv_request a ShmTagHeader in the cell, the header in the buffer.
// Everything a tagged cell holds is copied out of shared memory before it is checked; a cell that
// fails a check is logged, counted and skipped before anything is matched (a zcopy one is acked
// with protocol_error), so a peer's bad bytes never consume a posted receive or disturb another
// peer's messages.
#pragma once

#include "base/desc_pool.hpp"
#include "base/iface_base.hpp"
#include "base/membind.hpp"
#include "base/tag_offload.hpp"
#include "shm/shm_mapped.hpp"
#include "shm/shm_md.hpp"
#include "shm/shm_peer.hpp"
#include "shm/shm_segment.hpp"

#include <comm/transport/transport.hpp>

#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace comm::tl::shm {

/// The shm transport's component.
component& shm_component();

/// Messages handlers may keep at once (am_flag_desc), bcopy (a spare segment buffer each, see
/// spare_buffers) and zcopy (a private zcopy buffer each) together.
inline constexpr size_t max_am_descs = spare_buffers;

/// Receives an interface may have posted at once.
inline constexpr size_t tag_max_outstanding = 256;
/// Largest header of tag_rndv_zcopy and tag_rndv_request.
inline constexpr size_t tag_rndv_max_hdr = 256;
/// Largest packed key a rendezvous announcement may carry (an shm key with its heap extension).
inline constexpr size_t tag_rndv_max_rkey = 128;
/// Senders whose segments an interface keeps mapped to fetch their rendezvous from.
inline constexpr size_t max_rndv_sources = 256;

class shm_ep;
struct tag_header_writer;

/// An shm interface: a receive segment (FIFO + region table) and the endpoints to peers.
class shm_iface final : public iface_base {
public:
  /// Opens an interface; the constructor leaves `open_status()` set.
  explicit shm_iface(const iface_params& params);
  ~shm_iface() override;

  /// ok, or why the interface could not be opened.
  status open_status() const { return open_status_; }

  // -- iface --

  const iface_attr& attr() const override { return attr_; }
  std::string_view transport_name() const override { return "shm"; }
  unsigned progress() override;
  int event_fd() const override { return epoll_fd_; }
  status event_arm() override;
  std::vector<uint8_t> device_address() const override;
  std::vector<uint8_t> iface_address() const override;
  bool is_reachable(const std::vector<uint8_t>& device_address,
                    const std::vector<uint8_t>& iface_address) const override;
  status create_ep(const std::vector<uint8_t>& device_address,
                   const std::vector<uint8_t>& iface_address, std::unique_ptr<ep>& out) override;
  md* memory_domain() override { return md_.get(); }
  std::string info() const override;
  void release_am_desc(void* data) override;
  status set_tag_handlers(tag_unexp_eager_fn eager, void* eager_arg, tag_unexp_rndv_fn rndv,
                          void* rndv_arg) override;
  status tag_recv_zcopy(tag_t tag, tag_t tag_mask, const iov* entries, size_t count,
                        tag_context* ctx) override;
  status tag_recv_cancel(tag_context* ctx, bool force) override;

  // -- used by shm_ep --

  /// Reports `ep`'s peer as failed (an RMA found it gone): progress() completes the operations of
  /// every endpoint to it and calls the error handler, as for any peer failure.
  void peer_failed(shm_ep* ep);

  /// Counts one RMA operation of `bytes` that ended with `result`.
  void count_rma(bool put, size_t bytes, status result) { rma_.count(put, bytes, result); }

  /// Counts one RMA operation (already counted by count_rma) that took the mapped path.
  void count_mapped(bool put) { ++(put ? mapped_puts_ : mapped_gets_); }

  /// Peers' shared-heap segments mapped by this interface.
  mapped_segments& mapped() { return mapped_; }

  /// The unbound datagram socket endpoints send wakeups through.
  int wakeup_sender_fd() const { return wakeup_tx_fd_; }

  /// The random id of this interface (also in its segment and wakeup socket name).
  uint64_t id() const { return iface_id_; }

  /// Puts `ep` on the list of endpoints whose zcopy completions and parked requests progress()
  /// advances.
  void schedule(shm_ep* ep);

  /// Forgets `ep` (destroyed), and its peer with the peer's last endpoint.
  void forget(shm_ep* ep);

  /// This interface's address.
  iface_addr own_address() const;

  /// Writes the ShmTagHeader of `tag` and `imm` to `dest` (tag_header_size bytes, aligned).
  void write_tag_header(void* dest, tag_t tag, uint64_t imm);

  /// Takes a free rendezvous slot of our segment with its next generation; false when none.
  bool rndv_alloc(uint32_t* slot, uint64_t* generation);
  /// Returns a slot taken with rndv_alloc.
  void rndv_free(uint32_t slot) { rndv_free_.push_back(slot); }
  /// The word of our rendezvous slot `slot`.
  uint64_t& rndv_word(uint32_t slot) const { return segment_.rndv_op(slot); }

private:
  unsigned receive();
  void deliver(uint64_t index, cell_header* cell);
  status receive_zcopy(uint64_t index, cell_meta meta, int32_t* sender);
  void acknowledge(uint64_t index, cell_header* cell, status result, int32_t sender);
  /// Calls the handler of `id`, lending it the descriptor when one may be lent; true when it kept
  /// the descriptor.
  bool call_handler(am_id id, void* data, size_t length);
  /// Counts and logs a message for `id` without a handler.
  void unhandled(am_id id);
  /// True when one more descriptor may be lent.
  bool can_lend() const { return lent_buffers_.size() + zcopy_descs_.lent() < max_am_descs; }
  /// Lends the buffer of FIFO position `index` (a handler kept it) and gives the cell a spare.
  void lend_buffer(uint64_t index);
  /// Lends the zcopy buffer (a handler kept the message in it) and takes a fresh one.
  void lend_zcopy_buffer();
  void malformed(uint64_t index, const char* why);
  // -- tag matching --
  void receive_tag(uint64_t index, cell_header* cell, cell_meta meta);
  void receive_tag_inline(uint64_t index, cell_header* cell, cell_meta meta);
  void receive_tag_buffered(uint64_t index, cell_header* cell, cell_meta meta);
  status receive_tag_zcopy(uint64_t index, cell_meta meta, int32_t* sender);
  /// Delivers `total` bytes in the zcopy buffer as unexpected fragments.
  void unexpected_fragments(size_t total, tag_t tag, uint64_t imm);
  void receive_tag_rndv(uint64_t index, cell_meta meta);
  /// Claims, fetches or hands over, and ends the announced rendezvous.
  void take_rndv(shm_ep& source, uint32_t slot, uint64_t generation, tag_t tag,
                 const uint8_t* header, size_t header_length, uint64_t address, uint64_t length,
                 const uint8_t* rkey, size_t rkey_length);
  /// The endpoint of our own to the sender at `address`, made on first use; null when it cannot
  /// be reached.
  shm_ep* rndv_source(const iface_addr& address);
  void publish_tail();
  /// Binds the receive segment to `nodes` (iface_params::numa_nodes); a failure is logged and
  /// shown by info(), and the interface works with the memory where the kernel put it.
  void place_segment(std::span<const unsigned> nodes);
  unsigned progress_eps();
  /// The peer interface at `address`: the one endpoints already share, or newly attached.
  status find_or_attach(const iface_addr& address, shm_peer** out);
  status attach_peer(const iface_addr& address, shm_peer** out);
  void release_peer(shm_peer& peer);
  void maybe_check_peers();
  void check_peers();
  void drain_wakeups();
  void notice_peer_failure(shm_peer& peer);
  unsigned report_failures();

  status open_status_ = status::ok;
  iface_attr attr_;
  placement_outcome placement_;    ///< where the segment's memory went (iface_params::numa_nodes)

  // -- receive side, hot --
  segment segment_;
  uint64_t tail_ = 0;              ///< next cell to consume
  uint64_t published_tail_ = 0;    ///< last tail stored in the control block
  uint64_t publish_mask_ = 0;      ///< publish when (tail_ & publish_mask_) == 0
  uint64_t received_ = 0;
  std::vector<uint32_t> buffer_of_;  ///< our copy of the segment's buffer_of, by cell
  std::vector<uint32_t> spare_slots_;   ///< receive buffers no cell uses and no handler holds
  std::vector<uint32_t> lent_buffers_;  ///< receive buffers handlers kept

  // -- everything else --
  unsigned progress_calls_ = 0;
  uint64_t last_check_ns_ = 0;
  /// Peer interfaces with endpoints, by (pid, interface id).
  std::map<std::pair<int32_t, uint64_t>, std::unique_ptr<shm_peer>> peers_;
  std::vector<shm_ep*> eps_;       ///< every endpoint of this interface
  std::vector<shm_ep*> work_;      ///< endpoints with work (null: destroyed meanwhile)
  std::vector<shm_ep*> failed_;    ///< failed endpoints not yet reported
  desc_pool::block zcopy_buffer_;  ///< zcopy header + payload land here
  desc_pool zcopy_descs_{max_am_descs};  ///< zcopy buffers kept by handlers
  uint64_t iface_id_ = 0;
  int memfd_ = -1;
  int epoll_fd_ = -1;
  int wakeup_rx_fd_ = -1;
  int wakeup_tx_fd_ = -1;
  uint64_t malformed_ = 0;
  uint64_t unhandled_ = 0;
  uint64_t zcopy_errors_ = 0;
  uint64_t peers_failed_ = 0;
  uint64_t peers_refused_ = 0;     ///< addresses whose segment was not what they said
  std::unique_ptr<shm_md> md_;     ///< registrations in segment_'s region table
  rma_counters rma_;
  mapped_segments mapped_;         ///< peers' heap segments, for the mapped RMA path
  uint64_t mapped_gets_ = 0;
  uint64_t mapped_puts_ = 0;

  // -- tag matching --
  tag_offload tags_{tag_max_outstanding};  ///< posted receives, unexpected handlers
  std::unique_ptr<tag_header_writer> tag_header_;  ///< made at the first tagged send
  std::vector<uint32_t> rndv_free_;        ///< free rendezvous slots of our segment
  std::vector<uint64_t> rndv_generation_;  ///< last generation of each slot
  /// Our endpoints to senders of rendezvous, by (pid, interface id).
  std::map<std::pair<int32_t, uint64_t>, std::unique_ptr<shm_ep>> rndv_sources_;
  uint64_t rndv_skipped_ = 0;       ///< announced rendezvous canceled before we took them
  uint64_t rndv_unreachable_ = 0;   ///< rendezvous whose sender we could not map
  uint64_t rndv_fetch_errors_ = 0;  ///< matched rendezvous whose data could not be read
};

}  // namespace comm::tl::shm
