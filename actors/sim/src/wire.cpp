// Packing and checking the simulator's wire header.
#include "wire.hpp"

#include <cstring>

namespace comm::sim::wire {

totals pack(const run_counters& c) {
  return totals{{c.committed, c.processed, c.rollbacks, c.remote, c.cross_partition, c.digest,
                 c.nanoseconds}};
}

run_counters unpack(const totals& t) {
  const uint64_t* w = t.words;
  return run_counters{w[0], w[1], w[2], w[3], w[4], w[5], w[6]};
}

bool check_header(const void* data, size_t length, int size, int self, header* out,
                  std::string* why) {
  if (length != sizeof(header)) {
    *why = "a simulator message with a header of " + std::to_string(length) + " bytes, not " +
           std::to_string(sizeof(header));
    return false;
  }
  std::memcpy(out, data, sizeof(header));
  if (out->magic != magic) {
    *why = "a message that is not the simulator's (bad magic number)";
    return false;
  }
  if (out->sender >= static_cast<uint32_t>(size) || out->sender == static_cast<uint32_t>(self)) {
    *why = "a simulator message claiming to come from rank " + std::to_string(out->sender);
    return false;
  }
  if (out->what < static_cast<uint16_t>(kind::round) ||
      out->what > static_cast<uint16_t>(kind::abort)) {
    *why = "a simulator message of unknown kind " + std::to_string(out->what);
    return false;
  }
  return true;
}

}  // namespace comm::sim::wire
