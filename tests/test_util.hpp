// Small helpers shared by the test suites: readable statuses in Boost.Test's messages, the
// number of descriptors a process holds (for leak checks), and what a piece of code writes to
// stderr (the worker's warnings).
#pragma once

#include <comm/status.hpp>

#include <boost/test/unit_test.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
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

}  // namespace comm::test
