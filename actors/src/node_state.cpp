// The node's lifecycle, its progress thread, and the public API's entry points (see
// node_state.hpp for the threading rules).
#include "node_state.hpp"
#include "core_move.hpp"
#include "idle_spin.hpp"

#include <comm/log.hpp>

#include <caf/actor_cast.hpp>

#include <cerrno>
#include <cstring>

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace comm::actors::detail {

namespace {

/// Longest sleep on the event fds: the worker is progressed at least this often.
constexpr int max_sleep_ms = 10;

/// How long the progress thread spins at least while a send of its node is in flight.
constexpr std::chrono::microseconds in_flight_spin{5000};

/// How long a sender waits for the turn lock before it leaves its frame in the outbox: several
/// idle turns of the progress thread, less than a turn that delivers a burst of frames.
constexpr std::chrono::nanoseconds turn_wait{2000};

/// Tells the core that this thread spins (lets the other hardware thread of a core go on).
inline void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// Numbers the nodes of this process (see node_state::generation_).
std::atomic<uint64_t> node_generations{0};

/// Pins the calling thread to `cpus` (no-op when empty).
void pin(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    COMM_LOG(warn, "actors", "cannot pin the progress thread; it runs unpinned");
  }
}

}  // namespace

node_state::node_state(caf::actor_system& sys, node_params params)
    : sys_(sys),
      params_(std::move(params)),
      proxies_(sys, *this),
      serializer_unit_(&sys),
      unit_(sys),
      generation_(++node_generations),
      proxies_alive_(std::make_shared<std::atomic<size_t>>(0)) {
  unit_.proxy_registry_ptr(&proxies_);
}

node_state::~node_state() noexcept {
  stop();
  outbox::delete_all(queue_head_);
}

// -- lifecycle -----------------------------------------------------------------------------------

void node_state::start() {
  context_ = std::make_unique<comm::context>(params_.transport);
  comm::worker_params wp;
  wp.name = "caf-node:" + std::to_string(::getpid());
  wp.cpus = params_.cpus;  // the worker's memory near the progress thread run() pins
  if (auto made = comm::worker::create(*context_, wp)) worker_ = std::move(*made);
  if (!worker_ || !open_wakeup()) {
    fail_start();
    return;
  }
  worker_->set_am_handler(frame_am_id, &node_state::on_frame, this,
                          comm::am_handler_flags::whole_msg | comm::am_handler_flags::fetch_rndv);
  open_listener();
  hello_ = encode_hello(sys_, node_hello{sys_.node(), address()});
  thread_ = std::thread([this] { run(); });
}

bool node_state::open_wakeup() {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) return false;
  for (int fd : {wake_fd_, worker_->event_fd()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return false;
  }
  return true;
}

void node_state::fail_start() {
  const int err = errno;
  COMM_LOG(error, "actors", "the node cannot start (%s): it neither listens nor connects",
           worker_ ? std::strerror(err) : "no worker: out of file descriptors or memory");
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  wake_fd_ = epoll_fd_ = -1;
  worker_.reset();
  std::lock_guard<std::mutex> g(mtx_);
  listen_error_ = make_error(comm::status::no_resource);
}

void node_state::stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true, std::memory_order_seq_cst);
  sleeping_.store(true);
  wake();
  thread_.join();
  proxies_.clear();
  {
    std::lock_guard<std::mutex> g(mtx_);
    names_.clear();
    by_node_.clear();
  }
  ::close(wake_fd_);
  ::close(epoll_fd_);
  wake_fd_ = epoll_fd_ = -1;
}

// -- the progress thread -------------------------------------------------------------------------

void node_state::run() {
  thread_id_.store(std::this_thread::get_id(), std::memory_order_release);
  pthread_setname_np(pthread_self(), "comm.progress");
  pin(params_.cpus);
  idle_spin spin;
  core_move mover(generation_ ^ static_cast<uint64_t>(::getpid()));
  const bool movable = may_move();
  int left_cpu = -1;
  while (!stopping_.load(std::memory_order_acquire)) {
    const bool busy = turn() != 0;
    if (busy) {
      spin.busy();
    } else {
      // A send in flight (a large frame the peer is fetching) means an answer is likely on its
      // way: waiting for it asleep would add a wake-up to every hop of a large ping-pong.
      const auto spin_time = in_flight_.get() != 0 ? std::max(params_.spin_time, in_flight_spin)
                                                   : params_.spin_time;
      if (spin.idle(spin_time) == idle_spin::action::sleep && sleep()) mover.slept();
    }
    if (!movable) continue;
    switch (mover.turn(busy, spin.sharing(), spin.long_offers())) {
      case core_move::action::leave: left_cpu = move_off(); break;
      case core_move::action::go_back: move_back(left_cpu); break;
      case core_move::action::stay: break;
    }
  }
  shut_down();
}

bool node_state::on_progress_thread() const noexcept {
  return std::this_thread::get_id() == thread_id_.load(std::memory_order_acquire);
}

size_t node_state::turn() {
  size_t n = 0;
  // A sender waiting for the lock sends sooner and cheaper from its own thread: this turn passes.
  if (turn_wanted_.load(std::memory_order_relaxed) == 0 && try_acquire()) {
    n = progress_locked();
    release();
  }
  return n + unit_.run();
}

size_t node_state::progress_locked() {
  // Frames of other threads that this one sends for them do not count as events: they would
  // send them themselves, and a thread that only relays should offer its core like an idle one.
  drain();
  in_callback_ = true;
  const size_t n = worker_->progress();
  in_callback_ = false;
  close_endpoints();
  drain();
  return n;
}

bool node_state::sleep() {
  if (!try_acquire()) return false;  // another thread is sending: not idle
  sleeping_.store(true, std::memory_order_seq_cst);
  const bool busy = !outbox_.empty() || !unit_.idle() || stopping_.load() ||
                    worker_->arm() != comm::status::ok;
  release();
  if (busy) {
    sleeping_.store(false, std::memory_order_relaxed);
    return false;
  }
  epoll_event events[2];
  ::epoll_wait(epoll_fd_, events, 2, max_sleep_ms);
  sleeping_.store(false, std::memory_order_relaxed);
  uint64_t count = 0;
  [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof(count));
  return true;
}

void node_state::wake() {
  if (sleeping_.exchange(false, std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }
}

void node_state::shut_down() {
  // The lock is kept from here on: no other thread touches the worker again.
  while (!try_acquire()) std::this_thread::yield();
  drain();
  std::vector<std::shared_ptr<peer>> all;
  for (auto& [ep, p] : by_ep_) all.push_back(p);
  for (auto& p : all) fail_peer(p, comm::status::not_connected);
  close_endpoints();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < until && worker_->progress() != 0) {
  }
  listener_.reset();
  unit_.hand_over();
  outbox::delete_all(outbox_.take_all());
  worker_.reset();
  context_.reset();
}

// -- the turn lock -------------------------------------------------------------------------------

bool node_state::try_acquire() noexcept {
  if (busy_.exchange(true, std::memory_order_seq_cst)) return false;
  holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  return true;
}

bool node_state::wait_for_turn() noexcept {
  if (holder_stalled_.load(std::memory_order_relaxed)) return false;
  turn_wanted_.fetch_add(1, std::memory_order_seq_cst);
  bool got = false;
  const auto until = std::chrono::steady_clock::now() + turn_wait;
  for (unsigned i = 1;; ++i) {
    if (!busy_.load(std::memory_order_relaxed) && try_acquire()) {
      got = true;
      break;
    }
    relax();
    if (i % 16 == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  turn_wanted_.fetch_sub(1, std::memory_order_relaxed);
  if (!got) holder_stalled_.store(true, std::memory_order_relaxed);
  return got;
}

bool node_state::holds_lock() const noexcept {
  return holder_.load(std::memory_order_relaxed) == std::this_thread::get_id();
}

void node_state::release() noexcept {
  if (holder_stalled_.load(std::memory_order_relaxed)) {
    holder_stalled_.store(false, std::memory_order_relaxed);  // the lock changes hands
  }
  for (;;) {
    holder_.store(std::thread::id{}, std::memory_order_relaxed);
    busy_.store(false, std::memory_order_seq_cst);
    // What others queued while this thread held the lock leaves now, unless one of them took
    // the lock (and drains it) meanwhile.
    if (outbox_.empty() || !try_acquire()) return;
    drain();
  }
}

// -- handing work over ---------------------------------------------------------------------------

void node_state::submit(outgoing* item) {
  if (holds_lock()) {
    enqueue_local(item);
    if (!in_callback_ && !draining_) drain();
    return;
  }
  outbox_.push(item);
  if (try_acquire()) {
    drain();
    release();
  }
}

void node_state::post(outgoing* item) {
  if (holds_lock()) {
    enqueue_local(item);
  } else {
    outbox_.push(item);
    wake();
  }
}

void node_state::post_task(std::function<void()> task) {
  auto* item = new outgoing;
  item->task = std::move(task);
  post(item);
}

void node_state::enqueue_local(outgoing* item) {
  // What other threads queued earlier goes first: an actor that sent from a CAF worker and now
  // runs here must see its frames leave in order.
  for (outgoing* list = outbox_.empty() ? nullptr : outbox_.take_all(); list != nullptr;) {
    outgoing* next = list->next;
    list->next = nullptr;
    (queue_tail_ ? queue_tail_->next : queue_head_) = list;
    queue_tail_ = list;
    list = next;
  }
  if (item == nullptr) return;
  item->next = nullptr;
  (queue_tail_ ? queue_tail_->next : queue_head_) = item;
  queue_tail_ = item;
}

size_t node_state::drain() {
  enqueue_local(nullptr);
  if (draining_) return 0;
  draining_ = true;
  size_t n = 0;
  while (queue_head_ != nullptr) {
    outgoing* item = queue_head_;
    queue_head_ = item->next;
    if (queue_head_ == nullptr) queue_tail_ = nullptr;
    handle(item);
    ++n;
  }
  draining_ = false;
  return n;
}

void node_state::handle(outgoing* item) {
  if (item->task) {
    item->task();
    delete item;
    return;
  }
  transmit(item);
}

// -- public API ----------------------------------------------------------------------------------

std::string node_state::address() const {
  std::lock_guard<std::mutex> g(mtx_);
  return address_;
}

caf::error node_state::listen_error() const {
  std::lock_guard<std::mutex> g(mtx_);
  return listen_error_;
}

caf::error node_state::publish(const caf::actor& whom, const std::string& name, interface ifs) {
  if (!whom || name.empty()) return make_error(comm::status::invalid_param);
  {
    std::lock_guard<std::mutex> g(mtx_);
    auto [it, added] = names_.emplace(name, published_actor{whom, ifs});
    if (!added && it->second.handle != whom) return make_error(comm::status::already_exists);
    it->second.ifs = std::move(ifs);
  }
  sys_.registry().put(whom.id(), whom);
  // The name goes when its actor does.
  auto* self = this;
  auto weak = caf::actor_cast<caf::actor_addr>(whom);
  whom->attach_functor([self, name, weak] {
    std::lock_guard<std::mutex> g(self->mtx_);
    auto it = self->names_.find(name);
    if (it != self->names_.end() && it->second.handle.address() == weak) self->names_.erase(it);
  });
  return caf::error{};
}

caf::error node_state::unpublish(const std::string& name) {
  std::lock_guard<std::mutex> g(mtx_);
  return names_.erase(name) != 0 ? caf::error{} : make_error(comm::status::no_elem);
}

caf::expected<caf::actor> node_state::lookup(const std::string& address, const std::string& name,
                                             std::chrono::milliseconds timeout,
                                             const interface& expected) {
  if (address.empty() || name.empty()) return make_error(comm::status::invalid_param);
  if (on_progress_thread()) return make_error(comm::status::busy);
  if (!thread_.joinable() || stopping_.load()) return make_error(comm::status::not_connected);
  auto call = std::make_shared<lookup_call>(address, name, expected);
  post_task([this, call] { start_lookup(call); });
  return call->wait(timeout);
}

caf::error node_state::disconnect(const std::string& address) {
  if (on_progress_thread()) return make_error(comm::status::busy);
  if (!thread_.joinable() || stopping_.load()) return make_error(comm::status::no_elem);
  auto done = std::make_shared<lookup_call>(address, std::string());
  post_task([this, address, done] { disconnect_now(address, done); });
  auto result = done->wait(params_.connect_timeout);
  return result ? caf::error{} : std::move(result.error());
}

node_stats node_state::stats() const {
  node_stats s;
  {
    std::lock_guard<std::mutex> g(mtx_);
    s.published = names_.size();
  }
  s.peers = peers_.get();
  s.proxies = proxies_alive_->load(std::memory_order_relaxed);
  s.pending_requests = pending_gauge_.get();
  s.remote_monitors = watched_gauge_.get();
  s.messages_sent = sent_.get();
  s.messages_received = received_.get();
  s.bytes_sent = bytes_sent_.get();
  s.bytes_received = bytes_received_.get();
  s.frames_held = frames_held_.get();
  s.unreadable_messages = unreadable_.get();
  s.peak_bytes_held = peak_bytes_held_.get();
  s.peak_frames_queued = peak_frames_queued_.get();
  s.backlog_waits = backlog_waits_.load(std::memory_order_relaxed);
  s.backlog_stalls = backlog_stalls_.load(std::memory_order_relaxed);
  s.blobs_lent = blobs_lent_.get();
  s.lent_kept_now = kept_->count.load(std::memory_order_relaxed);
  s.lent_kept_bytes_now = kept_->bytes.load(std::memory_order_relaxed);
  s.lent_now = lent_now_.get() + s.lent_kept_now;
  s.lent_bytes_now = lent_bytes_now_.get() + s.lent_kept_bytes_now;
  s.blobs_borrowed = borrowed_.get();
  s.borrowed_copied = borrowed_copied_.get();
  return s;
}

}  // namespace comm::actors::detail
