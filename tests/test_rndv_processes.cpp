// Rendezvous between two real processes, over every transport that reaches another process
// (fixture.hpp's interprocess_transports), and peers killed with SIGKILL in the middle of a
// rendezvous: both sides end cleanly, nothing hangs, nothing stays registered.
#define BOOST_TEST_MODULE rndv_processes
#include "fixture.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace comm;
using namespace comm::test;

namespace rndv_processes {

/// Writes a length-prefixed blob.
bool send_blob(int fd, const std::vector<uint8_t>& blob) {
  const uint32_t n = static_cast<uint32_t>(blob.size());
  return ::write(fd, &n, sizeof(n)) == sizeof(n) &&
         ::write(fd, blob.data(), n) == static_cast<ssize_t>(n);
}

/// Reads a length-prefixed blob (bounded size); empty on failure.
std::vector<uint8_t> read_blob(int fd) {
  uint32_t n = 0;
  if (::read(fd, &n, sizeof(n)) != sizeof(n) || n > (1u << 20)) return {};
  std::vector<uint8_t> blob(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, blob.data() + got, n - got);
    if (r <= 0) return {};
    got += static_cast<size_t>(r);
  }
  return blob;
}

/// One side of a two-process test: a context on one transport and a worker.
struct side {
  explicit side(const std::string& transport)
      : ctx(config_for(transport)), w(worker::create(ctx).value()) {}
  context ctx;
  std::unique_ptr<worker> w;
};

/// Waits for `pid` to exit (bounded); returns its wait status or -1.
int reap(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return -1;
}

constexpr size_t big = 8u << 20;
constexpr tag_t tag_data = 0xda7a;

/// Child: connects to the parent, then runs `body` and exits with its result (never returns).
template <class Body>
[[noreturn]] void run_child(const std::string& transport, int sock, Body&& body) {
  int rc = 1;
  {
    side s(transport);
    if (send_blob(sock, s.w->address())) {
      auto parent = read_blob(sock);
      endpoint* ep = nullptr;
      if (!parent.empty() && s.w->connect(parent, &ep) == status::ok) rc = body(s, ep, sock);
    }
  }
  ::_exit(rc);
}

}  // namespace rndv_processes

// Named, not anonymous: the data-driven cases are templates whose lambdas capture these types.
using namespace rndv_processes;

BOOST_DATA_TEST_CASE(large_messages_both_ways_between_processes,
                     boost::unit_test::data::make(interprocess_transports()), tl_name) {
  int fds[2];
  BOOST_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    run_child(tl_name, fds[1], [](side& s, endpoint* ep, int) {
      std::vector<uint8_t> buf(big);
      for (int i = 0; i < 3; ++i) {
        op r = s.w->tag_recv(buf.data(), big, tag_data, tag_mask_full);
        if (s.w->wait(r, 30000) != status::ok) return 2;
        if (first_mismatch(buf.data(), big, 60 + i) != -1) return 3;
        op back = ep->tag_send(tag_data + 1, buf.data(), big);
        if (back.failed() || s.w->wait(back, 30000) != status::ok) return 4;
      }
      return s.w->wait(ep->close(), 30000) == status::ok ? 0 : 5;
    });
  }
  ::close(fds[1]);
  side s(tl_name);
  auto child = read_blob(fds[0]);
  BOOST_REQUIRE(!child.empty());
  BOOST_REQUIRE(send_blob(fds[0], s.w->address()));
  endpoint* ep = nullptr;
  BOOST_REQUIRE(s.w->connect(child, &ep) == status::ok);
  for (int i = 0; i < 3; ++i) {
    auto data = pattern(big, 60 + i);
    std::vector<uint8_t> echo(big);
    op r = s.w->tag_recv(echo.data(), big, tag_data + 1, tag_mask_full);
    op snd = ep->tag_send(tag_data, data.data(), big);
    BOOST_REQUIRE(!snd.failed());
    BOOST_CHECK(s.w->wait(snd, 30000) == status::ok);
    BOOST_CHECK(s.w->wait(r, 30000) == status::ok);
    BOOST_CHECK_EQUAL(first_mismatch(echo.data(), big, 60 + i), -1);
  }
  const int wstatus = reap(pid, 30);
  BOOST_CHECK(wstatus != -1 && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  ::close(fds[0]);
}

BOOST_DATA_TEST_CASE(receiver_killed_before_fetching_fails_the_send_and_releases_it,
                     boost::unit_test::data::make(interprocess_transports()), tl_name) {
  int fds[2];
  BOOST_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    run_child(tl_name, fds[1], [](side& s, endpoint*, int sock) {
      // Wait for the announcement, say so, then never receive it.
      tag_recv_info info;
      for (int i = 0; i < 3000000 && !s.w->tag_probe(tag_data, tag_mask_full, &info); ++i) {
        s.w->progress();
      }
      const char ready = 'r';
      if (::write(sock, &ready, 1) != 1) return 6;
      for (;;) s.w->progress();  // killed here
    });
  }
  ::close(fds[1]);
  side s(tl_name);
  auto child = read_blob(fds[0]);
  BOOST_REQUIRE(!child.empty());
  BOOST_REQUIRE(send_blob(fds[0], s.w->address()));
  endpoint* ep = nullptr;
  BOOST_REQUIRE(s.w->connect(child, &ep) == status::ok);
  error_log errors;
  ep->set_error_handler(record_error, &errors);
  auto data = pattern(big, 70);
  send_tracker t;
  op snd = ep->tag_send(tag_data, data.data(), big, send_params(t));
  BOOST_REQUIRE(snd.pending());
  char ready = 0;
  BOOST_REQUIRE(spin_until([&] { s.w->progress(); },
                           [&] {
                             pollfd pfd{fds[0], POLLIN, 0};
                             return ::poll(&pfd, 1, 0) > 0;
                           },
                           30));
  BOOST_REQUIRE(::read(fds[0], &ready, 1) == 1 && ready == 'r');
  BOOST_CHECK(s.w->request_status(snd.req) == status::in_progress);  // announced, not fetched
  BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
  reap(pid, 10);
  BOOST_REQUIRE(spin_until([&] { s.w->progress(); }, [&] { return t.calls == 1; }, 10));
  BOOST_CHECK(is_error(t.st));
  BOOST_CHECK_EQUAL(errors.calls, 1);
  // The registration went with it.
  BOOST_CHECK(detail::module_of<detail::rndv_protocol>(detail::impl(*s.w)).sends().empty());
  s.w->release(snd.req);
  ::close(fds[0]);
}

BOOST_DATA_TEST_CASE(sender_killed_after_announcing_leaves_no_stale_message,
                     boost::unit_test::data::make(interprocess_transports()), tl_name) {
  int fds[2];
  BOOST_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    run_child(tl_name, fds[1], [](side& s, endpoint* ep, int sock) {
      auto data = pattern(big, 80);
      op snd = ep->tag_send(tag_data, data.data(), big);
      if (snd.failed()) return 7;
      char go = 0;
      while (::recv(sock, &go, 1, MSG_DONTWAIT) != 1) s.w->progress();
      for (;;) s.w->progress();  // killed here, with the send announced
    });
  }
  ::close(fds[1]);
  side s(tl_name);
  auto child = read_blob(fds[0]);
  BOOST_REQUIRE(!child.empty());
  BOOST_REQUIRE(send_blob(fds[0], s.w->address()));
  tag_recv_info info;
  BOOST_REQUIRE(spin_until([&] { s.w->progress(); },
                           [&] { return s.w->tag_probe(tag_data, tag_mask_full, &info); }, 30));
  BOOST_CHECK_EQUAL(info.length, big);
  const char go = 'g';
  BOOST_REQUIRE(::write(fds[0], &go, 1) == 1);
  BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
  reap(pid, 10);
  // The announcement from the dead peer goes once the failure is noticed.
  BOOST_CHECK(spin_until([&] { s.w->progress(); },
                         [&] { return !s.w->tag_probe(tag_data, tag_mask_full, &info); }, 10));
  std::vector<uint8_t> buf(big);
  recv_tracker rt;
  op r = s.w->tag_recv(buf.data(), big, tag_data, tag_mask_full, recv_params(rt));
  BOOST_CHECK(r.pending());  // nothing stale matched it
  BOOST_CHECK(s.w->cancel(r.req, cancel_mode::report) == status::ok);
  BOOST_CHECK(rt.st == status::canceled);
  s.w->release(r.req);
  ::close(fds[0]);
}
