// Tagged messages: the send entry points and the receive side of the eager protocols (whole
// messages, first fragments and later fragments), matched against posted receives or kept as
// unexpected messages.
#include "iov.hpp"
#include "worker_impl.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::worker_impl;

namespace detail {
namespace {

/// Largest eager message a receiver accepts (larger ones belong to rendezvous).
constexpr uint64_t max_eager_message = 1ull << 30;

request* request_of(tag_expected* e) {
  return request::of_expected(e);
}

}  // namespace

void worker_impl::copy_to_recv(request* req, size_t offset, const uint8_t* data, size_t length) {
  const size_t end = std::min(offset + length, req->length);
  if (end > req->info.length) req->info.length = end;
  if (offset < end) iov_scatter(req->iov, offset, data, end - offset);
}

void worker_impl::finish_recv(request* req) {
  complete(req, req->received > req->length ? status::message_truncated : status::ok);
}

namespace {

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

}  // namespace

unexpected_msg* worker_impl::new_unexpected(endpoint_impl* ep, tag_t tag, uint64_t imm,
                                            size_t length, size_t extra) {
  const int tier = unexpected_tier(sizeof(unexpected_msg) + length);
  const size_t footprint =
      tier >= 0 ? unexpected_block_sizes[tier] : sizeof(unexpected_msg) + length;
  if (!charge_unexpected(ep, footprint + extra, 1)) return nullptr;
  void* block = nullptr;
  if (tier >= 0 && !unexpected_pool[tier].empty()) {
    block = unexpected_pool[tier].back();
    unexpected_pool[tier].pop_back();
  } else {
    block = std::malloc(footprint);
  }
  if (block == nullptr) {
    uncharge_unexpected(ep, footprint + extra, 1);
    COMM_LOG(error, "tag", "%s: out of memory for an unexpected message of %zu bytes",
             params.name.c_str(), length);
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

void worker_impl::free_unexpected(unexpected_msg* msg) {
  uncharge_unexpected(msg->from, msg->charged, 1);
  std::free(msg->grown);
  const int tier = msg->pool_tier;
  msg->~unexpected_msg();
  if (tier >= 0 && unexpected_pool[tier].size() < unexpected_pool_limits[tier]) {
    unexpected_pool[tier].push_back(msg);
  } else {
    std::free(msg);
  }
}

bool worker_impl::reserve_unexpected(unexpected_msg* msg, size_t needed) {
  if (needed <= msg->capacity) return true;
  size_t capacity = std::max<size_t>(msg->capacity * 2, 64 * 1024);
  capacity = std::min(std::max(capacity, needed), msg->length);
  const size_t growth = capacity - msg->capacity;
  if (!charge_unexpected(msg->from, growth, 0)) return false;
  void* bigger = std::realloc(msg->grown, capacity);
  if (bigger == nullptr) {
    uncharge_unexpected(msg->from, growth, 0);
    return false;
  }
  msg->charged += growth;
  msg->grown = static_cast<uint8_t*>(bigger);
  msg->data = msg->grown;
  msg->capacity = capacity;
  return true;
}

/// A whole message arrived on `ep`: complete a matching receive or keep it as unexpected.
static void deliver_tag(worker_impl& w, endpoint_impl* ep, tag_t tag, uint64_t imm,
                        const uint8_t* data, size_t length) {
  tag_expected* e = w.matcher.match_expected(tag);
  if (e != nullptr) {
    request* req = request_of(e);
    req->matched = true;
    req->info.sender_tag = tag;
    req->info.imm = imm;
    worker_impl::copy_to_recv(req, 0, data, length);
    req->received = length;
    w.finish_recv(req);
    return;
  }
  unexpected_msg* msg = w.new_unexpected(ep, tag, imm, length);
  if (msg == nullptr) return;  // a limit failed the endpoint, or no memory (logged)
  if (length != 0) std::memcpy(msg->data, data, length);
  msg->received = length;
  w.matcher.add_unexpected(msg);
}

void worker_impl::on_tag_eager(const uint8_t* data, size_t length, bool with_imm) {
  size_t used = 0;
  uint32_t dst;
  tag_t tag;
  uint64_t imm = 0;
  if (with_imm) {
    auto h = wire::read_header<wire::schema::TagEagerImm>(data, length, &used);
    if (!h) return protocol_error(nullptr, "truncated tag header");
    dst = h->getDstEp();
    tag = h->getTag();
    imm = h->getImm();
  } else {
    auto h = wire::read_header<wire::schema::TagEager>(data, length, &used);
    if (!h) return protocol_error(nullptr, "truncated tag header");
    dst = h->getDstEp();
    tag = h->getTag();
  }
  endpoint_impl* ep = receiving_ep(dst, "tagged message for an unknown endpoint");
  if (ep == nullptr) return;
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += length - used;
  deliver_tag(*this, ep, tag, imm, data + used, length - used);
}

void worker_impl::out_of_room(endpoint_impl* ep) {
  // A limit has failed the endpoint already; otherwise memory ran out.
  if (ep->state != endpoint_impl::phase::failed) {
    protocol_error(ep, "no memory for an unexpected message");
  }
}

void worker_impl::on_tag_eager_first(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::TagEagerFirst>(data, length, &used);
  if (!h) return protocol_error(nullptr, "truncated first-fragment header");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "fragment for an unknown endpoint");
  if (ep == nullptr) return;
  const uint64_t total = h->getTotalLength();
  const size_t payload = length - used;
  if (ep->rx.active) return protocol_error(ep, "new message before the previous one ended");
  if (total > max_eager_message || payload > total) {
    return protocol_error(ep, "first fragment with an impossible total length");
  }
  rx_fragments& rx = ep->rx;
  rx = rx_fragments{};
  rx.active = true;
  rx.is_tag = true;
  rx.msg_id = h->getMsgId();
  rx.total = total;
  rx.received = payload;
  ++ep->counters_.messages_received;
  ep->counters_.bytes_received += payload;
  tag_expected* e = matcher.match_expected(h->getTag());
  if (e != nullptr) {
    request* req = request_of(e);
    req->matched = true;
    req->info.sender_tag = h->getTag();
    req->info.imm = h->getImm();
    copy_to_recv(req, 0, data + used, payload);
    rx.recv = req;
  } else {
    rx.unexpected = new_unexpected(ep, h->getTag(), h->getImm(), 0);
    if (rx.unexpected == nullptr) return out_of_room(ep);
    rx.unexpected->length = total;
    if (!reserve_unexpected(rx.unexpected, payload)) return out_of_room(ep);
    if (payload != 0) std::memcpy(rx.unexpected->data, data + used, payload);
  }
  if (rx.received == rx.total) finish_tag_fragments(ep);
}

void worker_impl::on_fragment(const uint8_t* data, size_t length, bool is_tag) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::FragmentMiddle>(data, length, &used);
  if (!h) return protocol_error(nullptr, "truncated fragment header");
  endpoint_impl* ep = receiving_ep(h->getDstEp(), "fragment for an unknown endpoint");
  if (ep == nullptr) return;
  rx_fragments& rx = ep->rx;
  const size_t payload = length - used;
  if (!rx.active || rx.is_tag != is_tag || rx.msg_id != h->getMsgId() ||
      h->getOffset() != rx.received || payload > rx.total - rx.received) {
    return protocol_error(ep, "fragment out of sequence or beyond the message");
  }
  ep->counters_.bytes_received += payload;
  if (!is_tag) return on_am_fragment(ep, data + used, payload);
  if (rx.recv != nullptr) {
    copy_to_recv(rx.recv, rx.received, data + used, payload);
  } else {
    if (!reserve_unexpected(rx.unexpected, rx.received + payload)) return out_of_room(ep);
    std::memcpy(rx.unexpected->data + rx.received, data + used, payload);
  }
  rx.received += payload;
  if (rx.received == rx.total) finish_tag_fragments(ep);
}

void worker_impl::finish_tag_fragments(endpoint_impl* ep) {
  request* req = ep->rx.recv;
  unexpected_msg* msg = ep->rx.unexpected;
  const size_t total = ep->rx.total;
  ep->rx = rx_fragments{};
  if (req != nullptr) {
    req->received = total;
    finish_recv(req);
  } else if (msg != nullptr) {
    msg->received = total;
    // A receive posted while the fragments arrived was not matched against this message (it was
    // not in the unexpected queue yet): it takes the message now, ahead of later arrivals.
    if (tag_expected* e = matcher.match_expected(msg->tag)) {
      request* late = request_of(e);
      late->matched = true;
      late->info.sender_tag = msg->tag;
      late->info.imm = msg->imm;
      copy_to_recv(late, 0, msg->data, msg->length);
      late->received = msg->length;
      free_unexpected(msg);
      finish_recv(late);
    } else {
      matcher.add_unexpected(msg);
    }
  }
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
  if (ep.state == endpoint_impl::phase::connected && ep.pending_head == nullptr &&
      !(params.flags & slow_flags) && params.pack == nullptr &&
      header + length <= ep.short_limit) {
    auto& h = w.hdr_tag.fields();
    h.setDstEp(ep.remote_id);
    h.setTag(tag);
    status st = ep.lane->am_short(static_cast<tl::am_id>(detail::proto_id::tag_eager),
                                  w.hdr_tag.bytes(), header, buffer, length);
    if (st == status::ok) {
      ++ep.counters_.messages_sent;
      ep.counters_.bytes_sent += length;
      return op{};
    }
    if (st != status::no_resource) return op{st, nullptr};
    if (params.flags & request_force_immediate) return op{st, nullptr};
  }
  iov_entry entry{const_cast<void*>(buffer), length};
  return tag_send_iov(tag, &entry, 1, params);
}

size_t worker::cancel_tag_recvs(tag_t tag, tag_t mask) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  std::vector<request*> chosen;
  w.matcher.for_each_expected([&](detail::tag_expected* e) {
    if (((e->tag ^ tag) & mask) == 0) chosen.push_back(request::of_expected(e));
  });
  std::sort(chosen.begin(), chosen.end(),
            [](const request* a, const request* b) { return a->expected.sn < b->expected.sn; });
  // Out of the matcher first: a callback may post, cancel or release receives.
  for (request* req : chosen) w.matcher.remove_expected(&req->expected);
  for (request* req : chosen) w.complete(req, status::canceled);
  return chosen.size();
}

op endpoint::tag_send_iov(tag_t tag, const iov_entry* entries, size_t count,
                          const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl& w = ep.owner;
  worker_impl::guard g(w);
  if (count > 0 && entries == nullptr) return op{status::invalid_param, nullptr};
  if (ep.state == endpoint_impl::phase::closing) return op{status::not_connected, nullptr};
  request* req = w.alloc_request(request::kind::tag_send, params);
  req->tag = tag;
  req->iov.assign(entries, entries + count);
  for (size_t i = 0; i < count; ++i) req->length += entries[i].length;
  return detail::start_send(ep, req);
}

}  // namespace comm
