// Helpers of the transport suites that run a peer in a forked child: a pipe carrying
// length-prefixed byte strings, fork/wait with bounds, and checks for the child's side.
#pragma once

#include <comm/transport/transport.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace comm::test {

/// One direction of a pipe carrying length-prefixed byte strings.
struct channel {
  int fds[2] = {-1, -1};
  channel() {
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
  }
  ~channel() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  /// Writes one byte string.
  void send(const std::vector<uint8_t>& bytes) const {
    const uint32_t length = static_cast<uint32_t>(bytes.size());
    if (::write(fds[1], &length, sizeof(length)) != sizeof(length)) return;
    if (length != 0 && ::write(fds[1], bytes.data(), length) != static_cast<ssize_t>(length)) return;
  }
  /// Writes one 64-bit word.
  void send_word(uint64_t word) const {
    const auto* p = reinterpret_cast<const uint8_t*>(&word);
    send(std::vector<uint8_t>(p, p + sizeof(word)));
  }
  /// Reads one byte string; false on timeout or a closed pipe.
  bool receive(std::vector<uint8_t>* bytes, int timeout_ms = 20000) const {
    uint32_t length = 0;
    if (!read_exact(&length, sizeof(length), timeout_ms)) return false;
    bytes->resize(length);
    return read_exact(bytes->data(), length, timeout_ms);
  }
  /// Reads one 64-bit word; false on timeout, a closed pipe, or a string of another size.
  bool receive_word(uint64_t* word, int timeout_ms = 20000) const {
    std::vector<uint8_t> bytes;
    if (!receive(&bytes, timeout_ms) || bytes.size() != sizeof(*word)) return false;
    std::memcpy(word, bytes.data(), sizeof(*word));
    return true;
  }
  /// Reads exactly `length` bytes, each wait bounded by `timeout_ms`.
  bool read_exact(void* dest, size_t length, int timeout_ms) const {
    auto* p = static_cast<uint8_t*>(dest);
    while (length > 0) {
      pollfd pfd{fds[0], POLLIN, 0};
      if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
      const ssize_t n = ::read(fds[0], p, length);
      if (n <= 0) return false;
      p += n;
      length -= static_cast<size_t>(n);
    }
    return true;
  }
};

/// Sends an interface's device and interface addresses.
inline void send_addresses(const channel& ch, tl::iface& iface) {
  ch.send(iface.device_address());
  ch.send(iface.iface_address());
}

/// Receives what send_addresses sent.
inline bool receive_addresses(const channel& ch, std::vector<uint8_t>* device,
                              std::vector<uint8_t>* address) {
  return ch.receive(device) && ch.receive(address);
}

/// Runs `body` in a forked child, which exits with its return value (never returns there).
inline pid_t fork_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 100;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: exception: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return pid;
}

/// The child's exit code, or -1 when it had to be killed after `ticks` x 10 ms (20 s).
inline int wait_child(pid_t pid, int ticks = 2000) {
  for (int i = 0; i < ticks; ++i) {
    int wstatus = 0;
    const pid_t done = ::waitpid(pid, &wstatus, WNOHANG);
    if (done == pid) return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

}  // namespace comm::test

/// In a child: returns 1 (its exit code) with a message when `cond` does not hold.
#define CHILD_CHECK(cond)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "child check failed (line %d): %s\n", __LINE__, #cond);     \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)
