#include "shm/shm_segment.hpp"

#include "base/host_identity.hpp"
#include "shm/shm_peer_fd.hpp"

#include <comm/log.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace comm::tl::shm {
namespace {

constexpr const char* log_name = "shm";
constexpr uint32_t min_fifo_size = 2;
constexpr uint32_t max_fifo_size = 1u << 16;
constexpr uint32_t min_cell_size = 64;
constexpr uint32_t max_cell_size = 4096;
constexpr uint32_t min_segment_size = 1024;
constexpr uint32_t max_segment_size = 1u << 20;
constexpr size_t page_size = 4096;

}  // namespace

bool geometry::valid() const {
  return std::has_single_bit(fifo_size) && fifo_size >= min_fifo_size &&
         fifo_size <= max_fifo_size && std::has_single_bit(cell_size) &&
         cell_size >= min_cell_size && cell_size <= max_cell_size &&
         segment_size >= min_segment_size && segment_size <= max_segment_size &&
         segment_size % cache_line == 0;
}

size_t geometry::buffers_offset() const {
  const size_t end_of_table = buffer_of_offset() + size_t{fifo_size} * sizeof(uint64_t);
  return (end_of_table + page_size - 1) / page_size * page_size;
}

// -- addresses ------------------------------------------------------------------------------------

std::vector<uint8_t> iface_addr::pack() const {
  const auto* p = reinterpret_cast<const uint8_t*>(this);
  return std::vector<uint8_t>(p, p + sizeof(*this));
}

std::optional<iface_addr> iface_addr::unpack(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != sizeof(iface_addr)) return std::nullopt;
  iface_addr address;
  std::memcpy(&address, bytes.data(), sizeof(address));
  if (address.version != segment_version || address.pid <= 0 || address.fd < 0 ||
      address.iface_id == 0 || !address.geo().valid()) {
    return std::nullopt;
  }
  return address;
}

std::vector<uint8_t> pack_device_address() {
  const host_identity& id = local_host_identity();
  const auto* p = reinterpret_cast<const uint8_t*>(&id);
  return std::vector<uint8_t>(p, p + sizeof(id));
}

bool same_device(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != sizeof(host_identity)) return false;
  host_identity theirs;
  std::memcpy(&theirs, bytes.data(), sizeof(theirs));
  return theirs == local_host_identity();
}

socklen_t wakeup_socket_address(int32_t pid, uint64_t iface_id, sockaddr_un* out) {
  std::memset(out, 0, sizeof(*out));
  out->sun_family = AF_UNIX;
  // Abstract namespace: sun_path[0] == 0, nothing on the file system, gone with the socket.
  const int n = std::snprintf(out->sun_path + 1, sizeof(out->sun_path) - 1, "comm-shm-%d-%016llx",
                              static_cast<int>(pid), static_cast<unsigned long long>(iface_id));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// -- segment --------------------------------------------------------------------------------------

segment::~segment() { unmap(); }

segment::segment(segment&& other) noexcept { *this = std::move(other); }

segment& segment::operator=(segment&& other) noexcept {
  if (this != &other) {
    unmap();
    static_cast<segment_view&>(*this) = other;
    other.base_ = nullptr;
  }
  return *this;
}

void segment_view::adopt(uint8_t* base, const geometry& geo) {
  base_ = base;
  geo_ = geo;
  cells_ = base + geo.cells_offset();
  acks_ = reinterpret_cast<uint64_t*>(base + geo.acks_offset());
  buffer_of_ = reinterpret_cast<uint64_t*>(base + geo.buffer_of_offset());
  buffers_ = base + geo.buffers_offset();
  regions_ = reinterpret_cast<region_entry*>(base + geo.regions_offset());
  rndv_ops_ = reinterpret_cast<uint64_t*>(base + geo.rndv_offset());
  mask_ = geo.fifo_size - 1;
  cell_shift_ = static_cast<unsigned>(std::countr_zero(geo.cell_size));
}

void segment::unmap() {
  if (base_ != nullptr) ::munmap(base_, geo_.total_size());
  base_ = nullptr;
}

namespace {

/// Maps `fd`, already checked to be `geo.total_size()` bytes.
status map_segment(int fd, const geometry& geo, int extra_flags, uint8_t** base) {
  void* p = ::mmap(nullptr, geo.total_size(), PROT_READ | PROT_WRITE, MAP_SHARED | extra_flags,
                   fd, 0);
  if (p == MAP_FAILED) {
    COMM_LOG(error, log_name, "mmap of %zu bytes: %s", geo.total_size(), std::strerror(errno));
    return status::no_memory;
  }
  *base = static_cast<uint8_t*>(p);
  return status::ok;
}

}  // namespace

status segment::create(const geometry& geo, uint64_t iface_id, segment* out, int* fd_out) {
  if (!geo.valid()) return status::invalid_param;
  const int fd = ::memfd_create("comm-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    COMM_LOG(error, log_name, "memfd_create: %s", std::strerror(errno));
    return status::shmem_segment;
  }
  // Sealed against resizing, so a peer's mapping can never run past the end of the file.
  if (::ftruncate(fd, static_cast<off_t>(geo.total_size())) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    COMM_LOG(error, log_name, "sizing the segment: %s", std::strerror(errno));
    ::close(fd);
    return status::shmem_segment;
  }
  uint8_t* base = nullptr;
  // Populated up front: first messages do not take page faults.
  if (const status st = map_segment(fd, geo, MAP_POPULATE, &base); st != status::ok) {
    ::close(fd);
    return st;
  }
  segment seg;
  seg.adopt(base, geo);

  control_block& ctl = seg.control();  // the memfd starts zeroed: head, tail, seqs, acks are 0
  ctl.magic = segment_magic;
  ctl.iface_id = iface_id;
  ctl.version = segment_version;
  ctl.fifo_size = geo.fifo_size;
  ctl.cell_size = geo.cell_size;
  ctl.segment_size = geo.segment_size;
  ctl.owner_pid = static_cast<int32_t>(::getpid());
  ctl.region_count = region_table_size;
  for (uint64_t i = 0; i < geo.fifo_size; ++i) seg.buffer_of(i) = i;
  *out = std::move(seg);
  *fd_out = fd;
  return status::ok;
}

namespace {

/// Why the control block `ctl` of a mapped segment does not belong to the interface at `address`;
/// null when it does.
const char* control_mismatch(const control_block& ctl, const iface_addr& address) {
  if (ctl.magic != segment_magic || ctl.version != segment_version) return "no segment header";
  if (ctl.iface_id != address.iface_id || ctl.owner_pid != address.pid) {
    return "the segment of another interface (a stale address, or a reused pid)";
  }
  if (ctl.fifo_size != address.fifo_size || ctl.cell_size != address.cell_size ||
      ctl.segment_size != address.segment_size || ctl.region_count != region_table_size) {
    return "a segment of another geometry";
  }
  return nullptr;
}

}  // namespace

status segment::attach(int pidfd, const iface_addr& address, segment* out) {
  const geometry geo = address.geo();
  if (!geo.valid()) return status::invalid_addr;
  const taken_fd taken =
      take_peer_memfd(pidfd, address.pid, memfd_expectation{address.fd, geo.total_size()});
  const char* refusal = taken.refusal;
  segment seg;
  if (taken.fd >= 0) {
    uint8_t* base = nullptr;
    // One mapping per peer, populated now (the pages are the owner's already): the first messages
    // to a peer take no page faults.
    const status mapped = map_segment(taken.fd, geo, MAP_POPULATE, &base);
    ::close(taken.fd);
    if (mapped != status::ok) return mapped;
    seg.adopt(base, geo);
    refusal = control_mismatch(seg.control(), address);
  }
  if (refusal != nullptr) {
    COMM_LOG(warn, log_name, "refusing descriptor %d of pid %d as a peer segment: %s%s%s",
             static_cast<int>(address.fd), static_cast<int>(address.pid), refusal,
             taken.error != 0 ? ": " : "", taken.error != 0 ? std::strerror(taken.error) : "");
    return status::unreachable;  // seg unmaps itself
  }
  *out = std::move(seg);
  return status::ok;
}

}  // namespace comm::tl::shm
