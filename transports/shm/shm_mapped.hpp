// The peers' shared-heap segments an shm interface has mapped: the "mapped-segment" path of RMA.
//
// When an rkey carries a segment_ref (its region lies in the owner's shared heap, shm_heap.hpp),
// the accessing side takes the owner's descriptor (shm_peer_fd.hpp: a memfd of that inode and size,
// sealed, or nothing is opened), maps it, checks that its header names that segment id and owner,
// and then copies with memcpy. The mapping stays cached by (pid, segment id), least recently used
// unmapped first once the mapped bytes pass a budget (safe: accesses are synchronous). A key
// naming a cached segment id with another inode or size is not trusted with that mapping.
// Anything that fails makes map() return null and the caller falls back to CMA; a failed reference
// is remembered (exactly, so a forged key does not spoil the genuine one), so it costs one attempt.
// Segments their owner released (heap_header::released) are unmapped at their next access and
// whenever a new mapping is made, so freed memory is not kept alive for long.
// A mapping is unmapped once the cache dropped it and nobody holds it any more: rkey_local_address
// hands out a hold (last_mapping), so bytes a user keeps (a lent actor blob) outlive eviction, the
// peer's failure and the interface itself. Held mappings the cache dropped are not in bytes().
// A segment is mapped writable for regions open to remote writes, and read-only (PROT_READ) for
// regions registered read-only (md::mem_reg_read_only): each is its own mapping, cached apart, so
// bytes of a read-only region never sit in a writable mapping, while gets and puts into ordinary
// regions share one mapping of the segment.
// Not thread safe: the interface's owner serialises calls.
#pragma once

#include "shm/shm_heap.hpp"

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <unordered_set>

namespace comm::tl::shm {

/// Peers' heap segments mapped into this process, LRU by bytes.
class mapped_segments {
public:
  /// A cache that keeps at most `budget` bytes mapped (a larger segment is never mapped).
  explicit mapped_segments(size_t budget);
  /// Unmaps everything.
  ~mapped_segments();
  mapped_segments(const mapped_segments&) = delete;
  mapped_segments& operator=(const mapped_segments&) = delete;

  /// The local start of segment `ref` of process `pid` (whose pidfd is `pidfd`), mapped now if it
  /// is not yet, writable with `writable` and read-only otherwise; null when it cannot be mapped
  /// (the caller uses CMA).
  uint8_t* map(pid_t pid, int pidfd, const segment_ref& ref, bool writable);

  /// What keeps the mapping the last successful map() returned (valid after this cache and the
  /// interface are gone); null before any.
  std::shared_ptr<const void> last_mapping() const;

  /// True when the owner of the segment mapped at `base` has released it.
  static bool released(const uint8_t* base);

  /// Unmaps segment `id` of `pid` (released by its owner), both ways it may be mapped.
  void forget(pid_t pid, uint64_t id);

  /// Unmaps every segment of `pid` and forgets its failures (the peer is gone or disconnected).
  void forget_peer(pid_t pid);

  /// Segments mapped now.
  size_t count() const { return lru_.size(); }
  /// Bytes mapped now.
  size_t bytes() const { return bytes_; }
  /// Mappings made so far.
  uint64_t maps() const { return maps_; }
  /// Attempts that failed (each fell back to CMA).
  uint64_t failures() const { return failures_; }

private:
  struct key {
    pid_t pid;
    uint64_t id;
    bool writable;
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    size_t operator()(const key& k) const {
      return static_cast<size_t>(k.id * 0x9e3779b97f4a7c15ull) ^ static_cast<size_t>(k.pid) ^
             static_cast<size_t>(k.writable);
    }
  };
  struct entry {
    key k;
    uint8_t* base;
    size_t size;
    uint64_t inode;
    std::shared_ptr<const void> mapping;  ///< unmaps `base` when the last holder lets go
  };
  /// A reference that could not be mapped.
  struct failure {
    pid_t pid;
    segment_ref ref;
    bool operator==(const failure& o) const {
      return pid == o.pid && ref.fd == o.ref.fd && ref.inode == o.ref.inode && ref.id == o.ref.id &&
             ref.size == o.ref.size;
    }
  };
  struct failure_hash {
    size_t operator()(const failure& f) const {
      return key_hash{}(key{f.pid, f.ref.id, false}) ^ static_cast<size_t>(f.ref.inode << 7) ^
             static_cast<size_t>(f.ref.size);
    }
  };
  using lru_list = std::list<entry>;

  /// Opens, checks and maps the segment; null when any check fails.
  uint8_t* attach(pid_t pid, int pidfd, const segment_ref& ref, bool writable);
  void note_failure(pid_t pid, const segment_ref& ref);
  void erase(lru_list::iterator it);
  void sweep_released();
  void evict_beyond_budget();

  const size_t budget_;
  lru_list lru_;  ///< most recently used first
  std::unordered_map<key, lru_list::iterator, key_hash> index_;
  std::unordered_set<failure, failure_hash> failed_;
  size_t bytes_ = 0;
  uint64_t maps_ = 0;
  uint64_t failures_ = 0;
};

}  // namespace comm::tl::shm
