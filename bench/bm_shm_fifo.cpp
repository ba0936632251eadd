// Micro-benchmarks of the shm transport's FIFO: send + progress on one interface pair in one
// process (the cost of the hot path without a second core), a streaming variant (fill, then
// drain), and a ping-pong between two threads (one-way latency across cores).
#include <comm/transport/transport.hpp>

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstring>
#include <thread>

namespace {

using namespace comm;

tl::component& shm() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == "shm") return *c;
  }
  std::abort();
}

/// Two shm interfaces and an endpoint from the first to the second.
struct pair {
  std::unique_ptr<tl::iface> sender;
  std::unique_ptr<tl::iface> receiver;
  std::unique_ptr<tl::ep> ep;
  uint64_t received = 0;

  pair() {
    tl::iface_params params;
    if (shm().open(params, sender) != status::ok || shm().open(params, receiver) != status::ok ||
        sender->create_ep(receiver->device_address(), receiver->iface_address(), ep) !=
            status::ok) {
      std::abort();
    }
    receiver->set_am_handler(1, &count, this);
  }

  static status count(void* arg, void* data, size_t length, unsigned) {
    auto* self = static_cast<pair*>(arg);
    self->received += length != 0 ? 1 : 0;
    benchmark::DoNotOptimize(*static_cast<const uint8_t*>(data));
    return status::ok;
  }
};

void bm_am_short(benchmark::State& state) {
  pair p;
  const uint64_t header = 0x1234;
  for (auto _ : state) {
    if (p.ep->am_short(1, &header, sizeof(header), nullptr, 0) != status::ok) std::abort();
    p.receiver->progress();
  }
  state.SetItemsProcessed(static_cast<int64_t>(p.received));
}
BENCHMARK(bm_am_short);

struct bcopy_arg {
  const uint8_t* source;
  size_t length;
};

size_t pack_copy(void* dest, void* arg) {
  auto* a = static_cast<bcopy_arg*>(arg);
  std::memcpy(dest, a->source, a->length);
  return a->length;
}

void bm_am_bcopy(benchmark::State& state) {
  pair p;
  std::vector<uint8_t> data(static_cast<size_t>(state.range(0)), 0x5a);
  bcopy_arg arg{data.data(), data.size()};
  for (auto _ : state) {
    if (p.ep->am_bcopy(1, &pack_copy, &arg) < 0) std::abort();
    p.receiver->progress();
  }
  state.SetItemsProcessed(static_cast<int64_t>(p.received));
  state.SetBytesProcessed(static_cast<int64_t>(p.received * data.size()));
}
BENCHMARK(bm_am_bcopy)->Arg(4096);

/// Fills the FIFO, then drains it: messages per second when the sender runs ahead.
void bm_am_short_stream(benchmark::State& state) {
  pair p;
  const uint64_t header = 0x1234;
  for (auto _ : state) {
    while (p.ep->am_short(1, &header, sizeof(header), nullptr, 0) == status::ok) {
    }
    while (p.receiver->progress() != 0) {
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(p.received));
}
BENCHMARK(bm_am_short_stream);

/// 8-byte ping-pong with an echo thread; one iteration is one round trip (two one-way trips).
void bm_ping_pong_threads(benchmark::State& state) {
  pair forward;  // main -> echo
  pair back;     // echo -> main
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    uint64_t seen = 0;
    const uint64_t header = 1;
    while (!stop.load(std::memory_order_relaxed)) {
      forward.receiver->progress();
      while (seen < forward.received) {
        if (back.ep->am_short(1, &header, sizeof(header), nullptr, 0) == status::ok) ++seen;
      }
    }
  });
  const uint64_t header = 2;
  for (auto _ : state) {
    const uint64_t expected = back.received + 1;
    while (forward.ep->am_short(1, &header, sizeof(header), nullptr, 0) != status::ok) {
    }
    while (back.received < expected) back.receiver->progress();
  }
  stop = true;
  echo.join();
  // Seconds per one-way trip (two per iteration), printed with an SI prefix (e.g. 110n).
  state.counters["one_way"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(bm_ping_pong_threads)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
