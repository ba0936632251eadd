// The tag module: tagged sends and receives. A send goes eager (the send engine, send.hpp, with
// TagEager / TagEagerImm / TagEagerFirst headers and tag fragments) or by rendezvous (rndv.hpp).
// A message that arrives is matched against the posted receives (the worker's tag matcher) or kept
// as an unexpected message, pooled, counted against the limits of its endpoint, until a receive
// or a probe takes it; a rendezvous announcement waits there the same way. Sends and receives of
// at least COMM_TM_THRESH bytes may use the transport's own tag matching instead (tag_offload.hpp
// has the rules that keep both ways in agreement).
//
// Large eager copies. On a lane whose transport prefers copies below some size (endpoint_impl::
// copies_below; shm: its ring's capacity) a message in the zcopy range goes bcopy, and one in the
// rendezvous range goes in bcopy fragments too, unless the peer maps its buffer (md::
// maps_for_peers: comm::mem_alloc memory keeps its rendezvous through the mapping). What the
// receiver may have to hold of such rendezvous-range messages is bounded by its eager window
// (config::limits::eager_window_ep_bytes, advertised in its address): the sender takes room for
// each one (its TagEagerFirst says `windowed`) and sends a message that does not fit by
// rendezvous instead; the receiver gives room back (TagCredit) once receives took half a window
// of them, and fails a peer that sends beyond its window with EXCEEDS_LIMIT.
#pragma once

#include "rndv.hpp"
#include "send.hpp"
#include "tag_offload.hpp"
#include "worker_impl.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace comm::detail {

/// Wire ids of the tag module.
enum class tag_msg : tl::am_id {
  eager = 4,        ///< TagEager: a whole message
  eager_imm = 5,    ///< TagEagerImm: a whole message with an immediate value
  eager_first = 6,  ///< TagEagerFirst: the first fragment of a message
  fragment = 7,     ///< FragmentMiddle: a later fragment
  credit = 22,      ///< TagCredit: room of the eager window given back
};

/// An unexpected (arrived, not yet matched) tagged message, with its data.
struct unexpected_msg : tag_unexpected {
  bool rndv = false;         ///< a rendezvous announcement: data still at the sender
  endpoint_impl* ep = nullptr; ///< rendezvous: endpoint back to the sender
  /// The endpoint whose limits it counts against (it always counts for the worker's); null once
  /// that endpoint is gone or the user took the message with tag_probe.
  endpoint_impl* from = nullptr;
  uint64_t sreq = 0;         ///< rendezvous: the sender's request id
  uint64_t address = 0;      ///< rendezvous: where the data is
  std::vector<uint8_t> rkey; ///< rendezvous: the sender's packed key
  uint64_t imm = 0;          ///< the sender's immediate value
  size_t length = 0;         ///< total data bytes
  size_t received = 0;       ///< data bytes arrived so far
  uint8_t* data = nullptr;   ///< the data: inline after the descriptor, or `grown`
  uint8_t* grown = nullptr;  ///< a fragmented message's own buffer, grown as fragments arrive
  size_t capacity = 0;       ///< bytes `grown` holds
  int8_t pool_tier = -1;     ///< the module's pool tier the descriptor came from, or -1
  size_t charged = 0;        ///< bytes counted against the unexpected limits (all of its memory)
  size_t windowed = 0;       ///< a large eager copy: bytes of `from`'s eager window it holds
};

/// State of a tagged send.
struct tag_send_state {
  send_progress send;        ///< the send engine's part
  rndv_send rndv;            ///< its rendezvous, when it goes that way
  tag_t tag = 0;             ///< its tag
  tm_send tm = tm_send::undecided; ///< software, or which tag operation of the lane
};

/// State of a tagged receive.
struct tag_recv_state {
  tag_expected expected;     ///< the posted receive in the matcher
  tag_recv_info info;        ///< what was received (info.length: bytes delivered)
  size_t length = 0;         ///< bytes its buffers hold
  size_t received = 0;       ///< bytes the sender sent (more than `length`: truncated)
  bool matched = false;      ///< matched to a message (no longer cancellable)
  rndv_fetch fetch;          ///< a rendezvous message being fetched into it
  tl::tag_context tl_ctx;    ///< its entry in the transport's tag matching (expected.offloaded)
};

/// The tag module (see the top of this file).
class tag_protocol final : public protocol {
public:
  tag_protocol(worker_impl& w, unsigned index);
  ~tag_protocol() noexcept override;
  std::string_view name() const noexcept override { return "tag"; }

  /// The receive whose posted-receive entry is `e`.
  static request* recv_of(tag_expected* e) {
    return request::of_state(e, offsetof(tag_recv_state, expected));
  }

  /// The receive whose transport context is `ctx`.
  static request* recv_of(tl::tag_context* ctx) {
    return request::of_state(ctx, offsetof(tag_recv_state, tl_ctx));
  }

  // -- for the public API (tag.cpp) --
  /// Queues the receive `req` (nothing arrived for it): in the transport's tag matching too when
  /// tag_offload allows it.
  void post(request* req, tag_recv_state& s);
  /// Removes the queued receive `s` (cancel); false when it is not queued (matched already).
  bool unpost(tag_recv_state& s);
  /// Takes the earliest posted receive that accepts `tag` out of the queue (and back from the
  /// transport), or null.
  tag_expected* take_expected(tag_t tag);
  /// A whole eager message from `ep`: into a matching receive, or kept as unexpected.
  void deliver(endpoint_impl* ep, tag_t tag, uint64_t imm, const uint8_t* data, size_t length);
  /// A fragment of an eager message from `ep` that the transport's tag matching passed to its
  /// unexpected handler in pieces (tl::tag_flag_first / tag_flag_more): gathered into a matching
  /// receive or an unexpected message through `*context` (null before the first fragment, null
  /// again after the last).
  void unexpected_fragment(endpoint_impl* ep, tag_t tag, const uint8_t* data, size_t length,
                           unsigned flags, void** context);
  /// Receives the message `found` (matched by a receive or a probe) into `req`.
  op receive_unexpected(request* req, unexpected_msg* found);
  /// Stops counting `msg` against its endpoint's limits (the user took it with tag_probe); it
  /// still counts for the worker's.
  void detach(unexpected_msg* msg);
  /// Marks `req` matched by a message tagged `tag` with immediate value `imm`.
  static tag_recv_state& match(request* req, tag_t tag, uint64_t imm);
  /// A descriptor for an unexpected message from `ep` with room for `length` data bytes, counted
  /// with `extra` bytes more against the unexpected limits. Null when a limit fails `ep`, or
  /// (logged) without memory.
  unexpected_msg* new_unexpected(endpoint_impl* ep, tag_t tag, uint64_t imm, size_t length,
                                 size_t extra = 0);
  /// Frees an unexpected message (received, or dropped); the room it held in its endpoint's
  /// eager window is given back.
  void free_unexpected(unexpected_msg* msg);
  /// Gives back the room `msg` holds in its endpoint's eager window (the user took it).
  void give_back_window(unexpected_msg* msg);

  /// The unexpected message whose fragments `ep` is receiving, or null.
  const unexpected_msg* arriving(const endpoint_impl& ep) const;

  // -- from the rendezvous module --
  /// A rendezvous announcement of a tagged message from `ep`: fetched into a matching receive,
  /// or kept as an unexpected message.
  void on_announcement(endpoint_impl& ep, tag_t tag, uint64_t imm, rndv_announcement&& a);
  /// Drops the announcement `sreq` of `ep` if it waits unmatched (its sender cancelled it); true
  /// if it did.
  bool drop_announcement(endpoint_impl& ep, uint64_t sreq);

  void forget_peer(endpoint_impl& ep, held_fate fate) override;
  void endpoint_failed(endpoint_impl& ep, status reason) override;
  void endpoint_deleted(endpoint_impl& ep) override;
  void teardown() override;
  void info(std::ostream& out) const override;

  /// The transport's tag matching as this worker uses it.
  tag_offload offload;

  // Long-lived header builders (one per header type, see comm/wire/codec.hpp).
  wire::header_writer<wire::schema::TagEager> hdr_tag;
  wire::header_writer<wire::schema::TagEagerImm> hdr_tag_imm;
  wire::header_writer<wire::schema::TagEagerFirst> hdr_tag_first;
  wire::header_writer<wire::schema::TagCredit> hdr_credit;  ///< eager window given back

private:
  /// deliver's body, inlined into the eager receive path (defined and used in tag.cpp only).
  inline void deliver_message(endpoint_impl* ep, tag_t tag, uint64_t imm, const uint8_t* data,
                              size_t length);
  void on_eager(const uint8_t* data, size_t length);
  void on_eager_imm(const uint8_t* data, size_t length);
  void on_eager_first(const uint8_t* data, size_t length);
  void on_fragment(const uint8_t* data, size_t length);
  void on_credit(const uint8_t* data, size_t length);
  /// Takes `bytes` of `ep`'s eager window for a windowed message; false, with `ep` failed
  /// (EXCEEDS_LIMIT), when the peer sent beyond it.
  bool take_window(endpoint_impl& ep, size_t bytes);
  /// Gives `bytes` of `ep`'s eager window back: the peer is told once half a window is free.
  void give_back(endpoint_impl& ep, size_t bytes);
  /// A TagEager or TagEagerImm message.
  void receive_eager(const uint8_t* data, size_t length, bool with_imm);
  /// The last fragment of the message of `ep` arrived.
  void finish_fragments(endpoint_impl& ep);
  /// Frees what the fragmented message of `ep` holds and ends it; returns its matched receive,
  /// which is not completed.
  request* drop_fragments(endpoint_impl& ep);
  /// Starts fetching the rendezvous message of `length` bytes announced by `sreq` into `req`.
  void fetch(request* req, endpoint_impl* ep, uint64_t sreq, uint64_t address, size_t length,
             const uint8_t* rkey, size_t rkey_length);

  /// Makes room for `needed` bytes in a fragmented unexpected message (doubling, so a header
  /// that announces a huge message costs nothing until its data arrives); false when a limit
  /// failed its endpoint, or without memory.
  bool reserve_unexpected(unexpected_msg* msg, size_t needed);
  /// After new_unexpected or reserve_unexpected said no for a fragmented message of `ep`: fails
  /// `ep` for lack of memory unless a limit failed it already.
  void out_of_room(endpoint_impl* ep);

  std::vector<void*> unexpected_pool_[2];   ///< free unexpected-message blocks, per size tier
};

}  // namespace comm::detail
