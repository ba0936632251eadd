// Two "hosts" for tests that cross a network: a pair of network namespaces joined by two veth
// pairs, and loopback up. The first link gives each end an IPv4 address (10.199.<n>.1 and .2/24)
// and an IPv6 one (fd00:199:<n>::1 and ::2/64); the second has link-local IPv6 addresses only
// (fe80::199:1 and ::2/64, none made up by the kernel). IPv6 addresses are added with nodad, so
// they are usable at once (no duplicate address detection to wait for). Made with ip(8) and
// removed when the object goes (deleting a namespace deletes its veth ends). Needs root.
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
    link_veth_[0] = "cla" + id;
    link_veth_[1] = "clb" + id;
    remove();
    ok_ = run("ip netns add " + names_[0]) && run("ip netns add " + names_[1]) &&
          run("ip link add " + veth_[0] + " type veth peer name " + veth_[1]) &&
          run("ip link add " + link_veth_[0] + " type veth peer name " + link_veth_[1]);
    for (int which = 0; ok_ && which < 2; ++which) {
      const std::string in = "ip -n " + names_[which] + " ";
      const std::string veth = veth_[which], link = link_veth_[which];
      ok_ = run("ip link set " + veth + " netns " + names_[which]) &&
            run("ip link set " + link + " netns " + names_[which]) &&
            run(in + "addr add " + address(which) + "/24 dev " + veth) &&
            run(in + "addr add " + address6(which) + "/64 dev " + veth + " nodad") &&
            run(in + "link set " + link + " addrgenmode none") &&
            run(in + "addr add " + link_local(which) + "/64 dev " + link + " nodad") &&
            run(in + "link set " + veth + " up") && run(in + "link set " + link + " up") &&
            run(in + "link set lo up");
    }
  }
  ~netns_pair() { remove(); }
  netns_pair(const netns_pair&) = delete;
  netns_pair& operator=(const netns_pair&) = delete;

  /// True when both namespaces and the link were made.
  bool ok() const { return ok_; }

  /// The IPv4 address of host `which` (0 or 1).
  std::string address(int which) const { return "10.199." + subnet_ + "." + (which ? "2" : "1"); }

  /// The IPv6 address of host `which` on the first link.
  std::string address6(int which) const {
    return "fd00:199:" + subnet_ + "::" + (which ? "2" : "1");
  }

  /// The link-local IPv6 address of host `which` on the second link.
  std::string link_local(int which) const { return which ? "fe80::199:2" : "fe80::199:1"; }

  /// Host `which`'s end of the second (link-local only) link: the interface a link-local address
  /// is reached through from there.
  const std::string& link_device(int which) const { return link_veth_[which]; }

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
  std::string link_veth_[2];
  std::string subnet_;
  bool ok_ = false;
};

}  // namespace comm::test
