// The wireup module: the endpoint handshake and close notices.
//
// worker::connect() picks a lane, creates an endpoint in the wireup phase and sends a
// WireupRequest that carries our endpoint id and address. The peer creates its own endpoint back
// to us (the reply endpoint for our messages) and answers with a WireupReply naming it; from then
// on every message carries the receiver's endpoint id (dstEp). Sends issued before the reply wait
// in the pending queue. An EndpointClose tells the peer that we close (send.hpp sends it).
#pragma once

#include "worker_impl.hpp"

#include <cstdint>
#include <vector>

namespace comm::detail {

/// Wire ids of the wireup module.
enum class wireup_msg : tl::am_id {
  request = 1,  ///< WireupRequest
  reply = 2,    ///< WireupReply
  close = 3,    ///< EndpointClose
};

/// The wireup module (see the top of this file).
class wireup_protocol final : public protocol {
public:
  wireup_protocol(worker_impl& w, unsigned index);
  std::string_view name() const noexcept override { return "wireup"; }

  /// Starts the handshake of `ep`, a new endpoint of worker::connect: queues its WireupRequest.
  void start(endpoint_impl& ep);

private:
  void on_request(const uint8_t* data, size_t length);
  void on_reply(const uint8_t* data, size_t length);
  void on_close(const uint8_t* data, size_t length);
  /// Answers a wireup request beyond COMM_PEER_EP_MAX with EXCEEDS_LIMIT.
  void refuse(const std::vector<uint8_t>& address, uint32_t src_ep);
  /// Queues the WireupReply to `src_ep` on `ep`: our endpoint `our_ep`, or a refusal `st`.
  void reply(endpoint_impl* ep, uint32_t src_ep, uint32_t our_ep, status st);
};

}  // namespace comm::detail
