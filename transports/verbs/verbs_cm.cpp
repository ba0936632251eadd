#include "verbs/verbs_cm.hpp"

#include "verbs/verbs_device.hpp"

#include <comm/log.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace comm::verbs {
namespace {

constexpr const char* log_name = "verbs_cm";
using clock_type = std::chrono::steady_clock;
constexpr clock_type::time_point never = clock_type::time_point::max();

/// Precedes the private data: rdmacm delivers the whole (zero padded) field, so the data says
/// how long it is.
struct [[gnu::packed]] data_header {
  uint16_t magic = 0;   ///< cm_data_magic
  uint8_t length = 0;   ///< bytes of private data after the header
  uint8_t reserved = 0; ///< zero
};
static_assert(sizeof(data_header) + max_cm_connect_data == 56);
static_assert(sizeof(data_header) + max_cm_accept_data == 196);

/// "vc"
constexpr uint16_t cm_data_magic = 0x6376;
/// rdmacm's REJECTED status when nobody listens (IB_CM_REJ_INVALID_SERVICE_ID).
constexpr int reject_no_listener = 8;
/// How long route resolution may take.
constexpr int route_timeout_ms = 2000;

/// Header + data, ready to go into rdma_conn_param.
std::vector<uint8_t> wrap(const uint8_t* data, size_t length) {
  data_header h;
  h.magic = cm_data_magic;
  h.length = static_cast<uint8_t>(length);
  std::vector<uint8_t> out(sizeof(h) + length);
  std::memcpy(out.data(), &h, sizeof(h));
  if (length != 0) std::memcpy(out.data() + sizeof(h), data, length);
  return out;
}

/// The data behind a header in `field` (`size` bytes, as rdmacm delivered them); false when the
/// field does not hold a valid header and length.
bool unwrap(const void* field, size_t size, const uint8_t** data, size_t* length) {
  data_header h;
  if (field == nullptr || size < sizeof(h)) return false;
  std::memcpy(&h, field, sizeof(h));
  if (h.magic != cm_data_magic || h.reserved != 0 || sizeof(h) + h.length > size) return false;
  *data = static_cast<const uint8_t*>(field) + sizeof(h);
  *length = h.length;
  return true;
}

/// The port of a socket address, network order.
uint16_t& port_field(sockaddr_storage& address) {
  if (address.ss_family == AF_INET6) return reinterpret_cast<sockaddr_in6&>(address).sin6_port;
  return reinterpret_cast<sockaddr_in&>(address).sin_port;
}

class rdmacm_cm;

/// Where a connection is.
enum class phase : uint8_t {
  resolving,  ///< client: address and route being resolved
  resolved,   ///< flow client: resolved, waiting for cm_conn::connect
  connecting, ///< client: connect sent / server: request handed over or accepted
  connected,  ///< flow: established (client: the server answered; server: the client notified)
  done,       ///< over: no more callbacks
};

/// One connection of the rdmacm connection manager.
class rdmacm_conn final : public tl::cm_conn {
public:
  rdmacm_conn(rdmacm_cm* owner, rdma_cm_id* id, bool server)
      : owner(owner), id(id), server(server) {}
  ~rdmacm_conn() override;
  std::string peer_address() const override { return peer; }
  /// Refuses the request; rdmacm carries no reason, so the client sees rejected whatever it is.
  void reject(status reason) override;
  std::string device_name() const override;
  status connect(const tl::cm_private_data& data) override;
  status notify() override;
  status disconnect() override;

  rdmacm_cm* owner;             ///< null once its connection manager is gone
  rdma_cm_id* id;               ///< null once destroyed
  bool server;                  ///< the server's side of a connection
  bool handed_over = false;     ///< owned by the handler (a request not yet accepted)
  bool answered = false;        ///< accepted or rejected
  bool gone = false;            ///< the client went away before the answer
  phase at = phase::resolving;
  std::vector<uint8_t> request; ///< short client: header + data to send once the route resolved
  std::string peer;             ///< "ip:port"
  clock_type::time_point deadline = never;

  // -- flow --
  tl::cm_flow_handler* flow = nullptr;  ///< null for a short handshake
  int timeout_ms = 0;                   ///< flow client: for the server's answer
  bool notified = false;                ///< notify() established the connection
  bool local_disc = false;              ///< disconnect() was called
  bool disconnected = false;            ///< rdmacm said DISCONNECTED (the handler was told)
  bool closed = false;                  ///< its owner closed it
};

class rdmacm_listener final : public tl::cm_listener {
public:
  rdmacm_listener(rdmacm_cm& owner, rdma_cm_id* id, sockaddr_storage bound)
      : owner_(owner), id_(id), bound_(bound) {}
  ~rdmacm_listener() override;
  std::string address() const override { return to_string(bound_); }
  uint16_t port() const override { return ntohs(port_field(bound_)); }
  uint64_t requests() const override { return requests_; }
  /// One more request handed over.
  void count_request() { ++requests_; }

private:
  rdmacm_cm& owner_;
  rdma_cm_id* id_;
  mutable sockaddr_storage bound_;
  uint64_t requests_ = 0;
};

class rdmacm_cm final : public tl::cm {
public:
  rdmacm_cm(const api& table, const tl::cm_params& params) : t_(table), params_(params) {}
  ~rdmacm_cm() override;

  /// ok, or why it could not open.
  status open();

  int event_fd() const override { return epoll_fd_; }
  unsigned progress() override;
  bool active() const override { return listeners_ != 0 || !conns_.empty(); }
  tl::cm_attr query() const override { return {max_cm_connect_data, max_cm_accept_data}; }
  status listen(const std::string& address, int backlog,
                std::unique_ptr<tl::cm_listener>& out) override;
  status connect(const std::string& address, const uint8_t* data, size_t length, int timeout_ms,
                 tl::cm_conn** out) override;
  status accept(std::unique_ptr<tl::cm_conn> conn, const uint8_t* data, size_t length,
                int timeout_ms, tl::cm_conn** out) override;
  status resolve(const tl::cm_client_params& params, tl::cm_conn** out) override;
  status accept_flow(std::unique_ptr<tl::cm_conn> conn, const tl::cm_server_params& params,
                     tl::cm_conn** out) override;
  void close(tl::cm_conn* conn) override;

  // -- for connections and listeners --

  const api& table() const { return t_; }
  /// A connection is being destroyed by whoever holds it.
  void forget(rdmacm_conn& c) { conns_.erase(c.id); }
  /// A listener is being destroyed.
  void listener_closed(rdma_cm_id* id) {
    listeners_by_id_.erase(id);
    --listeners_;
  }
  /// Flow client `c` connects with `data` (cm_conn::connect).
  status flow_connect(rdmacm_conn& c, const tl::cm_private_data& data);
  /// Flow client `c` notifies the server: rdma_establish (cm_conn::notify).
  status flow_notify(rdmacm_conn& c);
  /// Flow `c` disconnects: rdma_disconnect (cm_conn::disconnect).
  status flow_disconnect(rdmacm_conn& c);

private:
  status start_client(const std::string& address, int timeout_ms, rdmacm_conn** out);
  status send_accept(rdmacm_conn& c, const std::vector<uint8_t>& reply, int timeout_ms);
  status private_data_of(rdmacm_conn& c, const tl::cm_private_data& data, size_t limit,
                         std::vector<uint8_t>* out);
  void handle(const rdma_cm_event& event, const void* data, size_t size);
  void handle_request(const rdma_cm_event& event, const void* data, size_t size);
  void handle_client(rdmacm_conn& c, const rdma_cm_event& event, const void* data, size_t size);
  void handle_server(rdmacm_conn& c, const rdma_cm_event& event);
  void route_resolved(rdmacm_conn& c);
  void answered(rdmacm_conn& c, const void* data, size_t size);
  void established(rdmacm_conn& c, const uint8_t* data, size_t length);
  void disconnected(rdmacm_conn& c);
  void failed(rdmacm_conn& c, status reason);
  void finish(rdmacm_conn& c);
  void expire();
  void arm_timer();
  rdmacm_conn* find(rdma_cm_id* id) {
    const auto found = conns_.find(id);
    return found != conns_.end() ? found->second : nullptr;
  }

  const api& t_;
  tl::cm_params params_;
  rdma_event_channel* channel_ = nullptr;
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  size_t listeners_ = 0;
  std::unordered_map<rdma_cm_id*, rdmacm_listener*> listeners_by_id_;
  std::unordered_map<rdma_cm_id*, rdmacm_conn*> conns_;  // every live connection
  std::vector<std::unique_ptr<rdmacm_conn>> owned_;      // the ones the cm holds
  std::vector<std::unique_ptr<rdmacm_conn>> finished_;   // released after progress()
};

// -- connections and listeners --

rdmacm_conn::~rdmacm_conn() {
  if (owner == nullptr || id == nullptr) return;
  if (server && !answered && !gone) owner->table().reject(id, nullptr, 0);
  owner->forget(*this);
  owner->table().destroy_id(id);
}

void rdmacm_conn::reject(status /*reason*/) {
  if (owner == nullptr || id == nullptr || !server || answered) return;
  answered = true;
  if (!gone) owner->table().reject(id, nullptr, 0);
}

std::string rdmacm_conn::device_name() const {
  if (owner == nullptr || id == nullptr || id->verbs == nullptr || id->verbs->device == nullptr) {
    return {};
  }
  const char* name = owner->table().get_device_name(id->verbs->device);
  if (name == nullptr) return {};
  return port_info{name, id->port_num}.name();
}

status rdmacm_conn::connect(const tl::cm_private_data& data) {
  if (server || flow == nullptr || owner == nullptr) return status::invalid_param;
  return owner->flow_connect(*this, data);
}

status rdmacm_conn::notify() {
  if (server || flow == nullptr || owner == nullptr) return status::invalid_param;
  return owner->flow_notify(*this);
}

status rdmacm_conn::disconnect() {
  if (flow == nullptr || owner == nullptr) return status::invalid_param;
  return owner->flow_disconnect(*this);
}

rdmacm_listener::~rdmacm_listener() {
  owner_.listener_closed(id_);
  owner_.table().destroy_id(id_);
}

// -- the connection manager --

rdmacm_cm::~rdmacm_cm() {
  for (auto& [id, c] : conns_) {
    t_.destroy_id(id);
    c->id = nullptr;
    c->owner = nullptr;
  }
  owned_.clear();
  finished_.clear();
  if (channel_ != nullptr) t_.destroy_event_channel(channel_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (timer_fd_ >= 0) ::close(timer_fd_);
}

status rdmacm_cm::open() {
  if (!params_.auth_key.empty()) {
    COMM_LOG(error, log_name, "an auth key needs more private data than rdmacm carries");
    return status::unsupported;
  }
  if (params_.handler == nullptr) return status::invalid_param;
  channel_ = t_.create_event_channel();
  if (channel_ == nullptr) {
    COMM_LOG(error, log_name, "rdma_create_event_channel: %s", std::strerror(errno));
    return status::io_error;
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  const int flags = ::fcntl(channel_->fd, F_GETFL);
  if (epoll_fd_ < 0 || timer_fd_ < 0 || flags < 0 ||
      ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return status::io_error;
  }
  for (int fd : {channel_->fd, timer_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return status::io_error;
  }
  return status::ok;
}

status rdmacm_cm::listen(const std::string& address, int backlog,
                         std::unique_ptr<tl::cm_listener>& out) {
  sockaddr_storage bound{};
  if (!parse_address(address, &bound)) return status::invalid_addr;
  rdma_cm_id* id = nullptr;
  if (t_.create_id(channel_, &id, nullptr, RDMA_PS_TCP) != 0) return status::io_error;
  if (t_.bind_addr(id, reinterpret_cast<sockaddr*>(&bound)) != 0 ||
      t_.listen(id, std::max(0, backlog)) != 0) {  // 0: rdma_listen's (the kernel's) maximum
    const int error = errno;
    t_.destroy_id(id);
    COMM_LOG(warn, log_name, "listen on %s: %s", address.c_str(), std::strerror(error));
    return error == EADDRINUSE ? status::busy : status::invalid_addr;
  }
  port_field(bound) = t_.get_src_port(id);
  auto listener = std::make_unique<rdmacm_listener>(*this, id, bound);
  listeners_by_id_[id] = listener.get();
  ++listeners_;
  out = std::move(listener);
  return status::ok;
}

status rdmacm_cm::start_client(const std::string& address, int timeout_ms, rdmacm_conn** out) {
  sockaddr_storage target{};
  if (!parse_address(address, &target)) return status::invalid_addr;
  rdma_cm_id* id = nullptr;
  if (t_.create_id(channel_, &id, nullptr, RDMA_PS_TCP) != 0) return status::io_error;
  if (t_.resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&target), timeout_ms) != 0) {
    t_.destroy_id(id);
    return status::unreachable;
  }
  auto c = std::make_unique<rdmacm_conn>(this, id, false);
  c->peer = address;
  c->deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  conns_[id] = c.get();
  *out = c.get();
  owned_.push_back(std::move(c));
  arm_timer();
  return status::ok;
}

status rdmacm_cm::connect(const std::string& address, const uint8_t* data, size_t length,
                          int timeout_ms, tl::cm_conn** out) {
  if (length > max_cm_connect_data) return status::exceeds_limit;
  if (out == nullptr || (data == nullptr && length != 0)) return status::invalid_param;
  rdmacm_conn* c = nullptr;
  const status st = start_client(address, timeout_ms, &c);
  if (st != status::ok) return st;
  c->request = wrap(data, length);
  *out = c;
  return status::ok;
}

status rdmacm_cm::resolve(const tl::cm_client_params& params, tl::cm_conn** out) {
  if (params.handler == nullptr || out == nullptr) return status::invalid_param;
  rdmacm_conn* c = nullptr;
  const status st = start_client(params.address, params.timeout_ms, &c);
  if (st != status::ok) return st;
  c->flow = params.handler;
  c->timeout_ms = params.timeout_ms;
  *out = c;
  return status::ok;
}

status rdmacm_cm::send_accept(rdmacm_conn& c, const std::vector<uint8_t>& reply, int timeout_ms) {
  rdma_conn_param param{};
  param.private_data = reply.data();
  param.private_data_len = static_cast<uint8_t>(reply.size());
  param.qp_num = 1;
  if (t_.accept(c.id, &param) != 0) {
    COMM_LOG(warn, log_name, "rdma_accept: %s", std::strerror(errno));
    return status::connection_reset;
  }
  c.answered = true;
  c.handed_over = false;
  c.deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  return status::ok;
}

status rdmacm_cm::accept(std::unique_ptr<tl::cm_conn> conn, const uint8_t* data, size_t length,
                         int timeout_ms, tl::cm_conn** out) {
  auto* c = dynamic_cast<rdmacm_conn*>(conn.get());
  if (c == nullptr || c->owner != this || !c->server || c->answered) return status::invalid_param;
  if (length > max_cm_accept_data) return status::exceeds_limit;
  if (c->gone) return status::connection_reset;
  const status st = send_accept(*c, wrap(data, length), timeout_ms);
  if (st != status::ok) return st;
  conn.release();
  owned_.emplace_back(c);
  if (out != nullptr) *out = c;
  arm_timer();
  return status::ok;
}

status rdmacm_cm::private_data_of(rdmacm_conn& c, const tl::cm_private_data& data, size_t limit,
                                  std::vector<uint8_t>* out) {
  if (!data.pack) {
    if (data.length > limit) return status::exceeds_limit;
    if (data.length != 0 && data.data == nullptr) return status::invalid_param;
    *out = wrap(data.data, data.length);
    return status::ok;
  }
  std::vector<uint8_t> packed(limit);
  const ssize_t written = c.flow->pack_private_data(&c, c.device_name(), packed.data(), limit);
  if (written < 0) {
    const auto refusal = static_cast<status>(written);
    return is_error(refusal) ? refusal : status::invalid_param;
  }
  if (static_cast<size_t>(written) > limit) return status::exceeds_limit;
  *out = wrap(packed.data(), static_cast<size_t>(written));
  return status::ok;
}

status rdmacm_cm::accept_flow(std::unique_ptr<tl::cm_conn> conn, const tl::cm_server_params& params,
                              tl::cm_conn** out) {
  auto* c = dynamic_cast<rdmacm_conn*>(conn.get());
  if (c == nullptr || c->owner != this || !c->server || c->answered ||
      params.handler == nullptr || out == nullptr) {
    return status::invalid_param;
  }
  if (c->gone) return status::connection_reset;
  c->flow = params.handler;
  std::vector<uint8_t> reply;
  const status packed = private_data_of(*c, params.reply, max_cm_accept_data, &reply);
  if (packed != status::ok) {
    if (params.reply.pack) c->reject(status::rejected);  // the pack callback said no
    return packed;
  }
  const status st = send_accept(*c, reply, params.timeout_ms);
  if (st != status::ok) return st;
  c->at = phase::connecting;
  conn.release();
  owned_.emplace_back(c);
  *out = c;
  arm_timer();
  return status::ok;
}

status rdmacm_cm::flow_connect(rdmacm_conn& c, const tl::cm_private_data& data) {
  if (c.at == phase::resolving) return status::busy;
  if (c.at != phase::resolved) {
    return c.at == phase::done ? status::not_connected : status::invalid_param;
  }
  std::vector<uint8_t> request;
  const status packed = private_data_of(c, data, max_cm_connect_data, &request);
  if (packed != status::ok) {
    if (data.pack) c.at = phase::done;  // the pack callback refused: the connection is over
    return packed;
  }
  rdma_conn_param param{};
  param.private_data = request.data();
  param.private_data_len = static_cast<uint8_t>(request.size());
  param.qp_num = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (t_.connect(c.id, &param) != 0) {
    c.at = phase::done;
    return status::unreachable;
  }
  c.at = phase::connecting;
  c.deadline = clock_type::now() + std::chrono::milliseconds(c.timeout_ms);
  arm_timer();
  return status::ok;
}

status rdmacm_cm::flow_notify(rdmacm_conn& c) {
  if (c.at != phase::connected) return c.at == phase::done ? status::not_connected : status::busy;
  if (c.local_disc || c.disconnected) return status::not_connected;
  if (c.notified) return status::ok;
  if (t_.establish(c.id) != 0) {
    COMM_LOG(warn, log_name, "rdma_establish: %s", std::strerror(errno));
    return status::connection_reset;
  }
  c.notified = true;
  return status::ok;
}

status rdmacm_cm::flow_disconnect(rdmacm_conn& c) {
  const bool was_connected = c.at == phase::connected || c.disconnected;
  if (!was_connected) return c.at == phase::done ? status::not_connected : status::busy;
  if (c.local_disc) return status::not_connected;
  c.local_disc = true;
  if (c.id != nullptr) t_.disconnect(c.id);
  return c.disconnected ? status::ok : status::in_progress;
}

void rdmacm_cm::close(tl::cm_conn* conn) {
  auto* c = static_cast<rdmacm_conn*>(conn);
  if (c == nullptr || c->closed) return;
  c->closed = true;
  c->at = phase::done;
  finish(*c);
}

void rdmacm_cm::finish(rdmacm_conn& c) {
  if (c.flow != nullptr && !c.closed) return;  // a flow connection stays until close()
  const auto mine = std::find_if(owned_.begin(), owned_.end(), [&](const auto& p) {
    return p.get() == &c;
  });
  if (mine == owned_.end()) return;
  finished_.push_back(std::move(*mine));
  owned_.erase(mine);
}

unsigned rdmacm_cm::progress() {
  unsigned n = 0;
  rdma_cm_event* event = nullptr;
  while (t_.get_cm_event(channel_, &event) == 0) {
    const rdma_cm_event copy = *event;
    uint8_t data[256] = {};
    size_t size = 0;
    if (event->param.conn.private_data != nullptr) {
      size = std::min<size_t>(event->param.conn.private_data_len, sizeof(data));
      std::memcpy(data, event->param.conn.private_data, size);
    }
    t_.ack_cm_event(event);
    handle(copy, data, size);
    ++n;
  }
  expire();
  for (auto& c : finished_) {
    if (c->id != nullptr && !c->server && c->flow == nullptr) t_.disconnect(c->id);
  }
  finished_.clear();
  arm_timer();
  return n;
}

void rdmacm_cm::handle(const rdma_cm_event& event, const void* data, size_t size) {
  if (event.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
    handle_request(event, data, size);
    return;
  }
  rdmacm_conn* c = find(event.id);
  if (c == nullptr || c->closed) return;
  if (event.event == RDMA_CM_EVENT_DISCONNECTED && c->flow != nullptr &&
      c->at == phase::connected) {
    disconnected(*c);
    return;
  }
  if (c->at == phase::done) return;
  if (c->server) {
    handle_server(*c, event);
  } else {
    handle_client(*c, event, data, size);
  }
}

void rdmacm_cm::handle_request(const rdma_cm_event& event, const void* data, size_t size) {
  const auto listener = listeners_by_id_.find(event.listen_id);
  const uint8_t* payload = nullptr;
  size_t length = 0;
  if (listener == listeners_by_id_.end() || !unwrap(data, size, &payload, &length)) {
    COMM_LOG(warn, log_name, "connection request without valid private data refused");
    t_.reject(event.id, nullptr, 0);
    t_.destroy_id(event.id);
    return;
  }
  auto c = std::make_unique<rdmacm_conn>(this, event.id, true);
  sockaddr_storage peer{};
  std::memcpy(&peer, &event.id->route.addr.dst_storage, sizeof(peer));
  c->peer = to_string(peer);
  c->handed_over = true;
  c->at = phase::connecting;
  conns_[event.id] = c.get();
  listener->second->count_request();
  params_.handler->on_request(listener->second, std::move(c), payload, length);
}

void rdmacm_cm::route_resolved(rdmacm_conn& c) {
  if (c.flow == nullptr) {
    rdma_conn_param param{};
    param.private_data = c.request.data();
    param.private_data_len = static_cast<uint8_t>(c.request.size());
    param.qp_num = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    c.at = phase::connecting;
    if (t_.connect(c.id, &param) != 0) failed(c, status::unreachable);
    return;
  }
  c.at = phase::resolved;
  c.deadline = never;
  const status st = c.flow->on_resolved(&c, c.device_name(), status::ok);
  if (is_error(st) && c.at != phase::done) c.at = phase::done;  // over: nothing more is told
}

void rdmacm_cm::answered(rdmacm_conn& c, const void* data, size_t size) {
  const uint8_t* payload = nullptr;
  size_t length = 0;
  if (!unwrap(data, size, &payload, &length)) {
    COMM_LOG(warn, log_name, "%s answered without valid private data", c.peer.c_str());
    failed(c, status::protocol_error);
    return;
  }
  if (c.flow != nullptr) {
    // The flow's client is connected; it notifies the server itself (rdma_establish).
    c.at = phase::connected;
    c.deadline = never;
    c.flow->on_connect(&c, status::ok, payload, length);
    return;
  }
  if (t_.establish(c.id) != 0) {
    failed(c, status::connection_reset);
    return;
  }
  established(c, payload, length);
}

void rdmacm_cm::handle_client(rdmacm_conn& c, const rdma_cm_event& event, const void* data,
                              size_t size) {
  switch (event.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (t_.resolve_route(c.id, route_timeout_ms) != 0) failed(c, status::unreachable);
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      route_resolved(c);
      break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      answered(c, data, size);
      break;
    case RDMA_CM_EVENT_REJECTED:
      failed(c, event.status == reject_no_listener ? status::unreachable : status::rejected);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      failed(c, status::connection_reset);
      break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      failed(c, status::unreachable);
      break;
    default:
      break;
  }
}

void rdmacm_cm::handle_server(rdmacm_conn& c, const rdma_cm_event& event) {
  switch (event.event) {
    case RDMA_CM_EVENT_ESTABLISHED:
      if (!c.handed_over) established(c, nullptr, 0);
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      if (c.handed_over) {
        c.gone = true;
      } else {
        failed(c, event.event == RDMA_CM_EVENT_UNREACHABLE ? status::endpoint_timeout
                                                           : status::connection_reset);
      }
      break;
    default:
      break;
  }
}

void rdmacm_cm::established(rdmacm_conn& c, const uint8_t* data, size_t length) {
  if (c.flow != nullptr) {
    // Only a server gets here in a flow: the client's rdma_establish (its notify) arrived.
    c.at = phase::connected;
    c.deadline = never;
    c.flow->on_notify(&c, status::ok);
    return;
  }
  c.at = phase::done;
  params_.handler->on_established(&c, data, length);
  finish(c);
}

void rdmacm_cm::disconnected(rdmacm_conn& c) {
  if (c.disconnected) return;
  c.disconnected = true;
  c.flow->on_disconnect(&c);
}

void rdmacm_cm::failed(rdmacm_conn& c, status reason) {
  const phase was = c.at;
  c.at = phase::done;
  if (c.flow == nullptr) {
    params_.handler->on_failed(&c, reason);
    finish(c);
  } else if (c.server) {
    c.flow->on_notify(&c, reason);
  } else if (was == phase::resolving) {
    c.flow->on_resolved(&c, {}, reason);
  } else {
    c.flow->on_connect(&c, reason, nullptr, 0);
  }
}

void rdmacm_cm::expire() {
  const auto now = clock_type::now();
  std::vector<rdmacm_conn*> late;
  for (auto& c : owned_) {
    const bool waiting = c->at == phase::resolving || c->at == phase::connecting;
    if (waiting && c->deadline <= now) late.push_back(c.get());
  }
  for (rdmacm_conn* c : late) {
    if (c->at == phase::done) continue;  // a callback before ended it
    failed(*c, c->at == phase::resolving && c->flow != nullptr ? status::unreachable
                                                               : status::endpoint_timeout);
  }
}

void rdmacm_cm::arm_timer() {
  auto earliest = never;
  for (auto& c : owned_) {
    if (c->at == phase::resolving || c->at == phase::connecting) {
      earliest = std::min(earliest, c->deadline);
    }
  }
  itimerspec spec{};
  if (earliest != never) {
    const auto wait = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::nanoseconds>(earliest - clock_type::now())
               .count());
    spec.it_value.tv_sec = wait / 1'000'000'000;
    spec.it_value.tv_nsec = wait % 1'000'000'000;
  }
  uint64_t expirations = 0;
  while (::read(timer_fd_, &expirations, sizeof(expirations)) > 0) {
  }
  ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
}

}  // namespace

status open_verbs_cm(const api& table, const tl::cm_params& params, std::unique_ptr<tl::cm>& out) {
  auto created = std::make_unique<rdmacm_cm>(table, params);
  const status st = created->open();
  if (st != status::ok) return st;
  out = std::move(created);
  return status::ok;
}

}  // namespace comm::verbs
