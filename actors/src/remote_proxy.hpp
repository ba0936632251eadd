// The proxy of an actor on another node: a caf::actor_proxy whose mailbox is the connection.
#pragma once

#include <caf/actor_proxy.hpp>

#include <atomic>
#include <memory>

namespace comm::actors::detail {

class node_state;
struct peer;

/// Stands for a remote actor (its control block carries the remote node id and actor id).
/// Messages enqueued to it are serialised and sent to its node; links to it are announced there.
/// After kill_proxy it bounces requests with its exit reason and drops other messages.
class remote_proxy final : public caf::actor_proxy {
public:
  /// A proxy reached through `link`, on behalf of `node`.
  remote_proxy(caf::actor_config& cfg, node_state* node, std::shared_ptr<peer> link);
  ~remote_proxy() override;

  /// Forwards `what` to the remote actor (any thread).
  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* ctx) override;

  /// Links `x` (a local actor) to the remote actor; the remote side learns it later.
  bool add_backlink(caf::abstract_actor* x) override;

  /// Removes that link.
  bool remove_backlink(caf::abstract_actor* x) override;

  /// Stops forwarding and tells monitors and links that the remote actor is gone.
  void kill_proxy(caf::execution_unit* ctx, caf::error reason) override;

  /// "comm_proxy".
  const char* name() const override;

private:
  /// Queues a link or unlink frame for `x` (called with actor locks held: sends nothing here).
  void announce_link(bool linked, caf::abstract_actor* x);

  node_state* node_;
  const std::shared_ptr<peer> link_;
  const std::shared_ptr<std::atomic<size_t>> count_;  ///< the node's count of live proxies
  std::atomic<bool> killed_{false};
};

}  // namespace comm::actors::detail
