// Two "hosts" for tests that cross a network: a pair of network namespaces joined by a veth pair,
// each end with an address of its own (10.199.<n>.1 and .2/24) and loopback up. Made with ip(8)
// and removed when the object goes (deleting a namespace deletes its veth end). Needs root.
//
// A process enters a host with enter(); do it in a forked child before any libcomm object exists,
// because transports cache the namespace identity of the process when first used.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace comm::test {

/// A pair of network namespaces joined by a veth link.
class netns_pair {
public:
  netns_pair() {
    const std::string id = std::to_string(::getpid() % 100000);
    subnet_ = std::to_string(::getpid() % 200 + 20);
    names_[0] = "commtest-a-" + id;
    names_[1] = "commtest-b-" + id;
    veth_[0] = "cta" + id;
    veth_[1] = "ctb" + id;
    const std::string veth_a = veth_[0], veth_b = veth_[1];
    remove();
    const std::string a = names_[0], b = names_[1];
    ok_ = run("ip netns add " + a) && run("ip netns add " + b) &&
          run("ip link add " + veth_a + " type veth peer name " + veth_b) &&
          run("ip link set " + veth_a + " netns " + a) &&
          run("ip link set " + veth_b + " netns " + b) &&
          run("ip -n " + a + " addr add " + address(0) + "/24 dev " + veth_a) &&
          run("ip -n " + b + " addr add " + address(1) + "/24 dev " + veth_b) &&
          run("ip -n " + a + " link set " + veth_a + " up") &&
          run("ip -n " + b + " link set " + veth_b + " up") &&
          run("ip -n " + a + " link set lo up") && run("ip -n " + b + " link set lo up");
  }
  ~netns_pair() { remove(); }
  netns_pair(const netns_pair&) = delete;
  netns_pair& operator=(const netns_pair&) = delete;

  /// True when both namespaces and the link were made.
  bool ok() const { return ok_; }

  /// The IPv4 address of host `which` (0 or 1).
  std::string address(int which) const { return "10.199." + subnet_ + "." + (which ? "2" : "1"); }

  /// Moves the calling process into host `which`'s network namespace; false on failure.
  bool enter(int which) const {
    const std::string path = "/var/run/netns/" + names_[which];
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool entered = ::setns(fd, CLONE_NEWNET) == 0;
    ::close(fd);
    return entered;
  }

  /// Takes host `which`'s end of the link down (or up): packets stop flowing, nobody is told.
  bool set_link(int which, bool up) const {
    return run("ip -n " + names_[which] + " link set " + veth_[which] + (up ? " up" : " down"));
  }

private:
  static bool run(const std::string& command) {
    const std::string quiet = command + " >/dev/null 2>&1";
    return std::system(quiet.c_str()) == 0;
  }
  void remove() const {
    for (const auto& name : names_) run("ip netns del " + name);
  }

  std::string names_[2];
  std::string veth_[2];
  std::string subnet_;
  bool ok_ = false;
};

}  // namespace comm::test
