// Small helpers shared by the test suites: readable statuses in Boost.Test's messages, and the
// number of descriptors a process holds (for leak checks).
#pragma once

#include <comm/status.hpp>

#include <dirent.h>

#include <cstddef>
#include <ostream>

namespace comm {

/// Prints a status by name (Boost.Test's messages for failed comparisons).
inline std::ostream& operator<<(std::ostream& os, status s) { return os << to_string(s); }

}  // namespace comm

namespace comm::test {

/// Number of descriptors open in this process (the entries of /proc/self/fd, without the
/// directory stream that lists them).
inline size_t open_fds() {
  size_t n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;
}

}  // namespace comm::test
