// A peer interface as one shm interface sees it: the peer's receive segment mapped once, a pidfd
// of its process, the address of its wakeup socket. Every endpoint to that peer interface shares
// it (shm_iface counts them and releases it with the last), so endpoints to one peer cost no
// descriptor and no mapping each.
#pragma once

#include "shm/shm_segment.hpp"

#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <utility>

namespace comm::tl::shm {

/// A peer interface, shared by the endpoints to it.
struct shm_peer {
  /// Takes the peer's segment, mapped and verified, and a pidfd of its process.
  shm_peer(segment mapped, const iface_addr& advertised, int process_fd)
      : seg(std::move(mapped)), address(advertised), pidfd(process_fd) {
    wake_address_length = wakeup_socket_address(address.pid, address.iface_id, &wake_address);
  }
  ~shm_peer() { ::close(pidfd); }
  shm_peer(const shm_peer&) = delete;
  shm_peer& operator=(const shm_peer&) = delete;

  /// True when the peer interface marked its segment closed.
  bool closed() const {
    return std::atomic_ref<uint32_t>(seg.control().closed).load(std::memory_order_acquire) != 0;
  }

  segment seg;                  ///< the peer's receive segment, mapped here
  const iface_addr address;     ///< what the peer advertised (its segment agreed)
  const int pidfd;              ///< the peer process; readable once it exited
  sockaddr_un wake_address;     ///< the peer's wakeup socket
  socklen_t wake_address_length = 0;
  size_t endpoints = 0;         ///< endpoints sharing this peer
  bool failed = false;          ///< its process exited or its interface closed (noticed)
};

}  // namespace comm::tl::shm
