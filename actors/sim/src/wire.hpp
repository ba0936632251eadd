// The simulator's messages between processes: one active message per peer per round (header +
// packed events), one with each process's totals at the end, and an abort notice. The header is
// a fixed little structure checked field by field on arrival; events are the engine's records.
// Processes of one job run the same build (the run's fingerprint covers the event size), and the
// magic number also rejects a peer of the other byte order.
#pragma once

#include <comm/sim/config.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace comm::sim::wire {

/// The active message id the simulator uses on its own worker.
inline constexpr uint16_t am_id = 1;

/// "SIM1" as a little-endian word.
inline constexpr uint32_t magic = 0x314d4953;

/// The longest abort reason shipped.
inline constexpr size_t max_reason = 512;

/// What a message carries.
enum class kind : uint16_t {
  round = 1,   ///< a round's events for the receiver, with the sender's minimum and count
  totals = 2,  ///< the sender's run_counters, at the end
  abort = 3,   ///< the sender stops; the data is its reason (text)
};

/// The header of every message.
struct header {
  uint32_t magic = wire::magic;
  uint16_t what = 0;          ///< a kind
  uint16_t reserved = 0;
  uint32_t sender = 0;        ///< the sender's rank
  uint32_t reserved2 = 0;
  uint64_t round = 0;         ///< round: the sender's round number (0: the init round)
  uint64_t fingerprint = 0;   ///< round: the sender's run configuration
  double local_min = 0;       ///< round: the earliest event time the sender holds or sends
  uint64_t committed = 0;     ///< round: events the sender committed so far
};

/// run_counters as it travels: seven words in its field order.
struct totals {
  uint64_t words[7] = {};
};

/// Packs counters for the wire.
totals pack(const run_counters& c);

/// Unpacks what pack made.
run_counters unpack(const totals& t);

/// Checks the parts every message shares; on failure says why in `*why`.
bool check_header(const void* data, size_t length, int size, int self, header* out,
                  std::string* why);

}  // namespace comm::sim::wire
