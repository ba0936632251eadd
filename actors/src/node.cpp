// The public node API, the actor-system module that owns the node, and the "comm" error category.
//
// The module is CAF 0.17's reserved network-manager slot, whose class caf::net::middleman CAF
// only declares (and befriends: it may give the system its node id, which without CAF's own io
// middleman stays invalid). It starts the node with the system and stops it after every actor is
// done.
#include <comm/actors/node.hpp>
#include <comm/log.hpp>

#include "node_state.hpp"

#include <caf/actor_system_config.hpp>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace caf::net {

/// The module that load() installs: owns the node of one actor system.
class middleman final : public caf::actor_system::module {
public:
  middleman(caf::actor_system& sys, comm::actors::node_params params)
      : sys_(sys), node_(sys, std::move(params)) {}

  /// Gives the system a node id when no other module did.
  void init(caf::actor_system_config& cfg) override {
    if (!sys_.node_) {
      auto id = caf::node_id::default_data::local(cfg);
      sys_.node_.swap(id);
    }
  }

  void start() override { node_.state_->start(); }
  void stop() override { node_.state_->stop(); }
  id_t id() const override { return network_manager; }
  void* subtype_ptr() override { return this; }

  /// The node.
  comm::actors::node& get() noexcept { return node_; }

private:
  caf::actor_system& sys_;
  comm::actors::node node_;
};

}  // namespace caf::net

namespace comm::actors {

namespace {

/// Parses a byte count with an optional k, m or g suffix (as the COMM_ variables take sizes).
/// @returns false for anything else, or a count beyond size_t
bool parse_size(std::string_view text, size_t& out) {
  const auto digits = text.find_first_not_of("0123456789");
  const std::string_view number = text.substr(0, digits);
  const std::string_view suffix = digits == std::string_view::npos ? "" : text.substr(digits);
  unsigned shift = 0;
  if (suffix == "k" || suffix == "K") {
    shift = 10;
  } else if (suffix == "m" || suffix == "M") {
    shift = 20;
  } else if (suffix == "g" || suffix == "G") {
    shift = 30;
  } else if (!suffix.empty()) {
    return false;
  }
  size_t value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc{} || value > (SIZE_MAX >> shift)) return false;
  out = value << shift;
  return true;
}

/// The size named by the environment variable `name`, else (also when malformed) `fallback`.
size_t size_from_environment(const char* name, size_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr) return fallback;
  size_t size = 0;
  if (!parse_size(value, size)) {
    COMM_LOG(warn, "actors", "%s=%s is not a size (e.g. 64m); ignored", name, value);
    return fallback;
  }
  return size;
}

/// CAF's setting that the node changes unless the configuration holds it: an idle CAF worker first
/// polls its queue 500 times, sleeping 50 us in between ("moderate" polling: about 60 ms here, as
/// each sleep overshoots), before it sleeps on its condition variable. Each poll is a timer
/// wake-up that preempts whatever runs on its core (the progress thread: 4 workers of each
/// process made 8-13 context switches per hop of a 1 MiB ping-pong), and a job another thread
/// enqueues waits for the next poll (about 90 us per hop with delivery::scheduler). Without it an
/// idle worker sleeps at once; an enqueue from another thread wakes it through the condition
/// variable, and it steals jobs queued at a busy worker every relaxed-sleep-duration (CAF's
/// 10 ms) instead of every 250 us.
constexpr char moderate_polls_key[] = "work-stealing.moderate-poll-attempts";

void set_scheduler_defaults(caf::actor_system_config& cfg) {
  if (caf::get_if(&caf::content(cfg), moderate_polls_key) == nullptr) {
    cfg.set(moderate_polls_key, size_t{0});
  }
}

/// Renders errors of error_category: the status's name.
std::string render_status(uint8_t code, caf::atom_value, const caf::message&) {
  return std::string("comm::") + comm::to_string(static_cast<comm::status>(-int{code}));
}

}  // namespace

delivery default_delivery() {
  const char* value = std::getenv("COMM_ACTORS_DELIVERY");
  return value != nullptr && std::string_view(value) == "scheduler" ? delivery::scheduler
                                                                    : delivery::progress_thread;
}

std::chrono::microseconds default_spin_time() {
  const char* value = std::getenv("COMM_ACTORS_SPIN_US");
  char* end = nullptr;
  const long long us = value != nullptr ? std::strtoll(value, &end, 10) : -1;
  if (value == nullptr || end == value || *end != '\0' || us < 0) return std::chrono::microseconds(200);
  return std::chrono::microseconds(us);
}

size_t default_max_held_bytes() {
  return size_from_environment("COMM_ACTORS_MAX_HELD", size_t{64} << 20);
}

size_t default_max_queued_bytes() {
  return size_from_environment("COMM_ACTORS_MAX_QUEUED", size_t{256} << 20);
}

size_t default_max_backlog() {
  return size_from_environment("COMM_ACTORS_MAX_BACKLOG", size_t{1} << 10);
}

size_t default_max_proxies() {
  return size_from_environment("COMM_ACTORS_MAX_PROXIES", size_t{1} << 18);
}

caf::error make_error(comm::status st) {
  if (!is_error(st)) return caf::error{};
  return caf::error{static_cast<uint8_t>(-static_cast<int>(st)), error_category};
}

comm::status status_of(const caf::error& err) {
  if (!err) return comm::status::ok;
  if (err.category() != error_category) return foreign_error;
  return static_cast<comm::status>(-static_cast<int>(err.code()));
}

// -- node ----------------------------------------------------------------------------------------

void node::load(caf::actor_system_config& cfg, node_params params) {
  set_scheduler_defaults(cfg);
  cfg.add_error_category(error_category, &render_status);
  cfg.add_message_type<blob>(blob_type_name);
  cfg.module_factories.push_back(
      [params = std::move(params)](caf::actor_system& sys) -> caf::actor_system::module* {
        return new caf::net::middleman(sys, params);
      });
}

node* node::get(caf::actor_system& sys) noexcept {
  if (!sys.has_network_manager()) return nullptr;
  return &sys.network_manager().get();
}

node::node(caf::actor_system& sys, node_params params)
    : state_(std::make_unique<detail::node_state>(sys, std::move(params))) {}

node::~node() = default;

std::string node::address() const { return state_->address(); }

caf::error node::listen_error() const { return state_->listen_error(); }

caf::node_id node::id() const { return state_->system().node(); }

caf::actor_system& node::system() const noexcept { return state_->system(); }

caf::error node::publish(const caf::actor& whom, const std::string& name) {
  return state_->publish(whom, name);
}

caf::error node::publish_typed(const caf::actor& whom, const std::string& name,
                               std::set<std::string> ifs) {
  return state_->publish(whom, name, std::move(ifs));
}

caf::error node::unpublish(const std::string& name) { return state_->unpublish(name); }

std::chrono::milliseconds node::default_timeout() const noexcept {
  return state_->connect_timeout();
}

caf::expected<caf::actor> node::lookup_as(const std::string& address, const std::string& name,
                                          std::chrono::milliseconds timeout,
                                          const std::set<std::string>& expected) {
  return state_->lookup(address, name, timeout, expected);
}

caf::expected<caf::actor> node::lookup(const std::string& address, const std::string& name) {
  return state_->lookup(address, name, state_->connect_timeout());
}

caf::expected<caf::actor> node::lookup(const std::string& address, const std::string& name,
                                       std::chrono::milliseconds timeout) {
  return state_->lookup(address, name, timeout);
}

caf::error node::disconnect(const std::string& address) { return state_->disconnect(address); }

node_stats node::stats() const { return state_->stats(); }

// -- blocking calls ------------------------------------------------------------------------------

namespace detail {

void lookup_call::complete(caf::expected<caf::actor> result) {
  {
    std::lock_guard<std::mutex> g(mtx_);
    if (result_) return;
    result_ = std::move(result);
  }
  cv_.notify_all();
}

caf::expected<caf::actor> lookup_call::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mtx_);
  if (!cv_.wait_for(g, timeout, [this] { return result_.has_value(); })) {
    return make_error(comm::status::timed_out);
  }
  return *result_;
}

}  // namespace detail

}  // namespace comm::actors
