// Fuzzes the Cap'n Proto header reader (serialization/include/comm/wire/codec.hpp).
//
// Input: one byte choosing a schema type, then the bytes of a record.
//   - Data-only headers (the hot path) go through wire::read_header, 8-byte aligned and misaligned.
//     A header it accepts must lie inside the input, and its fields must survive a trip through a
//     header_writer: what is written again reads back the same.
//   - Headers with pointers (addresses, keys, the CM messages, the node hello) go through the checked
//     reader libcomm uses (wire::checked_reader_options), and every field is read.
#include <comm/wire/codec.hpp>

#include "check.hpp"
#include "seeds.hpp"

#include "schema/actor.capnp.h"
#include "schema/wire.capnp.h"
#include "shm/shm.capnp.h"
#include "tcp/tcp.capnp.h"

#include <capnp/dynamic.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

namespace {

using comm::fuzz::fail;

namespace schema = comm::wire::schema;

/// The input after the selector byte, copied to 8-byte aligned words (plus one spare word so a
/// misaligned view of the same bytes fits).
struct aligned_copy {
  aligned_copy(const uint8_t* data, size_t length) : length(length), words(length / 8 + 2) {
    std::memcpy(words.data(), data, length);
  }
  const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  size_t length;
  std::vector<uint64_t> words;
};

/// Whether two scalar field values (the only kind a data-only header has) are equal.
bool same_value(const capnp::DynamicValue::Reader& a, const capnp::DynamicValue::Reader& b) {
  if (a.getType() != b.getType()) return false;
  switch (a.getType()) {
    case capnp::DynamicValue::BOOL:
      return a.as<bool>() == b.as<bool>();
    case capnp::DynamicValue::INT:
      return a.as<int64_t>() == b.as<int64_t>();
    case capnp::DynamicValue::UINT:
      return a.as<uint64_t>() == b.as<uint64_t>();
    case capnp::DynamicValue::ENUM:
      return a.as<capnp::DynamicEnum>().getRaw() == b.as<capnp::DynamicEnum>().getRaw();
    default:
      fail("a data-only header has a field that is not a scalar");
  }
}

/// Reads every field of a data-only header, writes them again and checks they read back equal.
template <class Struct>
void check_data_only(const aligned_copy& in) {
  size_t consumed = 0;
  auto header = comm::wire::read_header<Struct>(in.bytes(), in.length, &consumed);
  // The same bytes one byte off their alignment are always refused.
  std::vector<uint8_t> shifted(in.length + 1);
  std::memcpy(shifted.data() + 1, in.bytes(), in.length);
  if (in.length != 0 && comm::wire::read_header<Struct>(shifted.data() + 1, in.length)) {
    fail("a misaligned header was accepted");
  }
  if (!header) return;
  if (consumed > in.length || consumed < comm::wire::header_size<Struct>() || consumed % 8 != 0) {
    fail("an accepted header does not lie inside the input");
  }
  comm::wire::header_writer<Struct> writer;
  auto source = capnp::toDynamic(*header);
  auto sink = capnp::toDynamic(writer.fields());
  for (auto field : source.getSchema().getFields()) sink.set(field, source.get(field));
  auto again = comm::wire::read_header<Struct>(writer.bytes(), writer.size());
  if (!again) fail("a re-encoded header is refused");
  auto reread = capnp::toDynamic(*again);
  for (auto field : source.getSchema().getFields()) {
    if (!same_value(source.get(field), reread.get(field))) {
      fail("a field read back differently after re-encoding");
    }
  }
}

/// Reads a record with pointers through the checked reader and visits all of it.
template <class Struct>
void check_checked(const aligned_copy& in) {
  if (in.length < 8) return;
  kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(in.words.data()),
                                        in.length / 8);
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(words, comm::wire::checked_reader_options());
    auto text = kj::str(reader.getRoot<Struct>());
    if (text.size() == 0) fail("a record printed as nothing");
  });
  (void)failure;  // malformed input is refused by an exception: what the callers expect
}

// -- seeds -----------------------------------------------------------------------------------------

using comm::fuzz::flat;
using comm::fuzz::seed;

/// A header of `Struct` with every integer field set to its ordinal + 1 and every bool set.
template <class Struct>
seed data_only_seed() {
  comm::wire::header_writer<Struct> writer;
  auto fields = capnp::toDynamic(writer.fields());
  for (auto field : fields.getSchema().getFields()) {
    const auto type = field.getType();
    if (type.isBool()) {
      fields.set(field, true);
    } else if (!type.isEnum()) {
      fields.set(field, static_cast<uint64_t>(field.getIndex() + 1));
    }
  }
  seed out;
  comm::fuzz::append(out, writer.bytes(), writer.size());
  return out;
}

/// An empty record of `Struct` (every pointer null).
template <class Struct>
seed empty_seed() {
  capnp::MallocMessageBuilder message;
  message.initRoot<Struct>();
  return flat(message);
}

/// A worker address with two transports.
seed worker_address_seed() {
  capnp::MallocMessageBuilder message;
  auto address = message.initRoot<schema::WorkerAddress>();
  address.setUid(0x1234);
  address.setName("host:4242");
  auto list = address.initTransports(2);
  const uint8_t device[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  for (unsigned i = 0; i < 2; ++i) {
    list[i].setName(i == 0 ? "shm" : "tcp");
    list[i].setDevice(kj::arrayPtr(device, sizeof(device)));
    list[i].setIface(kj::arrayPtr(device, 8));
  }
  return flat(message);
}

/// A rendezvous announcement with a key and a header.
seed rts_seed() {
  capnp::MallocMessageBuilder message;
  auto rts = message.initRoot<schema::RndvRts>();
  rts.setDstEp(0x100000);
  rts.setTag(7);
  rts.setLength(1 << 20);
  const uint8_t key[48] = {0x73, 0x68, 0x72, 0x6b, 2};
  rts.setRkey(kj::arrayPtr(key, sizeof(key)));
  rts.setHeader(kj::arrayPtr(key, 4));
  return flat(message);
}

/// A connection manager request with private data.
seed cm_request_seed() {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::CmMessage>().initRequest();
  const uint8_t data[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  request.setPrivateData(kj::arrayPtr(data, sizeof(data)));
  return flat(message);
}

/// An actor node's hello.
seed node_hello_seed() {
  capnp::MallocMessageBuilder message;
  auto hello = message.initRoot<schema::ActorNodeHello>();
  hello.setMagic(0x434f4d4d41435401ull);
  const uint8_t id[24] = {1, 2, 3};
  hello.setNodeId(kj::arrayPtr(id, sizeof(id)));
  hello.setAddress("127.0.0.1:7000");
  return flat(message);
}

/// A tagged zcopy descriptor with two iov entries.
seed shm_tag_zcopy_seed() {
  capnp::MallocMessageBuilder message;
  auto d = message.initRoot<schema::ShmTagZcopyDescriptor>();
  d.setSenderPid(1234);
  d.setCompletionSeq(5);
  d.setTag(0x77);
  d.setImm(9);
  auto list = d.initIov(2);
  list[0].setAddress(0x10000);
  list[0].setLength(100);
  list[1].setAddress(0x20000);
  list[1].setLength(4000);
  return flat(message);
}

/// A rendezvous announcement of the shm transport with a key.
seed shm_tag_rndv_seed() {
  capnp::MallocMessageBuilder message;
  auto d = message.initRoot<schema::ShmTagRndvDescriptor>();
  d.setSenderPid(1234);
  d.setSenderFd(7);
  d.setSenderIfaceId(0x1122);
  d.setSenderFifoSize(256);
  d.setSenderCellSize(128);
  d.setSenderSegSize(8192);
  d.setOpSlot(3);
  d.setOpGeneration(1);
  d.setTag(0x42);
  d.setHeaderLength(16);
  d.setAddress(0x30000);
  d.setLength(1 << 20);
  const uint8_t key[48] = {0x73, 0x68, 0x72, 0x6b, 2};
  d.setRkey(kj::arrayPtr(key, sizeof(key)));
  return flat(message);
}

/// One schema type: how its bytes are checked and what its seed is.
struct codec_case {
  void (*check)(const aligned_copy&);
  seed (*make_seed)();
};

constexpr codec_case cases[] = {
    {check_data_only<schema::TagEager>, data_only_seed<schema::TagEager>},
    {check_data_only<schema::TagEagerImm>, data_only_seed<schema::TagEagerImm>},
    {check_data_only<schema::TagEagerFirst>, data_only_seed<schema::TagEagerFirst>},
    {check_data_only<schema::FragmentMiddle>, data_only_seed<schema::FragmentMiddle>},
    {check_data_only<schema::ActiveMessage>, data_only_seed<schema::ActiveMessage>},
    {check_data_only<schema::ActiveMessageFirst>, data_only_seed<schema::ActiveMessageFirst>},
    {check_data_only<schema::WireupReply>, data_only_seed<schema::WireupReply>},
    {check_data_only<schema::EndpointClose>, data_only_seed<schema::EndpointClose>},
    {check_data_only<schema::RndvAts>, data_only_seed<schema::RndvAts>},
    {check_data_only<schema::RndvRtr>, data_only_seed<schema::RndvRtr>},
    {check_data_only<schema::RndvData>, data_only_seed<schema::RndvData>},
    {check_data_only<schema::RndvCancel>, data_only_seed<schema::RndvCancel>},
    {check_data_only<schema::RndvRefuse>, data_only_seed<schema::RndvRefuse>},
    {check_data_only<schema::TagCredit>, data_only_seed<schema::TagCredit>},
    {check_data_only<schema::RmaRequest>, data_only_seed<schema::RmaRequest>},
    {check_data_only<schema::RmaReply>, data_only_seed<schema::RmaReply>},
    {check_data_only<schema::TcpHello>, data_only_seed<schema::TcpHello>},
    {check_data_only<schema::TcpChallenge>, data_only_seed<schema::TcpChallenge>},
    {check_data_only<schema::TcpProof>, data_only_seed<schema::TcpProof>},
    {check_data_only<schema::TcpWelcome>, data_only_seed<schema::TcpWelcome>},
    {check_data_only<schema::TcpFrame>, data_only_seed<schema::TcpFrame>},
    {check_data_only<schema::ActorEnvelope>, data_only_seed<schema::ActorEnvelope>},
    {check_data_only<schema::ShmRemoteIov>, data_only_seed<schema::ShmRemoteIov>},
    {check_checked<schema::WorkerAddress>, worker_address_seed},
    {check_checked<schema::WireupRequest>, empty_seed<schema::WireupRequest>},
    {check_checked<schema::RndvRts>, rts_seed},
    {check_checked<schema::RemoteKeyBundle>, empty_seed<schema::RemoteKeyBundle>},
    {check_checked<schema::ShmZcopyDescriptor>, empty_seed<schema::ShmZcopyDescriptor>},
    {check_checked<schema::CmMessage>, cm_request_seed},
    {check_checked<schema::CmEndpointData>, empty_seed<schema::CmEndpointData>},
    {check_checked<schema::ActorNodeHello>, node_hello_seed},
    {check_data_only<schema::ShmTagHeader>, data_only_seed<schema::ShmTagHeader>},
    {check_checked<schema::ShmTagZcopyDescriptor>, shm_tag_zcopy_seed},
    {check_checked<schema::ShmTagRndvDescriptor>, shm_tag_rndv_seed},
};

/// Seeds: one record of every schema type, after its selector byte.
std::vector<seed> make_seeds() {
  std::vector<seed> seeds;
  for (size_t i = 0; i < std::size(cases); ++i) {
    seed s{static_cast<uint8_t>(i)};
    const seed record = cases[i].make_seed();
    s.insert(s.end(), record.begin(), record.end());
    seeds.push_back(std::move(s));
  }
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  cases[data[0] % std::size(cases)].check(aligned_copy(data + 1, size - 1));
  return 0;
}
