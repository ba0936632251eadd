// The worker: interfaces, progress, event fd, the request pool, completion, cancel, flush, info and
// the blocking helpers.
#include "send.hpp"
#include "worker_impl.hpp"

#include <comm/log.hpp>
#include <comm/memory.hpp>

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>
#include <unordered_set>

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

/// Workers this process made without a name so far.
std::atomic<uint64_t> unnamed_workers{0};

/// "<host>:<pid>:<n>", unique among the workers of a process.
std::string default_name() {
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(getpid()) + ":" +
         std::to_string(unnamed_workers.fetch_add(1, std::memory_order_relaxed) + 1);
}

/// epoll data of the signal fd in the worker's own event set.
constexpr uint64_t signal_event_tag = ~uint64_t{0} - 1;

/// Workers of this process that warned about leaked requests.
std::atomic<uint64_t> leak_warnings{0};

/// True for the n-th leak warning of the process (counting from 1): the first 8, then every
/// power of two, so that a program leaking in a loop does not flood stderr.
bool leak_warning_shown(uint64_t n) { return n <= 8 || (n & (n - 1)) == 0; }

/// The interfaces a worker opens: every device of every transport, each transport's devices
/// nearest to the worker's cpus first.
std::vector<std::pair<tl::component*, std::string>> interfaces_to_open(
    const std::vector<tl::component*>& components, const tl::options& opts,
    const worker_placement& placement) {
  std::vector<std::pair<tl::component*, std::string>> out;
  for (tl::component* component : components) {
    for (std::string& device : placement.order_devices(component->devices(opts)))
      out.emplace_back(component, std::move(device));
  }
  return out;
}

}  // namespace

worker_impl::worker_impl(context& c, const worker_params& p) : ctx(c), params(p), uid_(random_uid()) {
  if (params.name.empty()) params.name = default_name();
  if (params.am_alignment == 0 || (params.am_alignment & (params.am_alignment - 1)) != 0) {
    COMM_LOG(warn, "worker", "am_alignment %zu is not a power of two; using 1", params.am_alignment);
    params.am_alignment = 1;
  }
  // cpus place resources (UCX's cpu_mask); the caller's threads stay where the caller put them.
  placement = place_worker(params.cpus.empty() ? nullptr : topology::machine(), params.cpus);
  init_status = open_wakeup();
  if (init_status != status::ok) return;
  tl::iface_params ip;
  ip.opts = ctx.cfg().transport_options;
  ip.cpus = params.cpus;
  ip.numa_nodes = placement.numa_nodes;
  ip.auth_key = ctx.cfg().auth_key;
  for (auto& [component, device] : interfaces_to_open(ctx.components(), ip.opts, placement)) {
    if (ifaces.size() == max_address_entries) {
      COMM_LOG(warn, "worker", "%s: %zu interfaces open, the most an address holds; %s on %s "
               "and the devices after it are not used", params.name.c_str(), ifaces.size(),
               std::string(component->name()).c_str(), device.c_str());
      break;
    }
    ip.device = device;
    std::unique_ptr<tl::iface> iface;
    status st = component->open(ip, iface);
    if (st != status::ok) {
      COMM_LOG(warn, "worker", "cannot open %s on %s: %s", std::string(component->name()).c_str(),
               ip.device.c_str(), to_string(st));
      continue;
    }
    if (iface->event_fd() >= 0) watch(iface->event_fd(), ifaces.size());
    const bool costly = (iface->attr().caps & tl::cap_costly_progress) != 0;
    ifaces.push_back({component, std::move(iface), costly, true, 0, 0, 0, std::move(device)});
  }
  short_thresh = ctx.cfg().short_thresh;
  zcopy_thresh = ctx.cfg().zcopy_thresh;
  make_protocols();
  install_handlers();
  COMM_LOG(debug, "worker", "created %s uid %016llx with %zu interfaces", params.name.c_str(),
           static_cast<unsigned long long>(uid_), ifaces.size());
}

worker_impl::~worker_impl() noexcept {
  for (endpoint_impl* ep : ep_table) {
    if (ep == nullptr) continue;
    // Best effort: tell the peer at once rather than leaving it to notice our exit.
    const bool peer_knows_us = ep->state == endpoint_impl::phase::connected ||
                               (ep->state == endpoint_impl::phase::closing &&
                                !ep->close_notice_sent) ||
                               (ep->state == endpoint_impl::phase::wireup && ep->lane &&
                                ep->remote_id != 0);
    if (peer_knows_us) (void)send_close_notice(ep);
    ep->fail(status::canceled);
  }
  for (size_t i = 0; i < protocol_count; ++i) protocols[i]->teardown();
  close_cm();
  for (endpoint_impl* ep : ep_table) delete ep;
  for (endpoint_impl* ep : doomed) delete ep;
  for (size_t i = protocol_count; i-- > 0;) protocols[i].reset();
  detach_operations();
  if (!(params.flags & worker_ignore_request_leak)) report_leaked_requests();
  close_wakeup();
  ifaces.clear();
}

// -- wakeup --------------------------------------------------------------------------------------

status worker_impl::open_wakeup() {
  if (!params.wakeup) return status::ok;
  if (params.event_fd < -1) return status::invalid_param;
  external_set = params.event_fd >= 0;
  epoll_fd = external_set ? params.event_fd : epoll_create1(EPOLL_CLOEXEC);
  signal_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd < 0 || signal_fd < 0) {
    COMM_LOG(error, "worker", "%s: cannot make its event fds: %s", params.name.c_str(),
             std::strerror(errno));
    return status::no_resource;
  }
  if (!watch(signal_fd, signal_event_tag)) {
    COMM_LOG(error, "worker", "%s: event_fd %d does not take the worker's event sources: %s",
             params.name.c_str(), params.event_fd, std::strerror(errno));
    return status::invalid_param;
  }
  return status::ok;
}

void worker_impl::close_wakeup() {
  if (external_set) {
    for (int fd : watched) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  } else if (epoll_fd >= 0) {
    close(epoll_fd);
  }
  watched.clear();
  epoll_fd = -1;
  if (signal_fd >= 0) close(signal_fd);
  signal_fd = -1;
}

bool worker_impl::watch(int fd, uint64_t tag) {
  if (epoll_fd < 0) return false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  if (external_set) {
    ev.data.ptr = params.user_data;
  } else {
    ev.data.u64 = tag;
  }
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) return false;
  watched.push_back(fd);
  return true;
}

void worker_impl::unwatch(int fd) {
  const auto it = std::find(watched.begin(), watched.end(), fd);
  if (it == watched.end()) return;
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  watched.erase(it);
}

bool worker_impl::take_signal() {
  uint64_t count = 0;
  return signal_fd >= 0 && read(signal_fd, &count, sizeof(count)) == sizeof(count) && count != 0;
}

status worker_impl::arm_ifaces() {
  for (auto& li : ifaces) {
    if (li.iface->event_fd() < 0) continue;
    status st = li.iface->event_arm();
    if (st != status::ok) return st;
  }
  // The interfaces' fds sit in the epoll set level-triggered: nothing to drain here.
  return status::ok;
}

int worker_impl::sleep_on_events(int timeout_ms) {
  if (external_set) {
    // The user's set is only asked whether it is readable: epoll_wait would take the events of
    // the user's own sources, and an edge-triggered or one-shot one would never reach the user.
    pollfd set{epoll_fd, POLLIN, 0};
    const int n = poll(&set, 1, timeout_ms);
    if (n > 0) {
      guard g(*this);
      wake_source(0);  // every source of ours has the user's data: all are polled
    }
    return n;
  }
  epoll_event ev[8];
  const int n = epoll_wait(epoll_fd, ev, 8, timeout_ms);
  if (n > 0) {
    guard g(*this);
    for (int i = 0; i < n; ++i) wake_source(ev[i].data.u64);
  }
  return n;
}

void worker_impl::count_lane(const tl::iface* iface, int change) {
  for (auto& li : ifaces) {
    if (li.iface.get() != iface) continue;
    li.endpoints = static_cast<uint32_t>(static_cast<int64_t>(li.endpoints) + change);
    li.throttled = li.costly || li.endpoints == 0;
    if (!li.throttled) li.skip = li.backoff = 0;
    return;
  }
}

void worker_impl::wake_source(uint64_t tag) {
  // Whatever woke us is polled now, not after its idle backoff. In an external set every source
  // has the user's data: poll them all.
  if (external_set) {
    cm_skip = 0;
    for (auto& li : ifaces) li.skip = 0;
  } else if (is_cm_event(tag)) {
    cm_skip = 0;
  } else if (tag < ifaces.size()) {
    ifaces[tag].skip = 0;
  }
}

bool worker_impl::wait_is_over() {
  guard g(*this);
  return params.events == wakeup_all || (events_seen & params.events) != 0;
}

const char* mode_name(thread_mode mode) {
  switch (mode) {
    case thread_mode::single: return "single";
    case thread_mode::serialized: return "serialized";
    case thread_mode::multi: return "multi";
  }
  return "?";
}

// -- leaked requests -----------------------------------------------------------------------------

void worker_impl::report_leaked_requests() {
  const std::unordered_set<request*> free_set(free_requests.begin(), free_requests.end());
  std::map<std::string, size_t> kinds;
  size_t leaked = 0;
  for (const auto& chunk : request_chunks) {
    for (size_t i = 0; i < request_chunk_size; ++i) {
      request* req = &chunk[i];
      if (free_set.count(req) != 0 || !req->user_visible || req->released) continue;
      ++leaked;
      ++kinds[req->ops != nullptr ? req->ops->name : "unknown"];
    }
  }
  if (leaked == 0) return;
  const uint64_t n = leak_warnings.fetch_add(1, std::memory_order_relaxed) + 1;
  if (!leak_warning_shown(n)) return;
  std::string list;
  for (const auto& [kind, count] : kinds) {
    list += (list.empty() ? "" : ", ") + std::to_string(count) + " " + kind;
  }
  COMM_LOG(warn, "worker",
           "%s: %zu request%s never released by the user (%s), freed at destruction; release each "
           "one (worker::release, worker::wait) or set worker_ignore_request_leak (%llu workers "
           "of this process leaked requests so far)",
           params.name.c_str(), leaked, leaked == 1 ? " was" : "s were", list.c_str(),
           static_cast<unsigned long long>(n));
}

// -- requests ------------------------------------------------------------------------------------

request* worker_impl::alloc_request(const request_ops& ops, const request_params& p,
                                    request::role type) {
  if (free_requests.empty()) {
    request_chunks.emplace_back(new request[request_chunk_size]);
    for (size_t i = 0; i < request_chunk_size; ++i) {
      request& fresh = request_chunks.back()[i];
      fresh.iov.reserve(request::reserved_iov_entries);  // whichever post gets it, no allocation
      free_requests.push_back(&fresh);
    }
  }
  request* req = free_requests.back();
  free_requests.pop_back();
  req->reset();
  req->type = type;
  req->ops = &ops;
  req->owner = this;
  req->params = p;
  return req;
}

void worker_impl::free_request(request* req) {
  if (req->handle != nullptr) {
    operation_access::empty(*req->handle, req->finished ? req->st : status::canceled);
    req->handle = nullptr;
  }
  if (req->has_completion) req->completion.reset();
  req->st = status::no_elem;  // a stale handle reads as "no such request"
  free_requests.push_back(req);
}

void worker_impl::release_quietly(request* req) {
  req->handle = nullptr;
  if (req->finished) {
    if (req->notifying) {
      req->released = true;  // complete() frees it once its completion returned
    } else {
      free_request(req);
    }
    return;
  }
  req->silenced = true;
  req->released = true;
  if (req->has_completion) req->completion.reset();
}

void worker_impl::detach_operations() {
  for (const auto& chunk : request_chunks) {
    for (size_t i = 0; i < request_chunk_size; ++i) {
      request* req = &chunk[i];
      if (req->handle == nullptr) continue;
      operation_access::empty(*req->handle, req->finished ? req->st : status::canceled);
      req->handle = nullptr;
      req->released = true;  // its owner is told; not a leak
    }
  }
}

void worker_impl::complete(request* req, status st) {
  if (req->holds) req->ops->release(req);
  if (is_error(st) && (req->params.flags & request_completion_suppressed) && req->ep != nullptr) {
    ++req->ep->counters_.errors;
    COMM_LOG(warn, "rma", "%s: unsignalled operation failed: %s", params.name.c_str(),
             to_string(st));
  }
  req->st = st;
  req->finished = true;
  events_seen |= req->ops->events;
  // A completion that releases its own request (worker::release, or its operation going) only
  // marks it: freed here, after the call, so that nothing it starts can reuse it before.
  req->notifying = true;
  if (req->silenced) {
    // Released by its operation while running (release_quietly): nobody is told.
  } else if (req->ops->notify != nullptr) {
    req->ops->notify(req, st);
  } else if (req->params.send_cb != nullptr) {
    req->params.send_cb(req, st, req->params.user_data);
  }
  req->notifying = false;
  if (!req->user_visible || req->released) free_request(req);
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
  request* req = alloc_request(flush_ops, p, request::role::flush);
  req->user_visible = true;
  complete(req, st);
  return op{status::in_progress, req};
}

}  // namespace detail

// -- public worker API ---------------------------------------------------------------------------

result<std::unique_ptr<worker>> worker::create(context& ctx, const worker_params& params) {
  std::unique_ptr<worker> out;
  const status st = create(ctx, params, &out);
  if (st != status::ok) return st;
  return out;
}

status worker::create(context& ctx, const worker_params& params, std::unique_ptr<worker>* out) {
  auto w = std::make_unique<worker_impl>(ctx, params);
  const status st = w->init_status;
  out->reset(st == status::ok ? w.release() : nullptr);
  return st;
}

thread_mode worker::mode() const noexcept { return impl(*this).params.mode; }
const std::string& worker::name() const noexcept { return impl(*this).params.name; }
uint64_t worker::uid() const noexcept { return impl(*this).uid_; }
uint64_t worker::client_id() const noexcept { return impl(*this).params.client_id; }
void* worker::user_data() const noexcept { return impl(*this).params.user_data; }
unsigned worker::wakeup_events() const noexcept { return impl(*this).params.events; }

std::vector<uint8_t> worker::address(unsigned flags) const {
  worker_impl& w = const_cast<worker_impl&>(impl(*this));
  worker_impl::guard g(w);
  return w.packed_address(flags);
}

size_t worker::optimal_alignment() const noexcept {
  // The cache line: what the kernel says, else a common size; always a power of two >= 8.
  const long line = ::sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
  if (line >= 8 && line <= 4096 && (line & (line - 1)) == 0) return static_cast<size_t>(line);
  return 64;
}

unsigned worker::progress() {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  ++w.progress_depth;
  unsigned events = 0;
  for (auto& li : w.ifaces) {
    if (!li.throttled) {
      events += li.iface->progress();
      continue;
    }
    // An interface whose progress is a system call, or that none of our endpoints uses, is
    // polled less often while it stays idle, so it does not tax the shared-memory path; traffic
    // brings it back to every call.
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
  if (w.progress_wanted != 0) w.progress_modules();
  // Closed endpoints are deleted by the outermost call only: a callback that progresses again
  // returns into code still using the endpoint it was called for.
  if (--w.progress_depth == 0 && !w.doomed.empty()) {
    for (detail::endpoint_impl* ep : w.doomed) delete ep;
    w.doomed.clear();
  }
  return events;
}

int worker::event_fd() const noexcept {
  const worker_impl& w = impl(*this);
  return w.external_set ? -1 : w.epoll_fd;
}

status worker::arm() {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (w.epoll_fd < 0) return status::unsupported;
  if (w.take_signal()) return status::busy;
  return w.arm_ifaces();
}

namespace {

/// Milliseconds left until `deadline`, for epoll_wait (-1: no deadline).
int remaining_ms(bool bounded, std::chrono::steady_clock::time_point deadline) {
  if (!bounded) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

}  // namespace

status worker::wait(int timeout_ms) {
  worker_impl& w = impl(*this);
  if (w.epoll_fd < 0) return status::unsupported;
  const bool bounded = timeout_ms >= 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  {
    worker_impl::guard g(w);
    w.events_seen = 0;
  }
  for (;;) {
    bool signalled = false;
    status st = status::ok;
    {
      worker_impl::guard g(w);
      signalled = w.take_signal();
      if (!signalled) st = w.arm_ifaces();
    }
    if (!signalled && st == status::ok) {
      const int n = w.sleep_on_events(remaining_ms(bounded, deadline));
      if (n == 0) return status::timed_out;
      if (n < 0 && errno != EINTR) return status::io_error;
      worker_impl::guard g(w);
      signalled = w.take_signal();
    } else if (!signalled && st != status::busy) {
      return st;
    }
    const int handled = progress();
    if (signalled || w.wait_is_over()) return status::ok;
    // The user's set was readable and nothing of ours was: the events are the user's sources'.
    // Returning lets the user take them; polling the set again would spin until the deadline.
    if (w.external_set && handled == 0 && st == status::ok) return status::ok;
    if (bounded && std::chrono::steady_clock::now() >= deadline) return status::timed_out;
  }
}

status worker::signal() {
  const worker_impl& w = impl(*this);
  if (w.signal_fd < 0) return status::unsupported;
  const uint64_t one = 1;
  // The eventfd adds under the kernel's lock; a full counter (2^64 - 2) still wakes.
  if (write(w.signal_fd, &one, sizeof(one)) != sizeof(one) && errno != EAGAIN) {
    return status::io_error;
  }
  return status::ok;
}

status worker::fence() {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  for (detail::endpoint_impl* ep : w.ep_table) {
    if (ep == nullptr || !ep->lane || ep->state == detail::endpoint_impl::phase::failed ||
        ep->state == detail::endpoint_impl::phase::closing) {
      continue;
    }
    if (ep->outstanding_head != nullptr) {
      ep->push_fence();
      continue;
    }
    status st = ep->lane->fence();
    if (is_error(st)) return st;
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
  request* req = w.alloc_request(detail::flush_ops, params, request::role::flush);
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
      << " thread_mode " << detail::mode_name(w.params.mode)
      << " client_id " << w.params.client_id << '\n';
  out << w.placement.describe() << '\n';
  for (const auto& li : w.ifaces) {
    const auto& a = li.iface->attr();
    out << "iface " << li.component->name() << '/' << li.device << " (device "
        << to_string(w.placement.distance(li.device)) << "): max_short " << a.max_short
        << " max_bcopy " << a.max_bcopy << " max_zcopy " << a.max_zcopy << " max_iov " << a.max_iov
        << " latency " << a.latency_ns << " ns bandwidth " << a.bandwidth_bytes_per_s / 1e9
        << " GB/s priority " << a.priority << '\n';
    std::istringstream lines(li.iface->info());
    for (std::string line; std::getline(lines, line);) out << "  " << line << '\n';
  }
  out << "thresholds: short " << (w.short_thresh ? std::to_string(w.short_thresh) : "transport max")
      << " zcopy " << w.zcopy_thresh << '\n';
  out << "protocol errors " << w.protocol_errors << "; late messages for closed endpoints "
      << w.late_messages << '\n';
  const peer_limits& c = w.ctx.cfg().limits;
  out << "held for peers: unexpected " << w.unexpected_bytes << " of " << c.unexpected_max_bytes
      << " B, AMs before delivery " << w.am_rx_bytes << " of " << c.am_rx_max_bytes
      << " B, peer endpoints " << w.peer_eps << " of " << c.peer_ep_max << "; limit errors "
      << w.limit_errors << '\n';
  for (size_t i = 0; i < w.protocol_count; ++i) w.protocols[i]->info(out);
  for (const listener* l : w.listeners) {
    out << "listener " << l->address() << ": " << l->requests() << " requests\n";
  }
  for (const detail::endpoint_impl* ep : w.ep_table) {
    if (ep != nullptr) out << ep->info() << '\n';
  }
  return out.str();
}

void worker::print_info(std::FILE* stream) const { std::fputs(info().c_str(), stream); }

// -- requests ------------------------------------------------------------------------------------

status worker::request_status(const request* req) const noexcept {
  if (req == nullptr) return status::invalid_param;
  worker_impl::guard g(const_cast<worker_impl&>(impl(*this)));
  return req->finished ? req->st : status::in_progress;
}

std::string worker::request_info(const request* req) const {
  if (req == nullptr) return "null request";
  worker_impl::guard g(const_cast<worker_impl&>(impl(*this)));
  std::ostringstream out;
  out << (req->ops != nullptr ? req->ops->name : "request");
  if (req->ep != nullptr) {
    out << " on ep " << req->ep->id << " -> " << req->ep->peer_name() << " via "
        << req->ep->transport();
  }
  size_t bytes = 0;
  for (const iov_entry& e : req->iov) bytes += e.length;
  out << ", " << bytes << " B in " << req->iov.size()
      << (req->iov.size() == 1 ? " entry" : " entries") << ", "
      << (req->finished ? to_string(req->st) : "in progress");
  if (req->released) out << " (released)";
  return out.str();
}

void worker::release(request* req) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (req == nullptr) return;
  if (req->finished && !req->notifying) {
    w.free_request(req);
  } else {
    req->released = true;  // freed when it completes (or once its completion returned)
  }
}

status worker::cancel(request* req, cancel_mode mode) {
  worker_impl& w = impl(*this);
  worker_impl::guard g(w);
  if (req == nullptr || req->finished) return status::invalid_param;
  if (req->ops->cancel == nullptr) return status::unsupported;
  return req->ops->cancel(req, mode);
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
