// Remote keys of the memory domains of self and shm, and the checks every RMA access makes.
//
// A packed rkey is one fixed-size little struct (packed_rkey, 48 bytes) naming a slot of the
// owner's region table and the generation the slot had when the region was registered:
//
//   offset size field
//        0    4 magic        rkey_magic_shm or rkey_magic_self (which md packed it)
//        4    1 version      rkey_version
//        5    3 reserved     zero
//        8    4 pid          owner process
//       12    4 index        slot in the owner's region table
//       16    8 iface_id     owner interface (shm: its random id; self: its registry id)
//       24    8 generation   the slot's generation when registered (never 0)
//       32    8 base         start of the registered region in the owner's address space
//       40    8 length       bytes in the region
//
// Version 2: a key may be followed by a transport extension (the shm md appends the shared-heap
// segment its region lies in, shm_heap.hpp: segment_ref); the transport parses and validates it
// and keeps it with the unpacked key (make_remote_key, rkey_extension).
//
// Unpacking checks the size, magic, version, reserved bytes and the plain consistency of the
// fields (pid > 0, iface id non-zero, 0 < generation <= max_rkey_generation, index inside the
// table, base + length does not wrap); anything else is status::invalid_param. Whether the key
// still grants access is decided at every access, against the owner's table (see check_range and
// the transports' region tables).
#pragma once

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace comm::tl {

/// Layout version of packed_rkey (2: optional transport extension after it).
inline constexpr uint8_t rkey_version = 2;
/// Magic of keys packed by the shm memory domain ("shrk").
inline constexpr uint32_t rkey_magic_shm = 0x6b726873;
/// Magic of keys packed by the self memory domain ("slrk").
inline constexpr uint32_t rkey_magic_self = 0x6b726c73;

/// Largest generation a key may carry (tables keep generation << 1 | valid in one word).
inline constexpr uint64_t max_rkey_generation = UINT64_MAX >> 1;

/// The bytes of a remote key, as they travel to the peer.
struct [[gnu::packed]] packed_rkey {
  uint32_t magic = 0;        ///< which memory domain packed it
  uint8_t version = rkey_version;
  uint8_t reserved[3] = {};  ///< zero
  int32_t pid = 0;           ///< owner process
  uint32_t index = 0;        ///< slot in the owner's region table
  uint64_t iface_id = 0;     ///< owner interface
  uint64_t generation = 0;   ///< generation of the slot when the region was registered
  uint64_t base = 0;         ///< start of the region (owner's virtual address)
  uint64_t length = 0;       ///< bytes in the region
};
static_assert(sizeof(packed_rkey) == 48);

/// Appends `key` to `out`.
void append_rkey(const packed_rkey& key, std::vector<uint8_t>& out);

/// Validates `length` bytes at `data` as a key with `magic` whose index is below `table_size`.
/// Returns ok and fills `*out`, or invalid_param.
status parse_rkey(const void* data, size_t length, uint32_t magic, uint32_t table_size,
                  packed_rkey* out);

/// Largest transport extension an unpacked key keeps.
inline constexpr size_t max_rkey_extension = 48;

/// Fills `*out` with a heap copy of `key` tagged with its magic (released by release_rkey), and of
/// the `extension_length` (<= max_rkey_extension) bytes at `extension`. Returns ok, no_memory, or
/// invalid_param for a longer extension.
status make_remote_key(const packed_rkey& key, remote_key* out, const void* extension = nullptr,
                       size_t extension_length = 0);

/// The extension kept with `key` when an md with `magic` unpacked it and gave one, else null;
/// `*length` is its size.
const void* rkey_extension(const remote_key& key, uint32_t magic, size_t* length);

/// The key behind `key` when an md with `magic` unpacked it, else null (no key, or another
/// transport's).
const packed_rkey* rkey_of(const remote_key& key, uint32_t magic);

/// Frees what make_remote_key allocated, when `key` was unpacked by an md with `magic`; clears it.
void release_rkey(remote_key* key, uint32_t magic);

/// Whether [address, address + bytes) lies inside [base, base + length): ok; protection_error when
/// the access starts outside the region (a 0-byte access may start at its end); length_error when
/// it starts inside but runs past the end.
status check_range(uint64_t base, uint64_t length, uint64_t address, uint64_t bytes);

/// Sums the lengths of `count` entries into `*total`; false when the sum overflows or `entries` is
/// null with a non-zero count.
bool sum_iov(const iov* entries, size_t count, size_t* total);

}  // namespace comm::tl
