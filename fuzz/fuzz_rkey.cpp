// Fuzzes remote keys of the self and shm memory domains: unpacking bytes a peer sent as a key, and
// using the key for a get or a put (transports/base/rkey.*, transports/self, transports/shm).
//
// One interface of each transport registers two regions of a static arena (A, and B read-only
// where the md enforces it: md::mem_reg_read_only, shm) and a third (C) that it deregisters again,
// and has an endpoint to itself. Each input picks a transport and one of the three keys, flips bits
// of its packed bytes, may append a transport extension, and makes one access at an offset from
// the region it started from. The property: an access that succeeds lies wholly inside a region
// still registered (A or B; never C, never the arena around them), a put never in a read-only one,
// a get returns exactly the region's bytes and a put changes exactly the bytes it names; an access
// that fails changes nothing.
#include "check.hpp"
#include "seeds.hpp"

#include "base/rkey.hpp"

#include <comm/transport/transport.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

namespace {

using comm::fuzz::require;

using namespace comm::tl;

constexpr size_t arena_size = 16384;
constexpr size_t max_access = 8192;
constexpr size_t key_count = 3;  // A, B (registered), C (deregistered)

/// A part of the arena.
struct range {
  size_t offset;  ///< in the arena
  size_t length;
};
constexpr range regions[key_count] = {{4096, 2048}, {8192, 1024}, {12288, 512}};

alignas(64) uint8_t arena[arena_size];
alignas(64) uint8_t arena_before[arena_size];

/// One transport's interface, its endpoint to itself and the packed keys of the three regions.
struct transport_setup {
  std::unique_ptr<iface> owner;
  std::unique_ptr<ep> to_self;
  std::array<std::vector<uint8_t>, key_count> keys;
  std::array<mem_handle*, key_count> handles{};
  std::array<bool, key_count> read_only{};  ///< registered with mem_reg_read_only
};

/// Opens transport `name`, registers the three regions and deregisters C.
transport_setup open_transport(std::string_view name) {
  transport_setup s;
  for (component* c : all_components()) {
    if (c->name() != name || c->devices().empty()) continue;
    iface_params params;
    params.device = c->devices().front();
    require(c->open(params, s.owner) == comm::status::ok, "cannot open an interface");
  }
  require(s.owner != nullptr, "transport missing");
  require(s.owner->create_ep(s.owner->device_address(), s.owner->iface_address(), s.to_self) ==
              comm::status::ok,
          "cannot create an endpoint to itself");
  md* domain = s.owner->memory_domain();
  for (size_t k = 0; k < key_count; ++k) {
    void* start = arena + regions[k].offset;
    // B is for reading only where the md can enforce it (unsupported elsewhere).
    comm::status st = k == 1 ? domain->mem_reg_read_only(start, regions[k].length, &s.handles[k])
                             : comm::status::unsupported;
    s.read_only[k] = st == comm::status::ok;
    if (st == comm::status::unsupported) {
      st = domain->mem_reg(start, regions[k].length, &s.handles[k]);
    }
    require(st == comm::status::ok, "cannot register");
    require(domain->rkey_pack(s.handles[k], s.keys[k]) == comm::status::ok, "cannot pack");
  }
  require(domain->mem_dereg(s.handles[key_count - 1]) == comm::status::ok, "cannot deregister");
  return s;
}

/// The self and shm setups, made on first use and kept.
std::array<transport_setup, 2>& setups() {
  static auto* made = new std::array<transport_setup, 2>{open_transport("self"),
                                                         open_transport("shm")};
  return *made;
}

/// True when [address, address + length) lies inside region A or B (the live ones), for a put
/// one that is not read-only.
bool inside_live_region(const transport_setup& s, uint64_t address, size_t length, bool put) {
  for (size_t k = 0; k + 1 < key_count; ++k) {
    if (put && s.read_only[k]) continue;
    const auto start = reinterpret_cast<uint64_t>(arena + regions[k].offset);
    if (address >= start && address - start <= regions[k].length &&
        length <= regions[k].length - (address - start)) {
      return true;
    }
  }
  return false;
}

/// Runs a get or put through `s`, progressing the interface until it finishes (bounded).
comm::status access(transport_setup& s, bool put, const iov* entries, size_t count,
                    uint64_t address, const remote_key& key) {
  completion comp;
  comp.count = 1;
  comm::status st = put ? s.to_self->put_zcopy(entries, count, address, key, &comp)
                        : s.to_self->get_zcopy(entries, count, address, key, &comp);
  if (st != comm::status::in_progress) return st;
  for (int i = 0; i < 100000 && comp.count != 0; ++i) s.owner->progress();
  require(comp.count == 0, "an access never completed");
  return comp.result;
}

/// Splits [buffer, buffer + length) into up to `parts` iov entries.
size_t split(uint8_t* buffer, size_t length, size_t parts, iov* out) {
  size_t at = 0;
  for (size_t i = 0; i < parts; ++i) {
    const size_t piece = i + 1 == parts ? length - at : length / parts;
    out[i] = iov{buffer + at, piece};
    at += piece;
  }
  return parts;
}

/// Makes the access the rest of the input describes with `key` and checks the property.
void check_access(transport_setup& s, const remote_key& key, FuzzedDataProvider& in) {
  const bool put = in.ConsumeBool();
  const size_t parts = in.ConsumeIntegralInRange<size_t>(1, 4);
  const size_t length = in.ConsumeIntegralInRange<size_t>(0, max_access);
  const bool absolute = in.ConsumeBool();
  const int64_t offset = in.ConsumeIntegral<int32_t>();
  const uint64_t address = absolute ? in.ConsumeIntegral<uint64_t>() : key.address + offset;
  std::vector<uint8_t> local(length);
  for (size_t i = 0; i < length; ++i) local[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < arena_size; ++i) arena[i] = static_cast<uint8_t>(i * 13 + 5);
  std::memcpy(arena_before, arena, arena_size);
  iov entries[4];
  const comm::status st = access(s, put, entries, split(local.data(), length, parts, entries),
                                 address, key);
  if (st != comm::status::ok) {
    require(std::memcmp(arena, arena_before, arena_size) == 0, "a failed put wrote memory");
    return;
  }
  require(inside_live_region(s, address, length, put),
          "an access outside every live region, or a put into a read-only one, succeeded");
  if (length == 0) return;
  const size_t at = address - reinterpret_cast<uint64_t>(arena);
  if (put) {
    require(std::memcmp(arena + at, local.data(), length) == 0, "a put wrote other bytes");
    std::memcpy(arena_before + at, local.data(), length);
    require(std::memcmp(arena, arena_before, arena_size) == 0, "a put wrote outside its range");
  } else {
    require(std::memcmp(arena + at, local.data(), length) == 0, "a get read other bytes");
  }
}

// -- seeds -----------------------------------------------------------------------------------------

using comm::fuzz::seed;

/// An input as FuzzedDataProvider reads it: byte strings from the front, integers from the back
/// (most significant byte first).
struct provider_input {
  seed front;
  seed back;  ///< in the order they are consumed
  void integer(uint64_t value, size_t bytes) {
    for (size_t i = bytes; i-- > 0;) back.push_back(static_cast<uint8_t>(value >> (8 * i)));
  }
  seed bytes() const {
    seed out = front;
    out.insert(out.end(), back.rbegin(), back.rend());
    return out;
  }
};

/// Seeds: for each transport and key, the key unchanged, a get of 64 bytes and a put of 512 at the
/// start of its region (over shm, the put into B is refused: B is read-only there).
std::vector<seed> make_seeds() {
  std::vector<seed> seeds;
  for (uint8_t transport = 0; transport < 2; ++transport) {
    for (uint8_t k = 0; k < key_count; ++k) {
      for (uint8_t put = 0; put < 2; ++put) {
        provider_input in;
        in.front.assign(sizeof(packed_rkey), 0);  // no bit flipped
        in.integer(transport, 1);
        in.integer(k, 1);
        in.integer(0, 1);         // no extension
        in.integer(put, 1);
        in.integer(put, 1);       // 1 or 2 iov entries
        in.integer(put ? 512 : 64, 2);
        in.integer(0, 1);         // relative to the key's address
        in.integer(0x80000000u, 4);  // offset 0
        seeds.push_back(in.bytes());
      }
    }
  }
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  transport_setup& s = setups()[in.ConsumeBool() ? 1 : 0];
  std::vector<uint8_t> bytes = s.keys[in.ConsumeIntegralInRange<size_t>(0, key_count - 1)];
  const std::vector<uint8_t> flips = in.ConsumeBytes<uint8_t>(bytes.size());
  for (size_t i = 0; i < flips.size(); ++i) bytes[i] ^= flips[i];
  const std::vector<uint8_t> extension =
      in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 64));
  bytes.insert(bytes.end(), extension.begin(), extension.end());
  md* domain = s.owner->memory_domain();
  remote_key key;
  if (domain->rkey_unpack(bytes.data(), bytes.size(), &key) != comm::status::ok) return 0;
  check_access(s, key, in);
  domain->rkey_release(&key);
  return 0;
}
