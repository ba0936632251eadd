// Run-time configuration: every knob of libcomm is a field here and an environment variable
// COMM_<NAME>; every knob of a transport is an entry of transport_options under its variable's
// name (COMM_<TL>_<NAME>), parsed and checked by the transport that owns it.
#pragma once

#include <comm/transport/options.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace comm {

/// Limits on what a peer can make a worker hold without the local user asking for it (see README
/// "Reliability and limits"). A peer that passes one fails the endpoint it came through with
/// EXCEEDS_LIMIT (its error handler is told, the peer's endpoint is closed, a warning names the
/// variable); the worker's other endpoints keep working. `config::from_environment()` reads them;
/// a value of 0 is refused (it would refuse every message) and the default kept.
struct peer_limits {
  /// Bytes a worker holds for unexpected tagged messages (COMM_UNEXPECTED_MAX_BYTES): eager data
  /// that arrived before its receive (whole, or still arriving in fragments) and rendezvous
  /// announcements, each counted with its descriptor. Messages keep counting after their
  /// endpoint closes, until received.
  size_t unexpected_max_bytes = size_t{1} << 30;
  /// The same, for what one endpoint brought (COMM_UNEXPECTED_EP_MAX_BYTES).
  size_t unexpected_ep_max_bytes = size_t{256} << 20;
  /// Unexpected messages one endpoint brought (COMM_UNEXPECTED_EP_MAX_MSGS).
  size_t unexpected_ep_max_msgs = 1000000;
  /// Bytes of large eager copies one endpoint's peer may have sent that no receive has taken yet
  /// (COMM_EAGER_WINDOW_EP_BYTES): tagged messages at or above the rendezvous threshold that a
  /// lane whose transport prefers copies (shm, below its ring's capacity) sends by copies because
  /// their buffer is not memory the peer maps (ordinary heap memory). The worker advertises it in
  /// its address, lowered to half of unexpected_ep_max_bytes and of unexpected_max_bytes; a
  /// sender sends a message that does not fit in what is left of it by rendezvous instead, and
  /// the receiver gives the room back as receives take the messages. A peer that sends beyond it
  /// fails the endpoint with EXCEEDS_LIMIT. The default holds 32 messages of 1 MiB in flight
  /// (ucx_perftest's window): 8 MiB held tag_bw at 1 MiB to 0.70 of UCX's, 32 MiB gave 1.45.
  size_t eager_window_ep_bytes = size_t{32} << 20;
  /// Bytes a worker holds for active messages before their handler runs
  /// (COMM_AM_RX_MAX_BYTES): whole-message reassembly buffers and rendezvous receive buffers.
  /// A rendezvous AM that does not fit now waits (flow control) until earlier ones are delivered.
  size_t am_rx_max_bytes = size_t{1} << 30;
  /// The same, for one endpoint (COMM_AM_RX_EP_MAX_BYTES); a rendezvous AM larger than this is
  /// refused (the sender's request completes with EXCEEDS_LIMIT) and the endpoint stays up.
  size_t am_rx_ep_max_bytes = size_t{256} << 20;
  /// Active messages a worker's handlers keep past their call (COMM_AM_HELD_MAX): rendezvous
  /// descriptors (each keeps the sender's buffer waiting) and data kept by returning in_progress.
  /// Beyond it a rendezvous AM is refused (the sender's request completes with EXCEEDS_LIMIT) and
  /// eager data is passed for the call only; the endpoint stays up.
  size_t am_held_max = 4096;
  /// Bytes of AM data a worker's handlers keep past their call (COMM_AM_HELD_MAX_BYTES); beyond
  /// it eager data is passed for the call only.
  size_t am_held_max_bytes = size_t{256} << 20;
  /// Bytes of protocol replies (acknowledgements, RMA replies with their data) an endpoint may
  /// queue for a peer that does not take them (COMM_REPLY_EP_MAX_BYTES).
  size_t reply_ep_max_bytes = size_t{64} << 20;
  /// Bytes of stream data a worker buffers before the user receives them
  /// (COMM_STREAM_RX_MAX_BYTES), every endpoint's, each buffered block counted with its
  /// descriptor. Data taken with endpoint::stream_recv_data no longer counts.
  size_t stream_rx_max_bytes = size_t{1} << 30;
  /// The same, for one endpoint (COMM_STREAM_RX_EP_MAX_BYTES).
  size_t stream_rx_ep_max_bytes = size_t{64} << 20;
  /// Endpoints peers may create on a worker by connecting to its address (COMM_PEER_EP_MAX).
  /// Beyond it a connecting peer is refused with EXCEEDS_LIMIT, after failed ones are released.
  size_t peer_ep_max = 4096;
  /// RDMA reads a peer may have outstanding on one endpoint to this worker (COMM_RMA_READS_IN,
  /// DAT's outstanding RDMA read incoming): advertised per transport in the worker's address
  /// (lowered to what the transport accepts), and a reader never has more in flight.
  size_t rma_reads_in = 16;
};

/// Configuration of a context. `from_environment()` reads the COMM_ variables; a field set in code
/// afterwards wins.
struct config {
  /// Transports to use (COMM_TLS=shm,self); empty means every transport that works here.
  std::vector<std::string> transports;
  /// Largest eager-short message, protocol header included (COMM_SHORT_THRESH); 0: transport max.
  size_t short_thresh = 0;
  /// Messages at least this large use eager zero copy where the transport has it
  /// (COMM_ZCOPY_THRESH).
  size_t zcopy_thresh = 16384;
  /// Messages at least this large use rendezvous (COMM_RNDV_THRESH); 0: chosen per transport.
  size_t rndv_thresh = 0;
  /// Tag matching in the transport (COMM_TM_THRESH, UCX's UCX_TM_THRESH): on an interface that
  /// matches tags itself (cap_tag_*), tagged receives whose buffer is at least this large are
  /// posted to it and tagged sends at least this large use its tag operations; smaller ones, and
  /// every wildcard receive, are matched in software. "off" (SIZE_MAX, the default) keeps all
  /// matching in software: the transports that offer tag matching here (self, shm) match in
  /// software too, and measured slower that way (docs/tag_offload.md); UCX's 1024 suits a NIC
  /// that matches in hardware.
  size_t tm_thresh = SIZE_MAX;
  /// The transports' own knobs by variable name, e.g. {"COMM_SHM_FIFO_SIZE", "1024"} or
  /// {"COMM_TCP_DEVICE", "lo"}: every COMM_<TL>_* variable of the README's transport table, what
  /// `comm_info` lists and tl::component::knobs() returns. A context refuses (throws
  /// std::invalid_argument) a value its transport refuses, and a name no transport reads.
  tl::options transport_options;
  /// Cluster secret for client-server authentication (COMM_AUTH_KEY, or the contents of the file
  /// named by COMM_AUTH_KEY_FILE); empty: no authentication, listeners default to loopback.
  std::string auth_key;

  // -- protocol-layer limits ---------------------------------------------------------------------
  /// What a peer may make a worker hold (COMM_UNEXPECTED_*, COMM_EAGER_WINDOW_EP_BYTES,
  /// COMM_AM_RX_*, COMM_AM_HELD_*,
  /// COMM_STREAM_RX_*, COMM_REPLY_EP_MAX_BYTES, COMM_PEER_EP_MAX, COMM_RMA_READS_IN).
  peer_limits limits;

  /// The defaults overridden by the COMM_ environment variables, read once here. Malformed values
  /// of libcomm's own knobs are reported (log level warn) and ignored; the COMM_<TL>_* variables of
  /// every transport built in go to transport_options as they are, for their transport to check.
  static config from_environment();

  /// True when `name` is enabled by `transports`.
  bool transport_enabled(const std::string& name) const;
};

}  // namespace comm
