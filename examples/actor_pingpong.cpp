// Ping-pong between actors in two processes, over libcomm's node.
//
// The parent starts a "pong" process, which publishes an actor under the name "pong". The parent
// looks it up by the node's address and name and gets a proxy, a caf::actor like any other: it
// sends pings to it, and the pong actor answers each to whoever sent it (the sender's identity
// travels with the message). A few exchanges are printed, then 10000 round trips between an
// event-based actor and the remote pong are timed.
//
//   build/examples/actor_pingpong
#include <comm/actors/node.hpp>

#include <caf/all.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pong_atom = caf::atom_constant<caf::atom("pong")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

constexpr int timed_round_trips = 10000;

/// Answers ping n with pong n, printing the first few.
caf::behavior pong(caf::event_based_actor* self) {
  return {
    [self](ping_atom, int n) {
      if (n < 3) {
        std::printf("[pong %d] got ping %d from actor %llu of node %s\n", ::getpid(), n,
                    static_cast<unsigned long long>(self->current_sender()->id()),
                    to_string(self->current_sender()->node()).c_str());
        std::fflush(stdout);
      }
      return caf::make_message(pong_atom::value, n);
    },
  };
}

[[noreturn]] void run_pong(int fd) {
  caf::actor_system_config cfg;
  comm::actors::node::load(cfg);
  caf::actor_system sys{cfg};
  auto& node = *comm::actors::node::get(sys);
  node.publish(sys.spawn(pong), "pong");
  std::printf("[pong %d] published \"pong\" at %s\n", ::getpid(), node.address().c_str());
  std::fflush(stdout);
  const std::string line = node.address() + "\n";
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
  for (;;) ::pause();
}

/// Sends `n` pings, each after the previous pong, then tells `report` how many came back.
caf::behavior pinger(caf::event_based_actor* self, caf::actor pong, int n, caf::actor report) {
  self->send(pong, ping_atom::value, 3);
  return {
    [=](pong_atom, int m) {
      if (m - 3 + 1 >= n) {
        self->send(report, done_atom::value, m - 3 + 1);
        self->quit();
        return;
      }
      self->send(pong, ping_atom::value, m + 1);
    },
  };
}

int run_ping(const std::string& address) {
  caf::actor_system_config cfg;
  comm::actors::node_params params;
  params.listen_address.clear();
  comm::actors::node::load(cfg, params);
  caf::actor_system sys{cfg};
  auto found = comm::actors::node::get(sys)->lookup(address, "pong");
  if (!found) {
    std::printf("[ping] lookup failed: %s\n", sys.render(found.error()).c_str());
    return 1;
  }
  std::printf("[ping %d] found \"pong\" at %s\n", ::getpid(), address.c_str());
  caf::scoped_actor self{sys};
  for (int n = 0; n < 3; ++n) {
    self->request(*found, std::chrono::seconds(2), ping_atom::value, n)
      .receive([&](pong_atom, int m) { std::printf("[ping] got pong %d\n", m); },
               [&](const caf::error& e) {
                 std::printf("[ping] error: %s\n", sys.render(e).c_str());
               });
  }
  // Timed: an event-based actor that sends the next ping from the pong's handler (a blocking
  // actor's request/receive would measure CAF's thread wake-ups instead).
  const auto start = std::chrono::steady_clock::now();
  sys.spawn(pinger, *found, timed_round_trips, caf::actor{self});
  int answered = 0;
  self->receive([&](done_atom, int n) { answered = n; },
                caf::after(std::chrono::seconds(30)) >> [] {});
  const double us = std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - start).count();
  std::printf("[ping] %d round trips from an event-based actor: %.2f us each\n", answered,
              us / timed_round_trips);
  return answered == timed_round_trips ? 0 : 1;
}

}  // namespace

int main() {
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    run_pong(fds[1]);
  }
  ::close(fds[1]);
  std::string address;
  char c;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') address += c;
  ::close(fds[0]);
  const int rc = address.empty() ? 1 : run_ping(address);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return rc;
}
