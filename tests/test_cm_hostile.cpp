// The tcp connection manager against hostile clients and against callbacks that answer, end or
// progress things from inside: requests rejected, accepted or dropped inside the request
// callback, malformed private data, a listener destroyed inside its own callback, nested progress
// and closes inside connect and error callbacks, a worker destroyed inside its callback.
//
// Freed memory is poisoned in this executable (operator delete below, as glibc's MALLOC_PERTURB_
// does), so a connection used after it was freed reads garbage and crashes in any build, not only
// under AddressSanitizer.
#define BOOST_TEST_MODULE cm_hostile
#include <boost/test/unit_test.hpp>

#include "listener_fixture.hpp"
#include "process_harness.hpp"

#include <comm/wire/codec.hpp>

#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

// -- freed memory poisoned ------------------------------------------------------------------------

void* operator new(std::size_t size) {
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

namespace {

/// Poisons and frees a block. Not inlined: where the compiler sees both, a free() of what
/// operator new returned reads to it as a mismatch. The empty asm keeps the compiler from dropping
/// the memset as a store to memory about to be freed.
[[gnu::noinline]] void poison_and_free(void* p) noexcept {
  if (p == nullptr) return;
  std::memset(p, 0xa5, malloc_usable_size(p));
  asm volatile("" : : "r"(p) : "memory");
  std::free(p);
}

}  // namespace

void operator delete(void* p) noexcept { poison_and_free(p); }

void operator delete(void* p, std::size_t) noexcept { poison_and_free(p); }

using namespace comm;
using namespace comm::test;
namespace schema = comm::wire::schema;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

// -- sockets --------------------------------------------------------------------------------------

/// A nonblocking TCP connect to 127.0.0.1:`port` from `source` (an address of 127/8); -1 when the
/// socket cannot be made.
int connect_from(const char* source, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 &&
       errno != EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// True when the peer closed `fd` (end of file or reset).
bool closed_by_peer(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  return n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE));
}

// -- a client speaking the connection manager's protocol by hand ----------------------------------

/// A raw socket to a listener on which a test writes and reads CmMessage frames.
struct raw_cm_client {
  explicit raw_cm_client(uint16_t port) : fd(connect_from("127.0.0.1", port)) {}
  ~raw_cm_client() {
    if (fd >= 0) ::close(fd);
  }

  /// Writes a frame whose message `fill` builds.
  template <class Fill>
  bool send(Fill&& fill) {
    capnp::MallocMessageBuilder message;
    fill(message.initRoot<schema::CmMessage>());
    auto words = capnp::messageToFlatArray(message);
    auto body = words.asBytes();
    std::vector<uint8_t> frame(4 + body.size());
    for (size_t i = 0; i < 4; ++i) frame[i] = static_cast<uint8_t>(body.size() >> (8 * i));
    std::memcpy(frame.data() + 4, body.begin(), body.size());
    return send_bytes(frame);
  }

  bool send_bytes(const std::vector<uint8_t>& bytes) {
    pollfd pfd{fd, POLLOUT, 0};
    return ::poll(&pfd, 1, 5000) == 1 &&
           ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(bytes.size());
  }

  bool send_hello() {
    return send([](schema::CmMessage::Builder m) {
      auto hello = m.initHello();
      hello.setVersion(1);
      hello.initNonce(16);
    });
  }

  bool send_request(const std::vector<uint8_t>& private_data) {
    return send([&](schema::CmMessage::Builder m) {
      m.initRequest().setPrivateData(kj::arrayPtr(private_data.data(), private_data.size()));
    });
  }

  /// Waits for the next message, calling `step` meanwhile (at most 10 s); its words, or none when
  /// the server closed the socket or said nothing.
  template <class Step>
  std::vector<capnp::word> receive(Step&& step) {
    std::vector<capnp::word> message;
    bool closed = false;
    spin_until(step, [&] {
      uint8_t chunk[4096];
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n > 0) rx.insert(rx.end(), chunk, chunk + n);
      closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      if (rx.size() < 4) return closed;
      const uint32_t length = rx[0] | (rx[1] << 8) | (rx[2] << 16) | (uint32_t{rx[3]} << 24);
      if (rx.size() < 4 + size_t{length}) return closed;
      message.resize(length / 8);
      std::memcpy(message.data(), rx.data() + 4, length);
      rx.erase(rx.begin(), rx.begin() + 4 + length);
      return true;
    }, 10.0);
    return message;
  }

  /// The status of the reply the server sends next, or 1 when the next message is no reply.
  template <class Step>
  int reply_status(Step&& step) {
    const auto words = receive(step);
    if (words.empty()) return 1;
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.data(), words.size()));
    auto root = reader.getRoot<schema::CmMessage>();
    return root.isReply() ? root.getReply().getStatus() : 1;
  }

  int fd;
  std::vector<uint8_t> rx;
};

/// A CmEndpointData with these fields, as libcomm's client would send it.
std::vector<uint8_t> endpoint_data(uint32_t src_ep, const std::vector<uint8_t>& address) {
  capnp::MallocMessageBuilder message;
  auto data = message.initRoot<schema::CmEndpointData>();
  data.setSrcEp(src_ep);
  data.setAddress(kj::arrayPtr(address.data(), address.size()));
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

// -- callbacks that reenter -----------------------------------------------------------------------

/// What reentering endpoint callbacks were told, and what they do inside: progress `w` again
/// (unless it is null: a worker being destroyed fails its endpoints), and close the endpoint when
/// `close_inside` is set.
struct reentrant {
  worker* w = nullptr;
  bool close_inside = false;
  int connects = 0;
  int errors = 0;
  status error = status::ok;
};

void progress_inside(reentrant* r) {
  for (int i = 0; r->w != nullptr && i < 5; ++i) r->w->progress();
}

void reenter_on_connect(void* arg, endpoint* ep, const uint8_t*, size_t) {
  auto* r = static_cast<reentrant*>(arg);
  ++r->connects;
  progress_inside(r);
  if (!r->close_inside) return;
  op closing = ep->close();
  if (closing.req != nullptr) r->w->release(closing.req);
  progress_inside(r);
}

void reenter_on_error(void* arg, endpoint*, status reason) {
  auto* r = static_cast<reentrant*>(arg);
  ++r->errors;
  r->error = reason;
  progress_inside(r);
}

endpoint_params reentrant_params(reentrant& r) {
  endpoint_params p;
  p.on_connect = reenter_on_connect;
  p.connect_arg = &r;
  p.on_error = reenter_on_error;
  p.error_arg = &r;
  return p;
}

/// Connects a client to `srv`, whose `answer` must accept, and exchanges data both ways.
bool good_client_gets_through(server& srv) {
  client cli(config_with({"shm", "tcp"}));
  ep_events ce;
  endpoint* cep = nullptr;
  if (cli.w->connect(srv.address(), params_for(ce), &cep) != status::ok) return false;
  if (!run(*srv.w, *cli.w, [&] { return ce.connects == 1 || ce.errors != 0; })) return false;
  BOOST_TEST_INFO("the good client was told " << ce.error);
  BOOST_TEST(ce.connects == 1);
  return ce.connects == 1 && tag_exchange(*cli.w, cep, *srv.w, 100, 11);
}

/// Accepts `r` on `w`, keeping the endpoint's events in `e`.
void accept_into(worker& w, conn_request* r, ep_events& e) {
  endpoint* ep = nullptr;
  BOOST_TEST(w.accept(r, params_for(e), &ep) == status::ok);
}

/// Kills the child on the way out, whatever happens in the test.
struct child_guard {
  ~child_guard() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  pid_t pid = -1;
};

}  // namespace

// -- answers and ends inside callbacks ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(requests_rejected_inside_their_callback_fail_their_clients_only) {
  ep_events se;  // told about the server's endpoint until the server is gone
  server srv(config_with({"shm", "tcp"}));
  srv.answer = [&](conn_request* r) { BOOST_TEST(srv.l->reject(r) == status::ok); };
  for (int i = 0; i < 20; ++i) {
    client cli(config_with({"shm", "tcp"}));
    ep_events ce;
    endpoint* cep = nullptr;
    BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.errors == 1; }));
    BOOST_TEST(ce.error == status::rejected);
  }
  srv.answer = [&](conn_request* r) { accept_into(*srv.w, r, se); };
  BOOST_TEST(good_client_gets_through(srv));
  BOOST_TEST(srv.l->requests() == 21u);
}

BOOST_AUTO_TEST_CASE(malformed_private_data_is_rejected_and_the_listener_goes_on) {
  ep_events se;
  server srv(config_with({"shm", "tcp"}));
  int delivered = 0;
  srv.answer = [&](conn_request* r) {
    ++delivered;
    BOOST_TEST(srv.l->reject(r) == status::ok);
  };
  const std::vector<std::vector<uint8_t>> malformed = {
      {},
      std::vector<uint8_t>(24, 0xee),
      {1, 2, 3, 4, 5, 6, 7},
      endpoint_data(0, {1, 2, 3}),                         // no endpoint id
      endpoint_data(5, std::vector<uint8_t>(40, 0x5a)),  // no worker address
  };
  auto step = [&] { srv.w->progress(); };
  for (const auto& data : malformed) {
    raw_cm_client raw(srv.port);
    BOOST_REQUIRE(raw.send_hello());
    BOOST_REQUIRE(!raw.receive(step).empty());  // the challenge
    BOOST_REQUIRE(raw.send_request(data));
    BOOST_TEST(raw.reply_status(step) == static_cast<int>(status::rejected));
    BOOST_TEST(spin_until(step, [&] { return closed_by_peer(raw.fd); }, 10));
  }
  BOOST_TEST(delivered == 0);  // libcomm rejected them itself
  srv.answer = [&](conn_request* r) { accept_into(*srv.w, r, se); };
  BOOST_TEST(good_client_gets_through(srv));
}

BOOST_AUTO_TEST_CASE(requests_accepted_inside_their_callback_here_or_on_another_worker) {
  ep_events se[2];
  server srv(config_with({"shm", "tcp"}));
  worker_params wp;
  wp.name = "second";
  auto second = worker::create(srv.ctx, wp);
  for (int i = 0; i < 2; ++i) {
    worker* on = i == 0 ? srv.w.get() : second.get();
    endpoint* sep = nullptr;
    srv.answer = [&](conn_request* r) {
      BOOST_TEST(on->accept(r, params_for(se[i]), &sep) == status::ok);
    };
    client cli(config_with({"shm", "tcp"}));
    ep_events ce;
    endpoint* cep = nullptr;
    BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
    BOOST_REQUIRE(spin_until([&] { srv.w->progress(); second->progress(); cli.w->progress(); },
                             [&] { return ce.connects == 1 && se[i].connects == 1; }, 10));
    BOOST_TEST(tag_exchange(*cli.w, cep, *on, 64, 3));
    BOOST_TEST(tag_exchange(*on, sep, *cli.w, 64, 4));
  }
}

BOOST_AUTO_TEST_CASE(a_listener_destroyed_inside_its_own_callback_rejects_and_drops_the_rest) {
  ep_events ae, be;
  server srv(config_with({"shm", "tcp"}));
  srv.answer = [&](conn_request*) { srv.l.reset(); };  // the request goes with its listener
  client a(config_with({"shm", "tcp"})), b(config_with({"shm", "tcp"}));
  endpoint* aep = nullptr;
  endpoint* bep = nullptr;
  BOOST_REQUIRE_EQUAL(a.w->connect(srv.address(), params_for(ae), &aep), status::ok);
  BOOST_REQUIRE_EQUAL(b.w->connect(srv.address(), params_for(be), &bep), status::ok);
  BOOST_REQUIRE(spin_until([&] { srv.w->progress(); a.w->progress(); b.w->progress(); },
                           [&] { return ae.errors == 1 && be.errors == 1; }, 15));
  BOOST_TEST(!srv.l);
  BOOST_TEST((ae.error == status::rejected || be.error == status::rejected));
  BOOST_TEST(ae.connects + be.connects == 0);
}

BOOST_AUTO_TEST_CASE(callbacks_may_progress_again_and_close_inside) {
  reentrant cr, sr, closer, closed, refused;
  server srv(config_with({"shm", "tcp"}));
  client cli(config_with({"shm", "tcp"}));
  cr.w = closer.w = refused.w = cli.w.get();
  sr.w = closed.w = srv.w.get();
  closer.close_inside = true;
  // Connected on both sides, each callback progressing its worker again from inside.
  endpoint* sep = nullptr;
  srv.answer = [&](conn_request* r) {
    BOOST_TEST(srv.w->accept(r, reentrant_params(sr), &sep) == status::ok);
    srv.w->progress();
  };
  endpoint* cep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), reentrant_params(cr), &cep), status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return cr.connects == 1 && sr.connects == 1; }));
  BOOST_TEST(tag_exchange(*cli.w, cep, *srv.w, 64, 5));
  // Closed inside the client's connect callback: the server is told.
  srv.answer = [&](conn_request* r) {
    BOOST_TEST(srv.w->accept(r, reentrant_params(closed), &sep) == status::ok);
  };
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), reentrant_params(closer), &cep), status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return closer.connects == 1 && closed.errors == 1; }));
  BOOST_TEST(closed.error == status::not_connected);
  // Rejected: the client's error callback progresses again from inside.
  srv.answer = [&](conn_request* r) { BOOST_TEST(srv.l->reject(r) == status::ok); };
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), reentrant_params(refused), &cep), status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return refused.errors == 1; }));
  BOOST_TEST(refused.error == status::rejected);
  for (reentrant* r : {&cr, &sr, &closer, &closed, &refused}) r->w = nullptr;
}

BOOST_AUTO_TEST_CASE(a_worker_destroyed_inside_its_own_callback_aborts_with_a_message) {
  channel err;
  child_guard guard;
  const pid_t child = fork_child([&] {
    ::signal(SIGABRT, SIG_DFL);  // not Boost.Test's handler, which would go on with the tests
    ::dup2(err.fds[1], 2);
    server srv(config_with({"shm", "tcp"}));
    srv.answer = [&](conn_request*) {
      srv.l.reset();
      srv.w.reset();
    };
    client cli(config_with({"shm", "tcp"}));
    ep_events ce;
    endpoint* cep = nullptr;
    CHILD_CHECK(cli.w->connect(srv.address(), params_for(ce), &cep) == status::ok);
    spin_until([&] { srv.w->progress(); cli.w->progress(); }, [] { return false; }, 10);
    return 3;
  });
  guard.pid = child;
  ::close(err.fds[1]);
  err.fds[1] = -1;
  int wstatus = 0;
  BOOST_REQUIRE(spin_until([] { std::this_thread::sleep_for(milliseconds(10)); },
                           [&] { return ::waitpid(child, &wstatus, WNOHANG) == child; }, 20));
  guard.pid = -1;
  BOOST_TEST((WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGABRT));
  char text[4096] = {};
  const ssize_t n = ::read(err.fds[0], text, sizeof(text) - 1);
  BOOST_TEST_INFO("stderr: " << (n > 0 ? text : ""));
  BOOST_TEST(std::strstr(text, "destroyed inside one of its own") != nullptr);
}

