// Who this process is, as far as reachability goes: the boot of this host and the namespaces that
// decide whether another process can see our /proc entries, shared memory and abstract sockets.
// Transports put it into their device addresses; two processes compare equal only when they run on
// the same boot of the same host, in the same IPC, network and PID namespaces.
#pragma once

#include <cstdint>

namespace comm::tl {

/// The identity of this host boot and of the namespaces of this process. Plain bytes, so it can be
/// copied into device addresses as it is.
struct [[gnu::packed]] host_identity {
  uint8_t boot_id[16] = {};  ///< /proc/sys/kernel/random/boot_id, parsed from its UUID text
  uint64_t ipc_ns = 0;       ///< inode of /proc/self/ns/ipc
  uint64_t net_ns = 0;       ///< inode of /proc/self/ns/net (abstract unix sockets live there)
  uint64_t pid_ns = 0;       ///< inode of /proc/self/ns/pid (pids in addresses are read there)

  friend bool operator==(const host_identity&, const host_identity&) = default;
};

/// This process's identity, read once (thread-safe). Fields that cannot be read stay zero.
const host_identity& local_host_identity();

}  // namespace comm::tl
