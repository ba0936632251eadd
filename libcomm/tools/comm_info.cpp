// comm_info: what libcomm sees on this machine (ucx_info's counterpart): transports and devices,
// each transport's variables (COMM_<TL>_*) with their values and help, the limits of each
// transport's interface, thresholds, the hwloc topology, the info of a worker on
// each enabled transport, and the bootstrap backend a job started here would use.
//
//   comm_info [-t tls] [-h]   (also --tls=tls, --help)

#include <comm/bootstrap.hpp>
#include <comm/context.hpp>
#include <comm/transport/transport.hpp>
#include <comm/worker.hpp>

#include <getopt.h>

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
      "Usage: comm_info [-t tls] [-h]\n"
      "  -t, --tls <tls>  comma-separated transports to show (like COMM_TLS), e.g. shm,self;\n"
      "                   known: %s, all\n"
      "  -h, --help       show this help\n"
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
  auto w = comm::worker::create(ctx, wp);
  if (!w) {
    std::printf("#   cannot create a worker\n");
    return;
  }
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

}  // namespace

int main(int argc, char** argv) {
  comm::config cfg = comm::config::from_environment();
  static const option long_options[] = {
      {"tls", required_argument, nullptr, 't'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  int c;
  while ((c = getopt_long(argc, argv, "t:h", long_options, nullptr)) != -1) {
    switch (c) {
      case 't':
        if (!take_transports(optarg, cfg)) return 2;
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
