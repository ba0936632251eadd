// The node under a hostile peer: a forged node (test_actors_forged.hpp) sends valid-looking frames
// built to hurt: CAF messages nested far deeper than a stack takes, down frames whose exit reason
// claims a 4 GiB sequence, and frames out of order whose turn never comes. The node under attack
// runs in a child process, so that a crash is a failed test rather than a dead test program, and
// reports its peak resident memory (VmHWM); a well-behaved node (another child) checks it is still
// served afterwards. This process stays single-threaded: it only forks and speaks libcomm.
#define BOOST_TEST_MODULE actors_hostile
#include <boost/test/unit_test.hpp>

#include "test_actors_forged.hpp"
#include "test_actors_scenarios.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace comm::test::actors;
using comm::test::fork_child;
using comm::test::wait_child;

namespace {

#if defined(__SANITIZE_THREAD__)
/// ThreadSanitizer's shadow memory: the same data costs about this many times the resident memory
/// (the node's held frames and everything around them), so the peak-RSS bound scales by it.
constexpr uint64_t tsan_rss_factor = 4;
#else
constexpr uint64_t tsan_rss_factor = 1;
#endif

/// The peak resident memory of this process (VmHWM), in KiB.
uint64_t peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

/// Body of the node under attack: publishes the service, tells its address on `out`, answers
/// every "hwm" on `in` with its peak resident memory in KiB, and stops on anything else (or after
/// 60 s of silence).
int target_process(const channel& out, const channel& in, const node_tweak& tweak) {
  caf::actor_system_config cfg;
  configure(cfg, "127.0.0.1:0", false, tweak);
  caf::actor_system sys{cfg};
  auto svc = start_service(sys);
  out.send(bytes_of(node_of(sys).address()));
  while (receive_string(in, 60000) == "hwm") out.send_word(peak_rss_kib());
  caf::anon_send_exit(svc, caf::exit_reason::user_shutdown);
  return 0;
}

/// The node under attack, in a child process.
struct target_child {
  channel from;
  channel to;
  pid_t pid = -1;
  std::string address;

  explicit target_child(const node_tweak& tweak = {}) {
    pid = fork_child([&] { return target_process(from, to, tweak); });
    address = receive_string(from);
  }

  ~target_child() {
    if (pid > 0) stop();
  }

  /// Its peak resident memory so far in KiB; 0 when it does not answer (it died).
  uint64_t peak_kib() {
    to.send(bytes_of("hwm"));
    uint64_t kib = 0;
    return from.receive_word(&kib) ? kib : 0;
  }

  /// Stops it and returns its exit code (-1: killed, or died of a signal).
  int stop() {
    to.send(bytes_of("stop"));
    const int rc = wait_child(pid);
    pid = -1;
    return rc;
  }
};

/// A well-behaved node, in a child process, gets an answer from the service at `address`.
bool still_serves(const std::string& address) {
  const pid_t client = fork_child([&] {
    return client_process(address, [](caf::actor_system& sys, const std::string& at) {
      return run_checks(sys, at, {check_request});
    });
  });
  return wait_child(client) == 0;
}

/// True when the node's last frame answers request `id` with an error.
bool error_answer(const forged_state& s, uint64_t id) {
  const std::string payload(s.last_payload.begin(), s.last_payload.end());
  return s.last_kind == kind_message &&
         s.last_message_id == caf::message_id{id}.response_id().integer_value() &&
         payload.find("@<>+@error") != std::string::npos;
}

/// Sends a request with `payload` (one element) to the service and waits for the answer; true
/// when the answer is an error and the connection stays.
bool refused_with_an_error(forged_peer& peer, uint64_t svc, const std::vector<char>& payload) {
  const int before = peer.state.frames;
  const uint64_t id = forged_request_id(static_cast<uint64_t>(before) + 1);
  peer.send(kind_message, svc, id, 1, payload);
  peer.progress_until([&] { return peer.state.frames > before || peer.closed(); }, 20);
  return !peer.closed() && error_answer(peer.state, id);
}

}  // namespace

BOOST_AUTO_TEST_CASE(messages_nested_deeper_than_the_limit_are_refused) {
  target_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  const uint64_t svc = peer.lookup(service_name);
  BOOST_REQUIRE(svc != 0);
  // 40,000 levels (600 KB) overflowed the progress thread's stack in CAF's message::load.
  BOOST_TEST(refused_with_an_error(peer, svc, nested_messages(40000)));
  // Containers recurse too: 300,000 nested lists in 600 KB.
  BOOST_TEST(refused_with_an_error(peer, svc, nested_lists(300000)));
  // The connection goes on: the node still answers this peer, and others.
  BOOST_TEST(peer.lookup(service_name) == svc);
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_reason_claiming_4_gib_costs_nothing) {
  target_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  BOOST_REQUIRE(peer.lookup(service_name) != 0);
  const uint64_t before = node.peak_kib();
  for (int i = 0; i < 3; ++i) peer.send(kind_down, 0, 0, 0, lying_reason());
  // The node has read them once it answers a lookup sent after them.
  BOOST_TEST(peer.lookup(service_name) != 0);
  const uint64_t after = node.peak_kib();
  BOOST_TEST_MESSAGE("peak RSS " << before << " KiB before, " << after << " KiB after");
  BOOST_TEST(after != 0u);
  BOOST_TEST(after < before + 16 * 1024);  // far below one 4 GiB fill
  BOOST_TEST(!peer.closed());
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_duration_of_an_unknown_unit_is_refused) {
  target_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  const uint64_t svc = peer.lookup(service_name);
  BOOST_REQUIRE(svc != 0);
  // The service does not expect a duration: CAF prints it, and its to_string reads the unit's
  // name from a table at index 0xfe3ee39a (a segfault), here and inside a nested message.
  std::vector<char> duration;
  put_message_start(duration, "@<>+@duration");
  put_int(duration, uint32_t{0xfe3ee39a});
  put_int(duration, uint64_t{5});
  std::vector<char> nested;
  put_message_start(nested, "@<>+@message");
  nested.insert(nested.end(), duration.begin(), duration.end());
  BOOST_TEST(refused_with_an_error(peer, svc, duration));
  BOOST_TEST(refused_with_an_error(peer, svc, nested));
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(infinities_are_answered) {
  target_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  const uint64_t svc = peer.lookup(service_name);
  BOOST_REQUIRE(svc != 0);
  // (echo, inf, -inf) as CAF writes infinities it reads (exponent all ones): the service sends
  // them back, and CAF 0.17.6's pack754 never returns for an infinity.
  std::vector<char> payload;
  put_message_start(payload, "@<>+@atom+double+float");
  put_int(payload, static_cast<uint64_t>(caf::atom("echo")));
  put_int(payload, uint64_t{0x7ff0000000000000});
  put_int(payload, uint32_t{0xff800000});
  const uint64_t response = caf::message_id{forged_request_id(2)}.response_id().integer_value();
  peer.send(kind_message, svc, forged_request_id(2), 3, payload);
  // The node also asks to monitor the forged sender (a monitor frame) before it answers.
  BOOST_TEST(peer.progress_until([&] { return peer.state.last_message_id == response; }, 10));
  const std::string answer(peer.state.last_payload.begin(), peer.state.last_payload.end());
  std::vector<char> values;
  put_message_start(values, "@<>+double+float");
  put_int(values, uint64_t{0x7ff0000000000000});
  put_int(values, uint32_t{0xff800000});
  BOOST_TEST(answer.find(std::string(values.begin(), values.end())) != std::string::npos);
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(frames_held_beyond_the_limit_close_the_peer) {
  constexpr size_t limit = size_t{16} << 20;
  target_child node([](comm::actors::node_params& p) { p.max_held_bytes = limit; });
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  const uint64_t svc = peer.lookup(service_name);
  BOOST_REQUIRE(svc != 0);
  const uint64_t before = node.peak_kib();
  // Frame 1 never comes: 2,000 frames of 256 KiB (500 MiB) after it wait for their turn.
  const std::vector<char> payload(256 * 1024, 'h');
  peer.seq = 2;
  for (int i = 0; i < 2000; ++i) {
    peer.fill(kind_message, svc, 0, 1, 0);
    peer.send_from(peer.envelope.bytes(), envelope_size, payload.data(), payload.size());
  }
  BOOST_TEST(peer.progress_until([&] { return peer.closed(); }, 30));
  const uint64_t after = node.peak_kib();
  BOOST_TEST_MESSAGE("peak RSS " << before << " KiB before, " << after << " KiB after");
  BOOST_TEST(after != 0u);
  BOOST_TEST(after < before + ((limit >> 10) + 32 * 1024) * tsan_rss_factor);
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(senders_beyond_max_proxies_close_the_peer) {
  target_child node([](comm::actors::node_params& p) { p.max_proxies = 1000; });
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  const uint64_t svc = peer.lookup(service_name);
  BOOST_REQUIRE(svc != 0);
  // (seq, 1) from 1,500 different actors of the forged node: the node makes a proxy of each.
  std::vector<char> payload;
  put_message_start(payload, "@<>+@atom+@i32");
  put_int(payload, static_cast<uint64_t>(caf::atom("seq")));
  put_int(payload, int32_t{1});
  for (uint64_t sender = 100; sender < 1600 && !peer.closed(); ++sender) {
    peer.fill(kind_message, svc, 0, 2, 0, sender);
    peer.send_from(peer.envelope.bytes(), envelope_size, payload.data(), payload.size());
    peer.worker->progress();
  }
  BOOST_TEST(peer.progress_until([&] { return peer.closed(); }, 20));
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_peer_that_never_reads_its_answers_is_closed) {
  // The node's receive FIFO takes every lookup below at once (8,192 entries of 1 KiB), while
  // its answers fill the forged peer's FIFO (256 entries) and then wait in the node's send queue.
  target_child node([](comm::actors::node_params& p) {
    p.transport.transport_options["COMM_SHM_FIFO_SIZE"] = "8192";
    p.transport.transport_options["COMM_SHM_SEG_SIZE"] = "1024";
    p.max_queued_bytes = 256 * 1024;
  });
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  BOOST_REQUIRE(peer.lookup(service_name) != 0);
  const std::vector<char> name(service_name.begin(), service_name.end());
  for (uint64_t i = 0; i < 8000; ++i) {
    peer.fill(kind_lookup, 0, i + 2, 0, 0);
    peer.send_from(peer.envelope.bytes(), envelope_size, name.data(), name.size());
  }
  // Give the node time to answer them all (a few milliseconds when idle), then read: the node
  // has closed the connection.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  BOOST_TEST(peer.progress_until([&] { return peer.closed(); }, 20));
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

#if defined(__SANITIZE_THREAD__)
extern "C" void __sanitizer_symbolize_pc(void* pc, const char* fmt, char* out, size_t size);
#endif

/// Under ThreadSanitizer, starts its symbolizer (an llvm-symbolizer process behind two pipes)
/// and has it name code of this program and of CAF while descriptors are still to be had:
/// CAF's internal hand-offs are reported as races and suppressed by function name
/// (tests/tsan_caf.supp), which needs the frames named; in a process without a descriptor left
/// the symbolizer cannot start, the reports stay unnamed and unsuppressed, and the process exits
/// 66. Nothing otherwise.
void start_symbolizer() {
#if defined(__SANITIZE_THREAD__)
  char name[256];
  __sanitizer_symbolize_pc(reinterpret_cast<void*>(&start_symbolizer), "%f", name, sizeof name);
  caf::actor_system_config cfg;  // code of libcaf_core.so, to start its symbolizer too
  __sanitizer_symbolize_pc(*reinterpret_cast<void**>(&cfg), "%f", name, sizeof name);
#endif
}

/// Body of a node started without a file descriptor to spare: it must report why (listen_error)
/// and fail a lookup at once instead of waiting for a progress thread that never started.
int node_without_descriptors() {
  start_symbolizer();
  int highest = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    highest = std::max(highest, std::stoi(entry.path().filename().string()));
  }
  const rlimit none{static_cast<rlim_t>(highest + 1), static_cast<rlim_t>(highest + 1)};
  if (::setrlimit(RLIMIT_NOFILE, &none) != 0) return 10;
  for (int i = 0; i <= highest && ::dup(0) >= 0; ++i) {
  }  // takes the gaps below the limit too
  caf::actor_system_config cfg;
  configure(cfg, "127.0.0.1:0", true);
  caf::actor_system sys{cfg};
  auto& node = node_of(sys);
  if (node.listen_error() != comm::actors::make_error(comm::status::no_resource)) return 11;
  if (!node.address().empty()) return 12;
  const auto started = std::chrono::steady_clock::now();
  if (node.lookup("127.0.0.1:1", "svc")) return 13;
  return std::chrono::steady_clock::now() - started < std::chrono::seconds(1) ? 0 : 14;
}

BOOST_AUTO_TEST_CASE(a_node_without_descriptors_says_so_and_fails_at_once) {
#if defined(__SANITIZE_ADDRESS__)
  BOOST_TEST_MESSAGE("skipped in the sanitizer build: UBSan's vptr check opens a pipe to probe "
                     "memory, so it reports false errors in a process with no descriptor left; "
                     "the plain build runs this case");
  return;
#endif
  BOOST_TEST(wait_child(fork_child(node_without_descriptors)) == 0);
}

BOOST_AUTO_TEST_CASE(the_limits_come_from_the_environment) {
  ::setenv("COMM_ACTORS_MAX_HELD", "8m", 1);
  const comm::actors::node_params eight;
  ::setenv("COMM_ACTORS_MAX_HELD", "12345", 1);
  const comm::actors::node_params exact;
  ::setenv("COMM_ACTORS_MAX_HELD", "lots", 1);
  const comm::actors::node_params malformed;
  ::setenv("COMM_ACTORS_MAX_PROXIES", "5000", 1);
  const comm::actors::node_params proxies;
  ::setenv("COMM_ACTORS_MAX_QUEUED", "1g", 1);
  const comm::actors::node_params queued;
  ::setenv("COMM_ACTORS_MAX_BACKLOG", "300", 1);
  const comm::actors::node_params backlog;
  ::unsetenv("COMM_ACTORS_MAX_HELD");
  ::unsetenv("COMM_ACTORS_MAX_PROXIES");
  ::unsetenv("COMM_ACTORS_MAX_QUEUED");
  ::unsetenv("COMM_ACTORS_MAX_BACKLOG");
  const comm::actors::node_params unset;
  BOOST_TEST(eight.max_held_bytes == size_t{8} << 20);
  BOOST_TEST(exact.max_held_bytes == 12345u);
  BOOST_TEST(malformed.max_held_bytes == unset.max_held_bytes);
  BOOST_TEST(unset.max_held_bytes == size_t{64} << 20);
  BOOST_TEST(proxies.max_proxies == 5000u);
  BOOST_TEST(unset.max_proxies == size_t{1} << 18);
  BOOST_TEST(queued.max_queued_bytes == size_t{1} << 30);
  BOOST_TEST(unset.max_queued_bytes == size_t{256} << 20);
  BOOST_TEST(backlog.max_backlog == 300u);
  BOOST_TEST(unset.max_backlog == 1024u);
}
