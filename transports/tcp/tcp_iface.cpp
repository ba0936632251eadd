#include "tcp/tcp_iface.hpp"

#include "tcp/tcp_conn.hpp"
#include "tcp/tcp_ep.hpp"

#include <comm/log.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
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
constexpr size_t max_connections = 4096;     ///< connections per interface
/// Reads a peer may have in flight per endpoint (what a reader on this interface is told; the
/// protocol layer's software RMA answers them with bcopy frames, one window's worth at most).
constexpr size_t max_outstanding_reads = 16;
constexpr unsigned housekeeping_mask = 1023; ///< housekeeping every this many progress() calls
/// While one connection carries the traffic, epoll is asked every this many + 1 progress() calls.
constexpr unsigned direct_read_mask = 15;
/// Without connections only the listener can have news: epoll is asked every this many + 1
/// progress() calls (a sleeping worker still wakes on the listener at once).
constexpr unsigned idle_poll_mask = 63;
constexpr uint64_t linger_timeout_ns = 10'000'000'000;  ///< a closed connection's bytes go by then
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

/// True for the errors accept4 reports about one connection rather than the listener.
bool transient_accept_error(int error) {
  return error == ECONNABORTED || error == EINTR || error == EPROTO || error == EPERM;
}

const char* phase_name(tcp_conn::phase p) {
  switch (p) {
    case tcp_conn::phase::connecting:
      return "connecting";
    case tcp_conn::phase::handshake:
      return "handshake";
    case tcp_conn::phase::awaiting:
      return "awaiting the peer's connection";
    case tcp_conn::phase::open:
      return "open";
    case tcp_conn::phase::finished:
      return "finished";
  }
  return "?";
}

}  // namespace

uint64_t tcp_iface::now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// -- open and close -------------------------------------------------------------------------------

tcp_iface::tcp_iface(const iface_params& params, const net_device& device)
    : device_(device),
      iface_id_(random_nonzero_id()),
      auth_key_(params.auth_key) {
  std::string why;
  if ((open_status_ = tcp_config::parse(params.opts, &config_, &why)) != status::ok) {
    COMM_LOG(error, log_name, "%s", why.c_str());
    return;
  }
  window_ = config_.window;
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
  if ((open_status_ = open_timer()) != status::ok) return;

  md_ = std::make_unique<tcp_md>(*this, iface_id_);
  attr_.caps = cap_am_short | cap_am_bcopy | cap_am_zcopy | cap_pending | cap_event_fd |
               cap_connect_to_iface | cap_peer_failure | cap_costly_progress;
  if (config_.rma) attr_.caps |= cap_put_zcopy | cap_get_zcopy | cap_get_needs_peer;
  attr_.max_short = max_short;
  attr_.max_bcopy = max_bcopy;
  attr_.max_zcopy = max_zcopy;
  attr_.max_hdr = max_hdr;
  attr_.max_iov = max_iov;
  attr_.max_am_descs = max_am_descs;
  attr_.max_outstanding_reads = max_outstanding_reads;
  if (config_.rma) {
    attr_.max_get_zcopy = max_rma_bytes;
    attr_.max_put_zcopy = max_rma_bytes;
    attr_.max_outstanding_reads = max_rma_in_flight;
  }
  attr_.latency_ns = 10'000;
  attr_.bandwidth_bytes_per_s = 2e9;
  attr_.priority = 5;
}

status tcp_iface::open_listener() {
  listen_fd_ = tcp::open_listener(device_.address, &port_);
  if (listen_fd_ < 0) return status::io_error;
  listener_target_ = {poll_target::kind::listener, this};
  return watch(listen_fd_, EPOLLIN, &listener_target_) ? status::ok : status::io_error;
}

status tcp_iface::open_timer() {
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_fd_ < 0) {
    COMM_LOG(error, log_name, "timerfd_create: %s", std::strerror(errno));
    return status::io_error;
  }
  timer_target_ = {poll_target::kind::timer, this};
  return watch(timer_fd_, EPOLLIN, &timer_target_) ? status::ok : status::io_error;
}

tcp_iface::~tcp_iface() noexcept {
  if (!eps_.empty()) {
    COMM_LOG(warn, log_name, "interface destroyed with %zu endpoints still open", eps_.size());
  }
  conns_.clear();
  for (auto& l : lingering_) ::close(l->fd);
  for (int fd : {listen_fd_, timer_fd_, epoll_fd_}) {
    if (fd >= 0) ::close(fd);
  }
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

void tcp_iface::retarget(int fd, uint32_t events, poll_target* from, poll_target* to) {
  rewatch(fd, events, to);
  for (int i = event_cursor_ + 1; i < event_count_; ++i) {
    if (events_[i].data.ptr == from) events_[i].data.ptr = nullptr;
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
  if (!reaped_.empty()) [[unlikely]] remove_reaped();
  if (!backlog_.empty()) [[unlikely]] events += drain_backlog();
  if (!redispatch_.empty()) [[unlikely]] events += run_redispatch();
  if (hot_ != nullptr && (++direct_reads_ & direct_read_mask) != 0 && !hot_->out_watched() &&
      conns_.size() == 1 && lingering_.empty()) {
    // The only socket with traffic (besides the listener): one recv instead of epoll_wait and
    // recv. With others around, epoll sees them all at once (a closing socket's EOF included).
    events += on_connection(hot_, EPOLLIN);
  } else if (!conns_.empty() || !lingering_.empty() || (progress_calls_ & idle_poll_mask) == 0) {
    events += poll_events();
  }
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
    case poll_target::kind::connection:
      return on_connection(static_cast<tcp_conn*>(target->object), events);
    case poll_target::kind::lingering:
      return on_lingering(static_cast<lingering_socket*>(target->object), events);
    case poll_target::kind::timer:
      return on_timer();
  }
  return 0;
}

unsigned tcp_iface::on_connection(tcp_conn* conn, uint32_t events) {
  const unsigned delivered = conn->on_events(events);
  unsigned done = delivered;
  if (!conn->finished()) {
    done += conn->after_io();
    // The connection that delivered last is read directly until epoll is asked again.
    if (delivered != 0 && conn->state() == tcp_conn::phase::open) hot_ = conn;
  }
  settle(conn);  // may remove it
  return done;
}

void tcp_iface::settle(tcp_conn* conn) {
  if (conn->finished()) {
    close_connection(conn);
    return;
  }
  if (conn->has_frames()) add_backlog(conn);
}

void tcp_iface::add_backlog(tcp_conn* conn) {
  if (conn->in_backlog) return;
  conn->in_backlog = true;
  backlog_.push_back(conn);
}

unsigned tcp_iface::drain_backlog() {
  unsigned done = 0;
  backlog_work_.swap(backlog_);
  for (size_t i = 0; i < backlog_work_.size(); ++i) {
    tcp_conn* conn = backlog_work_[i];
    if (conn == nullptr) continue;  // closed meanwhile
    conn->in_backlog = false;
    done += conn->deliver_buffered();
    if (!conn->finished()) done += conn->after_io();
    settle(conn);
  }
  backlog_work_.clear();
  return done;
}

// -- connections ----------------------------------------------------------------------------------

unsigned tcp_iface::accept_connections() {
  unsigned accepted = 0;
  for (int i = 0; i < accepts_per_call; ++i) {
    sockaddr_storage peer{};
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
    set_nodelay(fd);
    note_probe_cap(set_liveness(fd, config_));
    auto conn = std::make_unique<tcp_conn>(*this, fd, ip_address::of(peer), port_of(peer),
                                           now_ns());
    ++counters_.accepted;
    ++accepted;
    add_connection(std::move(conn));
  }
  return accepted;
}

void tcp_iface::add_connection(std::unique_ptr<tcp_conn> conn) {
  conn->index = conns_.size();
  tcp_conn* raw = conn.get();
  conns_.push_back(std::move(conn));
  if (raw->finished()) reap(raw);  // its socket could not be watched
}

tcp_iface::admission tcp_iface::admit(tcp_conn* conn) {
  const uint64_t peer = conn->peer_id();
  if (peer == iface_id_) return {};  // our own connection's other end: kept apart from the map
  auto it = peers_.find(peer);
  tcp_conn* mapped = it == peers_.end() ? nullptr : it->second;
  if (mapped == nullptr) {
    map(conn);
    return {};
  }
  if (mapped->state() == tcp_conn::phase::open) {
    // The peer connects again: it said bye on that one (or lost it), or this is a socket it gave
    // up in a simultaneous connect and is about to close. Either way it is served, but ours stay
    // on the mapped one (the peer reads it until both said bye); spare() finds this one later.
    return {};
  }
  // Our own connect to the peer is under way (or was answered "duplicate"): both connected at
  // once. The connection of the interface with the smaller id is kept.
  if (mapped->state() != tcp_conn::phase::awaiting && iface_id_ < peer) {
    ++counters_.duplicates;
    return {admission::kind::duplicate, nullptr};
  }
  ++counters_.taken_over;
  return {admission::kind::adopt, mapped};
}

tcp_conn* tcp_iface::spare(uint64_t peer) const {
  if (peer == iface_id_) return nullptr;
  for (const auto& conn : conns_) {
    if (conn->peer_id() == peer && !conn->mapped && conn->state() == tcp_conn::phase::open &&
        !conn->bye_sent() && !conn->bye_received()) {
      return conn.get();
    }
  }
  return nullptr;
}

void tcp_iface::map(tcp_conn* conn) {
  peers_[conn->peer_id()] = conn;
  conn->mapped = true;
}

void tcp_iface::unmap(tcp_conn* conn) {
  if (!conn->mapped) return;
  conn->mapped = false;
  auto it = peers_.find(conn->peer_id());
  if (it != peers_.end() && it->second == conn) peers_.erase(it);
}

void tcp_iface::reap(tcp_conn* conn) {
  if (std::find(reaped_.begin(), reaped_.end(), conn) == reaped_.end()) reaped_.push_back(conn);
}

void tcp_iface::remove_reaped() {
  while (!reaped_.empty()) close_connection(reaped_.back());
}

void tcp_iface::close_connection(tcp_conn* conn) {
  if (conn->fd() >= 0) unwatch(conn->fd(), conn->target());
  if (conn->in_backlog) backlog_.erase(std::find(backlog_.begin(), backlog_.end(), conn));
  std::replace(backlog_work_.begin(), backlog_work_.end(), conn, static_cast<tcp_conn*>(nullptr));
  reaped_.erase(std::remove(reaped_.begin(), reaped_.end(), conn), reaped_.end());
  unmap(conn);
  if (hot_ == conn) hot_ = nullptr;
  const size_t index = conn->index;
  if (index + 1 != conns_.size()) {
    conns_[index] = std::move(conns_.back());
    conns_[index]->index = index;
  }
  conns_.pop_back();  // closes the socket, if it still has one
  ++counters_.closed;
}

bool tcp_iface::deliver(am_id id, void* data, size_t length) {
  const handler& h = handlers_[id];
  if (h.fn == nullptr) [[unlikely]] {
    ++counters_.unhandled;
    COMM_LOG(debug, log_name, "no handler for am id %u, message dropped", unsigned{id});
    return false;
  }
  ++counters_.messages_received;
  const unsigned flags = descs_.can_lend() ? am_flag_desc : 0;
  return h.fn(h.arg, data, length, flags) == status::in_progress && flags != 0;
}

void tcp_iface::release_am_desc(void* data) {
  if (!descs_.release(data)) {
    COMM_LOG(error, log_name, "release_am_desc: %p is not a descriptor kept from this interface",
             data);
  }
}

md* tcp_iface::memory_domain() { return config_.rma ? md_.get() : nullptr; }

void tcp_iface::region_gone(uint32_t slot, uint64_t generation) {
  for (const auto& conn : conns_) conn->region_gone(slot, generation);
}

void* tcp_iface::scratch(size_t* capacity) {
  constexpr size_t bytes = 64 * 1024;
  if (!scratch_) scratch_.reset(new uint64_t[bytes / sizeof(uint64_t)]);
  *capacity = bytes;
  return scratch_.get();
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

// -- lingering sockets of finished connections ----------------------------------------------------

void tcp_iface::linger(int fd, byte_queue bytes) {
  auto l = std::make_unique<lingering_socket>();
  l->fd = fd;
  l->bytes = std::move(bytes);
  l->deadline_ns = now_ns() + linger_timeout_ns;
  l->target = {poll_target::kind::lingering, l.get()};
  if (!linger_write(l.get()) ||
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
  if (!l->shut) {
    if (!linger_write(l)) return false;
    if (l->shut) rewatch(l->fd, EPOLLIN | EPOLLRDHUP, &l->target);
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) == 0) return true;
  // Records we no longer need, then the peer's EOF: it has read everything.
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
  const uint64_t now = now_ns();
  for (size_t i = conns_.size(); i-- > 0;) conns_[i]->check_deadline(now);
  remove_reaped();
  for (size_t i = lingering_.size(); i-- > 0;) {
    if (now > lingering_[i]->deadline_ns) close_lingering(lingering_[i].get());
  }
}

// -- liveness of the peers ------------------------------------------------------------------------

void tcp_iface::arm_timer(bool on) {
  const auto period = static_cast<long>(config_.check_period_ns());
  itimerspec spec{};
  if (on) {
    spec.it_interval = {period / 1'000'000'000, period % 1'000'000'000};
    spec.it_value = spec.it_interval;
  }
  if (::timerfd_settime(timer_fd_, 0, &spec, nullptr) != 0) {
    COMM_LOG(error, log_name, "timerfd_settime: %s", std::strerror(errno));
    return;
  }
  timer_armed_ = on;
  if (on) timer_started_ns_ = now_ns();
}

unsigned tcp_iface::on_timer() {
  uint64_t ticks = 0;
  if (::read(timer_fd_, &ticks, sizeof(ticks)) != sizeof(ticks)) return 0;
  ++counters_.liveness_checks;
  const uint64_t now = now_ns();
  bool waiting = false;
  for (size_t i = 0; i < conns_.size(); ++i) waiting = conns_[i]->check_liveness(now) || waiting;
  if (!waiting) arm_timer(false);  // the next write arms it again
  return 0;
}

void tcp_iface::note_probe_cap(bool capped) {
  if (capped || !probes_capped_) return;
  probes_capped_ = false;
  COMM_LOG(info, log_name,
           "this kernel has no TCP_RTO_MAX_MS: while a peer stalls, its host is asked only as "
           "often as the kernel backs its window probes off (up to every 120 s)");
}

// -- blocking progress ----------------------------------------------------------------------------

bool tcp_iface::any_parked_ep_ready() const {
  return std::any_of(eps_.begin(), eps_.end(),
                     [](const tcp_ep* ep) { return ep->parked_and_ready(); });
}

status tcp_iface::event_arm() {
  if (!failed_.empty() || !backlog_.empty() || !redispatch_.empty() || !reaped_.empty()) {
    return status::busy;
  }
  if (any_parked_ep_ready()) return status::busy;
  epoll_event ready;
  if (::epoll_wait(epoll_fd_, &ready, 1, 0) > 0) return status::busy;
  return status::ok;
}

// -- addresses and endpoints ----------------------------------------------------------------------

std::vector<uint8_t> tcp_iface::device_address() const {
  return device_addr::local(device_.address).pack();
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
  const ip_address peer = device->address();
  if (peer.family != device_.address.family) return false;  // an interface reaches its family
  if (peer.link_local()) return !device_.address.loopback();  // through our device's link
  if (!device->loopback()) return true;  // routed: assume the network connects us
  const device_addr ours = device_addr::local(device_.address);
  return std::memcmp(device->boot_id, ours.boot_id, sizeof(ours.boot_id)) == 0 &&
         device->net_ns == ours.net_ns;
}

ip_address tcp_iface::reach(const device_addr& device) const {
  ip_address peer = device.address();
  if (peer.link_local()) peer.scope = device_.index;  // on our device's link
  return peer;
}

status tcp_iface::create_ep(const std::vector<uint8_t>& device_address,
                            const std::vector<uint8_t>& iface_address, std::unique_ptr<ep>& out) {
  const auto device = device_addr::unpack(device_address);
  const auto address = iface_addr::unpack(iface_address);
  if (!device || !address) return status::invalid_addr;
  if (!is_reachable(device_address, iface_address)) return status::unreachable;
  // iface_addr is packed: its id is read by value, never bound to a reference (misaligned).
  const uint64_t peer = address->iface_id;
  tcp_conn* conn = nullptr;
  if (auto it = peers_.find(peer); it != peers_.end()) conn = it->second;
  if (conn == nullptr && (conn = spare(peer)) != nullptr) map(conn);
  if (conn == nullptr) {
    if (conns_.size() >= max_connections) {
      COMM_LOG(warn, log_name, "no new connection: %zu connections open", conns_.size());
      return status::exceeds_limit;
    }
    const ip_address peer_ip = reach(*device);
    const connect_result c = start_connect(peer_ip, address->port, config_);
    if (c.fd < 0) return c.st;
    note_probe_cap(c.probes_capped);
    auto made = std::make_unique<tcp_conn>(*this, c.fd, c.connected, peer_ip, *address,
                                           now_ns());
    if (made->finished()) return status::io_error;
    conn = made.get();
    ++counters_.connected;
    add_connection(std::move(made));
    map(conn);
  }
  auto ep = std::make_unique<tcp_ep>(*this, *conn, reach(*device), *address);
  eps_.push_back(ep.get());
  out = std::move(ep);
  return status::ok;
}

std::string tcp_iface::info() const {
  const tcp_counters& c = counters_;
  size_t failed = 0;
  for (const tcp_ep* ep : eps_) failed += ep->failure() != status::ok ? 1 : 0;
  std::string text;
  text += "tcp: device " + device_.name + " address " + device_.address.text() + " port " +
          std::to_string(port_) + "\n";
  text += "tcp: max_short " + std::to_string(attr_.max_short) + ", max_bcopy " +
          std::to_string(attr_.max_bcopy) + ", max_zcopy " + std::to_string(attr_.max_zcopy) +
          " (max_hdr " + std::to_string(attr_.max_hdr) + ", max_iov " +
          std::to_string(attr_.max_iov) + ")\n";
  text += "tcp: send buffer " + std::to_string(send_buffer_size) + " bytes, receive buffer " +
          std::to_string(receive_buffer_size) + " bytes per connection, " +
          std::to_string(descs_.lent()) + " of " + std::to_string(descs_.limit()) +
          " kept by handlers\n";
  text += "tcp: window " + std::to_string(window_) + " frames undelivered per connection\n";
  text += std::string("tcp: authentication ") +
          (auth_key_.empty() ? "off" : "on (HMAC-SHA256 challenge-response)") + "\n";
  text += "tcp: endpoints " + std::to_string(eps_.size()) + " (" + std::to_string(failed) +
          " failed, " + std::to_string(c.peers_failed) + " failures seen)\n";
  for (const tcp_ep* ep : eps_) text += "tcp:   to " + ep->describe() + "\n";
  text += "tcp: connections " + std::to_string(conns_.size()) + " open (" +
          std::to_string(peers_.size()) + " to peers), " + std::to_string(c.connected) +
          " connected, " + std::to_string(c.accepted) + " accepted, " + std::to_string(c.closed) +
          " closed, " + std::to_string(lingering_.size()) + " closing\n";
  for (const auto& conn : conns_) {
    text += "tcp:   " + conn->describe() + " " + phase_name(conn->state()) + ", " +
            std::to_string(conn->endpoints()) + " endpoints" +
            (conn->mapped ? "" : ", unmapped") + (conn->bye_sent() ? ", bye sent" : "") +
            (conn->bye_received() ? ", bye received" : "") + "\n";
  }
  text += "tcp: sent " + std::to_string(c.messages_sent) + " messages, " +
          std::to_string(c.bytes_sent) + " bytes\n";
  text += "tcp: writes the kernel did not take in full " + std::to_string(c.would_block) + "\n";
  text += "tcp: sends refused for lack of resources " + std::to_string(c.no_resource) + "\n";
  text += "tcp: acknowledgements sent alone " + std::to_string(c.acks_sent) + "\n";
  text += "tcp: received " + std::to_string(c.messages_received) + " messages, " +
          std::to_string(c.bytes_received) + " bytes\n";
  text += "tcp: messages dropped without handler " + std::to_string(c.unhandled) + "\n";
  text += "tcp: malformed connections closed " + std::to_string(c.malformed) + "\n";
  text += "tcp: proofs of the key checked " + std::to_string(c.auth_checks) + "\n";
  text += "tcp: authentication refused " + std::to_string(c.auth_failures) + "\n";
  text += "tcp: simultaneous connects: answered duplicate " + std::to_string(c.duplicates) +
          ", sockets taken over " + std::to_string(c.taken_over) + "\n";
  text += config_.describe();
  text += "tcp: liveness checks made " + std::to_string(c.liveness_checks) + " (every " +
          std::to_string(config_.check_period_ns() / 1'000'000) +
          " ms while a peer owes an answer; window probes " +
          (probes_capped_
               ? "at least every " + std::to_string(config_.probe_interval_max_ms()) + " ms)\n"
               : "backing off to 120 s: kernel before 6.15)\n");
  text += "tcp: puts and gets sent " + std::to_string(c.rma_requests) + ", answered for peers " +
          std::to_string(c.rma_answers) + ", bytes read into memory " +
          std::to_string(c.rma_bytes_received) + " (up to " + std::to_string(max_rma_bytes) +
          " bytes each, " + std::to_string(max_rma_in_flight) + " unanswered per connection)\n";
  if (md_) text += md_->info();
  text += "tcp: peers given up: host silent " + std::to_string(c.silent_hosts) +
          ", process stalled " + std::to_string(c.stalled_peers) + " (heartbeats sent " +
          std::to_string(c.heartbeats_sent) + ")\n";
  return text;
}

}  // namespace comm::tl::tcp
