// Small helpers shared by the test suites: readable statuses in Boost.Test's messages, the
// number of descriptors a process holds (for leak checks), what a piece of code writes to
// stderr (the worker's warnings), and whether memory is mapped writable here.
#pragma once

#include <comm/status.hpp>

#include <boost/test/unit_test.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>

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

/// Everything written to stderr while `body` runs.
template <class Body>
inline std::string capture_stderr(Body&& body) {
  std::fflush(stderr);
  char path[] = "/tmp/comm_wakeup_stderr_XXXXXX";
  const int file = mkstemp(path);
  BOOST_REQUIRE(file >= 0);
  unlink(path);
  const int saved = dup(2);
  dup2(file, 2);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string text;
  lseek(file, 0, SEEK_SET);
  char buffer[4096];
  for (ssize_t n; (n = read(file, buffer, sizeof(buffer))) > 0;) text.append(buffer, n);
  close(file);
  return text;
}

/// Lines of `text` that contain `what`.
inline size_t lines_with(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  size_t count = 0;
  for (std::string line; std::getline(in, line);) count += line.find(what) != std::string::npos;
  return count;
}

/// The permissions ("rw-s", "r--s", ...) of this process's mapping that holds `p`, or "".
inline std::string mapping_protection(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long start = 0, end = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &start, &end, perms) == 3 && at >= start &&
        at < end) {
      return perms;
    }
  }
  return "";
}

/// How a forked child that writes one byte at `p` ends: the signal that killed it, or 0 when it
/// exited (its write went through); -1 when it could not be run.
inline int signal_of_a_child_writing(const void* p) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the fault into an exit code
    auto* byte = static_cast<volatile unsigned char*>(const_cast<void*>(p));
    *byte = static_cast<unsigned char>(*byte + 1);
    ::_exit(0);
  }
  int wstatus = 0;
  if (child < 0 || ::waitpid(child, &wstatus, 0) != child) return -1;
  return WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
}

}  // namespace comm::test
