// The bootstrap without a launcher: the single backend in this process, the address backend with
// ranks in threads of this process and with processes started by hand (tests/launch.hpp), across
// two network-namespace hosts over tcp, and the loud failures: launcher variables without PMIx,
// COMM_SIZE without an address, a rank that never comes, a rank taken twice or of another job, a
// wrong cluster key, garbage at rank 0's port, a rank SIGKILLed during a fence.
#define BOOST_TEST_MODULE bootstrap
#include <boost/test/unit_test.hpp>

#include "launch.hpp"
#include "netns.hpp"
#include "test_util.hpp"

#include <comm/bootstrap.hpp>
#include <comm/context.hpp>
#include <comm/transport/shared_heap.hpp>
#include <comm/wire/codec.hpp>
#include <comm/worker.hpp>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <future>
#include <thread>

#include "schema/bootstrap.capnp.h"

using namespace comm;
using namespace comm::test;

namespace {

const std::string probe = COMM_TESTS_BINARY_DIR "/comm_bootstrap_probe";

/// Options with a time limit well above the bootstrap's own limits.
launch_options limited(int timeout_ms = 60000) {
  launch_options opt;
  opt.timeout_ms = timeout_ms;
  return opt;
}

/// The probe's environment with a variable set (and no launcher variables of ours).
launch_options with_env(std::vector<std::string> env) {
  launch_options opt = limited();
  opt.env = std::move(env);
  return opt;
}

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

/// Parameters of an address bootstrap in this process.
bootstrap_params address_params(const std::string& address, int rank, int size) {
  bootstrap_params p;
  p.backend = bootstrap_backend::address;
  p.address = address;
  p.rank = rank;
  p.size = size;
  p.timeout_ms = 20000;
  return p;
}

std::string loopback_address() {
  return "127.0.0.1:" + std::to_string(comm::test::detail::free_port());
}

// -- a rank that breaks the protocol -----------------------------------------------------------

/// The address backend's fence message id and hello magic (bootstrap_address.cpp).
constexpr uint16_t fence_am = 0xB007;
constexpr uint64_t hello_magic = 0x434f4d4d424f5401ull;

/// Encoded BootstrapHello of `rank` of `size`.
std::vector<uint8_t> hello_bytes(uint32_t rank, uint32_t size) {
  wire::header_writer<wire::schema::BootstrapHello> h;
  h.fields().setMagic(hello_magic);
  h.fields().setRank(rank);
  h.fields().setSize(size);
  const auto* b = static_cast<const uint8_t*>(h.bytes());
  return {b, b + h.size()};
}

/// Encoded BootstrapFence: a contribution of `rank` to fence `epoch`.
std::vector<uint8_t> contribution(uint32_t rank, uint32_t epoch) {
  wire::header_writer<wire::schema::BootstrapFence> h;
  h.fields().setKind(1);
  h.fields().setStatus(0);
  h.fields().setRank(rank);
  h.fields().setEpoch(epoch);
  const auto* b = static_cast<const uint8_t*>(h.bytes());
  return {b, b + h.size()};
}

/// Encoded BootstrapRecords holding one record, its value `value_bytes` zeros.
std::vector<uint8_t> one_record(uint32_t rank, const std::string& key, size_t value_bytes = 0) {
  capnp::MallocMessageBuilder message;
  auto list = message.initRoot<wire::schema::BootstrapRecords>().initRecords(1);
  list[0].setRank(rank);
  list[0].setKey(kj::arrayPtr(reinterpret_cast<const kj::byte*>(key.data()), key.size()));
  if (value_bytes != 0) list[0].initValue(static_cast<unsigned>(value_bytes));
  const auto words = capnp::messageToFlatArray(message);
  const auto b = words.asBytes();
  return {b.begin(), b.end()};
}

/// Rank 1 of 2 made by hand: it connects to rank 0 with a valid hello, sends one fence message of
/// its own making, and records the abort rank 0 answers with.
struct hand_made_rank {
  context ctx;
  std::unique_ptr<worker> w = worker::create(ctx).value();
  endpoint* ep = nullptr;
  bool connected = false;
  status aborted_with = status::ok;

  static void on_connect(void* arg, endpoint*, const uint8_t*, size_t) {
    static_cast<hand_made_rank*>(arg)->connected = true;
  }
  static status on_fence(void* arg, const void* header, size_t length, void*, size_t,
                         const am_recv_params&) {
    uint64_t words[8] = {};
    const size_t copied = std::min(length, sizeof(words));
    std::memcpy(words, header, copied);
    auto h = wire::read_header<wire::schema::BootstrapFence>(words, copied);
    if (h && h->getKind() == 3) {
      static_cast<hand_made_rank*>(arg)->aborted_with = static_cast<status>(h->getStatus());
    }
    return status::ok;
  }

  /// Joins rank 0 at `address` and sends it `header` and `data` as a fence message.
  void send(const std::string& address, const std::vector<uint8_t>& header,
            const std::vector<uint8_t>& data, const std::shared_future<void>& rank_zero_done) {
    w->set_am_handler(fence_am, &on_fence, this, am_flag_whole_msg | am_flag_fetch_rndv);
    endpoint_params p;
    p.private_data = hello_bytes(1, 2);
    p.on_connect = &on_connect;
    p.connect_arg = this;
    // Rank 0 may not listen yet: retry until it answers or gives up (after 5 s; 30 s if broken).
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    const auto ready = [&rank_zero_done, give_up] {
      return rank_zero_done.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready ||
             std::chrono::steady_clock::now() > give_up;
    };
    while (!connected && !ready()) {
      if (ep == nullptr && w->connect(address, p, &ep) != status::ok) ep = nullptr;
      w->wait(20);
      if (ep != nullptr && ep->state() != status::ok) {
        (void)ep->close();
        ep = nullptr;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (!connected) return;
    request_params rp;
    rp.flags = request_reply_endpoint;
    const op o = ep->am_send(fence_am, header.data(), header.size(), data.data(), data.size(), rp);
    if (o.pending()) w->release(o.req);
    while (!ready()) w->wait(10);
    for (int i = 0; i < 50 && aborted_with == status::ok; ++i) w->wait(10);  // the abort's way
  }
};

/// What rank 0 of 2 says when rank 1 sends it `header` and `data` instead of a contribution.
std::string rank_zero_after(const std::vector<uint8_t>& header, const std::vector<uint8_t>& data,
                            status* rank_zero, status* rank_one_told) {
  const std::string address = loopback_address();
  std::string why;
  std::unique_ptr<bootstrap> boot;
  auto p = address_params(address, 0, 2);
  p.timeout_ms = 5000;
  std::promise<void> done;
  std::thread zero([&] {
    *rank_zero = bootstrap::create(p, &boot, &why);
    done.set_value();
  });
  hand_made_rank one;
  one.send(address, header, data, done.get_future().share());
  zero.join();
  *rank_one_told = one.aborted_with;
  return why;
}

}  // namespace

// -- single --------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(single_put_commit_fence_get) {
  bootstrap_params p;
  p.backend = bootstrap_backend::single;
  std::unique_ptr<bootstrap> boot;
  BOOST_REQUIRE(bootstrap::create(p, &boot) == status::ok);
  BOOST_TEST(boot->rank() == 0);
  BOOST_TEST(boot->size() == 1);
  BOOST_TEST(boot->backend_name() == "single");
  const uint8_t value[] = {0, 1, 0, 255, 7};
  std::vector<uint8_t> out;
  BOOST_TEST(boot->put("k", value, sizeof(value)) == status::ok);
  BOOST_TEST(boot->get(0, "k", out) == status::no_elem);  // not before commit and fence
  BOOST_TEST(boot->commit() == status::ok);
  BOOST_TEST(boot->get(0, "k", out) == status::no_elem);
  BOOST_TEST(boot->fence() == status::ok);
  BOOST_TEST(boot->get(0, "k", out) == status::ok);
  BOOST_TEST(out == std::vector<uint8_t>(value, value + sizeof(value)));
  BOOST_TEST(boot->get(1, "k", out) == status::invalid_param);
  std::vector<std::vector<uint8_t>> all;
  BOOST_TEST(boot->allgather("a", bytes("mine"), all) == status::ok);
  BOOST_REQUIRE(all.size() == 1u);
  BOOST_TEST(all[0] == bytes("mine"));
}

BOOST_AUTO_TEST_CASE(single_limits) {
  bootstrap_params p;
  p.backend = bootstrap_backend::single;
  std::unique_ptr<bootstrap> boot;
  BOOST_REQUIRE(bootstrap::create(p, &boot) == status::ok);
  const std::vector<uint8_t> mib(size_t{1} << 20);
  BOOST_TEST(boot->put("", mib.data(), 1) == status::invalid_param);
  BOOST_TEST(boot->put(std::string_view("a\0b", 3), mib.data(), 1) == status::invalid_param);
  BOOST_TEST(boot->put(std::string(256, 'k'), mib.data(), 1) == status::exceeds_limit);
  BOOST_TEST(boot->put(std::string(255, 'k'), mib.data(), 1) == status::ok);
  BOOST_TEST(boot->put("big", mib.data(), mib.size() + 0) == status::ok);
  std::vector<uint8_t> over(mib.size() + 1);
  BOOST_TEST(boot->put("over", over.data(), over.size()) == status::exceeds_limit);
  BOOST_TEST(!boot->last_error().empty());
  // 16 MiB per rank: the same key again counts once, new keys add up.
  for (int i = 0; i < 20; ++i) BOOST_TEST(boot->put("big", mib.data(), mib.size()) == status::ok);
  status last = status::ok;
  for (int i = 0; i < 17 && last == status::ok; ++i) {
    last = boot->put("key" + std::to_string(i), mib.data(), mib.size());
  }
  BOOST_TEST(last == status::exceeds_limit);
}

// -- address backend, ranks in threads of this process ------------------------------------------

BOOST_AUTO_TEST_CASE(address_ranks_in_threads_exchange_and_leave_nothing_behind) {
  const size_t fds_before = open_fds();
  {
    const std::string address = loopback_address();
    std::vector<std::unique_ptr<bootstrap>> boots(3);
    std::vector<status> results(3, status::in_progress);
    std::vector<std::string> whys(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        results[r] = bootstrap::create(address_params(address, r, 3), &boots[r], &whys[r]);
        if (results[r] != status::ok) return;
        bootstrap& b = *boots[r];
        std::vector<std::vector<uint8_t>> all;
        results[r] = b.allgather("who", bytes("rank" + std::to_string(r)), all);
        for (int s = 0; s < 3 && results[r] == status::ok; ++s) {
          if (all[s] != bytes("rank" + std::to_string(s))) results[r] = status::protocol_error;
        }
        // Twice under one key: the second fence's values replace the first's.
        for (const std::string round : {"first", "second"}) {
          const auto mine = bytes(round + std::to_string(r));
          if (results[r] == status::ok) results[r] = b.put("again", mine.data(), mine.size());
          if (results[r] == status::ok) results[r] = b.commit();
          if (results[r] == status::ok) results[r] = b.fence();
          std::vector<uint8_t> got;
          for (int s = 0; s < 3 && results[r] == status::ok; ++s) {
            results[r] = b.get(s, "again", got);
            if (results[r] == status::ok && got != bytes(round + std::to_string(s))) {
              results[r] = status::protocol_error;
            }
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) {
      BOOST_TEST_INFO("rank " << r << ": " << whys[r]);
      BOOST_TEST(results[r] == status::ok);
      if (boots[r]) BOOST_TEST(boots[r]->backend_name() == "address");
    }
  }
  BOOST_TEST(open_fds() == fds_before);
}

BOOST_AUTO_TEST_CASE(address_rank_zero_alone_and_a_port_in_use) {
  const std::string address = loopback_address();
  std::unique_ptr<bootstrap> alone;
  BOOST_REQUIRE(bootstrap::create(address_params(address, 0, 1), &alone) == status::ok);
  BOOST_TEST(alone->size() == 1);
  BOOST_TEST(alone->barrier() == status::ok);
  // A second job at an address whose port a listener holds: refused at once, with the reason.
  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(where);
  BOOST_REQUIRE(::bind(holder, reinterpret_cast<sockaddr*>(&where), sizeof(where)) == 0);
  BOOST_REQUIRE(::listen(holder, 4) == 0);
  ::getsockname(holder, reinterpret_cast<sockaddr*>(&where), &length);
  std::unique_ptr<bootstrap> second;
  std::string why;
  const auto busy = address_params("127.0.0.1:" + std::to_string(ntohs(where.sin_port)), 0, 2);
  BOOST_TEST(bootstrap::create(busy, &second, &why) == status::unreachable);
  BOOST_TEST(why.find("in use") != std::string::npos, why);
  ::close(holder);
}

BOOST_AUTO_TEST_CASE(address_parameters_missing) {
  std::unique_ptr<bootstrap> boot;
  std::string why;
  auto p = address_params("", 0, 2);
  BOOST_TEST(bootstrap::create(p, &boot, &why) == status::invalid_param);
  BOOST_TEST(why.find("COMM_BOOTSTRAP_ADDRESS") != std::string::npos, why);
  p = address_params(loopback_address(), 2, 2);
  BOOST_TEST(bootstrap::create(p, &boot, &why) == status::invalid_param);
  BOOST_TEST(why.find("COMM_RANK") != std::string::npos, why);
}

BOOST_AUTO_TEST_CASE(address_rank_breaking_the_protocol_fails_the_job_not_the_process) {
  // The shared heap keeps freed large buffers (the oversized records') for reuse, one descriptor
  // each: the descriptors counted are the others.
  const tl::shared_heap_stats heap_before = tl::shared_heap_snapshot();
  const size_t fds_before = open_fds() - heap_before.segments;
  struct breach {
    const char* what;
    std::vector<uint8_t> header;
    std::vector<uint8_t> data;
    const char* reason;
  };
  const std::vector<uint8_t> garbage(64, 0xff);
  std::vector<uint8_t> truncated = one_record(1, "k");
  truncated.resize(truncated.size() - 8);  // the records' segment announced longer than it is
  // Well formed, but beyond what one rank may send (twice bootstrap_max_rank_bytes of 16 MiB).
  const std::vector<uint8_t> oversized = one_record(1, "k", size_t{32} << 20);
  const breach breaches[] = {
      {"garbage header", garbage, {}, "rank 1 broke the bootstrap protocol: a malformed fence"},
      {"wrong fence", contribution(1, 7), one_record(1, "k"), "an unexpected fence message"},
      {"in another's name", contribution(0, 0), one_record(1, "k"), "an unexpected fence message"},
      {"garbage records", contribution(1, 0), garbage, "malformed or oversized records"},
      {"truncated records", contribution(1, 0), truncated, "malformed or oversized records"},
      {"oversized records", contribution(1, 0), oversized, "malformed or oversized records"},
      {"records of rank 0", contribution(1, 0), one_record(0, "k"), "in another rank's name"},
      {"a key too long", contribution(1, 0), one_record(1, std::string(300, 'k')),
       "bootstrap key of 300 bytes"},
  };
  for (const breach& b : breaches) {
    status zero = status::ok, told = status::ok;
    const std::string why = rank_zero_after(b.header, b.data, &zero, &told);
    BOOST_TEST_CONTEXT(b.what << ": " << why) {
      BOOST_TEST(zero == status::protocol_error);
      BOOST_TEST(why.find(b.reason) != std::string::npos);
      BOOST_TEST(told == status::protocol_error);  // rank 0 told the culprit too
    }
  }
  const tl::shared_heap_stats heap_after = tl::shared_heap_snapshot();
  BOOST_TEST(open_fds() - heap_after.segments == fds_before);
  BOOST_TEST(heap_after.live_blocks == heap_before.live_blocks);  // no buffer left behind
}

// -- by hand -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(by_hand_exchange_1_2_4) {
  for (int n : {1, 2, 4}) {
    const launch_result r = run_by_hand(n, {probe, "exchange", "20000"}, limited());
    BOOST_TEST_CONTEXT(n << " processes:\n" << r.output) {
      BOOST_TEST(r.exit_code == 0);
      BOOST_TEST(r.count("(address) exchange ok") == static_cast<size_t>(n));
    }
  }
}

BOOST_AUTO_TEST_CASE(by_hand_rank_started_late_is_waited_for) {
  // Rank 1 starts 1.5 s after the others (who retry rank 0 or wait in the join meanwhile).
  hand_options hand;
  hand.setup = [](size_t index) {
    if (index == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return true;
  };
  const launch_result r = run_by_hand(3, {probe, "exchange", "20000"}, limited(), hand);
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("exchange ok") == 3u);
  }
}

BOOST_AUTO_TEST_CASE(by_hand_rank_never_comes) {
  hand_options hand;
  hand.size = 3;
  hand.ranks = {0, 1};  // rank 2 never starts
  const launch_result r = run_by_hand(2, {probe, "join", "2000"}, limited(), hand);
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(!r.timed_out);
    BOOST_TEST(r.seconds < 15.0);  // a 2 s limit, not a hang
    BOOST_TEST(r.count("probe: create failed: ENDPOINT_TIMEOUT") == 2u);
    BOOST_TEST(r.count("rank 2 never connected to 127.0.0.1:") >= 1u);
    BOOST_TEST(r.count("joined") == 0u);
  }
}

BOOST_AUTO_TEST_CASE(by_hand_nobody_listens) {
  hand_options hand;
  hand.size = 2;
  hand.ranks = {1};
  const launch_result r = run_by_hand(1, {probe, "join", "1500"}, limited(), hand);
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("probe: create failed: UNREACHABLE") == 1u);
    BOOST_TEST(r.count("probe: create failed: UNREACHABLE: rank 1 of 2: nobody listened at") == 1u);
  }
}

BOOST_AUTO_TEST_CASE(by_hand_rank_taken_twice_or_of_another_job) {
  hand_options hand;
  hand.size = 3;
  hand.ranks = {0, 1, 1, 2, 2};
  hand.setup = [](size_t index) {
    return index != 4 || ::setenv("COMM_SIZE", "4", 1) == 0;  // the second rank 2: another job
  };
  const launch_result r = run_by_hand(5, {probe, "join", "3000"}, limited(), hand);
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("joined") == 3u);
    BOOST_TEST(r.count("create failed") == 2u);  // refused, or too late (rank 0 stopped listening)
  }
}

BOOST_AUTO_TEST_CASE(by_hand_wrong_auth_key_is_refused) {
  hand_options hand;
  hand.size = 2;
  hand.ranks = {0, 1};
  hand.setup = [](size_t index) {
    return ::setenv("COMM_AUTH_KEY", index == 0 ? "the job's key" : "another key", 1) == 0;
  };
  const launch_result r = run_by_hand(2, {probe, "join", "2000"}, limited(), hand);
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("joined") == 0u);
    BOOST_TEST(r.count("probe: create failed: REJECTED: rank 1 of 2: rank 0 at 127.0.0.1:") == 1u);
    // Rank 0: rank 1 never came.
    BOOST_TEST(r.count("probe: create failed: ENDPOINT_TIMEOUT") == 1u);
  }
}

BOOST_AUTO_TEST_CASE(by_hand_garbage_at_rank_zero_is_survived) {
  const std::string port = std::to_string(comm::test::detail::free_port());
  hand_options hand;
  hand.address = "127.0.0.1:" + port;
  hand.setup = [&port](size_t index) {
    if (index != 1) return true;
    // Before rank 1 starts, a stranger sends rank 0 bytes that are no handshake at all.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in where{};
    where.sin_family = AF_INET;
    where.sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
    where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&where), sizeof(where)) == 0) {
      const char garbage[] = "GET / HTTP/1.0\r\n\r\n\xff\xfe\x00\x01 not a libcomm peer";
      (void)!::write(fd, garbage, sizeof(garbage));
    }
    ::close(fd);
    return true;
  };
  const launch_result r = run_by_hand(2, {probe, "exchange", "20000"}, limited(), hand);
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("exchange ok") == 2u);
  }
}

BOOST_AUTO_TEST_CASE(by_hand_rank_killed_in_a_fence) {
  // The fence's own limit is 20 s: the survivors must learn of the death from the connections.
  const launch_result r = run_by_hand(3, {probe, "kill-in-fence", "20000"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("fence CONNECTION_RESET after") == 2u);
    BOOST_TEST(r.seconds < 10.0);
    // The messages name the dead rank: rank 0 saw it go, rank 1 heard it from rank 0.
    BOOST_TEST(r.count("probe: rank 0 fence CONNECTION_RESET") == 1u);
    BOOST_TEST(r.count("rank 2 (bootstrap-rank-2) is gone") >= 1u);
    BOOST_TEST(r.count("rank 2 failed (CONNECTION_RESET)") >= 1u);
  }
}

BOOST_AUTO_TEST_CASE(by_hand_on_two_network_namespace_hosts) {
  netns_pair hosts;
  BOOST_REQUIRE_MESSAGE(hosts.ok(), "cannot create network namespaces (root and ip(8) are needed)");
  hand_options hand;
  hand.address = hosts.address(0) + ":" + std::to_string(comm::test::detail::free_port());
  hand.setup = [&hosts](size_t index) { return hosts.enter(index == 0 ? 0 : 1); };
  launch_options opt = with_env({"COMM_AUTH_KEY=two hosts"});
  const launch_result r = run_by_hand(2, {probe, "exchange", "20000"}, opt, hand);
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(r.count("exchange ok") == 2u);
  }
}

// -- the choice of backend and the loud failures -------------------------------------------------

BOOST_AUTO_TEST_CASE(no_launcher_runs_single) {
  const launch_result r = run_command({probe, "join"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("rank 0 of 1 (single) joined") == 1u);
  }
}

BOOST_AUTO_TEST_CASE(launcher_variables_without_pmix_fail_loudly) {
  struct claim {
    const char* variable;
    const char* advice;
  };
  for (const claim& c : {claim{"SLURM_STEP_NUM_TASKS=2", "srun --mpi=pmix"},
                         claim{"SLURM_NTASKS=4", "srun --mpi=pmix"},
                         claim{"OMPI_COMM_WORLD_SIZE=4", "mpirun"},
                         claim{"PMI_SIZE=3", "PMIx only"}}) {
    const launch_result r = run_command({probe, "join"}, with_env({c.variable}));
    BOOST_TEST_CONTEXT(c.variable << ":\n" << r.output) {
      BOOST_TEST(r.exit_code == 2);
      BOOST_TEST(r.count("probe: create failed: UNREACHABLE") == 1u);
      BOOST_TEST(r.count(c.variable) >= 1u);
      BOOST_TEST(r.count(c.advice) >= 1u);
    }
  }
}

BOOST_AUTO_TEST_CASE(pmix_named_but_unreachable_fails_loudly) {
  const launch_result r = run_command({probe, "join"}, with_env({"PMIX_NAMESPACE=gone.0",
                                                                 "PMIX_RANK=0"}));
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.count("PMIX_NAMESPACE=gone.0") >= 1u);
  }
}

BOOST_AUTO_TEST_CASE(comm_size_without_address_fails_loudly) {
  const launch_result r = run_command({probe, "join"}, with_env({"COMM_SIZE=4", "COMM_RANK=1"}));
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.count("probe: create failed: INVALID_PARAM") == 1u);
    BOOST_TEST(r.count("COMM_BOOTSTRAP_ADDRESS") >= 1u);
  }
}

BOOST_AUTO_TEST_CASE(backend_named_in_the_environment) {
  launch_result r = run_command({probe, "join"}, with_env({"COMM_BOOTSTRAP=carrier-pigeon"}));
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("probe: create failed: INVALID_PARAM") == 1u);
    BOOST_TEST(r.count("use pmix, address or single") >= 1u);
  }
  r = run_command({probe, "join"}, with_env({"COMM_BOOTSTRAP=single", "SLURM_NTASKS=4"}));
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("rank 0 of 1 (single) joined") == 1u);
  }
  r = run_command({probe, "join"}, with_env({"COMM_BOOTSTRAP=pmix"}));
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("probe: create failed: UNREACHABLE") == 1u);
    BOOST_TEST(r.count("mpirun or srun --mpi=pmix") >= 1u);
  }
}

BOOST_AUTO_TEST_CASE(detect_says_what_it_would_use) {
  bootstrap_params p;
  p.address = "127.0.0.1:1";
  const bootstrap_choice by_address = bootstrap::detect(p);
  BOOST_TEST((by_address.backend == bootstrap_backend::address));
  BOOST_TEST(by_address.usable);
  p = {};
  p.size = 3;
  const bootstrap_choice missing = bootstrap::detect(p);
  BOOST_TEST(!missing.usable);
  BOOST_TEST(missing.reason.find("COMM_BOOTSTRAP_ADDRESS") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(comm_info_names_the_backend) {
  const std::string comm_info = COMM_TESTS_BINARY_DIR "/../libcomm/comm_info";
  launch_result r = run_command({comm_info, "-t", "self"}, limited());
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("# bootstrap: single (no launcher in the environment") == 1u);
  }
  r = run_command({comm_info, "-t", "self"}, with_env({"SLURM_STEP_NUM_TASKS=2"}));
  BOOST_TEST_CONTEXT(r.output) {
    BOOST_TEST(r.count("# bootstrap: pmix, would fail (") == 1u);
    BOOST_TEST(r.count("srun --mpi=pmix") == 1u);
  }
}
