#include "shm/shm_peer_fd.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace comm::tl::shm {
namespace {

/// What memfd_create names its files ("/memfd:<name> (deleted)" in /proc/<pid>/fd).
constexpr const char memfd_prefix[] = "/memfd:";

taken_fd refused(const char* why, int error = 0) { return {-1, why, error}; }

/// Refuses and closes `fd`.
taken_fd refused_closing(int fd, const char* why) {
  ::close(fd);
  return refused(why);
}

/// Why `fd` (a duplicate or an O_PATH descriptor: nothing needs it open) cannot be the memfd
/// `want` describes, from fstat and fstatfs; null when it can. Fills `*st`.
const char* refusal_by_stat(int fd, const memfd_expectation& want, struct stat* st) {
  struct statfs fs;
  if (::fstat(fd, st) != 0 || ::fstatfs(fd, &fs) != 0) return "cannot stat it";
  if (!S_ISREG(st->st_mode)) return "not a regular file (a FIFO, socket or device)";
  if (fs.f_type != TMPFS_MAGIC) return "not a file in memory (a file on disk, or hugetlbfs)";
  if (static_cast<uint64_t>(st->st_size) != want.size) return "not of the expected size";
  if (want.inode != 0 && static_cast<uint64_t>(st->st_ino) != want.inode) {
    return "not the expected inode";
  }
  return nullptr;
}

/// Why open descriptor `fd` is not sealed as a segment must be (against resizing, not against
/// writing); null when it is.
const char* refusal_by_seals(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return "not a memfd (it has no seals)";
  constexpr int needed = F_SEAL_GROW | F_SEAL_SHRINK;
  if ((seals & needed) != needed) return "a memfd not sealed against growing and shrinking";
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) return "a memfd sealed against writing";
  return nullptr;
}

/// The duplicate route: pidfd_getfd, then checks on the duplicate.
taken_fd duplicate(int pidfd, const memfd_expectation& want) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, want.fd, 0));
  if (fd < 0) {
    const int error = errno;
    return refused(error == EBADF ? "no such descriptor in the peer" : "pidfd_getfd failed", error);
  }
  struct stat st;
  if (const char* why = refusal_by_stat(fd, want, &st)) return refused_closing(fd, why);
  if (const char* why = refusal_by_seals(fd)) return refused_closing(fd, why);
  if ((::fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR) {
    return refused_closing(fd, "a memfd the peer holds open read-only");
  }
  return {fd};
}

/// True when the file behind our descriptor `fd` is named like a memfd.
bool named_like_a_memfd(int fd) {
  char link[32];
  char target[sizeof(memfd_prefix)];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof(target));
  const size_t prefix = sizeof(memfd_prefix) - 1;
  return n >= static_cast<ssize_t>(prefix) && std::memcmp(target, memfd_prefix, prefix) == 0;
}

/// Reopens the file behind our O_PATH descriptor `path_fd` (already checked) read-write; the same
/// inode as `checked`, or a refusal.
taken_fd reopen_checked(int path_fd, const struct stat& checked) {
  char link[32];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", path_fd);
  const int fd = ::open(link, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return refused("cannot reopen it read-write", errno);
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_dev != checked.st_dev || st.st_ino != checked.st_ino) {
    return refused_closing(fd, "the file changed while it was reopened");
  }
  return {fd};
}

/// The reopen route: look up by O_PATH, check, reopen, check the seals and that the peer lives.
taken_fd reopen(int pidfd, pid_t pid, const memfd_expectation& want) {
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", static_cast<int>(pid),
                static_cast<int>(want.fd));
  const int path_fd = ::open(path, O_PATH | O_CLOEXEC);
  if (path_fd < 0) return refused("cannot look up /proc/<pid>/fd/<fd>", errno);
  struct stat st;
  if (const char* why = refusal_by_stat(path_fd, want, &st)) return refused_closing(path_fd, why);
  if (!named_like_a_memfd(path_fd)) return refused_closing(path_fd, "not a memfd (its name)");
  const taken_fd taken = reopen_checked(path_fd, st);
  ::close(path_fd);
  if (taken.fd < 0) return taken;
  if (const char* why = refusal_by_seals(taken.fd)) return refused_closing(taken.fd, why);
  // The pidfd predates the lookup: alive now means /proc/<pid> was that process.
  if (process_exited(pidfd)) return refused_closing(taken.fd, "the peer exited");
  return taken;
}

}  // namespace

bool process_exited(int pidfd) {
  pollfd exited{pidfd, POLLIN, 0};
  return ::poll(&exited, 1, 0) != 0;
}

taken_fd take_peer_memfd(int pidfd, pid_t pid, const memfd_expectation& want,
                         peer_fd_route route) {
  if (want.fd < 0) return refused("no such descriptor in the peer");
  if (route == peer_fd_route::reopen) return reopen(pidfd, pid, want);
  const taken_fd taken = duplicate(pidfd, want);
  const bool not_allowed = taken.error == EPERM || taken.error == ENOSYS;
  if (route == peer_fd_route::automatic && taken.fd < 0 && not_allowed) {
    return reopen(pidfd, pid, want);
  }
  return taken;
}

}  // namespace comm::tl::shm
