// A connection to another node, and the blocking lookups that wait on one.
#pragma once

#include "attachments.hpp"
#include "frame.hpp"
#include "lending.hpp"

#include <comm/endpoint.hpp>

#include <caf/actor.hpp>
#include <caf/expected.hpp>
#include <caf/node_id.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace comm::actors::detail {

/// A lookup that a caller blocks on until the progress thread completes it.
class lookup_call {
public:
  /// A lookup of `name` at the node listening on `address`, for a handle of interface
  /// `expected` (empty: caf::actor, no check).
  lookup_call(std::string address, std::string name, interface expected = {})
      : address(std::move(address)), name(std::move(name)), expected(std::move(expected)) {}

  const std::string address;  ///< the node asked
  const std::string name;     ///< the name asked for
  const interface expected;   ///< the interface the caller's handle needs
  /// Connections this lookup was sent on that failed before answering (progress thread): the
  /// first such failure redials once, for a node that restarted at the same address.
  int lost_connections = 0;

  /// Completes the call with `result`; later completions are ignored.
  void complete(caf::expected<caf::actor> result);

  /// Waits up to `timeout` for the completion.
  /// @returns the result, or make_error(status::timed_out)
  caf::expected<caf::actor> wait(std::chrono::milliseconds timeout);

private:
  std::mutex mtx_;
  std::condition_variable cv_;
  std::optional<caf::expected<caf::actor>> result_;
};

/// Identifies a request sent to a peer: the local requester and the request's number.
struct request_key {
  caf::actor_id requester = 0;
  uint64_t request = 0;
  bool operator==(const request_key&) const = default;
};

/// Hash of a request_key.
struct request_key_hash {
  size_t operator()(const request_key& k) const noexcept {
    return std::hash<uint64_t>{}(k.requester * 0x9e3779b97f4a7c15ull ^ k.request);
  }
};

/// A frame that arrived before its turn (an earlier one is still being fetched by rendezvous).
struct held_frame {
  frame_header header;
  std::vector<char> payload;
  attachment_source attached;  ///< its attachments, owned (see attachment_source::own)
  size_t cost = 0;             ///< bytes it counts for against node_params::max_held_bytes
};

/// One connection to another node. Shared by the node's maps, its proxies and queued frames; the
/// fields below `alive` belong to the progress thread.
struct peer {
  /// A connection numbered `serial` (unique per node), known by `address` until its hello came.
  peer(uint64_t serial, std::string address) : serial(serial) {
    if (!address.empty()) addresses.push_back(std::move(address));
  }

  const uint64_t serial;        ///< number of the connection on this node
  caf::node_id id;              ///< the peer's node id, set before the peer is shared
  std::atomic<size_t> proxies{0};  ///< proxies of the peer's actors made through it, alive
  std::atomic<bool> alive{true};///< false once the connection failed or closed
  /// Frames waiting in libcomm's send queue (changed by the lock holder, read by any sender).
  std::atomic<size_t> queued_frames{0};
  /// Messages a sender left for the lock holder that it has not sent yet (changed by any
  /// thread): with queued_frames, what counts against node_params::max_backlog.
  std::atomic<size_t> unsent_frames{0};
  /// A sender waited for the backlog in vain (the peer took nothing): later senders do not wait
  /// until the peer takes a frame again.
  std::atomic<bool> backlog_stuck{false};

  comm::endpoint* ep = nullptr; ///< the connection's endpoint
  bool ready = false;           ///< the hello arrived: frames may flow
  bool dialled = false;         ///< this node opened it (a lookup), rather than accepted it
  bool mapped = false;          ///< the node's connection for `id` (proxies use it)
  std::vector<std::string> addresses;  ///< addresses the peer is known by
  uint32_t send_seq = 0;        ///< number of the next frame sent
  uint32_t recv_seq = 0;        ///< number of the next frame to handle
  std::map<uint32_t, held_frame> held;  ///< frames that arrived early, by number
  size_t held_bytes = 0;        ///< their costs (held_frame::cost)
  size_t queued_bytes = 0;      ///< costs of frames waiting in libcomm's send queue (queued_cost)
  /// Requests local actors sent to the peer's actors, waiting for a response: their message id.
  std::unordered_map<request_key, uint64_t, request_key_hash> pending;
  /// Pending requests above which those of terminated requesters are forgotten.
  static constexpr size_t first_prune = 4096;
  size_t prune_at = first_prune;
  std::unordered_set<caf::actor_id> watched;  ///< local actors the peer monitors
  std::vector<std::shared_ptr<lookup_call>> waiting;  ///< lookups waiting for the hello
  std::unordered_map<uint64_t, std::shared_ptr<lookup_call>> asked;  ///< lookups sent, by number
  /// The local actor the last message from the peer went to, and its id (a dead one is kept
  /// until replaced: a message to it is bounced as to any terminated actor).
  caf::actor_id last_receiver_id = 0;
  caf::strong_actor_ptr last_receiver;
  /// The proxy of the peer's actor that sent the last message, and its id.
  caf::actor_id last_sender_id = 0;
  caf::strong_actor_ptr last_sender;
  lend_table lends;                        ///< blobs this node lent to the peer (lending.hpp)
  std::shared_ptr<release_sink> releases;  ///< lends of the peer's let go of (made at the first)
};

}  // namespace comm::actors::detail
