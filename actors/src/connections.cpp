// Connections between nodes: listening, accepting, dialling, the hello exchange, lookups, and what
// happens when a connection fails or is closed. Progress thread only, except make_proxy.
//
// A connection becomes usable once both hellos are known: the server learns the client's from
// the connection request and answers with its own in the accept's private data. Nodes are peers
// by identity, not by address: a connection this node dialled that turns out to lead to a node it
// already dialled (the same node under another address, e.g. "localhost:P" and "127.0.0.1:P") is
// closed as soon as the server's hello names it, and its address and lookups go to the first.
// Two nodes that dial each other at the same time keep both connections (each side closing its
// own could close both); the first one established is the node's ("mapped") connection, which
// proxies use. Frames are accepted on either.
#include "node_state.hpp"
#include "remote_proxy.hpp"

#include <comm/log.hpp>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/make_actor.hpp>
#include <caf/sec.hpp>

#include <algorithm>

namespace comm::actors::detail {

namespace {

/// Token that names a peer's remote monitors on a local actor (see down_notifier).
constexpr size_t down_notifier_token = 0x636f6d6d;

/// Reports a local actor's termination to the peer that monitors it.
class down_notifier final : public caf::attachable {
public:
  down_notifier(node_state* node, std::weak_ptr<peer> to, caf::actor_id aid, const peer* key)
      : node_(node), to_(std::move(to)), aid_(aid), key_(key) {}

  void actor_exited(const caf::error& reason, caf::execution_unit*) override {
    node_->report_down(to_, aid_, reason);
  }

  bool matches(const token& what) override {
    return what.subtype == down_notifier_token && what.ptr == key_;
  }

private:
  node_state* node_;
  std::weak_ptr<peer> to_;
  caf::actor_id aid_;
  const peer* key_;
};

}  // namespace

// -- listening and accepting ---------------------------------------------------------------------

void node_state::open_listener() {
  if (params_.listen_address.empty()) return;
  comm::listener_params lp;
  lp.address = params_.listen_address;
  lp.on_request = &node_state::on_conn_request;
  lp.arg = this;
  auto made = worker_->listen(lp);
  const comm::status st = made.error();
  if (made) listener_ = std::move(*made);
  std::lock_guard<std::mutex> g(mtx_);
  if (st != comm::status::ok) {
    COMM_LOG(error, "actors", "cannot listen on %s: %s", params_.listen_address.c_str(),
             comm::to_string(st));
    listen_error_ = make_error(st);
    return;
  }
  address_ = listener_->address();
}

comm::endpoint_params node_state::endpoint_settings() {
  comm::endpoint_params ep;
  ep.private_data = hello_;
  ep.on_error = &node_state::on_ep_error;
  ep.error_arg = this;
  ep.on_connect = &node_state::on_ep_connect;
  ep.connect_arg = this;
  ep.timeout_ms = static_cast<int>(params_.connect_timeout.count());
  return ep;
}

void node_state::on_conn_request(void* arg, comm::conn_request* request) {
  static_cast<node_state*>(arg)->accept(request);
}

void node_state::accept(comm::conn_request* request) {
  comm::conn_request_attr attr;
  std::optional<node_hello> hello;
  if (listener_->query(request, &attr) == comm::status::ok) {
    hello = decode_hello(sys_, attr.private_data.data(), attr.private_data.size());
  }
  if (!hello || hello->id == sys_.node()) {
    COMM_LOG(warn, "actors", "connection request from %s is not from another node: rejected",
             attr.client_address.c_str());
    listener_->reject(request);
    return;
  }
  comm::endpoint* ep = nullptr;
  const comm::status st = worker_->accept(request, endpoint_settings(), &ep);
  if (st != comm::status::ok) {
    COMM_LOG(warn, "actors", "cannot accept %s: %s", attr.client_address.c_str(),
             comm::to_string(st));
    return;
  }
  auto p = std::make_shared<peer>(++serial_, std::string());
  p->ep = ep;
  by_ep_[ep] = p;
  peers_.add(1);
  introduce(p, *hello);
}

// -- dialling ------------------------------------------------------------------------------------

std::shared_ptr<peer> node_state::dial(const std::string& address, comm::status* failure) {
  comm::endpoint* ep = nullptr;
  const comm::status st = worker_->connect(address, endpoint_settings(), &ep);
  if (st != comm::status::ok) {
    *failure = st;
    return nullptr;
  }
  auto p = std::make_shared<peer>(++serial_, address);
  p->ep = ep;
  p->dialled = true;
  by_ep_[ep] = p;
  by_address_[address] = p;
  peers_.add(1);
  return p;
}

void node_state::on_ep_connect(void* arg, comm::endpoint* ep, const uint8_t* data, size_t length) {
  auto* self = static_cast<node_state*>(arg);
  auto p = self->peer_of(ep);
  if (!p || p->ready) return;  // the server's confirmation: its peer is ready since accept
  auto hello = decode_hello(self->sys_, data, length);
  if (!hello) {
    self->violation(p, "the server's hello is malformed");
    return;
  }
  if (hello->id == self->sys_.node()) {  // as accept refuses a client naming this node
    self->violation(p, "the server's hello names this node");
    return;
  }
  self->introduce(p, *hello);
}

void node_state::introduce(const std::shared_ptr<peer>& p, const node_hello& hello) {
  p->id = hello.id;
  if (p->dialled) {
    if (auto known = dialled_peer_of(hello.id, *p)) {
      fold(p, known);
      return;
    }
  }
  p->ready = true;
  if (!hello.address.empty() && !peer_at(hello.address)) {
    by_address_[hello.address] = p;
    p->addresses.push_back(hello.address);
  }
  {
    std::lock_guard<std::mutex> g(mtx_);
    auto [it, added] = by_node_.emplace(hello.id, p);
    p->mapped = added;
  }
  COMM_LOG(debug, "actors", "connection %llu to node %s (%s) established",
           static_cast<unsigned long long>(p->serial), caf::to_string(hello.id).c_str(),
           hello.address.c_str());
  auto waiting = std::move(p->waiting);
  for (auto& call : waiting) send_lookup(p, call);
}

std::shared_ptr<peer> node_state::dialled_peer_of(const caf::node_id& id,
                                                  const peer& other) const {
  for (const auto& [ep, p] : by_ep_) {
    if (p.get() != &other && p->dialled && p->ready && p->id == id &&
        p->alive.load(std::memory_order_relaxed)) {
      return p;
    }
  }
  return nullptr;
}

void node_state::fold(const std::shared_ptr<peer>& dup, const std::shared_ptr<peer>& known) {
  COMM_LOG(debug, "actors", "connection %llu leads to node %s of connection %llu: closed",
           static_cast<unsigned long long>(dup->serial), caf::to_string(known->id).c_str(),
           static_cast<unsigned long long>(known->serial));
  for (auto& address : dup->addresses) {
    by_address_[address] = known;
    if (std::find(known->addresses.begin(), known->addresses.end(), address) ==
        known->addresses.end()) {
      known->addresses.push_back(address);
    }
  }
  dup->addresses.clear();
  auto waiting = std::move(dup->waiting);
  dup->waiting.clear();
  fail_peer(dup, comm::status::not_connected);  // nothing used it yet
  for (auto& call : waiting) send_lookup(known, call);
}

std::shared_ptr<peer> node_state::peer_of(comm::endpoint* ep) const {
  auto it = by_ep_.find(ep);
  return it == by_ep_.end() ? nullptr : it->second;
}

std::shared_ptr<peer> node_state::peer_at(const std::string& address) const {
  auto it = by_address_.find(address);
  if (it == by_address_.end()) return nullptr;
  auto p = it->second.lock();
  return p && p->alive.load(std::memory_order_relaxed) ? p : nullptr;
}

// -- failure and teardown ------------------------------------------------------------------------

void node_state::on_ep_error(void* arg, comm::endpoint* ep, comm::status reason) {
  auto* self = static_cast<node_state*>(arg);
  if (auto p = self->peer_of(ep)) self->fail_peer(p, reason);
}

void node_state::fail_peer(const std::shared_ptr<peer>& p, comm::status reason) {
  if (!p->alive.exchange(false)) return;
  COMM_LOG(debug, "actors", "connection %llu to node %s ends: %s",
           static_cast<unsigned long long>(p->serial),
           p->id ? caf::to_string(p->id).c_str() : "?", comm::to_string(reason));
  const bool was_ready = p->ready;
  p->ready = false;
  forget(p);
  fail_lookups(*p, was_ready, reason);
  p->held.clear();
  p->held_bytes = 0;
  p->last_receiver = nullptr;
  p->last_sender = nullptr;
  fail_requests(*p);
  release_watched(*p);
  drop_lends(*p);
  unmap(p);
}

void node_state::forget(const std::shared_ptr<peer>& p) {
  if (rx_ep_ == p->ep) rx_ep_ = nullptr;
  by_ep_.erase(p->ep);
  // Closing tells the peer, also when an accepted client has not confirmed yet (libcomm sends
  // the close notice from the wireup phase).
  closing_.push_back(p->ep);
  peers_.sub(1);
  for (const auto& address : p->addresses) {
    auto it = by_address_.find(address);
    if (it != by_address_.end() && it->second.lock() == p) by_address_.erase(it);
  }
}

void node_state::fail_lookups(peer& p, bool was_ready, comm::status reason) {
  auto calls = std::move(p.waiting);
  for (auto& [n, call] : p.asked) calls.push_back(call);
  p.waiting.clear();
  p.asked.clear();
  for (auto& call : calls) {
    // A connection that worked and broke may be a node that restarted: dial once more.
    if (was_ready) {
      retry_lookup(call, reason);
    } else {
      call->complete(make_error(reason));
    }
  }
}

void node_state::unmap(const std::shared_ptr<peer>& p) {
  if (!p->mapped) return;
  p->mapped = false;
  std::shared_ptr<peer> successor;
  for (auto& [ep, other] : by_ep_) {
    if (other->ready && other->id == p->id) successor = other;
  }
  {
    std::lock_guard<std::mutex> g(mtx_);
    if (successor) {
      by_node_[p->id] = successor;
    } else {
      by_node_.erase(p->id);
    }
  }
  if (successor) successor->mapped = true;
  // Its proxies (which send through `p`) die: monitors get down_msg, links exit_msg.
  proxies_.erase(p->id);
}

void node_state::fail_requests(peer& p) {
  for (auto& [key, raw] : p.pending) {
    auto requester = sys_.registry().get(key.requester);
    if (!requester) continue;
    requester->enqueue(nullptr, caf::message_id{raw}.response_id(),
                       caf::make_message(caf::make_error(caf::sec::request_receiver_down)),
                       nullptr);
  }
  pending_gauge_.sub(p.pending.size());
  p.pending.clear();
}

void node_state::release_watched(peer& p) {
  const caf::attachable::token token{down_notifier_token, &p};
  for (caf::actor_id aid : p.watched) {
    if (auto ptr = sys_.registry().get(aid)) ptr->get()->detach(token);
  }
  watched_gauge_.sub(p.watched.size());
  p.watched.clear();
}

void node_state::close_endpoints() {
  if (closing_.empty()) return;
  auto closing = std::move(closing_);
  closing_.clear();
  for (comm::endpoint* ep : closing) comm::operation(ep->close()).detach();  // the worker ends it
}

void node_state::disconnect_now(const std::string& address,
                                const std::shared_ptr<lookup_call>& done) {
  auto p = peer_at(address);
  if (!p) {
    done->complete(make_error(comm::status::no_elem));
    return;
  }
  std::vector<std::shared_ptr<peer>> same_node;
  for (auto& [ep, other] : by_ep_) {
    if (other->ready && other->id == p->id) same_node.push_back(other);
  }
  fail_peer(p, comm::status::not_connected);
  for (auto& other : same_node) fail_peer(other, comm::status::not_connected);
  done->complete(caf::actor{});
}

// -- remote monitors -----------------------------------------------------------------------------

void node_state::on_monitor(const std::shared_ptr<peer>& p, caf::actor_id aid) {
  if (!p->watched.insert(aid).second) return;
  watched_gauge_.add(1);
  auto ptr = sys_.registry().get(aid);
  if (!ptr) {
    report_down(p, aid, caf::exit_reason::unknown);
    return;
  }
  // Runs at once when the actor is already gone.
  ptr->get()->attach(caf::attachable_ptr{new down_notifier(this, p, aid, p.get())});
}

// -- lookups -------------------------------------------------------------------------------------

void node_state::start_lookup(const std::shared_ptr<lookup_call>& call) {
  if (call->address == address()) {
    std::lock_guard<std::mutex> g(mtx_);
    auto it = names_.find(call->name);
    call->complete(it != names_.end()
                       ? checked(it->second.handle, it->second.ifs, *call)
                       : caf::expected<caf::actor>{make_error(comm::status::no_elem)});
    return;
  }
  auto p = peer_at(call->address);
  if (!p) {
    comm::status failure = comm::status::ok;
    p = dial(call->address, &failure);
    if (!p) {
      call->complete(make_error(failure));
      return;
    }
  }
  if (p->ready) {
    send_lookup(p, call);
  } else {
    p->waiting.push_back(call);
  }
}

void node_state::retry_lookup(const std::shared_ptr<lookup_call>& call, comm::status reason) {
  if (call->lost_connections++ == 0 && !stopping_.load()) {
    start_lookup(call);
  } else {
    call->complete(make_error(reason));
  }
}

void node_state::send_lookup(const std::shared_ptr<peer>& p,
                             const std::shared_ptr<lookup_call>& call) {
  outgoing* item = new_frame(p, frame_kind::lookup);
  item->header.message_id = ++lookups_;
  item->payload.assign(call->name.begin(), call->name.end());
  p->asked[item->header.message_id] = call;
  submit(item);
}

// -- proxies -------------------------------------------------------------------------------------

caf::strong_actor_ptr node_state::make_proxy(caf::node_id nid, caf::actor_id aid) {
  if (!nid || aid == caf::invalid_actor_id) return nullptr;
  std::shared_ptr<peer> p;
  {
    std::lock_guard<std::mutex> g(mtx_);
    auto it = by_node_.find(nid);
    if (it != by_node_.end()) p = it->second;
  }
  if (!p) {
    // A node this one has no connection to: the handle reads as invalid. Forget the registry's
    // empty entry for it later (not under the registry's lock).
    post_task([this, nid] {
      bool connected = false;
      {
        std::lock_guard<std::mutex> g(mtx_);
        connected = by_node_.count(nid) != 0;
      }
      if (!connected) proxies_.erase(nid);
    });
    return nullptr;
  }
  if (p->proxies.load(std::memory_order_relaxed) >= params_.max_proxies) {
    // Closing takes the registry's lock, held here: later, on the progress thread.
    post_task([this, p] {
      if (p->alive.load(std::memory_order_relaxed)) {
        violation(p, "more proxies of its actors than max_proxies");
      }
    });
    return nullptr;
  }
  caf::actor_config cfg;
  auto proxy = caf::make_actor<remote_proxy, caf::strong_actor_ptr>(aid, nid, &sys_, cfg, this, p);
  outgoing* item = new_frame(p, frame_kind::monitor);
  item->header.receiver = aid;
  post(item);
  return proxy;
}

void node_state::set_last_hop(caf::node_id*) {}

}  // namespace comm::actors::detail
