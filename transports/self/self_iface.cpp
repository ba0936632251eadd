#include "self/self_iface.hpp"

#include "base/host_identity.hpp"

#include <comm/log.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <unordered_map>

namespace comm::tl::self {
namespace {

constexpr const char* log_name = "self";
constexpr size_t max_fifo_size = 1u << 16;
constexpr size_t max_segment_size = 1u << 24;
constexpr size_t zcopy_max_hdr = 256;

/// COMM_SELF_FIFO_SIZE.
constexpr knob fifo_size_knob{"COMM_SELF_FIFO_SIZE",
                              "messages an interface's mailbox holds, 1..65536", "256"};
/// COMM_SELF_SEG_SIZE.
constexpr knob segment_size_knob{"COMM_SELF_SEG_SIZE",
                                 "bytes of a mailbox slot (the largest bcopy), 256..16m", "8192"};
/// Every knob of self.
constexpr std::array<knob, 2> self_knobs{fifo_size_knob, segment_size_knob};

/// The knobs of one interface.
struct self_config {
  size_t fifo_size = 256;     ///< COMM_SELF_FIFO_SIZE
  size_t segment_size = 8192; ///< COMM_SELF_SEG_SIZE
};

/// The knobs `opts` sets into `*out`: ok, or invalid_param with the refusal in `*why`.
status parse_config(const options& opts, self_config* out, std::string* why) {
  option_reader reader("self", self_knobs, opts);
  out->fifo_size = reader.number(fifo_size_knob, out->fifo_size, 1, max_fifo_size);
  out->segment_size = reader.size(segment_size_knob, out->segment_size, zcopy_max_hdr,
                                  max_segment_size);
  return reader.result(why);
}
constexpr size_t zcopy_max_iov = 16;
constexpr unsigned progress_batch = 64;
/// RMA limits (a copy has none of its own) and the reads in flight per endpoint we advertise.
constexpr size_t max_rma_bytes = size_t{1} << 40;
constexpr size_t max_outstanding_reads = 16;

/// Device address: this process on this boot.
struct [[gnu::packed]] device_addr {
  int32_t pid;
  uint8_t boot_id[16];
};

/// Interface address: the registry id.
struct [[gnu::packed]] iface_addr {
  uint64_t id;
};

/// Every live self interface of this process, by id. Leaked on purpose so interfaces destroyed
/// during static destruction still find it.
struct registry {
  std::mutex mutex;
  std::unordered_map<uint64_t, std::shared_ptr<mailbox>> live;
  uint64_t next_id = 1;
};

registry& the_registry() {
  static registry* instance = new registry;
  return *instance;
}

device_addr local_device_addr() {
  device_addr addr;
  addr.pid = static_cast<int32_t>(::getpid());
  std::memcpy(addr.boot_id, local_host_identity().boot_id, sizeof(addr.boot_id));
  return addr;
}

template <class T>
std::vector<uint8_t> to_bytes(const T& value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);
  return std::vector<uint8_t>(p, p + sizeof(T));
}

template <class T>
bool from_bytes(const std::vector<uint8_t>& bytes, T* out) {
  if (bytes.size() != sizeof(T)) return false;
  std::memcpy(out, bytes.data(), sizeof(T));
  return true;
}

bool device_matches(const std::vector<uint8_t>& bytes) {
  device_addr theirs;
  if (!from_bytes(bytes, &theirs)) return false;
  const device_addr ours = local_device_addr();
  return std::memcmp(&theirs, &ours, sizeof(ours)) == 0;
}

class self_component_impl final : public component {
public:
  std::string_view name() const override { return "self"; }
  std::vector<std::string> devices(const options&) const override { return {"memory"}; }
  std::span<const knob> knobs() const override { return self_knobs; }
  status check_options(const options& opts, std::string* why) const override {
    self_config config;
    return parse_config(opts, &config, why);
  }
  status open(const iface_params& params, std::unique_ptr<iface>& out) override {
    if (!params.device.empty() && params.device != "memory") return status::no_elem;
    auto created = std::make_unique<self_iface>(params);
    if (created->open_status() != status::ok) return created->open_status();
    out = std::move(created);
    return status::ok;
  }
};

}  // namespace

component& self_component() {
  static self_component_impl instance;
  return instance;
}

// -- mailbox --------------------------------------------------------------------------------------

mailbox::mailbox(size_t capacity_, size_t slot_bytes, int event_fd_)
    : capacity(capacity_),
      slot_words((slot_bytes + 7) / 8),
      event_fd(event_fd_),
      buffers(capacity_),
      slots(capacity_) {
  for (desc_pool::block& b : buffers) b.reset(new uint64_t[slot_words]);
}

mailbox::~mailbox() {
  if (event_fd >= 0) ::close(event_fd);
}

void mailbox::wake() const {
  const uint64_t one = 1;
  if (::write(event_fd, &one, sizeof(one)) < 0 && errno != EAGAIN) {
    COMM_LOG(warn, log_name, "eventfd write: %s", std::strerror(errno));
  }
}

void mailbox::hand_back(returned_completion done) {
  bool wake_owner = false;
  {
    std::lock_guard lock(mutex);
    if (closed) return;
    returned.push_back(std::move(done));
    note_activity();
    wake_owner = take_armed();
  }
  if (wake_owner) wake();
}

// -- self_iface -----------------------------------------------------------------------------------

self_iface::self_iface(const iface_params& params) {
  self_config config;
  std::string why;
  if ((open_status_ = parse_config(params.opts, &config, &why)) != status::ok) {
    COMM_LOG(error, log_name, "%s", why.c_str());
    return;
  }
  const size_t fifo = params.fifo_size != 0 ? params.fifo_size : config.fifo_size;
  const size_t segment = params.segment_size != 0 ? params.segment_size : config.segment_size;
  if (fifo > max_fifo_size || segment < zcopy_max_hdr || segment > max_segment_size) {
    COMM_LOG(error, log_name, "bad parameters: fifo_size %zu, segment_size %zu", fifo, segment);
    open_status_ = status::invalid_param;
    return;
  }
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) {
    COMM_LOG(error, log_name, "eventfd: %s", std::strerror(errno));
    open_status_ = status::io_error;
    return;
  }
  // The mailbox owns the eventfd from here on: senders may still hold it after we are gone.
  mailbox_ = std::make_shared<mailbox>(fifo, segment + zcopy_max_hdr, event_fd_);

  attr_.caps = cap_am_short | cap_am_bcopy | cap_am_zcopy | cap_pending | cap_event_fd |
               cap_connect_to_iface | cap_get_zcopy | cap_put_zcopy | cap_tag_any;
  attr_.max_short = segment;
  attr_.max_bcopy = segment;
  attr_.max_zcopy = segment;
  attr_.max_hdr = zcopy_max_hdr;
  attr_.max_iov = zcopy_max_iov;
  attr_.max_get_zcopy = max_rma_bytes;
  attr_.max_put_zcopy = max_rma_bytes;
  attr_.max_outstanding_reads = max_outstanding_reads;
  attr_.max_am_descs = max_am_descs;
  attr_.tag.eager = {segment, segment, tag_eager_max_zcopy, zcopy_max_iov};
  attr_.tag.rndv = {max_rma_bytes, zcopy_max_hdr, 1};
  attr_.tag.recv = {max_rma_bytes, tag_recv_max_iov, tag_max_outstanding};
  attr_.latency_ns = 50;
  attr_.bandwidth_bytes_per_s = 10e9;
  attr_.priority = 20;
  attr_.node_local = true;

  {
    registry& reg = the_registry();
    std::lock_guard lock(reg.mutex);
    id_ = reg.next_id++;
    reg.live.emplace(id_, mailbox_);
  }
  md_ = std::make_unique<self_md>(id_);
}

self_iface::~self_iface() {
  if (!mailbox_) return;
  {
    registry& reg = the_registry();
    std::lock_guard lock(reg.mutex);
    reg.live.erase(id_);
  }
  // Refuse further sends and drop undelivered zcopy state (it may refer back to us). Endpoints
  // that target us keep the mailbox itself alive until they are destroyed.
  std::vector<returned_completion> returned;
  std::vector<returned_completion> undelivered;
  {
    std::lock_guard lock(mailbox_->mutex);
    mailbox_->closed = true;
    for (mailbox::slot& s : mailbox_->slots) {
      if (s.origin) {
        undelivered.push_back(
            {std::move(s.origin), s.comp, status::connection_reset, std::move(s.rndv)});
      }
    }
    returned.swap(mailbox_->returned);
  }
  // Their senders complete zcopy operations we will never deliver with connection_reset.
  for (returned_completion& done : undelivered) {
    mailbox& home = *done.origin->home;
    home.hand_back(std::move(done));
  }
}

unsigned self_iface::deliver() {
  mailbox& mb = *mailbox_;
  unsigned delivered = 0;
  while (delivered < progress_batch) {
    taken_slot taken;
    {
      std::lock_guard lock(mb.mutex);
      if (mb.count == 0 || !mb.slots[mb.tail].ready) break;
      taken.index = mb.tail;
      mailbox::slot& s = mb.slots[taken.index];
      taken.id = s.id;
      taken.kind = s.kind;
      taken.length = s.length;
      taken.comp = s.comp;
      taken.origin = std::move(s.origin);
      if (taken.kind != slot_kind::am) [[unlikely]] {
        taken.tag = s.tag;
        taken.imm = s.imm;
        taken.aux = s.aux;
        taken.rndv = std::move(s.rndv);
      }
    }
    const size_t index = taken.index;
    const am_id id = taken.id;
    const uint32_t length = taken.length;
    const handler* h = id < am_id_count ? &handlers_[id] : nullptr;
    if (taken.kind != slot_kind::am) [[unlikely]] {
      deliver_tag(taken);
    } else if (h == nullptr) {
      // A bcopy whose pack overran max_bcopy: the sender logged it; nothing to deliver.
    } else if (h->fn != nullptr) {
      const unsigned flags = descs_.can_lend() ? am_flag_desc : 0;
      if (h->fn(h->arg, mb.slot_data(index), length, flags) == status::in_progress && flags != 0) {
        lend_slot(index);
      }
      ++delivered_;
    } else {
      ++dropped_;
      COMM_LOG(debug, log_name, "no handler for am id %u, message dropped", unsigned{id});
    }
    {
      std::lock_guard lock(mb.mutex);
      mb.slots[index].ready = false;
      mb.tail = (mb.tail + 1) % mb.capacity;
      --mb.count;
      mb.note_activity();
    }
    if (taken.origin) {
      // A zcopy: the sender completes it on its own progress.
      mailbox& home = *taken.origin->home;
      home.hand_back({std::move(taken.origin), taken.comp, status::ok, nullptr});
    }
    ++delivered;
  }
  return delivered;
}

// -- tag matching ---------------------------------------------------------------------------------

namespace {

/// Copies `length` bytes from byte `offset` of the iov `from` (`count` entries) to `dest`.
void gather(const iov* from, size_t count, size_t offset, uint8_t* dest, size_t length) {
  for (size_t i = 0; i < count && length > 0; ++i) {
    if (offset >= from[i].length) {
      offset -= from[i].length;
      continue;
    }
    const size_t n = std::min(from[i].length - offset, length);
    std::memcpy(dest, static_cast<const uint8_t*>(from[i].buffer) + offset, n);
    dest += n;
    length -= n;
    offset = 0;
  }
}

}  // namespace

void self_iface::deliver_tag(taken_slot& slot) {
  mailbox& mb = *mailbox_;
  uint8_t* data = mb.slot_data(slot.index);
  tag_match match;
  switch (slot.kind) {
    case slot_kind::tag_eager:
      if (tags_.take(slot.tag, &match)) {
        tags_.deliver(match, slot.tag, slot.imm, data, slot.length);
      } else {
        void* context = nullptr;
        unexpected_in_slot(slot.index, slot.length, tag_flag_first, slot.tag, slot.imm, &context);
      }
      return;
    case slot_kind::tag_zcopy:
      return deliver_tag_zcopy(slot);
    case slot_kind::tag_rndv:
      return deliver_rndv(slot);
    case slot_kind::tag_request:
      if (tags_.take(slot.tag, &match)) {
        tags_.deliver_request(match, slot.tag, data, slot.length);
      } else {
        tags_.unexpected_rndv(slot.tag, data, slot.length, 0, 0, nullptr, 0);
      }
      return;
    case slot_kind::am:
      return;
  }
}

void self_iface::unexpected_in_slot(size_t index, size_t length, unsigned flags, tag_t tag,
                                    uint64_t imm, void** context) {
  mailbox& mb = *mailbox_;
  if (descs_.can_lend()) flags |= am_flag_desc;
  const status kept = tags_.unexpected_eager(mb.slot_data(index), length, flags, tag, imm, context);
  if (kept == status::in_progress && (flags & am_flag_desc) != 0) lend_slot(index);
}

void self_iface::lend_slot(size_t index) {
  mailbox& mb = *mailbox_;
  desc_pool::block fresh = descs_.replacement(mb.slot_words * 8);
  descs_.lend(std::move(mb.buffers[index]), mb.slot_words * 8);
  mb.buffers[index] = std::move(fresh);
}

void self_iface::deliver_tag_zcopy(taken_slot& slot) {
  // The sender's iov, copied out of the slot: its buffer may be lent to a handler below.
  iov from[zcopy_max_iov];
  const size_t count = std::min<size_t>(slot.aux, zcopy_max_iov);
  std::memcpy(from, mailbox_->slot_data(slot.index), count * sizeof(iov));
  const size_t total = slot.length;
  tag_match match;
  if (tags_.take(slot.tag, &match)) {
    // Straight from the sender's memory into the posted receive.
    size_t offset = 0;
    for (size_t i = 0; i < count; ++i) {
      match.scatter(offset, from[i].buffer, from[i].length);
      offset += from[i].length;
    }
    tags_.finish(match, slot.tag, slot.imm, total, status::ok);
  } else {
    // Fragments of a slot's size, each copied into the slot's buffer.
    const size_t fragment = attr_.max_bcopy;
    void* context = nullptr;
    size_t offset = 0;
    do {
      const size_t n = std::min(fragment, total - offset);
      gather(from, count, offset, mailbox_->slot_data(slot.index), n);
      const unsigned flags =
          (offset == 0 ? tag_flag_first : 0) | (offset + n < total ? tag_flag_more : 0);
      unexpected_in_slot(slot.index, n, flags, slot.tag, slot.imm, &context);
      offset += n;
    } while (offset < total);
  }
  // Hand the completion back (deliver() does it for the slot's origin).
}

void self_iface::deliver_rndv(taken_slot& slot) {
  rndv_op& op = *slot.rndv;
  int expected = rndv_op::posted;
  if (!op.state.compare_exchange_strong(expected, rndv_op::taken, std::memory_order_acq_rel)) {
    ++rndv_skipped_;  // canceled by its sender before we got to it
    slot.origin.reset();
    return;
  }
  const uint8_t* header = mailbox_->slot_data(slot.index);
  tag_match match;
  if (!tags_.peek(slot.tag, &match)) {
    op.state.store(rndv_op::unexpected, std::memory_order_release);
    slot.origin.reset();  // the sender's operation waits for its cancel
    tags_.unexpected_rndv(slot.tag, header, slot.length, op.address, op.length, op.rkey.data(),
                          op.rkey.size());
    return;
  }
  // The md's get path: the key must still grant the range, then a copy.
  const size_t length = std::min<size_t>(op.length, match.capacity);
  status result = status::ok;
  if (length != 0) {
    packed_rkey key;
    result = parse_rkey(op.rkey.data(), op.rkey.size(), rkey_magic_self, max_self_regions, &key);
    if (result == status::ok) result = check_self_access(key, key.iface_id, op.address, length);
    iov into[tag_recv_max_iov];
    const size_t used = match.clipped(length, into);
    if (result == status::ok) copy_local(into, used, reinterpret_cast<uint8_t*>(op.address), false);
    count_rma(false, length, result);
  }
  op.state.store(rndv_op::done, std::memory_order_release);
  const uint64_t total = op.length;
  mailbox& home = *slot.origin->home;
  home.hand_back({std::move(slot.origin), slot.comp, result, std::move(slot.rndv)});
  if (result != status::ok) {
    // Nothing is delivered: the receive stays posted, the sender's operation fails.
    COMM_LOG(warn, log_name, "rendezvous of %llu bytes: fetch refused: %s",
             static_cast<unsigned long long>(total), to_string(result));
    return;
  }
  tags_.consume(match);
  tags_.finish(match, slot.tag, 0, total, status::ok);
}

unsigned self_iface::complete_returned() {
  {
    std::lock_guard lock(mailbox_->mutex);
    if (mailbox_->returned.empty()) return 0;
    returned_scratch_.swap(mailbox_->returned);
    mailbox_->note_activity();
  }
  unsigned done = 0;
  for (returned_completion& r : returned_scratch_) {
    ep_state& state = *r.origin;
    if (!state.alive) continue;  // the endpoint was destroyed: its completions are dropped
    if (r.rndv) {
      release_rndv(state, *r.rndv);
      if (r.rndv->canceled_by_sender) r.comp = nullptr;  // canceled meanwhile: never completed
    }
    ++state.zcopy_done;
    ++done;
    if (r.comp != nullptr) complete(r.comp, r.result);
    while (state.alive && !state.flushes.empty() &&
           state.flushes.front().first <= state.zcopy_done) {
      completion* flush = state.flushes.front().second;
      state.flushes.erase(state.flushes.begin());
      complete(flush, r.result);
    }
  }
  returned_scratch_.clear();
  return done;
}

void self_iface::schedule_pending(self_ep* ep) {
  if (ep->scheduled) return;
  ep->scheduled = true;
  pending_eps_.push_back(ep);
}

void self_iface::forget(self_ep* ep) {
  if (!ep->scheduled) return;
  for (self_ep*& entry : pending_eps_) {
    if (entry == ep) entry = nullptr;  // compacted by dispatch_pending
  }
}

unsigned self_iface::dispatch_pending() {
  unsigned done = 0;
  // Callbacks may park more requests (appending) or destroy endpoints (nulling entries).
  for (size_t i = 0; i < pending_eps_.size(); ++i) {
    if (self_ep* ep = pending_eps_[i]) done += ep->dispatch_pending();
  }
  size_t kept = 0;
  for (self_ep* ep : pending_eps_) {
    if (ep == nullptr) continue;
    if (ep->has_pending()) {
      pending_eps_[kept++] = ep;
    } else {
      ep->scheduled = false;
    }
  }
  pending_eps_.resize(kept);
  return done;
}

unsigned self_iface::progress() {
  if (mailbox_->activity.load(std::memory_order_acquire) == 0 && pending_eps_.empty()) return 0;
  unsigned events = deliver();
  events += complete_returned();
  if (!pending_eps_.empty()) events += dispatch_pending();
  return events;
}

status self_iface::event_arm() {
  uint64_t value;
  while (::read(event_fd_, &value, sizeof(value)) > 0) {
  }
  if (!pending_eps_.empty()) return status::busy;
  std::lock_guard lock(mailbox_->mutex);
  if (mailbox_->count != 0 && mailbox_->slots[mailbox_->tail].ready) return status::busy;
  if (!mailbox_->returned.empty()) return status::busy;
  // A slot still being filled wakes us when its sender commits it.
  mailbox_->armed = true;
  return status::ok;
}

std::vector<uint8_t> self_iface::device_address() const { return to_bytes(local_device_addr()); }

std::vector<uint8_t> self_iface::iface_address() const { return to_bytes(iface_addr{id_}); }

bool self_iface::is_reachable(const std::vector<uint8_t>& device_address,
                              const std::vector<uint8_t>& iface_address) const {
  iface_addr addr;
  if (!device_matches(device_address) || !from_bytes(iface_address, &addr)) return false;
  registry& reg = the_registry();
  std::lock_guard lock(reg.mutex);
  return reg.live.count(addr.id) != 0;
}

status self_iface::create_ep(const std::vector<uint8_t>& device_address,
                             const std::vector<uint8_t>& iface_address,
                             std::unique_ptr<ep>& out) {
  iface_addr addr;
  if (!from_bytes(iface_address, &addr) || device_address.size() != sizeof(device_addr)) {
    return status::invalid_addr;
  }
  if (!device_matches(device_address)) return status::unreachable;
  std::shared_ptr<mailbox> target;
  {
    registry& reg = the_registry();
    std::lock_guard lock(reg.mutex);
    auto found = reg.live.find(addr.id);
    if (found == reg.live.end()) return status::unreachable;
    target = found->second;
  }
  out = std::make_unique<self_ep>(*this, std::move(target), uint64_t{addr.id});
  return status::ok;
}

std::string self_iface::info() const {
  std::string text;
  text += "self: interface id " + std::to_string(id_) + "\n";
  text += "self: receive queue " + std::to_string(mailbox_->capacity) + " slots of " +
          std::to_string(mailbox_->slot_words * 8) + " bytes\n";
  text += "self: max_short " + std::to_string(attr_.max_short) + ", max_bcopy " +
          std::to_string(attr_.max_bcopy) + ", max_zcopy " + std::to_string(attr_.max_zcopy) +
          " (max_hdr " + std::to_string(attr_.max_hdr) + ", max_iov " +
          std::to_string(attr_.max_iov) + ")\n";
  text += "self: delivered " + std::to_string(delivered_) + " messages, dropped " +
          std::to_string(dropped_) + " without handler, " + std::to_string(descs_.lent()) +
          " of " + std::to_string(descs_.limit()) + " descriptors kept by handlers\n";
  if (md_) text += md_->info();
  text += "self: rma: " + rma_.text() + "\n";
  text += tags_.info("self");
  text += "self: tag: " + std::to_string(rndv_skipped_) +
          " rendezvous canceled before delivery\n";
  return text;
}

void self_iface::release_rndv(ep_state& state, rndv_op& op) {
  if (op.released) return;
  op.released = true;
  if (op.memh != nullptr) md_->mem_dereg(op.memh);
  op.memh = nullptr;
  auto& ops = state.rndv_ops;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].get() != &op) continue;
    ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
}

status self_iface::set_tag_handlers(tag_unexp_eager_fn eager, void* eager_arg,
                                    tag_unexp_rndv_fn rndv, void* rndv_arg) {
  tags_.set_handlers(eager, eager_arg, rndv, rndv_arg);
  return status::ok;
}

status self_iface::tag_recv_zcopy(tag_t tag, tag_t tag_mask, const iov* entries, size_t count,
                                  tag_context* ctx) {
  return tags_.post(tag, tag_mask, entries, count, ctx);
}

status self_iface::tag_recv_cancel(tag_context* ctx, bool force) {
  return tags_.cancel(ctx, force);
}

void self_iface::release_am_desc(void* data) {
  if (!descs_.release(data)) {
    COMM_LOG(error, log_name, "release_am_desc: %p is not a descriptor kept from this interface",
             data);
  }
}

}  // namespace comm::tl::self
