// The tag module: the send entry points, the receive side of the eager protocols (whole messages,
// first fragments and later fragments) matched against posted receives or kept as unexpected
// messages, and the receive entry points.
#include "tag.hpp"

#include "iov.hpp"
#include "protocols.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::module_of;
using detail::tag_protocol;
using detail::worker_impl;

namespace detail {
namespace {

/// Largest eager message a receiver accepts (larger ones belong to rendezvous).
constexpr uint64_t max_eager_message = 1ull << 30;

/// Sizes of pooled unexpected-message blocks: messages arriving before their receive (the common
/// case under load) reuse these instead of going through malloc. One tier for small messages,
/// one for anything up to a bcopy buffer.
constexpr size_t unexpected_block_sizes[2] = {512, 8192 + 256};
/// Free blocks kept for reuse, per tier.
constexpr size_t unexpected_pool_limits[2] = {4096, 1024};

/// The pool tier for a descriptor of `bytes`, or -1 when it is allocated on its own.
int unexpected_tier(size_t bytes) {
  for (int tier = 0; tier < 2; ++tier) {
    if (bytes <= unexpected_block_sizes[tier]) return tier;
  }
  return -1;
}

/// A message arriving in fragments through a transport's unexpected-eager handler (its per-message
/// context there).
struct tm_arrival {
  endpoint_impl* ep = nullptr;           ///< its sender's endpoint
  request* recv = nullptr;               ///< its matched receive, or
  unexpected_msg* msg = nullptr;         ///< the unexpected message being filled
  size_t received = 0;                   ///< data bytes so far
};

/// The module's fragmented message arriving on an endpoint.
struct tag_ep_state : endpoint_state {
  request* recv = nullptr;              ///< its matched receive, or
  unexpected_msg* unexpected = nullptr; ///< the descriptor being filled
  bool windowed = false;                ///< a large eager copy: holds room of the eager window
};

/// Delivers `length` bytes at `offset` of a matched receive.
void copy_to_recv(request* req, tag_recv_state& s, size_t offset, const uint8_t* data,
                  size_t length) {
  const size_t end = std::min(offset + length, s.length);
  if (end > s.info.length) s.info.length = end;
  if (offset < end) iov_scatter(req->iov, offset, data, end - offset);
}

/// Completes a receive whose data all arrived.
void finish_recv(worker_impl& w, request* req, const tag_recv_state& s) {
  w.complete(req, s.received > s.length ? status::message_truncated : status::ok);
}

// -- sends ---------------------------------------------------------------------------------------

size_t encode_first(request* req, const send_progress& s, bool whole, uint8_t* out,
                    tl::am_id* id) {
  tag_protocol& t = module_of<tag_protocol>(*req->owner);
  const tag_t tag = req->as<tag_send_state>().tag;
  const uint32_t dst = req->ep->remote_id;
  const bool with_imm = req->params.flags & request_immediate_value;
  if (!whole) {
    auto& h = t.hdr_tag_first.fields();
    h.setDstEp(dst);
    h.setTag(tag);
    h.setMsgId(s.msg_id);
    h.setTotalLength(s.length);
    h.setImm(with_imm ? req->params.imm : 0);
    h.setWindowed(s.windowed);
    *id = wire_id(tag_msg::eager_first);
    return t.hdr_tag_first.copy_to(out);
  }
  if (with_imm) {
    auto& h = t.hdr_tag_imm.fields();
    h.setDstEp(dst);
    h.setTag(tag);
    h.setImm(req->params.imm);
    *id = wire_id(tag_msg::eager_imm);
    return t.hdr_tag_imm.copy_to(out);
  }
  auto& h = t.hdr_tag.fields();
  h.setDstEp(dst);
  h.setTag(tag);
  *id = wire_id(tag_msg::eager);
  return t.hdr_tag.copy_to(out);
}

size_t whole_header_size(const request* req) {
  if (req->params.flags & request_immediate_value) {
    return wire::header_size<wire::schema::TagEagerImm>();
  }
  return wire::header_size<wire::schema::TagEager>();
}

status send_by_rndv(request* req) {
  auto& s = req->as<tag_send_state>();
  const rts_fields fields{.is_am = false, .tag = s.tag};
  return module_of<rndv_protocol>(*req->owner).send(req, s.rndv, s.send.length, fields);
}

const message_framing framing{encode_first, whole_header_size, send_by_rndv,
                              wire_id(tag_msg::fragment), true};

status progress_send(request* req) {
  auto& s = req->as<tag_send_state>();
  tag_offload& offload = module_of<tag_protocol>(*req->owner).offload;
  if (s.tm == tm_send::undecided) s.tm = offload.choose(req, s);
  if (s.tm != tm_send::software) return offload.send(req, s);
  return send_message(req, s.send, framing);
}

void release_send(request* req) {
  module_of<rndv_protocol>(*req->owner).release_send(req->as<tag_send_state>().rndv);
}

status cancel_send(request* req, cancel_mode mode) {
  auto& s = req->as<tag_send_state>();
  if (s.rndv.phase == rndv_phase::announced) {
    return module_of<rndv_protocol>(*req->owner).cancel_send(req, s.rndv, mode);
  }
  if (req->ep == nullptr) return status::busy;
  endpoint_impl& ep = *req->ep;
  const send_progress sent = s.send;  // a forced cancel frees the request
  const status st = ep.cancel_pending(req, mode);
  if (st == status::ok) refund_window(ep, sent);  // it never started
  return st;
}

const request_ops tag_send_ops{.name = "tag_send",
                           .progress = progress_send,
                           .release = release_send,
                           .cancel = cancel_send,
                           .events = wakeup_tag_send | wakeup_tx};

// -- receives ------------------------------------------------------------------------------------

void notify_recv(request* req, status st) {
  if (req->params.recv_cb != nullptr) {
    req->params.recv_cb(req, st, req->as<tag_recv_state>().info, req->params.user_data);
  }
}

void release_recv(request* req) {
  module_of<rndv_protocol>(*req->owner).release_fetch(req->as<tag_recv_state>().fetch);
}

status cancel_recv(request* req, cancel_mode mode) {
  worker_impl& w = *req->owner;
  auto& s = req->as<tag_recv_state>();
  if (s.matched || !module_of<tag_protocol>(w).unpost(s)) return status::busy;
  if (mode == cancel_mode::force) {
    req->finished = true;
    req->st = status::canceled;
    w.free_request(req);
    return status::ok;
  }
  w.complete(req, status::canceled);
  return status::ok;
}

const request_ops tag_recv_ops{.name = "tag_recv",
                           .notify = notify_recv,
                           .release = release_recv,
                           .cancel = cancel_recv,
                           .events = wakeup_tag_recv | wakeup_rx};

/// Ends the fetch of a rendezvous message into a receive.
void fetched(request* req, status outcome) {
  const auto& s = req->as<tag_recv_state>();
  const bool truncated = outcome == status::ok && s.received > s.length;
  req->owner->complete(req, truncated ? status::message_truncated : outcome);
}

}  // namespace

tag_protocol::tag_protocol(worker_impl& owner, unsigned index)
    : protocol(owner, index), offload(owner, *this) {
  receive<&tag_protocol::on_eager>(tag_msg::eager);
  receive<&tag_protocol::on_eager_imm>(tag_msg::eager_imm);
  receive<&tag_protocol::on_eager_first>(tag_msg::eager_first);
  receive<&tag_protocol::on_fragment>(tag_msg::fragment);
  receive<&tag_protocol::on_credit>(tag_msg::credit);
}

tag_protocol::~tag_protocol() noexcept {
  for (auto& tier : unexpected_pool_) {
    for (void* block : tier) std::free(block);
  }
}

// -- unexpected messages -------------------------------------------------------------------------

unexpected_msg* tag_protocol::new_unexpected(endpoint_impl* ep, tag_t tag, uint64_t imm,
                                             size_t length, size_t extra) {
  const int tier = unexpected_tier(sizeof(unexpected_msg) + length);
  const size_t footprint =
      tier >= 0 ? unexpected_block_sizes[tier] : sizeof(unexpected_msg) + length;
  if (!w.charge_unexpected(ep, footprint + extra, 1)) return nullptr;
  void* block = nullptr;
  if (tier >= 0 && !unexpected_pool_[tier].empty()) {
    block = unexpected_pool_[tier].back();
    unexpected_pool_[tier].pop_back();
  } else {
    block = std::malloc(footprint);
  }
  if (block == nullptr) {
    w.uncharge_unexpected(ep, footprint + extra, 1);
    COMM_LOG(error, "tag", "%s: out of memory for an unexpected message of %zu bytes",
             w.params.name.c_str(), length);
    return nullptr;
  }
  auto* msg = new (block) unexpected_msg();
  msg->from = ep;
  msg->charged = footprint + extra;
  msg->pool_tier = static_cast<int8_t>(tier);
  msg->tag = tag;
  msg->imm = imm;
  msg->length = length;
  msg->data = reinterpret_cast<uint8_t*>(msg + 1);
  return msg;
}

void tag_protocol::free_unexpected(unexpected_msg* msg) {
  give_back_window(msg);
  w.uncharge_unexpected(msg->from, msg->charged, 1);
  std::free(msg->grown);
  const int tier = msg->pool_tier;
  msg->~unexpected_msg();
  if (tier >= 0 && unexpected_pool_[tier].size() < unexpected_pool_limits[tier]) {
    unexpected_pool_[tier].push_back(msg);
  } else {
    std::free(msg);
  }
}

void tag_protocol::give_back_window(unexpected_msg* msg) {
  if (msg->windowed != 0 && msg->from != nullptr) give_back(*msg->from, msg->windowed);
  msg->windowed = 0;
}

bool tag_protocol::take_window(endpoint_impl& ep, size_t bytes) {
  const size_t window = w.eager_window_accepted();
  if (bytes > window - ep.eager_held) {
    w.exceed_limit(&ep, "COMM_EAGER_WINDOW_EP_BYTES", window);
    return false;
  }
  ep.eager_held += bytes;
  return true;
}

void tag_protocol::give_back(endpoint_impl& ep, size_t bytes) {
  ep.eager_held -= bytes;
  ep.eager_freed += bytes;
  if (ep.eager_freed < std::max<size_t>(w.eager_window_accepted() / 2, 1)) return;
  // The window no longer matters to an endpoint that is going.
  if (ep.state != endpoint_impl::phase::connected || ep.close_notice_sent) return;
  auto& h = hdr_credit.fields();
  h.setDstEp(ep.remote_id);
  h.setBytes(ep.eager_freed);
  ep.eager_freed = 0;
  w.send_control(&ep, wire_id(tag_msg::credit), hdr_credit.bytes(), hdr_credit.size());
}

void tag_protocol::on_credit(const uint8_t* data, size_t length) {
  auto h = wire::read_header<wire::schema::TagCredit>(data, length);
  if (!h) return w.protocol_error(nullptr, "truncated eager window credit");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "eager window credit for an unknown endpoint");
  if (ep == nullptr) return;
  const uint64_t bytes = h->getBytes();
  if (bytes > ep->eager_window - ep->eager_credit) {
    return w.protocol_error(ep, "eager window given back beyond what was taken");
  }
  ep->eager_credit += bytes;
}

bool tag_protocol::reserve_unexpected(unexpected_msg* msg, size_t needed) {
  if (needed <= msg->capacity) return true;
  size_t capacity = std::max<size_t>(msg->capacity * 2, 64 * 1024);
  capacity = std::min(std::max(capacity, needed), msg->length);
  const size_t growth = capacity - msg->capacity;
  if (!w.charge_unexpected(msg->from, growth, 0)) return false;
  void* bigger = std::realloc(msg->grown, capacity);
  if (bigger == nullptr) {
    w.uncharge_unexpected(msg->from, growth, 0);
    return false;
  }
  msg->charged += growth;
  msg->grown = static_cast<uint8_t*>(bigger);
  msg->data = msg->grown;
  msg->capacity = capacity;
  return true;
}

void tag_protocol::detach(unexpected_msg* msg) {
  if (msg->from == nullptr) return;
  worker_impl::detach_unexpected(msg->from, msg->charged, 1);
  msg->from = nullptr;
}

void tag_protocol::out_of_room(endpoint_impl* ep) {
  // A limit has failed the endpoint already; otherwise memory ran out.
  if (ep->state != endpoint_impl::phase::failed) {
    w.protocol_error(ep, "no memory for an unexpected message");
  }
}

// -- receiving -----------------------------------------------------------------------------------

void tag_protocol::post(request* req, tag_recv_state& s) {
  if (offload.receives_offloaded()) {
    offload.try_post(req, s);
  } else {
    s.expected.offloaded = false;
  }
  w.matcher.post_expected(&s.expected);
}

bool tag_protocol::unpost(tag_recv_state& s) {
  if (!w.matcher.remove_expected(&s.expected)) return false;
  offload.reclaim(s);
  return true;
}

tag_expected* tag_protocol::take_expected(tag_t tag) {
  tag_expected* e = w.matcher.match_expected(tag);
  if (e != nullptr && e->offloaded) {
    offload.reclaim(recv_of(e)->as<tag_recv_state>());  // rule 1 of tag_offload.hpp
  }
  return e;
}

[[gnu::always_inline]] inline void tag_protocol::deliver_message(endpoint_impl* ep, tag_t tag,
                                                                 uint64_t imm,
                                                                 const uint8_t* data,
                                                                 size_t length) {
  if (tag_expected* e = take_expected(tag)) {
    request* req = recv_of(e);
    tag_recv_state& s = match(req, tag, imm);
    copy_to_recv(req, s, 0, data, length);
    s.received = length;
    finish_recv(w, req, s);
    return;
  }
  unexpected_msg* msg = new_unexpected(ep, tag, imm, length);
  if (msg == nullptr) return;  // a limit failed the endpoint, or no memory (logged)
  if (length != 0) std::memcpy(msg->data, data, length);
  msg->received = length;
  w.matcher.add_unexpected(msg);
  w.note_events(wakeup_tag_recv | wakeup_rx);
}

void tag_protocol::deliver(endpoint_impl* ep, tag_t tag, uint64_t imm, const uint8_t* data,
                           size_t length) {
  deliver_message(ep, tag, imm, data, length);
}

tag_recv_state& tag_protocol::match(request* req, tag_t tag, uint64_t imm) {
  auto& s = req->as<tag_recv_state>();
  s.matched = true;
  s.info.sender_tag = tag;
  s.info.imm = imm;
  return s;
}

void tag_protocol::on_eager(const uint8_t* data, size_t length) {
  receive_eager(data, length, false);
}

void tag_protocol::on_eager_imm(const uint8_t* data, size_t length) {
  receive_eager(data, length, true);
}

void tag_protocol::receive_eager(const uint8_t* data, size_t length, bool with_imm) {
  size_t used = 0;
  uint32_t dst;
  tag_t tag;
  uint64_t imm = 0;
  if (with_imm) {
    auto h = wire::read_header<wire::schema::TagEagerImm>(data, length, &used);
    if (!h) return w.protocol_error(nullptr, "truncated tag header");
    dst = h->getDstEp();
    tag = h->getTag();
    imm = h->getImm();
  } else {
    auto h = wire::read_header<wire::schema::TagEager>(data, length, &used);
    if (!h) return w.protocol_error(nullptr, "truncated tag header");
    dst = h->getDstEp();
    tag = h->getTag();
  }
  endpoint_impl* ep = w.receiving_ep(dst, "tagged message for an unknown endpoint");
  if (ep == nullptr) return;
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += length - used;
  deliver_message(ep, tag, imm, data + used, length - used);
}

void tag_protocol::on_eager_first(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::TagEagerFirst>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated first-fragment header");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "fragment for an unknown endpoint");
  if (ep == nullptr) return;
  const uint64_t total = h->getTotalLength();
  const size_t payload = length - used;
  if (ep->rx.owner != nullptr) {
    return w.protocol_error(ep, "new message before the previous one ended");
  }
  if (total > max_eager_message || payload > total) {
    return w.protocol_error(ep, "first fragment with an impossible total length");
  }
  const bool windowed = h->getWindowed();
  if (windowed && !take_window(*ep, total)) return;
  ep->rx = rx_message{this, h->getMsgId(), total, payload};
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  auto& rx = state_of<tag_ep_state>(*ep);
  rx.recv = nullptr;
  rx.unexpected = nullptr;
  rx.windowed = windowed;
  tag_expected* e = take_expected(h->getTag());
  if (e != nullptr) {
    request* req = recv_of(e);
    tag_recv_state& s = match(req, h->getTag(), h->getImm());
    copy_to_recv(req, s, 0, data + used, payload);
    rx.recv = req;
  } else {
    unexpected_msg* msg = new_unexpected(ep, h->getTag(), h->getImm(), 0);
    if (msg == nullptr) return out_of_room(ep);
    rx.unexpected = msg;
    msg->length = total;
    // A windowed message is bounded by the window: its buffer is made whole at once.
    if (!reserve_unexpected(msg, windowed ? total : payload)) return out_of_room(ep);
    if (payload != 0) std::memcpy(msg->data, data + used, payload);
  }
  if (ep->rx.received == ep->rx.total) finish_fragments(*ep);
}

void tag_protocol::on_fragment(const uint8_t* data, size_t length) {
  const uint8_t* payload = nullptr;
  size_t bytes = 0;
  endpoint_impl* ep = accept_fragment(w, *this, data, length, &payload, &bytes);
  if (ep == nullptr) return;
  rx_message& message = ep->rx;
  auto& rx = state_of<tag_ep_state>(*ep);
  if (rx.recv != nullptr) {
    copy_to_recv(rx.recv, rx.recv->as<tag_recv_state>(), message.received, payload, bytes);
  } else {
    if (!reserve_unexpected(rx.unexpected, message.received + bytes)) return out_of_room(ep);
    std::memcpy(rx.unexpected->data + message.received, payload, bytes);
  }
  message.received += bytes;
  if (message.received == message.total) finish_fragments(*ep);
}

void tag_protocol::finish_fragments(endpoint_impl& ep) {
  auto& rx = state_of<tag_ep_state>(ep);
  request* req = rx.recv;
  unexpected_msg* msg = rx.unexpected;
  const size_t total = ep.rx.total;
  const bool windowed = rx.windowed;
  ep.rx = rx_message{};
  rx.recv = nullptr;
  rx.unexpected = nullptr;
  rx.windowed = false;
  if (req != nullptr) {
    if (windowed) give_back(ep, total);
    auto& s = req->as<tag_recv_state>();
    s.received = total;
    finish_recv(w, req, s);
  } else if (msg != nullptr) {
    msg->received = total;
    if (windowed) msg->windowed = total;  // held until a receive takes it
    // A receive posted while the fragments arrived was not matched against this message (it was
    // not in the unexpected queue yet): it takes the message now, ahead of later arrivals.
    if (tag_expected* e = take_expected(msg->tag)) {
      request* late = recv_of(e);
      tag_recv_state& s = match(late, msg->tag, msg->imm);
      copy_to_recv(late, s, 0, msg->data, msg->length);
      s.received = msg->length;
      free_unexpected(msg);
      finish_recv(w, late, s);
    } else {
      w.matcher.add_unexpected(msg);
      w.note_events(wakeup_tag_recv | wakeup_rx);
    }
  }
}

request* tag_protocol::drop_fragments(endpoint_impl& ep) {
  request* matched = nullptr;
  if (auto* rx = find_state<tag_ep_state>(ep)) {
    matched = rx->recv;
    if (rx->unexpected != nullptr) free_unexpected(rx->unexpected);
    rx->recv = nullptr;
    rx->unexpected = nullptr;
    rx->windowed = false;  // the endpoint is going: its window no longer matters
  }
  ep.rx = rx_message{};
  return matched;
}

void tag_protocol::unexpected_fragment(endpoint_impl* ep, tag_t tag, const uint8_t* data,
                                       size_t length, unsigned flags, void** context) {
  auto* a = static_cast<tm_arrival*>(*context);
  if (flags & tl::tag_flag_first) {
    a = new (std::nothrow) tm_arrival{ep};
    if (a == nullptr) return out_of_room(ep);
    *context = a;
    ++ep->counters_.messages_received;
    if (tag_expected* e = take_expected(tag)) {
      a->recv = recv_of(e);
      match(a->recv, tag, 0);
    } else if ((a->msg = new_unexpected(ep, tag, 0, 0)) != nullptr) {
      a->msg->length = max_eager_message;  // bounds reserve_unexpected until the last fragment
    }
  } else if (a == nullptr) {
    return w.protocol_error(ep, "tagged fragment without its first");
  } else {
    ep = a->ep;
  }
  ep->counters_.bytes_received += length;
  if (a->recv != nullptr) {
    copy_to_recv(a->recv, a->recv->as<tag_recv_state>(), a->received, data, length);
  } else if (a->msg != nullptr) {
    if (length > max_eager_message - a->received) {
      w.protocol_error(ep, "tagged message through tag matching beyond any eager message");
      free_unexpected(a->msg);
      a->msg = nullptr;
    } else if (!reserve_unexpected(a->msg, a->received + length)) {
      out_of_room(ep);
      free_unexpected(a->msg);
      a->msg = nullptr;
    } else if (length != 0) {
      std::memcpy(a->msg->data + a->received, data, length);
    }
  }
  a->received += length;
  if (flags & tl::tag_flag_more) return;
  *context = nullptr;
  if (a->recv != nullptr) {
    auto& s = a->recv->as<tag_recv_state>();
    s.received = a->received;
    finish_recv(w, a->recv, s);
  } else if (a->msg != nullptr) {
    // No receive can have been posted since the first fragment: no user code ran in between.
    a->msg->length = a->received;
    a->msg->received = a->received;
    w.matcher.add_unexpected(a->msg);
    w.note_events(wakeup_tag_recv | wakeup_rx);
  }
  delete a;
}

const unexpected_msg* tag_protocol::arriving(const endpoint_impl& ep) const {
  const auto* rx = find_state<tag_ep_state>(ep);
  return ep.rx.owner == this && rx != nullptr ? rx->unexpected : nullptr;
}

// -- rendezvous ----------------------------------------------------------------------------------

void tag_protocol::fetch(request* req, endpoint_impl* ep, uint64_t sreq, uint64_t address,
                         size_t length, const uint8_t* rkey, size_t rkey_length) {
  auto& s = req->as<tag_recv_state>();
  s.received = length;
  s.info.length = std::min(length, s.length);
  module_of<rndv_protocol>(w).start_fetch(req, s.fetch, ep, sreq, address, s.info.length, rkey,
                                          rkey_length, fetched);
}

void tag_protocol::on_announcement(endpoint_impl& ep, tag_t tag, uint64_t imm,
                                   rndv_announcement&& a) {
  tag_expected* e = take_expected(tag);
  if (e != nullptr) {
    request* req = recv_of(e);
    match(req, tag, imm);
    fetch(req, &ep, a.sreq, a.address, a.length, a.rkey.data(), a.rkey.size());
    return;
  }
  unexpected_msg* msg = new_unexpected(&ep, tag, imm, 0, a.rkey.size());
  if (msg == nullptr) return;  // a limit failed the endpoint, or no memory (logged)
  msg->rndv = true;
  msg->ep = &ep;
  msg->sreq = a.sreq;
  msg->address = a.address;
  msg->length = a.length;
  msg->rkey = std::move(a.rkey);
  w.matcher.add_unexpected(msg);
  w.note_events(wakeup_tag_recv | wakeup_rx);
}

bool tag_protocol::drop_announcement(endpoint_impl& ep, uint64_t sreq) {
  std::vector<unexpected_msg*> doomed_msgs;
  w.matcher.for_each_unexpected([&](tag_unexpected* u) {
    auto* msg = static_cast<unexpected_msg*>(u);
    if (msg->rndv && msg->ep == &ep && msg->sreq == sreq) doomed_msgs.push_back(msg);
  });
  for (unexpected_msg* msg : doomed_msgs) {
    w.matcher.remove_unexpected(msg);
    free_unexpected(msg);
  }
  return !doomed_msgs.empty();
}

op tag_protocol::receive_unexpected(request* req, unexpected_msg* found) {
  tag_recv_state& s = match(req, found->tag, found->imm);
  if (found->rndv) {
    // The data is still at the sender: fetch it now. A fetch that ends at once is an immediate
    // completion (no callback), like any other.
    const bool report_now = !(req->params.flags & request_no_immediate_completion);
    const tag_recv_callback callback = req->params.recv_cb;
    if (report_now) req->params.recv_cb = nullptr;
    req->user_visible = true;
    fetch(req, found->ep, found->sreq, found->address, found->length, found->rkey.data(),
          found->rkey.size());
    free_unexpected(found);
    if (report_now && req->finished) {
      if (req->params.recv_info != nullptr) *req->params.recv_info = s.info;
      const status st = req->st;
      w.free_request(req);
      return op{st, nullptr};
    }
    req->params.recv_cb = callback;
    return op{status::in_progress, req};
  }
  copy_to_recv(req, s, 0, found->data, found->length);
  const status st = s.info.length < found->length ? status::message_truncated : status::ok;
  free_unexpected(found);
  if (!(req->params.flags & request_no_immediate_completion)) {
    if (req->params.recv_info != nullptr) *req->params.recv_info = s.info;
    w.free_request(req);
    return op{st, nullptr};
  }
  req->user_visible = true;
  w.complete(req, st);
  return op{status::in_progress, req};
}

// -- hooks ---------------------------------------------------------------------------------------

void tag_protocol::forget_peer(endpoint_impl& ep, held_fate fate) {
  std::vector<unexpected_msg*> doomed_msgs;
  w.matcher.for_each_unexpected([&](tag_unexpected* u) {
    auto* msg = static_cast<unexpected_msg*>(u);
    if (msg->rndv ? msg->ep != &ep : msg->from != &ep) return;
    msg->windowed = 0;  // the endpoint is going: its window no longer matters
    if (msg->rndv || fate == held_fate::drop) {
      doomed_msgs.push_back(msg);
    } else if (fate == held_fate::detach) {
      detach(msg);  // still receivable, held by the worker alone
    }
  });
  for (unexpected_msg* msg : doomed_msgs) {
    w.matcher.remove_unexpected(msg);
    free_unexpected(msg);
  }
}

void tag_protocol::endpoint_failed(endpoint_impl& ep, status reason) {
  if (ep.rx.owner != this) return;
  request* matched = drop_fragments(ep);
  if (matched != nullptr) w.complete(matched, reason);
}

void tag_protocol::endpoint_deleted(endpoint_impl& ep) {
  if (ep.rx.owner == this) drop_fragments(ep);
}

void tag_protocol::teardown() {
  std::vector<tag_expected*> posted;
  w.matcher.for_each_expected([&](tag_expected* e) { posted.push_back(e); });
  for (tag_expected* e : posted) {
    unpost(recv_of(e)->as<tag_recv_state>());
    w.complete(recv_of(e), status::canceled);
  }
  std::vector<tag_unexpected*> arrived;
  w.matcher.for_each_unexpected([&](tag_unexpected* u) { arrived.push_back(u); });
  for (tag_unexpected* u : arrived) {
    w.matcher.remove_unexpected(u);
    auto* msg = static_cast<unexpected_msg*>(u);
    msg->windowed = 0;  // the worker is going: nothing is given back
    free_unexpected(msg);
  }
}

void tag_protocol::info(std::ostream& out) const {
  out << "tag queues: expected " << w.matcher.expected_count() << " unexpected "
      << w.matcher.unexpected_count() << '\n';
  uint64_t copies = 0, full = 0;
  size_t held = 0;
  for (const endpoint_impl* ep : w.ep_table) {
    if (ep == nullptr) continue;
    copies += ep->eager_copies;
    full += ep->eager_window_full;
    held += ep->eager_held;
  }
  out << "eager window: " << copies << " large eager copies sent, " << full
      << " sent by rendezvous for want of window; " << held << " B of peers' copies held of "
      << w.eager_window_accepted() << " B per endpoint\n";
  offload.info(out);
}

}  // namespace detail

// -- public API ----------------------------------------------------------------------------------

op endpoint::tag_send(tag_t tag, const void* buffer, size_t length, const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  constexpr uint32_t slow_flags = request_no_immediate_completion | request_immediate_value |
                                  request_force_zcopy | request_force_bcopy | request_force_rndv;
  constexpr size_t header = wire::header_size<wire::schema::TagEager>();
  if (!(params.flags & slow_flags) && params.pack == nullptr &&
      detail::short_path_open(ep, header + length) &&
      length < module_of<tag_protocol>(w).offload.thresh()) {
    auto& writer = module_of<tag_protocol>(w).hdr_tag;
    auto& h = writer.fields();
    h.setDstEp(ep.remote_id);
    h.setTag(tag);
    op result;
    if (detail::try_send_short(ep, detail::wire_id(detail::tag_msg::eager), writer.bytes(),
                               header, buffer, length, params.flags, &result)) {
      return result;
    }
  }
  iov_entry entry{const_cast<void*>(buffer), length};
  return tag_send_iov(tag, &entry, 1, params);
}

op endpoint::tag_send_iov(tag_t tag, const iov_entry* entries, size_t count,
                          const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  if (count > 0 && entries == nullptr) return op{status::invalid_param, nullptr};
  if (ep.state == endpoint_impl::phase::closing) return op{status::not_connected, nullptr};
  request* req = w.alloc_request(detail::tag_send_ops, params);
  auto& s = req->init<detail::tag_send_state>();
  s.tag = tag;
  req->set_iov(entries, count);
  for (size_t i = 0; i < count; ++i) s.send.length += entries[i].length;
  return detail::start_send(ep, req);
}

op worker::tag_recv(void* buffer, size_t length, tag_t tag, tag_t mask,
                    const request_params& params) {
  iov_entry entry{buffer, length};
  return tag_recv_iov(&entry, 1, tag, mask, params);
}

op worker::tag_recv_iov(const iov_entry* entries, size_t count, tag_t tag, tag_t mask,
                        const request_params& params) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (count > 0 && entries == nullptr) return op{status::invalid_param, nullptr};
  tag_protocol& t = module_of<tag_protocol>(w);
  auto* found = static_cast<detail::unexpected_msg*>(w.matcher.match_unexpected(tag, mask, true));
  if (found != nullptr && count == 1 && !found->rndv &&
      !(params.flags & request_no_immediate_completion)) {
    // The common case under load: the message is already here. Copy it out without a request.
    const size_t taken = std::min(found->length, entries[0].length);
    if (taken != 0) std::memcpy(entries[0].buffer, found->data, taken);
    if (params.recv_info != nullptr) {
      *params.recv_info = tag_recv_info{found->tag, taken, found->imm};
    }
    const status st = taken < found->length ? status::message_truncated : status::ok;
    t.free_unexpected(found);
    return op{st, nullptr};
  }
  request* req = w.alloc_request(detail::tag_recv_ops, params);
  auto& s = req->init<detail::tag_recv_state>();
  req->set_iov(entries, count);
  for (size_t i = 0; i < count; ++i) s.length += entries[i].length;
  s.expected.tag = tag;
  s.expected.mask = mask;
  if (found == nullptr) {
    t.post(req, s);
    return w.in_progress(req);
  }
  return t.receive_unexpected(req, found);
}

bool worker::tag_probe(tag_t tag, tag_t mask, tag_recv_info* info, message** out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  auto* found =
      static_cast<detail::unexpected_msg*>(w.matcher.match_unexpected(tag, mask, out != nullptr));
  if (found == nullptr) return false;
  if (info != nullptr) *info = tag_recv_info{found->tag, found->length, found->imm};
  if (out != nullptr) {
    tag_protocol& t = module_of<tag_protocol>(w);
    t.give_back_window(found);
    t.detach(found);  // the user holds it now, not the peer
    *out = reinterpret_cast<message*>(found);
  }
  return true;
}

op worker::tag_recv_message(message* msg, void* buffer, size_t length,
                            const request_params& params) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (msg == nullptr) return op{status::invalid_param, nullptr};
  auto* found = reinterpret_cast<detail::unexpected_msg*>(msg);
  request* req = w.alloc_request(detail::tag_recv_ops, params);
  req->init<detail::tag_recv_state>().length = length;
  req->iov.assign(1, iov_entry{buffer, length});
  return module_of<tag_protocol>(w).receive_unexpected(req, found);
}

size_t worker::cancel_tag_recvs(tag_t tag, tag_t mask) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  std::vector<request*> chosen;
  w.matcher.for_each_expected([&](detail::tag_expected* e) {
    if (((e->tag ^ tag) & mask) == 0) chosen.push_back(tag_protocol::recv_of(e));
  });
  auto sn = [](request* r) { return r->as<detail::tag_recv_state>().expected.sn; };
  std::sort(chosen.begin(), chosen.end(),
            [&](request* a, request* b) { return sn(a) < sn(b); });
  // Out of the matcher first: a callback may post, cancel or release receives.
  tag_protocol& t = module_of<tag_protocol>(w);
  for (request* req : chosen) t.unpost(req->as<detail::tag_recv_state>());
  for (request* req : chosen) w.complete(req, status::canceled);
  return chosen.size();
}

}  // namespace comm
