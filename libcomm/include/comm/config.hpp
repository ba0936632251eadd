// Run-time configuration: every knob of libcomm is a field here and an environment variable
// COMM_<NAME>; every knob of a transport is an entry of transport_options under its variable's
// name (COMM_<TL>_<NAME>), parsed and checked by the transport that owns it.
#pragma once

#include <comm/transport/options.hpp>

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
  /// The transports' own knobs by variable name, e.g. {"COMM_SHM_FIFO_SIZE", "1024"}: what
  /// `comm_info` lists for each transport. A context refuses (throws std::invalid_argument) a
  /// value its transport refuses, and a name no transport reads.
  tl::options transport_options;
  /// Cluster secret for client-server authentication (COMM_AUTH_KEY, or the contents of the file
  /// named by COMM_AUTH_KEY_FILE); empty: no authentication, listeners default to loopback.
  std::string auth_key;

  /// The defaults overridden by the COMM_ environment variables, read once here. Malformed values
  /// of libcomm's own knobs are reported (log level warn) and ignored; the COMM_<TL>_* variables of
  /// every transport built in go to transport_options as they are, for their transport to check.
  static config from_environment();

  /// True when `name` is enabled by `transports`.
  bool transport_enabled(const std::string& name) const;
};

}  // namespace comm
