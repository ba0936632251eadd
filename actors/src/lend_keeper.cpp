#include "lend_keeper.hpp"

#include <comm/log.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <thread>

namespace comm::actors::detail {

bool process_gone(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, 0);
  } while (ready < 0 && errno == EINTR);
  return ready != 0;  // readable (exited), or a descriptor poll refuses: nothing to wait for
}

pid_t pid_of_pidfd(int pidfd) {
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return 0;
  char line[128];
  long pid = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "Pid: %ld", &pid) == 1) break;
  }
  std::fclose(f);
  return pid > 0 ? static_cast<pid_t>(pid) : 0;
}

lend_keeper& lend_keeper::instance() {
  static std::mutex creating;
  static lend_keeper* current = nullptr;
  std::lock_guard<std::mutex> g(creating);
  // Never destroyed: its thread may outlive every node, up to the process's exit. A forked
  // child leaves the parent's (whose thread it does not have) alone and makes its own.
  if (current == nullptr || current->creator_ != ::getpid()) current = new lend_keeper();
  return *current;
}

lend_keeper::lend_keeper() : creator_(::getpid()) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

void lend_keeper::keep(int pidfd, pid_t pid, std::vector<blob> blobs, size_t bytes,
                       std::shared_ptr<kept_lends> counters) {
  counters->count.fetch_add(blobs.size(), std::memory_order_relaxed);
  counters->bytes.fetch_add(bytes, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(mtx_);
  entries_.push_back(entry{pidfd, pid, std::move(blobs), bytes, std::move(counters)});
  if (!started_ && wake_fd_ >= 0) start_thread();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  } else {
    COMM_LOG(warn, "actors", "no eventfd for the lend keeper: %zu lent bytes of pid %d kept "
             "until this process exits", bytes, static_cast<int>(pid));
  }
}

size_t lend_keeper::bytes_for(pid_t pid) {
  std::lock_guard<std::mutex> g(mtx_);
  size_t total = 0;
  for (const entry& e : entries_) {
    if (e.pid == pid) total += e.bytes;
  }
  return total;
}

void lend_keeper::start_thread() {
  try {
    std::thread([this] { run(); }).detach();
    started_ = true;
  } catch (const std::system_error& e) {
    COMM_LOG(warn, "actors", "lend keeper: no thread (%s); kept lent bytes stay until the next "
             "attempt or this process's exit", e.what());
  }
}

void lend_keeper::run() {
  while (wait_and_free()) {
  }
}

bool lend_keeper::wait_and_free() {
  std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
  {
    std::lock_guard<std::mutex> g(mtx_);
    for (const entry& e : entries_) fds.push_back({e.pidfd, POLLIN, 0});
  }
  if (::poll(fds.data(), fds.size(), -1) < 0) {
    if (errno == EINTR) return true;
    COMM_LOG(error, "actors", "lend keeper: poll: %s; kept lends stay until exit",
             std::strerror(errno));
    return false;
  }
  uint64_t woken;
  (void)!::read(wake_fd_, &woken, sizeof(woken));
  std::list<entry> gone;
  {
    std::lock_guard<std::mutex> g(mtx_);
    // Entries are appended by others and erased only here: the first fds.size() - 1 are those
    // polled, in order.
    auto it = entries_.begin();
    for (size_t i = 1; i < fds.size(); ++i) {
      const auto next = std::next(it);
      if (fds[i].revents != 0) gone.splice(gone.end(), entries_, it);
      it = next;
    }
  }
  for (entry& e : gone) {
    const size_t count = e.blobs.size();
    e.blobs.clear();  // frees them (unless the lender still uses them too)
    ::close(e.pidfd);
    e.counters->count.fetch_sub(count, std::memory_order_relaxed);
    e.counters->bytes.fetch_sub(e.bytes, std::memory_order_relaxed);
    COMM_LOG(debug, "actors", "borrower pid %d exited: %zu kept lent bytes freed",
             static_cast<int>(e.pid), e.bytes);
  }
  return true;
}

}  // namespace comm::actors::detail
