// The rendezvous module: large tagged messages and active messages move with one copy (zero on
// the sender).
//
// The sender registers its buffer and announces it (RndvRts: tag or AM id, length, address, packed
// key). The matched receiver reads the data straight into its buffer with the transport's
// get_zcopy (iov filled in order) and acknowledges (RndvAts); the sender's request completes on
// that acknowledgement. Where the lane has no get, the receiver asks (RndvRtr) and the sender
// pushes RndvData fragments (software rendezvous). An announcement that arrives before its receive
// waits in the tag module's unexpected queue (or the AM module's deferred list); nothing is
// fetched before a match. Stream bytes sent by rendezvous are fetched on arrival, into the
// receives posted on the endpoint and the stream's buffer (stream.hpp).
//
// The tag and AM modules own the requests: a send keeps an rndv_send in its state, a receive an
// rndv_fetch, and this module keeps tables of both by id.
//
// Every announcement gets exactly one answer that ends the sender's part: RndvAts (the receiver's
// fetch ended, or it dropped the announcement on RndvCancel), RndvRtr (the sender then pushes, or
// refuses a cancelled send), or the endpoint's failure or deletion. Until then the sender keeps
// the buffer registered and the request open, even once cancelled, so a receiver that matched
// never reads a withdrawn buffer. A peer that never answers holds a send (the user's own request,
// one registration) until the endpoint fails or is closed by the peer or the worker goes; a
// forced cancel, whose caller may reuse the buffer at once, withdraws the registration at once
// (a fetch racing with it fails at the sender's device instead of reading that memory).
#pragma once

#include "worker_impl.hpp"

#include <capnp/common.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace comm::detail {

/// Wire ids of the rendezvous module.
enum class rndv_msg : tl::am_id {
  rts = 11,     ///< RndvRts: announcement
  ats = 12,     ///< RndvAts: acknowledgement, the send completes
  rtr = 13,     ///< RndvRtr: software rendezvous, the receiver asks for the data
  data = 14,    ///< RndvData: software rendezvous data
  cancel = 15,  ///< RndvCancel: the sender cancelled an announced send
  refuse = 18,  ///< RndvRefuse: answer to an RndvRtr for a send that is gone
};

/// Where a rendezvous send stands.
enum class rndv_phase : uint8_t { none, announced, pushing };

/// The rendezvous part of a send's state (in the tag or AM module's request state).
struct rndv_send {
  request* req = nullptr;          ///< the send
  rndv_phase phase = rndv_phase::none; ///< where it stands
  bool cancelled = false;          ///< cancelled (report): completes with canceled when answered
  uint64_t id = 0;                 ///< our id in the send table, sent as sreq (0: not in it)
  uint64_t peer_id = 0;            ///< the receiver's request id (software rendezvous)
  size_t length = 0;               ///< data bytes
  size_t limit = 0;                ///< software rendezvous: bytes to push
  size_t pushed = 0;               ///< software rendezvous: bytes pushed so far
  tl::md* md = nullptr;            ///< memory domain of the registration made for it
  tl::mem_handle* reg = nullptr;   ///< that registration
  /// A tagged send through the transport's tag matching (tag_offload.hpp): the handle of its
  /// outstanding tag_rndv_zcopy (0: none), cancelled when the send ends another way.
  uint64_t tl_handle = 0;
};

/// What an announcement says of the message besides its data (RndvRts).
struct rts_fields {
  bool is_am = false;              ///< an active message, else a tagged message (or stream bytes)
  bool is_stream = false;          ///< bytes of the endpoint's byte stream (stream.hpp)
  tag_t tag = 0;                   ///< tagged message: its tag
  uint16_t am_id = 0;              ///< active message: its id
  uint16_t am_flags = 0;           ///< active message: its wire flags
};

/// A rendezvous announcement as received: where the data is.
struct rndv_announcement {
  uint64_t sreq = 0;               ///< the sender's request id
  uint64_t address = 0;            ///< where the data is
  size_t length = 0;               ///< data bytes
  std::vector<uint8_t> rkey;       ///< the sender's packed key
};

/// A rendezvous message being fetched into a receive (in the tag or AM module's request state).
struct rndv_fetch {
  request* req = nullptr;          ///< the receive it fills (request::iov)
  endpoint_impl* ep = nullptr;     ///< endpoint back to the sender
  /// Tells the receiving module that the fetch ended with `outcome`, after the fetch released
  /// what it held and, unless the endpoint failed, acknowledged the sender.
  void (*done)(request* req, status outcome) = nullptr;
  uint64_t sreq = 0;               ///< the sender's request id
  uint64_t id = 0;                 ///< software rendezvous: our id in the receive table (0: none)
  uint64_t address = 0;            ///< where the data is at the sender
  size_t take = 0;                 ///< bytes fetched: the announced length, at most the buffer
  size_t pushed = 0;               ///< software rendezvous: bytes arrived so far
  tl::completion comp;             ///< completion of the gets
  tl::remote_key remote;           ///< the sender's unpacked key
  bool remote_valid = false;       ///< `remote` must be released
  /// Its place in the module's list of fetches with gets in flight (not_getting: not there).
  uint32_t getting_at = not_getting;
  /// getting_at of a fetch without gets in flight.
  static constexpr uint32_t not_getting = UINT32_MAX;
};

/// Words an announcement fits in without a heap segment: the fields, a memory domain's packed
/// key and a short user header.
inline constexpr size_t rts_scratch_words = 64;

/// The rendezvous module (see the top of this file).
class rndv_protocol final : public protocol {
public:
  rndv_protocol(worker_impl& w, unsigned index);
  ~rndv_protocol() noexcept override = default;
  std::string_view name() const noexcept override { return "rndv"; }

  // -- sender --
  /// Sends `req` (one contiguous buffer of `length` bytes, request::iov[0]) by rendezvous, as
  /// send_message would: the first call announces it, later ones resume the announcement or push
  /// the data the receiver asked for. ok once issued (the request completes on the
  /// acknowledgement, or once pushed), no_resource, or an error.
  status send(request* req, rndv_send& r, size_t length, const rts_fields& fields);
  /// Releases what a rendezvous send holds (table entry, registration, the transport's
  /// operation); idempotent.
  void release_send(rndv_send& r);
  /// Enters `req`, a tagged send of `length` bytes about to go through the transport's tag
  /// matching (tag_offload.hpp), in the send table, so that the receiver's RndvAts (when the
  /// announcement reached it unmatched), RndvRtr or a cancel find it; sets r.id.
  void enter_offloaded(request* req, rndv_send& r, size_t length);
  /// Cancels an announced send: the peer drops the announcement if it is still unmatched. Reported,
  /// the send completes with canceled once the peer answered (its fetch is over) or the endpoint
  /// failed; forced, it withdraws the buffer and is released at once.
  status cancel_send(request* req, rndv_send& r, cancel_mode mode);

  // -- receiver --
  /// Starts fetching `take` bytes of the message announced by `sreq` of `ep` into `req`, whose
  /// state holds `f`. A request whose st is already an error, or a take of 0, ends the fetch at
  /// once (the sender is acknowledged with that status). `done` is told the outcome.
  void start_fetch(request* req, rndv_fetch& f, endpoint_impl* ep, uint64_t sreq,
                   uint64_t address, size_t take, const uint8_t* rkey, size_t rkey_length,
                   void (*done)(request* req, status outcome));
  /// Releases what a fetch holds (table entry, key); idempotent.
  void release_fetch(rndv_fetch& f);

  /// Sends announced and not yet acknowledged, by our id.
  const std::unordered_map<uint64_t, rndv_send*>& sends() const noexcept { return sends_; }
  /// Software-rendezvous receives waiting for data, by our id.
  const std::unordered_map<uint64_t, rndv_fetch*>& receives() const noexcept { return recvs_; }

  void endpoint_failed(endpoint_impl& ep, status reason) override;
  void endpoint_deleted(endpoint_impl& ep) override;
  bool busy_on(const endpoint_impl& ep) const override;
  void info(std::ostream& out) const override;

private:
  void on_rts(const uint8_t* data, size_t length);
  void on_ats(const uint8_t* data, size_t length);
  void on_rtr(const uint8_t* data, size_t length);
  void on_data(const uint8_t* data, size_t length);
  void on_cancel(const uint8_t* data, size_t length);
  void on_refuse(const uint8_t* data, size_t length);
  /// Builds the announcement of `req` into request::wire.
  status encode_rts(request* req, rndv_send& r, const rts_fields& fields);
  /// Pushes the next fragments of a software rendezvous.
  status push(request* req, rndv_send& r);
  /// The transport completed the gets of a fetch.
  static void on_fetched(tl::completion* comp);
  /// Puts `f`, which is not there yet, in the list of fetches with gets in flight.
  void join_getting(rndv_fetch& f);
  /// Takes `f` out of that list (nothing when it is not in it).
  void leave_getting(rndv_fetch& f);
  /// Ends a fetch: releases the key, acknowledges the sender, tells the receiving module.
  void finish_fetch(rndv_fetch& f);
  /// Tells the sender of `sreq` on `ep` how its rendezvous ended (RndvAts): at once when nothing
  /// waits on the endpoint, else queued behind what does.
  void acknowledge(endpoint_impl* ep, uint64_t sreq, status outcome);
  /// The announced send `sreq` that peer `ep` answers for, or null (a protocol error when it is
  /// another endpoint's or not announced).
  rndv_send* answered_send(endpoint_impl* ep, uint64_t sreq);
  /// Ends a send the peer answered with `st`: releases it and completes it in order.
  void end_send(rndv_send& r, status st);

  std::unordered_map<uint64_t, rndv_send*> sends_;  ///< sends awaiting the peer, by id
  std::unordered_map<uint64_t, rndv_fetch*> recvs_; ///< software-rendezvous receives, by id
  /// Fetches with gets in flight, each knowing its place (rndv_fetch::getting_at): a vector keeps
  /// its room, where a set allocated a node per fetch.
  std::vector<rndv_fetch*> getting_;
  /// The key bytes of the announcement being read: given to the receiving module, taken back
  /// when it did not keep them, so that reading one allocates nothing.
  std::vector<uint8_t> rts_rkey_;
  uint64_t next_id_ = 1;                            ///< next id in those tables
  wire::header_writer<wire::schema::RndvData> hdr_data_; ///< header of pushed data
  wire::header_writer<wire::schema::RndvAts> hdr_ats_;   ///< header of acknowledgements
  /// Words of the first segment of every announcement (capnp re-zeroes what a message used), so
  /// that building one allocates nothing; a larger one continues in the heap.
  capnp::word rts_scratch_[rts_scratch_words] = {};
  std::vector<uint8_t> packed_key_;  ///< the key of the announcement being built (reused)
};

}  // namespace comm::detail
