// Fuzzes what an shm interface reads from a peer's tagged cells (transports/shm/shm_iface.cpp,
// receive_tag and below): the ShmTagHeader in a cell, the ShmTagZcopyDescriptor and
// ShmTagRndvDescriptor in a receive buffer, and the lengths in the cell's metadata. The input's
// cells are written straight into a receiver's FIFO, as a hostile peer mapping the segment can.
//
// Input: records, each
//   kind:u8  desc_words:u16  length:u32  cell_bytes:u8  buffer_bytes:u16, then the cell's bytes
//   (at most the cell's inline room) and the buffer's bytes (at most a receive buffer).
// A record of kind 0xf0 is a rendezvous descriptor the harness builds with the real sender
// interface's address (which changes every run): slot:u16 generation:u8 tag:u8 length:u32
// header_length:u16 and the key's bytes follow as buffer bytes.
//
// What must hold for every input: nothing crashes; every completed receive reports ok,
// message_truncated or an error and a length within the bounds of the message kinds; the
// unexpected handler gets FIRST on the first fragment only, MORE until the last, its context back
// on every fragment after the first, and no fragment longer than a receive buffer; the FIFO drains;
// and a message from a well-behaved endpoint arrives afterwards.
#include "check.hpp"
#include "seeds.hpp"

#include <comm/log.hpp>
#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include "shm/shm.capnp.h"
#include "shm/shm_segment.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace {

using comm::fuzz::require;
namespace tl = comm::tl;
namespace shm = comm::tl::shm;
namespace schema = comm::wire::schema;
using comm::status;

constexpr size_t fifo_size = 64;
constexpr size_t segment_size = 2048;
constexpr uint8_t rndv_to_sender = 0xf0;
constexpr size_t record_header = 10;

tl::component& shm_component() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == "shm") return *c;
  }
  comm::fuzz::fail("no shm component");
}

std::unique_ptr<tl::iface> open_iface() {
  tl::iface_params params;
  params.fifo_size = fifo_size;
  params.segment_size = segment_size;
  std::unique_ptr<tl::iface> iface;
  require(shm_component().open(params, iface) == status::ok, "cannot open an shm interface");
  return iface;
}

/// A posted receive that checks what it is told.
struct checked_recv : tl::tag_context {
  std::vector<uint8_t> buffer;
  tl::iov entry;
  bool done = false;
  explicit checked_recv(size_t size) : buffer(size) {
    entry = {buffer.data(), buffer.size()};
    completed = [](tl::tag_context* self, tl::tag_t, uint64_t, size_t length, status result) {
      auto* r = static_cast<checked_recv*>(self);
      require(!r->done, "a receive completed twice");
      r->done = true;
      require(result == status::ok || result == status::message_truncated ||
                  comm::is_error(result),
              "a receive completed with a status that is not an outcome");
      require(result != status::message_truncated || length > r->buffer.size(),
              "truncated, but the message fitted");
      require(result != status::ok || length <= r->buffer.size(),
              "ok, but the message did not fit");
      require(length <= (size_t{1} << 40), "a length beyond every limit");
    };
    rndv = [](tl::tag_context* self, tl::tag_t, const void*, size_t length, status) {
      auto* r = static_cast<checked_recv*>(self);
      require(!r->done, "a receive completed twice");
      r->done = true;
      require(length <= shm::zcopy_max_hdr, "a rendezvous request header beyond max_hdr");
    };
  }
};

/// Checks the fragments the unexpected eager handler gets.
struct fragment_checker {
  int open = 0;  ///< messages begun (FIRST with MORE) and not ended
  static comm::status eager(void* arg, void* data, size_t length, unsigned flags, tl::tag_t,
                            uint64_t, void** context) {
    auto* self = static_cast<fragment_checker*>(arg);
    static char token;
    const bool first = (flags & tl::tag_flag_first) != 0;
    const bool more = (flags & tl::tag_flag_more) != 0;
    require(length <= segment_size, "a fragment longer than a receive buffer");
    require(length == 0 || data != nullptr, "a fragment without data");
    if (length != 0) {
      volatile uint8_t touch = static_cast<uint8_t*>(data)[length - 1];
      (void)touch;
    }
    if (first) {
      require(self->open == 0, "a new message began inside another");
      require(*context == nullptr, "the first fragment came with a context");
      if (more) {
        *context = &token;
        ++self->open;
      }
    } else {
      require(self->open == 1 && *context == &token, "a later fragment lost its context");
      if (!more) --self->open;
    }
    return comm::status::ok;
  }
  static comm::status rndv(void*, unsigned, tl::tag_t, const void* header, size_t header_length,
                           uint64_t, size_t length, const void* rkey, size_t rkey_length) {
    require(header_length <= 256 && (header_length == 0 || header != nullptr), "bad header");
    require((rkey_length == 0) == (length == 0), "a key without a length, or a length without");
    require(rkey_length == 0 || rkey != nullptr, "a key length without a key");
    return comm::status::ok;
  }
};

/// The receiver, a well-behaved sender, and a rogue mapping of the receiver's segment.
struct harness {
  std::unique_ptr<tl::iface> receiver = open_iface();
  std::unique_ptr<tl::iface> sender = open_iface();
  std::unique_ptr<tl::ep> ep;
  shm::segment rogue;
  fragment_checker fragments;
  std::vector<std::unique_ptr<checked_recv>> posted;
  uint64_t liveness = 0;
  uint64_t arrived = 0;

  harness() {
    const auto address = shm::iface_addr::unpack(receiver->iface_address());
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
    require(address.has_value() && pidfd >= 0, "no address or pidfd");
    require(shm::segment::attach(pidfd, *address, &rogue) == status::ok, "cannot map the FIFO");
    ::close(pidfd);
    require(receiver->set_tag_handlers(&fragment_checker::eager, &fragments,
                                       &fragment_checker::rndv, nullptr) == status::ok,
            "no tag handlers");
    receiver->set_am_handler(1, [](void* arg, void*, size_t, unsigned) {
      ++*static_cast<uint64_t*>(arg);
      return status::ok;
    }, &arrived);
    require(receiver->create_ep(receiver->device_address(), receiver->iface_address(), ep) ==
                status::ok,
            "no endpoint");
  }

  /// Keeps four receives posted: exact tags 0 and 1, low bit 1, anything.
  void repost() {
    static const tl::tag_t tags[][2] = {{0, ~0ull}, {1, ~0ull}, {1, 1}, {0, 0}};
    posted.resize(4);
    for (size_t i = 0; i < 4; ++i) {
      if (posted[i] && !posted[i]->done) continue;
      posted[i] = std::make_unique<checked_recv>(i * 700);
      const tl::iov* entry = &posted[i]->entry;
      require(receiver->tag_recv_zcopy(tags[i][0], tags[i][1], entry, 1, posted[i].get()) ==
                  status::ok,
              "cannot post a receive");
    }
  }

  uint64_t claim() {
    return shm::shared_word(rogue.control().head).fetch_add(1) & ~shm::head_armed;
  }

  void publish(uint64_t index, shm::cell_meta meta) {
    shm::cell_header* cell = rogue.cell(index);
    shm::shared_word(cell->meta).store(meta.pack(), std::memory_order_relaxed);
    shm::shared_word(cell->seq).store(index + 1, std::memory_order_release);
  }

  /// Builds a rendezvous descriptor naming the real sender interface into the cell's buffer.
  void write_rndv(uint64_t index, const uint8_t* p, const uint8_t* key, size_t key_length) {
    uint16_t slot, header_length;
    uint32_t length;
    std::memcpy(&slot, p, 2);
    std::memcpy(&length, p + 4, 4);
    std::memcpy(&header_length, p + 8, 2);
    header_length %= 300;
    const auto own = shm::iface_addr::unpack(sender->iface_address());
    capnp::word words[shm::zcopy_max_desc_words] = {};
    capnp::MallocMessageBuilder message(kj::arrayPtr(words, shm::zcopy_max_desc_words));
    auto d = message.initRoot<schema::ShmTagRndvDescriptor>();
    d.setSenderPid(own->pid);
    d.setSenderFd(own->fd);
    d.setSenderIfaceId(own->iface_id);
    d.setSenderFifoSize(own->fifo_size);
    d.setSenderCellSize(own->cell_size);
    d.setSenderSegSize(own->segment_size);
    d.setOpSlot(slot);
    d.setOpGeneration(p[2]);
    d.setTag(p[3]);
    d.setHeaderLength(header_length);
    d.setLength(length);
    d.setRkey(kj::arrayPtr(key, key_length));
    const auto segments = message.getSegmentsForOutput();
    const size_t desc_bytes = segments[0].size() * 8;
    std::memcpy(rogue.buffer(index), segments[0].begin(), desc_bytes);
    publish(index, {0, shm::cell_tag_rndv, static_cast<uint16_t>(segments[0].size()),
                    static_cast<uint32_t>(desc_bytes + header_length)});
  }

  /// Writes the input's records as cells; returns how many.
  size_t write_cells(const uint8_t* data, size_t size) {
    size_t cells = 0;
    while (size >= record_header && cells < fifo_size - 2) {
      const uint8_t kind = data[0];
      uint16_t desc_words, buffer_bytes;
      uint32_t length;
      std::memcpy(&desc_words, data + 1, 2);
      std::memcpy(&length, data + 3, 4);
      const size_t cell_bytes = std::min<size_t>(data[7], rogue.geo().max_short());
      std::memcpy(&buffer_bytes, data + 8, 2);
      data += record_header;
      size -= record_header;
      const size_t from_cell = std::min(cell_bytes, size);
      const size_t from_buffer = std::min<size_t>({buffer_bytes, size - from_cell, segment_size});
      const uint64_t index = claim();
      std::memcpy(shm::segment::cell_data(rogue.cell(index)), data, from_cell);
      std::memcpy(rogue.buffer(index), data + from_cell, from_buffer);
      if (kind == rndv_to_sender && from_cell >= 10) {
        write_rndv(index, data, data + from_cell, std::min<size_t>(from_buffer, 128));
      } else {
        publish(index, {0, kind, desc_words, length});
      }
      data += from_cell + from_buffer;
      size -= from_cell + from_buffer;
      ++cells;
    }
    return cells;
  }

  /// Progresses until the FIFO is drained and a message from the good endpoint arrived.
  void drain_and_check_liveness() {
    const uint64_t value = ++liveness;
    for (int round = 0; round < 100000; ++round) {
      receiver->progress();
      sender->progress();
      if (ep->am_short(1, &value, sizeof(value), nullptr, 0) == status::ok) break;
    }
    for (int round = 0; round < 100000 && arrived < liveness; ++round) {
      receiver->progress();
      sender->progress();
    }
    require(arrived == liveness, "a well-behaved message did not arrive after the input");
    require(fragments.open == 0, "a fragmented message never ended");
  }
};

harness* the_harness = nullptr;

// -- seeds ----------------------------------------------------------------------------------------

using comm::fuzz::seed;

void record(seed& out, uint8_t kind, uint16_t desc_words, uint32_t length, const seed& cell,
            const seed& buffer) {
  out.push_back(kind);
  comm::fuzz::append(out, &desc_words, 2);
  comm::fuzz::append(out, &length, 4);
  out.push_back(static_cast<uint8_t>(cell.size()));
  const uint16_t buffer_bytes = static_cast<uint16_t>(buffer.size());
  comm::fuzz::append(out, &buffer_bytes, 2);
  out.insert(out.end(), cell.begin(), cell.end());
  out.insert(out.end(), buffer.begin(), buffer.end());
}

seed tag_header(tl::tag_t tag, uint64_t imm) {
  comm::wire::header_writer<schema::ShmTagHeader> writer;
  writer.fields().setTag(tag);
  writer.fields().setImm(imm);
  seed out;
  comm::fuzz::append(out, writer.bytes(), writer.size());
  return out;
}

seed with(seed a, const seed& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<seed> make_seeds() {
  std::vector<seed> seeds;
  const seed payload(40, 0x5a);
  // Short and bcopy, matched and not.
  seed s;
  record(s, shm::cell_tag_inline, 0, 24 + 40, with(tag_header(0, 0), payload), {});
  record(s, shm::cell_tag_inline, 0, 24 + 40, with(tag_header(7, 0), payload), {});
  record(s, shm::cell_tag_bcopy, 0, 1500, tag_header(1, 3), seed(1500, 1));
  record(s, shm::cell_tag_request, 0, 16, tag_header(9, 0), seed(16, 2));
  seeds.push_back(s);
  // A tagged zcopy descriptor (whose addresses the receiver cannot read).
  capnp::MallocMessageBuilder message;
  auto d = message.initRoot<schema::ShmTagZcopyDescriptor>();
  d.setSenderPid(static_cast<int32_t>(::getpid()));
  d.setCompletionSeq(1);
  d.setTag(3);
  auto list = d.initIov(1);
  list[0].setAddress(4096);
  list[0].setLength(100);
  const auto words = message.getSegmentsForOutput()[0];
  seed z;
  comm::fuzz::append(z, words.begin(), words.size() * 8);
  seed zs;
  record(zs, shm::cell_tag_zcopy, static_cast<uint16_t>(words.size()),
         static_cast<uint32_t>(z.size()), seed(8, 0), z);
  seeds.push_back(zs);
  // A rendezvous naming the real sender, slot 3, generation 1, with a header.
  seed r;
  seed fields(10, 0);
  fields[0] = 3;
  fields[2] = 1;
  fields[3] = 1;
  fields[8] = 16;
  record(r, rndv_to_sender, 0, 0, fields, {});
  seeds.push_back(r);
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  // Below error: every input is malformed by design, and each line would cost a write.
  comm::set_log_level(static_cast<comm::log_level>(-1));
  the_harness = new harness;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harness& h = *the_harness;
  h.repost();
  h.write_cells(data, size);
  h.drain_and_check_liveness();
  return 0;
}
