// Run-time configuration: every knob is a field here and an environment variable COMM_<NAME>.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace comm {

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
  /// Entries of a worker's shared-memory receive FIFO (COMM_SHM_FIFO_SIZE), a power of two.
  size_t shm_fifo_size = 256;
  /// Bytes of one shared-memory receive buffer, the largest bcopy (COMM_SHM_SEG_SIZE).
  size_t shm_segment_size = 8192;
  /// Cluster secret for client-server authentication (COMM_AUTH_KEY, or the contents of the file
  /// named by COMM_AUTH_KEY_FILE); empty: no authentication, listeners default to loopback.
  std::string auth_key;

  /// The defaults overridden by the COMM_ environment variables. Unknown or malformed values are
  /// reported (log level warn) and ignored.
  static config from_environment();

  /// True when `name` is enabled by `transports`.
  bool transport_enabled(const std::string& name) const;
};

}  // namespace comm
