// Two real processes on every transport that reaches another process (shm): a forked child
// creates its own context and worker, the two exchange worker addresses over a socketpair and
// ping-pong tagged messages and active messages of many sizes. Then a peer killed with SIGKILL
// mid-stream: the survivor's outstanding sends (queued and zcopy) complete with an error, its
// endpoint error handlers fire, nothing hangs, and once the survivor's worker is gone no file
// descriptor is left open and /dev/shm holds nothing new.
#define BOOST_TEST_MODULE multiprocess
#include "fixture.hpp"
#include "test_util.hpp"

// The kill test parks eager sends behind a stalled peer: rendezvous stays out of its way
// (test_rndv_processes covers peers dying mid-rendezvous).
using comm::test::eager_only_suite;
BOOST_TEST_GLOBAL_FIXTURE(eager_only_suite);

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <set>
#include <thread>

using namespace comm;
using namespace comm::test;

namespace mp_test {

// -- plumbing ------------------------------------------------------------------------------------

bool write_all(int fd, const void* data, size_t length) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (length > 0) {
    const ssize_t n = ::write(fd, p, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

/// Reads exactly `length` bytes, waiting at most `timeout_ms` in total.
bool read_all(int fd, void* data, size_t length, int timeout_ms = 30000) {
  auto* p = static_cast<uint8_t*>(data);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (length > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int ready = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = ::read(fd, p, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

bool send_blob(int fd, const std::vector<uint8_t>& blob) {
  const uint32_t n = static_cast<uint32_t>(blob.size());
  return write_all(fd, &n, sizeof(n)) && write_all(fd, blob.data(), blob.size());
}

bool recv_blob(int fd, std::vector<uint8_t>* blob) {
  uint32_t n = 0;
  if (!read_all(fd, &n, sizeof(n)) || n > (1u << 20)) return false;
  blob->resize(n);
  return read_all(fd, blob->data(), n);
}

/// Names in /dev/shm.
std::set<std::string> dev_shm() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') names.insert(e->d_name);
    }
    ::closedir(d);
  }
  return names;
}

/// Waits for `pid` up to `seconds`, then kills it; returns its wait status, or -1.
int reap(pid_t pid, double seconds = 60) {
  int wstatus = 0;
  const bool done = spin_until([] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); },
                               [&] { return ::waitpid(pid, &wstatus, WNOHANG) == pid; }, seconds);
  if (done) return wstatus;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &wstatus, 0);
  return -1;
}

/// A process's side of a connection: its own context and worker, an endpoint to the peer, the
/// socket to the other process. Used by parent and child alike (no Boost.Test in the child).
struct side {
  std::unique_ptr<context> ctx;
  std::unique_ptr<worker> w;
  endpoint* ep = nullptr;
  int sock = -1;

  /// Creates the worker, swaps addresses over `sock_fd`, connects and finishes wireup.
  /// Returns an empty string, or what went wrong.
  std::string start(const std::string& transport, int sock_fd, const char* name,
                    std::function<void(config&)> tweak = {}) {
    sock = sock_fd;
    config cfg = config_for(transport);
    if (tweak) tweak(cfg);
    ctx = std::make_unique<context>(cfg);
    if (ctx->components().size() != 1) return "transport " + transport + " unavailable";
    worker_params wp;
    wp.name = name;
    w = worker::create(*ctx, wp).value();
    if (!send_blob(sock, w->address())) return "cannot send the address";
    std::vector<uint8_t> peer;
    if (!recv_blob(sock, &peer)) return "cannot read the peer's address";
    const status st = w->connect(peer, &ep);
    if (st != status::ok) return std::string("connect: ") + to_string(st);
    if (!spin_until([&] { w->progress(); }, [&] { return worker_pair::wired(ep); })) {
      return "wireup did not finish";
    }
    // The peer's wireup needs our answer too: keep progressing until it says it is done.
    if (!signal(wired_byte) || !await_progressing(wired_byte)) {
      return "the peer did not finish wireup";
    }
    return {};
  }

  static constexpr uint8_t wired_byte = 'w';

  /// Like await, but progresses the worker while waiting.
  bool await_progressing(uint8_t what, double seconds = default_wait_seconds) {
    bool arrived = false;
    spin_until([&] { w->progress(); },
               [&] {
                 pollfd pfd{sock, POLLIN, 0};
                 arrived = ::poll(&pfd, 1, 0) > 0;
                 return arrived;
               },
               seconds);
    return arrived && await(what, 1000);
  }

  /// Progresses until `o` is over (bounded); returns its status (timed_out if it is not).
  status finish(op o, double seconds = default_wait_seconds) {
    if (o.req == nullptr) return o.st;
    if (!spin_until([&] { w->progress(); },
                    [&] { return w->request_status(o.req) != status::in_progress; }, seconds)) {
      return status::timed_out;
    }
    const status st = w->request_status(o.req);
    w->release(o.req);
    return st;
  }

  /// A one-byte sync message over the socket (no progress of the worker meanwhile).
  bool signal(uint8_t what) { return write_all(sock, &what, 1); }
  bool await(uint8_t what, int timeout_ms = 30000) {
    uint8_t got = 0;
    return read_all(sock, &got, 1, timeout_ms) && got == what;
  }
};

/// Forks; the child runs `body(sock)` and exits with its result (0 = success). Returns the pid
/// and the parent's end of the socketpair.
template <class Body>
std::pair<pid_t, int> spawn(Body&& body) {
  int fds[2];
  BOOST_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    int code = 1;
    try {
      code = body(fds[1]);
    } catch (...) {
      std::fprintf(stderr, "child: exception\n");
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

#define CHILD_EXPECT(cond, ...)                                      \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::fprintf(stderr, "child %d: %s: ", getpid(), #cond);      \
      std::fprintf(stderr, __VA_ARGS__);                            \
      std::fprintf(stderr, "\n");                                   \
      return 1;                                                     \
    }                                                               \
  } while (0)

// -- ping-pong -----------------------------------------------------------------------------------

constexpr tag_t stop_tag = 0xDEAD;
constexpr uint16_t am_ping = 1, am_pong = 2;

std::vector<size_t> pingpong_sizes() {
  return {0, 1, 8, 100, 112, 113, 1000, 8000, 8192, 20000, 65536, 100000, 262144, 1u << 20};
}

/// A reply the echo child owes: the data of an AM and where to send it.
struct owed_reply {
  std::vector<uint8_t> header;
  std::vector<uint8_t> data;
  endpoint* reply_ep = nullptr;
};

status child_am_ping(void* arg, const void* header, size_t header_length, void* data,
                     size_t length, const am_recv_params& params) {
  auto* owed = static_cast<std::deque<owed_reply>*>(arg);
  owed_reply r;
  r.header.assign(static_cast<const uint8_t*>(header),
                  static_cast<const uint8_t*>(header) + header_length);
  r.data.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + length);
  r.reply_ep = (params.attr & am_recv_reply_ep) ? params.reply_ep : nullptr;
  owed->push_back(std::move(r));
  return status::ok;
}

/// The echo child: returns every tagged message with its tag and every AM ping as a pong on the
/// reply endpoint, until the stop tag comes.
int echo_child(const std::string& transport, int sock) {
  side s;
  const std::string err = s.start(transport, sock, "child");
  CHILD_EXPECT(err.empty(), "%s", err.c_str());
  std::deque<owed_reply> owed;
  CHILD_EXPECT(s.w->set_am_handler(am_ping, child_am_ping, &owed,
                                   am_flag_whole_msg | am_flag_fetch_rndv) == status::ok,
              "set_am_handler");
  std::vector<uint8_t> buffer(4u << 20);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::string failure;
  // Sends the pongs owed; false (with `failure` set) when one fails.
  auto serve_pings = [&] {
    while (!owed.empty()) {
      owed_reply reply = std::move(owed.front());
      owed.pop_front();
      if (reply.reply_ep == nullptr) {
        failure = "AM ping without a reply endpoint";
        return false;
      }
      op o = reply.reply_ep->am_send(am_pong, reply.header.data(), reply.header.size(),
                                     reply.data.data(), reply.data.size());
      const status st = s.finish(o);
      if (st != status::ok) {
        failure = std::string("pong: ") + to_string(st);
        return false;
      }
    }
    return true;
  };
  while (std::chrono::steady_clock::now() < deadline) {
    recv_tracker rt;
    request_params rp = recv_params(rt);
    rp.recv_info = &rt.info;  // when it completes in the call
    op r = s.w->tag_recv(buffer.data(), buffer.size(), 0, 0, rp);
    if (r.pending()) {
      // Serve AM pings while waiting for the next tagged message.
      const bool got = spin_until(
          [&] {
            s.w->progress();
            if (!serve_pings()) rt.calls = -1;
          },
          [&] { return rt.calls != 0; }, 60);
      CHILD_EXPECT(failure.empty(), "%s", failure.c_str());
      CHILD_EXPECT(got, "no message");
      CHILD_EXPECT(rt.st == status::ok, "receive: %s", to_string(rt.st));
      s.w->release(r.req);
    } else {
      CHILD_EXPECT(r.st == status::ok, "receive: %s", to_string(r.st));
    }
    const tag_recv_info info = rt.info;
    if (info.sender_tag == stop_tag) break;
    op back = s.ep->tag_send(info.sender_tag, buffer.data(), info.length);
    CHILD_EXPECT(s.finish(back) == status::ok, "echo of %zu bytes", info.length);
  }
  op f = s.ep->flush();
  CHILD_EXPECT(s.finish(f) == status::ok, "flush");
  op c = s.ep->close();
  s.finish(c);
  s.w.reset();
  s.ctx.reset();
  return 0;
}

// -- killed peer ---------------------------------------------------------------------------------

constexpr uint8_t ready = 'r', stalled = 's';

/// The victim child: receives `consume` messages, tells the parent it stalls, and waits to be
/// killed without ever progressing again.
int stalling_child(const std::string& transport, int sock, int consume) {
  side s;
  const std::string err =
      s.start(transport, sock, "victim", [](config& c) {
        c.transport_options = {
            {"COMM_SELF_FIFO_SIZE", "16"}, {"COMM_SHM_FIFO_SIZE", "16"}, {"COMM_TCP_WINDOW", "16"}};
      });
  CHILD_EXPECT(err.empty(), "%s", err.c_str());
  CHILD_EXPECT(s.signal(ready), "signal");
  std::vector<uint8_t> buffer(1u << 20);
  for (int i = 0; i < consume; ++i) {
    op r = s.w->tag_recv(buffer.data(), buffer.size(), 0, 0);
    CHILD_EXPECT(s.finish(r, 60) == status::ok, "receive %d", i);
  }
  CHILD_EXPECT(s.signal(stalled), "signal");
  ::pause();  // until SIGKILL
  return 0;
}

}  // namespace mp_test

using namespace mp_test;

BOOST_AUTO_TEST_SUITE(processes)

BOOST_AUTO_TEST_CASE(an_interprocess_transport_is_present) {
  BOOST_CHECK_MESSAGE(!interprocess_transports().empty(),
                      "no transport here carries traffic between processes");
}

BOOST_DATA_TEST_CASE(tag_and_am_pingpong, boost::unit_test::data::make(interprocess_transports()),
                     tl_name) {
  const auto [pid, sock] = spawn([&](int s) { return echo_child(tl_name, s); });
  side parent;
  const std::string err = parent.start(tl_name, sock, "parent");
  BOOST_REQUIRE_MESSAGE(err.empty(), err);
  BOOST_CHECK_EQUAL(parent.ep->transport(), tl_name);

  // Tagged ping-pong: the child echoes each message with its tag.
  uint32_t seed = 1;
  std::vector<uint8_t> in(1u << 20);
  for (size_t n : pingpong_sizes()) {
    for (int round = 0; round < 5; ++round, ++seed) {
      BOOST_TEST_CONTEXT("tag size " << n << " round " << round) {
        const std::vector<uint8_t> out = pattern(n, seed);
        recv_tracker rt;
        op r = parent.w->tag_recv(in.data(), in.size(), n, tag_mask_full, recv_params(rt));
        op s = parent.ep->tag_send(n, out.data(), out.size());
        BOOST_REQUIRE(!s.failed());
        BOOST_REQUIRE(spin_until([&] { parent.w->progress(); }, [&] { return rt.calls > 0; }));
        BOOST_CHECK(rt.st == status::ok);
        BOOST_CHECK_EQUAL(rt.info.length, n);
        BOOST_CHECK_EQUAL(rt.info.sender_tag, n);
        BOOST_CHECK_EQUAL(first_mismatch(in.data(), n, seed), -1);
        parent.w->release(r.req);
        BOOST_CHECK(parent.finish(s) == status::ok);
      }
    }
  }

  // AM ping-pong: pings carry a reply endpoint; the child answers each on it.
  struct pong_log {
    int calls = 0;
    std::vector<uint8_t> header, data;
  } pongs;
  BOOST_REQUIRE(parent.w->set_am_handler(
                    am_pong,
                    [](void* arg, const void* h, size_t hl, void* d, size_t l,
                       const am_recv_params&) {
                      auto* log = static_cast<pong_log*>(arg);
                      ++log->calls;
                      log->header.assign(static_cast<const uint8_t*>(h),
                                         static_cast<const uint8_t*>(h) + hl);
                      log->data.assign(static_cast<uint8_t*>(d), static_cast<uint8_t*>(d) + l);
                      return status::ok;
                    },
                    &pongs, am_flag_whole_msg | am_flag_fetch_rndv) == status::ok);
  for (size_t n : pingpong_sizes()) {
    for (int round = 0; round < 3; ++round, ++seed) {
      BOOST_TEST_CONTEXT("AM size " << n << " round " << round) {
        const std::vector<uint8_t> header = pattern(16, seed), out = pattern(n, seed + 1000);
        const int before = pongs.calls;
        request_params rp;
        rp.flags = request_reply_endpoint;
        op s = parent.ep->am_send(am_ping, header.data(), header.size(), out.data(), out.size(), rp);
        BOOST_REQUIRE(!s.failed());
        BOOST_REQUIRE(spin_until([&] { parent.w->progress(); },
                                 [&] { return pongs.calls > before; }));
        BOOST_CHECK(pongs.header == header);
        BOOST_CHECK(pongs.data == out);
        BOOST_CHECK(parent.finish(s) == status::ok);
      }
    }
  }

  // Stop the child and check it exited cleanly.
  const uint8_t none = 0;
  op stop = parent.ep->tag_send(stop_tag, &none, 1);
  BOOST_CHECK(parent.finish(stop) == status::ok);
  const int wstatus = reap(pid);
  BOOST_CHECK_MESSAGE(wstatus != -1 && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
                      "child wait status " << wstatus);
  // The child closed its endpoint and exited: our endpoints to it fail; tear down cleanly.
  parent.w.reset();
  parent.ctx.reset();
  ::close(sock);
}

BOOST_DATA_TEST_CASE(peer_killed_mid_stream, boost::unit_test::data::make(interprocess_transports()),
                     tl_name) {
  const size_t fds_before = comm::test::open_fds();
  const std::set<std::string> shm_before = dev_shm();
  constexpr int consumed = 20;
  const auto [pid, sock] = spawn([&](int s) { return stalling_child(tl_name, s, consumed); });
  {
    side parent;
    const std::string err = parent.start(tl_name, sock, "survivor");
    BOOST_REQUIRE_MESSAGE(err.empty(), err);
    error_log ep_errors, peer_created_errors;
    parent.ep->set_error_handler(record_error, &ep_errors);
    detail::endpoint_impl* back = nullptr;
    for (detail::endpoint_impl* e : detail::impl(*parent.w).ep_table) {
      if (e != nullptr && e != &detail::impl(*parent.ep)) back = e;
    }
    if (back != nullptr) back->set_error_handler(record_error, &peer_created_errors);
    BOOST_REQUIRE(parent.await_progressing(ready));  // its wireup needs our progress

    // The stream: small bcopy messages, fragmented ones and zcopy ones, far more than the
    // child's FIFO holds. The child consumes a few, then stops progressing.
    constexpr int count = 400;
    std::vector<std::vector<uint8_t>> data(count);
    std::vector<send_tracker> trackers(count);
    std::vector<int> completion_order;
    std::vector<op> ops(count);
    for (int i = 0; i < count; ++i) {
      // zcopy, multi-fragment zcopy, multi-fragment bcopy, bcopy, short.
      const size_t sizes[] = {100000, 1u << 20, 3 * 8192, 500, 8};
      const size_t n = sizes[i % 5];
      data[i] = pattern(n, i);
      trackers[i].id = i;
      trackers[i].order = &completion_order;
      ops[i] = parent.ep->tag_send(
          i, data[i].data(), n,
          send_params(trackers[i], i % 5 == 2 ? uint32_t{request_force_bcopy} : 0u));
      BOOST_REQUIRE_MESSAGE(!ops[i].failed(), "send " << i << ": " << to_string(ops[i].st));
      parent.w->progress();
    }
    // An AM parked behind them.
    const uint64_t v = 1;
    send_tracker am_tracker;
    op am = parent.ep->am_send(5, nullptr, 0, &v, sizeof(v), send_params(am_tracker));
    BOOST_REQUIRE(!am.failed());
    BOOST_REQUIRE(spin_until([&] { parent.w->progress(); },
                             [&, fd = sock] {
                               pollfd pfd{fd, POLLIN, 0};
                               return ::poll(&pfd, 1, 0) > 0;
                             },
                             60));
    BOOST_REQUIRE(parent.await(stalled));
    for (int i = 0; i < 1000; ++i) parent.w->progress();
    int outstanding = 0;
    std::vector<bool> was_outstanding(count);
    for (int i = 0; i < count; ++i) {
      // Still running in the transport (queued, or a zcopy the peer never took) - not merely
      // done and waiting for earlier sends to complete first.
      was_outstanding[i] = ops[i].pending() && ops[i].req->st == status::in_progress;
      outstanding += was_outstanding[i];
    }
    BOOST_CHECK_GT(outstanding, 0);  // the child stalled with our stream half-way

    BOOST_CHECK(am.pending() && parent.w->request_status(am.req) == status::in_progress);

    // Kill it; the survivor notices, fails the endpoints and completes everything.
    BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
    const int wstatus = reap(pid, 10);
    BOOST_CHECK(wstatus != -1 && WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
    auto all_over = [&] {
      if (am.pending() && parent.w->request_status(am.req) == status::in_progress) return false;
      for (const op& o : ops) {
        if (o.pending() && parent.w->request_status(o.req) == status::in_progress) return false;
      }
      return ep_errors.calls > 0;
    };
    BOOST_REQUIRE_MESSAGE(spin_until([&] { parent.w->progress(); }, all_over, 30),
                          "requests or the error handler still pending after the peer died:\n"
                              << parent.w->info());
    BOOST_CHECK_EQUAL(ep_errors.calls, 1);
    BOOST_CHECK(is_error(ep_errors.reason));
    BOOST_CHECK(is_error(parent.ep->state()));
    int failed = 0, succeeded = 0;
    for (int i = 0; i < count; ++i) {
      if (!ops[i].pending()) continue;
      const status st = parent.w->request_status(ops[i].req);
      BOOST_CHECK_EQUAL(trackers[i].calls, 1);
      if (st == status::ok) {
        ++succeeded;
      } else {
        BOOST_CHECK_MESSAGE(is_error(st), "send " << i << ": " << to_string(st));
        ++failed;
      }
      parent.w->release(ops[i].req);
    }
    BOOST_CHECK_GE(failed, outstanding);  // what was outstanding at the kill failed
    if (failed < outstanding || std::getenv("COMM_TEST_VERBOSE")) {
      for (int i = 0; i < count; ++i) {
        BOOST_TEST_MESSAGE("send " << i << " size " << data[i].size() << " pending "
                                   << ops[i].pending() << " at kill " << was_outstanding[i]
                                   << " -> " << to_string(trackers[i].st));
      }
    }
    if (am.pending()) {
      BOOST_CHECK(is_error(parent.w->request_status(am.req)));
      parent.w->release(am.req);
    }
    // Completions came in send order, whatever their status (a bcopy the peer's FIFO took
    // before it died succeeded; a zcopy before it that the peer never pulled failed).
    std::vector<int> expected_order;
    for (int i = 0; i < count; ++i) {
      if (ops[i].pending()) expected_order.push_back(i);
    }
    BOOST_CHECK(completion_order == expected_order);
    if (back != nullptr) {
      BOOST_CHECK(spin_until([&] { parent.w->progress(); },
                             [&] { return peer_created_errors.calls > 0; }, 10));
    }
    // The failed endpoint refuses new work at once; flush reports the failure.
    op late = parent.ep->tag_send(1, &v, sizeof(v));
    BOOST_CHECK(late.failed());
    BOOST_CHECK(parent.ep->flush().failed());
    // Closing it releases it.
    op c = parent.ep->close();
    BOOST_CHECK(parent.finish(c, 5) == status::ok);
    op wf = parent.w->flush();
    BOOST_CHECK(parent.finish(wf, 5) == status::ok);
  }
  ::close(sock);
  // Everything the survivor opened is closed again, and nothing is left in /dev/shm.
  BOOST_CHECK_EQUAL(comm::test::open_fds(), fds_before);
  std::vector<std::string> left;
  for (const std::string& name : dev_shm()) {
    if (!shm_before.count(name)) left.push_back(name);
  }
  BOOST_CHECK_MESSAGE(left.empty(), "new /dev/shm entries: " << left.size()
                                                             << (left.empty() ? "" : " e.g. " + left[0]));
}

BOOST_AUTO_TEST_SUITE_END()
