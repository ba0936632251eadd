// Worker addresses, endpoint creation and the wireup handshake (request, reply, close).
//
// connect() picks a lane, creates an endpoint in the wireup phase and sends a WireupRequest that
// carries our endpoint id and address. The peer creates its own endpoint back to us (the reply
// endpoint for our messages) and answers with a WireupReply naming it; from then on every message
// carries the receiver's endpoint id (dstEp). Sends issued before the reply wait in the pending
// queue.
#include "worker_impl.hpp"

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

/// Copies `length` bytes into 8-byte aligned words for a Cap'n Proto reader.
kj::Array<capnp::word> aligned_words(const void* data, size_t length) {
  auto words = kj::heapArray<capnp::word>((length + 7) / 8);
  std::memset(words.begin(), 0, words.size() * sizeof(capnp::word));
  std::memcpy(words.begin(), data, length);
  return words;
}

/// A decoded worker address.
struct peer_address {
  uint64_t uid = 0;
  std::string name;
  uint64_t client_id = 0;
  struct transport {
    std::string name;
    std::vector<uint8_t> device;
    std::vector<uint8_t> iface;
  };
  std::vector<transport> transports;
};

std::vector<uint8_t> to_vector(capnp::Data::Reader data) {
  return std::vector<uint8_t>(data.begin(), data.end());
}

/// Decodes a packed WorkerAddress; invalid_addr for anything malformed.
status decode_address(const void* data, size_t length, peer_address* out) {
  if (data == nullptr || length < 16 || length % 8 != 0 || length > (1u << 20)) {
    return status::invalid_addr;
  }
  auto words = aligned_words(data, length);
  status result = status::ok;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(words, wire::checked_reader_options());
    auto address = reader.getRoot<wire::schema::WorkerAddress>();
    out->uid = address.getUid();
    out->name = address.getName();
    out->client_id = address.getClientId();
    for (auto t : address.getTransports()) {
      out->transports.push_back({t.getName(), to_vector(t.getDevice()), to_vector(t.getIface())});
    }
  });
  if (failure != nullptr || out->uid == 0) result = status::invalid_addr;
  return result;
}

/// Serialises a Cap'n Proto message into the bytes of a control request.
void to_control(request* req, tl::am_id id, capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  req->control_id = id;
  req->control.assign(bytes.begin(), bytes.end());
}


template <void (worker_impl::*Handler)(const uint8_t*, size_t)>
status dispatch(void* arg, void* data, size_t length, unsigned) {
  (static_cast<worker_impl*>(arg)->*Handler)(static_cast<const uint8_t*>(data), length);
  return status::ok;
}

status dispatch_tag_eager(void* arg, void* data, size_t length, unsigned) {
  static_cast<worker_impl*>(arg)->on_tag_eager(static_cast<const uint8_t*>(data), length, false);
  return status::ok;
}

status dispatch_tag_eager_imm(void* arg, void* data, size_t length, unsigned) {
  static_cast<worker_impl*>(arg)->on_tag_eager(static_cast<const uint8_t*>(data), length, true);
  return status::ok;
}

status dispatch_tag_fragment(void* arg, void* data, size_t length, unsigned) {
  static_cast<worker_impl*>(arg)->on_fragment(static_cast<const uint8_t*>(data), length, true);
  return status::ok;
}

status dispatch_am_fragment(void* arg, void* data, size_t length, unsigned) {
  static_cast<worker_impl*>(arg)->on_fragment(static_cast<const uint8_t*>(data), length, false);
  return status::ok;
}

void on_transport_error(void* arg, tl::ep* failed, status reason) {
  auto* ep = static_cast<endpoint_impl*>(failed->user_data);
  if (ep != nullptr) ep->fail(reason);
}

}  // namespace

std::vector<uint8_t> worker_impl::packed_address() const {
  capnp::MallocMessageBuilder message;
  auto address = message.initRoot<wire::schema::WorkerAddress>();
  address.setUid(uid_);
  address.setName(params.name);
  address.setClientId(params.client_id);
  auto list = address.initTransports(static_cast<unsigned>(ifaces.size()));
  for (size_t i = 0; i < ifaces.size(); ++i) {
    auto entry = list[static_cast<unsigned>(i)];
    entry.setName(std::string(ifaces[i].component->name()));
    auto device = ifaces[i].iface->device_address();
    auto iface = ifaces[i].iface->iface_address();
    entry.setDevice(kj::arrayPtr(device.data(), device.size()));
    entry.setIface(kj::arrayPtr(iface.data(), iface.size()));
  }
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

void worker_impl::install_handlers() {
  for (auto& li : ifaces) {
    tl::iface& i = *li.iface;
    auto set = [&](proto_id id, tl::am_handler_fn fn) {
      i.set_am_handler(static_cast<tl::am_id>(id), fn, this);
    };
    set(proto_id::wireup_request, dispatch<&worker_impl::on_wireup_request>);
    set(proto_id::wireup_reply, dispatch<&worker_impl::on_wireup_reply>);
    set(proto_id::ep_close, dispatch<&worker_impl::on_ep_close>);
    set(proto_id::tag_eager, dispatch_tag_eager);
    set(proto_id::tag_eager_imm, dispatch_tag_eager_imm);
    set(proto_id::tag_eager_first, dispatch<&worker_impl::on_tag_eager_first>);
    set(proto_id::tag_fragment, dispatch_tag_fragment);
    set(proto_id::am_single, dispatch<&worker_impl::on_am_single>);
    set(proto_id::am_first, dispatch<&worker_impl::on_am_first>);
    set(proto_id::am_fragment, dispatch_am_fragment);
    set(proto_id::rndv_rts, dispatch<&worker_impl::on_rndv_rts>);
    set(proto_id::rndv_ats, dispatch<&worker_impl::on_rndv_ats>);
    set(proto_id::rndv_rtr, dispatch<&worker_impl::on_rndv_rtr>);
    set(proto_id::rndv_data, dispatch<&worker_impl::on_rndv_data>);
    set(proto_id::rndv_cancel, dispatch<&worker_impl::on_rndv_cancel>);
    set(proto_id::rndv_refuse, dispatch<&worker_impl::on_rndv_refuse>);
    set(proto_id::rma_request, dispatch<&worker_impl::on_rma_request>);
    set(proto_id::rma_reply, dispatch<&worker_impl::on_rma_reply>);
    i.set_error_handler(on_transport_error, this);
  }
}

status worker_impl::new_ep(bool by_peer, endpoint_impl** out) {
  uint32_t index;
  if (!free_ep_slots.empty()) {
    index = free_ep_slots.back();
    free_ep_slots.pop_back();
  } else {
    if (ep_table.size() >= (1u << 20)) return status::exceeds_limit;
    index = static_cast<uint32_t>(ep_table.size());
    ep_table.push_back(nullptr);
  }
  ep_generation = (ep_generation + 1) & 0xFFFu;
  if (ep_generation == 0) ep_generation = 1;
  const uint32_t id = index | (ep_generation << 20);
  auto* ep = new endpoint_impl(*this, id, by_peer);
  ep_table[index] = ep;
  if (by_peer) ++peer_eps;
  *out = ep;
  return status::ok;
}

status worker_impl::connect_lane(endpoint_impl* ep, const void* data, size_t length) {
  peer_address peer;
  status st = decode_address(data, length, &peer);
  if (st != status::ok) return st;
  for (auto& li : ifaces) {
    for (const auto& t : peer.transports) {
      if (t.name != li.component->name() || !li.iface->is_reachable(t.device, t.iface)) continue;
      std::unique_ptr<tl::ep> lane;
      st = li.iface->create_ep(t.device, t.iface, lane);
      if (st != status::ok) {
        COMM_LOG(warn, "wireup", "%s: cannot create %s endpoint to %s: %s", params.name.c_str(),
                 t.name.c_str(), peer.name.c_str(), to_string(st));
        continue;
      }
      ep->peer_uid_ = peer.uid;
      ep->peer_name_ = peer.name;
      ep->attach_lane(std::move(lane), li.iface.get());
      COMM_LOG(debug, "wireup", "%s: endpoint %u to %s via %s", params.name.c_str(), ep->id,
               peer.name.c_str(), t.name.c_str());
      return status::ok;
    }
  }
  COMM_LOG(info, "wireup", "%s: no transport reaches %s", params.name.c_str(), peer.name.c_str());
  return status::unreachable;
}

status worker_impl::create_ep(const void* data, size_t length, bool by_peer, endpoint_impl** out) {
  endpoint_impl* ep = nullptr;
  status st = new_ep(by_peer, &ep);
  if (st != status::ok) return st;
  st = connect_lane(ep, data, length);
  if (st != status::ok) {
    const uint32_t index = ep->id & 0xFFFFFu;
    ep_table[index] = nullptr;
    free_ep_slots.push_back(index);
    if (by_peer) --peer_eps;
    delete ep;
    return st;
  }
  *out = ep;
  return status::ok;
}

void worker_impl::destroy_ep(endpoint_impl* ep) {
  const uint32_t index = ep->id & 0xFFFFFu;
  if (index < ep_table.size() && ep_table[index] == ep) {
    forget_unexpected_from(ep, eager_fate::detach);
    if (ep->created_by_peer) --peer_eps;
    ep_table[index] = nullptr;
    free_ep_slots.push_back(index);
    closed_ids[closed_next++ % closed_ids.size()] = ep->id;
    doomed.push_back(ep);
  }
}

void worker_impl::on_wireup_request(const uint8_t* data, size_t length) {
  auto words = aligned_words(data, length);
  uint32_t src_ep = 0;
  std::vector<uint8_t> address;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(words, wire::checked_reader_options());
    auto request = reader.getRoot<wire::schema::WireupRequest>();
    src_ep = request.getSrcEp();
    address = to_vector(request.getAddress());
  });
  if (failure != nullptr || length % 8 != 0) {
    protocol_error(nullptr, "wireup request is not a valid message");
    return;
  }
  if (peer_eps >= ctx.cfg().limits.peer_ep_max && !make_room_for_peer_ep()) {
    return refuse_wireup(address, src_ep);
  }
  endpoint_impl* ep = nullptr;
  status st = create_ep(address.data(), address.size(), true, &ep);
  if (st != status::ok) {
    COMM_LOG(error, "wireup", "%s: cannot answer a wireup request: %s", params.name.c_str(),
             to_string(st));
    return;
  }
  ep->remote_id = src_ep;
  ep->state = endpoint_impl::phase::connected;
  wire::header_writer<wire::schema::WireupReply> reply;
  reply.fields().setDstEp(src_ep);
  reply.fields().setSrcEp(ep->id);
  reply.fields().setStatus(0);
  auto bytes = static_cast<const uint8_t*>(reply.bytes());
  queue_control(ep, proto_id::wireup_reply, std::vector<uint8_t>(bytes, bytes + reply.size()));
}

void worker_impl::on_wireup_reply(const uint8_t* data, size_t length) {
  auto reply = wire::read_header<wire::schema::WireupReply>(data, length);
  if (!reply) {
    protocol_error(nullptr, "truncated wireup reply");
    return;
  }
  endpoint_impl* ep = find_ep(reply->getDstEp());
  if (ep == nullptr || ep->state != endpoint_impl::phase::wireup) {
    protocol_error(ep, "wireup reply for an endpoint not waiting for one");
    return;
  }
  if (reply->getStatus() != 0) {
    const auto refusal = static_cast<status>(reply->getStatus());
    if (!is_error(refusal)) {
      // A refusal must be an error; anything else would leave a failed endpoint reading as ok.
      protocol_error(ep, "wireup reply with a status that is not an error");
      return;
    }
    ep->fail(refusal);
    return;
  }
  ep->remote_id = reply->getSrcEp();
  ep->state = endpoint_impl::phase::connected;
  if (!ep->dispatch_pending()) ep->wait_for_resources();
}

void worker_impl::on_ep_close(const uint8_t* data, size_t length) {
  auto header = wire::read_header<wire::schema::EndpointClose>(data, length);
  if (!header) {
    protocol_error(nullptr, "truncated endpoint close");
    return;
  }
  endpoint_impl* ep = find_ep(header->getDstEp());
  if (ep == nullptr) return;  // already gone: closes may cross
  ep->fail(status::not_connected);
  if (ep->created_by_peer) destroy_ep(ep);
}

}  // namespace detail

status worker::query_address(const void* address, size_t length, worker_address_attr* out) {
  detail::peer_address peer;
  status st = detail::decode_address(address, length, &peer);
  if (st != status::ok) return st;
  out->uid = peer.uid;
  out->name = peer.name;
  out->client_id = peer.client_id;
  out->transports.clear();
  for (const auto& t : peer.transports) out->transports.push_back(t.name);
  return status::ok;
}

status worker::connect(const std::vector<uint8_t>& peer_address, endpoint** out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (out == nullptr) return status::invalid_param;
  endpoint_impl* ep = nullptr;
  status st = w.create_ep(peer_address.data(), peer_address.size(), false, &ep);
  if (st != status::ok) return st;
  request* wireup = w.alloc_request(request::kind::control, request_params{});
  wireup->ep = ep;
  capnp::MallocMessageBuilder message;
  auto body = message.initRoot<wire::schema::WireupRequest>();
  body.setSrcEp(ep->id);
  auto address = w.packed_address();
  body.setAddress(kj::arrayPtr(address.data(), address.size()));
  detail::to_control(wireup, static_cast<tl::am_id>(detail::proto_id::wireup_request), message);
  ep->push_pending(wireup);
  if (!ep->dispatch_pending()) ep->wait_for_resources();
  *out = ep;
  return status::ok;
}

}  // namespace comm
