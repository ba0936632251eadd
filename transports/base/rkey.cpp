#include "base/rkey.hpp"

#include <cstring>
#include <new>

namespace comm::tl {
namespace {

/// What remote_key::transport points at: the key, tagged with its md's magic so a key handed to
/// the wrong transport is recognised rather than misread.
struct unpacked_rkey {
  uint32_t magic = 0;
  packed_rkey key;
  uint8_t extension_length = 0;
  uint8_t extension[max_rkey_extension] = {};
};

bool reserved_zero(const packed_rkey& key) {
  return key.reserved[0] == 0 && key.reserved[1] == 0 && key.reserved[2] == 0;
}

}  // namespace

void append_rkey(const packed_rkey& key, std::vector<uint8_t>& out) {
  const auto* p = reinterpret_cast<const uint8_t*>(&key);
  out.insert(out.end(), p, p + sizeof(key));
}

status parse_rkey(const void* data, size_t length, uint32_t magic, uint32_t table_size,
                  packed_rkey* out) {
  if (data == nullptr || length != sizeof(packed_rkey)) return status::invalid_param;
  packed_rkey key;
  std::memcpy(&key, data, sizeof(key));
  if (key.magic != magic || key.version != rkey_version || !reserved_zero(key)) {
    return status::invalid_param;
  }
  if (key.pid <= 0 || key.iface_id == 0 || key.generation == 0 ||
      key.generation > max_rkey_generation || key.index >= table_size ||
      key.base + key.length < key.base) {
    return status::invalid_param;
  }
  *out = key;
  return status::ok;
}

status make_remote_key(const packed_rkey& key, remote_key* out, const void* extension,
                       size_t extension_length) {
  if (extension_length > max_rkey_extension || (extension == nullptr && extension_length != 0)) {
    return status::invalid_param;
  }
  auto* unpacked = new (std::nothrow) unpacked_rkey{key.magic, key};
  if (unpacked == nullptr) return status::no_memory;
  unpacked->extension_length = static_cast<uint8_t>(extension_length);
  if (extension_length != 0) std::memcpy(unpacked->extension, extension, extension_length);
  out->address = key.base;
  out->length = key.length;
  out->transport = unpacked;
  return status::ok;
}

const packed_rkey* rkey_of(const remote_key& key, uint32_t magic) {
  const auto* unpacked = static_cast<const unpacked_rkey*>(key.transport);
  if (unpacked == nullptr || unpacked->magic != magic) return nullptr;
  return &unpacked->key;
}

const void* rkey_extension(const remote_key& key, uint32_t magic, size_t* length) {
  const auto* unpacked = static_cast<const unpacked_rkey*>(key.transport);
  if (unpacked == nullptr || unpacked->magic != magic || unpacked->extension_length == 0) {
    return nullptr;
  }
  *length = unpacked->extension_length;
  return unpacked->extension;
}

void release_rkey(remote_key* key, uint32_t magic) {
  if (key == nullptr || rkey_of(*key, magic) == nullptr) return;
  delete static_cast<unpacked_rkey*>(key->transport);
  *key = remote_key{};
}

status check_range(uint64_t base, uint64_t length, uint64_t address, uint64_t bytes) {
  if (address < base || address - base > length) return status::protection_error;
  const uint64_t offset = address - base;
  if (offset == length && bytes != 0) return status::protection_error;
  if (bytes > length - offset) return status::length_error;
  return status::ok;
}

bool sum_iov(const iov* entries, size_t count, size_t* total) {
  if (entries == nullptr && count != 0) return false;
  size_t sum = 0;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length > SIZE_MAX - sum) return false;
    sum += entries[i].length;
  }
  *total = sum;
  return true;
}

}  // namespace comm::tl
