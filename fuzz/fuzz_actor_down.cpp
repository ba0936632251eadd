// Fuzzes the actor node's reader of a down frame's payload, the exit reason of a remote actor
// (read_reason_payload, actors/src/payload.*). The reason must be read within the payload's bytes:
// no allocation beyond what they can fill (libFuzzer's -malloc_limit_mb catches one).
#include "actor_env.hpp"
#include "check.hpp"
#include "payload.hpp"

#include "seeds.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

/// Seeds: the reasons a node writes for a normal exit, a CAF error and one with context.
std::vector<comm::fuzz::seed> make_seeds() {
  std::vector<comm::fuzz::seed> seeds;
  for (const caf::error& reason :
       {caf::error{caf::exit_reason::normal}, caf::make_error(caf::sec::request_timeout),
        caf::make_error(caf::sec::runtime_error, std::string("gone"), int32_t{7})}) {
    std::vector<char> buf;
    comm::fuzz::require(!comm::actors::detail::write_reason_payload(&comm::fuzz::env().ctx,
                                                                     reason, buf),
                        "cannot write a seed reason");
    seeds.emplace_back(buf.begin(), buf.end());
  }
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  caf::error reason;
  (void)comm::actors::detail::read_reason_payload(&comm::fuzz::env().ctx, data, size, reason);
  return 0;
}
