// What every harness checks with: a failed property stops the run (libFuzzer reports a crash and
// saves the input), and the process's open descriptors can be listed to find one left open.
#pragma once

#include <dirent.h>
#include <errno.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace comm::fuzz {

/// Stops the run: prints `what` and aborts, which libFuzzer reports as a crash with this input.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what);
  std::abort();
}

/// fail(what) unless `condition` holds.
inline void require(bool condition, const char* what) {
  if (!condition) fail(what);
}

/// This process's open descriptors and what each one is (their /proc/self/fd links).
inline std::map<int, std::string> open_fds() {
  std::map<int, std::string> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[256] = {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      (void)!::readlink(path.c_str(), target, sizeof(target) - 1);
      fds[std::atoi(e->d_name)] = target;
    }
    ::closedir(d);
  }
  return fds;
}

}  // namespace comm::fuzz
