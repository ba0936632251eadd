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

/// Reads in flight on a zero-copy lane whose transport sets no limit of its own.
constexpr unsigned default_zcopy_reads = 16;

/// Whether a region with remote rights `access` allows a get (or a put).
bool remote_allows(uint32_t access, bool is_get) {
  return (access & (is_get ? mem_remote_read : mem_remote_write)) != 0;
}

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
  unsigned ops_in_flight = 0;    ///< puts and gets issued, not yet complete
  unsigned read_limit = 0;       ///< reads allowed in flight (0: not bound yet)
  unsigned peak_reads = 0;       ///< most reads in flight at once
  std::vector<rkey*> keys;       ///< keys unpacked for the endpoint and not yet destroyed
};

/// Counts a read issued on `st`.
void count_read(rma_ep_state& st, rma_state& s) {
  ++s.reads;
  ++st.reads_in_flight;
  st.peak_reads = std::max(st.peak_reads, st.reads_in_flight);
}

/// The transport completed the operations of an RMA request (or a software one's replies).
void on_done(tl::completion* comp) {
  auto* req = request::of_completion(comp);
  auto& s = req->as<rma_state>();
  endpoint_impl* ep = req->ep;
  req->tl_in_flight = 0;
  rma_protocol& rma = module_of<rma_protocol>(*req->owner);
  if (s.reads != 0) {
    rma.reads_in_flight(*ep) -= s.reads;
    s.reads = 0;
  }
  if (s.counted) {
    --rma.ops_in_flight(*ep);
    s.counted = false;
  }
  req->st = comp->result;
  if (req->issuing) return;
  ep->complete_in_order();
  // A get that stopped for the reads limit, or a fenced operation, goes on now.
  ep->resume_pending();
}

void release_op(request* req) {
  auto& s = req->as<rma_state>();
  rma_protocol& rma = module_of<rma_protocol>(*req->owner);
  if (s.counted && req->ep != nullptr) {
    --rma.ops_in_flight(*req->ep);
    s.counted = false;
  }
  rma.release(s);
}

/// The callback of a suppressed or unsignalled operation: a success is not reported, a failure
/// is.
void report_failure_only(request* req, status st, void* user_data) {
  const send_callback user_cb = req->as<rma_state>().user_cb;
  if (is_error(st) && user_cb != nullptr) user_cb(req, st, user_data);
}

const request_ops get_ops{.name = "get", .progress = rma_protocol::progress_op,
                          .release = release_op, .events = wakeup_rma | wakeup_tx};
const request_ops put_ops{.name = "put", .progress = rma_protocol::progress_op,
                          .release = release_op, .events = wakeup_rma | wakeup_tx};

}  // namespace

rma_protocol::rma_protocol(worker_impl& owner, unsigned index) : protocol(owner, index) {
  receive<&rma_protocol::on_request>(rma_msg::request);
  receive<&rma_protocol::on_reply>(rma_msg::reply);
}

unsigned& rma_protocol::reads_in_flight(endpoint_impl& ep) {
  return state_of<rma_ep_state>(ep).reads_in_flight;
}

unsigned& rma_protocol::ops_in_flight(endpoint_impl& ep) {
  return state_of<rma_ep_state>(ep).ops_in_flight;
}

void rma_protocol::bind_read_limit(endpoint_impl& ep, uint32_t peer_reads_in) {
  const tl::iface_attr& a = *ep.lane_attr;
  const bool zcopy = (a.caps & tl::cap_get_zcopy) != 0;
  unsigned local = max_software_reads;
  if (zcopy) {
    local = a.max_outstanding_reads != 0
                ? static_cast<unsigned>(std::min<size_t>(a.max_outstanding_reads, UINT32_MAX))
                : default_zcopy_reads;
  }
  const unsigned peer = peer_reads_in != 0 ? peer_reads_in : local;
  state_of<rma_ep_state>(ep).read_limit = std::max(1u, std::min(local, peer));
}

unsigned rma_protocol::read_limit(endpoint_impl& ep) {
  const unsigned limit = state_of<rma_ep_state>(ep).read_limit;
  return limit != 0 ? limit : 1;
}

unsigned rma_protocol::peak_reads(endpoint_impl& ep) {
  return state_of<rma_ep_state>(ep).peak_reads;
}

bool rma_protocol::must_wait(request* req, const rma_state& s, unsigned reads_needed) {
  rma_ep_state& st = state_of<rma_ep_state>(*req->ep);
  if ((req->params.flags & request_fence) && st.ops_in_flight > 0) return true;
  if (!s.is_get) return false;
  return st.reads_in_flight > 0 && st.reads_in_flight + reads_needed > read_limit(*req->ep);
}

status rma_protocol::check_local_rights(bool is_get, const iov_entry* local, size_t count) const {
  const uint32_t needed = is_get ? mem_local_write : mem_local_read;
  for (const memh* h : local_limited_) {
    if (h->access & needed) continue;
    const auto base = reinterpret_cast<uintptr_t>(h->address);
    for (size_t i = 0; i < count; ++i) {
      const auto start = reinterpret_cast<uintptr_t>(local[i].buffer);
      if (local[i].length != 0 && start < base + h->length && base < start + local[i].length) {
        return status::privileges_violation;
      }
    }
  }
  return status::ok;
}

void rma_protocol::note_local_rights(memh* handle) {
  if ((handle->access & (mem_local_read | mem_local_write)) !=
      (mem_local_read | mem_local_write)) {
    local_limited_.push_back(handle);
  }
}

void rma_protocol::forget_local_rights(memh* handle) {
  std::erase(local_limited_, handle);
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
  const unsigned limit = read_limit(ep);
  if (!req->has_started) {
    status st = check_range(*s.key, s.remote_address, s.length);
    if (st != status::ok) return st;
    if (must_wait(req, s, 1)) return status::no_resource;
    req->tl_completion = tl::completion{on_done, 1, status::ok};
    s.counted = true;
    ++ops_in_flight(ep);
    s.id = next_id_++;
    ops_[s.id] = req;
    req->holds = true;
  }
  const size_t room = ep.lane_attr->max_bcopy - 64;
  req->issuing = true;
  while (s.offset < s.length || !req->has_started) {
    if (s.is_get && req->has_started && reads >= limit) {
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
      if (!req->has_started) undo_issue(req, s);  // retried from the start, or failed
      return static_cast<status>(n);  // no_resource: resumed from the pending queue
    }
    ++req->tl_completion.count;
    ++s.replies_due;
    if (s.is_get) count_read(state_of<rma_ep_state>(ep), s);
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
  const tl::iface_attr& a = *req->ep->lane_attr;
  if (s.key->software || !(a.caps & (s.is_get ? tl::cap_get_zcopy : tl::cap_put_zcopy))) {
    return rma.send_by_messages(req, s);
  }
  return rma.send_zcopy(req, s);
}

void rma_protocol::undo_issue(request* req, rma_state& s) {
  release(s);
  req->holds = false;
  if (s.counted) {
    --ops_in_flight(*req->ep);
    s.counted = false;
  }
}

status rma_protocol::send_zcopy(request* req, rma_state& s) {
  endpoint_impl& ep = *req->ep;
  const tl::iface_attr& a = *ep.lane_attr;
  const size_t max_chunk = std::max<size_t>(s.is_get ? a.max_get_zcopy : a.max_put_zcopy, 1);
  const size_t max_entries = std::min<size_t>(16, std::max<size_t>(a.max_iov, 1));
  // Chunks this operation issues at most: it starts only when they fit under the reads limit
  // (or nothing else is in flight), so the peer never sees more reads than it accepts.
  const size_t chunks = s.length / max_chunk + 1 + req->iov.size() / max_entries;
  if (must_wait(req, s, static_cast<unsigned>(std::min<size_t>(chunks, UINT32_MAX)))) {
    return status::no_resource;
  }
  status st = check_range(*s.key, s.remote_address, s.length);
  if (st != status::ok) return st;
  rma_ep_state& counts = state_of<rma_ep_state>(ep);
  req->tl_completion = tl::completion{on_done, 1, status::ok};
  s.counted = true;
  ++counts.ops_in_flight;
  req->issuing = true;
  size_t offset = 0;
  do {
    size_t chunk = std::min(max_chunk, s.length - offset);
    tl::iov entries[16];
    const size_t count = iov_slice(req->iov, offset, &chunk, entries, max_entries);
    ++req->tl_completion.count;
    const uint64_t remote = s.remote_address + offset;
    st = s.is_get ? ep.lane->get_zcopy(entries, count, remote, s.key->key, &req->tl_completion)
                  : ep.lane->put_zcopy(entries, count, remote, s.key->key, &req->tl_completion);
    if (st != status::in_progress) --req->tl_completion.count;
    if (st == status::in_progress && s.is_get) count_read(counts, s);
    if (is_error(st)) break;
    offset += chunk;
  } while (offset < s.length);
  req->has_started = true;
  if (is_error(st) && offset == 0 && req->tl_completion.count == 1) {
    req->issuing = false;
    req->tl_completion.count = 0;
    undo_issue(req, s);
    return st;
  }
  ++ep.counters_.messages_sent;
  ep.counters_.bytes_sent += offset;
  tl::complete(&req->tl_completion, is_error(st) ? st : status::ok);
  req->issuing = false;
  return status::ok;
}

op rma_protocol::flushed(endpoint_impl& ep, bool is_get, const request_params& params) {
  request* req = w.alloc_request(is_get ? get_ops : put_ops, params);
  req->init<rma_state>().is_get = is_get;
  req->ep = &ep;
  const bool suppressed = (params.flags & request_completion_suppressed) != 0;
  op result = suppressed ? op{} : w.in_progress(req);
  if (suppressed) req->released = true;
  w.complete(req, status::flushed);  // posted, then flushed at once: the callback runs
  return result;
}

op rma_protocol::start(endpoint_impl& ep, bool is_get, const iov_entry* local, size_t count,
                       uint64_t remote_address, rkey* key, const request_params& params) {
  if ((count > 0 && local == nullptr) || key == nullptr || key->ep != &ep) {
    return op{status::invalid_param, nullptr};
  }
  if (ep.state == endpoint_impl::phase::closing || ep.state == endpoint_impl::phase::failed) {
    return flushed(ep, is_get, params);
  }
  if (!remote_allows(key->access, is_get)) return op{status::privileges_violation, nullptr};
  if (status st = check_local_rights(is_get, local, count); st != status::ok) return op{st};
  request* req = w.alloc_request(is_get ? get_ops : put_ops, params);
  auto& s = req->init<rma_state>();
  s.is_get = is_get;
  req->set_iov(local, count);
  for (size_t i = 0; i < count; ++i) s.length += local[i].length;
  s.remote_address = remote_address;
  s.key = key;
  const bool suppressed = (params.flags & request_completion_suppressed) != 0;
  if (suppressed || (params.flags & request_unsignalled)) {
    s.user_cb = params.send_cb;
    req->params.send_cb = report_failure_only;
  }
  op result = start_send(ep, req);
  if (suppressed && result.pending()) {
    // The caller gets no request; it still counts for flush and reports a failure.
    if (result.req->finished) {
      w.free_request(result.req);
    } else {
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

status rma_protocol::unmap(memh* handle) {
  if (handle == nullptr || !remove_region(handle)) return status::invalid_param;
  forget_local_rights(handle);
  for (auto& [li, reg] : handle->regs) li->iface->memory_domain()->mem_dereg(reg);
  if (handle->handle != nullptr) handle_access::empty(*handle->handle);
  delete handle;
  return status::ok;
}

void rma_protocol::add_key(endpoint_impl& ep, rkey* key) {
  state_of<rma_ep_state>(ep).keys.push_back(key);
}

void rma_protocol::destroy_key(rkey* key) {
  if (auto* st = find_state<rma_ep_state>(*key->ep)) {
    std::erase(st->keys, key);
  }
  if (!key->software) key->ep->lane_iface->memory_domain()->rkey_release(&key->key);
  if (key->handle != nullptr) handle_access::empty(*key->handle);
  delete key;
}

void rma_protocol::endpoint_deleted(endpoint_impl& ep) {
  auto* st = find_state<rma_ep_state>(ep);
  if (st == nullptr) return;
  while (!st->keys.empty()) destroy_key(st->keys.back());
}

void rma_protocol::teardown() {
  while (!regions_.empty()) (void)unmap(regions_.begin()->second);
}

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
  } else if (!remote_allows(it->second->access, is_get)) {
    st = status::privileges_violation;  // whatever rights the peer's copy of the key claims
  } else {
    rkey region;
    region.base = reinterpret_cast<uintptr_t>(it->second->address);
    region.length = it->second->length;
    st = check_range(region, address, count);
  }
  // A get's data goes back in one reply, behind its header: both must fit one bcopy.
  const size_t reply_header = wire::header_size<wire::schema::RmaReply>();
  if (st == status::ok && is_get && count > ep->lane_attr->max_bcopy - reply_header) {
    st = status::length_error;
  }
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
  // One reply per request sent: one more would complete the operation early, while it may
  // still wait in the pending queue to send the rest.
  if (req->ep != ep || s.replies_due == 0 ||
      (s.is_get && !is_error(st) &&
       (h->getAddress() < s.remote_address || offset > s.length || payload > s.length - offset))) {
    return w.protocol_error(ep, "RMA reply that does not fit its request");
  }
  --s.replies_due;
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

status worker::mem_map(void* address, size_t length, memh** out, uint32_t access) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (out == nullptr || (address == nullptr && length != 0) || (access & ~mem_access_all) != 0) {
    return status::invalid_param;
  }
  auto handle = std::make_unique<memh>();
  handle->owner = &w;
  handle->address = address;
  handle->length = length;
  handle->access = access;
  // Transports map a region for every remote access, and a read-only one where their memory
  // domain enforces that (md::mem_reg_read_only); any other region, and a read-only one on the
  // other transports, is served by our worker (software RMA), which checks the rights at every
  // access.
  const uint32_t remote = access & (mem_remote_read | mem_remote_write);
  const bool read_only = remote == mem_remote_read;
  const bool zero_copy = remote == (mem_remote_read | mem_remote_write) || read_only;
  for (auto& li : w.ifaces) {
    if (!zero_copy) break;
    tl::md* md = li.iface->memory_domain();
    if (md == nullptr) continue;
    tl::mem_handle* reg = nullptr;
    status st = read_only ? md->mem_reg_read_only(address, length, &reg)
                          : md->mem_reg(address, length, &reg);
    if (st == status::unsupported && read_only) continue;
    if (st != status::ok) {
      for (auto& [owner, r] : handle->regs) owner->iface->memory_domain()->mem_dereg(r);
      return st;
    }
    handle->regs.emplace_back(&li, reg);
  }
  module_of<rma_protocol>(w).add_region(handle.get());
  module_of<rma_protocol>(w).note_local_rights(handle.get());
  *out = handle.release();
  return status::ok;
}

status worker::mem_unmap(memh* handle) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  return module_of<rma_protocol>(w).unmap(handle);
}

status worker::rkey_pack(const memh* handle, std::vector<uint8_t>& out) const {
  if (handle == nullptr) return status::invalid_param;
  const uint32_t remote = handle->access & (mem_remote_read | mem_remote_write);
  if (remote == 0) return status::privileges_violation;
  capnp::MallocMessageBuilder message;
  auto bundle = message.initRoot<wire::schema::RemoteKeyBundle>();
  bundle.setAddress(reinterpret_cast<uintptr_t>(handle->address));
  bundle.setLength(handle->length);
  bundle.setToken(handle->token);
  bundle.setAccess(remote);
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
  auto key = std::make_unique<rkey>();
  key->ep = &ep;
  std::vector<uint8_t> packed;
  bool found = false;
  const std::string lane(ep.lane_iface->transport_name());
  const bool valid = wire::read_checked_message<wire::schema::RemoteKeyBundle>(
      data, length, [&](wire::schema::RemoteKeyBundle::Reader bundle) {
        key->base = bundle.getAddress();
        key->length = bundle.getLength();
        key->token = bundle.getToken();
        key->access = bundle.getAccess() != 0 ? bundle.getAccess() : mem_access_all;
        for (auto entry : bundle.getEntries()) {
          if (entry.getTransport() != lane.c_str() || entry.getIface() != ep.peer_iface) continue;
          auto bytes = entry.getKey();
          packed.assign(bytes.begin(), bytes.end());
          found = true;
          break;
        }
      });
  if (!valid || key->base + key->length < key->base) return status::invalid_param;
  const bool lane_rma = md != nullptr && (ep.lane_attr->caps & tl::cap_get_zcopy) &&
                        (ep.lane_attr->caps & tl::cap_put_zcopy);
  if (!lane_rma || !found) {
    // No get/put on this lane (or no key for it): RMA by messages, checked by the owner.
    if (key->token == 0) return status::unreachable;
    key->software = true;
  } else if (status st = md->rkey_unpack(packed.data(), packed.size(), &key->key);
             st != status::ok) {
    return st;
  }
  module_of<rma_protocol>(ep.owner).add_key(ep, key.get());
  *out = key.release();
  return status::ok;
}

void endpoint::rkey_destroy(rkey* key) {
  if (key == nullptr) return;
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  module_of<rma_protocol>(ep.owner).destroy_key(key);
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

remote_segment endpoint::rkey_segment(rkey* key) const noexcept {
  if (key == nullptr) return {};
  return remote_segment{key, key->base, key->length};
}

op endpoint::get(const iov_entry* local, size_t count, const remote_segment& remote,
                 const request_params& params) {
  if (count > 0 && local == nullptr) return op{status::invalid_param, nullptr};
  // The segment's length decides: the entries it reaches, the last one cut where it ends. The
  // cut list stays on the stack for the usual entry counts, so that a post allocates nothing.
  constexpr size_t stack_entries = 16;
  iov_entry on_stack[stack_entries];
  std::vector<iov_entry> on_heap(count > stack_entries ? count : 0);
  iov_entry* used = count > stack_entries ? on_heap.data() : on_stack;
  size_t n = 0;
  uint64_t left = remote.length;
  for (size_t i = 0; i < count && left != 0; ++i) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(local[i].length, left));
    used[n++] = {local[i].buffer, take};
    left -= take;
  }
  if (left != 0) return op{status::length_error, nullptr};
  return get(used, n, remote.address, remote.key, params);
}


}  // namespace comm
