// Client-server connections (comm/listener.hpp): listeners, connection requests, connect by socket
// address and accept, on top of a transport's connection manager.
//
// The connection manager carries a CmEndpointData each way: the sender's endpoint id, its packed
// worker address and the user's private data. With them each side creates its lane exactly as
// worker::connect does (self, then shm, then tcp, whichever reaches the peer first), so no wireup
// request is needed:
//   - the server's accept creates its endpoint with its lane at once, in the wireup phase (sends
//     wait), and answers; it becomes connected when the client confirms;
//   - the client's endpoint has no lane until the answer arrives; then it picks one, becomes
//     connected and confirms.
#include "worker_impl.hpp"

#include <comm/log.hpp>
#include <comm/transport/transport.hpp>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::worker_impl;

namespace detail {
class listener_impl;
}

/// A connection request handed to the user (ucp_conn_request): answered by worker::accept or
/// listener::reject.
class conn_request {
public:
  detail::listener_impl* owner = nullptr;  ///< the listener it arrived on (null once it is gone)
  std::unique_ptr<tl::cm_conn> conn;       ///< the handshake, paused until answered
  conn_request_attr attr;                  ///< what the client said
  uint32_t client_ep = 0;                  ///< the client's endpoint id
  std::vector<uint8_t> client_address;     ///< the client's packed worker address
};

namespace detail {
namespace {

/// The decoded private data of a handshake message.
struct endpoint_data {
  uint32_t src_ep = 0;
  std::vector<uint8_t> address;
  std::vector<uint8_t> user;
};

std::vector<uint8_t> encode_endpoint_data(uint32_t src_ep, const std::vector<uint8_t>& address,
                                          const std::vector<uint8_t>& user) {
  capnp::MallocMessageBuilder message;
  auto data = message.initRoot<wire::schema::CmEndpointData>();
  data.setSrcEp(src_ep);
  data.setAddress(kj::arrayPtr(address.data(), address.size()));
  data.setUser(kj::arrayPtr(user.data(), user.size()));
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

bool decode_endpoint_data(const uint8_t* data, size_t length, endpoint_data* out) {
  const bool valid = wire::read_checked_message<wire::schema::CmEndpointData>(
      data, length, [&](wire::schema::CmEndpointData::Reader root) {
        out->src_ep = root.getSrcEp();
        auto address = root.getAddress();
        auto user = root.getUser();
        out->address.assign(address.begin(), address.end());
        out->user.assign(user.begin(), user.end());
      });
  return valid && out->src_ep != 0;
}

/// Gives `ep` the callbacks of `params`.
void apply_callbacks(endpoint_impl* ep, const endpoint_params& params) {
  ep->error_cb = params.on_error;
  ep->error_arg = params.error_arg;
  ep->on_connect = params.on_connect;
  ep->connect_arg = params.connect_arg;
}

/// Ties `ep` to the handshake `conn` the connection manager runs for it, and polls soon.
void bind_handshake(worker_impl& w, endpoint_impl* ep, tl::cm_conn* conn) {
  conn->user_data = ep;
  ep->cm_conn = conn;
  w.cm_skip = 0;
}

/// epoll data of the connection manager's fd in the worker's event set.
constexpr uint64_t cm_event_tag = ~uint64_t{0};

}  // namespace

/// A listener (see comm/listener.hpp).
class listener_impl final : public listener {
public:
  listener_impl(worker_impl& w, const listener_params& params,
                std::unique_ptr<tl::cm_listener> socket)
      : w_(&w), params_(params), socket_(std::move(socket)) {
    socket_->user_data = this;
  }

  ~listener_impl() override {
    if (w_ != nullptr) {
      worker_impl::guard g(*w_);
      detach();
    }
  }

  std::string address() const override { return address_; }
  uint16_t port() const override { return port_; }
  uint64_t requests() const override { return requests_; }

  status reject(conn_request* request) override {
    if (!forget(request)) return status::invalid_param;
    COMM_LOG(debug, "listener", "rejected %s", request->attr.client_address.c_str());
    request->conn->reject();
    delete request;
    return status::ok;
  }

  status query(const conn_request* request, conn_request_attr* out) const override {
    if (request == nullptr || out == nullptr || request->owner != this) {
      return status::invalid_param;
    }
    *out = request->attr;
    return status::ok;
  }

  /// Takes a new request and tells the user (or rejects it without a handler).
  void deliver(std::unique_ptr<conn_request> request) {
    request->owner = this;
    ++requests_;
    conn_request* raw = request.release();
    {
      std::lock_guard<std::mutex> g(lock_);
      pending_.push_back(raw);
    }
    if (w_ != nullptr) w_->note_events(~0u);  // a connection request ends any wait
    if (params_.on_request != nullptr) {
      params_.on_request(params_.arg, raw);
    } else if (params_.on_accept != nullptr && w_ != nullptr) {
      accept_itself(raw);
    } else {
      reject(raw);
    }
  }

  /// Accepts `request` on the listener's worker and tells on_accept the new endpoint (worker's
  /// accept rejects the request when it fails).
  void accept_itself(conn_request* request) {
    endpoint* ep = nullptr;
    const status st = static_cast<worker&>(*w_).accept(request, params_.accept_params, &ep);
    if (st != status::ok) {
      COMM_LOG(warn, "listener", "%s: accepting a connection request failed: %s",
               w_->params.name.c_str(), to_string(st));
      return;
    }
    params_.on_accept(params_.accept_arg, ep);
  }

  /// Removes `request` from the unanswered ones; false if it is not one of them.
  bool forget(conn_request* request) {
    std::lock_guard<std::mutex> g(lock_);
    auto it = std::find(pending_.begin(), pending_.end(), request);
    if (it == pending_.end()) return false;
    pending_.erase(it);
    request->owner = nullptr;
    return true;
  }

  /// Rejects unanswered requests and closes the socket (listener or worker going away).
  void detach() {
    std::vector<conn_request*> left;
    {
      std::lock_guard<std::mutex> g(lock_);
      left.swap(pending_);
    }
    for (conn_request* r : left) delete r;  // an unanswered cm_conn rejects as it goes
    socket_.reset();
    if (w_ != nullptr) {
      auto& all = w_->listeners;
      all.erase(std::remove(all.begin(), all.end(), static_cast<listener*>(this)), all.end());
    }
    w_ = nullptr;
  }

  /// Records the bound address (kept after the socket closes).
  void remember_address() {
    address_ = socket_->address();
    port_ = socket_->port();
  }

private:
  worker_impl* w_;
  listener_params params_;
  std::unique_ptr<tl::cm_listener> socket_;
  std::mutex lock_;
  std::vector<conn_request*> pending_;
  std::string address_;
  uint16_t port_ = 0;
  uint64_t requests_ = 0;
};

namespace {

/// Turns connection manager events into listener requests and endpoint state changes.
class cm_bridge final : public tl::cm_handler {
public:
  explicit cm_bridge(worker_impl& w) : w_(w) {}

  void on_request(tl::cm_listener* from, std::unique_ptr<tl::cm_conn> conn, const uint8_t* data,
                  size_t length) override {
    auto* l = static_cast<listener_impl*>(from->user_data);
    endpoint_data decoded;
    worker_address_attr client;
    if (!decode_endpoint_data(data, length, &decoded) ||
        worker::query_address(decoded.address.data(), decoded.address.size(), &client) !=
            status::ok) {
      COMM_LOG(warn, "listener", "%s: malformed connection request from %s: rejected",
               w_.params.name.c_str(), conn->peer_address().c_str());
      conn->reject();
      return;
    }
    auto request = std::make_unique<conn_request>();
    request->attr.client_address = conn->peer_address();
    request->attr.client_id = client.client_id;
    request->attr.client_name = client.name;
    request->attr.private_data = std::move(decoded.user);
    request->client_ep = decoded.src_ep;
    request->client_address = std::move(decoded.address);
    request->conn = std::move(conn);
    l->deliver(std::move(request));
  }

  void on_established(tl::cm_conn* conn, const uint8_t* data, size_t length) override {
    auto* ep = static_cast<endpoint_impl*>(conn->user_data);
    ep->cm_conn = nullptr;
    if (ep->state != endpoint_impl::phase::wireup) return;
    if (ep->lane) {
      connected(ep, nullptr, 0);  // server: the client confirmed
      return;
    }
    endpoint_data decoded;
    if (!decode_endpoint_data(data, length, &decoded)) {
      w_.protocol_error(ep, "malformed connection reply");
      return;
    }
    const status st = w_.connect_lane(ep, decoded.address.data(), decoded.address.size());
    if (st != status::ok) {
      ep->fail(st);
      return;
    }
    ep->remote_id = decoded.src_ep;
    connected(ep, decoded.user.data(), decoded.user.size());
  }

  void on_failed(tl::cm_conn* conn, status reason) override {
    auto* ep = static_cast<endpoint_impl*>(conn->user_data);
    ep->cm_conn = nullptr;
    ep->fail(reason);
  }

private:
  static void connected(endpoint_impl* ep, const uint8_t* data, size_t length) {
    ep->state = endpoint_impl::phase::connected;
    if (!ep->dispatch_pending()) ep->wait_for_resources();
    if (ep->on_connect != nullptr && ep->state == endpoint_impl::phase::connected) {
      ep->on_connect(ep->connect_arg, ep, data, length);
    }
  }

  worker_impl& w_;
};

}  // namespace

status worker_impl::open_cm() {
  if (cm) return status::ok;
  if (!cm_events) cm_events = std::make_unique<cm_bridge>(*this);
  tl::cm_params p;
  p.opts = ctx.cfg().transport_options;
  p.auth_key = ctx.cfg().auth_key;
  p.handler = cm_events.get();
  for (tl::component* component : tl::all_components()) {
    std::unique_ptr<tl::cm> made;
    if (component->open_cm(p, made) != status::ok) continue;
    cm = std::move(made);
    if (epoll_fd >= 0) watch(cm->event_fd(), cm_event_tag);
    return status::ok;
  }
  return status::unsupported;
}

unsigned worker_impl::poll_cm() {
  // Polled less often while idle: its progress is a system call, and a listener that waits for
  // clients must not tax the shared-memory path. Listening or connecting resets the backoff.
  const unsigned n = cm->active() ? cm->progress() : 0;
  cm_backoff = n != 0 ? 0 : static_cast<uint8_t>(std::min(2 * cm_backoff + 1, 255));
  cm_skip = cm_backoff;
  return n;
}

void worker_impl::close_cm() {
  while (!listeners.empty()) static_cast<listener_impl*>(listeners.back())->detach();
  if (cm) unwatch(cm->event_fd());
  cm.reset();
}

bool is_cm_event(uint64_t tag) { return tag == cm_event_tag; }

}  // namespace detail

// -- public API ----------------------------------------------------------------------------------

status worker::listen(const listener_params& params, std::unique_ptr<listener>* out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (out == nullptr) return status::invalid_param;
  if (params.accept_params.private_data.size() > max_private_data) return status::exceeds_limit;
  status st = w.open_cm();
  if (st != status::ok) return st;
  std::unique_ptr<tl::cm_listener> socket;
  st = w.cm->listen(params.address, params.backlog, socket);
  if (st != status::ok) return st;
  auto made = std::make_unique<detail::listener_impl>(w, params, std::move(socket));
  made->remember_address();
  w.listeners.push_back(made.get());
  w.cm_skip = 0;
  *out = std::move(made);
  return status::ok;
}

status worker::connect(const std::string& address, const endpoint_params& params,
                       endpoint** out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (out == nullptr) return status::invalid_param;
  if (params.private_data.size() > max_private_data) return status::exceeds_limit;
  status st = w.open_cm();
  if (st != status::ok) return st;
  endpoint_impl* ep = nullptr;
  st = w.new_ep(false, &ep);
  if (st != status::ok) return st;
  detail::apply_callbacks(ep, params);
  ep->peer_name_ = address;
  const auto data = detail::encode_endpoint_data(ep->id, w.packed_address(), params.private_data);
  tl::cm_conn* conn = nullptr;
  st = w.cm->connect(address, data.data(), data.size(), params.timeout_ms, &conn);
  if (st != status::ok) {
    w.destroy_ep(ep);
    return st;
  }
  detail::bind_handshake(w, ep, conn);
  *out = ep;
  return status::ok;
}

status worker::accept(conn_request* request, const endpoint_params& params, endpoint** out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (request == nullptr || out == nullptr || !request->conn) return status::invalid_param;
  if (params.private_data.size() > max_private_data) return status::exceeds_limit;
  if (request->owner == nullptr || !request->owner->forget(request)) return status::invalid_param;
  std::unique_ptr<conn_request> owned(request);
  status st = w.open_cm();
  endpoint_impl* ep = nullptr;
  if (st == status::ok) {
    st = w.create_ep(owned->client_address.data(), owned->client_address.size(), false, &ep);
  }
  if (st != status::ok) {
    owned->conn->reject(st);  // the client's endpoint fails with the same status (unreachable)
    return st;
  }
  ep->remote_id = owned->client_ep;
  detail::apply_callbacks(ep, params);
  const auto data = detail::encode_endpoint_data(ep->id, w.packed_address(), params.private_data);
  tl::cm_conn* conn = nullptr;
  st = w.cm->accept(std::move(owned->conn), data.data(), data.size(), params.timeout_ms, &conn);
  if (st != status::ok) {
    w.destroy_ep(ep);
    return st;
  }
  detail::bind_handshake(w, ep, conn);
  *out = ep;
  return status::ok;
}

}  // namespace comm
