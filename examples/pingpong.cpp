// pingpong: libcomm's main demo. One command starts two processes (a fork) that connect their
// workers over shared memory, exchange tagged messages and active messages of a few sizes, and
// measure a short ping-pong latency.
//
//   pingpong            # COMM_TLS defaults to shm for this demo
//
// The worker addresses are bootstrapped through a socketpair created before the fork; everything
// else goes through libcomm, through its C++ face (result<T>, endpoint_ptr, comm::operation,
// spans, scoped flags and capturing completions). Exit status 0 means both processes checked every
// message.

#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using steady = std::chrono::steady_clock;

/// Message sizes exchanged in the tag and AM phases.
constexpr std::array<size_t, 4> demo_sizes = {8, 64, 4096, 65536};
/// Round trips of the latency summary, and warm-up round trips before them.
constexpr int latency_rounds = 20000;
constexpr int latency_warmup = 2000;
/// Bound on any single wait, and on the whole run.
constexpr int wait_timeout_ms = 10000;
constexpr unsigned run_timeout_s = 60;

/// Tags: requests carry 0x1000 | index, replies 0x2000 | index, latency pings 0x3000.
constexpr comm::tag_t tag_request = 0x1000;
constexpr comm::tag_t tag_reply = 0x2000;
constexpr comm::tag_t tag_ping = 0x3000;
/// Matches every tag that differs from the base only in its low 12 bits.
constexpr comm::tag_t tag_group_mask = ~comm::tag_t{0xfff};
/// Active-message ids: requests, replies, latency pings.
constexpr uint16_t am_request = 1;
constexpr uint16_t am_reply = 2;
constexpr uint16_t am_ping = 3;

/// An error that ends this process with exit status 1.
struct demo_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws a demo_error formatted like printf.
[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char* fmt, ...) {
  char text[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  throw demo_error(text);
}

/// Prints one line prefixed with the role of this process.
__attribute__((format(printf, 2, 3))) void say(const char* role, const char* fmt, ...) {
  char text[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  std::printf("[%s] %s\n", role, text);
  std::fflush(stdout);
}

/// Byte `i` of the test pattern of a message with `seed`.
uint8_t pattern(size_t i, size_t seed) { return static_cast<uint8_t>((i * 31 + seed * 7) & 0xff); }

/// A buffer filled with the test pattern.
std::vector<uint8_t> make_payload(size_t size, size_t seed) {
  std::vector<uint8_t> v(size);
  for (size_t i = 0; i < size; ++i) v[i] = pattern(i, seed);
  return v;
}

/// True when `data` holds the test pattern of `seed`.
bool check_payload(const uint8_t* data, size_t size, size_t seed) {
  for (size_t i = 0; i < size; ++i)
    if (data[i] != pattern(i, seed)) return false;
  return true;
}

// -- bootstrap over the socketpair ----------------------------------------------------------------

/// Writes all bytes to the socketpair.
void write_all(int fd, const void* data, size_t length) {
  auto* p = static_cast<const char*>(data);
  while (length > 0) {
    ssize_t n = ::write(fd, p, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("bootstrap write: %s", std::strerror(errno));
    p += n;
    length -= static_cast<size_t>(n);
  }
}

/// Reads exactly `length` bytes from the socketpair, waiting at most wait_timeout_ms per read.
void read_all(int fd, void* data, size_t length) {
  auto* p = static_cast<char*>(data);
  while (length > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, wait_timeout_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) fail("bootstrap read: %s", ready == 0 ? "timed out" : std::strerror(errno));
    ssize_t n = ::read(fd, p, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("bootstrap read: %s", n == 0 ? "the peer exited" : std::strerror(errno));
    p += n;
    length -= static_cast<size_t>(n);
  }
}

/// Sends our packed address and receives the peer's.
std::vector<uint8_t> swap_addresses(int fd, const std::vector<uint8_t>& mine) {
  uint32_t n = static_cast<uint32_t>(mine.size());
  write_all(fd, &n, sizeof n);
  write_all(fd, mine.data(), mine.size());
  read_all(fd, &n, sizeof n);
  if (n == 0 || n > 65536) fail("bootstrap: bad address length %u", n);
  std::vector<uint8_t> theirs(n);
  read_all(fd, theirs.data(), n);
  return theirs;
}

/// Both processes wait for each other.
void barrier(int fd) {
  char token = 'b';
  write_all(fd, &token, 1);
  read_all(fd, &token, 1);
}

// -- one side of the demo -------------------------------------------------------------------------

/// An active message kept by the handler until the main loop looks at it.
struct am_record {
  uint64_t header = 0;
  std::vector<uint8_t> data;
  bool reply_ep = false;
};

/// One process of the demo: its worker, the endpoint to the peer, and what its AM handlers saw.
struct node {
  const char* role = "";
  int sock = -1;
  std::unique_ptr<comm::context> ctx;
  std::unique_ptr<comm::worker> w;
  comm::endpoint_ptr ep;             ///< closes itself if a phase fails
  std::vector<am_record> received;   ///< AM requests or replies not yet handled
  uint64_t pings = 0;                ///< AM latency pings seen
};

/// Stores an arrived active message (header is a uint64 sequence number) for the main loop.
comm::status on_am_store(void* arg, const void* header, size_t header_length, void* data,
                         size_t length, const comm::am_recv_params& params) {
  auto* n = static_cast<node*>(arg);
  am_record rec;
  if (header_length == sizeof rec.header) std::memcpy(&rec.header, header, sizeof rec.header);
  rec.data.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + length);
  rec.reply_ep = (params.attr & comm::am_recv_reply_ep) != 0;
  n->received.push_back(std::move(rec));
  return comm::status::ok;
}

/// Counts a latency ping.
comm::status on_am_ping(void* arg, const void*, size_t, void*, size_t,
                        const comm::am_recv_params&) {
  ++static_cast<node*>(arg)->pings;
  return comm::status::ok;
}

/// Creates the worker (COMM_TLS, else shared memory), swaps addresses and connects to the peer.
void setup(node& n) {
  comm::config cfg = comm::config::from_environment();
  if (std::getenv("COMM_TLS") == nullptr) cfg.transports = {"shm"};
  n.ctx = std::make_unique<comm::context>(cfg);
  comm::worker_params wp;
  wp.name = std::string("pingpong-") + n.role;
  auto made = comm::worker::create(*n.ctx, wp);
  if (!made) fail("cannot create a worker: %s", comm::to_string(made.error()));
  n.w = std::move(*made);
  const auto flags = comm::am_handler_flags::whole_msg | comm::am_handler_flags::fetch_rndv;
  if (n.w->set_am_handler(am_request, on_am_store, &n, flags) != comm::status::ok ||
      n.w->set_am_handler(am_reply, on_am_store, &n, flags) != comm::status::ok ||
      n.w->set_am_handler(am_ping, on_am_ping, &n, flags) != comm::status::ok)
    fail("cannot install the AM handlers");
  std::vector<uint8_t> peer = swap_addresses(n.sock, n.w->address());
  comm::worker_address_attr attr;
  if (comm::worker::query_address(peer.data(), peer.size(), &attr) != comm::status::ok)
    fail("the peer's address does not decode");
  auto ep = n.w->connect(peer);
  if (!ep) fail("connect: %s", comm::to_string(ep.error()));
  n.ep = std::move(*ep);
  say(n.role, "worker %s (uid %016" PRIx64 ") connected to %s over %.*s", n.w->name().c_str(),
      n.w->uid(), attr.name.c_str(), static_cast<int>(n.ep->transport().size()),
      n.ep->transport().data());
  barrier(n.sock);
}

/// Waits (bounded) for `o` and fails unless it completed with ok.
void finish(comm::operation o, const char* what) {
  comm::status st = o.wait(wait_timeout_ms);
  if (st != comm::status::ok) fail("%s: %s", what, comm::to_string(st));
}

/// Receives one tagged message matching `tag` under `mask` into `buf`; returns what arrived.
comm::tag_recv_info receive(node& n, std::vector<uint8_t>& buf, comm::tag_t tag, comm::tag_t mask) {
  comm::tag_recv_info info;
  finish(n.w->tag_recv(buf, tag, mask,
                       [&info](comm::status, const comm::tag_recv_info& got) { info = got; }),
         "tag_recv");
  return info;
}

/// Progresses (bounded) until the AM handlers stored a message, and takes it.
am_record next_am(node& n) {
  auto end = steady::now() + std::chrono::milliseconds(wait_timeout_ms);
  while (n.received.empty()) {
    n.w->progress();
    if (n.ep->state() != comm::status::ok) fail("endpoint failed: %s", comm::to_string(n.ep->state()));
    if (steady::now() > end) fail("no active message within %d ms", wait_timeout_ms);
  }
  am_record rec = std::move(n.received.front());
  n.received.erase(n.received.begin());
  return rec;
}

// -- the phases -----------------------------------------------------------------------------------

/// Client: sends a tagged message of each size and checks the echo.
void client_tags(node& n) {
  for (size_t i = 0; i < demo_sizes.size(); ++i) {
    size_t size = demo_sizes[i];
    std::vector<uint8_t> out = make_payload(size, i), in(size);
    say(n.role, "send tag 0x%" PRIx64 ", %zu bytes", tag_request | i, size);
    finish(n.ep->tag_send(tag_request | i, out), "tag_send");
    comm::tag_recv_info info = receive(n, in, tag_reply | i, comm::tag_mask_full);
    if (info.length != size || !check_payload(in.data(), size, i))
      fail("echo of tag 0x%" PRIx64 " is wrong", tag_request | i);
    say(n.role, "got echo tag 0x%" PRIx64 ", %zu bytes, contents ok", info.sender_tag, info.length);
  }
}

/// Server: receives any tag of the request group (a wildcard mask), checks it, echoes it back.
void server_tags(node& n) {
  std::vector<uint8_t> in(demo_sizes.back());
  for (size_t i = 0; i < demo_sizes.size(); ++i) {
    comm::tag_recv_info info = receive(n, in, tag_request, tag_group_mask);
    size_t index = info.sender_tag & 0xfff;
    bool ok = index < demo_sizes.size() && info.length == demo_sizes[index] &&
              check_payload(in.data(), info.length, index);
    say(n.role, "got tag 0x%" PRIx64 ", %zu bytes, contents %s", info.sender_tag, info.length,
        ok ? "ok" : "WRONG");
    if (!ok) fail("tagged message %zu arrived damaged", i);
    finish(n.ep->tag_send(tag_reply | index, std::span(in).first(info.length)), "tag_send echo");
  }
}

/// Client: sends an active message of each size (header = index) and checks the reply.
void client_ams(node& n) {
  for (size_t i = 0; i < demo_sizes.size(); ++i) {
    size_t size = demo_sizes[i];
    std::vector<uint8_t> out = make_payload(size, i + 100);
    uint64_t header = i;
    say(n.role, "send AM id %u, header %zu bytes, data %zu bytes", am_request, sizeof header, size);
    finish(n.ep->am_send(am_request, std::span(&header, 1), out, {},
                         comm::am_send_flags::reply_endpoint),
           "am_send");
    am_record rec = next_am(n);
    if (rec.header != i || rec.data.size() != size || !check_payload(rec.data.data(), size, i + 100))
      fail("AM reply %zu is wrong", i);
    say(n.role, "got AM reply %" PRIu64 ", %zu bytes, contents ok", rec.header, rec.data.size());
  }
}

/// Server: takes each active message the handler stored, checks it, and replies with the same data.
void server_ams(node& n) {
  for (size_t i = 0; i < demo_sizes.size(); ++i) {
    am_record rec = next_am(n);
    bool ok = rec.header < demo_sizes.size() && rec.data.size() == demo_sizes[rec.header] &&
              check_payload(rec.data.data(), rec.data.size(), rec.header + 100);
    say(n.role, "got AM id %u, header %" PRIu64 ", %zu bytes%s, contents %s", am_request,
        rec.header, rec.data.size(), rec.reply_ep ? ", with reply endpoint" : "",
        ok ? "ok" : "WRONG");
    if (!ok) fail("active message %zu arrived damaged", i);
    finish(n.ep->am_send(am_reply, std::span(&rec.header, 1), rec.data), "am_send reply");
  }
}

/// Progresses (bounded) until `n.pings` reaches `target`.
void wait_pings(node& n, uint64_t target) {
  auto end = steady::now() + std::chrono::milliseconds(wait_timeout_ms);
  unsigned polls = 0;
  while (n.pings < target) {
    n.w->progress();
    if ((++polls & 1023u) == 0 && steady::now() > end) fail("AM ping %" PRIu64 " lost", target);
  }
}

/// One round trip of 8 bytes: tagged (am false) or active message (am true).
void round_trip(node& n, bool am, bool initiator, uint64_t& value) {
  if (am) {
    uint64_t target = n.pings + 1;
    if (!initiator) wait_pings(n, target);
    finish(n.ep->am_send(am_ping, comm::const_bytes{}, std::span(&value, 1)), "am ping");
    if (initiator) wait_pings(n, target);
    return;
  }
  const auto bytes = std::span(&value, 1);
  comm::operation r = n.w->tag_recv(bytes, tag_ping, comm::tag_mask_full);
  if (initiator) finish(n.ep->tag_send(tag_ping, bytes), "tag ping");
  finish(std::move(r), "tag ping receive");
  if (!initiator) finish(n.ep->tag_send(tag_ping, bytes), "tag pong");
}

/// Runs the latency rounds; the client prints median and average one-way latency.
void latency(node& n, bool am, bool initiator) {
  uint64_t value = 42;
  std::vector<double> one_way_us;
  one_way_us.reserve(latency_rounds);
  for (int i = 0; i < latency_warmup + latency_rounds; ++i) {
    auto t0 = steady::now();
    round_trip(n, am, initiator, value);
    if (i >= latency_warmup)
      one_way_us.push_back(std::chrono::duration<double, std::micro>(steady::now() - t0).count() / 2);
  }
  if (!initiator) return;
  double sum = 0;
  for (double v : one_way_us) sum += v;
  std::nth_element(one_way_us.begin(), one_way_us.begin() + latency_rounds / 2, one_way_us.end());
  say(n.role, "%s ping-pong, 8 bytes, %d round trips: one-way latency median %.3f us, average %.3f us",
      am ? "active-message" : "tagged", latency_rounds, one_way_us[latency_rounds / 2],
      sum / latency_rounds);
}

/// Runs every phase as client (the parent) or server (the child).
void run(node& n, bool client) {
  setup(n);
  if (client) client_tags(n); else server_tags(n);
  barrier(n.sock);
  if (client) client_ams(n); else server_ams(n);
  barrier(n.sock);
  latency(n, false, client);
  barrier(n.sock);
  latency(n, true, client);
  barrier(n.sock);
  // Our endpoint counts what we sent; what the peer sent arrived on the endpoint its wireup made
  // here, so print every endpoint of the worker.
  std::istringstream lines(n.w->info());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("ep ", 0) == 0) say(n.role, "%s", line.c_str());
  }
  finish(n.ep.close(), "close");
  barrier(n.sock);
  n.w.reset();
  n.ctx.reset();
}

/// Pins this process to the `index`-th core it may run on, when there are at least two, so the
/// two processes spin on different cores. Returns the core, or -1.
int pin_to_nth_core(int index) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return -1;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != index) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof one, &one) == 0 ? cpu : -1;
  }
  return -1;
}

/// Runs one role and returns its exit status.
int run_role(const char* role, int sock, bool client) {
  int core = pin_to_nth_core(client ? 1 : 0);
  if (core >= 0) say(role, "pid %d pinned to core %d", static_cast<int>(::getpid()), core);
  node n;
  n.role = role;
  n.sock = sock;
  try {
    run(n, client);
    say(role, "done");
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "[%s] error: %s\n", role, e.what());
    return 1;
  }
}

/// Waits (bounded) for the child; kills it if it does not finish. Returns its exit status.
int reap_child(pid_t child) {
  auto end = steady::now() + std::chrono::milliseconds(wait_timeout_ms);
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(child, &status, WNOHANG);
    if (r == child) break;
    if (r < 0 && errno != EINTR) return 1;
    if (steady::now() > end) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      std::fprintf(stderr, "[client] the server did not exit; killed it\n");
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int main() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    std::perror("socketpair");
    return 1;
  }
  std::fflush(stdout);
  pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  ::alarm(run_timeout_s);
  if (child == 0) {
    ::close(fds[0]);
    int rc = run_role("server", fds[1], false);
    std::fflush(stdout);
    ::_exit(rc);
  }
  ::close(fds[1]);
  int rc = run_role("client", fds[0], true);
  ::close(fds[0]);
  int child_rc = reap_child(child);
  if (rc == 0 && child_rc == 0) std::printf("pingpong: both processes finished cleanly\n");
  return rc != 0 ? rc : child_rc;
}
