// One RC connection of a verbs interface: a QP connected to one peer QP, its rdmacm id (the
// handshake that exchanged QP numbers, LIDs/GIDs and PSNs, and later the disconnect), credits
// (receive buffers the peer granted; a SEND is never posted without one), send slots (work
// requests the QP holds; unsignaled ones stay held until a later signaled completion), and the
// operations still outstanding, completed in posting order. A connection is shared both ways: an
// endpoint from this side claims a connection the peer opened, so credits travel back piggy-backed
// on its messages; an explicit grant goes out when there is nothing to carry them.
#pragma once

#include "base/pending_queue.hpp"
#include "base/ring_queue.hpp"
#include "verbs/verbs_md.hpp"
#include "verbs/verbs_wire.hpp"

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>

namespace comm::verbs {

class verbs_iface;
class verbs_ep;

/// Where a connection is in its life.
enum class conn_state { connecting, ready, failed };

/// One operation posted and not yet completed.
struct tx_entry {
  uint64_t seq = 0;                   ///< its work request's id
  tl::completion* comp = nullptr;     ///< told when it completes, or null
  int32_t buffer = -1;                ///< send buffer to return, or -1
  bool read = false;                  ///< an RDMA READ (counts against reads in flight)
  pin_set pins;                       ///< implicit registrations it uses
};

/// What one posted work request needs.
struct tx_request {
  ibv_send_wr wr{};                   ///< opcode, sg_list, remote address (wr_id, flags: post)
  tl::completion* comp = nullptr;     ///< completion, or null
  int32_t buffer = -1;                ///< send buffer it uses, or -1
  bool needs_credit = false;          ///< a SEND that consumes a peer receive buffer
  bool signal = false;                ///< must produce a completion
  pin_set pins;                       ///< implicit registrations it uses
};

/// An RC connection. Owned by its interface.
class verbs_conn {
public:
  /// A connection on `qp` (already in INIT) whose handshake runs on `id`.
  verbs_conn(verbs_iface& owner, uint64_t serial, ibv_qp* qp, rdma_cm_id* id, bool passive,
             uint32_t psn);
  ~verbs_conn();
  verbs_conn(const verbs_conn&) = delete;
  verbs_conn& operator=(const verbs_conn&) = delete;

  // -- identity and state --

  /// Unique within its interface (never reused).
  uint64_t serial() const { return serial_; }
  /// Its QP.
  ibv_qp* qp() const { return qp_; }
  /// Its rdmacm id (null once destroyed).
  rdma_cm_id* id() const { return id_; }
  /// True when the peer opened it.
  bool passive() const { return passive_; }
  /// Where it is.
  conn_state state() const { return state_; }
  /// Why it failed (ok while it has not).
  status failure() const { return failure_; }
  /// The peer's interface id (once the handshake is known).
  uint64_t peer_iface_id() const { return peer_.iface_id; }
  /// Starting PSN of this side.
  uint32_t psn() const { return psn_; }
  /// The endpoint using it, or null.
  verbs_ep* ep = nullptr;
  /// On its interface's watch list (progress() looks at it for grants and parked operations).
  bool watched = false;

  /// The peer's handshake arrived and the QP is connected. Returns 0 or the errno of the QP
  /// transition.
  int connected(const handshake& peer);
  /// Both QPs are connected (the client called rdma_establish, or the server saw ESTABLISHED):
  /// ready to send. Until then the peer's QP may not be ready to answer.
  void established();
  /// Fails the connection with `reason`: every outstanding operation completes with it, the QP
  /// goes to error, the endpoint's error handler is scheduled. Later calls do nothing.
  void fail(status reason);
  /// Sends the rdmacm disconnect (once, when connected).
  void disconnect();

  // -- leaving a connection the peer may share --

  /// True while an operation still reads or writes the user's memory (a zcopy send, an RDMA
  /// operation, anything with a completion): such a connection closes with its endpoint.
  bool holds_user_memory() const;
  /// This side's endpoint left for good: the peer is told with a release message (sent from
  /// progress() once a send slot is free); no endpoint of this side claims the connection again.
  void release();
  /// True once release() was called.
  bool released() const { return released_; }
  /// True once the peer's release message arrived: it has no endpoint on the connection.
  bool peer_released() const { return peer_released_; }
  /// The peer's release message arrived.
  void peer_left() { peer_released_ = true; }
  /// True while the release message waits for a send slot.
  bool release_due() const { return release_due_ && state_ == conn_state::ready; }
  /// Sends the release message; ok, or no_resource when no slot is free.
  status send_release();

  // -- sending --

  /// ok when a request (with a credit when `needs_credit`) can be posted now, else no_resource,
  /// or the failure status.
  status can_post(bool needs_credit) const;
  /// Posts `req` (can_post() was ok); ok, or the failure status when the post failed.
  status post(tx_request& req);
  /// Posts a signaled zero-length RDMA WRITE if the last request was unsignaled, so that `comp`
  /// (may be null) is told when every operation so far is done. ok when none are outstanding
  /// (always so while connecting: nothing can be posted before).
  status flush(tl::completion* comp);
  /// The next request waits for every RDMA READ before it.
  void fence() { fence_next_ = true; }
  /// Credits the peer granted and this side has not used.
  uint32_t tx_credits() const { return tx_credits_; }
  /// RDMA READs in flight and the most allowed.
  uint32_t reads_in_flight() const { return reads_in_flight_; }
  /// Most RDMA READs in flight: the smaller of this device's initiator depth and the peer's
  /// responder resources.
  uint32_t max_reads() const { return max_reads_; }
  /// The parked operations of the endpoint using it.
  tl::pending_queue pending;

  // -- completions and credits --

  /// A send completion for `seq` with `st`.
  void send_completed(uint64_t seq, ibv_wc_status st);
  /// The peer returned `n` credits.
  void add_credits(uint16_t n) { tx_credits_ += n; }
  /// One of this connection's receive buffers was reposted: a credit to return (watched once a
  /// grant is due).
  void receive_reposted();
  /// Credits to return now (piggy-backed or in a grant); resets the count.
  uint16_t take_credits_to_return();
  /// True when enough credits wait to justify an explicit grant.
  bool grant_due() const;
  /// Sends an explicit grant; ok, or no_resource when no slot is free.
  status send_grant();
  /// Tells the peer its rendezvous `op_id` was fetched (an rndv_fin message), now or, without a
  /// send slot, from progress().
  void send_fin(uint32_t op_id);
  /// Sends the rndv_fin messages waiting for a slot; false while some still wait.
  bool send_due_fins();
  /// True when parked operations may be able to run now.
  bool pending_can_run() const;
  /// True while it has a grant or a release to send or parked operations, and has not failed.
  bool needs_watching() const;
  /// Explicit grants sent so far.
  uint64_t grants_sent() const { return grants_sent_; }

private:
  void abort_operations(status reason);
  void complete_until(uint64_t seq, status st);
  void complete_entry(tx_entry& e, status st);
  bool wants_signal(const tx_request& req) const;
  /// Credits waiting to be returned that justify an explicit grant.
  uint32_t grant_threshold() const;
  /// Sends a message of `kind` (grant, release or rndv_fin) with the credits to return; needs no
  /// credit.
  status send_credit_free(message_kind kind, uint32_t op_id = 0);

  verbs_iface& owner_;
  uint64_t serial_;
  ibv_qp* qp_;
  rdma_cm_id* id_;
  bool passive_;
  uint32_t psn_;
  conn_state state_ = conn_state::connecting;
  status failure_ = status::ok;
  bool disconnected_ = false;
  bool established_ = false;
  bool released_ = false;
  bool peer_released_ = false;
  bool release_due_ = false;
  handshake peer_{};

  uint32_t tx_credits_ = 0;
  uint32_t rx_to_return_ = 0;
  uint32_t sq_free_ = 0;
  uint32_t unsignaled_ = 0;
  uint64_t next_seq_ = 1;
  uint32_t reads_in_flight_ = 0;
  uint32_t max_reads_ = 1;
  bool fence_next_ = false;
  uint64_t grants_sent_ = 0;
  tl::ring_queue<tx_entry> outstanding_;  ///< posted, in posting order (storage reused)
  std::deque<uint32_t> fins_due_;  ///< rndv_fin messages waiting for a send slot
};

/// The status of a failed work completion.
status status_of(ibv_wc_status st);

}  // namespace comm::verbs
