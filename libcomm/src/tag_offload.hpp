// Tag matching in the transport (COMM_TM_THRESH, UCP's tag offload): tagged receives and sends of
// at least config::tm_thresh bytes use the tag operations of an interface that matches tags
// itself (cap_tag_*: self and shm here, a NIC with tag matching elsewhere); everything else is
// matched in software by the worker's tag_matcher. Both give the same results. The rules that make
// them agree:
//
//  1. One queue of posted receives. Every posted receive sits in the worker's tag_matcher in
//     posting order, also the ones handed to the transport (tag_expected::offloaded). A message
//     matched in software (an AM-framed message, or one the transport passed to the unexpected
//     handlers) takes the earliest receive there; if that one is offloaded, it is first taken back
//     from the transport (tag_recv_cancel, forced), so the transport cannot fill it too.
//  2. The transport only sees receives it may match first. A receive is offloaded only when
//     nothing that arrived could take it (the unexpected queue was searched first, as for any
//     receive), its tag is exact (wildcard receives stay in software: a transport that matched
//     one could not tell which earlier exact receives it must yield to), and no software receive
//     that could take a message of its tag was posted before it (tag_matcher::software_may_take).
//     So the earliest receive the transport finds for a tag is also the earliest in the worker's
//     queue: whatever the transport matches, software would have matched the same way. A receive
//     posted after an offloaded one with the same tag may stay in software; the transport's
//     match then comes first, as its receive was posted first.
//  3. One interface per worker gets receives (as in UCP): receives for one tag must all sit in
//     one transport's list for rule 2 to hold. Messages through another interface's tag
//     operations come to the unexpected handlers and are matched in software (rule 1).
//  4. The transport's matches leave the queue at once: tag_consumed unlinks the receive before
//     any other message is matched, and completed ends it (data length, truncation).
//  5. Sends keep their order: a send goes through the tag operations of the endpoint's own lane
//     (the same transport endpoint as its AM-framed messages, one FIFO), from the endpoint's
//     pending queue like any send. A receiver therefore meets one sender's messages in send
//     order, whichever way each was framed and matched.
//  6. Unexpected messages from the transport join the software unexpected queue: whole eager
//     messages, fragments (tag_flag_first/more, gathered per message through the handler's
//     context) and rendezvous announcements (fetched later with get_zcopy and acknowledged with
//     RndvAts, as software rendezvous are), counted against the same limits, found by probes and
//     by later receives.
//  7. The sender is named on the wire: eager messages carry the sender's endpoint id in their
//     immediate value (so sends with a user immediate value stay in software), rendezvous carry
//     it in their TagOffloadRndv header with the send's id.
//  8. Cancel, endpoint failure and worker teardown take receives back from the transport before
//     they complete; the transport holds no registration of a receive (self and shm copy or read
//     into it), and a sender's rendezvous registration is the transport's, released when the
//     operation completes or is cancelled (tag_rndv_cancel).
//
// What differs from software matching: a message the transport matched is delivered even if its
// endpoint failed after sending it (software matching drops what a failed endpoint's peer sent),
// and a rendezvous the transport matched counts in the sender's counters only (the receiver's
// transport does not say who sent it).
#pragma once

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>
#include <comm/types.hpp>

#include <cstddef>
#include <cstdint>
#include <ostream>

namespace comm {
class request;
}

namespace comm::detail {

class endpoint_impl;
class tag_protocol;
class worker_impl;
struct tag_recv_state;
struct tag_send_state;

/// How a tagged send goes (tag_send_state::tm).
enum class tm_send : uint8_t {
  undecided,  ///< not chosen yet (first progress)
  software,   ///< the send engine's AM-framed eager or rendezvous
  bcopy,      ///< the lane's tag_eager_bcopy
  zcopy,      ///< the lane's tag_eager_zcopy
  rndv,       ///< the lane's tag_rndv_zcopy
};

/// Immediate value of a tagged eager message sent through tag matching: names the sender's
/// endpoint on the receiver (`dst`, the receiver's endpoint id).
constexpr uint64_t tm_sender_word(uint32_t dst) { return (uint64_t{0x746d0001} << 32) | dst; }

/// The receiver's endpoint id in a sender word; false when `imm` is not one.
constexpr bool tm_sender_of(uint64_t imm, uint32_t* dst) {
  if ((imm >> 32) != 0x746d0001) return false;
  *dst = static_cast<uint32_t>(imm);
  return true;
}

/// A worker's use of its interfaces' tag matching (see the top of this file).
class tag_offload {
public:
  /// Installs the unexpected handlers on every interface of `w` that matches tags and picks the
  /// one that gets receives.
  tag_offload(worker_impl& w, tag_protocol& t);
  /// Removes the handlers.
  ~tag_offload();
  tag_offload(const tag_offload&) = delete;
  tag_offload& operator=(const tag_offload&) = delete;

  /// Sends and receives of at least this many bytes may use tag matching.
  size_t thresh() const noexcept { return thresh_; }
  /// True when receives may go to a transport's tag matching (an interface offers it and the
  /// threshold is set): without it try_post has nothing to do.
  bool receives_offloaded() const noexcept { return iface_ != nullptr; }

  // -- receives --

  /// Hands the receive `req` (state `s`, not queued yet) to the transport if rule 2 allows it;
  /// sets s.expected.offloaded accordingly. The caller queues it in the matcher next.
  void try_post(request* req, tag_recv_state& s);
  /// Takes an offloaded receive back from the transport once it left the matcher's queue
  /// (matched in software, or removed to be cancelled): the matcher counts software receives by
  /// the flag this clears. Nothing for a software receive.
  void reclaim(tag_recv_state& s);

  // -- sends --

  /// Chooses how the send `req` goes (software unless tag matching may take it).
  tm_send choose(const request* req, const tag_send_state& s) const;
  /// Issues the send `req` through its lane's tag operations (as send_message does for the
  /// software ones): ok once issued (zcopy and rendezvous complete later), no_resource, or an
  /// error.
  status send(request* req, tag_send_state& s);

  /// The interface that gets receives, or null (off, or none offers tag matching).
  const tl::iface* receiving_iface() const noexcept { return iface_; }
  /// Receives handed to the transport so far.
  uint64_t posted() const noexcept { return posted_; }
  /// Receives the transport matched so far.
  uint64_t matched() const noexcept { return matched_; }
  /// Receives taken back from the transport so far.
  uint64_t reclaimed() const noexcept { return reclaimed_; }
  /// Sends through tag operations so far.
  uint64_t sent() const noexcept { return sent_; }
  /// Messages the unexpected handlers received so far.
  uint64_t unexpected() const noexcept { return unexpected_; }

  /// Appends the offload's lines to worker::info().
  void info(std::ostream& out) const;

private:
  static void on_consumed(tl::tag_context* ctx);
  static void on_completed(tl::tag_context* ctx, tag_t stag, uint64_t imm, size_t length,
                           status result);
  static void on_rndv_request(tl::tag_context* ctx, tag_t stag, const void* header,
                              size_t header_length, status result);
  static status on_unexpected_eager(void* arg, void* data, size_t length, unsigned flags,
                                    tag_t stag, uint64_t imm, void** context);
  static status on_unexpected_rndv(void* arg, unsigned flags, tag_t stag, const void* header,
                                   size_t header_length, uint64_t remote_address, size_t length,
                                   const void* rkey, size_t rkey_length);
  static void on_rndv_sent(tl::completion* comp);

  status send_rndv(request* req, tag_send_state& s);
  status send_zcopy(request* req, tag_send_state& s);
  status send_bcopy(request* req, tag_send_state& s);
  /// The endpoint a message through tag matching names in `imm`, or null (a protocol error
  /// when it names none, counted and logged).
  endpoint_impl* sender_of(uint64_t imm);

  worker_impl& w_;
  tag_protocol& t_;
  wire::header_writer<wire::schema::TagOffloadRndv> rndv_header_;  ///< of send_rndv
  tl::iface* iface_ = nullptr;  ///< the interface that gets receives, or null
  size_t thresh_ = SIZE_MAX;    ///< config::tm_thresh
  uint64_t posted_ = 0;         ///< receives handed to the transport
  uint64_t matched_ = 0;        ///< ... that the transport matched
  uint64_t reclaimed_ = 0;      ///< ... taken back (matched in software, cancelled, teardown)
  uint64_t sent_ = 0;           ///< sends through tag operations
  uint64_t unexpected_ = 0;     ///< messages the unexpected handlers received
};

}  // namespace comm::detail
