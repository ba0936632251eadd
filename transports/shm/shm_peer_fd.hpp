// Taking a descriptor that a peer names (a pid and a descriptor number, from an interface address
// or a remote key) without trusting the name: the peer's receive segment and its shared-heap
// segments are memfds, and nothing else is ever mapped or even opened.
//
// First choice, pidfd_getfd(2) through a pidfd of the peer opened beforehand: a duplicate of the
// peer's own descriptor, so no file is opened at all. A FIFO, a device, a leased file or a file
// on a hung file system named by a hostile peer blocks nothing and has no side effect; fstat says
// what it is and it is closed again. It needs ptrace access to the peer
// (PTRACE_MODE_ATTACH_REALCREDS: same user and not undumpable, or CAP_SYS_PTRACE), which is what
// the CMA calls (process_vm_readv/writev) of zcopy and RMA need already.
// Second choice, when that access is refused (EPERM: Yama's kernel.yama.ptrace_scope >= 1 refuses
// it for a peer that is not our descendant) or the kernel lacks the call (ENOSYS, before 5.6):
// /proc/<pid>/fd/<fd> resolved with O_PATH, which opens nothing and needs only read access
// (PTRACE_MODE_READ, which Yama leaves alone); checked to be a regular file in memory named
// "/memfd:..." of the expected size; only then reopened read-write through /proc/self/fd (the same
// inode, whatever the peer does meanwhile) with O_NONBLOCK | O_NOCTTY; and the pidfd must show
// the peer still alive afterwards, so the pid looked up was that process and not a reused one.
// Under Yama the CMA paths fail as well: zcopy and RMA to such a peer report io_error.
//
// Either way the descriptor returned is a memfd (tmpfs, hugetlbfs refused) of exactly the expected
// size (and inode, when one is expected), sealed with F_SEAL_GROW and F_SEAL_SHRINK, so a mapping
// of it can never run past the end of the file, and open for reading and writing without a seal
// against writing, so it can be mapped shared and writable. The caller maps it and checks the
// header it wrote.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace comm::tl::shm {

/// What a descriptor named by a peer must be.
struct memfd_expectation {
  int32_t fd = -1;      ///< the descriptor number in the peer
  uint64_t size = 0;    ///< the file's exact size
  uint64_t inode = 0;   ///< the file's inode; 0: any
};

/// How take_peer_memfd reaches the peer's descriptor.
enum class peer_fd_route {
  automatic,  ///< duplicate, or reopen when the duplicate is refused (EPERM, ENOSYS)
  duplicate,  ///< pidfd_getfd only
  reopen,     ///< /proc/<pid>/fd/<fd> by O_PATH, checked, then reopened
};

/// A descriptor taken from a peer, or why not.
struct taken_fd {
  int fd = -1;                   ///< ours to close; -1 when refused
  const char* refusal = nullptr; ///< why it was refused (for the log); null when fd is valid
  int error = 0;                 ///< the errno behind the refusal, if a call failed
};

/// True when the process behind `pidfd` has exited (its pidfd polls readable).
bool process_exited(int pidfd);

/// Takes descriptor `want.fd` of process `pid`, whose pidfd (opened before the pid was trusted)
/// is `pidfd`, when it is a sealed memfd as `want` describes; otherwise refuses, having opened
/// nothing but that memfd.
taken_fd take_peer_memfd(int pidfd, pid_t pid, const memfd_expectation& want,
                         peer_fd_route route = peer_fd_route::automatic);

}  // namespace comm::tl::shm
