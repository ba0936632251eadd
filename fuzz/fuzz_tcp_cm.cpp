// Fuzzes the tcp connection manager (transports/tcp/tcp_cm.*) through its sockets, as a peer meets
// it: no seam, the bytes travel over loopback.
//
// Input: one byte of flags, then the bytes the peer sends (length-prefixed CmMessages, or garbage).
//   bit 0 clear: server side. A raw client connects to the connection manager's listener (bit 2:
//                the keyed one), sends the bytes and shuts its side down. A request handed over
//                is accepted (bit 1) or rejected, after the callback returns.
//   bit 0 set:   client side. The connection manager connects to a raw listener, whose accepted
//                socket sends the bytes (the server's challenge and reply) and shuts down.
//   bit 3:       over IPv6 loopback (::1) instead of 127.0.0.1.
//   bit 4:       the client-server flow (cm::resolve / cm::accept_flow) instead of the short
//                handshake: once connected, whatever else the peer sends, and its end, reach the
//                connection's last stage (a disconnect).
// Either way the handshake must end (established, failed, or the socket closed) within a few
// seconds of the peer's end of input, and every descriptor it opened must be closed again.
#include <comm/transport/transport.hpp>

#include "check.hpp"
#include "seeds.hpp"

#include "schema/wire.capnp.h"
#include "tcp/tcp.capnp.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {

using comm::fuzz::fail;
using comm::fuzz::require;

using namespace comm::tl;
namespace wire = comm::wire::schema;
using clock_type = std::chrono::steady_clock;

/// How long a handshake may take after the peer's last byte (generous: the machine is shared).
constexpr auto handshake_bound = std::chrono::seconds(5);

/// What the connection manager reported during one input.
struct recorder final : cm_handler {
  void on_request(cm_listener*, std::unique_ptr<cm_conn> conn, const uint8_t*, size_t) override {
    handed = std::move(conn);  // answered after progress() returns, never inside the callback
  }
  void on_established(cm_conn*, const uint8_t*, size_t) override { ++ended; }
  void on_failed(cm_conn*, comm::status) override { ++ended; }

  void reset() {
    ended = 0;
    handed.reset();
  }

  int ended = 0;
  std::unique_ptr<cm_conn> handed;
};

/// What a flow connection reported during one input.
struct flow_recorder final : cm_flow_handler {
  comm::status on_resolved(cm_conn* conn, std::string_view, comm::status result) override {
    const uint8_t request[] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
    cm_private_data data;
    data.data = request;
    data.length = sizeof(request);
    if (result != comm::status::ok || conn->connect(data) != comm::status::ok) ended = true;
    return result;
  }
  void on_connect(cm_conn* conn, comm::status result, const uint8_t*, size_t) override {
    if (result != comm::status::ok || conn->notify() != comm::status::ok) ended = true;
  }
  void on_notify(cm_conn*, comm::status result) override {
    if (result != comm::status::ok) ended = true;
  }
  void on_disconnect(cm_conn*) override { ended = true; }

  bool ended = false;
};

/// Where one family's raw peers and listeners are.
struct family {
  std::string host;  ///< "127.0.0.1" or "[::1]"
  std::unique_ptr<cm_listener> plain_listener;
  std::unique_ptr<cm_listener> keyed_listener;
  int raw_listener = -1;
  uint16_t raw_port = 0;
  bool v6 = false;
};

/// The connection managers (plain and keyed), their listeners and a raw listener for the client
/// side, for IPv4 and IPv6 loopback, made once.
struct setup {
  recorder events;
  std::unique_ptr<cm> plain;
  std::unique_ptr<cm> keyed;
  family families[2];  ///< IPv4, IPv6
};

/// The tcp transport.
component& tcp() {
  for (component* c : all_components()) {
    if (c->name() == "tcp") return *c;
  }
  fail("no tcp transport");
}

/// A connection manager reporting to `events`, with cluster key `key` (empty: none).
std::unique_ptr<cm> open_cm(recorder& events, std::string key) {
  cm_params params;
  params.handler = &events;
  params.auth_key = std::move(key);
  std::unique_ptr<cm> made;
  require(tcp().open_cm(params, made) == comm::status::ok, "cannot open a connection manager");
  return made;
}

/// The loopback address of IPv4 or IPv6 with `port`.
sockaddr_storage loopback(bool v6, uint16_t port, socklen_t* length) {
  sockaddr_storage where{};
  if (v6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&where);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_loopback;
    in6->sin6_port = htons(port);
    *length = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&where);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    in->sin_port = htons(port);
    *length = sizeof(sockaddr_in);
  }
  return where;
}

/// A nonblocking listening socket on loopback (`v6`: ::1); `*port` is its port.
int raw_listen(bool v6, uint16_t* port) {
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  socklen_t length = 0;
  sockaddr_storage where = loopback(v6, 0, &length);
  require(fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&where), length) == 0 &&
              ::listen(fd, 16) == 0 &&
              ::getsockname(fd, reinterpret_cast<sockaddr*>(&where), &length) == 0,
          "cannot make the raw listener");
  *port = v6 ? ntohs(reinterpret_cast<sockaddr_in6&>(where).sin6_port)
             : ntohs(reinterpret_cast<sockaddr_in&>(where).sin_port);
  return fd;
}

/// The connection managers and listeners, made on first use and kept.
setup& the_setup() {
  static setup* s = [] {
    auto* made = new setup;
    made->plain = open_cm(made->events, "");
    made->keyed = open_cm(made->events, "fuzzing-cluster-key");
    for (const bool v6 : {false, true}) {
      family& f = made->families[v6 ? 1 : 0];
      f.v6 = v6;
      f.host = v6 ? "[::1]" : "127.0.0.1";
      const std::string any = f.host + ":0";
      require(made->plain->listen(any, 64, f.plain_listener) == comm::status::ok &&
                  made->keyed->listen(any, 64, f.keyed_listener) == comm::status::ok,
              "cannot listen");
      f.raw_listener = raw_listen(v6, &f.raw_port);
    }
    return made;
  }();
  return *s;
}

/// Makes close() reset the connection instead of leaving it in TIME_WAIT: a fuzzing run opens
/// hundreds of thousands of connections, more than the ephemeral ports TIME_WAIT would hold.
void reset_on_close(int fd) {
  const linger now{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
}

/// Waits for a connect that a signal interrupted (it goes on in the kernel: a new connect would
/// fail with EALREADY) until it completes; true when it connected, else errno says why.
bool finish_interrupted_connect(int fd) {
  pollfd p{fd, POLLOUT, 0};
  const int bound_ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(handshake_bound).count());
  int ready = -1;
  for (int attempt = 0; attempt < 100; ++attempt) {  // libFuzzer's timer interrupts us too
    ready = ::poll(&p, 1, bound_ms);
    if (ready >= 0 || errno != EINTR) break;
  }
  if (ready <= 0) {
    errno = ready == 0 ? ETIMEDOUT : errno;
    return false;
  }
  int error = 0;
  socklen_t size = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return false;
  errno = error;
  return error == 0;
}

/// A connected socket to `port` on loopback (`v6`: ::1). Local ports run short while the machine's
/// other connections (ours and anyone's) sit in TIME_WAIT: that is retried for a while, anything
/// else is a failure of the listener.
int raw_connect(bool v6, uint16_t port) {
  socklen_t length = 0;
  const sockaddr_storage to = loopback(v6, port, &length);
  const auto deadline = clock_type::now() + handshake_bound;
  for (;;) {
    const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    require(fd >= 0, "cannot make a socket");
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), length) == 0 ||
        (errno == EINTR && finish_interrupted_connect(fd))) {
      reset_on_close(fd);
      return fd;
    }
    const int error = errno;
    ::close(fd);
    if (error != EADDRNOTAVAIL || clock_type::now() >= deadline) {
      std::fprintf(stderr, "fuzz_tcp_cm: connect: %s\n", std::strerror(error));
      fail("cannot connect to the listener");
    }
    ::poll(nullptr, 0, 10);
  }
}

/// Sends all of the bytes (blocking) and ends our direction; the peer may have closed already.
void send_and_shut(int fd, const uint8_t* data, size_t size) {
  while (size != 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) break;
    data += n;
    size -= static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
}

/// Reads and drops what the socket has; true once the other side closed it.
bool drain(int fd) {
  uint8_t sink[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n > 0) continue;
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
}

/// Progresses `manager` (sleeping on its event fd and `fd`) until `done()` or the bound passes.
template <class Done>
void run_until(cm& manager, int fd, Done done) {
  const auto deadline = clock_type::now() + handshake_bound;
  while (!done()) {
    require(clock_type::now() < deadline, "the handshake did not end after the peer's last byte");
    pollfd fds[2] = {{manager.event_fd(), POLLIN, 0}, {fd, POLLIN, 0}};
    ::poll(fds, fd >= 0 ? 2 : 1, 1);
    manager.progress();
  }
}

/// Answers handed-over request `handed` on the flow, then progresses until the connection ends
/// (its notify failed, or the peer disconnected) and closes it.
void answer_on_the_flow(cm& manager, std::unique_ptr<cm_conn> handed, int client, bool* closed) {
  flow_recorder flow;
  cm_server_params params;
  params.handler = &flow;
  const uint8_t reply[] = {1, 2, 3, 4, 5, 6, 7, 8};
  params.reply.data = reply;
  params.reply.length = sizeof(reply);
  params.timeout_ms = 2000;
  cm_conn* answered = nullptr;
  require(manager.accept_flow(std::move(handed), params, &answered) == comm::status::ok,
          "cannot accept a handed-over request on the flow");
  run_until(manager, client, [&] {
    *closed = *closed || drain(client);
    return flow.ended;
  });
  manager.close(answered);
}

/// Plays a client sending the input to a listener, then answers a handed-over request.
void server_side(setup& s, const family& f, bool keyed, bool accept, bool flow,
                 const uint8_t* data, size_t size) {
  cm& manager = keyed ? *s.keyed : *s.plain;
  const int client = raw_connect(f.v6, keyed ? f.keyed_listener->port() : f.plain_listener->port());
  send_and_shut(client, data, size);
  bool closed = false;
  run_until(manager, client, [&] {
    closed = closed || drain(client);
    return closed || s.events.handed != nullptr;
  });
  if (s.events.handed != nullptr) {
    if (accept && flow) {
      answer_on_the_flow(manager, std::move(s.events.handed), client, &closed);
    } else if (accept) {
      cm_conn* answered = nullptr;
      const uint8_t reply[] = {1, 2, 3, 4, 5, 6, 7, 8};
      require(manager.accept(std::move(s.events.handed), reply, sizeof(reply), 2000, &answered) ==
                  comm::status::ok,
              "cannot accept a handed-over request");
      run_until(manager, client, [&] {
        closed = closed || drain(client);
        return s.events.ended != 0;
      });
    } else {
      s.events.handed.reset();  // destroyed unanswered: rejected
    }
  }
  ::close(client);
}

/// Plays a server: accepts the connection manager's connect (the short handshake, or with `flow`
/// the client-server flow, which notifies once answered) and sends it the input.
void client_side(setup& s, const family& f, bool flow, const uint8_t* data, size_t size) {
  cm_conn* conn = nullptr;
  const std::string address = f.host + ":" + std::to_string(f.raw_port);
  flow_recorder events;
  if (flow) {
    cm_client_params params;
    params.address = address;
    params.handler = &events;
    params.timeout_ms = 2000;
    require(s.plain->resolve(params, &conn) == comm::status::ok, "cannot start a flow client");
  } else {
    const uint8_t request[] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
    require(s.plain->connect(address, request, sizeof(request), 2000, &conn) == comm::status::ok,
            "cannot start a connect");
  }
  const auto ended = [&] { return flow ? events.ended : s.events.ended != 0; };
  int server = -1;
  run_until(*s.plain, -1, [&] {
    server = ::accept4(f.raw_listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return server >= 0 || ended();
  });
  if (server >= 0) {
    reset_on_close(server);
    send_and_shut(server, data, size);
    run_until(*s.plain, server, [&] {
      drain(server);
      return ended();
    });
    ::close(server);
  }
  // It may have failed before we accepted: the connection may still wait in the backlog.
  while ((server = ::accept4(f.raw_listener, nullptr, nullptr, SOCK_NONBLOCK)) >= 0) {
    reset_on_close(server);
    ::close(server);
  }
  if (flow) s.plain->close(conn);
}

/// Progresses both managers until the descriptors are back to `baseline` (closing connections
/// linger up to a second to flush their last reply).
void settle(setup& s, size_t baseline) {
  const auto deadline = clock_type::now() + handshake_bound;
  while (comm::fuzz::open_fds().size() > baseline) {
    require(clock_type::now() < deadline, "descriptors still open after the handshake ended");
    ::poll(nullptr, 0, 1);
    s.plain->progress();
    s.keyed->progress();
  }
}

// -- seeds -----------------------------------------------------------------------------------------

using comm::fuzz::seed;

/// Appends `message` to `out` as the connection manager frames it: a 4-byte little-endian length,
/// then the message.
void append_frame(capnp::MessageBuilder& message, seed& out) {
  auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  const uint32_t length = static_cast<uint32_t>(bytes.size());
  const uint8_t prefix[4] = {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
                             static_cast<uint8_t>(length >> 16),
                             static_cast<uint8_t>(length >> 24)};
  comm::fuzz::append(out, prefix, sizeof(prefix));
  comm::fuzz::append(out, bytes.begin(), bytes.size());
}

const uint8_t nonce[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const uint8_t private_data[12] = {'p', 'r', 'i', 'v', 'a', 't', 'e', ' ', 'd', 'a', 't', 'a'};

/// What a client sends: hello, request, confirm (protocol version 1, no key).
seed client_bytes(uint8_t flags) {
  seed out{flags};
  {
    capnp::MallocMessageBuilder message;
    auto hello = message.initRoot<wire::CmMessage>().initHello();
    hello.setVersion(1);
    hello.setNonce(kj::arrayPtr(nonce, sizeof(nonce)));
    append_frame(message, out);
  }
  {
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<wire::CmMessage>().initRequest();
    request.setPrivateData(kj::arrayPtr(private_data, sizeof(private_data)));
    append_frame(message, out);
  }
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::CmMessage>().setConfirm();
  append_frame(message, out);
  return out;
}

/// What a server sends: challenge, then a reply with `status`.
seed server_bytes(int16_t status) {
  seed out{1};
  {
    capnp::MallocMessageBuilder message;
    message.initRoot<wire::CmMessage>().initChallenge().setNonce(
        kj::arrayPtr(nonce, sizeof(nonce)));
    append_frame(message, out);
  }
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::CmMessage>().initReply();
  reply.setStatus(status);
  reply.setPrivateData(kj::arrayPtr(private_data, sizeof(private_data)));
  append_frame(message, out);
  return out;
}

/// What a server sends (`flags`: the client side, over IPv6 and/or the flow).
seed server_bytes(uint8_t flags, int16_t status) {
  seed out = server_bytes(status);
  out[0] = flags;
  return out;
}

/// Seeds: a client's whole handshake (rejected, accepted, against the keyed listener; over IPv6,
/// on the flow) and a server's (accepting, rejecting; over IPv6, on the flow).
std::vector<seed> make_seeds() {
  return {client_bytes(0),
          client_bytes(2),
          client_bytes(4),
          server_bytes(0),
          server_bytes(static_cast<int16_t>(comm::status::rejected)),
          client_bytes(2 | 8),
          client_bytes(2 | 16),
          client_bytes(2 | 8 | 16),
          server_bytes(1 | 8, 0),
          server_bytes(1 | 16, 0),
          server_bytes(1 | 8 | 16, static_cast<int16_t>(comm::status::rejected))};
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  setup& s = the_setup();
  const size_t baseline = comm::fuzz::open_fds().size();
  s.events.reset();
  const uint8_t flags = data[0];
  const family& f = s.families[(flags & 8u) != 0 ? 1 : 0];
  const bool flow = (flags & 16u) != 0;
  if (flags & 1u) {
    client_side(s, f, flow, data + 1, size - 1);
  } else {
    server_side(s, f, (flags & 4u) != 0, (flags & 2u) != 0, flow, data + 1, size - 1);
  }
  settle(s, baseline);
  return 0;
}
