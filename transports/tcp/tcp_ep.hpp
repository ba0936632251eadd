// A tcp endpoint: sends to one peer interface over the connection the interface keeps to it
// (shared with every other endpoint between the two interfaces, both ways; see tcp_conn.hpp).
//
// Order on the wire is the order of the calls. While a zcopy frame of the connection is half
// written every other send answers no_resource; short and bcopy messages append to the
// connection's send buffer while it has room and the peer's window is open. A zcopy completes when
// the peer's `delivered` count covers its frame. Up to max_unacked_zcopy zcopy operations of one
// endpoint may wait. Parked requests keep later sends of the same endpoint behind them.
#pragma once

#include "base/pending_queue.hpp"
#include "tcp/tcp_wire.hpp"

#include <comm/transport/transport.hpp>

#include <memory>
#include <string>
#include <vector>

namespace comm::tl::tcp {

class tcp_iface;
class tcp_conn;

/// Zcopy operations of one endpoint that may wait for their acknowledgement (a power of two).
inline constexpr uint64_t max_unacked_zcopy = 128;

class tcp_ep final : public ep {
public:
  /// An endpoint on `conn` to the interface `peer` at `peer_ip`.
  tcp_ep(tcp_iface& owner, tcp_conn& conn, const ip_address& peer_ip, const iface_addr& peer);
  ~tcp_ep() override;

  // -- ep --

  status am_short(am_id id, const void* header, size_t header_length, const void* payload,
                  size_t payload_length) override;
  ssize_t am_bcopy(am_id id, pack_fn pack, void* arg) override;
  /// Always in_progress when accepted: `comp` completes once the peer acknowledged delivery.
  status am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                  size_t count, completion* comp) override;
  status pending_add(pending_req* req) override;
  void pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) override;
  status flush(completion* comp) override;

  // -- used by tcp_conn and tcp_iface --

  /// Completes the zcopy operations whose frames are within the peer's `delivered` count; returns
  /// how many.
  unsigned complete_delivered(uint64_t delivered);

  /// After progress on the connection: completes finished flushes, dispatches parked requests
  /// when there is room. Returns the number of operations advanced.
  unsigned after_progress();

  /// Retries parked requests (after a dispatch that left some re-parked with room left).
  unsigned dispatch_pending() { return after_progress(); }

  /// The connection failed with `reason`: later sends answer it, and the interface reports it.
  void conn_failed(status reason);

  /// Completes outstanding zcopy and flush operations with `reason` (the failure was noticed
  /// earlier: sends already answer with it). Parked requests stay for pending_purge.
  void fail(status reason);

  /// Why the endpoint failed, or ok.
  status failure() const { return failure_; }

  /// True when requests are parked and sends would be accepted now.
  bool parked_and_ready() const;

  /// "ip:port state" for info().
  std::string describe() const;

  /// Set by the interface while the endpoint is on its failure list / its redispatch list.
  bool failure_queued = false;
  bool redispatch_queued = false;

private:
  bool broken() const { return failure_ != status::ok; }
  bool has_room() const;
  /// True when nothing waits: the connection wrote everything, no zcopy of ours unacknowledged.
  bool idle() const;
  status refuse_no_resource();

  tcp_iface& owner_;
  tcp_conn* conn_;
  status failure_ = status::ok;
  /// A zcopy operation waiting for the peer to deliver its frame.
  struct zcopy_slot {
    uint64_t frame = 0;          ///< the frame's number on the connection
    completion* comp = nullptr;  ///< the caller's completion, may be null
  };
  /// Zcopy operations in issue order: [zacked_, zissued_) wait for their ack.
  std::unique_ptr<zcopy_slot[]> zring_;
  uint64_t zissued_ = 0;
  uint64_t zacked_ = 0;
  pending_queue pending_;
  std::vector<completion*> flushes_;
  const ip_address peer_ip_;
  const iface_addr peer_;
};

}  // namespace comm::tl::tcp
