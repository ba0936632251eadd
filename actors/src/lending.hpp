// Lent blobs: a blob crosses to a node that can map this process's memory (over shm) as a
// reference instead of its bytes.
//
// The sender registers the blob's bytes (worker::mem_map), packs their key and sends, in place of
// the attachment, a lend: an id, the address, the length and the key (schema ActorLend). It keeps
// the blob and the registration in the connection's lend_table until the receiver releases the
// id, within node_params::max_lent_bytes per connection (beyond it, the bytes are copied as
// before). The receiver unpacks the key, asks libcomm where the bytes lie in its own address space
// (endpoint::rkey_local_address: the shm transport's mapping of the sender's heap segment, which
// the blob then holds) and reads them in place; the blob's owner is a lent_view, whose destruction
// queues the release in the connection's release_sink. A receiver that cannot map them copies
// them at once (endpoint::get) and releases the lend. A blob that goes back to the node that lent
// it travels as "returned": its id only, and the lender takes its own blob from the table.
//
// Every field of a lend is checked by the receiver (the key and range by libcomm against the
// sender's registrations, a returned id against the receiver's own table), every release id by
// the sender: anything else closes the connection as any malformed frame does. A connection that
// ends closes its sink (the borrower's blobs stay valid: they hold the mapping, which outlives the
// sender) and drops its table: the lender frees what it lent when the borrower process is gone,
// and otherwise hands the blobs to the lend_keeper (lend_keeper.hpp), which frees them when it
// exits, so bytes a borrower may still read are never reused while it lives.
//
// Lent bytes are registered for remote reads only (worker::mem_map without mem_remote_write):
// the borrower's mapping of them is read-only, so a write through a borrowed blob faults in the
// borrower, and a put through its key fails.
#pragma once

#include "attachments.hpp"

#include <comm/endpoint.hpp>
#include <comm/memory.hpp>

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace comm::actors::detail {

/// Most lends one frame may carry.
inline constexpr size_t max_lends_per_frame = 1024;

/// Most ids one release frame carries (more go in several frames).
inline constexpr size_t max_releases_per_frame = 4096;

/// Where a borrower collects the ids of the lends of one connection it let go of, from any
/// thread, until the progress thread sends them back (see the file comment).
class release_sink {
public:
  /// A sink that calls `notify` (under the sink's lock, so it must not call back into the sink)
  /// when it gets its first id after being emptied.
  explicit release_sink(std::function<void()> notify) : notify_(std::move(notify)) {}

  /// Records that lend `id` is let go; nothing once the sink is closed.
  void push(uint64_t id) noexcept;

  /// Takes the ids recorded so far.
  std::vector<uint64_t> take();

  /// Drops the ids and ignores later ones (the connection ended or the node stopped).
  void close();

private:
  std::mutex mtx_;
  std::vector<uint64_t> ids_;
  std::function<void()> notify_;
  bool closed_ = false;
};

/// The owner of a blob read in place from a lend: keeps the mapping of the sender's memory and
/// queues the release when the last copy of the blob goes.
struct lent_view {
  std::shared_ptr<release_sink> sink;   ///< the connection's sink
  std::shared_ptr<const void> mapping;  ///< keeps the bytes mapped
  uint64_t id = 0;                      ///< the lend
  const char* data = nullptr;           ///< the bytes, here
  size_t size = 0;                      ///< their length

  /// Queues the release.
  void operator()(const void*) const noexcept { sink->push(id); }
};

/// A blob of `view`'s bytes, owned by (a copy of) `view`.
blob borrowed_blob(const lent_view& view);

/// True when `owner` is that of a blob read in place from a lend (never writable here).
bool is_borrowed(const std::shared_ptr<const void>& owner) noexcept;

/// The id of the lend `run` is, whole, when it was read from a lend of the connection whose sink
/// is `sink`: it can go back to its lender by id.
std::optional<uint64_t> returned_lend(const blob& run, const release_sink* sink) noexcept;

/// A blob lent to a peer, kept until released.
struct lend {
  blob bytes;                      ///< the blob (its bytes stay allocated)
  comm::memh_ptr registration;     ///< their registration, which the peer's key names
};

/// What a connection's peer has borrowed from this node.
struct lend_table {
  lend_table() = default;
  lend_table(const lend_table&) = delete;
  lend_table& operator=(const lend_table&) = delete;
  /// Closes `borrower`.
  ~lend_table();

  std::unordered_map<uint64_t, lend> lent;  ///< by id
  size_t bytes = 0;                         ///< bytes of those
  uint64_t next_id = 0;                     ///< the id of the last lend
  bool watched = false;  ///< the borrower process was asked for (at the first lend)
  int borrower = -1;     ///< pidfd of the borrower process (-1: unknown, or handed over)
  pid_t borrower_pid = 0;  ///< its pid
  /// Bytes kept for the borrower process from its closed connections when this one began lending
  /// (lend_keeper.hpp); they count against max_lent_bytes.
  size_t kept_before = 0;
};

/// One attachment of a message frame sent as a lend (schema ActorLend).
struct lend_descriptor {
  uint64_t id = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  std::vector<uint8_t> key;  ///< packed remote key; empty when returned
  bool returned = false;     ///< the receiver's own lend `id` coming back
};

/// Appends the ActorLends of `runs` to `out`.
void encode_lends(const std::vector<lend_descriptor>& runs, std::vector<char>& out);

/// Decodes an ActorLends into `out`.
/// @returns false when the bytes are not one, name no run or more than max_lends_per_frame
bool decode_lends(const void* data, size_t length, std::vector<lend_descriptor>& out);

/// Appends the ActorReleases of `count` ids at `ids` to `out`.
void encode_releases(const uint64_t* ids, size_t count, std::vector<char>& out);

/// Decodes an ActorReleases into `out`.
/// @returns false when the bytes are not one, or name no id
bool decode_releases(const void* data, size_t length, std::vector<uint64_t>& out);

}  // namespace comm::actors::detail
