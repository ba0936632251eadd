// Active messages: the send entry point and delivery to the handlers, whole or per fragment, with
// persistent data and reply endpoints.
#include "worker_impl.hpp"

#include <comm/log.hpp>
#include <comm/memory.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
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

}  // namespace

void worker_impl::deliver_am(endpoint_impl* ep, uint16_t id, uint16_t wire_flags,
                             const uint8_t* header, size_t header_length, uint8_t* data,
                             size_t length, unsigned attr, size_t offset, size_t total,
                             uint64_t msg_id, bool data_is_ours) {
  const am_handler* found = find_am_handler(id);
  if (found == nullptr) {
    ++ep->counters_.errors;
    COMM_LOG(error, "am", "%s: no handler for active message %u from %s; dropped",
             params.name.c_str(), id, ep->peer_name_.c_str());
    if (data_is_ours) release_large(data);
    return;
  }
  const am_handler h = *found;
  am_recv_params p;
  p.attr = attr;
  p.offset = offset;
  p.total_length = total;
  p.message_id = msg_id;
  if (wire_flags & am_wire_reply_ep) {
    p.attr |= am_recv_reply_ep;
    p.reply_ep = ep;
  }
  uint8_t* block = data_is_ours ? data : nullptr;
  const bool misaligned = reinterpret_cast<uintptr_t>(data) % params.am_alignment != 0;
  if (block == nullptr && ((h.flags & am_flag_persistent_data) || misaligned)) {
    block = aligned_block(params.am_alignment, length);
    if (block == nullptr) {
      ++ep->counters_.errors;
      COMM_LOG(error, "am", "%s: no memory for %zu bytes of AM %u; dropped", params.name.c_str(),
               length, id);
      return;
    }
    if (length != 0) std::memcpy(block, data, length);
    data = block;
  }
  if (block == nullptr) {
    h.cb(h.arg, header, header_length, data, length, p);
    return;
  }
  // Held before the call, so that the handler may detach it (worker::am_data_detach) inside.
  p.attr |= am_recv_data_persistent;
  persistent_data[data] = block;
  status st = h.cb(h.arg, header, header_length, data, length, p);
  if (st == status::in_progress) return;
  auto held = persistent_data.find(data);
  if (held == persistent_data.end()) return;  // detached by the handler
  persistent_data.erase(held);
  release_large(block);
}

uint8_t* worker_impl::take_large(size_t length) {
  length = std::max<size_t>(length, 1);
  for (size_t i = 0; i < large_free.size(); ++i) {
    const large_block b = large_free[i];
    if (b.capacity < length || b.capacity / 2 > length) continue;
    large_free.erase(large_free.begin() + static_cast<long>(i));
    large_free_bytes -= b.capacity;
    large_out[b.block] = b.capacity;
    return static_cast<uint8_t*>(b.block);
  }
  // Shareable (comm::mem_alloc), so that sending the block on is a mapped copy for a peer on this
  // host; page aligned, so only an alignment beyond a page needs the plain heap.
  constexpr size_t page = 4096;
  uint8_t* fresh = params.am_alignment <= page ? static_cast<uint8_t*>(mem_alloc(length))
                                               : aligned_block(params.am_alignment, length);
  if (fresh != nullptr) large_out[fresh] = length;
  return fresh;
}

void worker_impl::release_large(void* block) {
  constexpr size_t max_blocks = 4;
  constexpr size_t max_bytes = 64u << 20;
  auto it = large_out.find(block);
  if (it == large_out.end()) {
    std::free(block);  // persistent or reassembled data: aligned_block's (no heap lock needed)
    return;
  }
  const size_t capacity = it->second;
  large_out.erase(it);
  if (large_free.size() >= max_blocks || large_free_bytes + capacity > max_bytes) {
    mem_free(block);
    return;
  }
  large_free.push_back({block, capacity});
  large_free_bytes += capacity;
}

void worker_impl::on_am_single(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::ActiveMessage>(data, length, &used);
  if (!h) return protocol_error(nullptr, "truncated active message header");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "active message for an unknown endpoint");
  if (ep == nullptr) return;
  const size_t payload = length - used;
  const size_t header_length = h->getHeaderLength();
  if (header_length > payload) return protocol_error(ep, "AM user header beyond the message");
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  uint8_t* body = const_cast<uint8_t*>(data) + used;
  deliver_am(ep, h->getAmId(), h->getFlags(), body, header_length, body + header_length,
             payload - header_length, am_recv_first, 0, payload - header_length, 0, false);
}

void worker_impl::on_am_first(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::ActiveMessageFirst>(data, length, &used);
  if (!h) return protocol_error(nullptr, "truncated active message header");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "active message for an unknown endpoint");
  if (ep == nullptr) return;
  const size_t payload = length - used;
  const size_t header_length = h->getHeaderLength();
  const uint64_t total = h->getTotalLength();
  if (ep->rx.active) return protocol_error(ep, "new message before the previous one ended");
  if (header_length > payload || total > max_am_message || payload > total) {
    return protocol_error(ep, "first AM fragment with impossible lengths");
  }
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  rx_fragments& rx = ep->rx;
  rx = rx_fragments{};
  rx.active = true;
  rx.is_tag = false;
  rx.msg_id = h->getMsgId();
  rx.total = total - header_length;
  rx.am_id = h->getAmId();
  rx.am_flags = h->getFlags();
  const uint8_t* body = data + used;
  rx.am_header.assign(body, body + header_length);
  on_am_fragment(ep, body + header_length, payload - header_length);
}

void worker_impl::on_am_fragment(endpoint_impl* ep, const uint8_t* data, size_t length) {
  rx_fragments& rx = ep->rx;
  const am_handler* handler = find_am_handler(rx.am_id);
  const bool first = rx.received == 0 && rx.am_buffer == nullptr;
  if (handler == nullptr) {
    if (first) {
      ++ep->counters_.errors;
      COMM_LOG(error, "am", "%s: no handler for active message %u from %s; dropped",
               params.name.c_str(), rx.am_id, ep->peer_name_.c_str());
    }
  } else if (handler->flags & am_flag_whole_msg) {
    if (rx.am_buffer == nullptr) {
      // Counted for the whole announced length at once: that is what the buffer takes.
      if (!charge_am_rx(ep, rx.total)) return;
      rx.am_buffer = aligned_block(params.am_alignment, rx.total);
      if (rx.am_buffer == nullptr) {
        release_am_rx(ep, rx.total);
        return protocol_error(ep, "no memory to reassemble an AM");
      }
    }
    std::memcpy(rx.am_buffer + rx.received, data, length);
  } else {
    unsigned attr = (first ? am_recv_first : 0u) |
                    (rx.received + length < rx.total ? am_recv_more : 0u);
    deliver_am(ep, rx.am_id, rx.am_flags, rx.am_header.data(), rx.am_header.size(),
               const_cast<uint8_t*>(data), length, attr, rx.received, rx.total, rx.msg_id, false);
  }
  rx.received += length;
  if (rx.received < rx.total) return;
  uint8_t* whole = rx.am_buffer;
  const uint16_t id = rx.am_id;
  const uint16_t flags = rx.am_flags;
  const size_t total = rx.total;
  const uint64_t msg_id = rx.msg_id;
  std::vector<uint8_t> header = std::move(rx.am_header);
  rx = rx_fragments{};
  if (whole != nullptr) {
    release_am_rx(ep, total);
    deliver_am(ep, id, flags, header.data(), header.size(), whole, total, am_recv_first, 0, total,
               msg_id, true);
  }
}

}  // namespace detail

op endpoint::am_send(uint16_t id, const void* header, size_t header_length, const void* data,
                     size_t length, const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  if (header_length > w.max_am_header_ || (header_length != 0 && header == nullptr) ||
      (length != 0 && data == nullptr && params.pack == nullptr)) {
    return op{status::invalid_param, nullptr};
  }
  if (ep.state == endpoint_impl::phase::closing) return op{status::not_connected, nullptr};
  request* req = w.alloc_request(request::kind::am_send, params);
  req->am_id = id;
  req->am_flags = (params.flags & request_reply_endpoint) ? detail::am_wire_reply_ep : 0;
  const auto* user = static_cast<const uint8_t*>(header);
  req->control.assign(user, user + header_length);
  req->iov.assign(1, iov_entry{const_cast<void*>(data), length});
  req->length = length;
  return detail::start_send(ep, req);
}

}  // namespace comm
