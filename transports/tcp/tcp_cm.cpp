// The tcp connection manager: listeners, the handshake state machine, admission of clients under
// load, timeouts (see tcp_cm.hpp).
#include "tcp/tcp_cm.hpp"
#include "tcp/tcp_address.hpp"
#include "tcp/tcp_config.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp.capnp.h"

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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace comm::tl::tcp {

namespace schema = wire::schema;

// -- wire format ----------------------------------------------------------------------------------

namespace {

std::vector<uint8_t> copy_of(capnp::Data::Reader data) {
  return std::vector<uint8_t>(data.begin(), data.end());
}

kj::ArrayPtr<const kj::byte> bytes_of(const std::vector<uint8_t>& data) {
  return kj::arrayPtr(data.data(), data.size());
}

/// Copies the fields of `root` into `out`; false for a union member this version does not know.
bool read_message(schema::CmMessage::Reader root, cm_message* out) {
  switch (root.which()) {
    case schema::CmMessage::HELLO:
      out->type = cm_message::kind::hello;
      out->version = root.getHello().getVersion();
      out->nonce = copy_of(root.getHello().getNonce());
      return true;
    case schema::CmMessage::CHALLENGE:
      out->type = cm_message::kind::challenge;
      out->nonce = copy_of(root.getChallenge().getNonce());
      out->proof = copy_of(root.getChallenge().getProof());
      return true;
    case schema::CmMessage::REQUEST:
      out->type = cm_message::kind::request;
      out->proof = copy_of(root.getRequest().getProof());
      out->private_data = copy_of(root.getRequest().getPrivateData());
      return true;
    case schema::CmMessage::REPLY:
      out->type = cm_message::kind::reply;
      out->status = root.getReply().getStatus();
      out->private_data = copy_of(root.getReply().getPrivateData());
      return true;
    case schema::CmMessage::CONFIRM:
      out->type = cm_message::kind::confirm;
      return true;
  }
  return false;
}

/// Fills the builder's root from `message`.
void write_message(const cm_message& message, schema::CmMessage::Builder root) {
  switch (message.type) {
    case cm_message::kind::hello: {
      auto hello = root.initHello();
      hello.setVersion(message.version);
      hello.setNonce(bytes_of(message.nonce));
      break;
    }
    case cm_message::kind::challenge: {
      auto challenge = root.initChallenge();
      challenge.setNonce(bytes_of(message.nonce));
      challenge.setProof(bytes_of(message.proof));
      break;
    }
    case cm_message::kind::request: {
      auto request = root.initRequest();
      request.setProof(bytes_of(message.proof));
      request.setPrivateData(bytes_of(message.private_data));
      break;
    }
    case cm_message::kind::reply: {
      auto reply = root.initReply();
      reply.setStatus(message.status);
      reply.setPrivateData(bytes_of(message.private_data));
      break;
    }
    case cm_message::kind::confirm:
      root.setConfirm();
      break;
  }
}

}  // namespace

cm_frame find_cm_frame(const uint8_t* data, size_t size, size_t max_length) {
  cm_frame frame;
  if (size < cm_frame_prefix) return frame;
  const uint32_t length = uint32_t{data[0]} | (uint32_t{data[1]} << 8) |
                          (uint32_t{data[2]} << 16) | (uint32_t{data[3]} << 24);
  if (length == 0 || length % 8 != 0 || length > max_length) {
    frame.at = cm_frame::state::invalid;
  } else if (size - cm_frame_prefix >= length) {
    frame.at = cm_frame::state::complete;
    frame.length = length;
  }
  return frame;
}

bool parse_cm_message(const uint8_t* data, size_t length, cm_message* out) {
  bool known = false;
  const bool valid = wire::read_checked_message<schema::CmMessage>(
      data, length, [&](schema::CmMessage::Reader root) { known = read_message(root, out); });
  return valid && known;
}

std::vector<uint8_t> encode_cm_message(const cm_message& message) {
  capnp::MallocMessageBuilder builder;
  write_message(message, builder.initRoot<schema::CmMessage>());
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  const auto length = static_cast<uint32_t>(bytes.size());
  std::vector<uint8_t> frame(cm_frame_prefix + bytes.size());
  for (size_t i = 0; i < cm_frame_prefix; ++i) frame[i] = static_cast<uint8_t>(length >> (8 * i));
  std::memcpy(frame.data() + cm_frame_prefix, bytes.begin(), bytes.size());
  return frame;
}

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* log_name = "cm";
/// Largest request or reply: the largest private data and the message around it.
constexpr size_t max_message = 72 * 1024;
/// Bytes of a request or reply message besides its private data (a proof and the pointers).
constexpr size_t message_overhead = 256;
/// Largest private data either side sends (cm_attr::max_conn_priv and max_reply_priv).
constexpr size_t max_private_data = max_message - message_overhead;
/// Largest hello, challenge or confirm: a nonce, a proof and the message around them.
constexpr size_t max_small_message = 256;
constexpr int accepts_per_event = 64;
/// How long accepting pauses when the process is out of descriptors and nothing can be shed.
constexpr milliseconds accept_pause{100};
/// How long a connection that is closing may take to send its last bytes.
constexpr std::chrono::seconds closing_linger{1};
/// Shortest interval between two warnings of a kind a flood repeats (see throttled_warning).
constexpr std::chrono::seconds warning_interval{10};
constexpr uint16_t protocol_version = 1;
constexpr const char* server_role = "libcomm-cm-server";
constexpr const char* client_role = "libcomm-cm-client";
/// Host names being resolved at once, process-wide (each on a thread of its own).
constexpr int max_lookups = 64;
/// A deadline that never comes.
constexpr clock_type::time_point never = clock_type::time_point::max();

// -- limits ---------------------------------------------------------------------------------------

/// The server's limits on unauthenticated handshakes (see tcp_cm.hpp).
struct cm_limits {
  size_t max_handshakes = 1024;
  milliseconds hello_timeout{3000};
  milliseconds handshake_timeout{10000};
};

/// The limits the COMM_TCP_CM_* knobs set.
cm_limits limits_of(const tcp_config& config) {
  cm_limits limits;
  limits.max_handshakes = config.cm_max_handshakes;
  limits.handshake_timeout = milliseconds(config.cm_handshake_timeout_ms);
  limits.hello_timeout =
      milliseconds(std::min(config.cm_hello_timeout_ms, config.cm_handshake_timeout_ms));
  return limits;
}

/// Unauthenticated handshakes this process may hold now: the configured limit, and at most a
/// quarter of its descriptor limit.
size_t handshake_cap(const cm_limits& limits) {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) {
    return limits.max_handshakes;
  }
  return std::clamp<size_t>(files.rlim_cur / 4, 1, limits.max_handshakes);
}

/// True for the accept(2) errors that mean the process or the system is out of descriptors or
/// socket memory.
bool out_of_descriptors(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}

/// A warning printed at most once per warning_interval, with how often it happened meanwhile.
class throttled_warning {
public:
  /// Counts one occurrence; true when it is time to print, with `*since` the occurrences since
  /// the last print.
  bool due(uint64_t* since) {
    ++count_;
    const auto now = clock_type::now();
    if (now < next_) return false;
    *since = count_;
    count_ = 0;
    next_ = now + warning_interval;
    return true;
  }

private:
  uint64_t count_ = 0;
  clock_type::time_point next_{};
};

// -- stages ---------------------------------------------------------------------------------------

/// Where a connection is in the handshake.
enum class stage : uint8_t {
  resolving,        ///< client: the host name (in a flow, also the route) is being resolved
  resolved,         ///< flow client: resolved, waiting for cm_conn::connect
  connecting,       ///< client: nonblocking connect under way
  await_challenge,  ///< client: hello sent
  await_reply,      ///< client: request sent
  await_hello,      ///< server: accepted
  await_request,    ///< server: challenge sent
  handed_over,      ///< server: request given to the protocol layer
  await_confirm,    ///< server: reply sent
  connected,        ///< flow: established; the socket stays for the disconnect
  closing,          ///< last bytes going out, then closed
  dead,             ///< closed (a flow connection stays until its owner closes it)
};

/// The largest message a connection at stage `at` may receive: only a request or a reply may be
/// large.
size_t max_message_in(stage at) {
  return at == stage::await_request || at == stage::await_reply ? max_message : max_small_message;
}

/// What an epoll registration points at.
struct pollable {
  bool is_listener = false;
};

// -- host names -----------------------------------------------------------------------------------

/// Host names resolving right now, process-wide.
std::atomic<int> lookups_running{0};

/// A host name resolved on a thread of its own, so that connect never blocks the worker. The
/// thread and the connection share it; `ready` (an eventfd, watched by the connection manager)
/// says when `done` is set. The last owner closes `ready`, so the thread never writes to a
/// descriptor that was closed and reused.
struct name_lookup {
  std::mutex mtx;
  bool done = false;
  std::vector<ip_address> addresses;  ///< what it resolved to, in the resolver's order
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
    std::vector<ip_address> found = resolve_host(host);
    {
      std::lock_guard<std::mutex> g(mtx);
      done = true;
      addresses = std::move(found);
    }
    const uint64_t one = 1;
    (void)!::write(ready, &one, sizeof(one));
    lookups_running.fetch_sub(1);
  }
};

/// The address to listen on for `host` (blocking on a name): a numeric one as it is; a name's
/// first IPv4 address, else its first (a name that resolves both ways listens on IPv4, as it did
/// before IPv6; clients connecting by that name try every address).
bool listen_address_of(const std::string& host, ip_address* out) {
  if (parse_numeric_host(host, out)) return true;
  const std::vector<ip_address> all = resolve_host(host);
  if (all.empty()) return false;
  const auto v4 =
      std::find_if(all.begin(), all.end(), [](const ip_address& a) { return a.is_v4(); });
  *out = v4 != all.end() ? *v4 : all.front();
  return true;
}

std::vector<uint8_t> copy_of(const auth::nonce& nonce) {
  return std::vector<uint8_t>(nonce.begin(), nonce.end());
}

/// What unauthenticated handshakes are counted by: an IPv4 address, or an IPv6 /64 (a host
/// usually holds a whole /64, so counting single IPv6 addresses would let one host flood from
/// many of them).
struct source_key {
  int family = AF_UNSPEC;
  uint64_t bits = 0;
  bool operator==(const source_key& other) const = default;
};

struct source_hash {
  size_t operator()(const source_key& key) const {
    return std::hash<uint64_t>()(key.bits ^ static_cast<uint64_t>(key.family));
  }
};

source_key source_of(const ip_address& address) {
  source_key key;
  key.family = address.family;
  if (address.is_v6()) {
    std::memcpy(&key.bits, address.bytes, sizeof(key.bits));  // the /64
  } else {
    key.bits = address.ipv4();
  }
  return key;
}

// -- connections ----------------------------------------------------------------------------------

class tcp_cm;
class tcp_cm_listener;

/// One connection of the connection manager, client or server side, short handshake or flow.
class socket_conn final : public cm_conn, public pollable {
public:
  socket_conn(tcp_cm* owner, int fd, bool server, const ip_address& peer, uint16_t peer_port,
              std::string key)
      : fd_(fd), server_(server), peer_(peer), peer_port_(peer_port), key_(std::move(key)),
        owner_(owner) {
    own_nonce_ = auth::make_nonce();
  }
  ~socket_conn() override {
    if (server_ && !answered_ && fd_ >= 0) reject(status::rejected);
    close_socket();
  }

  std::string peer_address() const override { return address_text(peer_, peer_port_); }

  void reject(status reason) override {
    if (answered_ || fd_ < 0) return;
    answered_ = true;
    queue_reply(reason, nullptr, 0);
    // Best effort: the socket is idle, so the short reply goes out in one write.
    (void)flush();
    close_socket();
    at = stage::dead;
  }

  std::string device_name() const override;
  status connect(const cm_private_data& data) override;
  status notify() override;
  status disconnect() override;

  /// What its handshakes are counted by.
  source_key source() const { return source_of(peer_); }

  void close_socket() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  /// Queues `message` for sending.
  void queue(const cm_message& message) {
    const std::vector<uint8_t> frame = encode_cm_message(message);
    tx_.insert(tx_.end(), frame.begin(), frame.end());
  }

  /// Queues a reply {status, private data}.
  void queue_reply(status st, const uint8_t* data, size_t length) {
    cm_message reply;
    reply.type = cm_message::kind::reply;
    reply.status = static_cast<int16_t>(st);
    if (length != 0) reply.private_data.assign(data, data + length);
    queue(reply);
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

  /// Reads what the socket has, up to a whole frame of the largest message its stage may
  /// receive; false when the peer closed the connection or the socket failed.
  bool receive() {
    const size_t limit = cm_frame_prefix + max_message_in(at);
    uint8_t chunk[16384];
    while (rx_.size() < limit) {
      const ssize_t n = ::recv(fd_, chunk, std::min(sizeof(chunk), limit - rx_.size()), 0);
      if (n > 0) {
        append_received(chunk, static_cast<size_t>(n), limit);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    return true;
  }

  /// Removes the first `length` received bytes (a frame handled).
  void consume(size_t length) { rx_.erase(rx_.begin(), rx_.begin() + static_cast<long>(length)); }

  int fd_;
  bool server_;
  ip_address peer_;
  uint16_t peer_port_;
  std::string key_;
  tcp_cm* owner_;                    ///< the connection manager that polls it (set by accept)
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
  clock_type::time_point accepted;   ///< server: when it was accepted
  tcp_cm_listener* listener = nullptr; ///< server, until handed over: where it was accepted
  std::shared_ptr<name_lookup> lookup; ///< client, while resolving: the host name's resolution
  bool in_handshakes = false;          ///< server: counted in the handshake table
  std::list<socket_conn*>::iterator age_slot; ///< its place there, while counted
  std::vector<ip_address> candidates;  ///< client: the server's addresses, tried in order
  size_t next_candidate = 0;           ///< client: the next of them to try

  // -- flow --
  cm_flow_handler* flow = nullptr;   ///< the flow's callbacks; null for a short handshake
  milliseconds flow_timeout{0};      ///< flow client: for the server's answer after connect()
  mutable std::string device_;       ///< the local device, once known
  bool established = false;          ///< flow: reached stage connected
  bool notified = false;             ///< flow client: notify() sent the confirm
  bool local_disc = false;           ///< flow: disconnect() was called
  bool remote_disc = false;          ///< flow: the peer disconnected (or is gone)
  bool shut_pending = false;         ///< flow: shut the sending side down once tx_ is out
  bool closed = false;               ///< flow: its owner closed it (released soon)

private:
  /// Appends received bytes, growing the buffer at most to `limit`.
  void append_received(const uint8_t* data, size_t length, size_t limit) {
    const size_t needed = rx_.size() + length;
    if (needed > rx_.capacity()) rx_.reserve(std::min(limit, std::max(needed, 2 * rx_.capacity())));
    rx_.insert(rx_.end(), data, data + length);
  }
};

std::string socket_conn::device_name() const {
  if (device_.empty() && fd_ >= 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      device_ = interface_of(ip_address::of(local));
    }
  }
  return device_;
}

/// The server handshakes not yet past the client's request (unauthenticated), oldest first, with
/// a count per source (an IPv4 address, an IPv6 /64): what a flood of half-open sockets fills, and
/// where handshakes are shed from when there are too many.
class handshake_table {
public:
  size_t size() const { return by_age_.size(); }

  /// Adds `conn` as the newest.
  void add(socket_conn* conn) {
    conn->age_slot = by_age_.insert(by_age_.end(), conn);
    conn->in_handshakes = true;
    ++per_source_[conn->source()];
  }

  /// Removes `conn` if it is counted.
  void remove(socket_conn* conn) {
    if (!conn->in_handshakes) return;
    conn->in_handshakes = false;
    by_age_.erase(conn->age_slot);
    auto it = per_source_.find(conn->source());
    if (--it->second == 0) per_source_.erase(it);
  }

  /// The handshake to shed: the oldest of the source holding the most (of those tied, the one
  /// whose oldest is oldest); null when there is none.
  socket_conn* victim() const {
    size_t most = 0;
    for (const auto& [source, count] : per_source_) most = std::max(most, count);
    for (socket_conn* conn : by_age_) {
      if (per_source_.at(conn->source()) == most) return conn;
    }
    return nullptr;
  }

private:
  std::list<socket_conn*> by_age_;
  std::unordered_map<source_key, size_t, source_hash> per_source_;
};

/// A listening socket.
class tcp_cm_listener final : public cm_listener, public pollable {
public:
  tcp_cm_listener(tcp_cm* owner, int fd, const sockaddr_storage& bound)
      : owner_(owner), fd_(fd), bound_(bound) {
    is_listener = true;
  }
  ~tcp_cm_listener() override;

  std::string address() const override { return address_text(bound_); }
  uint16_t port() const override { return port_of(bound_); }
  uint64_t requests() const override { return requests_; }

  tcp_cm* owner_;
  int fd_;
  sockaddr_storage bound_;
  uint64_t requests_ = 0;
  bool paused = false;                  ///< not accepting until resume_at (out of descriptors)
  clock_type::time_point resume_at{};
};

// -- the connection manager -----------------------------------------------------------------------

/// What became of a connection once its buffered messages were handled.
enum class outcome : uint8_t {
  open,         ///< still in the handshake (or connected), still ours
  handed_over,  ///< given to the handler: not ours to touch any more
  finished,     ///< established, failed or closing
};

/// The connection manager.
class tcp_cm final : public cm {
public:
  /// A connection manager with `params` and the limits of `config`.
  tcp_cm(const cm_params& params, const tcp_config& config)
      : params_(params), limits_(limits_of(config)) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &ev);
  }

  ~tcp_cm() override {
    if (depth_ != 0) {
      COMM_LOG(error, log_name, "the connection manager was destroyed inside one of its own "
               "callbacks (its owner destroyed from a connection callback): aborting");
      std::abort();
    }
    for (tcp_cm_listener* l : listeners_) l->owner_ = nullptr;
    conns_.clear();
    ::close(timer_fd_);
    ::close(epoll_fd_);
  }

  bool ok() const { return epoll_fd_ >= 0 && timer_fd_ >= 0; }

  int event_fd() const override { return epoll_fd_; }

  bool active() const override {
    return !listeners_.empty() ||
           std::any_of(conns_.begin(), conns_.end(), [](const std::unique_ptr<socket_conn>& c) {
             return c->at != stage::dead || c->flow == nullptr || c->closed;
           });
  }

  cm_attr query() const override { return {max_private_data, max_private_data}; }

  status listen(const std::string& address, int backlog,
                std::unique_ptr<cm_listener>& out) override {
    std::string host;
    uint16_t port = 0;
    ip_address ip;
    if (!split_host_port(address, &host, &port) || !listen_address_of(host, &ip)) {
      return status::invalid_addr;
    }
    narrow_without_key(ip);
    const int fd = ::socket(ip.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return status::io_error;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ip.is_v6()) {
      const int v6_only = ip.unspecified() ? 0 : 1;  // [::] takes IPv4 clients too
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6_only, sizeof(v6_only));
    }
    socklen_t length = 0;
    sockaddr_storage where = ip.with_port(port, &length);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&where), length) != 0) {
      const int error = errno;
      ::close(fd);
      COMM_LOG(warn, log_name, "cannot listen on %s: %s", address_text(ip, port).c_str(),
               std::strerror(error));
      return error == EADDRINUSE ? status::busy : status::invalid_addr;
    }
    length = sizeof(where);
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
    if (length > max_private_data) return status::exceeds_limit;
    socket_conn* conn = nullptr;
    const status st = start_client(address, milliseconds(timeout_ms), nullptr, &conn);
    if (st != status::ok) return st;
    conn->private_data.assign(data, data + length);
    *out = conn;
    return status::ok;
  }

  status accept(std::unique_ptr<cm_conn> handed, const uint8_t* data, size_t length,
                int timeout_ms, cm_conn** out) override {
    auto* conn = dynamic_cast<socket_conn*>(handed.get());
    if (!answerable(conn)) return status::invalid_param;
    if (length > max_private_data) return status::exceeds_limit;
    handed.release();
    answer(conn, data, length, milliseconds(timeout_ms));
    *out = conn;
    return status::ok;
  }

  status resolve(const cm_client_params& params, cm_conn** out) override {
    if (params.handler == nullptr || out == nullptr) return status::invalid_param;
    socket_conn* conn = nullptr;
    const status st = start_client(params.address, milliseconds(params.timeout_ms),
                                   params.handler, &conn);
    if (st != status::ok) return st;
    conn->flow_timeout = milliseconds(params.timeout_ms);
    *out = conn;
    return status::ok;
  }

  status accept_flow(std::unique_ptr<cm_conn> handed, const cm_server_params& params,
                     cm_conn** out) override {
    auto* conn = dynamic_cast<socket_conn*>(handed.get());
    if (!answerable(conn) || params.handler == nullptr || out == nullptr) {
      return status::invalid_param;
    }
    conn->flow = params.handler;
    std::vector<uint8_t> reply;
    const status packed = private_data_of(conn, params.reply, &reply);
    if (packed != status::ok) {
      if (params.reply.pack) conn->reject(status::rejected);  // the pack callback said no
      return packed;
    }
    handed.release();
    answer(conn, reply.data(), reply.size(), milliseconds(params.timeout_ms));
    *out = conn;
    return status::ok;
  }

  void close(cm_conn* target) override {
    for (auto& conn : conns_) {
      if (conn.get() != target) continue;
      conn->closed = true;
      retire(conn.get());
    }
  }

  unsigned progress() override {
    // Connections that end are released only when the outermost call returns, so a handler that
    // progresses again (a nested call) cannot free one that an outer call is still handling.
    ++depth_;
    epoll_event events[32];
    const int n = ::epoll_wait(epoll_fd_, events, 32, 0);
    unsigned handled = handle_events(events, n > 0 ? n : 0);
    handled += sweep();
    resume_listeners();
    --depth_;
    if (depth_ == 0) reap();
    arm_timer();
    return handled;
  }

  /// Forgets a listener being destroyed, and drops the handshakes under way on it.
  void drop_listener(tcp_cm_listener* l) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, l->fd_, nullptr);
    forget_events(l);
    listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), l), listeners_.end());
    for (auto& conn : conns_) {
      if (conn->listener == l) retire(conn.get());
    }
  }

  // -- the flow's steps (cm_conn calls) ----------------------------------------------------------

  /// Client `conn` connects with `data` (cm_conn::connect).
  status flow_connect(socket_conn* conn, const cm_private_data& data) {
    if (conn->at == stage::resolving) return status::busy;
    if (conn->at != stage::resolved) {
      return conn->at == stage::dead ? status::not_connected : status::invalid_param;
    }
    std::vector<uint8_t> bytes;
    const status packed = private_data_of(conn, data, &bytes);
    if (packed != status::ok) {
      if (data.pack) retire(conn);  // the pack callback refused: the connection is over
      return packed;
    }
    conn->private_data = std::move(bytes);
    conn->deadline = clock_type::now() + conn->flow_timeout;
    const status st = start_connect(conn);
    if (st != status::ok) retire(conn);
    return st;
  }

  /// Client `conn` tells the server it is connected (cm_conn::notify).
  status flow_notify(socket_conn* conn) {
    if (!conn->established) return conn->at == stage::dead ? status::not_connected : status::busy;
    if (conn->local_disc || conn->remote_disc) return status::not_connected;
    if (conn->notified) return status::ok;
    conn->notified = true;
    cm_message confirm;
    confirm.type = cm_message::kind::confirm;
    conn->queue(confirm);
    (void)conn->flush();  // a failure shows as the socket's error in progress()
    update_interest(conn);
    return status::ok;
  }

  /// `conn` disconnects (cm_conn::disconnect): its sending side is shut down once what it queued
  /// is out; the peer reads the end and disconnects too, which this side reads in turn.
  status flow_disconnect(socket_conn* conn) {
    if (!conn->established) return conn->at == stage::dead ? status::not_connected : status::busy;
    if (conn->local_disc) return status::not_connected;
    conn->local_disc = true;
    if (conn->remote_disc) {
      retire(conn);  // both sides are done
      return status::ok;
    }
    (void)conn->flush();
    if (conn->wants_write()) {
      conn->shut_pending = true;
    } else {
      ::shutdown(conn->fd_, SHUT_WR);
    }
    update_interest(conn);
    return status::in_progress;
  }

private:
  // -- events ------------------------------------------------------------------------------------


  /// Handles one epoll batch. A target that goes away while the batch is handled (a listener
  /// destroyed, a connection handed over, here or in a nested call) has its events in every
  /// batch under way forgotten first (forget_events).
  unsigned handle_events(epoll_event* events, int n) {
    batches_.push_back({events, n});
    unsigned handled = 0;
    for (int i = 0; i < n; ++i) {
      auto* target = static_cast<pollable*>(events[i].data.ptr);
      if (target == &forgotten_) continue;
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
    batches_.pop_back();
    return handled;
  }

  /// Makes the events of `target` in the batches under way point at nothing.
  void forget_events(const pollable* target) {
    for (const event_batch& batch : batches_) {
      for (int i = 0; i < batch.n; ++i) {
        if (batch.events[i].data.ptr == target) batch.events[i].data.ptr = &forgotten_;
      }
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
    if (conn->fd_ < 0 || conn->remote_disc) return;
    watch(conn->fd_, conn, EPOLLIN | (conn->wants_write() ? EPOLLOUT : 0u));
  }

  /// Stops watching the socket of `conn` (it stays open).
  void unwatch(socket_conn* conn) {
    if (conn->fd_ >= 0) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->fd_, nullptr);
    forget_events(conn);
  }

  // -- admission (server) ------------------------------------------------------------------------


  /// Accepts what the backlog holds (up to accepts_per_event). Out of descriptors, it sheds a
  /// handshake to make room, or with none to shed pauses the listener, so that a listening
  /// socket that stays readable is never polled in a loop.
  void accept_clients(tcp_cm_listener* l) {
    const size_t cap = handshake_cap(limits_);
    for (int i = 0; i < accepts_per_event; ++i) {
      sockaddr_storage peer{};
      socklen_t length = sizeof(peer);
      const int fd = ::accept4(l->fd_, reinterpret_cast<sockaddr*>(&peer), &length,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(l, fd, peer, cap);
        continue;
      }
      const int error = errno;
      if (error == EAGAIN || error == EWOULDBLOCK) return;
      if (error == EINTR || error == ECONNABORTED) continue;  // that client gave up: next one
      if (out_of_descriptors(error) && shed_one("out of descriptors")) continue;
      pause(l, error);
      return;
    }
  }

  /// Starts the handshake of a socket just accepted, shedding one if there are `cap` already.
  void admit(tcp_cm_listener* l, int fd, const sockaddr_storage& peer, size_t cap) {
    if (handshakes_.size() >= cap) shed_one("too many handshakes at once");
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto conn = std::make_unique<socket_conn>(this, fd, true, ip_address::of(peer),
                                              port_of(peer), params_.auth_key);
    conn->at = stage::await_hello;
    conn->listener = l;
    conn->accepted = clock_type::now();
    conn->deadline = conn->accepted + limits_.hello_timeout;
    watch(fd, conn.get(), EPOLLIN);
    handshakes_.add(conn.get());
    conns_.push_back(std::move(conn));
  }

  /// Closes the oldest handshake of the busiest source; false when there is none.
  bool shed_one(const char* why) {
    socket_conn* victim = handshakes_.victim();
    if (victim == nullptr) return false;
    uint64_t since = 0;
    if (shed_warning_.due(&since)) {
      COMM_LOG(warn, log_name, "%s: shed %llu unauthenticated handshake(s) since the last "
               "warning, the oldest of the busiest source (now %s)", why,
               static_cast<unsigned long long>(since), victim->peer_address().c_str());
    }
    retire(victim);
    return true;
  }

  /// Stops accepting on `l` for accept_pause (accept failed with `error`).
  void pause(tcp_cm_listener* l, int error) {
    uint64_t since = 0;
    if (pause_warning_.due(&since)) {
      COMM_LOG(warn, log_name, "accepting on %s failed (%s), nothing to shed: paused %lld ms "
               "(%llu time(s) since the last warning)", l->address().c_str(), std::strerror(error),
               static_cast<long long>(accept_pause.count()),
               static_cast<unsigned long long>(since));
    }
    l->paused = true;
    l->resume_at = clock_type::now() + accept_pause;
    watch(l->fd_, l, 0);
  }

  void resume_listeners() {
    const auto now = clock_type::now();
    for (tcp_cm_listener* l : listeners_) {
      if (!l->paused || now < l->resume_at) continue;
      l->paused = false;
      watch(l->fd_, l, EPOLLIN);
    }
  }

  /// Without a key, a wildcard address (0.0.0.0, ::) becomes loopback (127.0.0.1, ::1).
  void narrow_without_key(ip_address& where) const {
    if (!params_.auth_key.empty()) return;
    if (where.unspecified()) {
      ip_address loopback;
      if (where.is_v6()) {
        const uint8_t one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        loopback = ip_address::v6(one);
      } else {
        loopback = ip_address::v4(htonl(INADDR_LOOPBACK));
      }
      where = loopback;
      COMM_LOG(warn, log_name,
               "no auth key (COMM_AUTH_KEY): listening on loopback (%s) only; set a key to "
               "accept clients from other hosts", where.text().c_str());
    } else if (!where.loopback()) {
      COMM_LOG(warn, log_name, "listening on %s without an auth key: anyone who reaches it may "
               "connect", where.text().c_str());
    }
  }

  // -- answering a request (server) --------------------------------------------------------------


  /// True when `conn` is a handed-over request a cm may answer.
  static bool answerable(const socket_conn* conn) {
    return conn != nullptr && conn->server_ && conn->at == stage::handed_over && conn->fd_ >= 0;
  }

  /// Sends the accepting reply of handed-over `conn` (now ours) and waits for the client's
  /// confirm (or notify) for `timeout`.
  void answer(socket_conn* conn, const uint8_t* data, size_t length, milliseconds timeout) {
    conn->owner_ = this;  // it may have been handed over by another worker's cm
    conn->answered_ = true;
    conn->queue_reply(status::ok, data, length);
    conn->at = stage::await_confirm;
    conn->deadline = clock_type::now() + timeout;
    watch(conn->fd_, conn, EPOLLIN | EPOLLOUT);
    conns_.emplace_back(conn);
  }

  /// The private data of a flow step into `*out`: `data`'s bytes, or what the handler of `conn`
  /// packs for its device. exceeds_limit beyond max_private_data; the pack callback's refusal.
  static status private_data_of(socket_conn* conn, const cm_private_data& data,
                                std::vector<uint8_t>* out) {
    if (!data.pack) {
      if (data.length > max_private_data) return status::exceeds_limit;
      if (data.length != 0 && data.data == nullptr) return status::invalid_param;
      out->assign(data.data, data.data + data.length);
      return status::ok;
    }
    out->resize(max_private_data);
    const std::string device = conn->device_name();
    const ssize_t written =
        conn->flow->pack_private_data(conn, device, out->data(), out->size());
    if (written < 0) {
      const auto refusal = static_cast<status>(written);
      return is_error(refusal) ? refusal : status::invalid_param;
    }
    if (static_cast<size_t>(written) > max_private_data) return status::exceeds_limit;
    out->resize(static_cast<size_t>(written));
    return status::ok;
  }

  // -- client connects ---------------------------------------------------------------------------


  /// A client connection to `address` (short handshake when `flow` is null), resolving for
  /// `timeout`: a dotted or bracketed address at once, a name on a thread.
  status start_client(const std::string& address, milliseconds timeout, cm_flow_handler* flow,
                      socket_conn** out) {
    std::string host;
    uint16_t port = 0;
    if (!split_host_port(address, &host, &port) || port == 0) return status::invalid_addr;
    auto conn =
        std::make_unique<socket_conn>(this, -1, false, ip_address{}, port, params_.auth_key);
    conn->flow = flow;
    conn->deadline = clock_type::now() + timeout;
    conn->at = stage::resolving;
    ip_address numeric;
    if (parse_numeric_host(host, &numeric)) {
      conn->candidates = {numeric};
      if (flow == nullptr) {
        // Nothing to resolve: connect at once (a refusal is reported from progress()).
        if (const status st = start_connect(conn.get()); st != status::ok) return st;
      } else {
        arm_timer_now();  // the route is resolved and reported in progress() (sweep)
      }
    } else {
      // A name: resolved on a thread, the connect starts when it is known (on_lookup).
      conn->lookup = std::make_shared<name_lookup>();
      if (!name_lookup::start(conn->lookup, host)) return status::busy;
      watch(conn->lookup->ready, conn.get(), EPOLLIN);
    }
    *out = conn.get();
    conns_.push_back(std::move(conn));
    return status::ok;
  }

  /// Opens a socket to the next of the addresses of client `conn` and starts a nonblocking
  /// connect; an address refused at once moves on to the next. With none left, the failure is
  /// reported from progress(), like every other outcome. io_error when no socket could be made.
  status start_connect(socket_conn* conn) {
    while (conn->next_candidate < conn->candidates.size()) {
      conn->peer_ = conn->candidates[conn->next_candidate++];
      const int fd = ::socket(conn->peer_.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return status::io_error;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      conn->fd_ = fd;
      conn->at = stage::connecting;
      socklen_t length = 0;
      const sockaddr_storage where = conn->peer_.with_port(conn->peer_port_, &length);
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&where), length) == 0 ||
          errno == EINPROGRESS) {
        watch(fd, conn, EPOLLIN | EPOLLOUT);
        return status::ok;
      }
      conn->failure = status_of_errno(errno, true);
      conn->close_socket();
    }
    arm_timer_now();
    return status::ok;
  }

  /// The host name of client `conn` resolved (or did not).
  void on_lookup(socket_conn* conn) {
    std::vector<ip_address> addresses;
    {
      std::lock_guard<std::mutex> g(conn->lookup->mtx);
      if (!conn->lookup->done) return;  // the eventfd is written only after done is set
      addresses = conn->lookup->addresses;
    }
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->lookup->ready, nullptr);
    conn->lookup.reset();
    resolved(conn, std::move(addresses));
  }

  /// Client `conn`'s server has `addresses` (none: it did not resolve): a short handshake
  /// connects, a flow resolves the route.
  void resolved(socket_conn* conn, std::vector<ip_address> addresses) {
    if (addresses.empty()) {
      COMM_LOG(info, log_name, "cannot resolve the host to connect to: unreachable");
      fail(conn, status::unreachable);
      return;
    }
    conn->candidates = std::move(addresses);
    if (conn->flow != nullptr) {
      resolve_route(conn);
      return;
    }
    const status st = start_connect(conn);
    if (st != status::ok) fail(conn, st);
  }

  /// Flow client `conn`: finds the local device its first routable address goes through (the
  /// addresses reached through another device are dropped) and tells the handler.
  void resolve_route(socket_conn* conn) {
    std::vector<ip_address> usable;
    std::string device;
    for (const ip_address& address : conn->candidates) {
      ip_address source;
      int error = 0;
      if (!route_source(address, &source, &error)) continue;
      std::string name = interface_of(source);
      if (name.empty()) name = source.text();
      if (usable.empty()) device = name;
      if (name == device) usable.push_back(address);
    }
    if (usable.empty()) {
      COMM_LOG(info, log_name, "no route to the host to connect to: unreachable");
      fail(conn, status::unreachable);
      return;
    }
    conn->candidates = std::move(usable);
    conn->device_ = device;
    conn->at = stage::resolved;
    conn->deadline = never;
    const status st = conn->flow->on_resolved(conn, device, status::ok);
    if (is_error(st)) retire(conn);  // refused: the connection is over, nothing more is told
  }

  /// The nonblocking connect of `conn` finished (or not yet): sends the hello; false when the
  /// connection is not (or no longer) ready for it. A refused address moves on to the next.
  bool finish_connect(socket_conn* conn, uint32_t events) {
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return false;
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(conn->fd_, SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) {
      unwatch(conn);
      conn->close_socket();
      if (conn->next_candidate < conn->candidates.size()) {
        const status st = start_connect(conn);
        if (st != status::ok) fail(conn, st);
      } else {
        fail(conn, status_of_errno(error, true));
      }
      return false;
    }
    cm_message hello;
    hello.type = cm_message::kind::hello;
    hello.version = protocol_version;
    hello.nonce = copy_of(conn->own_nonce_);
    conn->queue(hello);
    conn->at = stage::await_challenge;
    return true;
  }

  // -- one connection's socket -------------------------------------------------------------------


  void on_socket(socket_conn* conn, uint32_t events) {
    if (conn->at == stage::dead) return;
    if (conn->at == stage::resolving) {
      on_lookup(conn);
      return;
    }
    if (conn->at == stage::connecting && !finish_connect(conn, events)) return;
    const bool ended = (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) && !conn->receive();
    if (handle_frames(conn) == outcome::handed_over) return;  // no longer ours to touch
    if (conn->at == stage::dead || conn->remote_disc) return;
    if (ended) {
      peer_closed(conn);
      return;
    }
    if (!conn->flush()) {
      fail(conn, status::connection_reset);
      return;
    }
    if (conn->shut_pending && !conn->wants_write()) {
      conn->shut_pending = false;
      ::shutdown(conn->fd_, SHUT_WR);
    }
    if (conn->at == stage::closing && !conn->wants_write()) {
      retire(conn);
      return;
    }
    update_interest(conn);
  }

  /// The peer closed `conn` (or its socket failed): before the handshake was done, a failure;
  /// on a connected flow, the peer's disconnect.
  void peer_closed(socket_conn* conn) {
    if (conn->at == stage::closing) {
      retire(conn);
      return;
    }
    fail(conn, conn->at == stage::await_challenge ? status::unreachable
                                                  : status::connection_reset);
  }

  /// Handles every whole message `conn` has buffered. Each is consumed before it is dispatched,
  /// so whatever a handler does with the connection, nothing here reads it afterwards unless it
  /// is still ours.
  outcome handle_frames(socket_conn* conn) {
    while (conn->at != stage::dead && !conn->remote_disc) {
      const cm_frame frame =
          find_cm_frame(conn->rx_.data(), conn->rx_.size(), max_message_in(conn->at));
      if (frame.at == cm_frame::state::incomplete) return outcome::open;
      if (frame.at == cm_frame::state::invalid) {
        garbage(conn, "a frame with an impossible length");
        return outcome::finished;
      }
      cm_message message;
      const bool parsed =
          parse_cm_message(conn->rx_.data() + cm_frame_prefix, frame.length, &message);
      conn->consume(cm_frame_prefix + frame.length);
      if (!parsed) {
        garbage(conn, "a malformed message");
        return outcome::finished;
      }
      const outcome next = dispatch(conn, message);
      if (next != outcome::open) return next;
    }
    return outcome::finished;
  }

  void garbage(socket_conn* conn, const char* what) {
    uint64_t since = 0;
    if (garbage_warning_.due(&since)) {
      COMM_LOG(warn, log_name, "%s sent %s: connection closed (%llu such since the last warning)",
               conn->peer_address().c_str(), what, static_cast<unsigned long long>(since));
    }
    fail(conn, status::protocol_error);
  }

  /// Handles one message; a message that does not belong to the connection's stage, or does not
  /// check out, is garbage (on a connected flow nothing more belongs).
  outcome dispatch(socket_conn* conn, const cm_message& message) {
    bool valid = false;
    switch (conn->at) {
      case stage::await_challenge:
        valid = message.type == cm_message::kind::challenge && on_challenge(conn, message);
        break;
      case stage::await_reply:
        valid = message.type == cm_message::kind::reply && on_reply(conn, message);
        break;
      case stage::await_hello:
        valid = message.type == cm_message::kind::hello && on_hello(conn, message);
        break;
      case stage::await_request:
        if (message.type == cm_message::kind::request) return on_request(conn, message);
        break;
      case stage::await_confirm:
        valid = message.type == cm_message::kind::confirm;
        if (valid) confirmed(conn);
        break;
      default:
        break;
    }
    if (!valid) {
      garbage(conn, "a message out of place or malformed");
      return outcome::finished;
    }
    const bool going_on = conn->at != stage::dead && conn->at != stage::closing;
    return going_on ? outcome::open : outcome::finished;
  }

  bool on_challenge(socket_conn* conn, const cm_message& challenge) {
    if (challenge.nonce.size() != auth::nonce_size) return false;
    std::memcpy(conn->peer_nonce_.data(), challenge.nonce.data(), auth::nonce_size);
    const auto& key = conn->key_;
    if (!key.empty() &&
        !auth::check_proof(key, server_role, conn->own_nonce_.data(), auth::nonce_size,
                           conn->peer_nonce_.data(), auth::nonce_size, challenge.proof.data(),
                           challenge.proof.size())) {
      COMM_LOG(warn, log_name, "server %s did not prove the cluster key: refused",
               conn->peer_address().c_str());
      fail(conn, status::rejected);
      return true;
    }
    cm_message request;
    request.type = cm_message::kind::request;
    if (!key.empty()) {
      const auth::proof proof = auth::make_proof(key, client_role, conn->peer_nonce_.data(),
                                                 auth::nonce_size, conn->own_nonce_.data(),
                                                 auth::nonce_size);
      request.proof.assign(proof.begin(), proof.end());
    }
    request.private_data = std::move(conn->private_data);
    conn->private_data.clear();
    conn->queue(request);
    conn->at = stage::await_reply;
    return true;
  }

  bool on_reply(socket_conn* conn, const cm_message& reply) {
    const auto st = static_cast<status>(reply.status);
    if (st != status::ok) {
      if (!is_error(st)) return false;
      fail(conn, st);
      return true;
    }
    if (conn->flow != nullptr) {
      // The flow's client is connected; it notifies the server itself (cm_conn::notify).
      conn->at = stage::connected;
      conn->established = true;
      conn->deadline = never;
      conn->flow->on_connect(conn, status::ok, reply.private_data.data(),
                             reply.private_data.size());
      return true;
    }
    cm_message confirm;
    confirm.type = cm_message::kind::confirm;
    conn->queue(confirm);
    establish(conn, reply.private_data.data(), reply.private_data.size());
    return true;
  }

  bool on_hello(socket_conn* conn, const cm_message& hello) {
    if (hello.version != protocol_version || hello.nonce.size() != auth::nonce_size) return false;
    std::memcpy(conn->peer_nonce_.data(), hello.nonce.data(), auth::nonce_size);
    cm_message challenge;
    challenge.type = cm_message::kind::challenge;
    challenge.nonce = copy_of(conn->own_nonce_);
    if (!conn->key_.empty()) {
      const auth::proof proof = auth::make_proof(conn->key_, server_role,
                                                 conn->peer_nonce_.data(), auth::nonce_size,
                                                 conn->own_nonce_.data(), auth::nonce_size);
      challenge.proof.assign(proof.begin(), proof.end());
    }
    conn->queue(challenge);
    conn->at = stage::await_request;
    conn->deadline = conn->accepted + limits_.handshake_timeout;
    return true;
  }

  /// The client's request: rejected when its proof fails, else handed over to the handler.
  outcome on_request(socket_conn* conn, const cm_message& request) {
    handshakes_.remove(conn);  // past the hello, and authenticated or not, no longer counted
    if (!conn->key_.empty() &&
        !auth::check_proof(conn->key_, client_role, conn->own_nonce_.data(), auth::nonce_size,
                           conn->peer_nonce_.data(), auth::nonce_size, request.proof.data(),
                           request.proof.size())) {
      uint64_t since = 0;
      if (auth_warning_.due(&since)) {
        COMM_LOG(warn, log_name, "client %s failed authentication: rejected (%llu such since the "
                 "last warning)", conn->peer_address().c_str(),
                 static_cast<unsigned long long>(since));
      }
      conn->answered_ = true;
      conn->queue_reply(status::rejected, nullptr, 0);
      conn->at = stage::closing;
      conn->deadline = clock_type::now() + closing_linger;
      return outcome::finished;
    }
    return hand_over(conn, request.private_data);
  }

  /// Gives server connection `conn` to the handler with the client's private data. It leaves
  /// this connection manager before the call (its socket unwatched, its events forgotten), so
  /// whatever the handler does with it (accept it here or on another worker, reject it, drop
  /// it), it is not touched here again.
  outcome hand_over(socket_conn* conn, const std::vector<uint8_t>& data) {
    tcp_cm_listener* from = conn->listener;
    unwatch(conn);
    conn->at = stage::handed_over;
    conn->listener = nullptr;
    conn->rx_.shrink_to_fit();
    auto it = std::find_if(conns_.begin(), conns_.end(),
                           [&](const std::unique_ptr<socket_conn>& c) { return c.get() == conn; });
    std::unique_ptr<socket_conn> owned = std::move(*it);
    conns_.erase(it);
    ++from->requests_;
    params_.handler->on_request(from, std::move(owned), data.data(), data.size());
    return outcome::handed_over;
  }

  /// The client confirmed (notified) server connection `conn`.
  void confirmed(socket_conn* conn) {
    if (conn->flow == nullptr) {
      establish(conn, nullptr, 0);
      return;
    }
    conn->at = stage::connected;
    conn->established = true;
    conn->deadline = never;
    conn->flow->on_notify(conn, status::ok);
  }

  // -- endings -----------------------------------------------------------------------------------


  /// Reports what progress() owes: numeric flow resolutions, failures found while connecting,
  /// and connections past their deadline.
  unsigned sweep() {
    if (conns_.empty()) return 0;
    const auto now = clock_type::now();
    unsigned n = 0;
    // By index: a handler told about a failure may add connections.
    for (size_t i = 0; i < conns_.size(); ++i) {
      socket_conn* conn = conns_[i].get();
      if (conn->at == stage::dead) continue;
      if (conn->at == stage::resolving && !conn->lookup) {
        resolved(conn, conn->candidates);
        ++n;
      } else if (conn->failure != status::ok) {
        fail(conn, conn->failure);
        ++n;
      } else if (now >= conn->deadline) {
        time_out(conn);
        ++n;
      }
    }
    return n;
  }

  void time_out(socket_conn* conn) {
    if (conn->in_handshakes) {
      COMM_LOG(debug, log_name, "no %s from %s in time: dropped",
               conn->at == stage::await_hello ? "hello" : "request", conn->peer_address().c_str());
    }
    const bool reaching = conn->at == stage::connecting || conn->at == stage::resolving;
    fail(conn, reaching ? status::unreachable : status::endpoint_timeout);
  }

  /// Marks a connection closed; a short handshake's is released when the outermost progress()
  /// returns, a flow's once its owner closed it too.
  void retire(socket_conn* conn) {
    if (conn->at == stage::dead) return;
    handshakes_.remove(conn);
    if (conn->lookup) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->lookup->ready, nullptr);
      conn->lookup.reset();
    }
    if (conn->fd_ >= 0) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->fd_, nullptr);
    forget_events(conn);
    conn->answered_ = true;
    conn->shut_pending = false;
    conn->close_socket();
    conn->at = stage::dead;
  }

  void reap() {
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::unique_ptr<socket_conn>& c) {
                                  return c->at == stage::dead && (c->flow == nullptr || c->closed);
                                }),
                 conns_.end());
  }

  /// Retires `conn` and tells its handler, if it is one the handler knows (a client, or a server
  /// connection it accepted).
  void fail(socket_conn* conn, status reason) {
    if (conn->at == stage::dead) return;
    if (conn->flow != nullptr) {
      fail_flow(conn, reason);
      return;
    }
    const bool tell = conn->at != stage::closing &&
                      (!conn->server_ || conn->at == stage::await_confirm);
    retire(conn);
    if (tell) params_.handler->on_failed(conn, reason);
  }

  /// A flow connection failed: before it was established, the callback of its step is told;
  /// afterwards the peer is gone (peer_gone).
  void fail_flow(socket_conn* conn, status reason) {
    if (conn->established) {
      peer_gone(conn);
      return;
    }
    const stage was = conn->at;
    retire(conn);
    if (conn->server_) {
      conn->flow->on_notify(conn, reason);
    } else if (was == stage::resolving) {
      conn->flow->on_resolved(conn, {}, reason);
    } else {
      conn->flow->on_connect(conn, reason, nullptr, 0);
    }
  }

  /// The peer of connected flow `conn` disconnected (or its socket broke, or it sent what does
  /// not belong): once both sides are done the socket closes; before, it stays (unwatched: there
  /// is nothing more to read) until this side disconnects. The handler is told once.
  void peer_gone(socket_conn* conn) {
    if (conn->remote_disc) return;
    conn->remote_disc = true;
    if (conn->local_disc) {
      retire(conn);
    } else {
      unwatch(conn);
    }
    conn->flow->on_disconnect(conn);
  }

  /// The handshake of `conn` is done: it closes once its last bytes (a client's confirm) are out.
  void establish(socket_conn* conn, const uint8_t* data, size_t length) {
    if (conn->wants_write()) {
      conn->at = stage::closing;
      conn->deadline = clock_type::now() + closing_linger;
      update_interest(conn);
    } else {
      retire(conn);
    }
    params_.handler->on_established(conn, data, length);
  }

  // -- timer -------------------------------------------------------------------------------------


  void arm_timer_now() {
    itimerspec spec{};
    spec.it_value.tv_nsec = 1;
    ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
  }

  /// When `conn` needs progress() next: now for a numeric flow resolution or a failure to
  /// report, else its deadline.
  static clock_type::time_point due_at(const socket_conn& conn) {
    if (conn.at == stage::dead) return never;
    if (conn.failure != status::ok || (conn.at == stage::resolving && !conn.lookup)) {
      return clock_type::time_point::min();
    }
    return conn.deadline;
  }

  /// Arms the timer for the earliest deadline or listener resumption, so a sleeping owner wakes
  /// for it.
  void arm_timer() {
    auto earliest = never;
    for (const auto& conn : conns_) earliest = std::min(earliest, due_at(*conn));
    for (const tcp_cm_listener* l : listeners_) {
      if (l->paused) earliest = std::min(earliest, l->resume_at);
    }
    itimerspec spec{};
    if (earliest != never) {
      const auto wait = std::max<clock_type::duration>(earliest - clock_type::now(),
                                                       std::chrono::microseconds(1));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
      spec.it_value.tv_sec = ns / 1000000000;
      spec.it_value.tv_nsec = ns % 1000000000;
    }
    ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
  }

  /// An epoll batch being handled (see forget_events).
  struct event_batch {
    epoll_event* events;
    int n;
  };

  cm_params params_;
  cm_limits limits_;
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  std::vector<tcp_cm_listener*> listeners_;
  std::vector<std::unique_ptr<socket_conn>> conns_;
  handshake_table handshakes_;
  unsigned depth_ = 0;                  ///< progress() calls under way (nested from handlers)
  std::vector<event_batch> batches_;    ///< their epoll batches
  pollable forgotten_;                  ///< what a forgotten event points at
  // Warnings a flood could repeat thousands of times a second, printed at most every 10 s.
  throttled_warning shed_warning_;
  throttled_warning pause_warning_;
  throttled_warning garbage_warning_;
  throttled_warning auth_warning_;
};

tcp_cm_listener::~tcp_cm_listener() {
  if (owner_ != nullptr) owner_->drop_listener(this);
  ::close(fd_);
}

status socket_conn::connect(const cm_private_data& data) {
  if (server_ || flow == nullptr) return status::invalid_param;
  return owner_->flow_connect(this, data);
}

status socket_conn::notify() {
  if (server_ || flow == nullptr) return status::invalid_param;
  return owner_->flow_notify(this);
}

status socket_conn::disconnect() {
  if (flow == nullptr) return status::invalid_param;
  if (!established) return at == stage::dead ? status::not_connected : status::busy;
  return owner_->flow_disconnect(this);
}

}  // namespace

status open_tcp_cm(const cm_params& params, std::unique_ptr<cm>& out) {
  if (params.handler == nullptr) return status::invalid_param;
  tcp_config config;
  std::string why;
  if (tcp_config::parse(params.opts, &config, &why) != status::ok) {
    COMM_LOG(error, log_name, "%s", why.c_str());
    return status::invalid_param;
  }
  auto made = std::make_unique<tcp_cm>(params, config);
  if (!made->ok()) return status::io_error;
  out = std::move(made);
  return status::ok;
}

}  // namespace comm::tl::tcp
