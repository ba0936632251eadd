// Micro-benchmarks of the memory domains and RMA of shm and self: get/put of 8 B to 4 MiB between
// two interfaces of one process (shm: CMA on our own pid, the same kernel path as across
// processes), and the cost of a registration that hits the cache versus one that misses.
#include <benchmark/benchmark.h>

#include <comm/transport/transport.hpp>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace comm;

std::unique_ptr<tl::iface> open_iface(const std::string& name) {
  for (tl::component* c : tl::all_components()) {
    if (c->name() != name) continue;
    std::unique_ptr<tl::iface> iface;
    if (c->open(tl::iface_params{}, iface) == status::ok) return iface;
  }
  throw std::runtime_error("cannot open " + name);
}

/// Two interfaces, an endpoint between them and a registered remote buffer with its key.
struct rma_setup {
  std::unique_ptr<tl::iface> a, b;
  std::unique_ptr<tl::ep> ep;
  std::vector<uint8_t> remote, local;
  tl::mem_handle* handle = nullptr;
  tl::remote_key key;

  rma_setup(const std::string& name, size_t bytes)
      : a(open_iface(name)), b(open_iface(name)), remote(bytes, 1), local(bytes, 2) {
    if (a->create_ep(b->device_address(), b->iface_address(), ep) != status::ok ||
        b->memory_domain()->mem_reg(remote.data(), remote.size(), &handle) != status::ok) {
      throw std::runtime_error("setup");
    }
    std::vector<uint8_t> packed;
    b->memory_domain()->rkey_pack(handle, packed);
    a->memory_domain()->rkey_unpack(packed.data(), packed.size(), &key);
  }
  ~rma_setup() {
    a->memory_domain()->rkey_release(&key);
    b->memory_domain()->mem_dereg(handle);
    ep.reset();
  }
};

void run_rma(benchmark::State& state, const std::string& name, bool put) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  rma_setup s(name, bytes);
  const tl::iov entry{s.local.data(), bytes};
  const uint64_t at = reinterpret_cast<uintptr_t>(s.remote.data());
  for (auto _ : state) {
    const status st = put ? s.ep->put_zcopy(&entry, 1, at, s.key, nullptr)
                          : s.ep->get_zcopy(&entry, 1, at, s.key, nullptr);
    if (st != status::ok) {
      state.SkipWithError(to_string(st));
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_shm_get(benchmark::State& state) { run_rma(state, "shm", false); }
void BM_shm_put(benchmark::State& state) { run_rma(state, "shm", true); }
void BM_self_get(benchmark::State& state) { run_rma(state, "self", false); }

void BM_md_reg_cache_hit(benchmark::State& state) {
  auto iface = open_iface("shm");
  std::vector<uint8_t> buffer(1 << 20);
  tl::md& md = *iface->memory_domain();
  tl::mem_handle* held = nullptr;
  md.mem_reg(buffer.data(), buffer.size(), &held);  // keeps the entry cached
  for (auto _ : state) {
    tl::mem_handle* h = nullptr;
    md.mem_reg(buffer.data(), buffer.size(), &h);
    md.mem_dereg(h);
  }
  md.mem_dereg(held);
}

void BM_md_reg_miss(benchmark::State& state) {
  auto iface = open_iface("shm");
  std::vector<uint8_t> buffer(1 << 20);
  tl::md& md = *iface->memory_domain();
  for (auto _ : state) {
    tl::mem_handle* h = nullptr;
    md.mem_reg(buffer.data(), buffer.size(), &h);
    md.mem_dereg(h);
  }
}

BENCHMARK(BM_shm_get)->RangeMultiplier(8)->Range(8, 4 << 20);
BENCHMARK(BM_shm_put)->RangeMultiplier(8)->Range(8, 4 << 20);
BENCHMARK(BM_self_get)->RangeMultiplier(8)->Range(8, 4 << 20);
BENCHMARK(BM_md_reg_cache_hit);
BENCHMARK(BM_md_reg_miss);

}  // namespace

BENCHMARK_MAIN();
