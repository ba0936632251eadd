// Remote keys re-encoded by a test: a hostile reader's forged rights or length, or a key without
// the transports' entries, so that every access through it goes through the owner's worker.
#pragma once

#include "fixture.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>
#include <vector>

namespace comm::test {

/// The packed key `packed` re-encoded by `edit` (called with its RemoteKeyBundle builder).
template <class Edit>
inline std::vector<uint8_t> reencoded(const std::vector<uint8_t>& packed, Edit&& edit) {
  auto words = kj::heapArray<capnp::word>(packed.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), packed.data(), words.size() * sizeof(capnp::word));
  capnp::FlatArrayMessageReader reader(words);
  capnp::MallocMessageBuilder builder;
  builder.setRoot(reader.getRoot<wire::schema::RemoteKeyBundle>());
  edit(builder.getRoot<wire::schema::RemoteKeyBundle>());
  const auto flat = capnp::messageToFlatArray(builder);
  const auto bytes = flat.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

/// b's key for `handle`, re-encoded by `edit` (called with the RemoteKeyBundle builder) and
/// unpacked on a's endpoint.
template <class Edit>
inline rkey* reencoded_key(worker_pair& p, memh* handle, Edit&& edit) {
  std::vector<uint8_t> packed;
  BOOST_REQUIRE(p.b->rkey_pack(handle, packed) == status::ok);
  const std::vector<uint8_t> edited = reencoded(packed, edit);
  rkey* key = nullptr;
  BOOST_REQUIRE(p.ab->rkey_unpack(edited.data(), edited.size(), &key) == status::ok);
  return key;
}

/// b's key for `handle` without the transports' keys in it: a's puts and gets with it go through
/// b's worker (software RMA) on every lane, in flight until b progresses.
inline rkey* key_served_by_owner(worker_pair& p, memh* handle) {
  return reencoded_key(p, handle, [](auto bundle) { bundle.initEntries(0); });
}

}  // namespace comm::test
