// The stream module: sends through the send engine, the stream of each endpoint on arrival
// (posted receives first, then the buffer under the stream limits), receives, the data-ready
// list and the public stream API.
#include "stream.hpp"

#include "iov.hpp"
#include "protocols.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <utility>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::module_of;
using detail::stream_protocol;
using detail::worker_impl;

namespace detail {
namespace {

/// Smallest buffer block: small payloads share one.
constexpr size_t min_block = 4096;
/// What a block costs besides its bytes (its descriptor), counted against the limits.
constexpr size_t block_overhead = 64;

/// Buffered stream bytes: [begin, end) of a block of `capacity` bytes.
struct block {
  uint8_t* data = nullptr;
  size_t capacity = 0;
  size_t begin = 0;
  size_t end = 0;
};

// -- sends ---------------------------------------------------------------------------------------

size_t encode_first(request* req, const send_progress& s, bool whole, uint8_t* out,
                    tl::am_id* id) {
  stream_protocol& m = module_of<stream_protocol>(*req->owner);
  const uint32_t dst = req->ep->remote_id;
  if (whole) {
    m.hdr_data.fields().setDstEp(dst);
    *id = wire_id(stream_msg::data);
    return m.hdr_data.copy_to(out);
  }
  auto& h = m.hdr_first.fields();
  h.setDstEp(dst);
  h.setMsgId(s.msg_id);
  h.setTotalLength(s.length);
  *id = wire_id(stream_msg::first);
  return m.hdr_first.copy_to(out);
}

size_t whole_header_size(const request*) {
  return wire::header_size<wire::schema::StreamData>();
}

const message_framing framing{encode_first, whole_header_size, nullptr,
                              wire_id(stream_msg::fragment)};

status progress_send(request* req) {
  return send_message(req, req->as<stream_send_state>().send, framing);
}

status cancel_send(request* req, cancel_mode mode) {
  if (req->ep == nullptr) return status::busy;
  return req->ep->cancel_pending(req, mode);
}

const request_ops stream_send_ops{
    .name = "stream_send", .progress = progress_send, .cancel = cancel_send, .events = wakeup_tx};

// -- receives ------------------------------------------------------------------------------------

void notify_recv(request* req, status st) {
  if (req->params.stream_recv_cb != nullptr) {
    req->params.stream_recv_cb(req, st, req->as<stream_recv_state>().received,
                               req->params.user_data);
  }
}

status cancel_recv(request* req, cancel_mode mode) {
  worker_impl& w = *req->owner;
  if (!module_of<stream_protocol>(w).unpost(req)) return status::busy;
  if (mode == cancel_mode::force) {
    req->finished = true;
    req->st = status::canceled;
    w.free_request(req);
    return status::ok;
  }
  w.complete(req, status::canceled);
  return status::ok;
}

const request_ops stream_recv_ops{
    .name = "stream_recv", .notify = notify_recv, .cancel = cancel_recv, .events = wakeup_rx};

/// True while `ep` is in its worker's table (not closed and released).
bool live(worker_impl& w, const endpoint_impl* ep) { return w.find_ep(ep->id) == ep; }

}  // namespace

/// The module's state on an endpoint: the receives posted, in order, and the bytes buffered.
struct stream_protocol::ep_state : endpoint_state {
  request* recv_head = nullptr;                 ///< receives posted, oldest first
  request* recv_tail = nullptr;
  std::deque<block> blocks;                     ///< buffered bytes, oldest first
  size_t buffered = 0;                          ///< stream bytes in `blocks`
  size_t charged = 0;                           ///< what `blocks` count against the limits
  bool ready = false;                           ///< in the ready list
  endpoint_impl* ep = nullptr;                  ///< its endpoint, while ready
  ep_state* ready_prev = nullptr;               ///< neighbours in the ready list
  ep_state* ready_next = nullptr;
};

stream_protocol::stream_protocol(worker_impl& owner, unsigned index) : protocol(owner, index) {
  receive<&stream_protocol::on_data>(stream_msg::data);
  receive<&stream_protocol::on_first>(stream_msg::first);
  receive<&stream_protocol::on_fragment>(stream_msg::fragment);
}

stream_protocol::~stream_protocol() noexcept {
  for (auto& [data, start] : lent_) std::free(start);
  std::free(spare_);
}

uint8_t* stream_protocol::take_block(size_t capacity) {
  if (capacity == min_block && spare_ != nullptr) return std::exchange(spare_, nullptr);
  return static_cast<uint8_t*>(std::malloc(capacity));
}

void stream_protocol::drop_block(uint8_t* data, size_t capacity) {
  if (capacity == min_block && spare_ == nullptr) {
    spare_ = data;
  } else {
    std::free(data);
  }
}

// -- arrival -------------------------------------------------------------------------------------

void stream_protocol::on_data(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::StreamData>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated stream data header");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "stream data for an unknown endpoint");
  if (ep == nullptr) return;
  if (ep->rx.owner != nullptr) {
    return w.protocol_error(ep, "new message before the previous one ended");
  }
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += length - used;
  take(ep, data + used, length - used);
}

void stream_protocol::on_first(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::StreamFirst>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated stream header");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "stream data for an unknown endpoint");
  if (ep == nullptr) return;
  const size_t payload = length - used;
  const uint64_t total = h->getTotalLength();
  if (ep->rx.owner != nullptr) {
    return w.protocol_error(ep, "new message before the previous one ended");
  }
  if (payload >= total) return w.protocol_error(ep, "first stream fragment as long as the send");
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  // What the fragments will bring is not allocated ahead: each is buffered as it comes.
  ep->rx = rx_message{this, h->getMsgId(), total, payload};
  take(ep, data + used, payload);
}

void stream_protocol::on_fragment(const uint8_t* data, size_t length) {
  const uint8_t* payload = nullptr;
  size_t bytes = 0;
  endpoint_impl* ep = accept_fragment(w, *this, data, length, &payload, &bytes);
  if (ep == nullptr) return;
  ep->rx.received += bytes;
  if (ep->rx.received == ep->rx.total) ep->rx = rx_message{};
  take(ep, payload, bytes);
}

void stream_protocol::take(endpoint_impl* ep, const uint8_t* data, size_t length) {
  auto& s = state_of<ep_state>(*ep);
  while (length != 0 && s.recv_head != nullptr) {
    request* req = s.recv_head;
    auto& r = req->as<stream_recv_state>();
    const size_t n = std::min(length, r.length - r.received);
    iov_scatter(req->iov, r.received, data, n);
    r.received += n;
    data += n;
    length -= n;
    const bool full = r.received == r.length;
    if (!full && (length != 0 || r.received < r.min_length)) continue;
    s.recv_head = r.next;
    if (s.recv_head == nullptr) s.recv_tail = nullptr;
    w.complete(req, status::ok);
    // Its callback may have closed the endpoint or failed it: what is left goes nowhere.
    if (!live(w, ep) || ep->state == endpoint_impl::phase::failed) return;
  }
  if (length != 0) buffer(ep, s, data, length);
}

void stream_protocol::buffer(endpoint_impl* ep, ep_state& s, const uint8_t* data,
                             size_t length) {
  w.note_events(wakeup_rx);  // bytes wait for a receive: worker::wait for rx ends
  if (!s.blocks.empty()) {
    block& last = s.blocks.back();
    const size_t n = std::min(length, last.capacity - last.end);
    std::memcpy(last.data + last.end, data, n);
    last.end += n;
    s.buffered += n;
    data += n;
    length -= n;
  }
  if (length != 0) {
    const peer_limits& c = w.ctx.cfg().limits;
    const size_t capacity = std::max(length, min_block);
    const size_t cost = capacity + block_overhead;
    if (s.charged + cost > c.stream_rx_ep_max_bytes) {
      return w.exceed_limit(ep, "COMM_STREAM_RX_EP_MAX_BYTES", c.stream_rx_ep_max_bytes);
    }
    if (buffered_total_ + cost > c.stream_rx_max_bytes) {
      return w.exceed_limit(ep, "COMM_STREAM_RX_MAX_BYTES", c.stream_rx_max_bytes);
    }
    uint8_t* bytes = take_block(capacity);
    if (bytes == nullptr) return w.protocol_error(ep, "no memory to buffer stream data");
    std::memcpy(bytes, data, length);
    s.blocks.push_back(block{bytes, capacity, 0, length});
    s.buffered += length;
    s.charged += cost;
    buffered_total_ += cost;
  }
  update_ready(*ep, s);
}

// -- receives ------------------------------------------------------------------------------------

size_t stream_protocol::drain(endpoint_impl& ep, ep_state& s, std::span<const iov_entry> entries,
                              size_t offset, size_t length) {
  size_t moved = 0;
  while (moved < length && !s.blocks.empty()) {
    block& b = s.blocks.front();
    const size_t n = std::min(length - moved, b.end - b.begin);
    iov_scatter(entries, offset + moved, b.data + b.begin, n);
    b.begin += n;
    moved += n;
    if (b.begin < b.end) break;
    const size_t cost = b.capacity + block_overhead;
    drop_block(b.data, b.capacity);
    s.blocks.pop_front();
    s.charged -= cost;
    buffered_total_ -= cost;
  }
  s.buffered -= moved;
  update_ready(ep, s);
  return moved;
}

size_t stream_protocol::recv_now(endpoint_impl& ep, void* buffer, size_t length,
                                 size_t min_length) {
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr || s->recv_head != nullptr || s->buffered < min_length) return 0;
  const iov_entry entry{buffer, length};
  return drain(ep, *s, {&entry, 1}, 0, length);
}

op stream_protocol::post_recv(endpoint_impl& ep, request* req) {
  auto& s = state_of<ep_state>(ep);
  auto& r = req->as<stream_recv_state>();
  req->ep = &ep;
  if (s.recv_head == nullptr) r.received = drain(ep, s, req->iov, 0, r.length);
  if (r.received >= r.min_length) {
    req->user_visible = true;
    w.complete(req, status::ok);
    return op{status::in_progress, req};
  }
  if (s.recv_tail != nullptr) {
    s.recv_tail->as<stream_recv_state>().next = req;
  } else {
    s.recv_head = req;
  }
  s.recv_tail = req;
  return w.in_progress(req);
}

bool stream_protocol::unpost(request* req) {
  if (req->ep == nullptr) return false;
  auto* s = find_state<ep_state>(*req->ep);
  if (s == nullptr) return false;
  request* prev = nullptr;
  for (request* r = s->recv_head; r != nullptr; prev = r, r = r->as<stream_recv_state>().next) {
    if (r != req) continue;
    request* next = r->as<stream_recv_state>().next;
    (prev != nullptr ? prev->as<stream_recv_state>().next : s->recv_head) = next;
    if (s->recv_tail == r) s->recv_tail = prev;
    return true;
  }
  return false;
}

void stream_protocol::complete_recvs(endpoint_impl& ep, ep_state& s, status st) {
  while (s.recv_head != nullptr) {
    request* req = s.recv_head;
    s.recv_head = req->as<stream_recv_state>().next;
    if (s.recv_head == nullptr) s.recv_tail = nullptr;
    w.complete(req, st);
  }
}

void* stream_protocol::lend_block(endpoint_impl& ep, size_t* length) {
  *length = 0;
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr || s->recv_head != nullptr || s->blocks.empty()) return nullptr;
  const block b = s->blocks.front();
  s->blocks.pop_front();
  const size_t cost = b.capacity + block_overhead;
  s->charged -= cost;
  buffered_total_ -= cost;
  s->buffered -= b.end - b.begin;
  update_ready(ep, *s);
  void* data = b.data + b.begin;
  lent_[data] = b.data;
  *length = b.end - b.begin;
  return data;
}

bool stream_protocol::release_block(void* data) {
  auto it = lent_.find(data);
  if (it == lent_.end()) return false;
  std::free(it->second);
  lent_.erase(it);
  return true;
}

size_t stream_protocol::buffered(const endpoint_impl& ep) const {
  const auto* s = find_state<ep_state>(ep);
  return s == nullptr ? 0 : s->buffered;
}

// -- the ready list ------------------------------------------------------------------------------

void stream_protocol::update_ready(endpoint_impl& ep, ep_state& s) {
  const bool ready = s.buffered != 0 && s.recv_head == nullptr;
  if (ready == s.ready) return;
  s.ep = &ep;
  if (ready) {
    link_ready(s);
  } else {
    unlink_ready(s);
  }
}

void stream_protocol::link_ready(ep_state& s) {
  s.ready_prev = ready_tail_;
  s.ready_next = nullptr;
  (ready_tail_ != nullptr ? ready_tail_->ready_next : ready_head_) = &s;
  ready_tail_ = &s;
  s.ready = true;
  ++ready_count_;
}

void stream_protocol::unlink_ready(ep_state& s) {
  (s.ready_prev != nullptr ? s.ready_prev->ready_next : ready_head_) = s.ready_next;
  (s.ready_next != nullptr ? s.ready_next->ready_prev : ready_tail_) = s.ready_prev;
  s.ready_prev = s.ready_next = nullptr;
  s.ready = false;
  --ready_count_;
}

size_t stream_protocol::poll(stream_poll_entry* out, size_t max) {
  const size_t n = std::min(max, ready_count_);
  for (size_t i = 0; i < n; ++i) {
    ep_state& s = *ready_head_;
    out[i] = stream_poll_entry{s.ep, s.buffered};
    unlink_ready(s);  // to the back: the next poll starts with the others
    link_ready(s);
  }
  return n;
}

// -- hooks ---------------------------------------------------------------------------------------

void stream_protocol::free_blocks(endpoint_impl& ep, ep_state& s) {
  for (const block& b : s.blocks) drop_block(b.data, b.capacity);
  s.blocks.clear();
  buffered_total_ -= s.charged;
  s.charged = 0;
  s.buffered = 0;
  update_ready(ep, s);
}

void stream_protocol::forget_peer(endpoint_impl& ep, held_fate fate) {
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr) return;
  // Kept on a failed endpoint: the bytes that arrived before the failure stay receivable.
  if (fate == held_fate::keep) return;
  free_blocks(ep, *s);
  // Going away (closed): a receive still waiting can never complete.
  if (fate == held_fate::detach) complete_recvs(ep, *s, status::canceled);
}

void stream_protocol::endpoint_failed(endpoint_impl& ep, status reason) {
  if (ep.rx.owner == this) ep.rx = rx_message{};
  auto* s = find_state<ep_state>(ep);
  if (s != nullptr) complete_recvs(ep, *s, reason);
}

void stream_protocol::endpoint_deleted(endpoint_impl& ep) {
  if (ep.rx.owner == this) ep.rx = rx_message{};
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr) return;
  free_blocks(ep, *s);
  complete_recvs(ep, *s, status::canceled);
}

void stream_protocol::info(std::ostream& out) const {
  out << "streams: " << ready_count_ << " endpoints with data ready, buffered " << buffered_total_
      << " of " << w.ctx.cfg().limits.stream_rx_max_bytes << " B, blocks lent " << lent_.size()
      << '\n';
}

}  // namespace detail

// -- public API ----------------------------------------------------------------------------------

op endpoint::stream_send(const void* buffer, size_t length, const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  constexpr uint32_t slow_flags =
      request_no_immediate_completion | request_force_zcopy | request_force_bcopy;
  constexpr size_t header = wire::header_size<wire::schema::StreamData>();
  // The common small send: straight to the transport, no request (as tag_send does).
  if (!(params.flags & slow_flags) && params.pack == nullptr &&
      (buffer != nullptr || length == 0) && detail::short_path_open(ep, header + length)) {
    auto& writer = module_of<stream_protocol>(w).hdr_data;
    writer.fields().setDstEp(ep.remote_id);
    op result;
    if (detail::try_send_short(ep, detail::wire_id(detail::stream_msg::data), writer.bytes(),
                               header, buffer, length, params.flags, &result)) {
      return result;
    }
  }
  iov_entry entry{const_cast<void*>(buffer), length};
  return stream_send_iov(&entry, 1, params);
}

op endpoint::stream_send_iov(const iov_entry* entries, size_t count,
                             const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  if (count > 0 && entries == nullptr) return op{status::invalid_param, nullptr};
  size_t length = 0;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length != 0 && entries[i].buffer == nullptr && params.pack == nullptr) {
      return op{status::invalid_param, nullptr};
    }
    length += entries[i].length;
  }
  if (ep.state == endpoint_impl::phase::closing) return op{status::not_connected, nullptr};
  request* req = w.alloc_request(detail::stream_send_ops, params);
  auto& s = req->init<detail::stream_send_state>();
  req->set_iov(entries, count);
  s.send.length = length;
  return detail::start_send(ep, req);
}

op endpoint::stream_recv(void* buffer, size_t length, size_t* received,
                         const request_params& params) {
  const size_t min_length = (params.flags & request_stream_waitall) ? length : 1;
  return stream_recv(buffer, length, min_length, received, params);
}

op endpoint::stream_recv(void* buffer, size_t length, size_t min_length, size_t* received,
                         const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  if (min_length == 0 || min_length > length || buffer == nullptr) {
    return op{status::invalid_param, nullptr};
  }
  stream_protocol& m = module_of<stream_protocol>(w);
  const bool failed = ep.state == endpoint_impl::phase::failed;
  if (ep.state == endpoint_impl::phase::closing) return op{status::not_connected, nullptr};
  if (!(params.flags & request_no_immediate_completion)) {
    // Enough is buffered already: copy it out without a request.
    const size_t n = m.recv_now(ep, buffer, length, min_length);
    if (n != 0) {
      if (received != nullptr) *received = n;
      return op{};
    }
  }
  // A failed endpoint brings no more: what is buffered is all a receive can get.
  if (failed && m.buffered(ep) < min_length) return op{ep.failure, nullptr};
  request* req = w.alloc_request(detail::stream_recv_ops, params);
  auto& s = req->init<detail::stream_recv_state>();
  s.length = length;
  s.min_length = min_length;
  req->iov.push_back(iov_entry{buffer, length});
  return m.post_recv(ep, req);
}

void* endpoint::stream_recv_data(size_t* length) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  size_t ignored = 0;
  return module_of<stream_protocol>(ep.owner).lend_block(ep, length != nullptr ? length : &ignored);
}

status endpoint::stream_data_release(void* data) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  return module_of<stream_protocol>(ep.owner).release_block(data) ? status::ok
                                                                   : status::invalid_param;
}

size_t worker::stream_poll(stream_poll_entry* out, size_t max) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (out == nullptr) return 0;
  return module_of<stream_protocol>(w).poll(out, max);
}

}  // namespace comm
