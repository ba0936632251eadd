#include "shm/shm_iface.hpp"

#include "base/host_identity.hpp"
#include "shm/shm_config.hpp"
#include "shm/shm_ep.hpp"
#include "shm/shm.capnp.h"

#include <comm/log.hpp>
#include <comm/wire/codec.hpp>

#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace comm::tl::shm {
namespace {

constexpr const char* log_name = "shm";
constexpr uint32_t default_cell_size = 128;
constexpr unsigned progress_batch = 64;
/// progress() looks at the clock every this many calls...
constexpr unsigned liveness_call_mask = 255;
/// ...and checks its peers when this much time has passed.
constexpr uint64_t liveness_interval_ns = 2'000'000;
/// RMA limits: CMA has no size limit of its own (long transfers take several calls).
constexpr size_t max_rma_bytes = size_t{1} << 40;
/// Bytes of peers' heap segments an interface keeps mapped for the mapped RMA path.
constexpr size_t mapped_budget = size_t{256} << 20;
/// Reads in flight per endpoint we advertise (ours complete synchronously; the bound is for the
/// protocol layer's flow control).
constexpr size_t max_outstanding_reads = 16;
/// Bytes of the private buffer a zcopy's header and payload land in.
constexpr size_t zcopy_buffer_bytes = zcopy_max_hdr + zcopy_max_payload;

uint64_t random_nonzero_id() {
  uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof(id), 0) != sizeof(id)) {
      id = static_cast<uint64_t>(::getpid()) << 32 ^ static_cast<uint64_t>(::time(nullptr));
    }
  }
  return id;
}

static_assert(tag_header_size == wire::header_size<wire::schema::ShmTagHeader>());

uint64_t coarse_now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

/// Reads `total` bytes of process `pid` at `remote` into `local`; ok, connection_reset (the
/// process is gone) or io_error, with `*error` the errno.
status cma_pull(int32_t pid, const iovec* local, size_t local_count, const iovec* remote,
                size_t remote_count, size_t total, int* error) {
  if (total == 0) return status::ok;
  const ssize_t got = ::process_vm_readv(pid, local, local_count, remote, remote_count, 0);
  if (got == static_cast<ssize_t>(total)) return status::ok;
  *error = got < 0 ? errno : EFAULT;
  return *error == ESRCH ? status::connection_reset : status::io_error;
}

/// The sender's memory a zcopy descriptor names: at most zcopy_max_iov entries, zcopy_max_payload
/// bytes in all.
struct remote_iov {
  iovec entries[zcopy_max_iov];
  size_t count = 0;
  size_t total = 0;
};

/// Reads a descriptor's iov list into `*out`; the problem, or null.
const char* read_remote_iov(capnp::List<wire::schema::ShmRemoteIov>::Reader list,
                            remote_iov* out) {
  if (list.size() > zcopy_max_iov) return "zcopy iov count out of bounds";
  for (auto entry : list) {
    const uint64_t length = entry.getLength();
    if (length > zcopy_max_payload - out->total) return "zcopy payload exceeds max_zcopy";
    out->total += length;
    out->entries[out->count++] = {reinterpret_cast<void*>(entry.getAddress()), length};
  }
  return nullptr;
}

/// Copies the descriptor of `words` (1..zcopy_max_desc_words) words at `buffer` out of shared
/// memory, so the sender cannot change it under the checks, and hands its root, a T, to `read`,
/// which returns the problem it found or null. Returns that, or `invalid` when the words are not
/// a valid message.
template <class T, class Read>
const char* read_descriptor(const uint8_t* buffer, size_t words, const char* invalid,
                            Read&& read) {
  capnp::word copy[zcopy_max_desc_words];
  std::memcpy(copy, buffer, words * sizeof(capnp::word));
  try {
    const kj::ArrayPtr<const capnp::word> only_segment(copy, words);
    capnp::SegmentArrayMessageReader reader(kj::arrayPtr(&only_segment, 1),
                                            wire::checked_reader_options());
    return read(reader.getRoot<T>());
  } catch (const kj::Exception&) {
    return invalid;
  }
}

}  // namespace

/// The one ShmTagHeader builder of an interface (its endpoints share it: one thread).
struct tag_header_writer {
  wire::header_writer<wire::schema::ShmTagHeader> writer;
};

// -- open and close -------------------------------------------------------------------------------

shm_iface::shm_iface(const iface_params& params) : mapped_(mapped_budget) {
  shm_config config;
  std::string why;
  if ((open_status_ = shm_config::parse(params.opts, &config, &why)) != status::ok) {
    COMM_LOG(error, log_name, "%s", why.c_str());
    return;
  }
  geometry geo;
  geo.fifo_size = static_cast<uint32_t>(params.fifo_size != 0 ? params.fifo_size : config.fifo_size);
  geo.cell_size = default_cell_size;
  geo.segment_size =
      static_cast<uint32_t>(params.segment_size != 0 ? params.segment_size : config.segment_size);
  if (params.fifo_size > (1u << 16) || params.segment_size > (1u << 20) || !geo.valid()) {
    COMM_LOG(error, log_name,
             "bad parameters: fifo_size %zu (a power of two, 2..65536), segment_size %zu "
             "(a multiple of 64, 1024..1048576)",
             params.fifo_size, params.segment_size);
    open_status_ = status::invalid_param;
    return;
  }
  iface_id_ = random_nonzero_id();
  if ((open_status_ = segment::create(geo, iface_id_, &segment_, &memfd_)) != status::ok) return;
  place_segment(params.numa_nodes);
  md_ = std::make_unique<shm_md>(segment_, iface_id_);

  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wakeup_rx_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  wakeup_tx_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (epoll_fd_ < 0 || wakeup_rx_fd_ < 0 || wakeup_tx_fd_ < 0) {
    COMM_LOG(error, log_name, "epoll/socket: %s", std::strerror(errno));
    open_status_ = status::io_error;
    return;
  }
  sockaddr_un address;
  const socklen_t length = wakeup_socket_address(::getpid(), iface_id_, &address);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = nullptr;  // null: the wakeup socket; otherwise the shm_peer of a pidfd
  if (::bind(wakeup_rx_fd_, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wakeup_rx_fd_, &event) != 0) {
    COMM_LOG(error, log_name, "wakeup socket: %s", std::strerror(errno));
    open_status_ = status::io_error;
    return;
  }
  zcopy_buffer_.reset(new uint64_t[zcopy_buffer_bytes / sizeof(uint64_t)]);
  buffer_of_.resize(geo.fifo_size);
  for (uint32_t i = 0; i < geo.fifo_size; ++i) buffer_of_[i] = i;
  for (uint32_t i = 0; i < spare_buffers; ++i) spare_slots_.push_back(geo.fifo_size + i);
  publish_mask_ = std::max<uint64_t>(geo.fifo_size / 4, 1) - 1;

  attr_.caps = cap_am_short | cap_am_bcopy | cap_am_zcopy | cap_pending | cap_event_fd |
               cap_connect_to_iface | cap_peer_failure | cap_get_zcopy | cap_put_zcopy |
               cap_tag_any;
  attr_.max_short = geo.max_short();
  attr_.max_bcopy = geo.segment_size;
  attr_.max_zcopy = zcopy_max_payload;
  attr_.max_hdr = zcopy_max_hdr;
  attr_.max_iov = zcopy_max_iov;
  attr_.max_get_zcopy = max_rma_bytes;
  attr_.max_put_zcopy = max_rma_bytes;
  attr_.max_outstanding_reads = max_outstanding_reads;
  attr_.max_am_descs = max_am_descs;
  // Copies through the ring beat cross-memory reads (am_zcopy, get_zcopy) at every size measured
  // (16 KiB - 16 MiB, both states of the VM: process_vm_readv spends most of its time pinning the
  // sender's pages); memory of the shared heap, which a peer maps, is the exception (the md says
  // which). Up to the ring's capacity: no larger message goes through the ring alone.
  attr_.copies_preferred_below = size_t{geo.fifo_size} * geo.segment_size + 1;
  attr_.tag.eager = {geo.max_short() - tag_header_size, geo.segment_size, zcopy_max_payload,
                     zcopy_max_iov};
  attr_.tag.rndv = {max_rma_bytes, tag_rndv_max_hdr, 1};
  attr_.tag.recv = {max_rma_bytes, tag_recv_max_iov, tag_max_outstanding};
  rndv_generation_.assign(rndv_slots, 0);
  for (uint32_t i = rndv_slots; i-- > 0;) rndv_free_.push_back(i);
  attr_.latency_ns = 100;
  attr_.bandwidth_bytes_per_s = 10e9;
  attr_.priority = 10;
  attr_.node_local = true;
}

void shm_iface::place_segment(std::span<const unsigned> nodes) {
  placement_ = bind_to_numa_nodes(segment_.base(), segment_.geo().total_size(), nodes);
  if (placement_.st != status::ok) {
    COMM_LOG(warn, log_name, "receive segment: %s", placement_.text.c_str());
  } else if (placement_.bound) {
    COMM_LOG(debug, log_name, "receive segment %s", placement_.text.c_str());
  }
}

shm_iface::~shm_iface() {
  rndv_sources_.clear();  // our own endpoints, before the check for the user's
  if (!eps_.empty()) {
    COMM_LOG(warn, log_name, "interface destroyed with %zu endpoints still open", eps_.size());
  }
  // Tell senders we are gone. A forked child destroying its inherited copy must not.
  if (segment_.mapped() && segment_.control().owner_pid == ::getpid()) {
    if (md_) md_->close();  // peers' keys go stale before they see `closed`
    std::atomic_ref<uint32_t>(segment_.control().closed).store(1, std::memory_order_release);
  }
  for (int fd : {wakeup_tx_fd_, wakeup_rx_fd_, epoll_fd_, memfd_}) {
    if (fd >= 0) ::close(fd);
  }
}

// -- receive --------------------------------------------------------------------------------------

unsigned shm_iface::progress() {
  unsigned events = receive();
  if (!work_.empty()) [[unlikely]] events += progress_eps();
  if ((++progress_calls_ & liveness_call_mask) == 0) [[unlikely]] maybe_check_peers();
  if (!failed_.empty()) [[unlikely]] events += report_failures();
  return events;
}

unsigned shm_iface::receive() {
  unsigned delivered = 0;
  while (delivered < progress_batch) {
    cell_header* cell = segment_.cell(tail_);
    if (shared_word(cell->seq).load(std::memory_order_acquire) != tail_ + 1) break;
    deliver(tail_, cell);
    ++tail_;
    ++delivered;
    if ((tail_ & publish_mask_) == 0) publish_tail();
  }
  // Drained (or idle): let senders see every free cell.
  if (delivered < progress_batch && published_tail_ != tail_) publish_tail();
  return delivered;
}

void shm_iface::publish_tail() {
  shared_word(segment_.control().tail).store(tail_, std::memory_order_release);
  published_tail_ = tail_;
}

void shm_iface::deliver(uint64_t index, cell_header* cell) {
  // One load of the metadata: a sender changing it meanwhile cannot get past the checks.
  const cell_meta meta = cell_meta::unpack(shared_word(cell->meta).load(std::memory_order_relaxed));
  if (meta.am_id >= am_id_count) [[unlikely]] {
    if (meta.kind == cell_zcopy || meta.kind == cell_tag_zcopy) {
      acknowledge(index, cell, status::protocol_error, 0);
    }
    return malformed(index, "am id out of range");
  }
  void* data;
  switch (meta.kind) {
    case cell_inline:
      if (meta.length > segment_.geo().max_short()) [[unlikely]] {
        return malformed(index, "inline length exceeds the cell");
      }
      data = segment::cell_data(cell);
      break;
    case cell_bcopy:
      if (meta.length > segment_.geo().segment_size) [[unlikely]] {
        return malformed(index, "bcopy length exceeds the receive buffer");
      }
      data = segment_.buffer_at(buffer_of_[index & (buffer_of_.size() - 1)]);
      break;
    case cell_zcopy: {
      int32_t sender = 0;
      const status result = receive_zcopy(index, meta, &sender);
      acknowledge(index, cell, result, sender);
      return;
    }
    case cell_skip:
      return;
    default:
      // The tagged kinds: off the AM path, in the branch unknown kinds take anyway.
      if (meta.kind >= cell_tag_inline && meta.kind <= cell_tag_request) {
        return receive_tag(index, cell, meta);
      }
      return malformed(index, "unknown cell kind");
  }
  if (meta.kind == cell_inline) {
    const handler& h = handlers_[meta.am_id];
    if (h.fn == nullptr) [[unlikely]] return unhandled(meta.am_id);
    h.fn(h.arg, data, meta.length, 0);
    ++received_;
    return;
  }
  if (call_handler(meta.am_id, data, meta.length)) lend_buffer(index);
}

bool shm_iface::call_handler(am_id id, void* data, size_t length) {
  const handler& h = handlers_[id];
  if (h.fn == nullptr) [[unlikely]] {
    unhandled(id);
    return false;
  }
  ++received_;
  const unsigned flags = can_lend() ? am_flag_desc : 0;
  return h.fn(h.arg, data, length, flags) == status::in_progress && flags != 0;
}

void shm_iface::unhandled(am_id id) {
  ++unhandled_;
  COMM_LOG(debug, log_name, "no handler for am id %u, message dropped", unsigned{id});
}

void shm_iface::lend_buffer(uint64_t index) {
  uint32_t& slot = buffer_of_[index & (buffer_of_.size() - 1)];
  lent_buffers_.push_back(slot);
  slot = spare_slots_.back();  // can_lend() held: lent ones plus free ones are spare_buffers
  spare_slots_.pop_back();
  // Before the tail passes this cell, so the sender that claims it next fills the new buffer.
  shared_word(segment_.buffer_of(index)).store(slot, std::memory_order_relaxed);
}

void shm_iface::release_am_desc(void* data) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < lent_buffers_.size(); ++i) {
    if (p != segment_.buffer_at(lent_buffers_[i])) continue;
    spare_slots_.push_back(lent_buffers_[i]);
    lent_buffers_.erase(lent_buffers_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
  if (!zcopy_descs_.release(data)) {
    COMM_LOG(error, log_name, "release_am_desc: %p is not a descriptor kept from this interface",
             data);
  }
}

void shm_iface::acknowledge(uint64_t index, cell_header* cell, status result, int32_t sender) {
  const uint64_t before =
      shared_word(*segment_.ack(index)).exchange(make_ack(index, result), std::memory_order_acq_rel);
  if ((before & ack_wake) == 0 || sender <= 0) return;
  // The sender sleeps until this ack: wake it.
  const uint64_t sender_id = shared_word(*reinterpret_cast<uint64_t*>(segment::cell_data(cell)))
                                 .load(std::memory_order_relaxed);
  sockaddr_un address;
  const socklen_t length = wakeup_socket_address(sender, sender_id, &address);
  const char byte = 0;
  (void)::sendto(wakeup_tx_fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&address), length);
}

status shm_iface::receive_zcopy(uint64_t index, cell_meta meta, int32_t* sender_pid) {
  const size_t desc_bytes = size_t{meta.desc_words} * sizeof(capnp::word);
  if (meta.desc_words == 0 || meta.desc_words > zcopy_max_desc_words ||
      desc_bytes > meta.length || meta.length > segment_.geo().segment_size) {
    malformed(index, "zcopy descriptor size out of bounds");
    return status::protocol_error;
  }
  const uint8_t* buffer = segment_.buffer_at(buffer_of_[index & (buffer_of_.size() - 1)]);
  const size_t header_length = meta.length - desc_bytes;
  remote_iov remote;
  int32_t sender = 0;
  const char* problem = read_descriptor<wire::schema::ShmZcopyDescriptor>(
      buffer, meta.desc_words, "zcopy descriptor is not a valid message", [&](auto descriptor) {
        sender = descriptor.getSenderPid();
        if (descriptor.getHeaderLength() != header_length || header_length > zcopy_max_hdr) {
          return "zcopy header length mismatch";
        }
        if (descriptor.getAmId() != meta.am_id || descriptor.getCompletionSeq() != index + 1 ||
            sender <= 0) {
          return "zcopy descriptor does not match its cell";
        }
        return read_remote_iov(descriptor.getIov(), &remote);
      });
  if (problem != nullptr) {
    malformed(index, problem);
    return status::protocol_error;
  }
  *sender_pid = sender;

  auto* target = reinterpret_cast<uint8_t*>(zcopy_buffer_.get());
  std::memcpy(target, buffer + desc_bytes, header_length);
  const iovec local{target + header_length, remote.total};
  int error = 0;
  const status result =
      cma_pull(sender, &local, 1, remote.entries, remote.count, remote.total, &error);
  if (result != status::ok) {
    ++zcopy_errors_;
    COMM_LOG(warn, log_name, "zcopy from pid %d: %zu bytes: %s", sender, remote.total,
             std::strerror(error));
    return result;
  }
  if (call_handler(meta.am_id, target, header_length + remote.total)) lend_zcopy_buffer();
  return status::ok;
}

void shm_iface::lend_zcopy_buffer() {
  desc_pool::block fresh = zcopy_descs_.replacement(zcopy_buffer_bytes);
  zcopy_descs_.lend(std::move(zcopy_buffer_), zcopy_buffer_bytes);
  zcopy_buffer_ = std::move(fresh);
}

void shm_iface::malformed(uint64_t index, const char* why) {
  ++malformed_;
  COMM_LOG(error, log_name, "malformed cell at position %llu skipped: %s",
           static_cast<unsigned long long>(index), why);
}

// -- tag matching: receive ------------------------------------------------------------------------

namespace {

/// Reads the ShmTagHeader at the start of `cell`'s data, copied out of shared memory first.
bool read_tag_header(cell_header* cell, tag_t* tag, uint64_t* imm) {
  uint64_t words[tag_header_size / sizeof(uint64_t)];
  std::memcpy(words, segment::cell_data(cell), tag_header_size);
  const auto header = wire::read_header<wire::schema::ShmTagHeader>(words, tag_header_size);
  if (!header) return false;
  *tag = header->getTag();
  *imm = header->getImm();
  return true;
}

}  // namespace

void shm_iface::receive_tag(uint64_t index, cell_header* cell, cell_meta meta) {
  switch (meta.kind) {
    case cell_tag_inline:
      return receive_tag_inline(index, cell, meta);
    case cell_tag_bcopy:
    case cell_tag_request:
      return receive_tag_buffered(index, cell, meta);
    case cell_tag_zcopy: {
      int32_t sender = 0;
      const status result = receive_tag_zcopy(index, meta, &sender);
      return acknowledge(index, cell, result, sender);
    }
    case cell_tag_rndv:
      return receive_tag_rndv(index, meta);
    default:
      return malformed(index, "unknown cell kind");
  }
}

void shm_iface::receive_tag_inline(uint64_t index, cell_header* cell, cell_meta meta) {
  tag_t tag = 0;
  uint64_t imm = 0;
  if (meta.length < tag_header_size || meta.length > segment_.geo().max_short()) {
    return malformed(index, "tagged inline length out of bounds");
  }
  if (!read_tag_header(cell, &tag, &imm)) return malformed(index, "bad tag header");
  uint8_t* data = segment::cell_data(cell) + tag_header_size;
  const size_t length = meta.length - tag_header_size;
  tag_match match;
  if (tags_.take(tag, &match)) return tags_.deliver(match, tag, imm, data, length);
  void* context = nullptr;
  tags_.unexpected_eager(data, length, tag_flag_first, tag, imm, &context);  // lives in the cell
}

void shm_iface::receive_tag_buffered(uint64_t index, cell_header* cell, cell_meta meta) {
  tag_t tag = 0;
  uint64_t imm = 0;
  const bool request = meta.kind == cell_tag_request;
  const size_t limit = request ? tag_rndv_max_hdr : segment_.geo().segment_size;
  if (meta.length > limit) return malformed(index, "tagged length exceeds the receive buffer");
  if (!read_tag_header(cell, &tag, &imm)) return malformed(index, "bad tag header");
  uint8_t* data = segment_.buffer_at(buffer_of_[index & (buffer_of_.size() - 1)]);
  tag_match match;
  if (request) {
    if (tags_.take(tag, &match)) return tags_.deliver_request(match, tag, data, meta.length);
    return tags_.unexpected_rndv(tag, data, meta.length, 0, 0, nullptr, 0);
  }
  if (tags_.take(tag, &match)) return tags_.deliver(match, tag, imm, data, meta.length);
  const unsigned flags = tag_flag_first | (can_lend() ? am_flag_desc : 0);
  void* context = nullptr;
  const status kept = tags_.unexpected_eager(data, meta.length, flags, tag, imm, &context);
  if (kept == status::in_progress && (flags & am_flag_desc) != 0) lend_buffer(index);
}

status shm_iface::receive_tag_zcopy(uint64_t index, cell_meta meta, int32_t* sender_pid) {
  const size_t desc_bytes = size_t{meta.desc_words} * sizeof(capnp::word);
  if (meta.desc_words == 0 || meta.desc_words > zcopy_max_desc_words || desc_bytes != meta.length) {
    malformed(index, "tagged zcopy descriptor size out of bounds");
    return status::protocol_error;
  }
  remote_iov remote;
  int32_t sender = 0;
  tag_t tag = 0;
  uint64_t imm = 0;
  const char* problem = read_descriptor<wire::schema::ShmTagZcopyDescriptor>(
      segment_.buffer_at(buffer_of_[index & (buffer_of_.size() - 1)]), meta.desc_words,
      "tagged zcopy descriptor is not a valid message", [&](auto descriptor) {
        sender = descriptor.getSenderPid();
        tag = descriptor.getTag();
        imm = descriptor.getImm();
        if (descriptor.getCompletionSeq() != index + 1 || sender <= 0) {
          return "tagged zcopy descriptor does not match its cell";
        }
        return read_remote_iov(descriptor.getIov(), &remote);
      });
  if (problem != nullptr) {
    malformed(index, problem);
    return status::protocol_error;
  }
  *sender_pid = sender;
  const size_t total = remote.total;

  tag_match match;
  const bool matched = tags_.peek(tag, &match);
  // Into the posted receive (what fits), or whole into the zcopy buffer.
  iovec local[tag_recv_max_iov];
  size_t local_count = 1;
  size_t pulled = total;
  if (matched) {
    iov into[tag_recv_max_iov];
    pulled = std::min(total, match.capacity);
    local_count = match.clipped(pulled, into);
    for (size_t i = 0; i < local_count; ++i) {
      local[i] = {const_cast<void*>(into[i].buffer), into[i].length};
    }
  } else {
    local[0] = {zcopy_buffer_.get(), total};
  }
  int error = 0;
  const status result =
      cma_pull(sender, local, local_count, remote.entries, remote.count, pulled, &error);
  if (result != status::ok) {
    // Nothing is delivered: a matched receive stays posted, the sender's operation fails.
    ++zcopy_errors_;
    COMM_LOG(warn, log_name, "tagged zcopy from pid %d: %zu bytes: %s", sender, pulled,
             std::strerror(error));
    return result;
  }
  if (matched) {
    tags_.consume(match);
    tags_.finish(match, tag, imm, total, status::ok);
  } else {
    unexpected_fragments(total, tag, imm);
  }
  return status::ok;
}

void shm_iface::unexpected_fragments(size_t total, tag_t tag, uint64_t imm) {
  const size_t fragment = segment_.geo().segment_size;
  auto* data = reinterpret_cast<uint8_t*>(zcopy_buffer_.get());
  if (total <= fragment) {
    // One fragment: the handler may keep the whole buffer, as for am_zcopy.
    const unsigned flags = tag_flag_first | (can_lend() ? am_flag_desc : 0);
    void* context = nullptr;
    if (tags_.unexpected_eager(data, total, flags, tag, imm, &context) == status::in_progress &&
        (flags & am_flag_desc) != 0) {
      lend_zcopy_buffer();
    }
    return;
  }
  // Fragments of a receive buffer's size, in order; they cannot be kept (one buffer holds all).
  void* context = nullptr;
  for (size_t offset = 0; offset < total; offset += fragment) {
    const size_t n = std::min(fragment, total - offset);
    const unsigned flags =
        (offset == 0 ? tag_flag_first : 0) | (offset + n < total ? tag_flag_more : 0);
    tags_.unexpected_eager(data + offset, n, flags, tag, imm, &context);
  }
}

void shm_iface::receive_tag_rndv(uint64_t index, cell_meta meta) {
  const size_t desc_bytes = size_t{meta.desc_words} * sizeof(capnp::word);
  if (meta.desc_words == 0 || meta.desc_words > zcopy_max_desc_words ||
      desc_bytes > meta.length || meta.length > segment_.geo().segment_size ||
      meta.length - desc_bytes > tag_rndv_max_hdr) {
    return malformed(index, "rendezvous descriptor size out of bounds");
  }
  const uint8_t* buffer = segment_.buffer_at(buffer_of_[index & (buffer_of_.size() - 1)]);
  const size_t header_length = meta.length - desc_bytes;
  uint8_t header[tag_rndv_max_hdr];
  std::memcpy(header, buffer + desc_bytes, header_length);
  uint8_t rkey[tag_rndv_max_rkey];
  size_t rkey_length = 0;
  iface_addr sender;
  uint32_t slot = 0;
  uint64_t generation = 0;
  tag_t tag = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  const char* problem = read_descriptor<wire::schema::ShmTagRndvDescriptor>(
      buffer, meta.desc_words, "rendezvous descriptor is not a valid message",
      [&](auto d) -> const char* {
        sender.pid = d.getSenderPid();
        sender.fd = d.getSenderFd();
        sender.iface_id = d.getSenderIfaceId();
        sender.fifo_size = d.getSenderFifoSize();
        sender.cell_size = d.getSenderCellSize();
        sender.segment_size = d.getSenderSegSize();
        slot = d.getOpSlot();
        generation = d.getOpGeneration();
        tag = d.getTag();
        address = d.getAddress();
        length = d.getLength();
        const auto key = d.getRkey();
        if (d.getHeaderLength() != header_length) return "rendezvous header length mismatch";
        if (slot >= rndv_slots || generation == 0 || generation > max_rndv_generation) {
          return "rendezvous operation out of bounds";
        }
        if (key.size() > tag_rndv_max_rkey || (key.size() == 0) != (length == 0)) {
          return "rendezvous key size out of bounds";
        }
        if (!iface_addr::unpack(sender.pack())) return "rendezvous sender address invalid";
        rkey_length = key.size();
        if (rkey_length != 0) std::memcpy(rkey, key.begin(), rkey_length);  // empty: no pointer
        return nullptr;
      });
  if (problem != nullptr) return malformed(index, problem);
  shm_ep* source = rndv_source(sender);
  if (source == nullptr) {
    ++rndv_unreachable_;
    COMM_LOG(warn, log_name, "rendezvous from pid %d: its sender cannot be reached, dropped",
             static_cast<int>(sender.pid));
    return;
  }
  take_rndv(*source, slot, generation, tag, header, header_length, address, length, rkey,
            rkey_length);
}

void shm_iface::take_rndv(shm_ep& source, uint32_t slot, uint64_t generation, tag_t tag,
                          const uint8_t* header, size_t header_length, uint64_t address,
                          uint64_t length, const uint8_t* rkey, size_t rkey_length) {
  auto word = shared_word(source.peer().seg.rndv_op(slot));
  uint64_t seen = word.load(std::memory_order_acquire);
  // Claim it: posted -> taken (a canceled or stale one is skipped).
  do {
    if (rndv_op_word::generation(seen) != generation ||
        rndv_op_word::state(seen) != rndv_op_word::posted) {
      ++rndv_skipped_;
      return;
    }
  } while (!word.compare_exchange_weak(seen, rndv_op_word::with_state(seen, rndv_op_word::taken),
                                       std::memory_order_acq_rel, std::memory_order_acquire));
  tag_match match;
  const bool matched = tags_.peek(tag, &match);
  status result = status::ok;
  if (matched && length != 0 && match.capacity != 0) {
    iov into[tag_recv_max_iov];
    const size_t used = match.clipped(std::min<uint64_t>(length, match.capacity), into);
    remote_key key;
    result = md_->rkey_unpack(rkey, rkey_length, &key);
    if (result == status::ok) {
      result = source.get_zcopy(into, used, address, key, nullptr);
      md_->rkey_release(&key);
    }
  }
  // End it: taken -> done (with the fetch's outcome) or unexpected, unless the sender canceled.
  const uint64_t state = matched ? rndv_op_word::done : rndv_op_word::unexpected;
  uint64_t taken = word.load(std::memory_order_acquire);
  while (rndv_op_word::generation(taken) == generation &&
         rndv_op_word::state(taken) == rndv_op_word::taken) {
    if (word.compare_exchange_weak(taken, rndv_op_word::with_state(taken, state, result),
                                   std::memory_order_acq_rel, std::memory_order_acquire)) {
      if ((taken & rndv_op_word::wake) != 0) source.wake_peer();
      break;
    }
  }
  if (!matched) {
    return tags_.unexpected_rndv(tag, header, header_length, address, length, rkey, rkey_length);
  }
  if (result != status::ok) {
    // Nothing is delivered: the receive stays posted, the sender's operation fails.
    ++rndv_fetch_errors_;
    COMM_LOG(warn, log_name, "rendezvous from pid %d: fetching %llu bytes: %s",
             static_cast<int>(source.peer_pid()), static_cast<unsigned long long>(length),
             to_string(result));
    return;
  }
  tags_.consume(match);
  tags_.finish(match, tag, 0, length, status::ok);
}

shm_ep* shm_iface::rndv_source(const iface_addr& address) {
  const auto key = std::make_pair(address.pid, address.iface_id);
  const auto found = rndv_sources_.find(key);
  if (found != rndv_sources_.end()) {
    if (!found->second->failed() && !found->second->failure_noticed) return found->second.get();
    return nullptr;
  }
  if (rndv_sources_.size() >= max_rndv_sources) return nullptr;
  shm_peer* peer = nullptr;
  if (find_or_attach(address, &peer) != status::ok) return nullptr;
  auto ep = std::make_unique<shm_ep>(*this, *peer);
  ep->internal = true;
  eps_.push_back(ep.get());
  ++peer->endpoints;
  shm_ep* source = ep.get();
  rndv_sources_.emplace(key, std::move(ep));
  return source;
}

// -- tag matching: the interface's side -----------------------------------------------------------

status shm_iface::set_tag_handlers(tag_unexp_eager_fn eager, void* eager_arg,
                                   tag_unexp_rndv_fn rndv, void* rndv_arg) {
  tags_.set_handlers(eager, eager_arg, rndv, rndv_arg);
  return status::ok;
}

status shm_iface::tag_recv_zcopy(tag_t tag, tag_t tag_mask, const iov* entries, size_t count,
                                 tag_context* ctx) {
  return tags_.post(tag, tag_mask, entries, count, ctx);
}

status shm_iface::tag_recv_cancel(tag_context* ctx, bool force) {
  return tags_.cancel(ctx, force);
}

void shm_iface::write_tag_header(void* dest, tag_t tag, uint64_t imm) {
  if (!tag_header_) tag_header_ = std::make_unique<tag_header_writer>();
  auto& fields = tag_header_->writer.fields();
  fields.setTag(tag);
  fields.setImm(imm);
  tag_header_->writer.copy_to(dest);
}

bool shm_iface::rndv_alloc(uint32_t* slot, uint64_t* generation) {
  if (rndv_free_.empty()) return false;
  *slot = rndv_free_.back();
  rndv_free_.pop_back();
  uint64_t& last = rndv_generation_[*slot];
  last = last >= max_rndv_generation ? 1 : last + 1;
  *generation = last;
  return true;
}

// -- endpoints: work, liveness, failure -----------------------------------------------------------

void shm_iface::schedule(shm_ep* ep) {
  if (ep->scheduled) return;
  ep->scheduled = true;
  work_.push_back(ep);
}

void shm_iface::forget(shm_ep* ep) {
  eps_.erase(std::remove(eps_.begin(), eps_.end(), ep), eps_.end());
  failed_.erase(std::remove(failed_.begin(), failed_.end(), ep), failed_.end());
  for (shm_ep*& entry : work_) {
    if (entry == ep) entry = nullptr;  // progress_eps may be iterating: compacted there
  }
  release_peer(ep->peer());
}

void shm_iface::release_peer(shm_peer& peer) {
  if (--peer.endpoints != 0) return;
  if (!peer.failed) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer.pidfd, nullptr);
  mapped_.forget_peer(peer.address.pid);  // an endpoint to that process maps again on use
  peers_.erase({peer.address.pid, peer.address.iface_id});  // unmaps, closes the pidfd
}

unsigned shm_iface::progress_eps() {
  unsigned events = 0;
  // Completions and pending callbacks may schedule endpoints (appending) or destroy other
  // endpoints (nulling their entries), so index and re-read the size.
  for (size_t i = 0; i < work_.size(); ++i) {
    if (shm_ep* ep = work_[i]) events += ep->progress();
  }
  size_t kept = 0;
  for (shm_ep* ep : work_) {
    if (ep == nullptr) continue;
    if (ep->has_work() && !ep->failed()) {
      work_[kept++] = ep;
    } else {
      ep->scheduled = false;
    }
  }
  work_.resize(kept);
  return events;
}

void shm_iface::maybe_check_peers() {
  if (eps_.empty()) return;
  const uint64_t now = coarse_now_ns();
  if (now - last_check_ns_ < liveness_interval_ns) return;
  last_check_ns_ = now;
  check_peers();
}

void shm_iface::check_peers() {
  epoll_event events[16];
  const int n = ::epoll_wait(epoll_fd_, events, 16, 0);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.ptr == nullptr) {
      drain_wakeups();
    } else {
      notice_peer_failure(*static_cast<shm_peer*>(events[i].data.ptr));  // the process exited
    }
  }
  for (auto& [key, peer] : peers_) {
    if (!peer->failed && peer->closed()) notice_peer_failure(*peer);
  }
}

void shm_iface::drain_wakeups() {
  char bytes[64];
  while (::recv(wakeup_rx_fd_, bytes, sizeof(bytes), MSG_DONTWAIT) >= 0) {
  }
}

void shm_iface::peer_failed(shm_ep* ep) { notice_peer_failure(ep->peer()); }

void shm_iface::notice_peer_failure(shm_peer& peer) {
  if (peer.failed) return;
  peer.failed = true;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer.pidfd, nullptr);  // its pidfd stays readable
  mapped_.forget_peer(peer.address.pid);  // do not keep a dead peer's memory alive
  ++peers_failed_;
  COMM_LOG(info, log_name, "peer pid %d is gone", static_cast<int>(peer.address.pid));
  for (shm_ep* ep : eps_) {
    if (&ep->peer() != &peer || ep->failure_noticed) continue;
    ep->failure_noticed = true;
    failed_.push_back(ep);
  }
}

unsigned shm_iface::report_failures() {
  unsigned events = 0;
  while (!failed_.empty()) {
    shm_ep* ep = failed_.front();
    failed_.erase(failed_.begin());
    ep->fail(status::connection_reset);
    ++events;
    if (ep->internal) {
      // Ours (a rendezvous source): nobody else is told; it goes, and the peer with it.
      rndv_sources_.erase({ep->peer_pid(), ep->peer().address.iface_id});
      continue;
    }
    if (error_fn_ != nullptr) {
      error_fn_(error_arg_, ep, status::connection_reset);  // may destroy ep: not touched after
    } else {
      COMM_LOG(warn, log_name, "peer pid %d failed and no error handler is set",
               static_cast<int>(ep->peer_pid()));
    }
  }
  return events;
}

// -- blocking progress ----------------------------------------------------------------------------

status shm_iface::event_arm() {
  if (!failed_.empty()) return status::busy;
  for (shm_ep* ep : work_) {
    if (ep != nullptr && ep->arm() != status::ok) return status::busy;
  }
  check_peers();
  if (!failed_.empty()) return status::busy;
  auto head = shared_word(segment_.control().head);
  const uint64_t before = head.fetch_or(head_armed, std::memory_order_acq_rel);
  if ((before & ~head_armed) != tail_) {
    head.fetch_and(~head_armed, std::memory_order_relaxed);
    return status::busy;
  }
  return status::ok;
}

// -- addresses and endpoints ----------------------------------------------------------------------

std::vector<uint8_t> shm_iface::device_address() const { return pack_device_address(); }

iface_addr shm_iface::own_address() const {
  iface_addr address;
  address.pid = static_cast<int32_t>(::getpid());
  address.fd = memfd_;
  address.fifo_size = segment_.geo().fifo_size;
  address.cell_size = segment_.geo().cell_size;
  address.segment_size = segment_.geo().segment_size;
  address.iface_id = iface_id_;
  return address;
}

std::vector<uint8_t> shm_iface::iface_address() const { return own_address().pack(); }

bool shm_iface::is_reachable(const std::vector<uint8_t>& device_address,
                             const std::vector<uint8_t>& iface_address) const {
  return same_device(device_address) && iface_addr::unpack(iface_address).has_value();
}

status shm_iface::create_ep(const std::vector<uint8_t>& device_address,
                            const std::vector<uint8_t>& iface_address_bytes,
                            std::unique_ptr<ep>& out) {
  const std::optional<iface_addr> address = iface_addr::unpack(iface_address_bytes);
  if (!address || device_address.size() != sizeof(host_identity)) return status::invalid_addr;
  if (!same_device(device_address)) return status::unreachable;

  shm_peer* peer = nullptr;
  if (const status st = find_or_attach(*address, &peer); st != status::ok) return st;
  auto ep = std::make_unique<shm_ep>(*this, *peer);
  eps_.push_back(ep.get());
  ++peer->endpoints;
  out = std::move(ep);
  return status::ok;
}

status shm_iface::find_or_attach(const iface_addr& address, shm_peer** out) {
  const auto found = peers_.find({address.pid, address.iface_id});
  if (found == peers_.end()) return attach_peer(address, out);
  shm_peer& peer = *found->second;
  if (std::memcmp(&peer.address, &address, sizeof(address)) != 0) {
    // The segment of that pid and interface id said otherwise when it was attached.
    COMM_LOG(warn, log_name, "address of pid %d names interface %016llx with another segment",
             static_cast<int>(address.pid), static_cast<unsigned long long>(address.iface_id));
    ++peers_refused_;
    return status::invalid_addr;
  }
  if (peer.failed) return status::unreachable;
  *out = &peer;
  return status::ok;
}

status shm_iface::attach_peer(const iface_addr& address, shm_peer** out) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, address.pid, 0));
  if (pidfd < 0) {
    COMM_LOG(info, log_name, "pidfd_open(%d): %s", static_cast<int>(address.pid),
             std::strerror(errno));
    return status::unreachable;
  }
  segment seg;
  if (const status st = segment::attach(pidfd, address, &seg); st != status::ok) {
    ::close(pidfd);
    if (st == status::unreachable) ++peers_refused_;
    return st;
  }
  auto peer = std::make_unique<shm_peer>(std::move(seg), address, pidfd);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = peer.get();
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &event) != 0) {
    COMM_LOG(warn, log_name, "epoll_ctl(pidfd): %s; peer exit will go unnoticed",
             std::strerror(errno));
  }
  *out = peer.get();
  peers_.emplace(std::make_pair(address.pid, address.iface_id), std::move(peer));
  return status::ok;
}

std::string shm_iface::info() const {
  const geometry& geo = segment_.geo();
  size_t failed = 0;
  for (const shm_ep* ep : eps_) failed += ep->failed() ? 1 : 0;
  std::string text;
  text += "shm: fifo size " + std::to_string(geo.fifo_size) + " cells\n";
  text += "shm: cell size " + std::to_string(geo.cell_size) + " bytes\n";
  text += "shm: receive buffers " + std::to_string(geo.segment_size) + " bytes per cell\n";
  text += "shm: segment " + std::to_string(geo.total_size()) + " bytes (memfd), " +
          placement_.text + "\n";
  text += "shm: max_short " + std::to_string(attr_.max_short) + "\n";
  text += "shm: max_bcopy " + std::to_string(attr_.max_bcopy) + "\n";
  text += "shm: max_zcopy " + std::to_string(attr_.max_zcopy) + " (max_hdr " +
          std::to_string(attr_.max_hdr) + ", max_iov " + std::to_string(attr_.max_iov) + ")\n";
  text += "shm: endpoints " + std::to_string(eps_.size()) + " (" + std::to_string(failed) +
          " failed) to " + std::to_string(peers_.size()) + " peer interfaces (" +
          std::to_string(peers_failed_) + " peer failures seen, " +
          std::to_string(peers_refused_) + " peer segments refused)\n";
  text += "shm: received " + std::to_string(received_) + " messages, " +
          std::to_string(lent_buffers_.size() + zcopy_descs_.lent()) + " of " +
          std::to_string(max_am_descs) + " kept by handlers\n";
  text += "shm: malformed cells " + std::to_string(malformed_) + "\n";
  text += "shm: dropped without handler " + std::to_string(unhandled_) + "\n";
  text += "shm: zcopy read errors " + std::to_string(zcopy_errors_) + "\n";
  text += tags_.info("shm");
  text += "shm: tag: " + std::to_string(rndv_skipped_) + " rendezvous canceled before delivery, " +
          std::to_string(rndv_unreachable_) + " from unreachable senders, " +
          std::to_string(rndv_fetch_errors_) + " failed fetches, " +
          std::to_string(rndv_sources_.size()) + " senders mapped, " +
          std::to_string(rndv_slots - rndv_free_.size()) + " of " + std::to_string(rndv_slots) +
          " own rendezvous outstanding\n";
  if (md_) text += md_->info();
  text += "shm: rma: " + rma_.text() + "\n";
  text += "shm: rma mapped: " + std::to_string(mapped_gets_) + " gets, " +
          std::to_string(mapped_puts_) + " puts; " + std::to_string(mapped_.count()) +
          " peer segments mapped (" + std::to_string(mapped_.bytes()) + " bytes), " +
          std::to_string(mapped_.maps()) + " maps, " + std::to_string(mapped_.failures()) +
          " map failures\n";
  return text;
}

}  // namespace comm::tl::shm
