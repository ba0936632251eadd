// Lends kept after their connection closed: the bytes of blobs a borrower process may still map.
//
// A borrower reads a lent blob in place (lending.hpp) and holds its mapping of the lender's memory
// for as long as it keeps the blob, whatever happens to the connection. When the connection ends
// on purpose (node::disconnect, a node that stops, a duplicate connection closed) while the
// borrower process lives, its releases can no longer arrive, and freeing the blobs would let the
// lender's allocator hand those bytes out again under the borrower's eyes. So the node hands the
// blobs (not their registrations: nobody can use the keys without the connection) to this
// keeper, which holds them until the borrower process exits, as its pidfd
// (endpoint::peer_process_fd) tells: one thread per process, started at the first kept lend,
// sleeps in poll(2) on the pidfds and frees a process's blobs as soon as it is gone. A lend whose
// borrower has already exited is freed at once, as before.
//
// Bound: the bytes kept for one borrower process count against node_params::max_lent_bytes of
// every later connection to it (lend_table::kept_before), so a borrower that keeps connecting,
// borrowing and disconnecting gets copies once it holds max_lent_bytes; what one connection had
// lent when it closed is at most max_lent_bytes.
//
// The keeper lives as long as the process (it may outlive every node; nodes count what it keeps
// for them in a kept_lends they share with it). A forked child starts its own.
#pragma once

#include <comm/actors/blob.hpp>

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace comm::actors::detail {

/// What a node has handed to the keeper and is not freed yet (shared: the keeper may outlive the
/// node).
struct kept_lends {
  std::atomic<size_t> count{0};  ///< lends kept now
  std::atomic<size_t> bytes{0};  ///< their bytes
};

/// The process's keeper of lent blobs whose connection closed (see the file comment).
class lend_keeper {
public:
  /// The keeper of this process (a fresh one in a forked child).
  static lend_keeper& instance();

  /// Keeps `blobs` (`bytes` in all) until the process behind `pidfd` (the process `pid`) has
  /// exited; takes the descriptor. Counted in `counters` meanwhile.
  void keep(int pidfd, pid_t pid, std::vector<blob> blobs, size_t bytes,
            std::shared_ptr<kept_lends> counters);

  /// Bytes kept now for process `pid`.
  size_t bytes_for(pid_t pid);

  lend_keeper(const lend_keeper&) = delete;
  lend_keeper& operator=(const lend_keeper&) = delete;

private:
  /// Blobs kept for one borrower process.
  struct entry {
    int pidfd;
    pid_t pid;
    std::vector<blob> blobs;
    size_t bytes;
    std::shared_ptr<kept_lends> counters;
  };

  lend_keeper();
  /// Starts the thread (the caller holds mtx_); logs when it cannot, to try again at the next
  /// keep.
  void start_thread();
  /// The thread: waits for borrowers to exit and frees their blobs.
  void run();
  /// Frees the entries whose process has exited; false when it cannot wait any more.
  bool wait_and_free();

  const pid_t creator_;  ///< the process this keeper belongs to
  int wake_fd_ = -1;     ///< eventfd: an entry was added
  std::mutex mtx_;
  std::list<entry> entries_;  ///< erased by the thread only
  bool started_ = false;      ///< the thread runs
};

/// True when the process behind `pidfd` has exited.
bool process_gone(int pidfd);

/// The pid of the process behind `pidfd` (from /proc/self/fdinfo), or 0.
pid_t pid_of_pidfd(int pidfd);

}  // namespace comm::actors::detail
