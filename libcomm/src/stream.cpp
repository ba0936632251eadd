// The stream module: sends through the send engine (eager bcopy, or the rndv module's rendezvous
// when asked), the stream of each endpoint on arrival (posted receives first, then the buffer
// under the stream limits: kept transport descriptors or copies), rendezvous reads into the
// posted receives and the buffer with what arrives behind them, receives, the data-ready list
// and the public stream API.
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

status send_by_rndv(request* req) {
  auto& s = req->as<stream_send_state>();
  const rts_fields fields{.is_stream = true};
  return module_of<rndv_protocol>(*req->owner).send(req, s.rndv, s.send.length, fields);
}

/// True when a new send goes by rendezvous: one contiguous, non-empty buffer whose send asks
/// for it (request_force_rndv; the software rendezvous where the lane has no get).
bool wants_rndv(const request* req, const send_progress& s) {
  return (req->params.flags & request_force_rndv) &&
         !(req->params.flags & (request_force_bcopy | request_force_zcopy)) &&
         req->params.pack == nullptr && req->iov.size() == 1 && s.length != 0;
}

/// True when an eager send the engine would send zcopy goes bcopy instead: a stream's bytes are
/// copied on arrival anyway (into a posted receive or the buffer), and the transports' zcopy
/// costs the receiver a copy of its own first (shm: a cross-memory read into its private buffer)
/// and the sender a completion round trip. request_force_zcopy still gets zcopy.
bool prefers_bcopy(const request* req, const send_progress& s) {
  return !(req->params.flags & request_force_zcopy) && s.length >= req->owner->zcopy_thresh;
}

/// Eager sends: the engine never picks a rendezvous for streams (progress_send does, when the
/// send asks for one).
const message_framing framing{encode_first, whole_header_size, nullptr,
                              wire_id(stream_msg::fragment)};

status progress_send(request* req) {
  auto& s = req->as<stream_send_state>();
  const bool fresh = !req->has_started && s.send.offset == 0 && req->tl_completion.count == 0;
  if (s.send.proto == send_protocol::rndv || (fresh && wants_rndv(req, s.send))) {
    s.send.proto = send_protocol::rndv;
    return send_by_rndv(req);
  }
  if (fresh && prefers_bcopy(req, s.send)) {
    s.send.proto = send_protocol::bcopy;
    s.send.preset = true;
  }
  return send_message(req, s.send, framing);
}

void release_send(request* req) {
  module_of<rndv_protocol>(*req->owner).release_send(req->as<stream_send_state>().rndv);
}

status cancel_send(request* req, cancel_mode mode) {
  // An announced rendezvous has started: like any started send, it cannot be withdrawn.
  if (req->ep == nullptr) return status::busy;
  return req->ep->cancel_pending(req, mode);
}

const request_ops stream_send_ops{.name = "stream_send",
                                  .progress = progress_send,
                                  .release = release_send,
                                  .cancel = cancel_send,
                                  .events = wakeup_tx};

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

// -- rendezvous reads ----------------------------------------------------------------------------

void release_fetch(request* req) {
  module_of<rndv_protocol>(*req->owner).release_fetch(req->as<stream_fetch_state>().fetch);
}

/// The module's own request that reads a rendezvous into the stream (never the user's).
const request_ops stream_fetch_ops{.name = "stream_fetch", .release = release_fetch};

void fetched(request* req, status outcome) {
  module_of<stream_protocol>(*req->owner).end_fetch(req, outcome);
}

/// True while `ep` is in its worker's table (not closed and released).
bool live(worker_impl& w, const endpoint_impl* ep) { return w.find_ep(ep->id) == ep; }

/// Largest max_bcopy of an interface whose descriptors are kept: replacing a larger receive
/// buffer costs the transport more than the copy saves (tcp's 256 KiB ones, measured with
/// bench/bm_stream's unposted case).
constexpr size_t keep_desc_max = 65536;

/// What `length` buffered bytes count against the limits: a block of at least min_block, or a
/// kept descriptor counted as at least its interface's max_bcopy.
size_t block_cost(size_t length, tl::iface* kept_from) {
  const size_t held = kept_from != nullptr ? std::max(length, kept_from->attr().max_bcopy)
                                           : std::max(length, min_block);
  return held + block_overhead;
}

}  // namespace

/// The module's state on an endpoint: the receives posted, in order, the bytes buffered, and the
/// rendezvous read under way with what arrived behind it.
struct stream_protocol::ep_state : endpoint_state {
  request* recv_head = nullptr;                 ///< receives posted, oldest first
  request* recv_tail = nullptr;
  std::deque<stream_block> blocks;              ///< buffered bytes, oldest first
  size_t buffered = 0;                          ///< stream bytes in `blocks`
  size_t charged = 0;                           ///< what this endpoint counts against the limits
  bool ready = false;                           ///< in the ready list
  endpoint_impl* ep = nullptr;                  ///< its endpoint, while ready
  ep_state* ready_prev = nullptr;               ///< neighbours in the ready list
  ep_state* ready_next = nullptr;
  request* fetch = nullptr;                     ///< the rendezvous read under way, if any
  /// What arrived after it, in order; with no read under way, an announcement at its head
  /// waits for a receive (parked).
  std::deque<held_item> held;
  bool advancing = false;                       ///< advance() runs for this endpoint
  /// True when an announcement waits for a receive, with what arrived after it.
  bool parked() const { return fetch == nullptr && !held.empty() && held.front().announced; }
};

stream_protocol::stream_protocol(worker_impl& owner, unsigned index) : protocol(owner, index) {
  receive_desc<&stream_protocol::on_data>(stream_msg::data);
  receive_desc<&stream_protocol::on_first>(stream_msg::first);
  receive_desc<&stream_protocol::on_fragment>(stream_msg::fragment);
}

stream_protocol::~stream_protocol() noexcept {
  for (auto& [data, lent] : lent_) {
    if (lent.desc_iface != nullptr) {
      lent.desc_iface->release_am_desc(lent.start);
    } else {
      std::free(lent.start);
    }
  }
  std::free(spare_);
}

uint8_t* stream_protocol::take_block(size_t capacity) {
  if (capacity == min_block && spare_ != nullptr) return std::exchange(spare_, nullptr);
  return static_cast<uint8_t*>(std::malloc(capacity));
}

void stream_protocol::drop_block(const stream_block& b) {
  if (b.desc_iface != nullptr) {
    b.desc_iface->release_am_desc(b.data);
    --kept_descs_;
  } else if (b.capacity == min_block && spare_ == nullptr) {
    spare_ = b.data;
  } else {
    std::free(b.data);
  }
}

bool stream_protocol::charge(endpoint_impl* ep, ep_state& s, size_t cost) {
  const peer_limits& c = w.ctx.cfg().limits;
  if (s.charged + cost > c.stream_rx_ep_max_bytes) {
    w.exceed_limit(ep, "COMM_STREAM_RX_EP_MAX_BYTES", c.stream_rx_ep_max_bytes);
    return false;
  }
  if (buffered_total_ + cost > c.stream_rx_max_bytes) {
    w.exceed_limit(ep, "COMM_STREAM_RX_MAX_BYTES", c.stream_rx_max_bytes);
    return false;
  }
  s.charged += cost;
  buffered_total_ += cost;
  return true;
}

void stream_protocol::uncharge(ep_state& s, size_t cost) {
  s.charged -= cost;
  buffered_total_ -= cost;
}

// -- arrival -------------------------------------------------------------------------------------

bool stream_protocol::keepable(size_t length, const arrival* from) {
  if (from == nullptr || from->from == nullptr || !(from->flags & tl::am_flag_desc)) return false;
  const size_t size = from->from->attr().max_bcopy;
  return size <= keep_desc_max && length * 2 >= size;
}

status stream_protocol::on_data(tl::iface* from, uint8_t* data, size_t length, unsigned flags) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::StreamData>(data, length, &used);
  if (!h) {
    w.protocol_error(nullptr, "truncated stream data header");
    return status::ok;
  }
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "stream data for an unknown endpoint");
  if (ep == nullptr) return status::ok;
  if (ep->rx.owner != nullptr) {
    w.protocol_error(ep, "new message before the previous one ended");
    return status::ok;
  }
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += length - used;
  const arrival lent{from, data, flags};
  return take(ep, data + used, length - used, (flags & tl::am_flag_desc) ? &lent : nullptr);
}

status stream_protocol::on_first(tl::iface* from, uint8_t* data, size_t length, unsigned flags) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::StreamFirst>(data, length, &used);
  if (!h) {
    w.protocol_error(nullptr, "truncated stream header");
    return status::ok;
  }
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "stream data for an unknown endpoint");
  if (ep == nullptr) return status::ok;
  const size_t payload = length - used;
  const uint64_t total = h->getTotalLength();
  if (ep->rx.owner != nullptr) {
    w.protocol_error(ep, "new message before the previous one ended");
    return status::ok;
  }
  if (payload >= total) {
    w.protocol_error(ep, "first stream fragment as long as the send");
    return status::ok;
  }
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  // What the fragments will bring is not allocated ahead: each is buffered as it comes.
  ep->rx = rx_message{this, h->getMsgId(), total, payload};
  const arrival lent{from, data, flags};
  return take(ep, data + used, payload, (flags & tl::am_flag_desc) ? &lent : nullptr);
}

status stream_protocol::on_fragment(tl::iface* from, uint8_t* data, size_t length,
                                    unsigned flags) {
  const uint8_t* payload = nullptr;
  size_t bytes = 0;
  endpoint_impl* ep = accept_fragment(w, *this, data, length, &payload, &bytes);
  if (ep == nullptr) return status::ok;
  ep->rx.received += bytes;
  if (ep->rx.received == ep->rx.total) ep->rx = rx_message{};
  const arrival lent{from, data, flags};
  return take(ep, payload, bytes, (flags & tl::am_flag_desc) ? &lent : nullptr);
}

status stream_protocol::take(endpoint_impl* ep, const uint8_t* data, size_t length,
                             const arrival* from) {
  auto& s = state_of<ep_state>(*ep);
  ++counters_.fragments;
  if (length == 0) return status::ok;
  if (s.fetch != nullptr || !s.held.empty()) return hold(ep, s, data, length, from);
  if (s.recv_head == nullptr) return buffer(ep, s, data, length, from);
  bool alive = true;
  const size_t taken = fill_receives(ep, s, data, length, &alive);
  // A completion callback may have closed the endpoint or failed it: what is left goes nowhere.
  if (!alive || taken == length) return status::ok;
  return buffer(ep, s, data + taken, length - taken, from);
}

size_t stream_protocol::fill_receives(endpoint_impl* ep, ep_state& s, const uint8_t* data,
                                      size_t length, bool* alive) {
  size_t taken = 0;
  while (taken < length && s.recv_head != nullptr) {
    request* req = s.recv_head;
    auto& r = req->as<stream_recv_state>();
    const size_t n = std::min(length - taken, r.length - r.received);
    iov_scatter(req->iov, r.received, data + taken, n);
    r.received += n;
    taken += n;
    counters_.direct_bytes += n;
    // Not full: the bytes ran out; it completes if it holds enough.
    if (r.received < r.length && r.received < r.min_length) break;
    s.recv_head = r.next;
    if (s.recv_head == nullptr) s.recv_tail = nullptr;
    w.complete(req, status::ok);
    if (!live(w, ep) || ep->state == endpoint_impl::phase::failed) {
      *alive = false;
      break;
    }
  }
  return taken;
}

bool stream_protocol::make_block(const uint8_t* data, size_t length, const arrival* from,
                                 stream_block* out) {
  if (keepable(length, from)) {
    const size_t offset = static_cast<size_t>(data - from->desc);
    *out = stream_block{from->desc, 0, offset, offset + length, from->from,
                        block_cost(length, from->from)};
    ++kept_descs_;
    ++counters_.kept_descs;
    counters_.kept_bytes += length;
    return true;
  }
  const size_t capacity = std::max(length, min_block);
  uint8_t* bytes = take_block(capacity);
  if (bytes == nullptr) return false;
  std::memcpy(bytes, data, length);
  counters_.copied_bytes += length;
  *out = stream_block{bytes, capacity, 0, length, nullptr, block_cost(length, nullptr)};
  return true;
}

status stream_protocol::buffer(endpoint_impl* ep, ep_state& s, const uint8_t* data,
                               size_t length, const arrival* from) {
  w.note_events(wakeup_rx);  // bytes wait for a receive: worker::wait for rx ends
  const bool keep = keepable(length, from);
  if (!keep && !s.blocks.empty() && s.blocks.back().desc_iface == nullptr) {
    // Small payloads share the last block while it has room.
    stream_block& last = s.blocks.back();
    const size_t n = std::min(length, last.capacity - last.end);
    std::memcpy(last.data + last.end, data, n);
    last.end += n;
    s.buffered += n;
    counters_.copied_bytes += n;
    data += n;
    length -= n;
  }
  status result = status::ok;
  if (length != 0) {
    if (!charge(ep, s, block_cost(length, keep ? from->from : nullptr))) return status::ok;
    stream_block b;
    if (!make_block(data, length, from, &b)) {
      uncharge(s, block_cost(length, nullptr));
      w.protocol_error(ep, "no memory to buffer stream data");
      return status::ok;
    }
    s.blocks.push_back(b);
    s.buffered += length;
    if (b.desc_iface != nullptr) result = status::in_progress;
  }
  update_ready(*ep, s);
  return result;
}

status stream_protocol::hold(endpoint_impl* ep, ep_state& s, const uint8_t* data, size_t length,
                             const arrival* from) {
  const bool keep = keepable(length, from);
  const size_t cost = block_cost(length, keep ? from->from : nullptr);
  if (!charge(ep, s, cost)) return status::ok;
  held_item item;
  if (!make_block(data, length, from, &item.bytes)) {
    uncharge(s, cost);
    w.protocol_error(ep, "no memory to hold stream data");
    return status::ok;
  }
  item.cost = cost;
  const bool kept = item.bytes.desc_iface != nullptr;
  s.held.push_back(std::move(item));
  ++counters_.held;
  return kept ? status::in_progress : status::ok;
}

// -- rendezvous ----------------------------------------------------------------------------------

void stream_protocol::on_announcement(endpoint_impl& ep, rndv_announcement&& a) {
  auto& s = state_of<ep_state>(ep);
  if (ep.rx.owner != nullptr) {
    return w.protocol_error(&ep, "new message before the previous one ended");
  }
  // Read now into the receives posted, or ahead of them into the buffer while that stays small
  // (the send then completes before its receive is posted, as into a socket's buffer).
  const bool in_order = s.fetch == nullptr && s.held.empty();
  if (in_order && (s.recv_head != nullptr || s.buffered + a.length <= read_ahead(ep))) {
    return start_fetch(ep, s, std::move(a));
  }
  // Behind a read or a parked announcement, or parked itself: it waits for a receive.
  const size_t cost = block_overhead + a.rkey.size();
  if (!charge(&ep, s, cost)) return;
  held_item item;
  item.cost = cost;
  item.announced = std::make_unique<rndv_announcement>(std::move(a));
  item.may_read_ahead = s.fetch != nullptr && !parked_behind(s);
  s.held.push_back(std::move(item));
  ++counters_.held;
  if (s.parked()) {
    w.note_events(wakeup_rx);  // bytes wait for a receive
    update_ready(ep, s);
  }
}

void stream_protocol::start_fetch(endpoint_impl& ep, ep_state& s, rndv_announcement&& a) {
  // The posted receives take the bytes in order; a block takes what is left.
  size_t left = a.length;
  for (request* r = s.recv_head; r != nullptr && left != 0; r = r->as<stream_recv_state>().next) {
    const auto& rs = r->as<stream_recv_state>();
    left -= std::min(left, rs.length - rs.received);
  }
  stream_block block;
  if (left != 0) {
    const size_t cost = block_cost(left, nullptr);
    if (!charge(&ep, s, cost)) return;
    const size_t capacity = std::max(left, min_block);
    uint8_t* bytes = take_block(capacity);
    if (bytes == nullptr) {
      uncharge(s, cost);
      return w.protocol_error(&ep, "no memory to buffer stream data");
    }
    block = stream_block{bytes, capacity, 0, left, nullptr, cost};
  }
  request* fetch = w.alloc_request(stream_fetch_ops, request_params{});
  auto& f = fetch->init<stream_fetch_state>();
  size_t rest = a.length - left;
  for (request* r = s.recv_head; r != nullptr && rest != 0; r = r->as<stream_recv_state>().next) {
    auto& rs = r->as<stream_recv_state>();
    const size_t n = std::min(rest, rs.length - rs.received);
    for_each_piece(r->iov, rs.received, n,
                   [&](uint8_t* piece, size_t bytes) { fetch->iov.push_back({piece, bytes}); });
    rs.reserved = n;
    rest -= n;
    ++f.targets;
  }
  if (left != 0) fetch->iov.push_back({block.data, left});
  f.block = block;
  s.fetch = fetch;
  ++counters_.fetches;
  counters_.fetched_direct += a.length - left;
  counters_.fetched_buffered += left;
  // On a transport whose reads complete at once, end_fetch runs before this returns.
  module_of<rndv_protocol>(w).start_fetch(fetch, f.fetch, &ep, a.sreq, a.address, a.length,
                                          a.rkey.data(), a.rkey.size(), fetched);
}

void stream_protocol::end_fetch(request* fetch, status outcome) {
  auto& f = fetch->as<stream_fetch_state>();
  endpoint_impl* ep = f.fetch.ep;
  const stream_block block = f.block;
  const bool drop = f.drop_block;
  module_of<rndv_protocol>(w).release_fetch(f.fetch);
  fetch->holds = false;
  w.free_request(fetch);
  auto& s = state_of<ep_state>(*ep);
  s.fetch = nullptr;
  const bool ok = outcome == status::ok;
  // The receives it wrote into are the first ones posted (a reserved one cannot be canceled).
  for (request* r = s.recv_head; r != nullptr; r = r->as<stream_recv_state>().next) {
    auto& rs = r->as<stream_recv_state>();
    if (rs.reserved == 0) break;
    if (ok) rs.received += rs.reserved;
  }
  if (block.data != nullptr) {
    if (ok && !drop) {
      s.blocks.push_back(block);
      s.buffered += block.bytes();
    } else {
      uncharge(s, block.cost);
      drop_block(block);
    }
  }
  // Complete them in order: each is full, but the last when the bytes ended in it.
  while (s.recv_head != nullptr && s.recv_head->as<stream_recv_state>().reserved != 0) {
    request* req = s.recv_head;
    auto& r = req->as<stream_recv_state>();
    r.reserved = 0;
    if (ok && r.received < r.length && r.received < r.min_length) break;  // waits for more
    s.recv_head = r.next;
    if (s.recv_head == nullptr) s.recv_tail = nullptr;
    w.complete(req, ok ? status::ok : outcome);
    if (!live(w, ep)) return;  // closed by its callback: what is left went with it
  }
  // A read that failed leaves a hole in the stream: the endpoint fails (its receives end).
  if (!ok && ep->state != endpoint_impl::phase::failed) {
    w.protocol_error(ep, "stream rendezvous read failed");
  }
  if (!live(w, ep) || s.advancing) return;  // a running advance() goes on from here
  advance(ep, s, false);
  if (!live(w, ep)) return;
  // Receives that waited through a failure (endpoint_failed left them to us) end now.
  if (s.fetch == nullptr && ep->state == endpoint_impl::phase::failed) {
    complete_recvs(*ep, s, ep->failure);
  }
  update_ready(*ep, s);
}

void stream_protocol::advance(endpoint_impl* ep, ep_state& s, bool force) {
  s.advancing = true;
  advance_held(ep, s, force);
  if (live(w, ep)) {
    s.advancing = false;
    update_ready(*ep, s);
  }
}

void stream_protocol::advance_held(endpoint_impl* ep, ep_state& s, bool force) {
  if (!serve_from_buffer(ep, s)) return;
  while (!s.held.empty() && s.fetch == nullptr) {
    held_item& head = s.held.front();
    // On a failed endpoint nothing more is read from the peer: the held bytes before the first
    // announcement stay receivable, the announcement and what came after it are dropped.
    const bool failed = ep->state == endpoint_impl::phase::failed;
    if (head.announced && failed) {
      drop_held(s);
      return;
    }
    if (head.announced) {
      // Parked until a receive wants it (or stream_recv_data, with nothing buffered, asks),
      // unless it may still be read ahead.
      const bool ahead =
          head.may_read_ahead && s.buffered + head.announced->length <= read_ahead(*ep);
      if (s.recv_head == nullptr && !ahead && !(force && s.blocks.empty())) {
        head.may_read_ahead = false;  // parked: what comes after waits for receives too
        return;
      }
      held_item item = std::move(head);
      s.held.pop_front();
      uncharge(s, item.cost);
      start_fetch(*ep, s, std::move(*item.announced));
      if (!live(w, ep)) return;
      if (s.fetch == nullptr && !serve_from_buffer(ep, s)) return;
      continue;
    }
    held_item item = std::move(head);
    s.held.pop_front();
    stream_block b = item.bytes;
    if (!failed) {
      bool alive = true;
      b.begin += fill_receives(ep, s, b.data + b.begin, b.bytes(), &alive);
    }
    if (!live(w, ep) || b.bytes() == 0) {
      uncharge(s, item.cost);
      drop_block(b);
      if (!live(w, ep)) return;
      continue;
    }
    // What no receive took joins the buffer as it is, still counted.
    b.cost = item.cost;
    s.blocks.push_back(b);
    s.buffered += b.bytes();
    w.note_events(wakeup_rx);
  }
}

void stream_protocol::drop_held(ep_state& s) {
  for (const held_item& item : s.held) {
    uncharge(s, item.cost);
    if (item.bytes.data != nullptr) drop_block(item.bytes);
  }
  s.held.clear();
}

bool stream_protocol::parked_behind(const ep_state& s) {
  for (const held_item& item : s.held) {
    if (item.announced && !item.may_read_ahead) return true;
  }
  return false;
}

size_t stream_protocol::read_ahead(const endpoint_impl&) const {
  return std::min(stream_read_ahead, w.ctx.cfg().limits.stream_rx_ep_max_bytes / 2);
}

bool stream_protocol::serve_from_buffer(endpoint_impl* ep, ep_state& s) {
  while (s.recv_head != nullptr && s.buffered != 0) {
    request* req = s.recv_head;
    auto& r = req->as<stream_recv_state>();
    r.received += drain(*ep, s, req->iov, r.received, r.length - r.received);
    if (r.received < r.min_length) break;
    s.recv_head = r.next;
    if (s.recv_head == nullptr) s.recv_tail = nullptr;
    w.complete(req, status::ok);
    if (!live(w, ep)) return false;
  }
  return true;
}

// -- receives ------------------------------------------------------------------------------------

size_t stream_protocol::drain(endpoint_impl& ep, ep_state& s, std::span<const iov_entry> entries,
                              size_t offset, size_t length) {
  size_t moved = 0;
  while (moved < length && !s.blocks.empty()) {
    stream_block& b = s.blocks.front();
    const size_t n = std::min(length - moved, b.bytes());
    iov_scatter(entries, offset + moved, b.data + b.begin, n);
    b.begin += n;
    moved += n;
    if (b.begin < b.end) break;
    uncharge(s, b.cost);
    drop_block(b);
    s.blocks.pop_front();
  }
  s.buffered -= moved;
  counters_.drained_bytes += moved;
  update_ready(ep, s);
  return moved;
}

size_t stream_protocol::recv_now(endpoint_impl& ep, void* buffer, size_t length,
                                 size_t min_length) {
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr || s->recv_head != nullptr || s->fetch != nullptr || s->buffered < min_length) {
    return 0;
  }
  const iov_entry entry{buffer, length};
  return drain(ep, *s, {&entry, 1}, 0, length);
}

op stream_protocol::post_recv(endpoint_impl& ep, request* req) {
  auto& s = state_of<ep_state>(ep);
  auto& r = req->as<stream_recv_state>();
  req->ep = &ep;
  // Behind a read under way, the buffer is served once it ended (end_fetch).
  if (s.recv_head == nullptr && s.fetch == nullptr) {
    r.received = drain(ep, s, req->iov, 0, r.length);
  }
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
  const op result = w.in_progress(req);
  // A parked announcement is read into it now (at once where reads complete at once).
  if (s.parked()) advance(&ep, s, false);
  return result;
}

bool stream_protocol::unpost(request* req) {
  if (req->ep == nullptr) return false;
  auto* s = find_state<ep_state>(*req->ep);
  if (s == nullptr || req->as<stream_recv_state>().reserved != 0) return false;
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
    auto& r = req->as<stream_recv_state>();
    s.recv_head = r.next;
    if (s.recv_head == nullptr) s.recv_tail = nullptr;
    r.reserved = 0;
    w.complete(req, st);
  }
}

void* stream_protocol::lend_block(endpoint_impl& ep, size_t* length) {
  *length = 0;
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr || s->recv_head != nullptr) return nullptr;
  // Nothing buffered but an announcement parked: read it into the buffer to lend it.
  if (s->blocks.empty() && s->parked()) advance(&ep, *s, true);
  if (s->blocks.empty()) return nullptr;
  const stream_block b = s->blocks.front();
  s->blocks.pop_front();
  uncharge(*s, b.cost);
  s->buffered -= b.bytes();
  update_ready(ep, *s);
  void* data = b.data + b.begin;
  lent_[data] = lent_block{b.data, b.desc_iface};
  *length = b.bytes();
  return data;
}

bool stream_protocol::release_block(void* data) {
  auto it = lent_.find(data);
  if (it == lent_.end()) return false;
  const lent_block lent = it->second;
  lent_.erase(it);
  if (lent.desc_iface != nullptr) {
    lent.desc_iface->release_am_desc(lent.start);
    --kept_descs_;
  } else {
    std::free(lent.start);
  }
  return true;
}

size_t stream_protocol::buffered(const endpoint_impl& ep) const {
  const auto* s = find_state<ep_state>(ep);
  return s == nullptr ? 0 : s->buffered;
}

// -- the ready list ------------------------------------------------------------------------------

void stream_protocol::update_ready(endpoint_impl& ep, ep_state& s) {
  const bool ready = (s.buffered != 0 || s.parked()) && s.recv_head == nullptr;
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
    const size_t parked = s.parked() ? s.held.front().announced->length : 0;
    out[i] = stream_poll_entry{s.ep, s.buffered + parked};
    unlink_ready(s);  // to the back: the next poll starts with the others
    link_ready(s);
  }
  return n;
}

// -- hooks ---------------------------------------------------------------------------------------

void stream_protocol::free_blocks(endpoint_impl& ep, ep_state& s) {
  for (const stream_block& b : s.blocks) {
    uncharge(s, b.cost);
    drop_block(b);
  }
  s.blocks.clear();
  drop_held(s);
  s.buffered = 0;
  // A read under way still writes into its block (still counted): it is freed when it ends.
  if (s.fetch != nullptr) s.fetch->as<stream_fetch_state>().drop_block = true;
  update_ready(ep, s);
}

void stream_protocol::forget_peer(endpoint_impl& ep, held_fate fate) {
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr) return;
  // Kept on a failed endpoint: the bytes that arrived before the failure stay receivable.
  if (fate == held_fate::keep) return;
  free_blocks(ep, *s);
  // Going away (closed): a receive still waiting can never complete. Behind a read under way,
  // the receives end in order once it ended (endpoint_deleted ends it).
  if (fate == held_fate::detach && s->fetch == nullptr) {
    complete_recvs(ep, *s, status::canceled);
  }
}

void stream_protocol::endpoint_failed(endpoint_impl& ep, status reason) {
  if (ep.rx.owner == this) ep.rx = rx_message{};
  auto* s = find_state<ep_state>(ep);
  // Behind a read under way, the receives end once it ended (end_fetch).
  if (s == nullptr || s->fetch != nullptr) return;
  // What waited behind a parked announcement and can still be received joins the buffer.
  if (!s->held.empty() && !s->advancing) advance(&ep, *s, false);
  if (live(w, &ep)) complete_recvs(ep, *s, reason);
}

void stream_protocol::endpoint_deleted(endpoint_impl& ep) {
  if (ep.rx.owner == this) ep.rx = rx_message{};
  auto* s = find_state<ep_state>(ep);
  if (s == nullptr) return;
  // A read under way was ended before (rndv_protocol::endpoint_deleted runs first).
  free_blocks(ep, *s);
  complete_recvs(ep, *s, status::canceled);
}

void stream_protocol::info(std::ostream& out) const {
  out << "streams: " << ready_count_ << " endpoints with data ready, buffered " << buffered_total_
      << " of " << w.ctx.cfg().limits.stream_rx_max_bytes << " B, blocks lent " << lent_.size()
      << ", transport descriptors kept " << kept_descs_ << '\n';
  const stream_counters& c = counters_;
  out << "streams: " << c.fragments << " messages received: " << c.direct_bytes
      << " B copied into receives, " << c.copied_bytes << " B copied into blocks, "
      << c.kept_bytes << " B kept in " << c.kept_descs << " descriptors, " << c.drained_bytes
      << " B copied out of the buffer; " << c.fetches << " rendezvous reads: " << c.fetched_direct
      << " B into receives, " << c.fetched_buffered << " B into blocks, " << c.held
      << " messages held behind one\n";
}

}  // namespace detail

// -- public API ----------------------------------------------------------------------------------

op endpoint::stream_send(const void* buffer, size_t length, const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  constexpr uint32_t slow_flags = request_no_immediate_completion | request_force_zcopy |
                                  request_force_bcopy | request_force_rndv;
  constexpr size_t header = wire::header_size<wire::schema::StreamData>();
  // The common small send: straight to the transport, no request (as tag_send does); one that
  // fits a bcopy as well. (Two separate paths: joined, the short one's result went through
  // memory and cost the 8-byte message rate a store-forwarding stall.)
  if (!(params.flags & slow_flags) && params.pack == nullptr &&
      (buffer != nullptr || length == 0)) {
    const tl::am_id id = detail::wire_id(detail::stream_msg::data);
    auto& writer = module_of<stream_protocol>(w).hdr_data;
    writer.fields().setDstEp(ep.remote_id);
    op result;
    if (detail::short_path_open(ep, header + length)) {
      if (detail::try_send_short(ep, id, writer.bytes(), header, buffer, length, params.flags,
                                 &result)) {
        return result;
      }
    } else if (detail::bcopy_path_open(ep, header + length) &&
               detail::try_send_bcopy(ep, id, writer.bytes(), header, buffer, length,
                                      params.flags, &result)) {
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
