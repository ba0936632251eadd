// Fuzzes the actor node's reader of a down frame's payload, the exit reason of a remote actor
// (read_reason_payload, actors/src/payload.*). The reason must be read within the payload's bytes:
// no allocation beyond what they can fill (libFuzzer's -malloc_limit_mb catches one); a reason
// read is written again (write_reason_payload) and reads back to the same bytes.
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
  using namespace comm::actors::detail;
  auto* ctx = &comm::fuzz::env().ctx;
  caf::error reason;
  if (read_reason_payload(ctx, data, size, reason)) return 0;
  std::vector<char> once;
  comm::fuzz::require(!write_reason_payload(ctx, reason, once), "a reason read cannot be written");
  caf::error again;
  std::vector<char> twice;
  comm::fuzz::require(!read_reason_payload(ctx, once.data(), once.size(), again) &&
                          !write_reason_payload(ctx, again, twice) && once == twice,
                      "a reason reads back differently after writing it");
  return 0;
}
