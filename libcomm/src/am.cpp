// The AM module: the send entry point, delivery to the handlers, whole or per fragment, with
// persistent data and reply endpoints, rendezvous AMs as descriptors the receiver fetches or
// releases, and rendezvous AMs fetched for the handler under the AM receive limits.
#include "am.hpp"

#include "iov.hpp"
#include "protocols.hpp"

#include <comm/log.hpp>
#include <comm/memory.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>

namespace comm {

using detail::am_protocol;
using detail::endpoint_impl;
using detail::impl;
using detail::module_of;
using detail::worker_impl;

namespace detail {
namespace {

constexpr uint64_t max_am_message = 1ull << 30;

/// Allocates `length` bytes aligned for handlers (at least 8); null on failure.
uint8_t* aligned_block(size_t alignment, size_t length) {
  void* block = nullptr;
  if (posix_memalign(&block, std::max<size_t>(alignment, 8), std::max<size_t>(length, 1)) != 0) {
    return nullptr;
  }
  return static_cast<uint8_t*>(block);
}

/// The module's state on an endpoint: the fragmented message arriving, and the rendezvous AMs
/// waiting for room.
struct am_ep_state : endpoint_state {
  uint16_t id = 0;                  ///< AM id of the fragmented message
  uint16_t flags = 0;               ///< its wire flags
  std::vector<uint8_t> header;      ///< copy of its user header
  uint8_t* buffer = nullptr;        ///< its reassembly buffer (whole-message handlers)
  std::list<deferred_am> deferred;  ///< rendezvous AMs waiting for room, in order
};

// -- sends ---------------------------------------------------------------------------------------

size_t encode_first(request* req, const send_progress& s, bool whole, uint8_t* out,
                    tl::am_id* id) {
  am_protocol& am = module_of<am_protocol>(*req->owner);
  const auto& state = req->as<am_send_state>();
  const uint32_t dst = req->ep->remote_id;
  const auto header_length = static_cast<uint32_t>(req->header.size());
  if (!whole) {
    auto& h = am.hdr_am_first.fields();
    h.setDstEp(dst);
    h.setAmId(state.id);
    h.setFlags(state.flags);
    h.setHeaderLength(header_length);
    h.setMsgId(s.msg_id);
    h.setTotalLength(header_length + s.length);
    *id = wire_id(am_msg::first);
    return am.hdr_am_first.copy_to(out);
  }
  auto& h = am.hdr_am.fields();
  h.setDstEp(dst);
  h.setAmId(state.id);
  h.setFlags(state.flags);
  h.setHeaderLength(header_length);
  *id = wire_id(am_msg::single);
  return am.hdr_am.copy_to(out);
}

size_t whole_header_size(const request*) {
  return wire::header_size<wire::schema::ActiveMessage>();
}

status send_by_rndv(request* req) {
  auto& s = req->as<am_send_state>();
  const rts_fields fields{.is_am = true, .am_id = s.id, .am_flags = s.flags};
  return module_of<rndv_protocol>(*req->owner).send(req, s.rndv, s.send.length, fields);
}

const message_framing framing{encode_first, whole_header_size, send_by_rndv,
                              wire_id(am_msg::fragment)};

status progress_send(request* req) {
  return send_message(req, req->as<am_send_state>().send, framing);
}

void release_send(request* req) {
  module_of<rndv_protocol>(*req->owner).release_send(req->as<am_send_state>().rndv);
}

status cancel_send(request* req, cancel_mode mode) {
  auto& s = req->as<am_send_state>();
  if (s.rndv.phase == rndv_phase::announced) {
    return module_of<rndv_protocol>(*req->owner).cancel_send(req, s.rndv, mode);
  }
  if (req->ep == nullptr) return status::busy;
  return req->ep->cancel_pending(req, mode);
}

const request_ops am_send_ops{.name = "am_send",
                           .progress = progress_send,
                           .release = release_send,
                           .cancel = cancel_send,
                           .events = wakeup_tx};

// -- rendezvous receives -------------------------------------------------------------------------

void release_recv(request* req) {
  module_of<rndv_protocol>(*req->owner).release_fetch(req->as<am_recv_state>().fetch);
}

const request_ops am_recv_ops{.name = "am_recv", .release = release_recv,
                              .events = wakeup_am | wakeup_rx};

// -- worker::am_recv_data ------------------------------------------------------------------------

void notify_data(request* req, status st) {
  const auto& s = req->as<am_data_state>();
  if (s.cb == nullptr) return;
  const bool wrote = st == status::ok || st == status::message_truncated;
  s.cb(req, st, wrote ? s.written : 0, req->params.user_data);
}

void release_data_fetch(request* req) {
  module_of<rndv_protocol>(*req->owner).release_fetch(req->as<am_data_state>().fetch);
}

const request_ops am_data_ops{.name = "am_recv_data",
                              .notify = notify_data,
                              .release = release_data_fetch,
                              .events = wakeup_am | wakeup_rx};

/// Bytes the entries hold.
size_t capacity_of(const iov_entry* entries, size_t count) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += entries[i].length;
  return total;
}

}  // namespace

am_protocol::am_protocol(worker_impl& owner, unsigned index) : protocol(owner, index) {
  receive<&am_protocol::on_single>(am_msg::single);
  receive<&am_protocol::on_first>(am_msg::first);
  receive<&am_protocol::on_fragment>(am_msg::fragment);
  // The user header of an AM travels in one bcopy fragment of the smallest interface.
  size_t smallest = 0;
  for (const auto& li : w.ifaces) {
    const size_t room = li.iface->attr().max_bcopy;
    if (smallest == 0 || room < smallest) smallest = room;
  }
  const size_t header = wire::header_size<wire::schema::ActiveMessageFirst>();
  max_header_ = smallest > header + max_proto_header ? smallest - header - max_proto_header : 0;
}

am_protocol::~am_protocol() noexcept {
  for (auto& [data, held] : persistent_) mem_free(held.block);  // either allocator
  for (const large_block& b : large_free_) mem_free(b.block);
}

status am_protocol::set_handler(uint16_t id, am_callback cb, void* arg, unsigned flags) {
  if (flags & ~static_cast<unsigned>(am_flag_whole_msg | am_flag_persistent_data |
                                     am_flag_fetch_rndv)) {
    return status::invalid_param;
  }
  if (cb == nullptr) {
    if (id < table_size) {
      table_[id] = handler{};
    } else {
      handlers_.erase(id);
    }
  } else {
    const handler h{cb, arg, flags};
    if (id < table_size) {
      table_[id] = h;
    } else {
      handlers_[id] = h;
    }
  }
  return status::ok;
}

void am_protocol::release_data(void* data) {
  if (is_handle(data)) {
    auto desc = descs_.find(data);
    if (desc != descs_.end()) return drop_desc(desc);
  }
  auto it = persistent_.find(data);
  if (it == persistent_.end()) {
    COMM_LOG(error, "worker", "am_data_release(%p): not data or a descriptor held by a handler",
             data);
    return;
  }
  uncount(it->second);
  release_large(it->second.block);
  persistent_.erase(it);
}

bool am_protocol::detach_data(void* data) {
  auto it = persistent_.find(data);
  if (it == persistent_.end()) return false;
  uncount(it->second);
  large_out_.erase(it->second.block);
  persistent_.erase(it);
  return true;
}

void am_protocol::uncount(held_data& d) {
  if (!d.counted) return;
  --held_;
  held_bytes_ -= d.length;
  d.counted = false;
}

const char* am_protocol::held_limit(size_t bytes, size_t* limit) const {
  const peer_limits& c = w.ctx.cfg().limits;
  if (held_ + 1 > c.am_held_max) {
    *limit = c.am_held_max;
    return "COMM_AM_HELD_MAX";
  }
  if (held_bytes_ + bytes > c.am_held_max_bytes) {
    *limit = c.am_held_max_bytes;
    return "COMM_AM_HELD_MAX_BYTES";
  }
  return nullptr;
}

void am_protocol::held_limit_hit(endpoint_impl* ep, uint16_t id, const char* variable,
                                 size_t limit, const char* what) {
  ++ep->counters_.errors;
  if (!w.count_limit_error()) return;
  COMM_LOG(warn, "limits", "%s: AM %u from %s: handlers keep %zu messages (%zu B), at %s=%zu: %s",
           w.params.name.c_str(), id, ep->peer_name_.c_str(), held_, held_bytes_, variable, limit,
           what);
}

// -- delivery ------------------------------------------------------------------------------------

void am_protocol::deliver(endpoint_impl* ep, uint16_t id, uint16_t wire_flags,
                          const uint8_t* header, size_t header_length, uint8_t* data,
                          size_t length, unsigned attr, size_t offset, size_t total,
                          uint64_t msg_id, bool data_is_ours) {
  const handler* found = find_handler(id);
  if (found == nullptr) {
    ++ep->counters_.errors;
    COMM_LOG(error, "am", "%s: no handler for active message %u from %s; dropped",
             w.params.name.c_str(), id, ep->peer_name_.c_str());
    if (data_is_ours) release_large(data);
    return;
  }
  const handler h = *found;
  w.note_events(wakeup_am | wakeup_rx);
  am_recv_params p;
  p.attr = attr;
  p.offset = offset;
  p.total_length = total;
  p.message_id = msg_id;
  if (wire_flags & am_wire_reply_ep) {
    p.attr |= am_recv_reply_ep;
    p.reply_ep = ep;
  }
  const bool persistent = (h.flags & am_flag_persistent_data) != 0;
  uint8_t* block = data_is_ours ? data : nullptr;
  const bool misaligned = reinterpret_cast<uintptr_t>(data) % w.params.am_alignment != 0;
  // Only data in a block of ours (given, or copied into one) may be kept past the call, within
  // the COMM_AM_HELD_* limits; the common message (transient and aligned) skips the check.
  bool keepable = false;
  if (block != nullptr || persistent || misaligned) {
    size_t limit = 0;
    const char* full = held_limit(length, &limit);
    if (full != nullptr && persistent) {
      held_limit_hit(ep, id, full, limit, "its data is valid during the call only");
    }
    keepable = full == nullptr;
  }
  if (block == nullptr && ((persistent && keepable) || misaligned)) {
    block = aligned_block(w.params.am_alignment, length);
    if (block == nullptr) {
      ++ep->counters_.errors;
      COMM_LOG(error, "am", "%s: no memory for %zu bytes of AM %u; dropped",
               w.params.name.c_str(), length, id);
      return;
    }
    if (length != 0) std::memcpy(block, data, length);
    data = block;
  }
  if (!keepable) {
    if (h.cb(h.arg, header, header_length, data, length, p) == status::in_progress) {
      COMM_LOG(error, "am", "%s: handler of AM %u returned in_progress for data it may not keep",
               w.params.name.c_str(), id);
    }
    if (block != nullptr) release_large(block);
    return;
  }
  // Held before the call, so that the handler may detach it (worker::am_data_detach) or receive
  // it (worker::am_recv_data) inside.
  p.attr |= am_recv_data_persistent;
  persistent_[data] = held_data{block, length, false};
  status st = h.cb(h.arg, header, header_length, data, length, p);
  auto held = persistent_.find(data);
  if (held == persistent_.end()) return;  // detached or received by the handler
  if (st == status::in_progress) {
    if (!held->second.counted) {
      held->second.counted = true;
      ++held_;
      held_bytes_ += length;
    }
    return;
  }
  persistent_.erase(held);
  release_large(block);
}

uint8_t* am_protocol::take_large(size_t length) {
  length = std::max<size_t>(length, 1);
  for (size_t i = 0; i < large_free_.size(); ++i) {
    const large_block b = large_free_[i];
    if (b.capacity < length || b.capacity / 2 > length) continue;
    large_free_.erase(large_free_.begin() + static_cast<long>(i));
    large_free_bytes_ -= b.capacity;
    large_out_[b.block] = b.capacity;
    return static_cast<uint8_t*>(b.block);
  }
  // Shareable (comm::mem_alloc), so that sending the block on is a mapped copy for a peer on this
  // host; page aligned, so only an alignment beyond a page needs the plain heap.
  constexpr size_t page = 4096;
  uint8_t* fresh = w.params.am_alignment <= page
                       ? static_cast<uint8_t*>(mem_alloc(length))
                       : aligned_block(w.params.am_alignment, length);
  if (fresh != nullptr) large_out_[fresh] = length;
  return fresh;
}

void am_protocol::release_large(void* block) {
  constexpr size_t max_blocks = 4;
  constexpr size_t max_bytes = 64u << 20;
  auto it = large_out_.find(block);
  if (it == large_out_.end()) {
    std::free(block);  // persistent or reassembled data: aligned_block's (no heap lock needed)
    return;
  }
  const size_t capacity = it->second;
  large_out_.erase(it);
  if (large_free_.size() >= max_blocks || large_free_bytes_ + capacity > max_bytes) {
    mem_free(block);
    return;
  }
  large_free_.push_back({block, capacity});
  large_free_bytes_ += capacity;
}

void am_protocol::on_single(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::ActiveMessage>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated active message header");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "active message for an unknown endpoint");
  if (ep == nullptr) return;
  const size_t payload = length - used;
  const size_t header_length = h->getHeaderLength();
  if (header_length > payload) return w.protocol_error(ep, "AM user header beyond the message");
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  uint8_t* body = const_cast<uint8_t*>(data) + used;
  deliver(ep, h->getAmId(), h->getFlags(), body, header_length, body + header_length,
          payload - header_length, am_recv_first, 0, payload - header_length, 0, false);
}

void am_protocol::on_first(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::ActiveMessageFirst>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated active message header");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "active message for an unknown endpoint");
  if (ep == nullptr) return;
  const size_t payload = length - used;
  const size_t header_length = h->getHeaderLength();
  const uint64_t total = h->getTotalLength();
  if (ep->rx.owner != nullptr) {
    return w.protocol_error(ep, "new message before the previous one ended");
  }
  if (header_length > payload || total > max_am_message || payload > total) {
    return w.protocol_error(ep, "first AM fragment with impossible lengths");
  }
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  ep->rx = rx_message{this, h->getMsgId(), total - header_length, 0};
  auto& rx = state_of<am_ep_state>(*ep);
  rx.id = h->getAmId();
  rx.flags = h->getFlags();
  rx.buffer = nullptr;
  const uint8_t* body = data + used;
  rx.header.assign(body, body + header_length);
  take_fragment(ep, body + header_length, payload - header_length);
}

void am_protocol::on_fragment(const uint8_t* data, size_t length) {
  const uint8_t* payload = nullptr;
  size_t bytes = 0;
  endpoint_impl* ep = accept_fragment(w, *this, data, length, &payload, &bytes);
  if (ep != nullptr) take_fragment(ep, payload, bytes);
}

void am_protocol::take_fragment(endpoint_impl* ep, const uint8_t* data, size_t length) {
  rx_message& message = ep->rx;
  auto& rx = state_of<am_ep_state>(*ep);
  const handler* found = find_handler(rx.id);
  const bool first = message.received == 0 && rx.buffer == nullptr;
  if (found == nullptr) {
    if (first) {
      ++ep->counters_.errors;
      COMM_LOG(error, "am", "%s: no handler for active message %u from %s; dropped",
               w.params.name.c_str(), rx.id, ep->peer_name_.c_str());
    }
  } else if (found->flags & am_flag_whole_msg) {
    if (rx.buffer == nullptr) {
      // Counted for the whole announced length at once: that is what the buffer takes.
      if (!w.charge_am_rx(ep, message.total)) return;
      rx.buffer = aligned_block(w.params.am_alignment, message.total);
      if (rx.buffer == nullptr) {
        w.release_am_rx(ep, message.total);
        return w.protocol_error(ep, "no memory to reassemble an AM");
      }
    }
    std::memcpy(rx.buffer + message.received, data, length);
  } else {
    unsigned attr = (first ? am_recv_first : 0u) |
                    (message.received + length < message.total ? am_recv_more : 0u);
    deliver(ep, rx.id, rx.flags, rx.header.data(), rx.header.size(), const_cast<uint8_t*>(data),
            length, attr, message.received, message.total, message.msg_id, false);
  }
  message.received += length;
  if (message.received < message.total) return;
  uint8_t* whole = rx.buffer;
  const uint16_t id = rx.id;
  const uint16_t flags = rx.flags;
  const size_t total = message.total;
  const uint64_t msg_id = message.msg_id;
  std::vector<uint8_t> header = std::move(rx.header);
  rx.header.clear();
  rx.buffer = nullptr;
  message = rx_message{};
  if (whole != nullptr) {
    w.release_am_rx(ep, total);
    deliver(ep, id, flags, header.data(), header.size(), whole, total, am_recv_first, 0, total,
            msg_id, true);
  }
}

void am_protocol::drop_fragments(endpoint_impl& ep) {
  if (auto* rx = find_state<am_ep_state>(ep)) {
    if (rx->buffer != nullptr) {
      w.release_am_rx(&ep, ep.rx.total);
      std::free(rx->buffer);
      rx->buffer = nullptr;
    }
    rx->header.clear();
  }
  ep.rx = rx_message{};
}

// -- rendezvous AMs ------------------------------------------------------------------------------

void am_protocol::fetch(endpoint_impl* ep, deferred_am& am) {
  const handler* found = find_handler(am.id);
  uint8_t* buffer = found != nullptr ? take_large(am.data.length) : nullptr;
  request* req = w.alloc_request(am_recv_ops, request_params{});
  auto& s = req->init<am_recv_state>();
  s.id = am.id;
  s.flags = am.flags;
  s.length = buffer != nullptr ? am.data.length : 0;
  req->header = std::move(am.header);
  req->iov.assign(1, iov_entry{buffer, s.length});
  if (buffer == nullptr) {
    ++ep->counters_.errors;
    COMM_LOG(error, "rndv", "%s: cannot take rendezvous AM %u (%s); refused",
             w.params.name.c_str(), am.id, found == nullptr ? "no handler" : "no memory");
    req->st = status::no_elem;
  } else {
    // Counted until the handler has it (on_announcement checked that it fits).
    ep->am_rx_bytes += s.length;
    w.am_rx_bytes += s.length;
  }
  module_of<rndv_protocol>(w).start_fetch(req, s.fetch, ep, am.data.sreq, am.data.address,
                                          s.length, am.data.rkey.data(), am.data.rkey.size(),
                                          fetched);
}

void am_protocol::fetched(request* req, status outcome) {
  auto& s = req->as<am_recv_state>();
  worker_impl& w = *req->owner;
  am_protocol& am = module_of<am_protocol>(w);
  endpoint_impl* ep = s.fetch.ep;
  uint8_t* data = req->iov.empty() ? nullptr : static_cast<uint8_t*>(req->iov[0].buffer);
  const size_t length = s.length;
  const uint16_t id = s.id;
  const uint16_t flags = s.flags;
  std::vector<uint8_t> header = std::move(req->header);
  w.free_request(req);
  if (data == nullptr) return;
  w.release_am_rx(ep, length);
  if (outcome != status::ok) {
    am.release_large(data);
    return;
  }
  am.deliver(ep, id, flags, header.data(), header.size(), data, length, am_recv_first, 0, length,
             0, true);
}

void am_protocol::refuse(endpoint_impl* ep, const deferred_am& am, const char* variable,
                         size_t limit) {
  const bool log = w.count_limit_error();
  ++ep->counters_.errors;
  if (log) {
    COMM_LOG(warn, "limits", "%s: refused rendezvous AM %u of %zu bytes from %s: beyond %s=%zu",
             w.params.name.c_str(), am.id, am.data.length, ep->peer_name_.c_str(), variable,
             limit);
  }
  acknowledge(ep, am.data.sreq, am.data.address, status::exceeds_limit);
}

void am_protocol::acknowledge(endpoint_impl* ep, uint64_t sreq, uint64_t address, status st) {
  // A fetch of nothing, which ends at once: the sender's request completes with `st` (ok for
  // in_progress).
  request* req = w.alloc_request(am_recv_ops, request_params{});
  auto& s = req->init<am_recv_state>();
  req->st = st;
  module_of<rndv_protocol>(w).start_fetch(req, s.fetch, ep, sreq, address, 0, nullptr, 0,
                                          fetched);
}

// -- rendezvous AMs as descriptors ---------------------------------------------------------------

void am_protocol::offer(endpoint_impl& ep, const handler& h, deferred_am& am) {
  size_t limit = 0;
  if (const char* full = held_limit(0, &limit)) return refuse(&ep, am, full, limit);
  void* handle = next_handle();
  const size_t length = am.data.length;
  descs_.emplace(handle, am_desc{.ep = &ep, .data = std::move(am.data)});
  am_recv_params p;
  p.attr = am_recv_first | am_recv_rndv;
  p.total_length = length;
  if (am.flags & am_wire_reply_ep) {
    p.attr |= am_recv_reply_ep;
    p.reply_ep = &ep;
  }
  const status st = h.cb(h.arg, am.header.data(), am.header.size(), handle, length, p);
  auto it = descs_.find(handle);
  if (it == descs_.end()) return;  // used up in the call
  if (st == status::in_progress) {
    it->second.kept = true;
    ++held_;
    return;
  }
  drop_desc(it);
}

void am_protocol::drop_desc(desc_table::iterator d) {
  const am_desc& desc = d->second;
  if (desc.ep != nullptr && !desc.cancelled) {
    acknowledge(desc.ep, desc.data.sreq, desc.data.address, status::in_progress);
  }
  free_desc(d);
}

void am_protocol::free_desc(desc_table::iterator d) {
  if (d->second.kept) --held_;
  descs_.erase(d);
}

op am_protocol::recv_data(void* desc, const iov_entry* entries, size_t count,
                          am_recv_data_callback cb, const request_params& params) {
  if (count > 0 && entries == nullptr) return op{status::invalid_param, nullptr};
  if (is_handle(desc)) {
    auto d = descs_.find(desc);
    if (d != descs_.end()) return fetch_desc(d, entries, count, cb, params);
  } else if (persistent_.count(desc) != 0) {
    return copy_kept(desc, entries, count, cb, params);
  }
  COMM_LOG(error, "worker", "am_recv_data(%p): not a descriptor or data held by a handler", desc);
  return op{status::invalid_param, nullptr};
}

op am_protocol::fetch_desc(desc_table::iterator d, const iov_entry* entries, size_t count,
                           am_recv_data_callback cb, const request_params& params) {
  am_desc& desc = d->second;
  request* req = w.alloc_request(am_data_ops, params);
  auto& s = req->init<am_data_state>();
  req->set_iov(entries, count);
  s.length = desc.data.length;
  s.written = std::min(s.length, capacity_of(entries, count));
  // A descriptor whose sender cancelled or is gone ends here; nothing goes to the sender.
  endpoint_impl* ep = desc.cancelled ? nullptr : desc.ep;
  if (desc.cancelled) {
    req->st = status::canceled;
  } else if (ep == nullptr) {
    req->st = desc.gone;
  }
  const uint64_t sreq = desc.data.sreq;
  const uint64_t address = desc.data.address;
  const std::vector<uint8_t> rkey = std::move(desc.data.rkey);
  free_desc(d);
  // A fetch that ends at once is an immediate completion (no callback), like any other.
  const bool report_now = !(params.flags & request_no_immediate_completion);
  s.cb = report_now ? nullptr : cb;
  req->user_visible = true;
  if (ep == nullptr) {
    w.complete(req, req->st);
  } else {
    module_of<rndv_protocol>(w).start_fetch(req, s.fetch, ep, sreq, address, s.written,
                                            rkey.data(), rkey.size(), data_fetched);
  }
  if (report_now && req->finished) {
    const status st = req->st;
    w.free_request(req);
    return op{st, nullptr};
  }
  req->as<am_data_state>().cb = cb;
  return op{status::in_progress, req};
}

void am_protocol::data_fetched(request* req, status outcome) {
  const auto& s = req->as<am_data_state>();
  const bool truncated = outcome == status::ok && s.written < s.length;
  req->owner->complete(req, truncated ? status::message_truncated : outcome);
}

op am_protocol::copy_kept(void* data, const iov_entry* entries, size_t count,
                          am_recv_data_callback cb, const request_params& params) {
  const size_t length = persistent_.find(data)->second.length;
  const size_t written = std::min(length, capacity_of(entries, count));
  iov_scatter({entries, count}, 0, static_cast<const uint8_t*>(data), written);
  release_data(data);
  const status st = written < length ? status::message_truncated : status::ok;
  if (!(params.flags & request_no_immediate_completion)) return op{st, nullptr};
  request* req = w.alloc_request(am_data_ops, params);
  auto& s = req->init<am_data_state>();
  s.cb = cb;
  s.length = length;
  s.written = written;
  req->user_visible = true;
  w.complete(req, st);
  return op{status::in_progress, req};
}

void am_protocol::on_announcement(endpoint_impl& ep, uint16_t id, uint16_t flags,
                                  std::vector<uint8_t> header, rndv_announcement&& a) {
  deferred_am am{std::move(a), id, flags, std::move(header), 0};
  const handler* found = find_handler(id);
  if (found != nullptr && !(found->flags & am_flag_fetch_rndv)) return offer(ep, *found, am);
  const peer_limits& c = w.ctx.cfg().limits;
  if (am.data.length > c.am_rx_ep_max_bytes) {
    return refuse(&ep, am, "COMM_AM_RX_EP_MAX_BYTES", c.am_rx_ep_max_bytes);
  }
  if (am.data.length > c.am_rx_max_bytes) {
    return refuse(&ep, am, "COMM_AM_RX_MAX_BYTES", c.am_rx_max_bytes);
  }
  auto& waiting = state_of<am_ep_state>(ep).deferred;
  size_t limit = 0;
  if (waiting.empty() && w.am_rx_limit(&ep, am.data.length, &limit) == nullptr) {
    fetch(&ep, am);
    return;
  }
  am.charged = sizeof(deferred_am) + am.data.rkey.size() + am.header.size();
  if (!w.charge_unexpected(&ep, am.charged, 1)) return;
  waiting.push_back(std::move(am));
  ++deferred_;
  deferred_changed();
}

void am_protocol::progress() {
  if (starting_deferred_) return;
  starting_deferred_ = true;
  size_t limit = 0;
  for (size_t i = 0; i < w.ep_table.size() && deferred_ != 0; ++i) {
    // Re-read after each fetch: a handler run by it may close the endpoint.
    for (endpoint_impl* ep; (ep = w.ep_table[i]) != nullptr;) {
      auto* s = find_state<am_ep_state>(*ep);
      if (s == nullptr || s->deferred.empty()) break;
      if (w.am_rx_limit(ep, s->deferred.front().data.length, &limit) != nullptr) break;
      deferred_am am = std::move(s->deferred.front());
      s->deferred.pop_front();
      --deferred_;
      w.uncharge_unexpected(ep, am.charged, 1);
      fetch(ep, am);
    }
  }
  starting_deferred_ = false;
  deferred_changed();
}

bool am_protocol::drop_announcement(endpoint_impl& ep, uint64_t sreq) {
  // A descriptor a handler holds is answered now (the caller sends the cancel's answer); its
  // later fetch fails with CANCELED and sends nothing more.
  bool held = false;
  for (auto& [handle, d] : descs_) {
    if (d.ep != &ep || d.data.sreq != sreq) continue;
    d.cancelled = true;
    held = true;
  }
  if (held) return true;
  auto* s = find_state<am_ep_state>(ep);
  if (s == nullptr) return false;
  for (auto it = s->deferred.begin(); it != s->deferred.end(); ++it) {
    if (it->data.sreq != sreq) continue;
    w.uncharge_unexpected(&ep, it->charged, 1);
    s->deferred.erase(it);
    --deferred_;
    deferred_changed();
    return true;
  }
  return false;
}

// -- hooks ---------------------------------------------------------------------------------------

void am_protocol::forget_peer(endpoint_impl& ep, held_fate) {
  auto* s = find_state<am_ep_state>(ep);
  if (s == nullptr) return;
  for (const deferred_am& am : s->deferred) w.uncharge_unexpected(&ep, am.charged, 1);
  deferred_ -= s->deferred.size();
  s->deferred.clear();
  deferred_changed();
}

void am_protocol::endpoint_failed(endpoint_impl& ep, status reason) {
  if (ep.rx.owner == this) drop_fragments(ep);
  orphan_descs(ep, reason);
}

void am_protocol::endpoint_deleted(endpoint_impl& ep) {
  if (ep.rx.owner == this) drop_fragments(ep);
  orphan_descs(ep, status::not_connected);
}

void am_protocol::orphan_descs(endpoint_impl& ep, status reason) {
  for (auto& [handle, d] : descs_) {
    if (d.ep != &ep) continue;
    d.ep = nullptr;
    d.gone = reason;
  }
}

void am_protocol::teardown() {
  if (descs_.empty() && persistent_.empty()) return;
  COMM_LOG(warn, "am",
           "%s: destroyed while handlers kept %zu rendezvous descriptors and %zu blocks of AM "
           "data (%zu B) never released (am_data_release); freed",
           w.params.name.c_str(), descs_.size(), persistent_.size(), held_bytes_);
  descs_.clear();
}

void am_protocol::info(std::ostream& out) const {
  out << "active messages: deferred rendezvous AMs " << deferred_ << ", data held by handlers "
      << persistent_.size() << ", rendezvous descriptors held " << descs_.size()
      << "; kept past the call " << held_ << " of " << w.ctx.cfg().limits.am_held_max << " ("
      << held_bytes_ << " of " << w.ctx.cfg().limits.am_held_max_bytes << " B)\n";
}

}  // namespace detail

// -- public API ----------------------------------------------------------------------------------

op endpoint::am_send(uint16_t id, const void* header, size_t header_length, const void* data,
                     size_t length, const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  am_protocol& am = module_of<am_protocol>(w);
  if (header_length > am.max_header() || (header_length != 0 && header == nullptr) ||
      (length != 0 && data == nullptr && params.pack == nullptr)) {
    return op{status::invalid_param, nullptr};
  }
  if (ep.state == endpoint_impl::phase::closing) return op{status::not_connected, nullptr};
  request* req = w.alloc_request(detail::am_send_ops, params);
  auto& s = req->init<detail::am_send_state>();
  s.id = id;
  s.flags = (params.flags & request_reply_endpoint) ? detail::am_wire_reply_ep : 0;
  const auto* user = static_cast<const uint8_t*>(header);
  req->header.assign(user, user + header_length);
  req->iov.push_back(iov_entry{const_cast<void*>(data), length});
  s.send.length = length;
  return detail::start_send(ep, req);
}

size_t worker::max_am_header() const noexcept {
  return module_of<am_protocol>(impl(*this)).max_header();
}

status worker::set_am_handler(uint16_t id, am_callback cb, void* arg, unsigned flags) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  return module_of<am_protocol>(w).set_handler(id, cb, arg, flags);
}

void worker::am_data_release(void* data) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  module_of<am_protocol>(w).release_data(data);
}

op worker::am_recv_data(void* desc, void* buffer, size_t length, am_recv_data_callback cb,
                        const request_params& params) {
  const iov_entry entry{buffer, length};
  return am_recv_data_iov(desc, &entry, 1, cb, params);
}

op worker::am_recv_data_iov(void* desc, const iov_entry* entries, size_t count,
                            am_recv_data_callback cb, const request_params& params) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  return module_of<am_protocol>(w).recv_data(desc, entries, count, cb, params);
}

bool worker::am_data_detach(void* data) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  return module_of<am_protocol>(w).detach_data(data);
}

}  // namespace comm
