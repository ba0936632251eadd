// What shm endpoints cost this process: descriptors, mappings and resident memory per endpoint
// when many endpoints go to one peer interface, and per peer when one endpoint goes to each of
// many peers; the same through libcomm's worker::connect. Each iteration creates the endpoints,
// reads /proc/self (fd, maps, status) with all of them open, and destroys them again; the counters
// are the first iteration's deltas (later ones may find resources a closed libcomm endpoint has not
// released yet) divided by the endpoints (or peers). Resident memory is split into anonymous
// (heap) and shared (the peers' segments mapped here: pages the peer owns, counted again in every
// mapping of them). items_per_second: endpoints created and destroyed per second.
#include <comm/context.hpp>
#include <comm/endpoint.hpp>
#include <comm/transport/transport.hpp>
#include <comm/worker.hpp>

#include <benchmark/benchmark.h>

#include <dirent.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace {

using namespace comm;

tl::component& shm() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == "shm") return *c;
  }
  std::abort();
}

std::unique_ptr<tl::iface> open_iface() {
  std::unique_ptr<tl::iface> iface;
  if (shm().open(tl::iface_params{}, iface) != status::ok) std::abort();
  return iface;
}

/// Entries of a /proc/self directory listing, without . and ..
size_t count_entries(const char* path) {
  size_t n = 0;
  DIR* dir = ::opendir(path);
  if (dir == nullptr) std::abort();
  while (const dirent* entry = ::readdir(dir)) n += entry->d_name[0] != '.' ? 1 : 0;
  ::closedir(dir);
  return n;
}

size_t count_lines(const char* path) {
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) std::abort();
  size_t n = 0;
  for (int c; (c = std::fgetc(file)) != EOF;) n += c == '\n' ? 1 : 0;
  std::fclose(file);
  return n;
}

/// The value (kB) of `field` in /proc/self/status.
long status_kib(const char* field) {
  std::FILE* file = std::fopen("/proc/self/status", "r");
  if (file == nullptr) std::abort();
  char line[256];
  long value = -1;
  const size_t length = std::strlen(field);
  while (std::fgets(line, sizeof(line), file) != nullptr) {
    if (std::strncmp(line, field, length) == 0 && line[length] == ':') {
      value = std::strtol(line + length + 1, nullptr, 10);
    }
  }
  std::fclose(file);
  return value;
}

/// What this process holds at one moment.
struct usage {
  long fds = count_entries("/proc/self/fd");
  long maps = count_lines("/proc/self/maps");
  long rss = status_kib("VmRSS");
  long anon = status_kib("RssAnon");
  long shmem = status_kib("RssShmem");
};

/// Sets the counters to (now - before) / per.
void report(benchmark::State& state, const usage& before, const usage& now, double per,
            const char* unit) {
  const std::string suffix = std::string("/") + unit;
  state.counters["fds" + suffix] = static_cast<double>(now.fds - before.fds) / per;
  state.counters["maps" + suffix] = static_cast<double>(now.maps - before.maps) / per;
  state.counters["rss_KiB" + suffix] = static_cast<double>(now.rss - before.rss) / per;
  state.counters["anon_KiB" + suffix] = static_cast<double>(now.anon - before.anon) / per;
  state.counters["shmem_KiB" + suffix] = static_cast<double>(now.shmem - before.shmem) / per;
}

/// N endpoints from one interface to one peer interface.
void bm_endpoints_to_one_peer(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  auto sender = open_iface();
  auto peer = open_iface();
  const auto device = peer->device_address();
  const auto address = peer->iface_address();
  bool first = true;
  for (auto _ : state) {
    const usage before;
    std::vector<std::unique_ptr<tl::ep>> eps(n);
    for (auto& ep : eps) {
      if (sender->create_ep(device, address, ep) != status::ok) std::abort();
    }
    if (first) {
      state.PauseTiming();
      report(state, before, usage{}, static_cast<double>(n), "ep");
      state.ResumeTiming();
      first = false;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(bm_endpoints_to_one_peer)->Arg(1)->Arg(100)->Arg(1000)->Arg(3000)->Iterations(3);

/// One endpoint to each of N peer interfaces (the peers are opened before the measurement).
void bm_endpoints_to_n_peers(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  auto sender = open_iface();
  std::vector<std::unique_ptr<tl::iface>> peers;
  for (size_t i = 0; i < n; ++i) peers.push_back(open_iface());
  bool first = true;
  for (auto _ : state) {
    const usage before;
    std::vector<std::unique_ptr<tl::ep>> eps(n);
    for (size_t i = 0; i < n; ++i) {
      if (sender->create_ep(peers[i]->device_address(), peers[i]->iface_address(), eps[i]) !=
          status::ok) {
        std::abort();
      }
    }
    if (first) {
      state.PauseTiming();
      report(state, before, usage{}, static_cast<double>(n), "peer");
      state.ResumeTiming();
      first = false;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(bm_endpoints_to_n_peers)->Arg(1)->Arg(16)->Arg(64)->Iterations(3);

/// N libcomm endpoints (worker::connect, shm only) to one peer worker, closed again.
void bm_worker_endpoints_to_one_peer(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  config cfg = config::from_environment();
  cfg.transports = {"shm"};
  context ctx(cfg);
  auto client = worker::create(ctx).value();
  auto server = worker::create(ctx).value();
  const std::vector<uint8_t> address = server->address();
  bool first = true;
  for (auto _ : state) {
    const usage before;
    std::vector<endpoint*> eps(n, nullptr);
    for (endpoint*& ep : eps) {
      if (client->connect(address, &ep) != status::ok) std::abort();
    }
    if (first) {
      state.PauseTiming();
      report(state, before, usage{}, static_cast<double>(n), "ep");
      state.ResumeTiming();
      first = false;
    }
    for (endpoint* ep : eps) {
      if (client->wait(ep->close(), 10000) != status::ok) std::abort();
    }
    for (int i = 0; i < 1000; ++i) server->progress();  // the server's side of the closes
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(bm_worker_endpoints_to_one_peer)->Arg(1)->Arg(1000)->Arg(3000)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
