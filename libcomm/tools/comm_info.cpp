// comm_info: what libcomm sees on this machine (ucx_info's counterpart): transports and devices,
// each transport's variables (COMM_<TL>_*) with their values and help, the limits of each
// transport's interface, thresholds, the hwloc topology, the info of a worker on
// each enabled transport, and the bootstrap backend a job started here would use. With -l or -c
// it is one side of a connection instead and prints the lane chosen to the peer, and why.
//
//   comm_info [-t tls] [-h]   (also --tls=tls, --help)
//   comm_info [-t tls] -l [host:]port     serve one client, print the lane to it
//   comm_info [-t tls] -c host:port       connect to such a server, print the lane to it

#include <comm/bootstrap.hpp>
#include <comm/context.hpp>
#include <comm/endpoint.hpp>
#include <comm/listener.hpp>
#include <comm/transport/transport.hpp>
#include <comm/worker.hpp>

#include <getopt.h>

#include <chrono>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

/// The names of the transports built in, comma-separated.
std::string known_transports() {
  std::string names;
  for (const comm::tl::component* component : comm::tl::all_components()) {
    if (!names.empty()) names += ", ";
    names += component->name();
  }
  return names;
}

/// True when `name` is a transport built in, or "all" (what COMM_TLS accepts).
bool is_known_transport(const std::string& name) {
  if (name == "all") return true;
  for (const comm::tl::component* component : comm::tl::all_components())
    if (component->name() == name) return true;
  return false;
}

/// Prints the usage text to `out`.
void usage(std::FILE* out) {
  std::fprintf(out,
      "Usage: comm_info [-t tls] [-l [host:]port | -c host:port] [-h]\n"
      "  -t, --tls <tls>      comma-separated transports to show (like COMM_TLS), e.g. shm,self;\n"
      "                       known: %s, all\n"
      "  -l, --listen <addr>  serve one client (\"port\", \"host:port\", \"[::1]:port\"), print the\n"
      "                       lane chosen to it and why, and exit when it leaves (60 s at most)\n"
      "  -c, --connect <addr> connect to a comm_info -l at \"host:port\", print the lane chosen\n"
      "                       to it and why, and leave\n"
      "  -h, --help           show this help\n"
      "Without -t, COMM_TLS (or every transport) decides.\n",
      known_transports().c_str());
}

/// Splits a comma-separated list, dropping empty items.
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) items.push_back(item);
  return items;
}

/// Names of the capability flags set in `caps`.
std::string caps_names(uint64_t caps) {
  static const std::pair<uint64_t, const char*> names[] = {
      {comm::tl::cap_am_short, "am_short"},   {comm::tl::cap_am_bcopy, "am_bcopy"},
      {comm::tl::cap_am_zcopy, "am_zcopy"},   {comm::tl::cap_put_zcopy, "put_zcopy"},
      {comm::tl::cap_get_zcopy, "get_zcopy"}, {comm::tl::cap_pending, "pending"},
      {comm::tl::cap_event_fd, "event_fd"},   {comm::tl::cap_connect_to_iface, "connect_to_iface"},
      {comm::tl::cap_peer_failure, "peer_failure"},
  };
  std::string out;
  for (const auto& [flag, name] : names) {
    if ((caps & flag) == 0) continue;
    if (!out.empty()) out += ',';
    out += name;
  }
  return out.empty() ? "none" : out;
}

/// Prints the limits of an interface opened on `device` of `component`.
void print_iface_limits(comm::tl::component& component, const std::string& device,
                        const comm::config& cfg) {
  comm::tl::iface_params params;
  params.device = device;
  params.opts = cfg.transport_options;
  std::unique_ptr<comm::tl::iface> iface;
  comm::status st = component.open(params, iface);
  std::printf("#   device %s\n", device.c_str());
  if (st != comm::status::ok || !iface) {
    std::printf("#     cannot open an interface: %s\n", comm::to_string(st));
    return;
  }
  const comm::tl::iface_attr& a = iface->attr();
  std::printf("#     caps: %s\n", caps_names(a.caps).c_str());
  std::printf("#     max_short %zu, max_bcopy %zu, max_zcopy %zu, max_hdr %zu, max_iov %zu\n",
              a.max_short, a.max_bcopy, a.max_zcopy, a.max_hdr, a.max_iov);
  std::printf("#     max_get_zcopy %zu, max_put_zcopy %zu, max_outstanding_reads %zu\n",
              a.max_get_zcopy, a.max_put_zcopy, a.max_outstanding_reads);
  std::printf("#     latency %.0f ns, bandwidth %.1f MB/s, priority %u\n", a.latency_ns,
              a.bandwidth_bytes_per_s / 1e6, a.priority);
}

/// Prints the variables of `component`: value (or default), help and default.
void print_knobs(const comm::tl::component& component, const comm::config& cfg) {
  const std::string text = comm::tl::describe_knobs(component.knobs(), cfg.transport_options);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) std::printf("#   %s\n", line.c_str());
}

/// Prints, for one enabled transport, its interface limits and the info of a worker using only it.
void print_transport(comm::tl::component& component, const comm::config& base) {
  std::string name(component.name());
  std::printf("#\n# transport %s\n", name.c_str());
  print_knobs(component, base);
  for (const std::string& device : component.devices(base.transport_options))
    print_iface_limits(component, device, base);
  comm::config cfg = base;
  cfg.transports = {name};
  comm::context ctx(cfg);
  comm::worker_params wp;
  wp.name = "comm_info-" + name;
  auto made = comm::worker::create(ctx, wp);
  if (!made) {
    std::printf("#   cannot create a worker: %s\n", comm::to_string(made.error()));
    return;
  }
  std::unique_ptr<comm::worker> w = std::move(*made);
  std::printf("#   worker:\n");
  std::fflush(stdout);
  w->print_info(stdout);
}

/// Prints the bootstrap backend comm::bootstrap::create would choose here, and why.
void print_bootstrap() {
  static const char* const names[] = {"automatic", "pmix", "address", "single"};
  const comm::bootstrap_choice choice = comm::bootstrap::detect();
  std::printf("# bootstrap: %s%s (%s)\n", names[static_cast<int>(choice.backend)],
              choice.usable ? "" : ", would fail", choice.reason.c_str());
}

/// Takes the -t list into `cfg`; false (with a message) when it names an unknown transport or
/// none at all.
bool take_transports(const char* list, comm::config& cfg) {
  cfg.transports = split_list(list);
  if (cfg.transports.empty()) {
    std::fprintf(stderr, "comm_info: -t names no transport (known: %s, all)\n",
                 known_transports().c_str());
    return false;
  }
  for (const std::string& name : cfg.transports) {
    if (is_known_transport(name)) continue;
    std::fprintf(stderr, "comm_info: unknown transport '%s' (known: %s, all)\n", name.c_str(),
                 known_transports().c_str());
    return false;
  }
  return true;
}


/// One side of a connection made to show the lane choice: the endpoint, and what happened to it.
struct peer_side {
  comm::endpoint* ep = nullptr;  ///< the connection's endpoint (ours)
  bool connected = false;        ///< on_connect ran
  bool failed = false;           ///< on_error ran
  comm::status reason = comm::status::ok;  ///< why it failed
};

/// Endpoint parameters that record into `side`.
comm::endpoint_params peer_params(peer_side& side) {
  comm::endpoint_params ep;
  ep.on_connect = [](void* arg, comm::endpoint*, const uint8_t*, size_t) {
    static_cast<peer_side*>(arg)->connected = true;
  };
  ep.connect_arg = &side;
  ep.on_error = [](void* arg, comm::endpoint*, comm::status st) {
    auto* s = static_cast<peer_side*>(arg);
    s->failed = true;
    s->reason = st;
  };
  ep.error_arg = &side;
  return ep;
}

/// Progresses `w` until `done()` or `seconds` passed; true if done.
template <class Done>
bool progress_until(comm::worker& w, Done done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    if (w.progress() == 0) static_cast<void>(w.wait(10));
  }
  return true;
}

/// Prints the peer's endpoint: the lane chosen to it and why (endpoint::info).
void print_lane(const char* role, const comm::endpoint& ep) {
  std::printf("# %s: lane to the peer\n", role);
  std::istringstream lines(ep.info());
  for (std::string line; std::getline(lines, line);) std::printf("#   %s\n", line.c_str());
  std::fflush(stdout);
}

/// Serves one client at `address` and prints the lane to it; 0 on success.
int serve_one(comm::worker& w, const std::string& address) {
  struct server_state {
    comm::worker* w = nullptr;
    comm::listener* listener = nullptr;
    peer_side side;
    comm::status accepted = comm::status::in_progress;
  } state;
  state.w = &w;
  comm::listener_params lp;
  lp.address = address.find(':') == std::string::npos ? ":" + address : address;
  lp.arg = &state;
  lp.on_request = [](void* arg, comm::conn_request* request) {
    auto* s = static_cast<server_state*>(arg);
    if (s->accepted != comm::status::in_progress) {
      static_cast<void>(s->listener->reject(request));  // one client is served
      return;
    }
    s->accepted = s->w->accept(request, peer_params(s->side), &s->side.ep);
  };
  std::unique_ptr<comm::listener> listener;
  const comm::status st = w.listen(lp, &listener);
  if (st != comm::status::ok) {
    std::fprintf(stderr, "comm_info: cannot listen on %s: %s\n", lp.address.c_str(),
                 comm::to_string(st));
    return 1;
  }
  state.listener = listener.get();
  std::printf("# listening on port %u\n", static_cast<unsigned>(listener->port()));
  std::fflush(stdout);
  peer_side& side = state.side;
  // The lane is chosen when the request is accepted.
  if (!progress_until(w, [&] { return state.accepted != comm::status::in_progress; }, 60)) {
    std::fprintf(stderr, "comm_info: no client within 60 s\n");
    return 1;
  }
  if (state.accepted != comm::status::ok) {
    std::fprintf(stderr, "comm_info: cannot accept the client: %s\n",
                 comm::to_string(state.accepted));
    return 1;
  }
  print_lane("server", *side.ep);
  progress_until(w, [&] { return side.failed; }, 60);  // the client leaves
  return 0;
}

/// Connects to a comm_info -l at `address` and prints the lane to it; 0 on success.
int connect_to(comm::worker& w, const std::string& address) {
  peer_side side;
  const comm::status st = w.connect(address, peer_params(side), &side.ep);
  if (st != comm::status::ok) {
    std::fprintf(stderr, "comm_info: cannot connect to %s: %s\n", address.c_str(),
                 comm::to_string(st));
    return 1;
  }
  if (!progress_until(w, [&] { return side.connected || side.failed; }, 30) || !side.connected) {
    std::fprintf(stderr, "comm_info: connection to %s failed: %s\n", address.c_str(),
                 comm::to_string(side.failed ? side.reason : comm::status::endpoint_timeout));
    return 1;
  }
  print_lane("client", *side.ep);
  static_cast<void>(w.wait(side.ep->close(), 10000));  // the server sees the client leave
  return 0;
}

/// Runs one side of a connection (-l or -c) on a worker of `cfg`'s transports.
int run_peer(const comm::config& cfg, char mode, const std::string& address) {
  comm::context ctx(cfg);
  comm::worker_params wp;
  wp.name = mode == 'l' ? "comm_info-server" : "comm_info-client";
  auto w = comm::worker::create(ctx, wp);
  if (!w) {
    std::fprintf(stderr, "comm_info: cannot create a worker: %s\n", comm::to_string(w.error()));
    return 1;
  }
  return mode == 'l' ? serve_one(**w, address) : connect_to(**w, address);
}

}  // namespace

int main(int argc, char** argv) {
  comm::config cfg = comm::config::from_environment();
  static const option long_options[] = {
      {"tls", required_argument, nullptr, 't'},
      {"listen", required_argument, nullptr, 'l'},
      {"connect", required_argument, nullptr, 'c'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  char peer_mode = 0;
  std::string peer_address;
  int c;
  while ((c = getopt_long(argc, argv, "t:l:c:h", long_options, nullptr)) != -1) {
    switch (c) {
      case 't':
        if (!take_transports(optarg, cfg)) return 2;
        break;
      case 'l':
      case 'c':
        peer_mode = static_cast<char>(c);
        peer_address = optarg;
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "comm_info: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  try {
    if (peer_mode != 0) return run_peer(cfg, peer_mode, peer_address);
    comm::context ctx(cfg);
    std::printf("%s", ctx.info().c_str());
    print_bootstrap();
    for (comm::tl::component* component : ctx.components()) print_transport(*component, cfg);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_info: error: %s\n", e.what());
    return 1;
  }
}
