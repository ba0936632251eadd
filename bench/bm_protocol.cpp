// Micro-benchmarks of the protocol layer's per-message cost: two workers in one thread connected
// over one transport, so the numbers are the software path (send, progress, match, complete)
// without cross-core cache traffic. Run under `valgrind --tool=callgrind` for instruction counts.
#include <benchmark/benchmark.h>

#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <memory>
#include <string>
#include <vector>

namespace {

/// Two workers on `transport`, connected a -> b, wireup done.
struct pair_on {
  explicit pair_on(const char* transport) {
    comm::config cfg = comm::config::from_environment();
    cfg.transports = {transport};
    ctx = std::make_unique<comm::context>(cfg);
    a = comm::worker::create(*ctx).value();
    b = comm::worker::create(*ctx).value();
    if (a->connect(b->address(), &ab) != comm::status::ok) std::abort();
    // Wireup: the first send completes once b answered.
    uint64_t v = 0;
    comm::op o = ab->tag_send(1, &v, sizeof(v));
    for (int i = 0; i < 1000000 && o.pending() && a->request_status(o.req) == comm::status::in_progress; ++i) {
      a->progress();
      b->progress();
    }
    if (o.pending()) a->release(o.req);
    comm::tag_recv_info info;
    comm::request_params p;
    p.recv_info = &info;
    comm::op r = b->tag_recv(&v, sizeof(v), 1, comm::tag_mask_full, p);
    if (r.pending()) b->release(r.req);
  }
  std::unique_ptr<comm::context> ctx;
  std::unique_ptr<comm::worker> a, b;
  comm::endpoint* ab = nullptr;
};

/// One tagged message: post the receive on b, send from a, progress b until it completed.
void tag_expected(benchmark::State& state, const char* transport) {
  pair_on p(transport);
  std::vector<uint8_t> out(state.range(0)), in(state.range(0));
  comm::tag_recv_info info;
  comm::request_params rp;
  rp.recv_info = &info;
  for (auto _ : state) {
    comm::op r = p.b->tag_recv(in.data(), in.size(), 7, comm::tag_mask_full, rp);
    comm::op s = p.ab->tag_send(7, out.data(), out.size());
    if (s.pending()) p.a->release(s.req);
    while (p.b->request_status(r.req) == comm::status::in_progress) {
      p.b->progress();
      p.a->progress();
    }
    p.b->release(r.req);
  }
  state.SetItemsProcessed(state.iterations());
}

/// One tagged message arriving before its receive (unexpected queue, immediate completion).
void tag_unexpected(benchmark::State& state, const char* transport) {
  pair_on p(transport);
  std::vector<uint8_t> out(state.range(0)), in(state.range(0));
  comm::tag_recv_info info;
  comm::request_params rp;
  rp.recv_info = &info;
  for (auto _ : state) {
    comm::op s = p.ab->tag_send(7, out.data(), out.size());
    if (s.pending()) p.a->release(s.req);
    comm::op r;
    do {
      p.b->progress();
      r = p.b->tag_recv(in.data(), in.size(), 7, comm::tag_mask_full, rp);
      if (r.pending()) {
        while (p.b->request_status(r.req) == comm::status::in_progress) {
          p.b->progress();
          p.a->progress();
        }
        p.b->release(r.req);
      }
    } while (false);
  }
  state.SetItemsProcessed(state.iterations());
}

/// One active message to a handler that counts it.
void am_single(benchmark::State& state, const char* transport) {
  pair_on p(transport);
  static uint64_t count = 0;
  p.b->set_am_handler(3, [](void*, const void*, size_t, void*, size_t, const comm::am_recv_params&) {
    ++count;
    return comm::status::ok;
  }, nullptr);
  std::vector<uint8_t> out(state.range(0));
  for (auto _ : state) {
    const uint64_t before = count;
    comm::op s = p.ab->am_send(3, nullptr, 0, out.data(), out.size());
    if (s.pending()) p.a->release(s.req);
    while (count == before) {
      p.b->progress();
      p.a->progress();
    }
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK_CAPTURE(tag_expected, shm, "shm")->Arg(8)->Arg(4096)->Arg(65536)->Arg(1048576);
BENCHMARK_CAPTURE(tag_unexpected, shm, "shm")->Arg(8)->Arg(4096);
BENCHMARK_CAPTURE(am_single, shm, "shm")->Arg(8)->Arg(4096);
BENCHMARK_CAPTURE(tag_expected, self, "self")->Arg(8);

BENCHMARK_MAIN();
