// The tcp connection manager against hostile clients and against callbacks that answer, end or
// progress things from inside: requests rejected, accepted or dropped inside the request
// callback, malformed private data, a listener destroyed inside its own callback, nested progress
// and closes inside connect and error callbacks, a worker destroyed inside its callback; floods of
// half-open sockets from one source or another, silent sockets closed at the hello deadline, and a
// server short of descriptors that must neither spin nor keep good clients out.
//
// Freed memory is poisoned in this executable (operator delete below, as glibc's MALLOC_PERTURB_
// does), so a connection used after it was freed reads garbage and crashes in any build, not only
// under AddressSanitizer.
#define BOOST_TEST_MODULE cm_hostile
#include <boost/test/unit_test.hpp>

#include "listener_fixture.hpp"
#include "process_harness.hpp"

#include <comm/wire/codec.hpp>

#include "tcp/tcp.capnp.h"

#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
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

/// Sockets closed when the set goes, whatever happens in the test.
struct socket_set {
  socket_set() = default;
  socket_set(const socket_set&) = delete;
  socket_set& operator=(const socket_set&) = delete;
  ~socket_set() {
    for (int fd : fds) ::close(fd);
  }
  std::vector<int> fds;
};

/// Opens `count` sockets to `port` from `source` into `out` that never say anything, calling
/// `step` after every `batch` of them (to let an in-process server accept).
template <class Step>
void open_silent(socket_set& out, const char* source, uint16_t port, int count, int batch,
                 Step&& step) {
  for (int i = 0; i < count; ++i) {
    const int fd = connect_from(source, port);
    if (fd < 0) return;
    out.fds.push_back(fd);
    if ((i + 1) % batch == 0) step();
  }
}

/// True when the peer closed `fd` (end of file or reset).
bool closed_by_peer(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  return n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE));
}

/// How many of `sockets` the peer closed.
size_t count_closed(const socket_set& sockets) {
  size_t n = 0;
  for (int fd : sockets.fds) n += closed_by_peer(fd) ? 1 : 0;
  return n;
}

/// Raises this process's descriptor limit to at least `wanted` (the hard limit too: the tests run
/// as root); false when it cannot.
bool raise_fd_limit(rlim_t wanted) {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return false;
  if (files.rlim_cur >= wanted) return true;
  files.rlim_cur = wanted;
  files.rlim_max = std::max(files.rlim_max, wanted);
  return ::setrlimit(RLIMIT_NOFILE, &files) == 0;
}

/// Progresses `w` until nothing of it is ready (at most 1000 rounds). Through wait(0), which
/// polls whatever is ready at once, not after the idle backoff of progress().
void drain(worker& w) {
  for (int i = 0; i < 1000 && w.wait(0) != status::timed_out; ++i) {
  }
}

/// Sets an environment variable for the lifetime of this object.
struct scoped_env {
  scoped_env(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~scoped_env() { ::unsetenv(name_); }
  const char* name_;
};

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
  kj::Array<capnp::word> receive(Step&& step) {
    kj::Array<capnp::word> message;
    bool closed = false;
    spin_until(step, [&] {
      uint8_t chunk[4096];
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n > 0) rx.insert(rx.end(), chunk, chunk + n);
      closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      if (rx.size() < 4) return closed;
      const uint32_t length = rx[0] | (rx[1] << 8) | (rx[2] << 16) | (uint32_t{rx[3]} << 24);
      if (rx.size() < 4 + size_t{length}) return closed;
      message = kj::heapArray<capnp::word>(length / 8);
      std::memcpy(message.begin(), rx.data() + 4, length);
      rx.erase(rx.begin(), rx.begin() + 4 + length);
      return true;
    }, 10.0);
    return message;
  }

  /// The status of the reply the server sends next, or 1 when the next message is no reply.
  template <class Step>
  int reply_status(Step&& step) {
    const auto words = receive(step);
    if (words.size() == 0) return 1;
    capnp::FlatArrayMessageReader reader(words);
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
  ep_events ce;  // declared first: the client's endpoint tells it until the client is gone
  client cli(config_with({"shm", "tcp"}));
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

// -- a process short of descriptors ---------------------------------------------------------------

/// Nanoseconds the threads of `pid` were runnable (on a CPU or waiting for one), from
/// /proc/<pid>/task/*/schedstat. On a loaded machine a spinning process gets only a share of a
/// CPU, but it is runnable all the time; an idle one almost never.
uint64_t runnable_ns(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  uint64_t total = 0;
  DIR* dir = ::opendir(tasks.c_str());
  if (dir == nullptr) return 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream stat(tasks + "/" + entry->d_name + "/schedstat");
    uint64_t on_cpu = 0, waiting = 0;
    if (stat >> on_cpu >> waiting) total += on_cpu + waiting;
  }
  ::closedir(dir);
  return total;
}

/// Fraction of `seconds` of wall time that `pid` was runnable.
double runnable_fraction(pid_t pid, double seconds) {
  const uint64_t before = runnable_ns(pid);
  const auto start = steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double wall = std::chrono::duration<double>(steady_clock::now() - start).count();
  return static_cast<double>(runnable_ns(pid) - before) / 1e9 / wall;
}

/// A server that accepts every request inside its callback and echoes what arrives with tag 1
/// back as tag 2 on the newest endpoint.
struct echo_server {
  echo_server() : ctx(config_with({"shm", "tcp"})) {
    worker_params wp;
    wp.name = "echo";
    w = worker::create(ctx, wp).value();
    listener_params lp;
    lp.address = "127.0.0.1:0";
    lp.arg = this;
    lp.on_request = [](void* arg, conn_request* r) {
      auto* self = static_cast<echo_server*>(arg);
      endpoint* ep = nullptr;
      if (self->w->accept(r, endpoint_params{}, &ep) == status::ok) self->newest = ep;
    };
    if (w->listen(lp, &l) != status::ok) l.reset();
    post_receive();
  }

  void post_receive() {
    received = recv_tracker{};
    recv = w->tag_recv(buffer, sizeof(buffer), 1, tag_mask_full, recv_params(received));
  }

  /// Sends back what arrived, if anything, and posts the next receive.
  void echo() {
    if (!recv.done() && received.calls == 0) return;
    if (newest != nullptr) {
      op sent = newest->tag_send(2, buffer, sizeof(buffer));
      if (sent.req != nullptr) w->release(sent.req);
    }
    if (recv.req != nullptr) w->release(recv.req);
    post_receive();
  }

  context ctx;
  std::unique_ptr<worker> w;
  std::unique_ptr<listener> l;
  endpoint* newest = nullptr;
  uint8_t buffer[64] = {};
  recv_tracker received;
  op recv;
};

/// Takes every free descriptor into `hogged` (command 1), gives two back (2) or all (3).
void hog_descriptors(uint64_t command, std::vector<int>& hogged) {
  if (command == 1) {
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) hogged.push_back(fd);
    return;
  }
  for (size_t n = command == 2 ? 2 : hogged.size(); n > 0 && !hogged.empty(); --n) {
    ::close(hogged.back());
    hogged.pop_back();
  }
}

/// The child of a_server_short_of_descriptors_neither_spins_nor_keeps_good_clients_out: an echo
/// server under a descriptor limit 32 above what it holds once listening, sleeping in wait()
/// between events. It obeys words from the parent (see hog_descriptors; 4 ends it).
int serve_short_of_descriptors(const channel& commands, const channel& replies) {
  echo_server srv;
  CHILD_CHECK(srv.l != nullptr);
  rlimit files{};
  files.rlim_cur = files.rlim_max = open_fds() + 32;
  CHILD_CHECK(::setrlimit(RLIMIT_NOFILE, &files) == 0);
  replies.send_word(srv.l->port());
  std::vector<int> hogged;
  const auto deadline = steady_clock::now() + std::chrono::seconds(60);
  while (steady_clock::now() < deadline) {
    (void)srv.w->wait(100);
    srv.echo();
    pollfd pending{commands.fds[0], POLLIN, 0};
    uint64_t command = 0;
    if (::poll(&pending, 1, 0) != 1 || !commands.receive_word(&command)) continue;
    if (command == 4) return 0;
    hog_descriptors(command, hogged);
    replies.send_word(hogged.size());
  }
  return 2;
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

/// Connects a client to the echo server on `port` and checks the echo, within the client's
/// default timeout.
bool echo_through(uint16_t port, uint32_t seed) {
  ep_events ce;
  client cli(config_with({"shm", "tcp"}));
  endpoint* cep = nullptr;
  if (cli.w->connect("127.0.0.1:" + std::to_string(port), params_for(ce), &cep) != status::ok) {
    return false;
  }
  if (!spin_until([&] { (void)cli.w->wait(5); }, [&] { return ce.connects || ce.errors; }, 15)) {
    return false;
  }
  BOOST_TEST_INFO("the client was told " << ce.error);
  BOOST_TEST(ce.connects == 1);
  if (ce.connects != 1) return false;
  const auto data = pattern(64, seed);
  std::vector<uint8_t> got(64);
  recv_tracker r;
  op rop = cli.w->tag_recv(got.data(), got.size(), 2, tag_mask_full, recv_params(r));
  op sop = cep->tag_send(1, data.data(), data.size());
  const bool echoed = !sop.failed() && spin_until([&] { (void)cli.w->wait(5); },
                                                  [&] { return rop.done() || r.calls == 1; }, 15);
  if (rop.req != nullptr) cli.w->release(rop.req);
  if (sop.req != nullptr) cli.w->release(sop.req);
  return echoed && first_mismatch(got.data(), got.size(), seed) < 0;
}

}  // namespace

// -- answers and ends inside callbacks ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(requests_rejected_inside_their_callback_fail_their_clients_only) {
  ep_events se;  // told about the server's endpoint until the server is gone
  server srv(config_with({"shm", "tcp"}));
  srv.answer = [&](conn_request* r) { BOOST_TEST(srv.l->reject(r) == status::ok); };
  for (int i = 0; i < 20; ++i) {
    ep_events ce;
    client cli(config_with({"shm", "tcp"}));
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
    BOOST_REQUIRE(raw.receive(step).size() != 0);  // the challenge
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
  auto second = worker::create(srv.ctx, wp).value();
  for (int i = 0; i < 2; ++i) {
    worker* on = i == 0 ? srv.w.get() : second.get();
    endpoint* sep = nullptr;
    srv.answer = [&](conn_request* r) {
      BOOST_TEST(on->accept(r, params_for(se[i]), &sep) == status::ok);
    };
    ep_events ce;
    client cli(config_with({"shm", "tcp"}));
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

BOOST_AUTO_TEST_CASE(a_send_waiting_for_the_handshake_may_close_and_progress_in_its_callback) {
  ep_events ce, se;
  send_tracker s;
  server srv(config_with({"shm", "tcp"}));
  srv.answer = [&](conn_request* r) { accept_into(*srv.w, r, se); };
  client cli(config_with({"shm", "tcp"}));
  endpoint* cep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
  // The send waits for the handshake; when it ends, the send completes inside the connection
  // manager's callback, and its own callback closes the endpoint and progresses the worker.
  s.check = [&](status) {
    op closing = cep->close();
    if (closing.req != nullptr) cli.w->release(closing.req);
    for (int i = 0; i < 5; ++i) cli.w->progress();
  };
  const uint64_t word = 7;
  op sop = cep->tag_send(1, &word, sizeof(word), send_params(s));
  BOOST_REQUIRE(sop.pending());
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return s.calls == 1 && se.errors == 1; }));
  BOOST_TEST(s.st == status::ok);
  BOOST_TEST(se.error == status::not_connected);
  cli.w->release(sop.req);
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
    ep_events ce;
    client cli(config_with({"shm", "tcp"}));
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

// -- half-open floods -----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(thousands_of_half_open_sockets_do_not_keep_a_good_client_out) {
  constexpr int flood = 4300;
  constexpr size_t max_handshakes = 1024;  // the default
  BOOST_REQUIRE(raise_fd_limit(16384));
  ep_events se;
  server srv(config_with({"shm", "tcp"}));
  const size_t fds_before = open_fds();
  socket_set silent;
  open_silent(silent, "127.0.0.1", srv.port, flood, 64, [&] { drain(*srv.w); });
  BOOST_REQUIRE_EQUAL(silent.fds.size(), size_t{flood});
  drain(*srv.w);
  // The server holds at most its limit of handshakes: it closed the oldest beyond it.
  BOOST_TEST(count_closed(silent) >= flood - max_handshakes);
  BOOST_TEST(open_fds() <= fds_before + flood + max_handshakes);
  srv.answer = [&](conn_request* r) { accept_into(*srv.w, r, se); };
  BOOST_TEST(good_client_gets_through(srv));
}

BOOST_AUTO_TEST_CASE(a_flooding_source_sheds_its_own_handshakes_first) {
  BOOST_REQUIRE(raise_fd_limit(16384));
  const scoped_env cap("COMM_TCP_CM_MAX_HANDSHAKES", "64");
  ep_events ce, se;
  server srv(config_with({"shm", "tcp"}));
  auto step = [&] { srv.w->progress(); srv.w->progress(); };
  // 127.0.0.2 floods before and all along the good client's handshake, 64 new sockets per
  // round: more than the limit every round, so a newest-first client from 127.0.0.1 would be
  // shed if the oldest handshake of any source went first.
  socket_set silent;
  open_silent(silent, "127.0.0.2", srv.port, 512, 64, step);
  client cli(config_with({"shm", "tcp"}));
  endpoint* cep = nullptr;
  srv.answer = [&](conn_request* r) { accept_into(*srv.w, r, se); };
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
  const bool done = spin_until([&] {
    open_silent(silent, "127.0.0.2", srv.port, 64, 64, step);
    cli.w->progress();
  }, [&] { return ce.connects == 1 || ce.errors != 0 || silent.fds.size() > 6000; }, 15);
  BOOST_TEST(done);
  BOOST_TEST_INFO("the good client was told " << ce.error);
  BOOST_TEST(ce.connects == 1);
  if (ce.connects == 1) BOOST_TEST(tag_exchange(*cli.w, cep, *srv.w, 64, 6));
  drain(*srv.w);
  BOOST_TEST(count_closed(silent) >= silent.fds.size() - 64);
}

BOOST_AUTO_TEST_CASE(a_silent_socket_is_closed_at_the_hello_deadline) {
  const scoped_env hello("COMM_TCP_CM_HELLO_TIMEOUT", "200");
  const scoped_env whole("COMM_TCP_CM_HANDSHAKE_TIMEOUT", "3000");
  server srv(config_with({"shm", "tcp"}));
  const auto start = steady_clock::now();
  auto seconds_since_start = [&] {
    return std::chrono::duration<double>(steady_clock::now() - start).count();
  };
  socket_set silent;
  silent.fds.push_back(connect_from("127.0.0.1", srv.port));
  raw_cm_client greeter(srv.port);
  BOOST_REQUIRE(greeter.send_hello());
  auto step = [&] { (void)srv.w->wait(10); };
  BOOST_REQUIRE(spin_until(step, [&] { return closed_by_peer(silent.fds[0]); }, 10));
  const double silent_closed = seconds_since_start();
  BOOST_TEST(silent_closed >= 0.15);
  BOOST_TEST(silent_closed < 2.5);  // not the 3 s handshake deadline
  BOOST_TEST(greeter.receive(step).size() != 0);  // its challenge: it is past the hello
  spin_until(step, [&] { return seconds_since_start() > 1.0; }, 5);
  BOOST_TEST(!closed_by_peer(greeter.fd));
  BOOST_REQUIRE(spin_until(step, [&] { return closed_by_peer(greeter.fd); }, 15));
  BOOST_TEST(seconds_since_start() >= 2.9);
}

BOOST_AUTO_TEST_CASE(a_server_short_of_descriptors_neither_spins_nor_keeps_good_clients_out) {
  BOOST_REQUIRE(raise_fd_limit(8192));
  channel commands, replies;
  child_guard child;
  child.pid = fork_child([&] { return serve_short_of_descriptors(commands, replies); });
  uint64_t port = 0, hogged = 0;
  BOOST_REQUIRE(replies.receive_word(&port));
  auto tell = [&](uint64_t command) {
    commands.send_word(command);
    return replies.receive_word(&hogged);
  };
  auto settle = [] { std::this_thread::sleep_for(milliseconds(300)); };
  auto none = [] {};
  // Every descriptor taken: nothing can be accepted nor shed. Accepting pauses; no spinning.
  BOOST_REQUIRE(tell(1));
  BOOST_TEST(hogged > 0u);
  socket_set silent;
  open_silent(silent, "127.0.0.1", static_cast<uint16_t>(port), 300, 300, none);
  settle();
  BOOST_TEST(runnable_fraction(child.pid, 1.5) < 0.25);
  // Two descriptors free: handshakes take them, and the oldest are shed for the newer ones.
  BOOST_REQUIRE(tell(2));
  BOOST_TEST(spin_until(settle, [&] { return count_closed(silent) >= 250; }, 10));
  BOOST_TEST(runnable_fraction(child.pid, 1.5) < 0.25);
  // Descriptors back: a good client gets in and is echoed, within its default timeout.
  BOOST_REQUIRE(tell(3));
  BOOST_TEST(echo_through(static_cast<uint16_t>(port), 21));
  // Flooded with descriptors to spare: the handshake limit (a quarter of the descriptor limit)
  // holds, the child stays idle, and a good client still gets in.
  open_silent(silent, "127.0.0.1", static_cast<uint16_t>(port), 300, 300, none);
  settle();
  BOOST_TEST(runnable_fraction(child.pid, 1.5) < 0.25);
  BOOST_TEST(echo_through(static_cast<uint16_t>(port), 22));
  commands.send_word(4);
  int wstatus = 0;
  auto ended = [&] { return ::waitpid(child.pid, &wstatus, WNOHANG) == child.pid; };
  BOOST_REQUIRE(spin_until(settle, ended, 10));  // else the guard kills it
  child.pid = -1;
  BOOST_TEST((WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0));
}
