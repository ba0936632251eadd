// The wireup module: the handshake of worker::connect (request, reply) and close notices.
#include "wireup.hpp"

#include "protocols.hpp"
#include "send.hpp"

#include <comm/log.hpp>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::worker_impl;

namespace detail {
namespace {

/// Refusals of wireup requests answered beyond COMM_PEER_EP_MAX at once (each needs a short-lived
/// endpoint to carry the answer); later ones are dropped unanswered.
constexpr size_t max_refusals_in_flight = 64;

}  // namespace

wireup_protocol::wireup_protocol(worker_impl& owner, unsigned index) : protocol(owner, index) {
  receive<&wireup_protocol::on_request>(wireup_msg::request);
  receive<&wireup_protocol::on_reply>(wireup_msg::reply);
  receive<&wireup_protocol::on_close>(wireup_msg::close);
}

void wireup_protocol::start(endpoint_impl& ep) {
  request* wireup = w.alloc_request(control_ops, request_params{}, request::role::control);
  wireup->ep = &ep;
  wireup->init<control_state>().id = wire_id(wireup_msg::request);
  capnp::MallocMessageBuilder message;
  auto body = message.initRoot<wire::schema::WireupRequest>();
  body.setSrcEp(ep.id);
  auto address = w.packed_address();
  body.setAddress(kj::arrayPtr(address.data(), address.size()));
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  wireup->wire.assign(bytes.begin(), bytes.end());
  ep.push_pending(wireup);
  if (!ep.dispatch_pending()) ep.wait_for_resources();
}

void wireup_protocol::reply(endpoint_impl* ep, uint32_t src_ep, uint32_t our_ep, status st) {
  wire::header_writer<wire::schema::WireupReply> writer;
  writer.fields().setDstEp(src_ep);
  writer.fields().setSrcEp(our_ep);
  writer.fields().setStatus(static_cast<int16_t>(st));
  auto bytes = static_cast<const uint8_t*>(writer.bytes());
  w.queue_control(ep, wire_id(wireup_msg::reply),
                  std::vector<uint8_t>(bytes, bytes + writer.size()));
}

void wireup_protocol::on_request(const uint8_t* data, size_t length) {
  uint32_t src_ep = 0;
  std::vector<uint8_t> address;
  const bool valid = wire::read_checked_message<wire::schema::WireupRequest>(
      data, length, [&](wire::schema::WireupRequest::Reader request) {
        src_ep = request.getSrcEp();
        auto bytes = request.getAddress();
        address.assign(bytes.begin(), bytes.end());
      });
  if (!valid) {
    w.protocol_error(nullptr, "wireup request is not a valid message");
    return;
  }
  if (w.peer_eps >= w.ctx.cfg().limits.peer_ep_max && !w.make_room_for_peer_ep()) {
    return refuse(address, src_ep);
  }
  endpoint_impl* ep = nullptr;
  status st = w.create_ep(address.data(), address.size(), true, &ep);
  if (st != status::ok) {
    COMM_LOG(error, "wireup", "%s: cannot answer a wireup request: %s", w.params.name.c_str(),
             to_string(st));
    return;
  }
  ep->remote_id = src_ep;
  ep->state = endpoint_impl::phase::connected;
  reply(ep, src_ep, ep->id, status::ok);
}

void wireup_protocol::refuse(const std::vector<uint8_t>& address, uint32_t src_ep) {
  const size_t limit = w.ctx.cfg().limits.peer_ep_max;
  const bool log = w.count_limit_error();
  const bool answer = w.peer_eps < limit + max_refusals_in_flight;
  if (log) {
    COMM_LOG(warn, "limits", "%s: refused a peer's wireup request: COMM_PEER_EP_MAX=%zu endpoints "
             "created by peers%s (%llu so far)", w.params.name.c_str(), limit,
             answer ? "" : ", too many refusals under way to answer it",
             static_cast<unsigned long long>(w.limit_errors));
  }
  endpoint_impl* ep = nullptr;
  if (!answer || w.create_ep(address.data(), address.size(), true, &ep) != status::ok) return;
  // A short-lived endpoint carries the refusal, then closes (and is freed) behind it.
  ep->remote_id = src_ep;
  ep->state = endpoint_impl::phase::connected;
  reply(ep, src_ep, 0, status::exceeds_limit);
  op closing = ep->close();
  if (closing.pending()) w.release(closing.req);
}

void wireup_protocol::on_reply(const uint8_t* data, size_t length) {
  auto reply = wire::read_header<wire::schema::WireupReply>(data, length);
  if (!reply) {
    w.protocol_error(nullptr, "truncated wireup reply");
    return;
  }
  endpoint_impl* ep = w.find_ep(reply->getDstEp());
  if (ep == nullptr || ep->state != endpoint_impl::phase::wireup) {
    w.protocol_error(ep, "wireup reply for an endpoint not waiting for one");
    return;
  }
  if (reply->getStatus() != 0) {
    const auto refusal = static_cast<status>(reply->getStatus());
    if (!is_error(refusal)) {
      // A refusal must be an error; anything else would leave a failed endpoint reading as ok.
      w.protocol_error(ep, "wireup reply with a status that is not an error");
      return;
    }
    ep->fail(refusal);
    return;
  }
  ep->remote_id = reply->getSrcEp();
  ep->state = endpoint_impl::phase::connected;
  if (!ep->dispatch_pending()) ep->wait_for_resources();
}

void wireup_protocol::on_close(const uint8_t* data, size_t length) {
  auto header = wire::read_header<wire::schema::EndpointClose>(data, length);
  if (!header) {
    w.protocol_error(nullptr, "truncated endpoint close");
    return;
  }
  endpoint_impl* ep = w.find_ep(header->getDstEp());
  if (ep == nullptr) return;  // already gone: closes may cross
  // A peer that keeps to the protocol flushed before telling us (send.cpp's close). One that does
  // not may leave a fetch of ours in flight: it ends once the endpoint's lane is gone, before the
  // endpoint is freed (rndv's endpoint_deleted).
  ep->peer_closed();
  if (ep->created_by_peer) w.destroy_ep(ep);
}

}  // namespace detail

status worker::connect(const std::vector<uint8_t>& peer_address, endpoint** out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (out == nullptr) return status::invalid_param;
  endpoint_impl* ep = nullptr;
  status st = w.create_ep(peer_address.data(), peer_address.size(), false, &ep);
  if (st != status::ok) return st;
  detail::module_of<detail::wireup_protocol>(w).start(*ep);
  *out = ep;
  return status::ok;
}

}  // namespace comm
