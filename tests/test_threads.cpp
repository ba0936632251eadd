// Threads: workers driven from different threads, and one thread_mode::multi worker shared by
// several threads. Meant to run under ThreadSanitizer too (-DCOMM_SANITIZE=thread).
#define BOOST_TEST_MODULE threads
#include <boost/test/unit_test.hpp>

#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

comm::config config_for(const char* transport) {
  comm::config cfg = comm::config::from_environment();
  cfg.transports = {transport};
  return cfg;
}

/// Milliseconds left until `deadline` (at least 1 while it has not passed, else 0).
int ms_left(clock_type::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
  return left.count() <= 0 ? 0 : static_cast<int>(left.count());
}

/// Progresses `w` until `done()` or 20 s pass; false on timeout.
template <class Done>
bool progress_until(comm::worker& w, Done done) {
  const auto deadline = clock_type::now() + std::chrono::seconds(20);
  while (!done()) {
    w.progress();
    if (clock_type::now() > deadline) return false;
  }
  return true;
}

/// One receiver thread and one sender thread, each with its own worker, exchanging `count`
/// numbered tagged messages over `transport`; checks order and contents.
void run_two_threads(const char* transport, size_t count) {
  comm::context ctx(config_for(transport));
  auto receiver = comm::worker::create(ctx).value();
  auto sender = comm::worker::create(ctx).value();
  const auto receiver_address = receiver->address();
  std::atomic<bool> receiver_failed{false};
  std::atomic<size_t> received{0};
  // One deadline bounds every wait of the test, however many messages are left.
  const auto deadline = clock_type::now() + std::chrono::seconds(60);

  std::thread rx([&] {
    for (size_t i = 0; i < count; ++i) {
      if (ms_left(deadline) == 0) {
        receiver_failed = true;
        return;
      }
      uint64_t value = ~uint64_t{0};
      comm::tag_recv_info info;
      comm::request_params p;
      p.recv_info = &info;
      comm::op o = receiver->tag_recv(&value, sizeof(value), 7, comm::tag_mask_full, p);
      if (o.pending()) {
        if (receiver->wait(o, ms_left(deadline)) != comm::status::ok) {
          receiver_failed = true;
          return;
        }
      } else if (o.failed()) {
        receiver_failed = true;
        return;
      }
      if (value != i) {
        receiver_failed = true;
        return;
      }
      received = i + 1;
    }
  });

  comm::endpoint* ep = nullptr;
  BOOST_REQUIRE(sender->connect(receiver_address, &ep) == comm::status::ok);
  std::vector<comm::op> outstanding;
  for (uint64_t i = 0; i < count; ++i) {
    comm::request_params p;
    comm::op o = ep->tag_send(7, &i, sizeof(i), p);
    BOOST_REQUIRE(!o.failed());
    if (o.pending()) BOOST_REQUIRE(sender->wait(o, ms_left(deadline)) == comm::status::ok);
  }
  BOOST_CHECK(progress_until(*sender, [&] { return received == count || receiver_failed; }));
  rx.join();
  BOOST_CHECK(!receiver_failed);
  BOOST_CHECK_EQUAL(received.load(), count);
  BOOST_CHECK(sender->wait(ep->close(), 20000) == comm::status::ok);
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_threads_over_self) { run_two_threads("self", 20000); }

BOOST_AUTO_TEST_CASE(two_threads_over_shm) { run_two_threads("shm", 20000); }

/// Several threads send through one thread_mode::multi worker while another thread receives.
BOOST_AUTO_TEST_CASE(multi_mode_worker_shared_by_threads) {
  comm::context ctx(config_for("shm"));
  comm::worker_params params;
  params.mode = comm::thread_mode::multi;
  auto shared = comm::worker::create(ctx, params).value();
  auto receiver = comm::worker::create(ctx).value();
  BOOST_CHECK(shared->mode() == comm::thread_mode::multi);
  comm::endpoint* ep = nullptr;
  BOOST_REQUIRE(shared->connect(receiver->address(), &ep) == comm::status::ok);

  constexpr int senders = 3;
  constexpr uint64_t per_sender = 3000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  // One deadline bounds every wait of every thread.
  const auto deadline = clock_type::now() + std::chrono::seconds(60);
  for (int t = 0; t < senders; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < per_sender; ++i) {
        const uint64_t value = (uint64_t(t) << 32) | i;
        comm::op o = ep->tag_send(100 + t, &value, sizeof(value));
        if (o.failed() || ms_left(deadline) == 0 ||
            (o.pending() && shared->wait(o, ms_left(deadline)) != comm::status::ok)) {
          ++failures;
          return;
        }
      }
    });
  }
  // The receiver checks per-sender order: each thread's messages carry its tag.
  uint64_t next[senders] = {};
  uint64_t total = 0;
  while (total < senders * per_sender && ms_left(deadline) > 0) {
    uint64_t value = 0;
    comm::tag_recv_info info;
    comm::request_params p;
    p.recv_info = &info;
    comm::op o = receiver->tag_recv(&value, sizeof(value), 100, ~comm::tag_t{3}, p);
    comm::status st = o.pending() ? receiver->wait(o, ms_left(deadline)) : o.st;
    shared->progress();
    if (st != comm::status::ok) {
      ++failures;
      break;
    }
    const int t = static_cast<int>(value >> 32);
    BOOST_REQUIRE(t >= 0 && t < senders);
    BOOST_CHECK_EQUAL(value & 0xffffffffu, next[t]);
    next[t] = (value & 0xffffffffu) + 1;
    ++total;
  }
  for (auto& th : threads) th.join();
  BOOST_CHECK_EQUAL(failures.load(), 0);
  BOOST_CHECK_EQUAL(total, senders * per_sender);
}
