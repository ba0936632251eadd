// The tcp connection manager: listeners, the handshake state machine, timeouts (see tcp_cm.hpp).
#include "tcp/tcp_cm.hpp"
#include "tcp/tcp_socket.hpp"

#include "base/auth.hpp"

#include <comm/log.hpp>
#include <comm/wire/codec.hpp>

#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace comm::tl::tcp {
namespace {

namespace schema = wire::schema;
using clock_type = std::chrono::steady_clock;

constexpr const char* log_name = "cm";
constexpr size_t max_message = 72 * 1024;
constexpr int server_handshake_ms = 10000;
constexpr size_t max_connections = 4096;
constexpr int accepts_per_event = 64;
constexpr uint16_t protocol_version = 1;
constexpr const char* server_role = "libcomm-cm-server";
constexpr const char* client_role = "libcomm-cm-client";
/// Host names being resolved at once, process-wide (each on a thread of its own).
constexpr int max_lookups = 64;

/// Where a connection is in the handshake.
enum class stage : uint8_t {
  resolving,        ///< client: the host name is being resolved on a thread
  connecting,       ///< client: nonblocking connect under way
  await_challenge,  ///< client: hello sent
  await_reply,      ///< client: request sent
  await_hello,      ///< server: accepted
  await_request,    ///< server: challenge sent
  handed_over,      ///< server: request given to the protocol layer
  await_confirm,    ///< server: reply sent
  closing,          ///< last bytes going out, then closed
  dead,             ///< closed, to be released
};

/// What an epoll registration points at.
struct pollable {
  bool is_listener = false;
};

class tcp_cm;
class tcp_cm_listener;

/// Splits "host:port", ":port", "host" or "" into a host ("0.0.0.0" when empty or "*") and a
/// port (0 when absent); false when the port is not a number up to 65535.
bool split_address(const std::string& text, std::string* host, uint16_t* port) {
  *host = text;
  std::string digits = "0";
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    *host = text.substr(0, colon);
    digits = text.substr(colon + 1);
  }
  if (host->empty() || *host == "*") *host = "0.0.0.0";
  if (digits.empty() || digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const unsigned long number = std::stoul(digits);
  if (number > 65535) return false;
  *port = static_cast<uint16_t>(number);
  return true;
}

/// Resolves `host` to an IPv4 address (blocking: a numeric one at once, a name through the
/// system's resolver); false when it does not resolve.
bool resolve(const std::string& host, in_addr* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return false;
  *out = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  return true;
}

/// Parses and resolves "host:port" (see split_address) into an IPv4 address, blocking on a name.
bool parse_address(const std::string& text, sockaddr_in* out) {
  std::string host;
  uint16_t port = 0;
  if (!split_address(text, &host, &port) || !resolve(host, &out->sin_addr)) return false;
  out->sin_family = AF_INET;
  out->sin_port = htons(port);
  return true;
}

/// Host names resolving right now, process-wide.
std::atomic<int> lookups_running{0};

/// A host name resolved on a thread of its own, so that connect never blocks the worker. The
/// thread and the connection share it; `ready` (an eventfd, watched by the connection manager)
/// says when `done` is set. The last owner closes `ready`, so the thread never writes to a
/// descriptor that was closed and reused.
struct name_lookup {
  std::mutex mtx;
  bool done = false;
  bool resolved = false;
  in_addr address{};
  int ready = -1;

  name_lookup() : ready(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~name_lookup() {
    if (ready >= 0) ::close(ready);
  }
  name_lookup(const name_lookup&) = delete;
  name_lookup& operator=(const name_lookup&) = delete;

  /// Starts resolving `host` on a detached thread; false when no thread could be started.
  static bool start(const std::shared_ptr<name_lookup>& lookup, std::string host) {
    if (lookup->ready < 0) return false;
    if (lookups_running.fetch_add(1) >= max_lookups) {
      lookups_running.fetch_sub(1);
      return false;
    }
    try {
      std::thread([lookup, host = std::move(host)] { lookup->run(host); }).detach();
    } catch (const std::system_error&) {
      lookups_running.fetch_sub(1);
      return false;
    }
    return true;
  }

  /// The thread's work: resolve, publish, signal.
  void run(const std::string& host) {
    in_addr found{};
    const bool ok = resolve(host, &found);
    {
      std::lock_guard<std::mutex> g(mtx);
      done = true;
      resolved = ok;
      address = found;
    }
    const uint64_t one = 1;
    (void)!::write(ready, &one, sizeof(one));
    lookups_running.fetch_sub(1);
  }
};


std::string address_text(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(address.sin_port));
}

bool is_loopback(const sockaddr_in& address) {
  return (ntohl(address.sin_addr.s_addr) >> 24) == 127;
}

/// Serialises a CmMessage into a length-prefixed frame appended to `out`.
void append_frame(capnp::MessageBuilder& message, std::vector<uint8_t>& out) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  const uint32_t length = static_cast<uint32_t>(bytes.size());
  const uint8_t prefix[4] = {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
                             static_cast<uint8_t>(length >> 16),
                             static_cast<uint8_t>(length >> 24)};
  out.insert(out.end(), prefix, prefix + 4);
  out.insert(out.end(), bytes.begin(), bytes.end());
}

kj::ArrayPtr<const kj::byte> bytes_of(const uint8_t* data, size_t length) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(data), length);
}

/// One connection of the connection manager, client or server side.
class socket_conn final : public cm_conn, public pollable {
public:
  socket_conn(int fd, bool server, const sockaddr_in& peer, std::string key)
      : fd_(fd), server_(server), peer_(peer), key_(std::move(key)) {
    own_nonce_ = auth::make_nonce();
  }
  ~socket_conn() override {
    if (server_ && !answered_ && fd_ >= 0) reject();
    close_socket();
  }

  std::string peer_address() const override { return address_text(peer_); }

  void reject() override {
    if (answered_ || fd_ < 0) return;
    answered_ = true;
    queue_reply(status::rejected, nullptr, 0);
    // Best effort: the socket is idle, so the short reply goes out in one write.
    (void)flush();
    close_socket();
    at = stage::dead;
  }

  void close_socket() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  /// Queues a reply {status, private data}.
  void queue_reply(status st, const uint8_t* data, size_t length) {
    capnp::MallocMessageBuilder message;
    auto reply = message.initRoot<schema::CmMessage>().initReply();
    reply.setStatus(static_cast<int16_t>(st));
    if (length != 0) reply.setPrivateData(bytes_of(data, length));
    append_frame(message, tx_);
  }

  /// Writes queued bytes; false on a socket error.
  bool flush() {
    while (tx_done_ < tx_.size()) {
      const ssize_t n = ::send(fd_, tx_.data() + tx_done_, tx_.size() - tx_done_, MSG_NOSIGNAL);
      if (n > 0) {
        tx_done_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    tx_.clear();
    tx_done_ = 0;
    return true;
  }

  bool wants_write() const { return tx_done_ < tx_.size() || at == stage::connecting; }

  int fd_;
  bool server_;
  sockaddr_in peer_;
  std::string key_;
  stage at = stage::connecting;
  bool answered_ = false;            ///< server: a reply was sent (or the request is handed over)
  status failure = status::ok;       ///< client: a failure to report at the next progress
  auth::nonce own_nonce_{};
  auth::nonce peer_nonce_{};
  std::vector<uint8_t> private_data; ///< client: what the request carries
  std::vector<uint8_t> rx_;
  std::vector<uint8_t> tx_;
  size_t tx_done_ = 0;
  clock_type::time_point deadline;
  tcp_cm_listener* listener = nullptr; ///< server: where it was accepted
  std::shared_ptr<name_lookup> lookup; ///< client, while resolving: the host name's resolution
};

/// A listening socket.
class tcp_cm_listener final : public cm_listener, public pollable {
public:
  tcp_cm_listener(tcp_cm* owner, int fd, const sockaddr_in& bound)
      : owner_(owner), fd_(fd), bound_(bound) {
    is_listener = true;
  }
  ~tcp_cm_listener() override;

  std::string address() const override { return address_text(bound_); }
  uint16_t port() const override { return ntohs(bound_.sin_port); }
  uint64_t requests() const override { return requests_; }

  tcp_cm* owner_;
  int fd_;
  sockaddr_in bound_;
  uint64_t requests_ = 0;
};

/// The connection manager.
class tcp_cm final : public cm {
public:
  explicit tcp_cm(const cm_params& params) : params_(params) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &ev);
  }

  ~tcp_cm() override {
    for (tcp_cm_listener* l : listeners_) l->owner_ = nullptr;
    conns_.clear();
    ::close(timer_fd_);
    ::close(epoll_fd_);
  }

  bool ok() const { return epoll_fd_ >= 0 && timer_fd_ >= 0; }

  int event_fd() const override { return epoll_fd_; }

  bool active() const override { return !listeners_.empty() || !conns_.empty(); }

  status listen(const std::string& address, int backlog,
                std::unique_ptr<cm_listener>& out) override {
    sockaddr_in where{};
    if (!parse_address(address, &where)) return status::invalid_addr;
    narrow_without_key(where);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return status::io_error;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&where), sizeof(where)) != 0) {
      const int error = errno;
      ::close(fd);
      COMM_LOG(warn, log_name, "cannot listen on %s: %s", address_text(where).c_str(),
               std::strerror(error));
      return error == EADDRINUSE ? status::busy : status::invalid_addr;
    }
    socklen_t length = sizeof(where);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&where), &length);
    if (::listen(fd, backlog > 0 ? backlog : SOMAXCONN) != 0) {
      ::close(fd);
      return status::io_error;
    }
    auto made = std::make_unique<tcp_cm_listener>(this, fd, where);
    watch(fd, made.get(), EPOLLIN);
    listeners_.push_back(made.get());
    COMM_LOG(info, log_name, "listening on %s%s", made->address().c_str(),
             params_.auth_key.empty() ? " (no auth key)" : " (auth key required)");
    out = std::move(made);
    return status::ok;
  }

  status connect(const std::string& address, const uint8_t* data, size_t length, int timeout_ms,
                 cm_conn** out) override {
    std::string host;
    uint16_t port = 0;
    if (!split_address(address, &host, &port) || port == 0) return status::invalid_addr;
    sockaddr_in where{};
    where.sin_family = AF_INET;
    where.sin_port = htons(port);
    auto conn = std::make_unique<socket_conn>(-1, false, where, params_.auth_key);
    conn->private_data.assign(data, data + length);
    conn->deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
    if (::inet_pton(AF_INET, host.c_str(), &conn->peer_.sin_addr) == 1) {
      // A dotted address: nothing to resolve.
      if (const status st = start_connect(conn.get()); st != status::ok) return st;
    } else {
      // A name: resolved on a thread, the connect starts when it is known (on_lookup).
      conn->lookup = std::make_shared<name_lookup>();
      if (!name_lookup::start(conn->lookup, host)) return status::busy;
      conn->at = stage::resolving;
      watch(conn->lookup->ready, conn.get(), EPOLLIN);
    }
    *out = conn.get();
    conns_.push_back(std::move(conn));
    return status::ok;
  }

  status accept(std::unique_ptr<cm_conn> handed, const uint8_t* data, size_t length,
                int timeout_ms, cm_conn** out) override {
    auto* conn = dynamic_cast<socket_conn*>(handed.get());
    if (conn == nullptr || !conn->server_ || conn->at != stage::handed_over || conn->fd_ < 0)
      return status::invalid_param;
    handed.release();
    conn->answered_ = true;
    conn->queue_reply(status::ok, data, length);
    conn->at = stage::await_confirm;
    conn->deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
    watch(conn->fd_, conn, EPOLLIN | EPOLLOUT);
    conns_.emplace_back(conn);
    *out = conn;
    return status::ok;
  }

  void close(cm_conn* target) override {
    for (auto& conn : conns_) {
      if (conn.get() == target) retire(conn.get());
    }
  }

  unsigned progress() override {
    epoll_event events[32];
    const int n = ::epoll_wait(epoll_fd_, events, 32, 0);
    unsigned handled = 0;
    const uint64_t drops = listeners_dropped_;
    // A handler may destroy a listener whose event is still in this batch: stop there (the
    // events are level triggered and come back at the next call).
    for (int i = 0; i < n && drops == listeners_dropped_; ++i) {
      auto* target = static_cast<pollable*>(events[i].data.ptr);
      if (target == nullptr) {
        uint64_t expirations;
        (void)!::read(timer_fd_, &expirations, sizeof(expirations));
        continue;
      }
      ++handled;
      if (target->is_listener) {
        accept_clients(static_cast<tcp_cm_listener*>(target));
      } else {
        on_socket(static_cast<socket_conn*>(target), events[i].events);
      }
    }
    handled += expire();
    reap();
    arm_timer();
    return handled;
  }

  /// Forgets a listener being destroyed.
  void drop_listener(tcp_cm_listener* l) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, l->fd_, nullptr);
    ++listeners_dropped_;
    listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), l), listeners_.end());
    for (auto& conn : conns_) {
      if (conn->listener == l) conn->listener = nullptr;
    }
  }

private:
  void narrow_without_key(sockaddr_in& where) const {
    if (!params_.auth_key.empty()) return;
    if (where.sin_addr.s_addr == htonl(INADDR_ANY)) {
      where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      COMM_LOG(warn, log_name,
               "no auth key (COMM_AUTH_KEY): listening on loopback only; set a key to accept "
               "clients from other hosts");
    } else if (!is_loopback(where)) {
      COMM_LOG(warn, log_name, "listening on %s without an auth key: anyone who reaches it may "
               "connect", address_text(where).c_str());
    }
  }

  void watch(int fd, pollable* target, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = target;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev) != 0) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
  }

  void update_interest(socket_conn* conn) {
    if (conn->fd_ < 0) return;
    watch(conn->fd_, conn, EPOLLIN | (conn->wants_write() ? EPOLLOUT : 0u));
  }

  /// Opens the socket of client `conn` (its peer address known) and starts a nonblocking connect.
  status start_connect(socket_conn* conn) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return status::io_error;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conn->fd_ = fd;
    conn->at = stage::connecting;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&conn->peer_), sizeof(conn->peer_)) != 0 &&
        errno != EINPROGRESS) {
      // Reported from progress(), like every other outcome.
      conn->failure = status_of_errno(errno, true);
      arm_timer_now();
    }
    watch(fd, conn, EPOLLIN | EPOLLOUT);
    return status::ok;
  }

  /// The host name of client `conn` resolved (or did not): connect, or fail it as unreachable.
  void on_lookup(socket_conn* conn) {
    bool resolved = false;
    {
      std::lock_guard<std::mutex> g(conn->lookup->mtx);
      if (!conn->lookup->done) return;  // the eventfd is written only after done is set
      resolved = conn->lookup->resolved;
      conn->peer_.sin_addr = conn->lookup->address;
    }
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->lookup->ready, nullptr);
    conn->lookup.reset();
    if (!resolved) {
      COMM_LOG(info, log_name, "cannot resolve the host to connect to: unreachable");
      fail(conn, status::unreachable);
      return;
    }
    const status st = start_connect(conn);
    if (st != status::ok) fail(conn, st);
  }

  /// Marks a connection closed; it is released at the end of progress().
  void retire(socket_conn* conn) {
    if (conn->at == stage::dead) return;
    if (conn->lookup) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->lookup->ready, nullptr);
      conn->lookup.reset();
    }
    if (conn->fd_ >= 0) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->fd_, nullptr);
    conn->answered_ = true;
    conn->close_socket();
    conn->at = stage::dead;
  }

  void reap() {
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::unique_ptr<socket_conn>& c) {
                                  return c->at == stage::dead;
                                }),
                 conns_.end());
  }

  void fail(socket_conn* conn, status reason) {
    if (conn->at == stage::dead) return;
    const bool tell = conn->at != stage::closing &&
                      (!conn->server_ || conn->at == stage::await_confirm);
    retire(conn);
    if (tell) params_.handler->on_failed(conn, reason);
  }

  void establish(socket_conn* conn, const uint8_t* data, size_t length) {
    if (conn->wants_write()) {
      conn->at = stage::closing;
      update_interest(conn);
    } else {
      retire(conn);
    }
    params_.handler->on_established(conn, data, length);
    if (conn->at == stage::closing) conn->deadline = clock_type::now() + std::chrono::seconds(1);
  }

  void accept_clients(tcp_cm_listener* l) {
    for (int i = 0; i < accepts_per_event; ++i) {
      sockaddr_in peer{};
      socklen_t length = sizeof(peer);
      const int fd = ::accept4(l->fd_, reinterpret_cast<sockaddr*>(&peer), &length,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (conns_.size() >= max_connections) {
        COMM_LOG(warn, log_name, "too many connections under way: closing one from %s",
                 address_text(peer).c_str());
        ::close(fd);
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto conn = std::make_unique<socket_conn>(fd, true, peer, params_.auth_key);
      conn->at = stage::await_hello;
      conn->listener = l;
      conn->deadline = clock_type::now() + std::chrono::milliseconds(server_handshake_ms);
      watch(fd, conn.get(), EPOLLIN);
      conns_.push_back(std::move(conn));
    }
  }

  void on_socket(socket_conn* conn, uint32_t events) {
    if (conn->at == stage::dead) return;
    if (conn->at == stage::resolving) {
      on_lookup(conn);
      return;
    }
    if (conn->at == stage::connecting) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(conn->fd_, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        fail(conn, status_of_errno(error, true));
        return;
      }
      send_hello(conn);
    }
    if (events & EPOLLIN) read_frames(conn);
    // Handed over: no longer ours to touch.
    if (conn->at == stage::dead || conn->at == stage::handed_over) return;
    if (!conn->flush()) {
      fail(conn, status::connection_reset);
      return;
    }
    if (conn->at == stage::closing && !conn->wants_write()) {
      retire(conn);
      return;
    }
    update_interest(conn);
  }

  void send_hello(socket_conn* conn) {
    capnp::MallocMessageBuilder message;
    auto hello = message.initRoot<schema::CmMessage>().initHello();
    hello.setVersion(protocol_version);
    hello.setNonce(bytes_of(conn->own_nonce_.data(), conn->own_nonce_.size()));
    append_frame(message, conn->tx_);
    conn->at = stage::await_challenge;
  }

  /// Reads what the socket has and handles every complete frame.
  void read_frames(socket_conn* conn) {
    uint8_t chunk[16384];
    for (;;) {
      const ssize_t n = ::recv(conn->fd_, chunk, sizeof(chunk), 0);
      if (n > 0) {
        conn->rx_.insert(conn->rx_.end(), chunk, chunk + n);
        if (conn->rx_.size() > max_message + 4) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      handle_frames(conn);
      if (conn->at == stage::handed_over) return;  // its end is seen when it comes back
      if (conn->at != stage::dead && conn->at != stage::closing) {
        fail(conn, conn->at == stage::await_challenge ? status::unreachable
                                                      : status::connection_reset);
      } else if (conn->at == stage::closing) {
        retire(conn);
      }
      return;
    }
    handle_frames(conn);
  }

  void handle_frames(socket_conn* conn) {
    size_t used = 0;
    while (conn->at != stage::dead && conn->at != stage::handed_over &&
           conn->rx_.size() - used >= 4) {
      const uint8_t* p = conn->rx_.data() + used;
      const uint32_t length = p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t{p[3]} << 24);
      if (length == 0 || length % 8 != 0 || length > max_message) {
        garbage(conn, "a frame with an impossible length");
        return;
      }
      if (conn->rx_.size() - used < 4 + size_t{length}) break;
      handle_message(conn, p + 4, length);
      used += 4 + size_t{length};
    }
    if (conn->at != stage::dead) conn->rx_.erase(conn->rx_.begin(), conn->rx_.begin() + used);
  }

  void garbage(socket_conn* conn, const char* what) {
    ++protocol_errors_;
    COMM_LOG(warn, log_name, "%s sent %s: connection closed", conn->peer_address().c_str(), what);
    fail(conn, status::protocol_error);
  }

  void handle_message(socket_conn* conn, const uint8_t* data, size_t length) {
    auto words = kj::heapArray<capnp::word>(length / 8);
    std::memcpy(words.begin(), data, length);
    bool valid = true;
    kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
      capnp::FlatArrayMessageReader reader(words, wire::checked_reader_options());
      valid = dispatch(conn, reader.getRoot<schema::CmMessage>());
    });
    if (failure != nullptr || !valid) garbage(conn, "a message out of place or malformed");
  }

  /// Handles one message; false when it does not belong to the connection's stage.
  bool dispatch(socket_conn* conn, schema::CmMessage::Reader message) {
    switch (conn->at) {
      case stage::await_challenge:
        return message.isChallenge() && on_challenge(conn, message.getChallenge());
      case stage::await_reply:
        return message.isReply() && on_reply(conn, message.getReply());
      case stage::await_hello:
        return message.isHello() && on_hello(conn, message.getHello());
      case stage::await_request:
        return message.isRequest() && on_request(conn, message.getRequest());
      case stage::await_confirm:
        if (!message.isConfirm()) return false;
        establish(conn, nullptr, 0);
        return true;
      default:
        return false;
    }
  }

  bool on_challenge(socket_conn* conn, schema::CmChallenge::Reader challenge) {
    auto nonce = challenge.getNonce();
    if (nonce.size() != auth::nonce_size) return false;
    std::memcpy(conn->peer_nonce_.data(), nonce.begin(), auth::nonce_size);
    const auto& key = conn->key_;
    if (!key.empty()) {
      auto proof = challenge.getProof();
      if (!auth::check_proof(key, server_role, conn->own_nonce_.data(), auth::nonce_size,
                             conn->peer_nonce_.data(), auth::nonce_size, proof.begin(),
                             proof.size())) {
        COMM_LOG(warn, log_name, "server %s did not prove the cluster key: refused",
                 conn->peer_address().c_str());
        fail(conn, status::rejected);
        return true;
      }
    }
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<schema::CmMessage>().initRequest();
    if (!key.empty()) {
      const auth::proof proof = auth::make_proof(key, client_role, conn->peer_nonce_.data(),
                                                 auth::nonce_size, conn->own_nonce_.data(),
                                                 auth::nonce_size);
      request.setProof(bytes_of(proof.data(), proof.size()));
    }
    request.setPrivateData(bytes_of(conn->private_data.data(), conn->private_data.size()));
    append_frame(message, conn->tx_);
    conn->private_data.clear();
    conn->at = stage::await_reply;
    return true;
  }

  bool on_reply(socket_conn* conn, schema::CmReply::Reader reply) {
    const auto st = static_cast<status>(reply.getStatus());
    if (st != status::ok) {
      if (!is_error(st)) return false;
      fail(conn, st);
      return true;
    }
    capnp::MallocMessageBuilder message;
    message.initRoot<schema::CmMessage>().setConfirm();
    append_frame(message, conn->tx_);
    auto data = reply.getPrivateData();
    establish(conn, data.begin(), data.size());
    return true;
  }

  bool on_hello(socket_conn* conn, schema::CmHello::Reader hello) {
    auto nonce = hello.getNonce();
    if (hello.getVersion() != protocol_version || nonce.size() != auth::nonce_size) return false;
    std::memcpy(conn->peer_nonce_.data(), nonce.begin(), auth::nonce_size);
    capnp::MallocMessageBuilder message;
    auto challenge = message.initRoot<schema::CmMessage>().initChallenge();
    challenge.setNonce(bytes_of(conn->own_nonce_.data(), conn->own_nonce_.size()));
    if (!conn->key_.empty()) {
      const auth::proof proof = auth::make_proof(conn->key_, server_role,
                                                 conn->peer_nonce_.data(), auth::nonce_size,
                                                 conn->own_nonce_.data(), auth::nonce_size);
      challenge.setProof(bytes_of(proof.data(), proof.size()));
    }
    append_frame(message, conn->tx_);
    conn->at = stage::await_request;
    return true;
  }

  bool on_request(socket_conn* conn, schema::CmRequest::Reader request) {
    if (!conn->key_.empty()) {
      auto proof = request.getProof();
      if (!auth::check_proof(conn->key_, client_role, conn->own_nonce_.data(), auth::nonce_size,
                             conn->peer_nonce_.data(), auth::nonce_size, proof.begin(),
                             proof.size())) {
        ++auth_failures_;
        COMM_LOG(warn, log_name, "client %s failed authentication: rejected",
                 conn->peer_address().c_str());
        conn->answered_ = true;
        conn->queue_reply(status::rejected, nullptr, 0);
        conn->at = stage::closing;
        conn->deadline = clock_type::now() + std::chrono::seconds(1);
        return true;
      }
    }
    tcp_cm_listener* from = conn->listener;
    if (from == nullptr) {
      retire(conn);
      return true;
    }
    hand_over(conn, from, request.getPrivateData());
    return true;
  }

  void hand_over(socket_conn* conn, tcp_cm_listener* from, capnp::Data::Reader data) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->fd_, nullptr);
    conn->at = stage::handed_over;
    conn->listener = nullptr;
    auto it = std::find_if(conns_.begin(), conns_.end(),
                           [&](const std::unique_ptr<socket_conn>& c) { return c.get() == conn; });
    std::unique_ptr<socket_conn> owned = std::move(*it);
    conns_.erase(it);
    ++from->requests_;
    params_.handler->on_request(from, std::move(owned), data.begin(), data.size());
  }

  /// Fails connections past their deadline, and reports failures found while connecting.
  unsigned expire() {
    if (conns_.empty()) return 0;
    const auto now = clock_type::now();
    unsigned n = 0;
    for (size_t i = 0; i < conns_.size(); ++i) {
      socket_conn* conn = conns_[i].get();
      if (conn->at == stage::dead) continue;
      if (conn->failure != status::ok) {
        fail(conn, conn->failure);
        ++n;
      } else if (now >= conn->deadline) {
        if (conn->server_ && conn->at != stage::await_confirm) {
          COMM_LOG(debug, log_name, "handshake with %s timed out: dropped",
                   conn->peer_address().c_str());
        }
        const bool reaching = conn->at == stage::connecting || conn->at == stage::resolving;
        fail(conn, reaching ? status::unreachable : status::endpoint_timeout);
        ++n;
      }
    }
    return n;
  }

  void arm_timer_now() {
    itimerspec spec{};
    spec.it_value.tv_nsec = 1;
    ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
  }

  /// Arms the timer for the earliest deadline, so a sleeping owner wakes to time it out.
  void arm_timer() {
    itimerspec spec{};
    if (!conns_.empty()) {
      auto earliest = clock_type::time_point::max();
      for (const auto& conn : conns_) earliest = std::min(earliest, conn->deadline);
      const auto wait = std::max<clock_type::duration>(earliest - clock_type::now(),
                                                       std::chrono::microseconds(1));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
      spec.it_value.tv_sec = ns / 1000000000;
      spec.it_value.tv_nsec = ns % 1000000000;
    }
    ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
  }

  cm_params params_;
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  std::vector<tcp_cm_listener*> listeners_;
  std::vector<std::unique_ptr<socket_conn>> conns_;
  uint64_t listeners_dropped_ = 0;
  uint64_t protocol_errors_ = 0;
  uint64_t auth_failures_ = 0;
};

tcp_cm_listener::~tcp_cm_listener() {
  if (owner_ != nullptr) owner_->drop_listener(this);
  ::close(fd_);
}

}  // namespace

status open_tcp_cm(const cm_params& params, std::unique_ptr<cm>& out) {
  if (params.handler == nullptr) return status::invalid_param;
  auto made = std::make_unique<tcp_cm>(params);
  if (!made->ok()) return status::io_error;
  out = std::move(made);
  return status::ok;
}

}  // namespace comm::tl::tcp
