// The RMA module: memory registration, remote keys, and put/get with DAT's RDMA-read semantics.
#include "rma.hpp"

#include "iov.hpp"
#include "protocols.hpp"

#include <comm/log.hpp>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <sys/random.h>

#include <algorithm>
#include <cstring>

namespace comm {

/// A registration on every memory domain of a worker.
class memh {
public:
  void* address = nullptr;  ///< start of the region
  size_t length = 0;        ///< bytes in the region
  /// One registration per interface that has a memory domain.
  std::vector<std::pair<detail::worker_impl::lane_iface*, tl::mem_handle*>> regs;
  uint64_t token = 0;       ///< names it to software RMA from peers on lanes without get/put
};

/// A peer's region as seen through one endpoint.
class rkey {
public:
  detail::endpoint_impl* ep = nullptr;  ///< the endpoint it was unpacked for
  tl::remote_key key;                   ///< the transport's unpacked key
  uint64_t base = 0;                    ///< start of the remote region
  uint64_t length = 0;                  ///< bytes in the remote region
  bool software = false;                ///< the lane has no get/put: RMA by messages
  uint64_t token = 0;                   ///< the owner's software-RMA token
};

using detail::endpoint_impl;
using detail::impl;
using detail::module_of;
using detail::rma_protocol;
using detail::worker_impl;

namespace detail {
namespace {

/// Chunks of software gets in flight per endpoint. The owner answers each with a bcopy buffer of
/// data, so this bounds what it queues for us to well below its COMM_REPLY_EP_MAX_BYTES.
constexpr unsigned max_software_reads = 16;

/// Checks [address, address + length) against the region of `key`.
status check_range(const rkey& key, uint64_t address, size_t length) {
  if (address < key.base || address - key.base > key.length ||
      (address - key.base == key.length && length != 0)) {
    return status::protection_error;
  }
  if (length > key.length - (address - key.base)) return status::length_error;
  return status::ok;
}

/// The module's state on an endpoint.
struct rma_ep_state : endpoint_state {
  unsigned reads_in_flight = 0;  ///< gets outstanding on the lane
};

/// The transport completed the operations of an RMA request (or a software one's replies).
void on_done(tl::completion* comp) {
  auto* req = request::of_completion(comp);
  auto& s = req->as<rma_state>();
  endpoint_impl* ep = req->ep;
  req->tl_in_flight = 0;
  if (s.reads != 0) {
    module_of<rma_protocol>(*req->owner).reads_in_flight(*ep) -= s.reads;
    s.reads = 0;
  }
  const bool is_get = s.is_get;
  req->st = comp->result;
  if (req->issuing) return;
  ep->complete_in_order();
  // A get that stopped for max_outstanding_reads goes on now that one is over.
  if (is_get) ep->resume_pending();
}

void release_op(request* req) {
  module_of<rma_protocol>(*req->owner).release(req->as<rma_state>());
}

const request_ops get_ops{.name = "get", .progress = rma_protocol::progress_op,
                          .release = release_op};
const request_ops put_ops{.name = "put", .progress = rma_protocol::progress_op,
                          .release = release_op};

}  // namespace

rma_protocol::rma_protocol(worker_impl& owner, unsigned index) : protocol(owner, index) {
  receive<&rma_protocol::on_request>(rma_msg::request);
  receive<&rma_protocol::on_reply>(rma_msg::reply);
}

unsigned& rma_protocol::reads_in_flight(endpoint_impl& ep) {
  return state_of<rma_ep_state>(ep).reads_in_flight;
}

void rma_protocol::release(rma_state& s) {
  if (s.id == 0) return;
  ops_.erase(s.id);
  s.id = 0;
}

status rma_protocol::send_by_messages(request* req, rma_state& s) {
  endpoint_impl& ep = *req->ep;
  unsigned& reads = reads_in_flight(ep);
  if (!s.key->software) return status::unsupported;
  if (!req->has_started) {
    status st = check_range(*s.key, s.remote_address, s.length);
    if (st != status::ok) return st;
    if (s.is_get && (((req->params.flags & request_fence) && reads > 0) ||
                     reads >= max_software_reads)) {
      return status::no_resource;
    }
    req->tl_completion = tl::completion{on_done, 1, status::ok};
    s.id = next_id_++;
    ops_[s.id] = req;
    req->holds = true;
  }
  const size_t room = ep.lane_attr->max_bcopy - 64;
  req->issuing = true;
  while (s.offset < s.length || !req->has_started) {
    if (s.is_get && req->has_started && reads >= max_software_reads) {
      req->issuing = false;
      return status::no_resource;  // resumed as replies arrive (on_reply)
    }
    const size_t chunk = std::min(room, s.length - s.offset);
    wire::header_writer<wire::schema::RmaRequest> writer;
    auto h = writer.fields();
    h.setDstEp(ep.remote_id);
    h.setIsGet(s.is_get);
    h.setReqId(s.id);
    h.setToken(s.key->token);
    h.setAddress(s.remote_address + s.offset);
    h.setLength(chunk);
    struct piece {
      const void* header;
      size_t header_length;
      const request* req;
      size_t offset;
      size_t chunk;
      bool with_data;
    } p{writer.bytes(), writer.size(), req, s.offset, chunk, !s.is_get};
    ssize_t n = ep.lane->am_bcopy(
        wire_id(rma_msg::request),
        [](void* dest, void* arg) -> size_t {
          auto* pc = static_cast<piece*>(arg);
          auto* out = static_cast<uint8_t*>(dest);
          std::memcpy(out, pc->header, pc->header_length);
          if (!pc->with_data) return pc->header_length;
          iov_gather(pc->req->iov, pc->offset, out + pc->header_length, pc->chunk);
          return pc->header_length + pc->chunk;
        },
        &p);
    if (n < 0) {
      req->issuing = false;
      return static_cast<status>(n);  // no_resource: resumed from the pending queue
    }
    ++req->tl_completion.count;
    if (s.is_get) {
      ++s.reads;
      ++reads;
    }
    req->has_started = true;
    s.offset += chunk;
  }
  ++ep.counters_.messages_sent;
  ep.counters_.bytes_sent += s.length;
  tl::complete(&req->tl_completion, status::ok);  // drops the guard; the replies finish the rest
  req->issuing = false;
  return status::ok;
}

status rma_protocol::progress_op(request* req) {
  auto& s = req->as<rma_state>();
  rma_protocol& rma = module_of<rma_protocol>(*req->owner);
  endpoint_impl& ep = *req->ep;
  const tl::iface_attr& a = *ep.lane_attr;
  if (s.key->software || !(a.caps & (s.is_get ? tl::cap_get_zcopy : tl::cap_put_zcopy))) {
    return rma.send_by_messages(req, s);
  }
  unsigned& reads = rma.reads_in_flight(ep);
  if (s.is_get) {
    if ((req->params.flags & request_fence) && reads > 0) return status::no_resource;
    if (a.max_outstanding_reads != 0 && reads >= a.max_outstanding_reads) {
      return status::no_resource;
    }
  }
  status st = check_range(*s.key, s.remote_address, s.length);
  if (st != status::ok) return st;
  const size_t max_chunk = std::max<size_t>(s.is_get ? a.max_get_zcopy : a.max_put_zcopy, 1);
  const size_t max_entries = std::min<size_t>(16, std::max<size_t>(a.max_iov, 1));
  req->tl_completion = tl::completion{on_done, 1, status::ok};
  req->issuing = true;
  size_t offset = 0;
  st = status::ok;
  do {
    size_t chunk = std::min(max_chunk, s.length - offset);
    tl::iov entries[16];
    const size_t count = iov_slice(req->iov, offset, &chunk, entries, max_entries);
    ++req->tl_completion.count;
    const uint64_t remote = s.remote_address + offset;
    st = s.is_get ? ep.lane->get_zcopy(entries, count, remote, s.key->key, &req->tl_completion)
                  : ep.lane->put_zcopy(entries, count, remote, s.key->key, &req->tl_completion);
    if (st != status::in_progress) --req->tl_completion.count;
    if (st == status::in_progress && s.is_get) {
      ++s.reads;
      ++reads;
    }
    if (is_error(st)) break;
    offset += chunk;
  } while (offset < s.length);
  req->has_started = true;
  if (is_error(st) && offset == 0 && req->tl_completion.count == 1) {
    req->issuing = false;
    req->tl_completion.count = 0;
    return st;
  }
  ++ep.counters_.messages_sent;
  ep.counters_.bytes_sent += offset;
  tl::complete(&req->tl_completion, is_error(st) ? st : status::ok);
  req->issuing = false;
  return status::ok;
}

op rma_protocol::start(endpoint_impl& ep, bool is_get, const iov_entry* local, size_t count,
                       uint64_t remote_address, rkey* key, const request_params& params) {
  if ((count > 0 && local == nullptr) || key == nullptr || key->ep != &ep) {
    return op{status::invalid_param, nullptr};
  }
  if (ep.state == endpoint_impl::phase::closing) return op{status::not_connected, nullptr};
  request* req = w.alloc_request(is_get ? get_ops : put_ops, params);
  auto& s = req->init<rma_state>();
  s.is_get = is_get;
  req->set_iov(local, count);
  for (size_t i = 0; i < count; ++i) s.length += local[i].length;
  s.remote_address = remote_address;
  s.key = key;
  op result = start_send(ep, req);
  if ((params.flags & request_completion_suppressed) && result.pending()) {
    // Unsignalled: the caller gets no request; it still counts for flush.
    if (result.req->finished) {
      w.free_request(result.req);
    } else {
      result.req->params.send_cb = nullptr;
      result.req->released = true;
    }
    return op{};
  }
  return result;
}

void rma_protocol::add_region(memh* handle) {
  while (handle->token == 0 || regions_.count(handle->token) != 0) {
    if (getrandom(&handle->token, sizeof(handle->token), 0) != sizeof(handle->token)) {
      handle->token = reinterpret_cast<uintptr_t>(handle) ^ w.uid_;
    }
  }
  regions_[handle->token] = handle;
}

bool rma_protocol::remove_region(memh* handle) { return regions_.erase(handle->token) != 0; }

void rma_protocol::on_request(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::RmaRequest>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated RMA request");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "RMA request for an unknown endpoint");
  if (ep == nullptr) return;
  const bool is_get = h->getIsGet();
  const uint64_t address = h->getAddress(), count = h->getLength();
  if (!is_get && count != length - used) {
    return w.protocol_error(ep, "RMA put with wrong length");
  }
  status st = status::ok;
  auto it = regions_.find(h->getToken());
  if (it == regions_.end()) {
    st = status::protection_error;
  } else {
    rkey region;
    region.base = reinterpret_cast<uintptr_t>(it->second->address);
    region.length = it->second->length;
    st = check_range(region, address, count);
  }
  if (st == status::ok && count > ep->lane_attr->max_bcopy) st = status::length_error;
  if (st == status::ok && !is_get && count != 0) {
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(address)), data + used, count);
  }
  wire::header_writer<wire::schema::RmaReply> writer;
  writer.fields().setDstEp(ep->remote_id);
  writer.fields().setReqId(h->getReqId());
  writer.fields().setAddress(address);
  writer.fields().setStatus(static_cast<int16_t>(st));
  auto header = static_cast<const uint8_t*>(writer.bytes());
  std::vector<uint8_t> reply(header, header + writer.size());
  if (st == status::ok && is_get && count != 0) {
    const auto* source = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(address));
    reply.insert(reply.end(), source, source + count);
  }
  w.queue_control(ep, wire_id(rma_msg::reply), std::move(reply));
}

void rma_protocol::on_reply(const uint8_t* data, size_t length) {
  size_t used = 0;
  auto h = wire::read_header<wire::schema::RmaReply>(data, length, &used);
  if (!h) return w.protocol_error(nullptr, "truncated RMA reply");
  endpoint_impl* ep = w.receiving_ep(h->getDstEp(), "RMA reply for an unknown endpoint");
  if (ep == nullptr) return;
  auto it = ops_.find(h->getReqId());
  if (it == ops_.end()) return;  // the request failed or was released meanwhile
  request* req = it->second;
  auto& s = req->as<rma_state>();
  const status st = static_cast<status>(h->getStatus());
  const size_t payload = length - used;
  const uint64_t offset = h->getAddress() - s.remote_address;
  if (req->ep != ep || (s.is_get && !is_error(st) &&
                        (h->getAddress() < s.remote_address || offset > s.length ||
                         payload > s.length - offset))) {
    return w.protocol_error(ep, "RMA reply that does not fit its request");
  }
  if (s.is_get && !is_error(st) && payload != 0) {
    iov_scatter(req->iov, offset, data + used, payload);
  }
  if (s.reads != 0) {
    --s.reads;
    --reads_in_flight(*ep);
  }
  tl::complete(&req->tl_completion, is_error(st) ? st : status::ok);
  // A get that stopped at max_software_reads goes on now that a chunk is back.
  ep->resume_pending();
}

void rma_protocol::info(std::ostream& out) const {
  out << "rma: registered regions " << regions_.size() << ", software operations awaiting "
      << "replies " << ops_.size() << '\n';
}

}  // namespace detail

// -- worker: registration ------------------------------------------------------------------------

status worker::mem_map(void* address, size_t length, memh** out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (out == nullptr || (address == nullptr && length != 0)) return status::invalid_param;
  auto handle = std::make_unique<memh>();
  handle->address = address;
  handle->length = length;
  for (auto& li : w.ifaces) {
    tl::md* md = li.iface->memory_domain();
    if (md == nullptr) continue;
    tl::mem_handle* reg = nullptr;
    status st = md->mem_reg(address, length, &reg);
    if (st != status::ok) {
      for (auto& [owner, r] : handle->regs) owner->iface->memory_domain()->mem_dereg(r);
      return st;
    }
    handle->regs.emplace_back(&li, reg);
  }
  module_of<rma_protocol>(w).add_region(handle.get());
  *out = handle.release();
  return status::ok;
}

status worker::mem_unmap(memh* handle) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (handle == nullptr) return status::invalid_param;
  if (!module_of<rma_protocol>(w).remove_region(handle)) return status::invalid_param;
  for (auto& [li, reg] : handle->regs) li->iface->memory_domain()->mem_dereg(reg);
  delete handle;
  return status::ok;
}

status worker::rkey_pack(const memh* handle, std::vector<uint8_t>& out) const {
  if (handle == nullptr) return status::invalid_param;
  capnp::MallocMessageBuilder message;
  auto bundle = message.initRoot<wire::schema::RemoteKeyBundle>();
  bundle.setAddress(reinterpret_cast<uintptr_t>(handle->address));
  bundle.setLength(handle->length);
  bundle.setToken(handle->token);
  auto entries = bundle.initEntries(static_cast<unsigned>(handle->regs.size()));
  for (size_t i = 0; i < handle->regs.size(); ++i) {
    auto& [li, reg] = handle->regs[i];
    std::vector<uint8_t> packed;
    status st = li->iface->memory_domain()->rkey_pack(reg, packed);
    if (st != status::ok) return st;
    auto entry = entries[static_cast<unsigned>(i)];
    entry.setTransport(std::string(li->component->name()));
    entry.setIface(static_cast<uint32_t>(li - impl(*this).ifaces.data()));
    entry.setKey(kj::arrayPtr(packed.data(), packed.size()));
  }
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  out.insert(out.end(), bytes.begin(), bytes.end());
  return status::ok;
}

// -- endpoint: keys and RMA ----------------------------------------------------------------------

status endpoint::rkey_unpack(const void* data, size_t length, rkey** out) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  if (out == nullptr || data == nullptr || length < 16 || length % 8 != 0 || length > (1u << 16)) {
    return status::invalid_param;
  }
  if (ep.lane_iface == nullptr) return status::not_connected;  // handshake still under way
  tl::md* md = ep.lane_iface->memory_domain();
  auto words = kj::heapArray<capnp::word>(length / 8);
  std::memcpy(words.begin(), data, length);
  auto key = std::make_unique<rkey>();
  key->ep = &ep;
  std::vector<uint8_t> packed;
  bool found = false;
  const std::string lane(ep.lane_iface->transport_name());
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(words, wire::checked_reader_options());
    auto bundle = reader.getRoot<wire::schema::RemoteKeyBundle>();
    key->base = bundle.getAddress();
    key->length = bundle.getLength();
    key->token = bundle.getToken();
    for (auto entry : bundle.getEntries()) {
      if (entry.getTransport() != lane.c_str() || entry.getIface() != ep.peer_iface) continue;
      auto bytes = entry.getKey();
      packed.assign(bytes.begin(), bytes.end());
      found = true;
      break;
    }
  });
  if (failure != nullptr || key->base + key->length < key->base) return status::invalid_param;
  const bool lane_rma = md != nullptr && (ep.lane_attr->caps & tl::cap_get_zcopy) &&
                        (ep.lane_attr->caps & tl::cap_put_zcopy);
  if (!lane_rma || !found) {
    // No get/put on this lane (or no key for it): RMA by messages, checked by the owner.
    if (key->token == 0) return status::unreachable;
    key->software = true;
    *out = key.release();
    return status::ok;
  }
  status st = md->rkey_unpack(packed.data(), packed.size(), &key->key);
  if (st != status::ok) return st;
  *out = key.release();
  return status::ok;
}

void endpoint::rkey_destroy(rkey* key) {
  if (key == nullptr) return;
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  if (!key->software) ep.lane_iface->memory_domain()->rkey_release(&key->key);
  delete key;
}

op endpoint::put(const iov_entry* local, size_t count, uint64_t remote_address, rkey* key,
                 const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  return module_of<rma_protocol>(ep.owner).start(ep, false, local, count, remote_address, key,
                                                 params);
}

op endpoint::get(const iov_entry* local, size_t count, uint64_t remote_address, rkey* key,
                 const request_params& params) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  return module_of<rma_protocol>(ep.owner).start(ep, true, local, count, remote_address, key,
                                                 params);
}


}  // namespace comm
