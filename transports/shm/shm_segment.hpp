// The shared-memory layout of the shm transport: one receive segment per interface, its
// addresses, and the mapping of a segment (our own, or a peer's to send to).
//
// A segment is a memfd owned by the receiving interface, sealed against resizing; peers take it
// from the owner by pidfd_getfd (or a checked reopen through /proc/<pid>/fd/<fd>, see
// shm_peer_fd.hpp) and map it, once per peer interface however many endpoints use it.
// Layout (all offsets cache-line aligned):
//
//   control_block                      head (claimed cells | head_armed) on its own line,
//                                      published tail on another, then read-only identity
//   cells[fifo_size]                   cell_size bytes each: cell_header + inline data
//   acks[fifo_size]                    one word per cell: zcopy completion written by the receiver
//   buffer_of[fifo_size]               one word per cell: the buffer senders fill for that cell,
//                                      written by the receiver only (initially buffer i for cell i)
//   buffers[fifo_size + spare_buffers] segment_size bytes each (page aligned). When an am handler
//                                      keeps a bcopy message (am_flag_desc), the receiver lends
//                                      its buffer out and gives the cell a spare one before the
//                                      cell can be claimed again; it reads buffer_of only from its
//                                      own copy, so a sender rewriting it misleads nobody but
//                                      itself
//   regions[region_table_size]         the memory domain's region table (region_entry), written
//                                      by the owner only, read by peers before every RMA access
//   rndv_ops[rndv_slots]               one word per rendezvous the owner announced as a sender
//                                      (see rndv_op_word): receivers claim and complete them
//
// Senders claim cell `head` with a CAS on head, fill it, then store seq = index + 1 (release).
// The receiver consumes cells in order, waiting at `tail` for seq == tail + 1 (acquire), and
// publishes its tail every fifo_size / 4 cells and whenever it drains the FIFO.
#pragma once

#include <comm/status.hpp>

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace comm::tl::shm {

inline constexpr size_t cache_line = 64;
inline constexpr uint64_t segment_magic = 0x316d68736d6d6f63ull;  // "commshm1"
inline constexpr uint32_t segment_version = 4;  // 2: region table, 3: buffer_of and spares,
                                                 // 4: rendezvous operation words

/// Receive buffers beyond one per cell: what handlers keeping bcopy messages hold at most.
inline constexpr uint32_t spare_buffers = 16;

/// Bit of control_block::head set by a receiver that sleeps on its event fd. The sender whose CAS
/// clears it wakes the receiver after publishing its cell.
inline constexpr uint64_t head_armed = 1ull << 63;

/// What a cell carries (cell_header::kind).
enum cell_kind : uint8_t {
  cell_inline = 1,  ///< am_short: the message follows the cell header
  cell_bcopy = 2,   ///< am_bcopy: the message is in the cell's receive buffer
  cell_zcopy = 3,   ///< am_zcopy: descriptor + protocol header in the buffer, payload in the
                    ///< sender; inline: the sender's iface id (where to send a wakeup)
  cell_skip = 4,    ///< nothing to deliver (a sender's failed bcopy); the receiver skips it
  // Tag matching (the receiver matches them against its posted receives):
  cell_tag_inline = 5,   ///< tag_eager_short: a ShmTagHeader, then the message, in the cell
  cell_tag_bcopy = 6,    ///< tag_eager_bcopy: a ShmTagHeader in the cell, the message in the
                         ///< cell's receive buffer
  cell_tag_zcopy = 7,    ///< tag_eager_zcopy: a ShmTagZcopyDescriptor in the buffer, acked as
                         ///< cell_zcopy; inline: the sender's iface id
  cell_tag_rndv = 8,     ///< tag_rndv_zcopy: a ShmTagRndvDescriptor + header in the buffer
  cell_tag_request = 9,  ///< tag_rndv_request: a ShmTagHeader in the cell, the header in the buffer
};

/// The segment's first bytes. Head and tail each own a cache line.
struct control_block {
  alignas(cache_line) uint64_t head;  ///< cells claimed by senders, plus head_armed
  alignas(cache_line) uint64_t tail;  ///< cells the receiver is done with (published lazily)
  alignas(cache_line) uint64_t magic; ///< segment_magic
  uint64_t iface_id;                  ///< random id of the owning interface
  uint32_t version;                   ///< segment_version
  uint32_t fifo_size;
  uint32_t cell_size;
  uint32_t segment_size;
  int32_t owner_pid;
  uint32_t closed;                    ///< set when the owning interface is destroyed
  uint32_t region_count;              ///< entries of the region table (region_table_size)
  uint32_t reserved;
};
static_assert(sizeof(control_block) == 3 * cache_line);

/// Bytes of the ShmTagHeader (root pointer + tag + imm) that starts a tagged cell's data.
inline constexpr size_t tag_header_size = 24;

/// The first 16 bytes of a cell; inline data follows, 8-byte aligned.
struct cell_header {
  uint64_t seq;  ///< index + 1 once the cell at `index` is filled (release store)
  uint64_t meta; ///< am_id | kind << 8 | desc_words << 16 | length << 32 (see cell_meta)
};
inline constexpr size_t cell_header_size = sizeof(cell_header);

/// The fields packed into cell_header::meta, written and read as one word.
struct cell_meta {
  uint8_t am_id = 0;
  uint8_t kind = 0;
  uint16_t desc_words = 0;  ///< zcopy: 8-byte words of the descriptor at the start of the buffer
  uint32_t length = 0;      ///< inline/bcopy: message bytes; zcopy: descriptor + header bytes

  uint64_t pack() const {
    return uint64_t{am_id} | uint64_t{kind} << 8 | uint64_t{desc_words} << 16 |
           uint64_t{length} << 32;
  }
  static cell_meta unpack(uint64_t word) {
    return {static_cast<uint8_t>(word), static_cast<uint8_t>(word >> 8),
            static_cast<uint16_t>(word >> 16), static_cast<uint32_t>(word >> 32)};
  }
};

/// Limits of am_zcopy. The descriptor and the protocol header go into the cell's receive buffer
/// (so segment_size >= 1024 always has room for both); the payload is pulled into a private buffer
/// of the receiver, so it can be larger than a receive buffer.
inline constexpr size_t zcopy_max_iov = 16;
inline constexpr size_t zcopy_max_hdr = 512;
inline constexpr size_t zcopy_max_payload = 256 * 1024;
/// Bound on a descriptor's size in words (one with zcopy_max_iov entries takes 39).
inline constexpr size_t zcopy_max_desc_words = 64;

/// An ack word: (index + 1) << ack_shift | ack_wake | code, where code is the negated status of
/// the zcopy at `index` (0 = ok). A sender that sleeps until its oldest zcopy is acked sets ack_wake
/// with a CAS; the receiver acks with an exchange and wakes the sender if it finds the bit.
inline constexpr unsigned ack_shift = 16;
inline constexpr uint64_t ack_wake = 1u << 15;
inline constexpr uint64_t ack_code_mask = ack_wake - 1;

inline uint64_t make_ack(uint64_t index, status result) {
  return (index + 1) << ack_shift | (static_cast<uint64_t>(-static_cast<int>(result)) & ack_code_mask);
}

/// True when `ack` acknowledges the zcopy at `index`, or a later round of its cell (which cannot
/// be claimed before `index` was consumed).
inline bool ack_covers(uint64_t ack, uint64_t index) {
  const uint64_t acked = ack >> ack_shift;
  const uint64_t wanted = (index + 1) & (~uint64_t{0} >> ack_shift);
  return static_cast<int64_t>((acked - wanted) << ack_shift) >= 0;  // modulo 2^48
}

/// The status an ack carries.
inline status ack_status(uint64_t ack) {
  return static_cast<status>(-static_cast<int>(ack & ack_code_mask));
}

/// Entries of the region table of every segment.
inline constexpr uint32_t region_table_size = 4096;

/// One slot of the region table: a registered region of the owner's memory. `state` is
/// generation << 1 | region_valid; the owner bumps the generation at every registration of the
/// slot and clears region_valid at deregistration, so a key (which carries the generation) goes
/// stale forever once its registration is gone. Protocol (a seqlock): the owner writes base and
/// length only while the slot is invalid, then publishes the state with a release store; a reader
/// loads the state (acquire), base and length, fences (acquire) and loads the state again, and
/// trusts base/length/rights only when both loads equal the state its key expects. `rights` is
/// what peers may do: region_read_only refuses their puts (md::mem_reg_read_only), 0 allows all.
struct region_entry {
  uint64_t state;     ///< generation << 1 | region_valid
  uint64_t base;      ///< start of the region in the owner's address space
  uint64_t length;    ///< bytes in the region
  uint64_t rights;    ///< 0, or region_read_only
};
static_assert(sizeof(region_entry) == 32);
inline constexpr uint64_t region_valid = 1;
/// region_entry::rights of a region peers may only read.
inline constexpr uint64_t region_read_only = 1;

/// Rendezvous an interface may have announced at once as a sender (its rndv_ops words).
inline constexpr uint32_t rndv_slots = 1024;

/// The word of a rendezvous in its sender's segment: generation << 24 | code << 8 | rndv_wake |
/// state, where code is the negated status of a done operation. The sender writes posted with a
/// fresh generation before announcing the operation; the receiver claims it with a CAS from
/// posted to taken (so a canceled one is skipped), then ends it with a CAS to done (after fetching
/// the data into a posted receive) or to unexpected (handed to the unexpected handler: the
/// operation then waits for the sender's cancel). The sender's cancel moves any state to canceled
/// and frees the slot, whose next generation makes every late CAS of a receiver fail. A sender
/// sleeping until its operation is done sets rndv_wake; the receiver that ends it wakes it.
struct rndv_op_word {
  /// States of an operation.
  enum state_value : uint64_t { free = 0, posted = 1, taken = 2, unexpected = 3, done = 4,
                                canceled = 5 };
  static constexpr uint64_t state_mask = 0x7f;
  static constexpr uint64_t wake = 0x80;  ///< rndv_wake: the sender sleeps until it is done

  /// The word of generation `generation` in state `state` (with `result` when done).
  static uint64_t make(uint64_t generation, uint64_t state, status result = status::ok) {
    const uint64_t code = static_cast<uint64_t>(-static_cast<int>(result)) & 0xffff;
    return generation << 24 | code << 8 | state;
  }
  static uint64_t generation(uint64_t word) { return word >> 24; }
  static uint64_t state(uint64_t word) { return word & state_mask; }
  static status result(uint64_t word) {
    return static_cast<status>(-static_cast<int>((word >> 8) & 0xffff));
  }
  /// `word` moved to state `state` (with `result`), keeping its generation and wake bit.
  static uint64_t with_state(uint64_t word, uint64_t state, status result = status::ok) {
    return make(generation(word), state, result) | (word & wake);
  }
};

/// Largest generation of a rendezvous word.
inline constexpr uint64_t max_rndv_generation = (uint64_t{1} << 40) - 1;

/// Sizes of a segment and where its parts start.
struct geometry {
  uint32_t fifo_size = 0;     ///< cells, a power of two
  uint32_t cell_size = 0;     ///< bytes per cell, a power of two >= 64
  uint32_t segment_size = 0;  ///< bytes per receive buffer, a multiple of 64

  /// True when the sizes are within the bounds this transport accepts.
  bool valid() const;
  size_t cells_offset() const { return sizeof(control_block); }
  size_t acks_offset() const { return cells_offset() + size_t{fifo_size} * cell_size; }
  size_t buffer_of_offset() const { return acks_offset() + size_t{fifo_size} * sizeof(uint64_t); }
  size_t buffers_offset() const;
  /// Receive buffers: one per cell plus the spares.
  size_t buffer_count() const { return size_t{fifo_size} + spare_buffers; }
  size_t regions_offset() const { return buffers_offset() + buffer_count() * segment_size; }
  size_t rndv_offset() const {
    return regions_offset() + size_t{region_table_size} * sizeof(region_entry);
  }
  size_t total_size() const { return rndv_offset() + size_t{rndv_slots} * sizeof(uint64_t); }
  /// Largest am_short: a cell minus its header.
  size_t max_short() const { return cell_size - cell_header_size; }
};

/// Interface address: how a peer finds and verifies our segment.
struct [[gnu::packed]] iface_addr {
  uint8_t version = segment_version;
  uint8_t reserved[3] = {};
  int32_t pid = 0;            ///< owner process
  int32_t fd = -1;            ///< the segment's memfd in the owner
  uint32_t fifo_size = 0;
  uint32_t cell_size = 0;
  uint32_t segment_size = 0;
  uint64_t iface_id = 0;      ///< also stored in the segment, checked after mapping

  geometry geo() const { return {fifo_size, cell_size, segment_size}; }
  std::vector<uint8_t> pack() const;
  /// Validates and unpacks; nothing when the bytes are not an address of this version.
  static std::optional<iface_addr> unpack(const std::vector<uint8_t>& bytes);
};

/// Device address: the host boot and namespaces (see base/host_identity.hpp).
std::vector<uint8_t> pack_device_address();
/// True when `bytes` is the device address of a process that shares our host and namespaces.
bool same_device(const std::vector<uint8_t>& bytes);

/// The abstract unix socket name a receiver listens on for wakeups.
socklen_t wakeup_socket_address(int32_t pid, uint64_t iface_id, sockaddr_un* out);

/// std::atomic_ref over a word of shared memory.
inline std::atomic_ref<uint64_t> shared_word(uint64_t& word) { return std::atomic_ref<uint64_t>(word); }

/// Where the parts of a mapped segment are: a view that does not own the mapping. An endpoint keeps
/// a copy of its peer's (which the interface maps once per peer) for its hot path.
class segment_view {
public:
  bool mapped() const { return base_ != nullptr; }
  /// Start of the mapping (geo().total_size() bytes, page aligned).
  uint8_t* base() const { return base_; }
  const geometry& geo() const { return geo_; }
  control_block& control() const { return *reinterpret_cast<control_block*>(base_); }

  /// The cell of FIFO position `index` (any index; reduced modulo fifo_size).
  cell_header* cell(uint64_t index) const {
    return reinterpret_cast<cell_header*>(cells_ + ((index & mask_) << cell_shift_));
  }
  /// Inline data of a cell.
  static uint8_t* cell_data(cell_header* cell) {
    return reinterpret_cast<uint8_t*>(cell) + cell_header_size;
  }
  /// The ack word of FIFO position `index`.
  uint64_t* ack(uint64_t index) const { return acks_ + (index & mask_); }
  /// The sender's view of the receive buffer of FIFO position `index`: the one buffer_of names
  /// (the cell's own when the word is out of range, so a bad word never leaves the mapping).
  uint8_t* buffer(uint64_t index) const {
    uint64_t slot = shared_word(buffer_of_[index & mask_]).load(std::memory_order_relaxed);
    if (slot >= geo_.buffer_count()) [[unlikely]] slot = index & mask_;
    return buffer_at(slot);
  }
  /// Receive buffer `slot` (< geo().buffer_count()).
  uint8_t* buffer_at(uint64_t slot) const { return buffers_ + slot * geo_.segment_size; }
  /// The buffer_of word of FIFO position `index` (the receiver writes it).
  uint64_t& buffer_of(uint64_t index) const { return buffer_of_[index & mask_]; }
  /// Slot `index` (< region_table_size) of the region table.
  region_entry& region(uint32_t index) const { return regions_[index]; }
  /// The word of rendezvous slot `slot` (< rndv_slots), see rndv_op_word.
  uint64_t& rndv_op(uint32_t slot) const { return rndv_ops_[slot]; }

protected:
  /// Shows the mapping at `base` and computes where its parts start.
  void adopt(uint8_t* base, const geometry& geo);

  uint8_t* base_ = nullptr;
  geometry geo_;
  uint8_t* cells_ = nullptr;
  uint64_t* acks_ = nullptr;
  uint64_t* buffer_of_ = nullptr;
  uint8_t* buffers_ = nullptr;
  region_entry* regions_ = nullptr;
  uint64_t* rndv_ops_ = nullptr;
  uint64_t mask_ = 0;
  unsigned cell_shift_ = 0;
};

/// A mapped segment, which owns its mapping: our own receive segment, or a peer's.
class segment : public segment_view {
public:
  segment() = default;
  ~segment();
  segment(segment&& other) noexcept;
  segment& operator=(segment&& other) noexcept;
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;

  /// Creates a sealed memfd of `geo`'s size, maps it and writes the control block. On success
  /// `*fd` is the memfd, which the owner keeps open for as long as peers may attach.
  static status create(const geometry& geo, uint64_t iface_id, segment* out, int* fd);

  /// Maps the segment at `address` after checking that it is what the address says: the memfd of
  /// process `address.pid` (whose pidfd, opened before, is `pidfd`) of the advertised size, sealed
  /// (shm_peer_fd.hpp), whose control block names the advertised interface, geometry and owner.
  /// unreachable, with the reason logged, when it is not.
  static status attach(int pidfd, const iface_addr& address, segment* out);

private:
  void unmap();
};


}  // namespace comm::tl::shm
