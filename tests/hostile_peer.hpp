// A hostile peer for the shm suites: a forked child that holds files it can name (by descriptor
// number) in place of its segments: a FIFO, a device, a file on disk, a file it holds a read lease
// on, a socket, memfds that are not sealed or only half sealed, a sealed memfd with nothing in it,
// and a sealed memfd that looks like a segment in every respect (the control). It tells whether
// anybody broke its lease, which opening the leased file for writing does (and blocks until the
// holder lets go, 45 s by default); the parent watches the FIFO and the files with inotify, so an
// open of any of them shows. Everything is removed when the object goes, and the child is killed
// if it does not exit.
#pragma once

#include "process_harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace comm::test {

/// A forked child holding files a hostile peer names instead of its segment.
class hostile_peer {
public:
  /// What the child holds, by index into fds() and inodes().
  enum file : size_t {
    fifo,                  ///< a FIFO (held by an O_PATH descriptor)
    device,                ///< /dev/zero
    disk_file,             ///< a regular file on disk, of the expected size
    leased_file,           ///< the same, with a read lease the child holds
    socket,                ///< one end of a socket pair
    unsealed_memfd,        ///< a memfd with the expected size and content, without seals
    half_sealed_memfd,     ///< the same, sealed against shrinking only
    write_sealed_memfd,    ///< the same, sealed against resizing and writing
    read_only_memfd,       ///< sealed, expected size and content, held open read-only
    empty_sealed_memfd,    ///< a sealed memfd of the expected size holding zeros
    sealed_memfd,          ///< sealed, expected size and content: what a genuine segment is
    file_count
  };

  /// Fills a memfd the child made (mapped at `base`, `size` bytes) with what it pretends to be.
  using content_fn = std::function<void(uint8_t* base, size_t size)>;
  /// Runs first in the child and may talk to the parent; what it returns lives until the end.
  using setup_fn = std::function<std::shared_ptr<void>(const channel& to_parent)>;

  /// Starts the child: `setup` (if any), then the files, each of `size` bytes where a size
  /// applies, memfds filled by `content`.
  hostile_peer(size_t size, const content_fn& content, const setup_fn& setup = {}) {
    char dir[] = "/tmp/comm-hostile-XXXXXX";  // on disk, not tmpfs
    if (::mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp");
    dir_ = dir;
    if (::mkfifo(path("fifo").c_str(), 0600) != 0) throw std::runtime_error("mkfifo");
    for (const char* name : {"file", "leased"}) {
      const int fd = ::open(path(name).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        throw std::runtime_error("disk file");
      }
      ::close(fd);
    }
    pid_ = fork_child([&] { return run_child(size, content, setup); });
    try {
      receive_table();
      watch_files();
    } catch (...) {
      clean_up();
      throw;
    }
  }

  ~hostile_peer() { clean_up(); }
  hostile_peer(const hostile_peer&) = delete;
  hostile_peer& operator=(const hostile_peer&) = delete;

  pid_t pid() const { return pid_; }
  /// The child's descriptor number of `f`.
  int fd(file f) const { return fds_[f]; }
  /// The inode of `f` (0 for the device and the socket).
  uint64_t inode(file f) const { return inodes_[f]; }
  /// The channel `setup` writes to.
  const channel& from_setup() const { return from_setup_; }

  /// Opens of the FIFO, the disk file or the leased file since the child reported them.
  size_t opens_seen() {
    size_t opens = 0;
    alignas(inotify_event) char buffer[4096];
    for (ssize_t n; (n = ::read(inotify_, buffer, sizeof(buffer))) > 0;) {
      for (char* p = buffer; p < buffer + n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(p);
        opens += (event->mask & IN_OPEN) != 0 ? 1 : 0;
        p += sizeof(inotify_event) + event->len;
      }
    }
    return opens;
  }

  /// True when the child's lease was broken (somebody opened the leased file for writing); false
  /// when it was not, or the child did not answer.
  bool lease_broken() const {
    to_child_.send({'r'});
    std::vector<uint8_t> answer;
    return to_parent_.receive(&answer) && answer.size() == 1 && answer[0] == 1;
  }

private:
  std::string path(const char* name) const { return dir_ + "/" + name; }

  void receive_table() {
    std::vector<uint8_t> table;
    if (pid_ < 0 || !to_parent_.receive(&table) ||
        table.size() != sizeof(fds_) + sizeof(inodes_)) {
      throw std::runtime_error("the hostile child did not report its files");
    }
    std::memcpy(fds_.data(), table.data(), sizeof(fds_));
    std::memcpy(inodes_.data(), table.data() + sizeof(fds_), sizeof(inodes_));
  }

  /// Stops the child (killed if it does not quit) and removes the files.
  void clean_up() {
    if (pid_ > 0) {
      to_child_.send({'q'});
      wait_child(pid_);
    }
    if (inotify_ >= 0) ::close(inotify_);
    for (const char* name : {"fifo", "file", "leased"}) ::unlink(path(name).c_str());
    ::rmdir(dir_.c_str());
  }

  void watch_files() {
    inotify_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    for (const char* name : {"fifo", "file", "leased"}) {
      if (inotify_ < 0 || ::inotify_add_watch(inotify_, path(name).c_str(), IN_OPEN) < 0) {
        throw std::runtime_error("inotify");
      }
    }
  }

  static inline volatile sig_atomic_t lease_break_ = 0;

  /// A memfd of `size` bytes filled by `content`, with `seals` added.
  static int make_memfd(size_t size, const content_fn& content, int seals, bool fill) {
    const int fd = ::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) return -1;
    if (fill) {
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return -1;
      content(static_cast<uint8_t*>(p), size);
      ::munmap(p, size);
    }
    if (seals != 0 && ::fcntl(fd, F_ADD_SEALS, seals) != 0) return -1;
    return fd;
  }

  /// A read-only descriptor of the file behind `fd`, which is closed.
  static int read_only(int fd) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    const int reopened = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
    ::close(fd);
    return reopened;
  }

  int run_child(size_t size, const content_fn& content, const setup_fn& setup) {
    std::shared_ptr<void> kept = setup ? setup(from_setup_) : nullptr;
    struct sigaction on_break {};
    on_break.sa_handler = [](int) { lease_break_ = 1; };
    ::sigaction(SIGIO, &on_break, nullptr);
    int pair[2] = {-1, -1};
    CHILD_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    std::array<int, file_count> fds{};
    fds[fifo] = ::open(path("fifo").c_str(), O_PATH | O_CLOEXEC);
    fds[device] = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
    fds[disk_file] = ::open(path("file").c_str(), O_RDWR | O_CLOEXEC);
    fds[leased_file] = ::open(path("leased").c_str(), O_RDONLY | O_CLOEXEC);
    CHILD_CHECK(::fcntl(fds[leased_file], F_SETLEASE, F_RDLCK) == 0);
    fds[socket] = pair[0];
    constexpr int sealed = F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;
    fds[unsealed_memfd] = make_memfd(size, content, 0, true);
    fds[half_sealed_memfd] = make_memfd(size, content, F_SEAL_SHRINK, true);
    fds[write_sealed_memfd] = make_memfd(size, content, sealed | F_SEAL_WRITE, true);
    fds[read_only_memfd] = read_only(make_memfd(size, content, sealed, true));
    fds[empty_sealed_memfd] = make_memfd(size, content, sealed, false);
    fds[sealed_memfd] = make_memfd(size, content, sealed, true);
    std::array<uint64_t, file_count> inodes{};
    for (size_t i = 0; i < file_count; ++i) {
      struct stat st;
      CHILD_CHECK(fds[i] >= 0 && ::fstat(fds[i], &st) == 0);
      inodes[i] = S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode) ? st.st_ino : 0;
    }
    std::vector<uint8_t> table(sizeof(fds) + sizeof(inodes));
    std::memcpy(table.data(), fds.data(), sizeof(fds));
    std::memcpy(table.data() + sizeof(fds), inodes.data(), sizeof(inodes));
    to_parent_.send(table);
    return serve(fds[leased_file]);
  }

  /// Answers the parent until it says quit (60 s at most), letting go of the lease at once when
  /// it is broken, so that an opener is not stuck for the lease-break time.
  int serve(int leased) {
    bool broken = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (lease_break_ != 0 && !broken) {
        broken = true;
        ::fcntl(leased, F_SETLEASE, F_UNLCK);
      }
      pollfd command{to_child_.fds[0], POLLIN, 0};
      if (::poll(&command, 1, 10) != 1) continue;
      std::vector<uint8_t> bytes;
      if (!to_child_.receive(&bytes) || bytes.size() != 1 || bytes[0] == 'q') return 0;
      to_parent_.send({static_cast<uint8_t>(broken ? 1 : 0)});
    }
    return 0;
  }

  std::string dir_;
  channel to_child_;
  channel to_parent_;
  channel from_setup_;
  pid_t pid_ = -1;
  std::array<int, file_count> fds_{};
  std::array<uint64_t, file_count> inodes_{};
  int inotify_ = -1;
};

}  // namespace comm::test
