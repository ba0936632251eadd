// A shared, immutable byte buffer for large message payloads.
//
// A blob travels between nodes without being copied by the sender or by the receiver's
// deserialisation: its bytes go beside the serialised message (a libcomm rendezvous when large),
// and the receiver's blob is the very buffer they were fetched into. Copies of a
// blob share the bytes (a reference count), which makes passing one through local mailboxes free
// as well. Over shm the hop is not even a copy: the sender lends the blob (node_params::lend_blobs)
// and the receiver's blob refers to the sender's bytes in place, in the sender's memory that it
// maps; the sender keeps them until the receiver's last copy is gone. Such a blob's bytes are the
// sender's to change (a well-behaved sender never writes into a blob it shared): copy() one from an
// untrusted node that must stay stable.
//
//   comm::actors::blob frame(1 << 20);             // 1 MiB, uninitialised, writable while unique
//   std::memcpy(frame.mutable_data(), pixels, frame.size());
//   self->send(remote_viewer, show_atom::value, frame);
//
// node::load registers the type with CAF (as "comm::actors::blob"), so it needs no
// add_message_type. Other payloads (std::vector<char>, std::string) still avoid the serialiser's
// copy for large contents, but are copied once into their message on arrival.
#pragma once

#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/serializer.hpp>

#include <cstddef>
#include <memory>
#include <string_view>
#include <type_traits>

namespace comm::actors {

/// A reference-counted, immutable byte buffer (writable only while it has one owner).
class blob {
public:
  /// An empty blob.
  blob() noexcept = default;

  /// `size` bytes, uninitialised: fill them through mutable_data() before sharing the blob.
  explicit blob(size_t size);

  /// A copy of `size` bytes at `data`.
  blob(const void* data, size_t size);

  /// A copy of `bytes`.
  explicit blob(std::string_view bytes) : blob(bytes.data(), bytes.size()) {}

  /// Takes over `block`, `size` bytes allocated with comm::mem_alloc (or detached from a libcomm
  /// worker): comm::mem_free releases it when the last copy of the blob goes.
  static blob adopt(void* block, size_t size);

  /// A copy of the bytes in a buffer of their own: for a blob from another node that must stay
  /// stable although the sender may write into bytes it lent (see node_params::lend_blobs).
  blob copy() const { return blob(data_, size_); }

  /// A blob of the `size` bytes at `data`, kept alive by `owner`.
  static blob share(std::shared_ptr<const void> owner, const char* data, size_t size) noexcept;

  /// The bytes (null when empty).
  const char* data() const noexcept { return data_; }

  /// Number of bytes.
  size_t size() const noexcept { return size_; }

  /// True without bytes.
  bool empty() const noexcept { return size_ == 0; }

  /// The bytes, writable, while this is the only copy of the blob and they are not lent to this
  /// node by another (those are the lender's); null otherwise.
  char* mutable_data() noexcept;

  /// The bytes as a string view.
  std::string_view view() const noexcept { return {data_, size_}; }

  /// The owner of the bytes (shared by all copies).
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

  /// Same bytes (not necessarily the same buffer).
  friend bool operator==(const blob& a, const blob& b) noexcept { return a.view() == b.view(); }

  /// Different bytes.
  friend bool operator!=(const blob& a, const blob& b) noexcept { return !(a == b); }

private:
  std::shared_ptr<const void> owner_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

/// CAF's name of the blob type (registered by node::load).
inline constexpr const char* blob_type_name = "comm::actors::blob";

namespace detail {

/// Writes a blob: a length, then the bytes (beside the payload when the serialiser is a node's).
caf::error save_blob(caf::serializer& sink, const blob& x);

/// Reads a blob written by save_blob.
caf::error load_blob(caf::deserializer& source, blob& x);

}  // namespace detail

/// Serialises a blob with CAF's inspectors (and prints its size for to_string).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, blob& x) {
  if constexpr (std::is_base_of_v<caf::serializer, Inspector>) {
    return detail::save_blob(f, x);
  } else if constexpr (std::is_base_of_v<caf::deserializer, Inspector>) {
    return detail::load_blob(f, x);
  } else {
    size_t bytes = x.size();
    return f(caf::meta::type_name("blob"), bytes);
  }
}

}  // namespace comm::actors
