#include "shm/shm_ep.hpp"

#include "shm/shm_iface.hpp"
#include "shm/shm_md.hpp"
#include "shm/shm_peer_fd.hpp"
#include "shm/shm.capnp.h"

#include <comm/log.hpp>
#include <comm/wire/codec.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <new>

namespace comm::tl::shm {
namespace {

/// A descriptor built in zcopy_max_desc_words words on the stack (no allocation).
struct descriptor_message {
  capnp::word words[zcopy_max_desc_words] = {};
  capnp::MallocMessageBuilder message{kj::arrayPtr(words, zcopy_max_desc_words)};

  /// The words of the descriptor, or none (logged for `what`) when it outgrew them.
  kj::ArrayPtr<const capnp::word> built(const char* what) {
    const auto segments = message.getSegmentsForOutput();
    if (segments.size() != 1 || segments[0].size() > zcopy_max_desc_words) {
      COMM_LOG(error, "shm", "%s: descriptor does not fit in %zu words", what,
               zcopy_max_desc_words);
      return {};
    }
    return segments[0];
  }
};

/// Writes `entries` into a descriptor's iov list `list` (of `count` entries).
void write_iov(capnp::List<wire::schema::ShmRemoteIov>::Builder list, const iov* entries,
               size_t count) {
  for (size_t i = 0; i < count; ++i) {
    list[i].setAddress(reinterpret_cast<uintptr_t>(entries[i].buffer));
    list[i].setLength(entries[i].length);
  }
}

}  // namespace

shm_ep::shm_ep(shm_iface& owner, shm_peer& peer)
    : owner_(owner),
      remote_(peer),
      peer_(peer.seg),
      fifo_size_(peer.address.fifo_size),
      max_short_(peer.address.geo().max_short()),
      zmask_(peer.address.fifo_size - 1),
      own_pid_(static_cast<int32_t>(::getpid())) {
  cached_tail_ = shared_word(peer_.control().tail).load(std::memory_order_acquire);
}

shm_ep::~shm_ep() {
  // Zcopy operations still in flight are dropped without calling their completions; rendezvous
  // are canceled (their receivers skip them) and their buffers released.
  for (const rndv_entry& op : rndv_ops_) release_rndv(op, false);
  owner_.forget(this);
}

// -- the FIFO -------------------------------------------------------------------------------------

inline status shm_ep::refusal() const {
  if (failed_) return status::connection_reset;
  if (pending_.blocks_sends()) return status::no_resource;  // parked requests go first
  return status::ok;
}

inline status shm_ep::claim(uint64_t* index, bool* wake) {
  auto head = shared_word(peer_.control().head);
  uint64_t seen = head.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t next = seen & ~head_armed;
    const int64_t used = static_cast<int64_t>(next - cached_tail_);
    if (used >= static_cast<int64_t>(fifo_size_) || used < 0) [[unlikely]] {
      cached_tail_ = shared_word(peer_.control().tail).load(std::memory_order_acquire);
      const int64_t fresh = static_cast<int64_t>(next - cached_tail_);
      if (fresh < 0) {  // our head was older than the tail we just read: look again
        seen = head.load(std::memory_order_relaxed);
        continue;
      }
      if (fresh >= static_cast<int64_t>(fifo_size_)) return status::no_resource;
    }
    // Writing next + 1 also clears head_armed: if it was set, we wake the receiver.
    if (head.compare_exchange_weak(seen, next + 1, std::memory_order_acq_rel,
                                   std::memory_order_relaxed)) {
      *index = next;
      *wake = (seen & head_armed) != 0;
      return status::ok;
    }
  }
}

inline void shm_ep::publish(cell_header* cell, uint64_t index, cell_meta meta, bool wake) {
  shared_word(cell->meta).store(meta.pack(), std::memory_order_relaxed);
  shared_word(cell->seq).store(index + 1, std::memory_order_release);
  if (wake) [[unlikely]] wake_peer();
}

void shm_ep::wake_peer() const {
  const char byte = 0;
  // Failure is harmless: a full socket already wakes the receiver; a closed one has nobody left.
  (void)::sendto(owner_.wakeup_sender_fd(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&remote_.wake_address),
                 remote_.wake_address_length);
}

bool shm_ep::fifo_may_have_room() {
  const uint64_t head =
      shared_word(peer_.control().head).load(std::memory_order_relaxed) & ~head_armed;
  if (head - cached_tail_ < fifo_size_) return true;
  cached_tail_ = shared_word(peer_.control().tail).load(std::memory_order_acquire);
  return head - cached_tail_ < fifo_size_;
}

bool shm_ep::reserve_zring() {
  if (zring_ == nullptr) zring_.reset(new (std::nothrow) zcopy_slot[fifo_size_]);
  return zring_ != nullptr;
}

// -- sends ----------------------------------------------------------------------------------------

status shm_ep::am_short(am_id id, const void* header, size_t header_length, const void* payload,
                        size_t payload_length) {
  const size_t length = header_length + payload_length;
  if (length > max_short_ || id >= am_id_count) [[unlikely]] return status::invalid_param;
  if (const status st = refusal(); st != status::ok) [[unlikely]] return st;
  uint64_t index;
  bool wake;
  if (claim(&index, &wake) != status::ok) return status::no_resource;
  cell_header* cell = peer_.cell(index);
  uint8_t* data = segment::cell_data(cell);
  if (header_length != 0) std::memcpy(data, header, header_length);
  if (payload_length != 0) std::memcpy(data + header_length, payload, payload_length);
  publish(cell, index, {id, cell_inline, 0, static_cast<uint32_t>(length)}, wake);
  return status::ok;
}

ssize_t shm_ep::am_bcopy(am_id id, pack_fn pack, void* arg) {
  if (id >= am_id_count) [[unlikely]] return static_cast<ssize_t>(status::invalid_param);
  if (const status st = refusal(); st != status::ok) [[unlikely]] {
    return static_cast<ssize_t>(st);
  }
  uint64_t index;
  bool wake;
  if (claim(&index, &wake) != status::ok) return static_cast<ssize_t>(status::no_resource);
  const size_t length = pack(peer_.buffer(index), arg);
  cell_header* cell = peer_.cell(index);
  if (length > peer_.geo().segment_size) [[unlikely]] {
    COMM_LOG(error, "shm", "am_bcopy: pack wrote %zu bytes, more than max_bcopy %u", length,
             peer_.geo().segment_size);
    publish(cell, index, {id, cell_skip, 0, 0}, wake);  // the cell is ours: hand it back empty
    return static_cast<ssize_t>(status::invalid_param);
  }
  publish(cell, index, {id, cell_bcopy, 0, static_cast<uint32_t>(length)}, wake);
  return static_cast<ssize_t>(length);
}

status shm_ep::am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                        size_t count, completion* comp) {
  if (id >= am_id_count || header_length > zcopy_max_hdr || count > zcopy_max_iov) {
    return status::invalid_param;
  }
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length > zcopy_max_payload) return status::invalid_param;
    total += entries[i].length;
  }
  if (total > zcopy_max_payload) return status::invalid_param;
  if (const status st = zcopy_refusal(); st != status::ok) return st;
  // The descriptor is built before the cell is claimed, so the receiver never waits on it.
  descriptor_message built;
  auto descriptor = built.message.initRoot<wire::schema::ShmZcopyDescriptor>();
  descriptor.setSenderPid(own_pid_);
  descriptor.setAmId(id);
  descriptor.setHeaderLength(static_cast<uint32_t>(header_length));
  descriptor.setCompletionAddr(0);  // unused: the receiver acks in its own segment (ack words)
  write_iov(descriptor.initIov(static_cast<unsigned>(count)), entries, count);
  const auto words = built.built("am_zcopy");
  if (words.size() == 0) return status::invalid_param;
  return publish_zcopy(descriptor, words, id, cell_zcopy, header, header_length, comp);
}

status shm_ep::zcopy_refusal() {
  if (const status st = refusal(); st != status::ok) return st;
  if (zhead_ - ztail_ > zmask_) return status::no_resource;
  if (!reserve_zring()) return status::no_memory;
  return status::ok;
}

template <class Descriptor>
status shm_ep::publish_zcopy(Descriptor descriptor, kj::ArrayPtr<const capnp::word> words,
                             am_id id, cell_kind kind, const void* header, size_t header_length,
                             completion* comp) {
  uint64_t index;
  bool wake;
  if (claim(&index, &wake) != status::ok) return status::no_resource;
  descriptor.setCompletionSeq(index + 1);  // in place: `words` are the descriptor's
  const size_t desc_bytes = words.size() * sizeof(capnp::word);
  uint8_t* buffer = peer_.buffer(index);
  std::memcpy(buffer, words.begin(), desc_bytes);
  if (header_length != 0) std::memcpy(buffer + desc_bytes, header, header_length);
  cell_header* cell = peer_.cell(index);
  shared_word(*reinterpret_cast<uint64_t*>(segment::cell_data(cell)))
      .store(owner_.id(), std::memory_order_relaxed);  // where the receiver sends a wakeup
  zring_[zhead_ & zmask_] = {index, comp};
  ++zhead_;
  publish(cell, index,
          {id, kind, static_cast<uint16_t>(words.size()),
           static_cast<uint32_t>(desc_bytes + header_length)},
          wake);
  owner_.schedule(this);
  return status::in_progress;
}

// -- RMA ------------------------------------------------------------------------------------------

status shm_ep::put_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                         const remote_key& key, completion* comp) {
  return rma(entries, count, remote_address, key, true);
}

status shm_ep::get_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                         const remote_key& key, completion* comp) {
  return rma(entries, count, remote_address, key, false);
}

status shm_ep::rkey_local_address(uint64_t remote_address, size_t length,
                                  const remote_key& key, local_bytes* out) {
  const packed_rkey* k = rkey_of(key, rkey_magic_shm);
  if (k == nullptr || out == nullptr) return status::invalid_param;
  if (failed_ || failure_noticed) return status::connection_reset;
  if (k->pid != remote_.address.pid || k->iface_id != remote_.address.iface_id) {
    return status::invalid_param;
  }
  bool read_only = false;
  if (const status st = check_access(peer_, *k, remote_address, length, false, &read_only);
      st != status::ok) {
    return remote_.closed() ? status::connection_reset : st;
  }
  segment_ref segment;
  if (!segment_of(key, &segment)) return status::unsupported;
  mapped_segments& mapped = owner_.mapped();
  // A region peers may only read is handed out through a read-only mapping: writes fault here.
  uint8_t* base = mapped.map(peer_pid(), remote_.pidfd, segment, !read_only);
  if (base == nullptr) return status::unsupported;
  if (mapped_segments::released(base)) [[unlikely]] {
    mapped.forget(peer_pid(), segment.id);
    return status::io_error;
  }
  // As in mapped_rma: check_access put the range inside the key's region, inside the segment.
  out->data = base + segment.offset + (remote_address - k->base);
  out->mapping = mapped.last_mapping();
  return status::ok;
}

bool shm_ep::peer_alive() const { return !process_exited(remote_.pidfd); }

status shm_ep::rma(const iov* entries, size_t count, uint64_t remote_address,
                   const remote_key& key, bool write) {
  const packed_rkey* k = rkey_of(key, rkey_magic_shm);
  size_t total = 0;
  if (k == nullptr || !sum_iov(entries, count, &total)) return status::invalid_param;
  const status st = checked_rma(*k, key, entries, count, remote_address, total, write);
  owner_.count_rma(write, total, st);
  if (st == status::connection_reset) owner_.peer_failed(this);  // once; a no-op after that
  return st;
}

status shm_ep::checked_rma(const packed_rkey& key, const remote_key& unpacked,
                           const iov* entries, size_t count, uint64_t remote_address, size_t total,
                           bool write) {
  if (failed_ || failure_noticed) return status::connection_reset;
  if (key.pid != remote_.address.pid || key.iface_id != remote_.address.iface_id) {
    return status::invalid_param;
  }
  bool read_only = false;
  const status st = check_access(peer_, key, remote_address, total, write, &read_only);
  if (st != status::ok) [[unlikely]] {
    // A closed peer invalidated its table: say why rather than blame the key.
    return remote_.closed() ? status::connection_reset : st;
  }
  if (total == 0) return status::ok;
  // Through our mapping of the peer's segment no system call is made: a peer that died meanwhile
  // leaves a segment nobody reads, which the interface's liveness check reports soon after.
  if (segment_ref segment; segment_of(unpacked, &segment)) {
    const status st =
        mapped_rma(key, segment, entries, count, remote_address, write, !read_only);
    if (st != status::unsupported) return st;
  }
  // CMA names the peer by pid: a put into a reaped peer's reused pid would write into a
  // stranger, so make sure it is alive.
  if (write && !peer_alive()) [[unlikely]] return status::connection_reset;
  return cma_transfer(peer_pid(), entries, count, remote_address, total, write);
}

status shm_ep::mapped_rma(const packed_rkey& key, const segment_ref& segment, const iov* entries,
                          size_t count, uint64_t remote_address, bool write, bool writable) {
  mapped_segments& mapped = owner_.mapped();
  uint8_t* base = mapped.map(peer_pid(), remote_.pidfd, segment, writable);
  if (base == nullptr) return status::unsupported;
  if (mapped_segments::released(base)) [[unlikely]] {
    // Freed to the system under a live registration: what CMA's EFAULT reports.
    mapped.forget(peer_pid(), segment.id);
    COMM_LOG(debug, "shm", "%s at 0x%llx in pid %d: segment released by its owner",
             write ? "put" : "get", static_cast<unsigned long long>(remote_address),
             static_cast<int>(peer_pid()));
    return status::io_error;
  }
  // check_access put the access inside [key.base, key.base + key.length), which rkey_unpack put
  // inside the segment, whose size the mapping was checked to have.
  mapped_transfer(entries, count, base + segment.offset + (remote_address - key.base), write);
  owner_.count_mapped(write);
  return status::ok;
}

// -- pending, flush, progress, failure ------------------------------------------------------------

status shm_ep::pending_add(pending_req* req) {
  if (failed_) return status::connection_reset;
  if (pending_.empty() && !pending_.dispatching() && zhead_ - ztail_ <= zmask_ &&
      fifo_may_have_room()) {
    return status::busy;
  }
  pending_.push_back(req);
  owner_.schedule(this);
  return status::ok;
}

void shm_ep::pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) {
  pending_.purge(cb, arg);
}

status shm_ep::flush(completion* comp) {
  if (failed_) return status::connection_reset;
  if (ztail_ == zhead_ && rndv_ops_.empty()) return status::ok;
  if (comp != nullptr) {
    flushes_.push_back({zhead_, rndv_issued_, comp});
    owner_.schedule(this);
  }
  return status::in_progress;
}

void shm_ep::complete_flushes(status result) {
  // Rendezvous finish out of order: a flush waits for the oldest one still outstanding.
  const uint64_t oldest_rndv = rndv_ops_.empty() ? rndv_issued_ : rndv_ops_.front().seq;
  while (!flushes_.empty() && flushes_.front().zhead <= ztail_ &&
         flushes_.front().rndv_seq <= oldest_rndv) {
    completion* comp = flushes_.front().comp;
    flushes_.erase(flushes_.begin());
    complete(comp, result);
  }
}

unsigned shm_ep::progress() {
  unsigned events = 0;
  while (ztail_ != zhead_) {
    const zcopy_slot& slot = zring_[ztail_ & zmask_];
    const uint64_t ack = shared_word(*peer_.ack(slot.index)).load(std::memory_order_acquire);
    if (!ack_covers(ack, slot.index)) break;
    // A later round of the cell may already have overwritten our ack: then we were fine.
    const bool ours = ack >> ack_shift == ((slot.index + 1) & (~uint64_t{0} >> ack_shift));
    const status result = ours ? ack_status(ack) : status::ok;
    completion* comp = slot.comp;
    ++ztail_;
    ++events;
    if (comp != nullptr) complete(comp, result);
  }
  if (!rndv_ops_.empty()) [[unlikely]] events += progress_rndv();
  if (!flushes_.empty()) complete_flushes(status::ok);
  if (!pending_.empty() && !failed_ && fifo_may_have_room()) events += pending_.dispatch();
  return events;
}

status shm_ep::arm() {
  if (!pending_.empty()) return status::busy;  // room in the FIFO comes without a wakeup
  if (failed_) return status::ok;
  if (!rndv_ops_.empty() && arm_rndv() != status::ok) return status::busy;
  if (ztail_ == zhead_) return status::ok;
  const uint64_t index = zring_[ztail_ & zmask_].index;
  auto word = shared_word(*peer_.ack(index));
  uint64_t ack = word.load(std::memory_order_acquire);
  for (;;) {
    if (ack_covers(ack, index)) return status::busy;
    if ((ack & ack_wake) != 0) return status::ok;
    if (word.compare_exchange_weak(ack, ack | ack_wake, std::memory_order_acq_rel,
                                   std::memory_order_acquire)) {
      return status::ok;
    }
  }
}

void shm_ep::fail(status reason) {
  if (failed_) return;
  failed_ = true;
  while (ztail_ != zhead_) {
    completion* comp = zring_[ztail_ & zmask_].comp;
    ++ztail_;
    if (comp != nullptr) complete(comp, reason);
  }
  std::vector<rndv_entry> outstanding;
  outstanding.swap(rndv_ops_);
  for (const rndv_entry& op : outstanding) {
    release_rndv(op, false);
    if (op.comp != nullptr) complete(op.comp, reason);
  }
  complete_flushes(reason);
}

// -- tag matching: eager --------------------------------------------------------------------------

status shm_ep::tag_eager_short(tag_t tag, const void* data, size_t length) {
  if (length > max_short_ - tag_header_size || (data == nullptr && length != 0)) [[unlikely]] {
    return status::invalid_param;
  }
  if (const status st = refusal(); st != status::ok) [[unlikely]] return st;
  uint64_t index;
  bool wake;
  if (claim(&index, &wake) != status::ok) return status::no_resource;
  cell_header* cell = peer_.cell(index);
  uint8_t* dest = segment::cell_data(cell);
  owner_.write_tag_header(dest, tag, 0);
  if (length != 0) std::memcpy(dest + tag_header_size, data, length);
  publish(cell, index, {0, cell_tag_inline, 0, static_cast<uint32_t>(tag_header_size + length)},
          wake);
  return status::ok;
}

ssize_t shm_ep::tag_eager_bcopy(tag_t tag, uint64_t imm, pack_fn pack, void* arg) {
  if (const status st = refusal(); st != status::ok) [[unlikely]] {
    return static_cast<ssize_t>(st);
  }
  uint64_t index;
  bool wake;
  if (claim(&index, &wake) != status::ok) return static_cast<ssize_t>(status::no_resource);
  const size_t length = pack(peer_.buffer(index), arg);
  cell_header* cell = peer_.cell(index);
  if (length > peer_.geo().segment_size) [[unlikely]] {
    COMM_LOG(error, "shm", "tag_eager_bcopy: pack wrote %zu bytes, more than max_bcopy %u", length,
             peer_.geo().segment_size);
    publish(cell, index, {0, cell_skip, 0, 0}, wake);
    return static_cast<ssize_t>(status::invalid_param);
  }
  owner_.write_tag_header(segment::cell_data(cell), tag, imm);
  publish(cell, index, {0, cell_tag_bcopy, 0, static_cast<uint32_t>(length)}, wake);
  return static_cast<ssize_t>(length);
}

status shm_ep::tag_eager_zcopy(tag_t tag, uint64_t imm, const iov* entries, size_t count,
                               completion* comp) {
  size_t total = 0;
  if (count > zcopy_max_iov || !sum_iov(entries, count, &total) || total > zcopy_max_payload) {
    return status::invalid_param;
  }
  if (const status st = zcopy_refusal(); st != status::ok) return st;
  descriptor_message built;
  auto descriptor = built.message.initRoot<wire::schema::ShmTagZcopyDescriptor>();
  descriptor.setSenderPid(own_pid_);
  descriptor.setTag(tag);
  descriptor.setImm(imm);
  write_iov(descriptor.initIov(static_cast<unsigned>(count)), entries, count);
  const auto words = built.built("tag_eager_zcopy");
  if (words.size() == 0) return status::invalid_param;
  return publish_zcopy(descriptor, words, 0, cell_tag_zcopy, nullptr, 0, comp);
}

// -- tag matching: rendezvous ---------------------------------------------------------------------

status shm_ep::tag_rndv_zcopy(tag_t tag, const void* header, size_t header_length,
                              const iov* entries, size_t count, completion* comp,
                              uint64_t* handle) {
  size_t total = 0;
  if (handle == nullptr || header_length > tag_rndv_max_hdr || count > 1 ||
      (header == nullptr && header_length != 0) || !sum_iov(entries, count, &total)) {
    return status::invalid_param;
  }
  if (const status st = refusal(); st != status::ok) return st;
  rndv_entry op;
  if (!owner_.rndv_alloc(&op.slot, &op.generation)) return status::no_resource;
  op.handle = op.generation << 16 | op.slot;
  op.comp = comp;
  std::vector<uint8_t> rkey;
  const uint64_t address = total != 0 ? reinterpret_cast<uintptr_t>(entries[0].buffer) : 0;
  status st = status::ok;
  if (total != 0) {
    md& domain = *owner_.memory_domain();
    st = domain.mem_reg(const_cast<void*>(entries[0].buffer), total, &op.memh);
    if (st == status::ok) st = domain.rkey_pack(op.memh, rkey);
  }
  if (st == status::ok) st = announce_rndv(op, tag, header, header_length, address, total, rkey);
  if (st != status::ok) {
    release_rndv(op, true);
    return st;
  }
  op.seq = rndv_issued_++;
  rndv_ops_.push_back(op);
  owner_.schedule(this);
  *handle = op.handle;
  return status::in_progress;
}

status shm_ep::announce_rndv(const rndv_entry& op, tag_t tag, const void* header,
                             size_t header_length, uint64_t address, uint64_t length,
                             const std::vector<uint8_t>& rkey) {
  descriptor_message built;
  auto descriptor = built.message.initRoot<wire::schema::ShmTagRndvDescriptor>();
  const iface_addr own = owner_.own_address();
  descriptor.setSenderPid(own.pid);
  descriptor.setSenderFd(own.fd);
  descriptor.setSenderIfaceId(own.iface_id);
  descriptor.setSenderFifoSize(own.fifo_size);
  descriptor.setSenderCellSize(own.cell_size);
  descriptor.setSenderSegSize(own.segment_size);
  descriptor.setOpSlot(op.slot);
  descriptor.setOpGeneration(op.generation);
  descriptor.setTag(tag);
  descriptor.setHeaderLength(static_cast<uint32_t>(header_length));
  descriptor.setAddress(address);
  descriptor.setLength(length);
  descriptor.setRkey(kj::arrayPtr(rkey.data(), rkey.size()));
  const auto words = built.built("tag_rndv_zcopy");
  if (words.size() == 0) return status::invalid_param;
  const size_t desc_bytes = words.size() * sizeof(capnp::word);
  // Posted before it is announced: the receiver claims it from there.
  shared_word(owner_.rndv_word(op.slot))
      .store(rndv_op_word::make(op.generation, rndv_op_word::posted), std::memory_order_release);
  uint64_t index;
  bool wake;
  if (claim(&index, &wake) != status::ok) return status::no_resource;
  uint8_t* buffer = peer_.buffer(index);
  std::memcpy(buffer, words.begin(), desc_bytes);
  if (header_length != 0) std::memcpy(buffer + desc_bytes, header, header_length);
  publish(peer_.cell(index), index,
          {0, cell_tag_rndv, static_cast<uint16_t>(words.size()),
           static_cast<uint32_t>(desc_bytes + header_length)},
          wake);
  return status::ok;
}

void shm_ep::release_rndv(const rndv_entry& op, bool finished) {
  if (!finished) {
    // Whatever state it is in: a receiver's later CAS (of this generation) fails.
    shared_word(owner_.rndv_word(op.slot))
        .store(rndv_op_word::make(op.generation, rndv_op_word::canceled),
               std::memory_order_release);
  }
  if (op.memh != nullptr) owner_.memory_domain()->mem_dereg(op.memh);
  owner_.rndv_free(op.slot);
}

status shm_ep::tag_rndv_cancel(uint64_t handle) {
  for (size_t i = 0; i < rndv_ops_.size(); ++i) {
    if (rndv_ops_[i].handle != handle) continue;
    release_rndv(rndv_ops_[i], false);
    rndv_ops_.erase(rndv_ops_.begin() + static_cast<std::ptrdiff_t>(i));
    return status::ok;  // waiting flushes complete on the next progress
  }
  return status::no_elem;
}

unsigned shm_ep::progress_rndv() {
  unsigned events = 0;
  for (size_t i = 0; i < rndv_ops_.size();) {
    const rndv_entry op = rndv_ops_[i];
    const uint64_t word =
        shared_word(owner_.rndv_word(op.slot)).load(std::memory_order_acquire);
    status result;
    if (rndv_op_word::generation(word) != op.generation) [[unlikely]] {
      result = status::protocol_error;  // somebody overwrote our word
    } else if (rndv_op_word::state(word) == rndv_op_word::done) {
      result = rndv_op_word::result(word);
    } else {
      ++i;
      continue;
    }
    rndv_ops_.erase(rndv_ops_.begin() + static_cast<std::ptrdiff_t>(i));
    release_rndv(op, true);
    ++events;
    if (op.comp != nullptr) complete(op.comp, result);
  }
  return events;
}

status shm_ep::arm_rndv() {
  for (const rndv_entry& op : rndv_ops_) {
    auto word = shared_word(owner_.rndv_word(op.slot));
    uint64_t seen = word.load(std::memory_order_acquire);
    for (;;) {
      if (rndv_op_word::generation(seen) != op.generation ||
          rndv_op_word::state(seen) == rndv_op_word::done) {
        return status::busy;
      }
      if ((seen & rndv_op_word::wake) != 0) break;
      if (word.compare_exchange_weak(seen, seen | rndv_op_word::wake, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
        break;
      }
    }
  }
  return status::ok;
}

status shm_ep::tag_rndv_request(tag_t tag, const void* header, size_t header_length) {
  if (header_length > tag_rndv_max_hdr || (header == nullptr && header_length != 0)) {
    return status::invalid_param;
  }
  if (const status st = refusal(); st != status::ok) return st;
  uint64_t index;
  bool wake;
  if (claim(&index, &wake) != status::ok) return status::no_resource;
  if (header_length != 0) std::memcpy(peer_.buffer(index), header, header_length);
  cell_header* cell = peer_.cell(index);
  owner_.write_tag_header(segment::cell_data(cell), tag, 0);
  publish(cell, index, {0, cell_tag_request, 0, static_cast<uint32_t>(header_length)}, wake);
  return status::ok;
}

}  // namespace comm::tl::shm
