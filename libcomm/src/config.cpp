#include <comm/config.hpp>
#include <comm/log.hpp>
#include <comm/transport/transport.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>
#include <cstdint>

namespace comm {
namespace {

void read_size(const char* variable, size_t* field) {
  const char* text = std::getenv(variable);
  if (text == nullptr) return;
  uint64_t value = 0;
  if (tl::parse_size(text, &value)) {
    *field = static_cast<size_t>(value);
  } else {
    COMM_LOG(warn, "config", "%s=%s is not a size (e.g. 8192, 16k, 1m); ignored", variable, text);
  }
}

/// The cluster secret: COMM_AUTH_KEY, else the first line of the file COMM_AUTH_KEY_FILE names.
void read_auth_key(std::string* key) {
  if (const char* text = std::getenv("COMM_AUTH_KEY")) {
    *key = text;
    return;
  }
  const char* path = std::getenv("COMM_AUTH_KEY_FILE");
  if (path == nullptr) return;
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line) || line.empty()) {
    COMM_LOG(error, "config", "COMM_AUTH_KEY_FILE=%s cannot be read or is empty: no auth key",
             path);
    return;
  }
  *key = line;
}

/// The COMM_<TL>_* variables of the environment for every transport built in.
tl::options transport_variables() {
  tl::options found;
  const tl::options all = tl::environment_options();
  for (tl::component* component : tl::all_components()) {
    const std::string prefix = tl::option_prefix(component->name());
    for (auto it = all.lower_bound(prefix); it != all.end() && it->first.starts_with(prefix); ++it)
      found.insert(*it);
  }
  return found;
}

/// Reads COMM_TM_THRESH: a size, or "off" for no tag matching in the transport.
void read_tm_thresh(size_t* field) {
  const char* text = std::getenv("COMM_TM_THRESH");
  if (text != nullptr && std::string_view(text) == "off") {
    *field = SIZE_MAX;
    return;
  }
  read_size("COMM_TM_THRESH", field);
}

/// Reads a limit: a size of at least 1 (0 would refuse everything).
void read_limit(const char* variable, size_t* field) {
  size_t value = *field;
  read_size(variable, &value);
  if (value == 0) {
    COMM_LOG(warn, "config", "%s=0 would refuse every message; using %zu", variable, *field);
    return;
  }
  *field = value;
}

/// Reads the limits on what a peer may make a worker hold.
void read_limits(peer_limits* limits) {
  read_limit("COMM_UNEXPECTED_MAX_BYTES", &limits->unexpected_max_bytes);
  read_limit("COMM_UNEXPECTED_EP_MAX_BYTES", &limits->unexpected_ep_max_bytes);
  read_limit("COMM_UNEXPECTED_EP_MAX_MSGS", &limits->unexpected_ep_max_msgs);
  read_limit("COMM_EAGER_WINDOW_EP_BYTES", &limits->eager_window_ep_bytes);
  read_limit("COMM_AM_RX_MAX_BYTES", &limits->am_rx_max_bytes);
  read_limit("COMM_AM_RX_EP_MAX_BYTES", &limits->am_rx_ep_max_bytes);
  read_limit("COMM_AM_HELD_MAX", &limits->am_held_max);
  read_limit("COMM_AM_HELD_MAX_BYTES", &limits->am_held_max_bytes);
  read_limit("COMM_STREAM_RX_MAX_BYTES", &limits->stream_rx_max_bytes);
  read_limit("COMM_STREAM_RX_EP_MAX_BYTES", &limits->stream_rx_ep_max_bytes);
  read_limit("COMM_REPLY_EP_MAX_BYTES", &limits->reply_ep_max_bytes);
  read_limit("COMM_RMA_READS_IN", &limits->rma_reads_in);
  read_limit("COMM_PEER_EP_MAX", &limits->peer_ep_max);
}

}  // namespace

config config::from_environment() {
  config cfg;
  if (const char* tls = std::getenv("COMM_TLS")) {
    std::stringstream list(tls);
    std::string name;
    while (std::getline(list, name, ',')) {
      if (!name.empty()) cfg.transports.push_back(name);
    }
  }
  read_size("COMM_SHORT_THRESH", &cfg.short_thresh);
  read_size("COMM_ZCOPY_THRESH", &cfg.zcopy_thresh);
  read_size("COMM_RNDV_THRESH", &cfg.rndv_thresh);
  read_tm_thresh(&cfg.tm_thresh);
  cfg.transport_options = transport_variables();
  read_auth_key(&cfg.auth_key);
  read_limits(&cfg.limits);
  return cfg;
}

bool config::transport_enabled(const std::string& name) const {
  if (transports.empty()) return true;
  for (const auto& t : transports) {
    if (t == name || t == "all") return true;
  }
  return false;
}

}  // namespace comm
