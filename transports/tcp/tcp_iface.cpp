#include "tcp/tcp_iface.hpp"

#include "tcp/tcp_conn.hpp"
#include "tcp/tcp_ep.hpp"

#include <comm/log.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";
constexpr int progress_batch = 64;           ///< epoll events per progress() call
constexpr int accepts_per_call = 16;
constexpr size_t max_connections = 4096;     ///< accepted connections per interface
constexpr unsigned housekeeping_mask = 1023; ///< housekeeping every this many progress() calls
constexpr uint64_t hello_timeout_ns = 10'000'000'000;   ///< a connection must say hello by then
constexpr uint64_t linger_timeout_ns = 10'000'000'000;  ///< a closed endpoint's bytes go by then
/// A large-frame buffer holds any frame a peer may announce.
constexpr size_t max_frame_bytes = max_header_bytes + pad8(max_frame_payload);

uint64_t random_nonzero_id() {
  uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof(id), 0) != sizeof(id)) {
      id = static_cast<uint64_t>(::getpid()) << 32 ^ static_cast<uint64_t>(::time(nullptr));
    }
  }
  return id;
}

uint64_t coarse_now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

/// True for the errors accept4 reports about one connection rather than the listener.
bool transient_accept_error(int error) {
  return error == ECONNABORTED || error == EINTR || error == EPROTO || error == EPERM;
}

}  // namespace

// -- open and close -------------------------------------------------------------------------------

tcp_iface::tcp_iface(const iface_params& params, const ipv4_device& device)
    : device_(device), iface_id_(random_nonzero_id()) {
  if (params.fifo_size != 0) {
    if (params.fifo_size < min_window || params.fifo_size > max_window) {
      COMM_LOG(error, log_name, "bad parameters: fifo_size %zu (%u..%u frames in flight)",
               params.fifo_size, min_window, max_window);
      open_status_ = status::invalid_param;
      return;
    }
    window_ = static_cast<uint32_t>(params.fifo_size);
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    COMM_LOG(error, log_name, "epoll_create1: %s", std::strerror(errno));
    open_status_ = status::io_error;
    return;
  }
  if ((open_status_ = open_listener()) != status::ok) return;

  attr_.caps = cap_am_short | cap_am_bcopy | cap_am_zcopy | cap_pending | cap_event_fd |
               cap_connect_to_iface | cap_peer_failure | cap_costly_progress;
  attr_.max_short = max_short;
  attr_.max_bcopy = max_bcopy;
  attr_.max_zcopy = max_zcopy;
  attr_.max_hdr = max_hdr;
  attr_.max_iov = max_iov;
  attr_.latency_ns = 10'000;
  attr_.bandwidth_bytes_per_s = 2e9;
  attr_.priority = 5;
}

status tcp_iface::open_listener() {
  listen_fd_ = tcp::open_listener(device_.ipv4, &port_);
  if (listen_fd_ < 0) return status::io_error;
  listener_target_ = {poll_target::kind::listener, this};
  return watch(listen_fd_, EPOLLIN, &listener_target_) ? status::ok : status::io_error;
}

tcp_iface::~tcp_iface() noexcept {
  if (!eps_.empty()) {
    COMM_LOG(warn, log_name, "interface destroyed with %zu endpoints still open", eps_.size());
  }
  conns_.clear();
  for (auto& l : lingering_) ::close(l->fd);
  for (int fd : {listen_fd_, epoll_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void tcp_iface::set_am_handler(am_id id, am_handler_fn fn, void* arg) {
  if (id >= am_id_count) return;
  handlers_[id] = {fn, arg};
}

void tcp_iface::set_error_handler(error_handler_fn fn, void* arg) {
  error_fn_ = fn;
  error_arg_ = arg;
}

// -- the epoll set --------------------------------------------------------------------------------

bool tcp_iface::watch(int fd, uint32_t events, poll_target* target) {
  epoll_event event{};
  event.events = events;
  event.data.ptr = target;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) == 0) return true;
  COMM_LOG(error, log_name, "epoll_ctl(ADD, %d): %s", fd, std::strerror(errno));
  return false;
}

void tcp_iface::rewatch(int fd, uint32_t events, poll_target* target) {
  epoll_event event{};
  event.events = events;
  event.data.ptr = target;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &event) != 0) {
    COMM_LOG(error, log_name, "epoll_ctl(MOD, %d): %s", fd, std::strerror(errno));
  }
}

void tcp_iface::unwatch(int fd, poll_target* target) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  for (int i = event_cursor_ + 1; i < event_count_; ++i) {
    if (events_[i].data.ptr == target) events_[i].data.ptr = nullptr;
  }
}

// -- progress -------------------------------------------------------------------------------------

unsigned tcp_iface::progress() {
  unsigned events = 0;
  if (!backlog_.empty()) [[unlikely]] events += drain_backlog();
  if (!redispatch_.empty()) [[unlikely]] events += run_redispatch();
  events += poll_events();
  if ((++progress_calls_ & housekeeping_mask) == 0) [[unlikely]] housekeeping();
  if (!failed_.empty()) [[unlikely]] events += report_failures();
  return events;
}

unsigned tcp_iface::poll_events() {
  const int n = ::epoll_wait(epoll_fd_, events_, progress_batch, 0);
  if (n <= 0) return 0;
  unsigned done = 0;
  event_count_ = n;
  for (event_cursor_ = 0; event_cursor_ < event_count_; ++event_cursor_) {
    auto* target = static_cast<poll_target*>(events_[event_cursor_].data.ptr);
    if (target != nullptr) done += dispatch(target, events_[event_cursor_].events);
  }
  event_count_ = 0;
  event_cursor_ = 0;
  return done;
}

unsigned tcp_iface::dispatch(poll_target* target, uint32_t events) {
  switch (target->what) {
    case poll_target::kind::listener:
      return accept_connections();
    case poll_target::kind::endpoint:
      return static_cast<tcp_ep*>(target->object)->on_events(events);
    case poll_target::kind::connection:
      return on_connection(static_cast<tcp_conn*>(target->object), events);
    case poll_target::kind::lingering:
      return on_lingering(static_cast<lingering_socket*>(target->object), events);
  }
  return 0;
}

// -- receiving ------------------------------------------------------------------------------------

unsigned tcp_iface::accept_connections() {
  unsigned accepted = 0;
  for (int i = 0; i < accepts_per_call; ++i) {
    sockaddr_in peer{};
    socklen_t length = sizeof(peer);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (transient_accept_error(errno)) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors or memory: the listener stays readable, so say it only now and then.
        ++accept_failures_;
        if ((accept_failures_ & (accept_failures_ - 1)) == 0) {
          COMM_LOG(warn, log_name, "accept: %s (%llu times)", std::strerror(errno),
                   static_cast<unsigned long long>(accept_failures_));
        }
      }
      break;
    }
    if (conns_.size() >= max_connections) {
      COMM_LOG(warn, log_name, "refusing a connection: %zu connections open", conns_.size());
      ::close(fd);
      continue;
    }
    set_keepalive(fd);
    auto conn = std::make_unique<tcp_conn>(*this, fd, peer.sin_addr.s_addr, ntohs(peer.sin_port),
                                           coarse_now_ns());
    if (!watch(fd, EPOLLIN | EPOLLRDHUP, conn->target())) continue;
    conn->index = conns_.size();
    conns_.push_back(std::move(conn));
    ++counters_.accepted;
    ++accepted;
  }
  return accepted;
}

unsigned tcp_iface::on_connection(tcp_conn* conn, uint32_t events) {
  const unsigned delivered =
      (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0 ? conn->on_readable() : 0;
  settle(conn);
  return delivered;
}

void tcp_iface::settle(tcp_conn* conn) {
  if (conn->closing()) {
    close_connection(conn);
    return;
  }
  if (conn->has_frames()) add_backlog(conn);
  const bool ack_waits = conn->flush_acks();
  if (ack_waits != conn->out_watched) {
    conn->out_watched = ack_waits;
    rewatch(conn->fd(), EPOLLIN | EPOLLRDHUP | (ack_waits ? uint32_t{EPOLLOUT} : 0u),
            conn->target());
  }
}

void tcp_iface::add_backlog(tcp_conn* conn) {
  if (conn->in_backlog) return;
  conn->in_backlog = true;
  backlog_.push_back(conn);
}

unsigned tcp_iface::drain_backlog() {
  unsigned delivered = 0;
  backlog_work_.swap(backlog_);
  for (tcp_conn* conn : backlog_work_) {
    conn->in_backlog = false;
    delivered += conn->deliver_buffered();
    settle(conn);
  }
  backlog_work_.clear();
  return delivered;
}

void tcp_iface::close_connection(tcp_conn* conn) {
  unwatch(conn->fd(), conn->target());
  if (conn->in_backlog) backlog_.erase(std::find(backlog_.begin(), backlog_.end(), conn));
  const size_t index = conn->index;
  if (index + 1 != conns_.size()) {
    conns_[index] = std::move(conns_.back());
    conns_[index]->index = index;
  }
  conns_.pop_back();  // closes the socket
  ++counters_.closed;
}

void tcp_iface::deliver(am_id id, void* data, size_t length) {
  const handler& h = handlers_[id];
  if (h.fn == nullptr) [[unlikely]] {
    ++counters_.unhandled;
    COMM_LOG(debug, log_name, "no handler for am id %u, message dropped", unsigned{id});
    return;
  }
  ++counters_.messages_received;
  h.fn(h.arg, data, length, 0);
}

std::unique_ptr<uint64_t[]> tcp_iface::take_frame_buffer(size_t bytes, size_t* capacity) {
  if (spare_frame_ && spare_capacity_ >= bytes) {
    *capacity = spare_capacity_;
    return std::move(spare_frame_);
  }
  *capacity = std::max(bytes, max_frame_bytes);
  return std::unique_ptr<uint64_t[]>(new uint64_t[*capacity / sizeof(uint64_t)]);
}

void tcp_iface::give_frame_buffer(std::unique_ptr<uint64_t[]> buffer, size_t capacity) {
  if (spare_frame_) return;
  spare_frame_ = std::move(buffer);
  spare_capacity_ = capacity;
}

// -- endpoints ------------------------------------------------------------------------------------

void tcp_iface::write_hello(uint64_t peer_id, void* dest) {
  auto& hello = hello_writer_.fields();
  hello.setMagic(hello_magic);
  hello.setVersion(hello_version);
  hello.setSrcPort(port_);
  hello.setSrcAddress(device_.ipv4);
  hello.setSrcIfaceId(iface_id_);
  hello.setDstIfaceId(peer_id);
  hello_writer_.copy_to(dest);
}

void tcp_iface::write_ack(uint64_t delivered, void* dest) {
  ack_writer_.fields().setDelivered(delivered);
  ack_writer_.copy_to(dest);
}

void tcp_iface::notice_failure(tcp_ep* ep) {
  if (ep->failure_queued) return;
  ep->failure_queued = true;
  failed_.push_back(ep);
}

void tcp_iface::redispatch(tcp_ep* ep) {
  if (ep->redispatch_queued) return;
  ep->redispatch_queued = true;
  redispatch_.push_back(ep);
}

void tcp_iface::forget(tcp_ep* ep) {
  eps_.erase(std::remove(eps_.begin(), eps_.end(), ep), eps_.end());
  failed_.erase(std::remove(failed_.begin(), failed_.end(), ep), failed_.end());
  for (tcp_ep*& entry : redispatch_) {
    if (entry == ep) entry = nullptr;  // run_redispatch may be iterating
  }
}

unsigned tcp_iface::run_redispatch() {
  unsigned done = 0;
  const size_t count = redispatch_.size();  // endpoints re-added meanwhile wait for the next call
  for (size_t i = 0; i < count; ++i) {
    tcp_ep* ep = redispatch_[i];
    if (ep == nullptr) continue;
    ep->redispatch_queued = false;
    done += ep->dispatch_pending();
  }
  redispatch_.erase(redispatch_.begin(), redispatch_.begin() + static_cast<ptrdiff_t>(count));
  return done;
}

unsigned tcp_iface::report_failures() {
  unsigned events = 0;
  while (!failed_.empty()) {
    tcp_ep* ep = failed_.front();
    failed_.erase(failed_.begin());
    ep->failure_queued = false;
    ++counters_.peers_failed;
    const status reason = ep->failure();
    ep->fail(reason);
    ++events;
    if (error_fn_ != nullptr) {
      error_fn_(error_arg_, ep, reason);  // may destroy ep: not touched after
    } else {
      COMM_LOG(warn, log_name, "endpoint failed (%s) and no error handler is set",
               to_string(reason));
    }
  }
  return events;
}

// -- lingering sockets of destroyed endpoints -----------------------------------------------------

void tcp_iface::linger(int fd, bool connecting, byte_queue bytes) {
  auto l = std::make_unique<lingering_socket>();
  l->fd = fd;
  l->connecting = connecting;
  l->bytes = std::move(bytes);
  l->deadline_ns = coarse_now_ns() + linger_timeout_ns;
  l->target = {poll_target::kind::lingering, l.get()};
  if ((!connecting && !linger_write(l.get())) ||
      !watch(fd, EPOLLIN | EPOLLRDHUP | (l->shut ? 0u : uint32_t{EPOLLOUT}), &l->target)) {
    ::close(fd);
    return;
  }
  lingering_.push_back(std::move(l));
}

bool tcp_iface::linger_write(lingering_socket* l) {
  if (!l->bytes.empty()) {
    const ssize_t sent =
        ::send(l->fd, l->bytes.data(), l->bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    counters_.bytes_sent += static_cast<size_t>(sent);
    l->bytes.consume(static_cast<size_t>(sent));
    if (!l->bytes.empty()) return true;
  }
  l->shut = true;
  return ::shutdown(l->fd, SHUT_WR) == 0;
}

unsigned tcp_iface::on_lingering(lingering_socket* l, uint32_t events) {
  if (!lingering_goes_on(l, events)) close_lingering(l);
  return 0;
}

bool tcp_iface::lingering_goes_on(lingering_socket* l, uint32_t events) {
  if (events & EPOLLERR) return false;
  if (l->connecting) {
    if ((events & (EPOLLOUT | EPOLLHUP)) == 0) return true;
    if (socket_error(l->fd) != 0) return false;
    l->connecting = false;
  }
  if (!l->shut) {
    if (!linger_write(l)) return false;
    if (l->shut) rewatch(l->fd, EPOLLIN | EPOLLRDHUP, &l->target);
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) == 0) return true;
  // Acknowledgements we no longer need, then the peer's EOF: it has read everything.
  char sink[512];
  for (int round = 0; round < 16; ++round) {
    const ssize_t got = ::recv(l->fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (got > 0) continue;
    return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  }
  return true;
}

void tcp_iface::close_lingering(lingering_socket* l) {
  unwatch(l->fd, &l->target);
  ::close(l->fd);
  auto it = std::find_if(lingering_.begin(), lingering_.end(),
                         [&](const auto& entry) { return entry.get() == l; });
  lingering_.erase(it);
}

// -- housekeeping ---------------------------------------------------------------------------------

void tcp_iface::housekeeping() {
  if (conns_.empty() && lingering_.empty()) return;
  const uint64_t now = coarse_now_ns();
  for (size_t i = conns_.size(); i-- > 0;) {
    tcp_conn* conn = conns_[i].get();
    if (conn->awaiting_hello() && now - conn->accepted_ns() > hello_timeout_ns) {
      ++counters_.malformed;
      COMM_LOG(warn, log_name, "connection from %s closed: no hello within %llu s",
               conn->describe().c_str(),
               static_cast<unsigned long long>(hello_timeout_ns / 1'000'000'000));
      close_connection(conn);
    }
  }
  for (size_t i = lingering_.size(); i-- > 0;) {
    if (now > lingering_[i]->deadline_ns) close_lingering(lingering_[i].get());
  }
}

// -- blocking progress ----------------------------------------------------------------------------

bool tcp_iface::any_parked_ep_ready() const {
  return std::any_of(eps_.begin(), eps_.end(),
                     [](const tcp_ep* ep) { return ep->parked_and_ready(); });
}

status tcp_iface::event_arm() {
  if (!failed_.empty() || !backlog_.empty() || !redispatch_.empty()) return status::busy;
  if (any_parked_ep_ready()) return status::busy;
  epoll_event ready;
  if (::epoll_wait(epoll_fd_, &ready, 1, 0) > 0) return status::busy;
  return status::ok;
}

// -- addresses and endpoints ----------------------------------------------------------------------

std::vector<uint8_t> tcp_iface::device_address() const {
  return device_addr::local(device_.ipv4).pack();
}

std::vector<uint8_t> tcp_iface::iface_address() const {
  iface_addr address;
  address.port = port_;
  address.iface_id = iface_id_;
  address.window = window_;
  return address.pack();
}

bool tcp_iface::is_reachable(const std::vector<uint8_t>& device_address,
                             const std::vector<uint8_t>& iface_address) const {
  const auto device = device_addr::unpack(device_address);
  if (!device || !iface_addr::unpack(iface_address)) return false;
  if (!device->loopback()) return true;  // routed: assume the network connects us
  const device_addr ours = device_addr::local(device_.ipv4);
  return std::memcmp(device->boot_id, ours.boot_id, sizeof(ours.boot_id)) == 0 &&
         device->net_ns == ours.net_ns;
}

status tcp_iface::create_ep(const std::vector<uint8_t>& device_address,
                            const std::vector<uint8_t>& iface_address, std::unique_ptr<ep>& out) {
  const auto device = device_addr::unpack(device_address);
  const auto address = iface_addr::unpack(iface_address);
  if (!device || !address) return status::invalid_addr;
  if (!is_reachable(device_address, iface_address)) return status::unreachable;
  const connect_result c = start_connect(device->ipv4, address->port);
  if (c.fd < 0) return c.st;
  auto ep = std::make_unique<tcp_ep>(*this, c.fd, c.connected, device->ipv4, *address);
  if (ep->failure() != status::ok) return ep->failure();
  eps_.push_back(ep.get());
  out = std::move(ep);
  return status::ok;
}

std::string tcp_iface::info() const {
  const tcp_counters& c = counters_;
  size_t failed = 0;
  for (const tcp_ep* ep : eps_) failed += ep->failure() != status::ok ? 1 : 0;
  std::string text;
  text += "tcp: device " + device_.name + " address " + ipv4_text(device_.ipv4) + " port " +
          std::to_string(port_) + "\n";
  text += "tcp: max_short " + std::to_string(attr_.max_short) + ", max_bcopy " +
          std::to_string(attr_.max_bcopy) + ", max_zcopy " + std::to_string(attr_.max_zcopy) +
          " (max_hdr " + std::to_string(attr_.max_hdr) + ", max_iov " +
          std::to_string(attr_.max_iov) + ")\n";
  text += "tcp: send buffer " + std::to_string(send_buffer_size) + " bytes per endpoint, receive " +
          "buffer " + std::to_string(receive_buffer_size) + " bytes per connection\n";
  text += "tcp: window " + std::to_string(window_) + " frames undelivered per connection\n";
  text += "tcp: endpoints " + std::to_string(eps_.size()) + " (" + std::to_string(failed) +
          " failed, " + std::to_string(c.peers_failed) + " failures seen), " +
          std::to_string(lingering_.size()) + " closing\n";
  for (const tcp_ep* ep : eps_) text += "tcp:   to " + ep->describe() + "\n";
  text += "tcp: connections " + std::to_string(conns_.size()) + " open, " +
          std::to_string(c.accepted) + " accepted, " + std::to_string(c.closed) + " closed\n";
  text += "tcp: sent " + std::to_string(c.messages_sent) + " messages, " +
          std::to_string(c.bytes_sent) + " bytes\n";
  text += "tcp: writes the kernel did not take in full " + std::to_string(c.would_block) + "\n";
  text += "tcp: sends refused for lack of resources " + std::to_string(c.no_resource) + "\n";
  text += "tcp: received " + std::to_string(c.messages_received) + " messages, " +
          std::to_string(c.bytes_received) + " bytes\n";
  text += "tcp: messages dropped without handler " + std::to_string(c.unhandled) + "\n";
  text += "tcp: malformed connections closed " + std::to_string(c.malformed) + "\n";
  return text;
}

}  // namespace comm::tl::tcp
