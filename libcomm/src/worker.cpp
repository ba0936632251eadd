// The worker: interfaces, progress, event fd, requests, tagged receives and blocking helpers.
#include "worker_impl.hpp"

#include <comm/log.hpp>
#include <comm/memory.hpp>

#include <sched.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

namespace comm {

using detail::impl;
using detail::worker_impl;


namespace detail {
namespace {

uint64_t random_uid() {
  uint64_t value = 0;
  if (getrandom(&value, sizeof(value), 0) != sizeof(value)) {
    value = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            (static_cast<uint64_t>(getpid()) << 32);
  }
  return value == 0 ? 1 : value;
}

std::string default_name() {
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

void pin_to_cpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    COMM_LOG(warn, "worker", "cannot pin to the requested cpus: %s", std::strerror(errno));
  }
}

}  // namespace

worker_impl::worker_impl(context& c, const worker_params& p) : ctx(c), params(p), uid_(random_uid()) {
  if (params.name.empty()) params.name = default_name();
  if (params.am_alignment == 0 || (params.am_alignment & (params.am_alignment - 1)) != 0) {
    COMM_LOG(warn, "worker", "am_alignment %zu is not a power of two; using 1", params.am_alignment);
    params.am_alignment = 1;
  }
  pin_to_cpus(params.cpus);
  epoll_fd = params.wakeup ? epoll_create1(EPOLL_CLOEXEC) : -1;
  tl::iface_params ip;
  ip.opts = ctx.cfg().transport_options;
  ip.cpus = params.cpus;
  ip.auth_key = ctx.cfg().auth_key;
  for (tl::component* component : ctx.components()) {
    ip.device = component->devices(ip.opts).front();
    std::unique_ptr<tl::iface> iface;
    status st = component->open(ip, iface);
    if (st != status::ok) {
      COMM_LOG(warn, "worker", "cannot open %s on %s: %s", std::string(component->name()).c_str(),
               ip.device.c_str(), to_string(st));
      continue;
    }
    if (epoll_fd >= 0 && iface->event_fd() >= 0) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = ifaces.size();
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, iface->event_fd(), &ev);
    }
    const bool costly = (iface->attr().caps & tl::cap_costly_progress) != 0;
    ifaces.push_back({component, std::move(iface), costly});
  }
  // The user header of an AM travels in one bcopy fragment of the smallest interface.
  size_t smallest = 0;
  for (const auto& li : ifaces) {
    const size_t room = li.iface->attr().max_bcopy;
    if (smallest == 0 || room < smallest) smallest = room;
  }
  const size_t header = wire::header_size<wire::schema::ActiveMessageFirst>();
  max_am_header_ = smallest > header + 64 ? smallest - header - 64 : 0;
  short_thresh = ctx.cfg().short_thresh;
  zcopy_thresh = ctx.cfg().zcopy_thresh;
  install_handlers();
  COMM_LOG(debug, "worker", "created %s uid %016llx with %zu interfaces", params.name.c_str(),
           static_cast<unsigned long long>(uid_), ifaces.size());
}

worker_impl::~worker_impl() noexcept {
  for (endpoint_impl* ep : ep_table) {
    if (ep == nullptr) continue;
    // Best effort: tell the peer at once rather than leaving it to notice our exit.
    const bool peer_knows_us = ep->state == endpoint_impl::phase::connected ||
                               (ep->state == endpoint_impl::phase::wireup && ep->lane &&
                                ep->remote_id != 0);
    if (peer_knows_us) (void)send_close_notice(ep);
    ep->fail(status::canceled);
  }
  std::vector<tag_expected*> posted;
  matcher.for_each_expected([&](tag_expected* e) { posted.push_back(e); });
  for (tag_expected* e : posted) {
    matcher.remove_expected(e);
    request* req = request::of_expected(e);
    complete(req, status::canceled);
  }
  std::vector<tag_unexpected*> arrived;
  matcher.for_each_unexpected([&](tag_unexpected* u) { arrived.push_back(u); });
  for (tag_unexpected* u : arrived) {
    matcher.remove_unexpected(u);
    free_unexpected(static_cast<unexpected_msg*>(u));
  }
  close_cm();
  for (endpoint_impl* ep : ep_table) delete ep;
  for (endpoint_impl* ep : doomed) delete ep;
  for (auto& [data, block] : persistent_data) mem_free(block);  // either allocator
  for (auto& tier : unexpected_pool) {
    for (void* block : tier) std::free(block);
  }
  for (const large_block& b : large_free) mem_free(b.block);
  ifaces.clear();
  if (epoll_fd >= 0) close(epoll_fd);
}

// -- requests ------------------------------------------------------------------------------------

request* worker_impl::alloc_request(request::kind type, const request_params& p) {
  if (free_requests.empty()) {
    constexpr size_t chunk = 64;
    request_chunks.emplace_back(new request[chunk]);
    for (size_t i = 0; i < chunk; ++i) free_requests.push_back(&request_chunks.back()[i]);
  }
  request* req = free_requests.back();
  free_requests.pop_back();
  req->reset();
  req->type = type;
  req->owner = this;
  req->params = p;
  return req;
}

void worker_impl::free_request(request* req) {
  req->st = status::no_elem;  // a stale handle reads as "no such request"
  free_requests.push_back(req);
}

void worker_impl::complete(request* req, status st) {
  if (req->type == request::kind::tag_send || req->type == request::kind::am_send) {
    release_rndv_send(req);
  } else if (req->type == request::kind::tag_recv && req->rndv_id != 0) {
    rndv_recvs.erase(req->rndv_id);
    req->rndv_id = 0;
  } else if ((req->type == request::kind::get || req->type == request::kind::put) &&
             req->rndv_id != 0) {
    rma_ops.erase(req->rndv_id);
    req->rndv_id = 0;
  }
  if (req->remote_valid) {
    req->rndv_ep->lane_iface->memory_domain()->rkey_release(&req->remote);
    req->remote_valid = false;
  }
  if (is_error(st) && (req->params.flags & request_completion_suppressed) && req->ep != nullptr) {
    ++req->ep->counters_.errors;
    COMM_LOG(warn, "rma", "%s: unsignalled operation failed: %s", params.name.c_str(),
             to_string(st));
  }
  req->st = st;
  req->finished = true;
  if (req->type == request::kind::tag_recv) {
    if (req->params.recv_cb != nullptr) req->params.recv_cb(req, st, req->info, req->params.user_data);
  } else if (req->params.send_cb != nullptr) {
    req->params.send_cb(req, st, req->params.user_data);
  }
  if (!req->user_visible || req->released) free_request(req);
}

op worker_impl::in_progress(request* req) {
  req->user_visible = true;
  return op{status::in_progress, req};
}

endpoint_impl* worker_impl::find_ep(uint32_t id) const {
  const uint32_t index = id & 0xFFFFFu;
  if (index >= ep_table.size()) return nullptr;
  endpoint_impl* ep = ep_table[index];
  return (ep != nullptr && ep->id == id) ? ep : nullptr;
}

endpoint_impl* worker_impl::receiving_ep(uint32_t id, const char* what) {
  endpoint_impl* ep = find_ep(id);
  if (ep == nullptr) {
    if (id != 0 && std::find(closed_ids.begin(), closed_ids.end(), id) != closed_ids.end()) {
      ++late_messages;
      COMM_LOG(debug, "worker", "%s: %s (endpoint %u, closed): dropped", params.name.c_str(),
               what, id);
      return nullptr;
    }
    protocol_error(nullptr, what);
    return nullptr;
  }
  return ep->state == endpoint_impl::phase::failed ? nullptr : ep;
}

void worker_impl::protocol_error(endpoint_impl* ep, const char* what) {
  ++protocol_errors;
  // A hostile peer must not flood the log: the first errors, then every power of two.
  const bool log = protocol_errors <= 16 || (protocol_errors & (protocol_errors - 1)) == 0;
  if (ep != nullptr) {
    ++ep->counters_.errors;
    if (log) {
      COMM_LOG(error, "worker", "%s: malformed message from %s: %s (%llu so far)",
               params.name.c_str(), ep->peer_name_.c_str(), what,
               static_cast<unsigned long long>(protocol_errors));
    }
    ep->fail(status::protocol_error);
  } else if (log) {
    COMM_LOG(error, "worker", "%s: malformed message: %s (%llu so far)", params.name.c_str(), what,
             static_cast<unsigned long long>(protocol_errors));
  }
}

op worker_impl::immediate(const request_params& p, status st) {
  if (!(p.flags & request_no_immediate_completion)) return op{st, nullptr};
  request* req = alloc_request(request::kind::flush, p);
  req->user_visible = true;
  complete(req, st);
  return op{status::in_progress, req};
}

op worker_impl::receive_unexpected(request* req, unexpected_msg* found) {
  req->matched = true;
  req->info.sender_tag = found->tag;
  req->info.imm = found->imm;
  if (found->rndv) {
    // The data is still at the sender: fetch it now. A fetch that ends at once is an immediate
    // completion (no callback), like any other.
    const bool report_now = !(req->params.flags & request_no_immediate_completion);
    const tag_recv_callback callback = req->params.recv_cb;
    if (report_now) req->params.recv_cb = nullptr;
    req->user_visible = true;
    start_fetch(req, found->ep, found->sreq, found->address, found->length, found->rkey.data(),
                found->rkey.size());
    free_unexpected(found);
    if (report_now && req->finished) {
      if (req->params.recv_info != nullptr) *req->params.recv_info = req->info;
      const status st = req->st;
      free_request(req);
      return op{st, nullptr};
    }
    req->params.recv_cb = callback;
    return op{status::in_progress, req};
  }
  copy_to_recv(req, 0, found->data, found->length);
  const status st = req->info.length < found->length ? status::message_truncated : status::ok;
  free_unexpected(found);
  if (!(req->params.flags & request_no_immediate_completion)) {
    if (req->params.recv_info != nullptr) *req->params.recv_info = req->info;
    free_request(req);
    return op{st, nullptr};
  }
  req->user_visible = true;
  complete(req, st);
  return op{status::in_progress, req};
}

status worker_impl::cancel_rndv_send(request* req, cancel_mode mode) {
  endpoint_impl* ep = req->ep;
  const uint64_t sreq = req->rndv_id;
  // Deregistering first makes a fetch that races with the cancel fail instead of reading memory
  // the caller is about to reuse.
  release_rndv_send(req);
  wire::header_writer<wire::schema::RndvCancel> writer;
  writer.fields().setDstEp(ep->remote_id);
  writer.fields().setSreqId(sreq);
  auto bytes = static_cast<const uint8_t*>(writer.bytes());
  queue_control(ep, proto_id::rndv_cancel, std::vector<uint8_t>(bytes, bytes + writer.size()));
  if (mode == cancel_mode::force) {
    req->params.send_cb = nullptr;
    req->released = true;
  }
  req->st = status::canceled;
  ep->complete_in_order();
  return status::ok;
}

}  // namespace detail

// -- public worker API ---------------------------------------------------------------------------

std::unique_ptr<worker> worker::create(context& ctx, const worker_params& params) {
  return std::make_unique<worker_impl>(ctx, params);
}

thread_mode worker::mode() const noexcept { return impl(*this).params.mode; }
const std::string& worker::name() const noexcept { return impl(*this).params.name; }
uint64_t worker::uid() const noexcept { return impl(*this).uid_; }
uint64_t worker::client_id() const noexcept { return impl(*this).params.client_id; }

size_t worker::max_am_header() const noexcept { return impl(*this).max_am_header_; }

std::vector<uint8_t> worker::address() const {
  worker_impl& w = const_cast<worker_impl&>(impl(*this));
  worker_impl::guard g(w);
  return w.packed_address();
}

unsigned worker::progress() {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  ++w.progress_depth;
  unsigned events = 0;
  for (auto& li : w.ifaces) {
    if (!li.costly) {
      events += li.iface->progress();
      continue;
    }
    // An interface whose progress is a system call is polled less often while it stays idle,
    // so it does not tax the shared-memory path; traffic brings it back to every call.
    if (li.skip != 0) {
      --li.skip;
      continue;
    }
    const unsigned n = li.iface->progress();
    li.backoff = n != 0 ? 0 : static_cast<uint8_t>(std::min(2 * li.backoff + 1, 15));
    li.skip = li.backoff;
    events += n;
  }
  events += w.progress_cm();
  if (w.deferred_ams != 0) w.start_deferred_ams();
  // Closed endpoints are deleted by the outermost call only: a callback that progresses again
  // returns into code still using the endpoint it was called for.
  if (--w.progress_depth == 0 && !w.doomed.empty()) {
    for (detail::endpoint_impl* ep : w.doomed) delete ep;
    w.doomed.clear();
  }
  return events;
}

int worker::event_fd() const noexcept { return impl(*this).epoll_fd; }

status worker::arm() {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (w.epoll_fd < 0) return status::unsupported;
  for (auto& li : w.ifaces) {
    if (li.iface->event_fd() < 0) continue;
    status st = li.iface->event_arm();
    if (st != status::ok) return st;
  }
  // The interfaces' fds sit in our epoll set level-triggered: nothing to drain here.
  return status::ok;
}

status worker::wait(int timeout_ms) {
  worker_impl& w = impl(*this);
  if (w.epoll_fd < 0) return status::unsupported;
  status st = arm();
  if (st == status::ok) {
    epoll_event ev[8];
    int n = epoll_wait(w.epoll_fd, ev, 8, timeout_ms);
    if (n == 0) return status::timed_out;
    // Whatever woke us is polled now, not after its idle backoff.
    for (int i = 0; i < n; ++i) {
      if (detail::is_cm_event(ev[i].data.u64)) {
        w.cm_skip = 0;
      } else if (ev[i].data.u64 < w.ifaces.size()) {
        w.ifaces[ev[i].data.u64].skip = 0;
      }
    }
  } else if (st != status::busy) {
    return st;
  }
  progress();
  return status::ok;
}

status worker::fence() {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  for (detail::endpoint_impl* ep : w.ep_table) {
    if (ep != nullptr && ep->lane) {
      status st = ep->lane->fence();
      if (is_error(st)) return st;
    }
  }
  return status::ok;
}

namespace {

/// A worker flush waiting for its endpoints' flushes.
struct worker_flush_state {
  worker_impl* w;
  request* req;
  int remaining;
  status first_error = status::ok;
};

void worker_flush_part_done(request*, status st, void* arg) {
  auto* state = static_cast<worker_flush_state*>(arg);
  if (is_error(st) && state->first_error == status::ok) state->first_error = st;
  if (--state->remaining == 0) {
    state->w->complete(state->req, state->first_error);
    delete state;
  }
}

}  // namespace

op worker::flush(const request_params& params) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  std::vector<request*> parts;
  status first_error = status::ok;
  for (detail::endpoint_impl* ep : w.ep_table) {
    if (ep == nullptr || ep->state == detail::endpoint_impl::phase::failed) continue;
    request_params part;
    part.flags = request_no_immediate_completion;
    op o = ep->flush(part);
    if (!o.pending()) continue;
    if (o.req->finished) {
      // Completed in the call, before we could install our callback: account for it now.
      if (is_error(o.req->st) && first_error == status::ok) first_error = o.req->st;
      w.free_request(o.req);
      continue;
    }
    parts.push_back(o.req);
  }
  if (parts.empty()) return w.immediate(params, first_error);
  request* req = w.alloc_request(request::kind::flush, params);
  auto* state =
      new worker_flush_state{&w, req, static_cast<int>(parts.size()), first_error};
  for (request* part : parts) {
    part->params.send_cb = worker_flush_part_done;
    part->params.user_data = state;
    w.release(part);
  }
  return w.in_progress(req);
}

std::string worker::info() const {
  const worker_impl& w = impl(*this);
  std::ostringstream out;
  out << "# worker " << w.params.name << " uid " << std::hex << w.uid_ << std::dec
      << " thread_mode " << (w.params.mode == thread_mode::multi ? "multi" : "single")
      << " client_id " << w.params.client_id << '\n';
  for (const auto& li : w.ifaces) {
    const auto& a = li.iface->attr();
    out << "iface " << li.component->name() << ": max_short " << a.max_short << " max_bcopy "
        << a.max_bcopy << " max_zcopy " << a.max_zcopy << " max_iov " << a.max_iov << '\n';
    std::istringstream lines(li.iface->info());
    for (std::string line; std::getline(lines, line);) out << "  " << line << '\n';
  }
  out << "thresholds: short " << (w.short_thresh ? std::to_string(w.short_thresh) : "transport max")
      << " zcopy " << w.zcopy_thresh << '\n';
  out << "tag queues: expected " << w.matcher.expected_count() << " unexpected "
      << w.matcher.unexpected_count() << "; protocol errors " << w.protocol_errors
      << "; late messages for closed endpoints " << w.late_messages << '\n';
  const peer_limits& c = w.ctx.cfg().limits;
  out << "held for peers: unexpected " << w.unexpected_bytes << " of " << c.unexpected_max_bytes
      << " B, AMs before delivery " << w.am_rx_bytes << " of " << c.am_rx_max_bytes
      << " B (deferred " << w.deferred_ams << "), peer endpoints " << w.peer_eps << " of "
      << c.peer_ep_max << "; limit errors " << w.limit_errors << '\n';
  for (const listener* l : w.listeners) {
    out << "listener " << l->address() << ": " << l->requests() << " requests\n";
  }
  for (const detail::endpoint_impl* ep : w.ep_table) {
    if (ep != nullptr) out << ep->info() << '\n';
  }
  return out.str();
}

void worker::print_info(std::FILE* stream) const { std::fputs(info().c_str(), stream); }

// -- active messages -----------------------------------------------------------------------------

status worker::set_am_handler(uint16_t id, am_callback cb, void* arg, unsigned flags) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (flags & ~static_cast<unsigned>(am_flag_whole_msg | am_flag_persistent_data)) {
    return status::invalid_param;
  }
  if (cb == nullptr) {
    if (id < worker_impl::am_table_size) {
      w.am_table[id] = worker_impl::am_handler{};
    } else {
      w.am_handlers.erase(id);
    }
  } else {
    const worker_impl::am_handler h{cb, arg, flags};
    if (id < worker_impl::am_table_size) {
      w.am_table[id] = h;
    } else {
      w.am_handlers[id] = h;
    }
  }
  return status::ok;
}

void worker::am_data_release(void* data) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  auto it = w.persistent_data.find(data);
  if (it == w.persistent_data.end()) {
    COMM_LOG(error, "worker", "am_data_release(%p): not data held by a handler", data);
    return;
  }
  w.release_large(it->second);
  w.persistent_data.erase(it);
}

bool worker::am_data_detach(void* data) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  auto it = w.persistent_data.find(data);
  if (it == w.persistent_data.end()) return false;
  w.large_out.erase(it->second);
  w.persistent_data.erase(it);
  return true;
}

// -- tag matching --------------------------------------------------------------------------------

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
  auto* found = static_cast<detail::unexpected_msg*>(w.matcher.match_unexpected(tag, mask, true));
  if (found != nullptr && count == 1 && !found->rndv &&
      !(params.flags & request_no_immediate_completion)) {
    // The common case under load: the message is already here. Copy it out without a request.
    const size_t taken = std::min(found->length, entries[0].length);
    if (taken != 0) std::memcpy(entries[0].buffer, found->data, taken);
    if (params.recv_info != nullptr) *params.recv_info = tag_recv_info{found->tag, taken, found->imm};
    const status st = taken < found->length ? status::message_truncated : status::ok;
    w.free_unexpected(found);
    return op{st, nullptr};
  }
  request* req = w.alloc_request(request::kind::tag_recv, params);
  req->iov.assign(entries, entries + count);
  for (size_t i = 0; i < count; ++i) req->length += entries[i].length;
  req->expected.tag = tag;
  req->expected.mask = mask;
  if (found == nullptr) {
    w.matcher.post_expected(&req->expected);
    return w.in_progress(req);
  }
  return w.receive_unexpected(req, found);
}

bool worker::tag_probe(tag_t tag, tag_t mask, tag_recv_info* info, message** out) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  auto* found =
      static_cast<detail::unexpected_msg*>(w.matcher.match_unexpected(tag, mask, out != nullptr));
  if (found == nullptr) return false;
  if (info != nullptr) *info = tag_recv_info{found->tag, found->length, found->imm};
  if (out != nullptr) {
    worker_impl::detach_unexpected(found);  // the user holds it now, not the peer
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
  request* req = w.alloc_request(request::kind::tag_recv, params);
  req->iov.assign(1, iov_entry{buffer, length});
  req->length = length;
  return w.receive_unexpected(req, found);
}

// -- requests ------------------------------------------------------------------------------------

status worker::request_status(const request* req) const noexcept {
  if (req == nullptr) return status::invalid_param;
  worker_impl::guard g(const_cast<worker_impl&>(impl(*this)));
  return req->finished ? req->st : status::in_progress;
}

void worker::release(request* req) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (req == nullptr) return;
  if (req->finished) {
    w.free_request(req);
  } else {
    req->released = true;
  }
}

status worker::cancel(request* req, cancel_mode mode) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (req == nullptr || req->finished) return status::invalid_param;
  if (req->type == request::kind::tag_recv) {
    if (req->matched || !w.matcher.remove_expected(&req->expected)) return status::busy;
  } else if ((req->type == request::kind::tag_send || req->type == request::kind::am_send) &&
             req->phase == request::rndv_phase::announced) {
    return w.cancel_rndv_send(req, mode);
  } else if (req->type == request::kind::tag_send || req->type == request::kind::am_send) {
    if (req->has_started || req->ep == nullptr) return status::busy;
    detail::endpoint_impl* ep = req->ep;
    request** link = &ep->pending_head;
    request* prev = nullptr;
    while (*link != nullptr && *link != req) {
      prev = *link;
      link = &(*link)->next_pending;
    }
    if (*link == nullptr) return status::busy;
    *link = req->next_pending;
    if (ep->pending_tail == req) ep->pending_tail = prev;
    // The send also sits in the endpoint's ordered completion queue: forced, it leaves it;
    // reported, it completes from there, after the sends issued before it.
    if (mode == cancel_mode::force) {
      ep->remove_outstanding(req);
      req->finished = true;
      req->st = status::canceled;
      w.free_request(req);
    } else {
      req->st = status::canceled;
    }
    ep->complete_in_order();
    return status::ok;
  } else {
    return status::unsupported;
  }
  if (mode == cancel_mode::force) {
    req->finished = true;
    req->st = status::canceled;
    w.free_request(req);
    return status::ok;
  }
  w.complete(req, status::canceled);
  return status::ok;
}

status worker::wait(op o, int timeout_ms) {
  if (o.req == nullptr) return o.st;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  status st;
  for (unsigned spins = 0; (st = request_status(o.req)) == status::in_progress; ++spins) {
    progress();
    if (timeout_ms >= 0 && (spins & 255) == 255 && std::chrono::steady_clock::now() > deadline) {
      if (cancel(o.req, cancel_mode::force) == status::ok) return status::timed_out;
      release(o.req);
      return status::timed_out;
    }
  }
  release(o.req);
  return st;
}

}  // namespace comm
