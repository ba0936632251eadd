// The engine's lifecycle and progress loop: tasks from actors, progress, tag matching, and sleep
// on the worker's event fd plus a wake-up eventfd when idle.
#include "io_engine.hpp"
#include "idle_spin.hpp"

#include <comm/log.hpp>

#include <caf/send.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>

namespace comm::actors::io::detail {

namespace {

/// Longest sleep between progress calls even without events, so a missed wake-up costs little.
constexpr int max_sleep_ms = 100;

}  // namespace

caf::expected<std::shared_ptr<engine>> engine::start(caf::actor_system& sys, worker_config cfg) {
  auto eng = std::make_shared<engine>(sys, std::move(cfg));
  if (eng->wake_fd_ < 0) return make_error(status::io_error);
  if (!eng->worker_) return make_error(status::no_resource);
  eng->thread_ = std::thread([eng] { eng->run(); });
  return eng;
}

engine::engine(caf::actor_system& sys, worker_config cfg) : sys_(sys), cfg_(std::move(cfg)) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ctx_ = std::make_unique<comm::context>(cfg_.transport);
  comm::worker_params wp = cfg_.worker;
  wp.mode = thread_mode::single;
  wp.wakeup = true;
  if (auto made = comm::worker::create(*ctx_, wp)) worker_ = std::move(*made);
}

engine::~engine() {
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  worker_.reset();
  ctx_.reset();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

// -- any thread ------------------------------------------------------------------------------------

bool engine::post(task t) {
  {
    std::lock_guard<std::mutex> guard(mtx_);
    if (stopping_) return false;
    tasks_.push_back(std::move(t));
  }
  if (sleeping_.load()) wake();
  return true;
}

void engine::stop() {
  {
    std::lock_guard<std::mutex> guard(mtx_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void engine::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

// -- progress loop ---------------------------------------------------------------------------------

void engine::run() {
  // Idle turns offer the core as the node's progress thread does (see idle_spin.hpp).
  comm::actors::detail::idle_spin spin;
  while (!stopping_.load()) {
    size_t events = run_tasks();
    events += worker_->progress();
    events += match_tags();
    if (events != 0) {
      spin.busy();
    } else if (spin.idle(cfg_.spin_time) == comm::actors::detail::idle_spin::action::sleep) {
      sleep();
    }
  }
  shut_down();
}

size_t engine::run_tasks() {
  std::vector<task> batch;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    batch.swap(tasks_);
  }
  for (task& t : batch) t(*this);
  return batch.size();
}

void engine::sleep() {
  sleeping_.store(true);
  bool idle = false;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    idle = tasks_.empty() && !stopping_;
  }
  if (idle && worker_->arm() == status::ok) {
    pollfd fds[2] = {{worker_->event_fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    (void)::poll(fds, 2, max_sleep_ms);
  }
  sleeping_.store(false);
  uint64_t drained = 0;
  [[maybe_unused]] ssize_t n = ::read(wake_fd_, &drained, sizeof(drained));
}

void engine::shut_down() {
  shutting_down_ = true;
  std::vector<task> dropped;  // destroyed without the lock: they may hold an actor's last handle
  {
    std::lock_guard<std::mutex> guard(mtx_);
    dropped.swap(tasks_);
  }
  dropped.clear();
  for (auto& [id, slot] : listeners_) caf::anon_send(slot.actor, gone{status::ok});
  for (auto& [id, slot] : endpoints_) caf::anon_send(slot.actor, gone{status::ok});
  for (tag_wait& w : waits_) report(w.reply, status::canceled);
  waits_.clear();
  close_all_endpoints();
  listeners_.clear();
  worker_.reset();
  flights_.clear();
  route_order_.clear();
  endpoints_.clear();
  slot_of_.clear();
  am_routes_.clear();
  tag_routes_.clear();
  ctx_.reset();
}

void engine::close_all_endpoints() {
  std::vector<comm::operation> closing;
  for (auto& [id, slot] : endpoints_) {
    if (slot.closing) continue;
    slot.closing = true;
    comm::operation o = slot.ep.close();
    if (!o.done()) closing.push_back(std::move(o));
  }
  const auto deadline = std::chrono::steady_clock::now() + cfg_.close_timeout;
  for (comm::operation& o : closing) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const status st = o.wait(static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (st != status::ok) COMM_LOG(warn, "io", "closing an endpoint at exit: %s", to_string(st));
  }
}

// -- helpers ---------------------------------------------------------------------------------------

void engine::report(const notice& n, comm::status st) {
  op_done done;
  done.st = st;
  report(n, std::move(done));
}

void engine::report(const notice& n, op_done done) {
  auto to = caf::actor_cast<caf::actor>(n.to);
  if (!to) return;
  done.id = n.id;
  caf::anon_send(to, std::move(done));
}

engine::flight* engine::new_flight(notice n) {
  auto f = std::make_unique<flight>();
  f->key = next_key_++;
  f->reply = std::move(n);
  flight* raw = f.get();
  flights_.emplace(raw->key, std::move(f));
  return raw;
}

void engine::finish(uint64_t key, comm::status st) {
  auto it = flights_.find(key);
  if (it == flights_.end()) return;
  std::unique_ptr<flight> f = std::move(it->second);
  flights_.erase(it);
  if (f->endpoint != 0) drop_endpoint(f->endpoint);
  report(f->reply, st);
}

comm::send_completion engine::finisher(uint64_t key) {
  return [this, key](status st) { finish(key, st); };
}

}  // namespace comm::actors::io::detail
