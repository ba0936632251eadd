// comm_perftest: libcomm's counterpart of UCX's ucx_perftest.
//
// Server:  comm_perftest [-p port] [-c core]
// Client:  comm_perftest <server-host> -t <test> -s size -n iters -w warmup
//                        [-c core] [-p port] [-W window] [-T timeout_s] [-R rank] [-f]
//                        [-m host|shared]
//   tests: tag_lat, tag_bw, am_lat, am_bw, put_lat, put_bw, get, stream_lat, stream_bw (UCX's
//   ucp_am_lat, ucp_am_bw, ucp_put_lat, ucp_put_bw, ucp_get, ucp_stream_lat and ucp_stream_bw are
//   accepted too)
//
// The TCP socket between the two processes carries only the bootstrap (test parameters, packed
// worker addresses, packed remote keys) and barriers; every measured message travels over
// libcomm. The output has ucx_perftest's table and `Final:` row columns so the two tools can be
// compared directly.
//
// The RMA tests follow ucx_perftest's ucp_* tests: the server registers its receive buffer
// (worker::mem_map) and sends the packed key; the client puts its send buffer there or gets it into
// its receive buffer, with a window of outstanding operations, and flushes the endpoint at the end.
// put_lat is a ping-pong in which both sides put into each other's registered buffer and poll the
// last byte for the iteration's sequence number. The default windows are ucx_perftest's: 32 for
// tag_bw, am_bw and put_bw, 1 (one operation at a time: per-operation latency) for get.
//
// The stream tests follow ucx_perftest's stream_lat / stream_bw: each message is `size` bytes of
// the byte stream, received with a wait-all receive of `size` bytes. A stream sent on our endpoint
// arrives on the peer's partner of it (the endpoint its worker made for our connect), which the
// receiving side finds with worker::stream_poll when the first bytes come; answers go back on that
// partner, so they arrive on the sender's own endpoint.

#include <comm/context.hpp>
#include <comm/memory.hpp>
#include <comm/worker.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using steady = std::chrono::steady_clock;

// -- errors ---------------------------------------------------------------------------------------

/// A fatal error of the test: printed once by main, exit status 1.
struct fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws a fatal error formatted like printf.
[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char* fmt, ...) {
  char text[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  throw fatal(text);
}

// -- options --------------------------------------------------------------------------------------

/// The tests comm_perftest runs (the values travel in wire_params).
enum class test_kind : uint32_t {
  tag_lat = 1,
  tag_bw = 2,
  am_lat = 3,
  am_bw = 4,
  put_bw = 5,
  put_lat = 6,
  get = 7,
  stream_lat = 8,
  stream_bw = 9,
};
/// Every test, in the order of the usage text.
constexpr test_kind all_tests[] = {test_kind::tag_lat, test_kind::tag_bw, test_kind::am_lat,
                                   test_kind::am_bw,   test_kind::put_lat, test_kind::put_bw,
                                   test_kind::get,     test_kind::stream_lat,
                                   test_kind::stream_bw};

/// Where the send and receive buffers come from (-m; the client's choice applies to both sides).
enum class memory_kind : uint32_t {
  host = 0,    ///< posix_memalign: rendezvous and RMA move them with cross-memory attach
  shared = 1,  ///< comm::mem_alloc: the peer copies through a mapping of the segment
};

/// Command-line options of either side.
struct options {
  std::string server_host;        ///< empty: run as server
  uint16_t port = 13337;          ///< bootstrap TCP port
  int core = -1;                  ///< core to pin to, -1: no pinning
  test_kind test = test_kind::tag_lat;
  uint64_t size = 8;              ///< message size in bytes
  uint64_t iters = 1000000;       ///< measured iterations
  uint64_t warmup = 10000;        ///< warm-up iterations
  uint32_t window = 0;            ///< outstanding operations; 0: the test's default
  uint32_t timeout_s = 60;        ///< bound on one test run
  double rank = 50.0;             ///< percentile rank shown in the table
  bool final_only = false;        ///< print only the final row
  bool info = false;              ///< print this side's worker info at the end (stderr)
  memory_kind memory = memory_kind::host;
};

/// Seconds a client waits for the server's host to answer its connection.
constexpr int connect_timeout_s = 10;
/// Seconds a server waits for its client.
constexpr int accept_timeout_s = 120;
/// Milliseconds a bootstrap read or write may block.
constexpr int socket_timeout_ms = 30000;
/// Largest message size accepted.
constexpr uint64_t max_size = 1ull << 30;

/// Name of a test as given with -t.
const char* test_name(test_kind t) {
  switch (t) {
    case test_kind::tag_lat: return "tag_lat";
    case test_kind::tag_bw: return "tag_bw";
    case test_kind::am_lat: return "am_lat";
    case test_kind::am_bw: return "am_bw";
    case test_kind::put_bw: return "put_bw";
    case test_kind::put_lat: return "put_lat";
    case test_kind::get: return "get";
    case test_kind::stream_lat: return "stream_lat";
    case test_kind::stream_bw: return "stream_bw";
  }
  return "?";
}

/// UCX's name of a test (ucx_perftest's UCP test of the same kind).
const char* ucx_test_name(test_kind t) {
  switch (t) {
    case test_kind::am_lat: return "ucp_am_lat";
    case test_kind::am_bw: return "ucp_am_bw";
    case test_kind::put_bw: return "ucp_put_bw";
    case test_kind::put_lat: return "ucp_put_lat";
    case test_kind::get: return "ucp_get";
    case test_kind::stream_lat: return "ucp_stream_lat";
    case test_kind::stream_bw: return "ucp_stream_bw";
    default: return test_name(t);
  }
}

/// One-line description of a test, for the server's banner.
const char* test_description(test_kind t) {
  switch (t) {
    case test_kind::tag_lat: return "tag match latency";
    case test_kind::tag_bw: return "tag match bandwidth";
    case test_kind::am_lat: return "am latency";
    case test_kind::am_bw: return "am bandwidth / message rate";
    case test_kind::put_bw: return "put bandwidth";
    case test_kind::put_lat: return "put latency";
    case test_kind::get: return "get latency / bandwidth / message rate";
    case test_kind::stream_lat: return "stream latency";
    case test_kind::stream_bw: return "stream bandwidth / message rate";
  }
  return "?";
}

/// True for the ping-pong tests, whose per-iteration time is a round trip.
bool is_pingpong_test(test_kind t) {
  return t == test_kind::tag_lat || t == test_kind::am_lat || t == test_kind::put_lat ||
         t == test_kind::stream_lat;
}

/// True for the tests whose table shows latency rather than per-message overhead (ucx_perftest's
/// ping-pongs, and ucp_get).
bool shows_latency(test_kind t) { return is_pingpong_test(t) || t == test_kind::get; }

/// True for the one-sided tests, which need a remote key.
bool is_rma_test(test_kind t) {
  return t == test_kind::put_bw || t == test_kind::put_lat || t == test_kind::get;
}

/// ucx_perftest's default window of a test (its -O): 32 for the streaming tests, 1 for get and the
/// ping-pongs.
uint32_t default_window(test_kind t) {
  switch (t) {
    case test_kind::tag_bw:
    case test_kind::am_bw:
    case test_kind::stream_bw:
    case test_kind::put_bw: return 32;
    default: return 1;
  }
}

/// Parses the -t argument: our names and UCX's.
test_kind parse_test(const char* arg) {
  for (auto t : all_tests)
    if (std::strcmp(arg, test_name(t)) == 0 || std::strcmp(arg, ucx_test_name(t)) == 0) return t;
  fail("unknown test '%s' (tag_lat, tag_bw, am_lat, am_bw, put_lat, put_bw, get, stream_lat, "
       "stream_bw)", arg);
}

/// Parses an unsigned number in [lo, hi] for option `opt`.
uint64_t parse_number(char opt, const char* arg, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(arg, &end, 0);
  if (errno != 0 || end == arg || *end != '\0' || v < lo || v > hi)
    fail("-%c: '%s' is not a number in [%" PRIu64 ", %" PRIu64 "]", opt, arg, lo, hi);
  return v;
}

/// Parses the -m argument.
memory_kind parse_memory(const char* arg) {
  if (std::strcmp(arg, "host") == 0) return memory_kind::host;
  if (std::strcmp(arg, "shared") == 0) return memory_kind::shared;
  fail("-m: '%s' is neither host nor shared", arg);
}

/// Name of a memory kind, as given with -m.
const char* memory_name(memory_kind m) { return m == memory_kind::shared ? "shared" : "host"; }

/// Prints the usage text.
void usage(std::FILE* out) {
  std::fprintf(out,
      "Usage: comm_perftest [server-hostname] [options]\n"
      "  Without a hostname it runs as server and serves one client test.\n\n"
      "  -t <test>     tag_lat | tag_bw | am_lat | am_bw | put_lat | put_bw | get |\n"
      "                stream_lat | stream_bw (tag_lat) (UCX's ucp_am_lat, ucp_am_bw,\n"
      "                ucp_put_lat, ucp_put_bw, ucp_get, ucp_stream_lat, ucp_stream_bw accepted)\n"
      "  -s <size>     message size in bytes (8)\n"
      "  -n <iters>    measured iterations (1000000)\n"
      "  -w <iters>    warm-up iterations (10000)\n"
      "  -c <core>     pin this process to one core (off)\n"
      "  -p <port>     TCP port of the bootstrap socket (13337)\n"
      "  -W <count>    outstanding operations in streaming tests; -O is the same (32 for\n"
      "                tag_bw, am_bw, put_bw; 1 for get, i.e. per-operation latency)\n"
      "  -T <seconds>  bound on one test (60)\n"
      "  -R <rank>     percentile rank of the latency column (50.0)\n"
      "  -f            print only the final row\n"
      "  -m <memory>   host (posix_memalign) | shared (comm::mem_alloc) buffers, both sides (host)\n"
      "  -I            print this side's worker info (counters: how the bytes moved) to stderr\n"
      "                when the test ends; the server takes it too\n"
      "  -h, --help    show this help\n\n"
      "  The server must be listening when the client starts: a client that finds nobody at the\n"
      "  port fails at once (connection refused).\n\n"
      "  Transports and thresholds come from COMM_TLS, COMM_SHORT_THRESH, ... (see README).\n");
}

/// Parses argv into options; exits for -h.
options parse_options(int argc, char** argv) {
  options o;
  int c;
  static const option long_options[] = {
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  while ((c = getopt_long(argc, argv, "t:s:n:w:c:p:W:O:T:R:m:fIh", long_options, nullptr)) != -1) {
    switch (c) {
      case 't': o.test = parse_test(optarg); break;
      case 's': o.size = parse_number('s', optarg, 1, max_size); break;
      case 'n': o.iters = parse_number('n', optarg, 1, 1ull << 40); break;
      case 'w': o.warmup = parse_number('w', optarg, 0, 1ull << 40); break;
      case 'c': o.core = static_cast<int>(parse_number('c', optarg, 0, CPU_SETSIZE - 1)); break;
      case 'p': o.port = static_cast<uint16_t>(parse_number('p', optarg, 1, 65535)); break;
      case 'W':
      case 'O':
        o.window = static_cast<uint32_t>(parse_number(static_cast<char>(c), optarg, 1, 65536));
        break;
      case 'T': o.timeout_s = static_cast<uint32_t>(parse_number('T', optarg, 1, 86400)); break;
      case 'R': o.rank = std::strtod(optarg, nullptr); break;
      case 'f': o.final_only = true; break;
      case 'I': o.info = true; break;
      case 'm': o.memory = parse_memory(optarg); break;
      case 'h': usage(stdout); std::exit(0);
      default: usage(stderr); std::exit(2);
    }
  }
  if (o.rank <= 0.0 || o.rank > 100.0) fail("-R: rank must be in (0, 100]");
  if (optind < argc) o.server_host = argv[optind++];
  if (optind < argc) fail("unexpected argument '%s'", argv[optind]);
  if (o.window == 0) o.window = default_window(o.test);
  return o;
}

/// Pins the calling thread to `core` (no-op for -1).
void pin_to_core(int core) {
  if (core < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    fail("sched_setaffinity(core %d): %s", core, std::strerror(errno));
}

// -- time -----------------------------------------------------------------------------------------

/// A cheap monotonic tick counter (TSC on x86, steady_clock elsewhere) calibrated to microseconds.
class ticker {
public:
  /// Calibrates the tick rate against steady_clock over about 20 ms.
  ticker() {
    auto t0 = steady::now();
    uint64_t c0 = now();
    while (steady::now() - t0 < std::chrono::milliseconds(20)) {}
    uint64_t c1 = now();
    double us = std::chrono::duration<double, std::micro>(steady::now() - t0).count();
    per_us_ = static_cast<double>(c1 - c0) / us;
    if (per_us_ <= 0.0) per_us_ = 1.0;
  }

  /// The current tick.
  static uint64_t now() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return __rdtsc();
#else
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               steady::now().time_since_epoch()).count();
#endif
  }

  /// Ticks per microsecond.
  double per_us() const noexcept { return per_us_; }
  /// Converts ticks to microseconds.
  double to_us(uint64_t ticks) const noexcept { return static_cast<double>(ticks) / per_us_; }

private:
  double per_us_ = 1.0;
};

/// A deadline checked cheaply from busy loops: steady_clock is read once every 1024 polls.
class deadline {
public:
  /// Expires `seconds` from now.
  explicit deadline(uint32_t seconds) : end_(steady::now() + std::chrono::seconds(seconds)) {}

  /// True once the deadline passed.
  bool expired() noexcept {
    if ((++polls_ & 1023u) != 0) return false;
    return steady::now() >= end_;
  }

private:
  steady::time_point end_;
  uint64_t polls_ = 0;
};

// -- bootstrap socket -----------------------------------------------------------------------------

/// An owned file descriptor.
class fd_guard {
public:
  explicit fd_guard(int fd = -1) : fd_(fd) {}
  ~fd_guard() { if (fd_ >= 0) ::close(fd_); }
  fd_guard(fd_guard&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  fd_guard& operator=(fd_guard&&) = delete;
  /// The descriptor.
  int get() const noexcept { return fd_; }

private:
  int fd_;
};

/// Waits up to `timeout_ms` for `events` on `fd`; fails on timeout or error.
void wait_fd(int fd, short events, int timeout_ms, const char* what) {
  pollfd p{fd, events, 0};
  int n;
  do {
    n = ::poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (n == 0) fail("%s: timed out after %d ms", what, timeout_ms);
  if (n < 0) fail("%s: poll: %s", what, std::strerror(errno));
}

/// Writes all `length` bytes to the bootstrap socket.
void send_all(int fd, const void* data, size_t length) {
  auto* p = static_cast<const char*>(data);
  while (length > 0) {
    wait_fd(fd, POLLOUT, socket_timeout_ms, "bootstrap send");
    ssize_t n = ::send(fd, p, length, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("bootstrap send: %s", std::strerror(errno));
    p += n;
    length -= static_cast<size_t>(n);
  }
}

/// Reads exactly `length` bytes from the bootstrap socket.
void recv_all(int fd, void* data, size_t length) {
  auto* p = static_cast<char*>(data);
  while (length > 0) {
    wait_fd(fd, POLLIN, socket_timeout_ms, "bootstrap receive");
    ssize_t n = ::recv(fd, p, length, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) fail("bootstrap receive: the peer closed the connection");
    if (n < 0) fail("bootstrap receive: %s", std::strerror(errno));
    p += n;
    length -= static_cast<size_t>(n);
  }
}

/// Sends a length-prefixed byte string.
void send_blob(int fd, const std::vector<uint8_t>& blob) {
  uint32_t n = static_cast<uint32_t>(blob.size());
  send_all(fd, &n, sizeof n);
  send_all(fd, blob.data(), blob.size());
}

/// Receives a length-prefixed byte string of at most 64 KiB.
std::vector<uint8_t> recv_blob(int fd) {
  uint32_t n = 0;
  recv_all(fd, &n, sizeof n);
  if (n == 0 || n > 65536) fail("bootstrap: bad address length %u", n);
  std::vector<uint8_t> blob(n);
  recv_all(fd, blob.data(), n);
  return blob;
}

/// Both sides wait until the other reached the same point.
void barrier(int fd) {
  uint8_t token = 0x5a, got = 0;
  send_all(fd, &token, 1);
  recv_all(fd, &got, 1);
  if (got != token) fail("bootstrap: barrier out of step");
}

/// Listens on the loopback interface and accepts one client within accept_timeout_s.
fd_guard accept_client(uint16_t port) {
  fd_guard lsock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (lsock.get() < 0) fail("socket: %s", std::strerror(errno));
  int one = 1;
  ::setsockopt(lsock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(lsock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    fail("bind to port %u: %s", port, std::strerror(errno));
  if (::listen(lsock.get(), 1) != 0) fail("listen: %s", std::strerror(errno));
  std::printf("Waiting for connection...\n");
  std::fflush(stdout);
  wait_fd(lsock.get(), POLLIN, accept_timeout_s * 1000, "waiting for a client");
  sockaddr_in peer{};
  socklen_t len = sizeof peer;
  fd_guard sock(::accept4(lsock.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC));
  if (sock.get() < 0) fail("accept: %s", std::strerror(errno));
  char host[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &peer.sin_addr, host, sizeof host);
  std::printf("Accepted connection from %s:%u\n", host, ntohs(peer.sin_port));
  ::setsockopt(sock.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return sock;
}

/// Connects `fd` to `address` within connect_timeout_s; 0, or the errno of the failure (a refusal
/// is ECONNREFUSED at once, a host that does not answer ETIMEDOUT).
int connect_within(int fd, const sockaddr* address, socklen_t length) {
  if (::connect(fd, address, length) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  pollfd p{fd, POLLOUT, 0};
  int n;
  do {
    n = ::poll(&p, 1, connect_timeout_s * 1000);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return ETIMEDOUT;
  int error = 0;
  socklen_t size = sizeof error;
  if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return errno;
  return error;
}

/// Connects to the server once: fails at once when nobody listens (the server must be started
/// first, as with ucx_perftest), within connect_timeout_s when its host does not answer.
fd_guard connect_server(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) fail("cannot resolve '%s': %s", host.c_str(), ::gai_strerror(rc));
  int error = 0;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd_guard sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                           ai->ai_protocol));
    if (sock.get() < 0) {
      error = errno;
      continue;
    }
    error = connect_within(sock.get(), ai->ai_addr, ai->ai_addrlen);
    if (error != 0) continue;
    ::freeaddrinfo(res);
    const int flags = ::fcntl(sock.get(), F_GETFL);
    ::fcntl(sock.get(), F_SETFL, flags & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(sock.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return sock;
  }
  ::freeaddrinfo(res);
  fail("cannot connect to %s:%u: %s%s", host.c_str(), port, std::strerror(error),
       error == ECONNREFUSED ? " (is a comm_perftest server running on that port?)" : "");
}

/// Test parameters the client sends to the server.
struct wire_params {
  uint32_t magic = 0x434f4d50;  ///< "COMP"
  uint32_t test = 0;
  uint64_t size = 0;
  uint64_t iters = 0;
  uint64_t warmup = 0;
  uint32_t window = 0;
  uint32_t timeout_s = 0;
  uint32_t memory = 0;
  uint32_t reserved = 0;
};

/// Copies the test parameters of `o` into their wire form.
wire_params to_wire(const options& o) {
  wire_params p;
  p.test = static_cast<uint32_t>(o.test);
  p.size = o.size;
  p.iters = o.iters;
  p.warmup = o.warmup;
  p.window = o.window;
  p.timeout_s = o.timeout_s;
  p.memory = static_cast<uint32_t>(o.memory);
  return p;
}

/// Checks parameters received from a client and applies them to `o`.
void apply_wire(const wire_params& p, options& o) {
  if (p.magic != wire_params{}.magic) fail("bootstrap: the client is not comm_perftest");
  if (p.test < 1 || p.test > static_cast<uint32_t>(test_kind::stream_bw))
    fail("bootstrap: unknown test %u", p.test);
  if (p.size == 0 || p.size > max_size || p.iters == 0 || p.window == 0 || p.timeout_s == 0 ||
      p.memory > static_cast<uint32_t>(memory_kind::shared))
    fail("bootstrap: bad test parameters");
  o.test = static_cast<test_kind>(p.test);
  o.size = p.size;
  o.iters = p.iters;
  o.warmup = p.warmup;
  o.window = p.window;
  o.timeout_s = p.timeout_s;
  o.memory = static_cast<memory_kind>(p.memory);
}

// -- output ---------------------------------------------------------------------------------------

/// Prints ucx_perftest's table header; bandwidth tests show per-message overhead.
void print_table_header(bool latency, bool final_only, double rank) {
  const char* sep =
      "+--------------+--------------+----------+---------+---------+----------+----------+"
      "-----------+-----------+\n";
  std::printf("+--------------+--------------+------------------------------+---------------------+"
              "-----------------------+\n");
  std::printf("|              |              |       %s (usec)        |   bandwidth (MB/s)  |"
              "  message rate (msg/s) |\n", latency ? " latency" : "overhead");
  std::printf("%s", sep);
  std::printf("|    %s     | # iterations | %4.1f%%ile | average | overall |  average |  overall |"
              "  average  |  overall  |\n", final_only ? " Test" : "Stage", rank);
  std::printf("%s", sep);
}

/// Prints the server's banner describing the test it serves.
void print_banner(const options& o, const comm::endpoint& ep) {
  const char* line =
      "+----------------------------------------------------------------------------------------"
      "------------------+\n";
  std::printf("%s", line);
  auto row = [](const char* key, const std::string& value) {
    std::printf("| %-14s%-90s|\n", key, value.c_str());
  };
  row("API:", "libcomm");
  row("Test:", test_description(o.test));
  row("Transport:", std::string(ep.transport()));
  row("Message size:", std::to_string(o.size));
  row("Memory:", memory_name(o.memory));
  row("Iterations:", std::to_string(o.iters) + " (+" + std::to_string(o.warmup) + " warm-up)");
  if (!is_pingpong_test(o.test)) row("Window:", std::to_string(o.window));
  std::printf("%s", line);
  std::fflush(stdout);
}

// -- measurement ----------------------------------------------------------------------------------

/// Collects per-iteration times and prints ucx_perftest's periodic and final rows. The per-iteration
/// time of a latency test is half a round trip.
class reporter {
public:
  /// `factor` scales an iteration's ticks to the reported time (0.5 for ping-pong).
  reporter(const ticker& clock, uint64_t size, double factor, double rank, bool final_only)
      : clock_(clock), size_(size), factor_(factor), rank_(rank), final_only_(final_only),
        samples_(sample_count) {}

  /// Starts the measured phase now.
  void start() {
    start_ = last_ = last_report_ = ticker::now();
    report_every_ = static_cast<uint64_t>(clock_.per_us() * 1e6);
  }

  /// Records one iteration that ended at `now`.
  void record(uint64_t now) {
    samples_[count_ % sample_count] = now - last_;
    last_ = now;
    ++count_;
    if (now - last_report_ >= report_every_) report(now, "[thread 0]");
  }

  /// Ends the measured phase at `now` and prints the final row.
  void finish(uint64_t now) {
    last_ = now;
    if (!final_only_) std::printf("Final:");
    report(now, "");
  }

private:
  static constexpr size_t sample_count = 8192;

  /// Microseconds per iteration for `ticks` spent on `iterations`.
  double per_iter_us(uint64_t ticks, uint64_t iterations) const {
    if (iterations == 0) return 0.0;
    return clock_.to_us(ticks) * factor_ / static_cast<double>(iterations);
  }

  /// The `rank_` percentile of the recent per-iteration samples, in microseconds.
  double percentile_us() {
    size_t n = std::min<uint64_t>(count_, sample_count);
    if (n == 0) return 0.0;
    std::vector<uint64_t> v(samples_.begin(), samples_.begin() + static_cast<ptrdiff_t>(n));
    size_t k = std::min(n - 1, static_cast<size_t>(rank_ / 100.0 * static_cast<double>(n)));
    std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
    return clock_.to_us(v[k]) * factor_;
  }

  /// Prints one row and starts a new reporting interval. `label` empty: continue a "Final:" label.
  void report(uint64_t now, const char* label) {
    double moment = per_iter_us(now - last_report_, count_ - last_report_count_);
    double overall = per_iter_us(now - start_, count_);
    if (!final_only_ || *label == '\0') print_row(label, percentile_us(), moment, overall);
    last_report_ = now;
    last_report_count_ = count_;
  }

  /// Prints the columns of one row.
  void print_row(const char* label, double pct, double moment, double overall) const {
    auto mbps = [this](double us) { return us > 0 ? size_ / us / 1.048576 : 0.0; };
    auto rate = [](double us) { return us > 0 ? 1e6 / us : 0.0; };
    int pad = *label == '\0' ? (final_only_ ? 14 : 8) : 14;
    std::printf("%-*s %13" PRIu64 " %10.3f %9.3f %9.3f %11.2f %10.2f %11.0f %11.0f\n", pad, label,
                count_, pct, moment, overall, mbps(moment), mbps(overall), rate(moment),
                rate(overall));
    std::fflush(stdout);
  }

  const ticker& clock_;
  double size_;
  double factor_;
  double rank_;
  bool final_only_;
  std::vector<uint64_t> samples_;
  uint64_t count_ = 0;
  uint64_t start_ = 0, last_ = 0, last_report_ = 0, last_report_count_ = 0;
  uint64_t report_every_ = 0;
};

// -- libcomm side ---------------------------------------------------------------------------------

/// AM ids used by the tests.
constexpr uint16_t am_data_id = 10;
constexpr uint16_t am_ack_id = 11;
/// Tags used by the tests.
constexpr comm::tag_t tag_data = 0xc0ffee01;
constexpr comm::tag_t tag_ack = 0xc0ffee02;

/// A page-aligned buffer (ucx_perftest's buffers are page-aligned too), touched once so that page
/// faults stay out of the measurement: plain heap memory, or comm::mem_alloc's shared memory.
class page_buffer {
public:
  page_buffer() = default;
  ~page_buffer() { comm::mem_free(data_); }
  page_buffer(const page_buffer&) = delete;
  page_buffer& operator=(const page_buffer&) = delete;

  /// Replaces the contents with `size` bytes of `fill`, allocated as `memory` says.
  void assign(size_t size, uint8_t fill, memory_kind memory) {
    comm::mem_free(data_);  // either kind: mem_free hands plain heap blocks to std::free
    data_ = nullptr;
    size_ = 0;
    void* p = nullptr;
    if (memory == memory_kind::shared) {
      p = comm::mem_alloc(size);
    } else if (posix_memalign(&p, 4096, std::max<size_t>(size, 1)) != 0) {
      p = nullptr;
    }
    if (p == nullptr) fail("cannot allocate a %zu-byte buffer", size);
    data_ = static_cast<uint8_t*>(p);
    size_ = size;
    std::memset(data_, fill, std::max<size_t>(size, 1));
  }
  /// The first byte.
  uint8_t* data() const noexcept { return data_; }
  /// Bytes in the buffer.
  size_t size() const noexcept { return size_; }

private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

/// Everything one side of a test uses: worker, endpoint to the peer, buffers, AM counters, and
/// for the RMA tests the registration of this side's receive buffer and the peer's key.
struct session {
  comm::worker* w = nullptr;
  comm::endpoint* ep = nullptr;
  comm::endpoint* stream_rx = nullptr;  ///< where the peer's stream arrives (stream tests)
  page_buffer send_buf;
  page_buffer recv_buf;
  comm::memh* local_reg = nullptr;      ///< registration of recv_buf (RMA tests)
  comm::rkey* remote_key = nullptr;     ///< the peer's recv_buf (RMA tests)
  uint64_t remote_address = 0;          ///< where the peer's recv_buf starts
  volatile uint64_t am_data_count = 0;  ///< AM data messages delivered
  volatile uint64_t am_ack_count = 0;   ///< AM acks delivered
  volatile bool failed = false;         ///< the endpoint reported an error
  comm::status failure = comm::status::ok;
  deadline* limit = nullptr;            ///< bound of the running test
};

/// Counts an AM data message.
comm::status on_am_data(void* arg, const void*, size_t, void*, size_t,
                        const comm::am_recv_params&) {
  auto* s = static_cast<session*>(arg);
  s->am_data_count = s->am_data_count + 1;
  return comm::status::ok;
}

/// Counts an AM acknowledgement.
comm::status on_am_ack(void* arg, const void*, size_t, void*, size_t,
                       const comm::am_recv_params&) {
  auto* s = static_cast<session*>(arg);
  s->am_ack_count = s->am_ack_count + 1;
  return comm::status::ok;
}

/// Marks the session failed when its endpoint fails.
void on_endpoint_error(void* arg, comm::endpoint*, comm::status reason) {
  auto* s = static_cast<session*>(arg);
  s->failure = reason;
  s->failed = true;
}

/// Fails the test if the endpoint failed or the test ran out of time.
inline void check_alive(session& s, const char* where) {
  if (s.failed) fail("%s: endpoint failed: %s", where, comm::to_string(s.failure));
  if (s.limit->expired()) fail("%s: the test did not finish in time", where);
}

/// Busy-polls until `o` completes, then releases its request. Fails on errors.
void complete(session& s, comm::op o, const char* what) {
  if (o.failed()) fail("%s: %s", what, comm::to_string(o.st));
  if (!o.pending()) return;
  comm::status st;
  while ((st = s.w->request_status(o.req)) == comm::status::in_progress) {
    s.w->progress();
    check_alive(s, what);
  }
  s.w->release(o.req);
  if (is_error(st)) fail("%s: %s", what, comm::to_string(st));
}

/// True when `o` has completed, releasing its request; fails on errors.
bool test_op(session& s, comm::op& o, const char* what) {
  if (!o.pending()) {
    if (o.failed()) fail("%s: %s", what, comm::to_string(o.st));
    return true;
  }
  comm::status st = s.w->request_status(o.req);
  if (st == comm::status::in_progress) return false;
  s.w->release(o.req);
  o.req = nullptr;
  o.st = comm::status::ok;
  if (is_error(st)) fail("%s: %s", what, comm::to_string(st));
  return true;
}

/// Busy-polls until the AM counter `counter` reaches `target`.
void wait_count(session& s, volatile uint64_t& counter, uint64_t target, const char* what) {
  while (counter < target) {
    s.w->progress();
    check_alive(s, what);
  }
}

/// A ring of outstanding operations completing in order, at most `capacity` at a time.
class op_window {
public:
  explicit op_window(size_t capacity) : ring_(capacity) {}

  /// Adds an operation; a completed one is not kept.
  void push(session& s, comm::op o, const char* what) {
    if (test_op(s, o, what)) return;
    ring_[(head_ + size_) % ring_.size()] = o;
    ++size_;
  }

  /// True when no more operations fit.
  bool full() const noexcept { return size_ == ring_.size(); }
  /// True when no operation is outstanding.
  bool empty() const noexcept { return size_ == 0; }

  /// Releases the completed operations at the head; returns how many.
  size_t reap(session& s, const char* what) {
    size_t n = 0;
    while (size_ > 0 && test_op(s, ring_[head_], what)) {
      head_ = (head_ + 1) % ring_.size();
      --size_;
      ++n;
    }
    return n;
  }

  /// Busy-polls until at least one slot is free.
  void make_room(session& s, const char* what) {
    while (full()) {
      s.w->progress();
      reap(s, what);
      if (full()) check_alive(s, what);
    }
  }

  /// Busy-polls until every operation completed.
  void drain(session& s, const char* what) {
    while (size_ > 0) {
      s.w->progress();
      reap(s, what);
      if (size_ > 0) check_alive(s, what);
    }
  }

private:
  std::vector<comm::op> ring_;
  size_t head_ = 0;
  size_t size_ = 0;
};

/// Sends one tagged message or active message of the test's kind.
comm::op send_one(session& s, bool am, const void* buf, size_t size, comm::tag_t tag, uint16_t id) {
  if (am) return s.ep->am_send(id, nullptr, 0, buf, size);
  return s.ep->tag_send(tag, buf, size);
}

// -- the tests ------------------------------------------------------------------------------------

/// Ping-pong client of tag_lat / am_lat: send, wait for the reply; reports RTT/2.
void run_latency_client(session& s, const options& o, reporter& rep) {
  bool am = o.test == test_kind::am_lat;
  const uint64_t total = o.warmup + o.iters;
  for (uint64_t i = 0; i < total; ++i) {
    if (i == o.warmup) rep.start();
    if (am) {
      uint64_t expect = s.am_data_count + 1;
      complete(s, send_one(s, true, s.send_buf.data(), o.size, 0, am_data_id), "am_send");
      wait_count(s, s.am_data_count, expect, "am_lat reply");
    } else {
      // As ucx_perftest does: send, then post the receive for the reply (a reply that comes
      // first waits in the unexpected queue), so posting is off the round trip's critical path.
      comm::op snd = s.ep->tag_send(tag_data, s.send_buf.data(), o.size);
      comm::op r = s.w->tag_recv(s.recv_buf.data(), o.size, tag_data, comm::tag_mask_full);
      complete(s, r, "tag_lat reply");
      complete(s, snd, "tag_send");
    }
    if (i >= o.warmup) rep.record(ticker::now());
  }
  rep.finish(ticker::now());
}

/// Ping-pong server of tag_lat / am_lat: wait for a message, answer it.
void run_latency_server(session& s, const options& o) {
  bool am = o.test == test_kind::am_lat;
  const uint64_t total = o.warmup + o.iters;
  for (uint64_t i = 0; i < total; ++i) {
    if (am) {
      wait_count(s, s.am_data_count, i + 1, "am_lat ping");
    } else {
      complete(s, s.w->tag_recv(s.recv_buf.data(), o.size, tag_data, comm::tag_mask_full),
               "tag_lat ping");
    }
    complete(s, send_one(s, am, s.send_buf.data(), o.size, tag_data, am_data_id), "reply");
  }
}

/// Streams `count` messages with a window of outstanding sends, then waits for the server's ack.
void stream_phase(session& s, const options& o, uint64_t count, reporter* rep) {
  bool am = o.test == test_kind::am_bw;
  op_window win(o.window);
  uint64_t acks = s.am_ack_count;
  comm::op ack{};
  if (!am) ack = s.w->tag_recv(s.recv_buf.data(), 0, tag_ack, comm::tag_mask_full);
  if (rep) rep->start();
  for (uint64_t i = 0; i < count; ++i) {
    win.make_room(s, "send window");
    win.push(s, send_one(s, am, s.send_buf.data(), o.size, tag_data, am_data_id), "send");
    if (!win.empty() || (i & 15) == 0) {
      s.w->progress();
      win.reap(s, "send");
    }
    if (rep) rep->record(ticker::now());
  }
  win.drain(s, "send completion");
  if (am) wait_count(s, s.am_ack_count, acks + 1, "final ack");
  else complete(s, ack, "final ack");
  if (rep) rep->finish(ticker::now());
}

/// Receives `count` tagged messages with up to `window` receives posted.
void receive_tagged(session& s, const options& o, uint64_t count) {
  op_window win(o.window);
  uint64_t posted = 0;
  while (posted < count) {
    win.make_room(s, "receive window");
    win.push(s, s.w->tag_recv(s.recv_buf.data(), o.size, tag_data, comm::tag_mask_full),
             "tag_recv");
    ++posted;
  }
  win.drain(s, "tag_recv completion");
}

/// Bandwidth server: receives one phase of `count` messages, then acknowledges it.
void sink_phase(session& s, const options& o, uint64_t count, uint64_t& am_seen) {
  if (o.test == test_kind::am_bw) {
    am_seen += count;
    wait_count(s, s.am_data_count, am_seen, "am_bw receive");
    complete(s, send_one(s, true, nullptr, 0, 0, am_ack_id), "ack");
  } else {
    receive_tagged(s, o, count);
    complete(s, s.ep->tag_send(tag_ack, nullptr, 0), "ack");
  }
}

// -- RMA tests ------------------------------------------------------------------------------------

/// Issues `count` puts (put_bw) or gets (get) of the test's size into / from the peer's registered
/// buffer with up to o.window outstanding, then flushes the endpoint; times the phase when `rep` is
/// set. With a window of 1 each operation completes before the next starts, so the per-iteration
/// time is the operation's latency (ucx_perftest's ucp_get).
void rma_phase(session& s, const options& o, uint64_t count, reporter* rep) {
  const bool put = o.test == test_kind::put_bw;
  const char* what = put ? "put" : "get";
  comm::iov_entry local{put ? s.send_buf.data() : s.recv_buf.data(), o.size};
  op_window win(o.window);
  if (rep) rep->start();
  for (uint64_t i = 0; i < count; ++i) {
    win.make_room(s, what);
    win.push(s,
             put ? s.ep->put(&local, 1, s.remote_address, s.remote_key)
                 : s.ep->get(&local, 1, s.remote_address, s.remote_key),
             what);
    if (o.window == 1) {
      win.drain(s, what);
    } else if (!win.empty()) {
      s.w->progress();
      win.reap(s, what);
    }
    check_alive(s, what);
    if (rep) rep->record(ticker::now());
  }
  win.drain(s, what);
  complete(s, s.ep->flush(), "flush");
  if (rep) rep->finish(ticker::now());
}

/// The sequence number of ping-pong iteration `i`, carried in the last byte of a put: 1..255, so
/// never the buffers' initial 0 and never the previous iteration's number.
uint8_t psn(uint64_t i) { return static_cast<uint8_t>(i % 255 + 1); }

/// Busy-polls until the last byte of this side's registered buffer holds `sn`, i.e. the peer's put
/// of that iteration landed. As in ucx_perftest, a put is taken to write its bytes in order (true
/// of shm's CMA and self's memcpy), so the rest of the message is there as well.
void wait_psn(session& s, size_t size, uint8_t sn, const char* what) {
  std::atomic_ref<uint8_t> last(s.recv_buf.data()[size - 1]);
  while (last.load(std::memory_order_acquire) != sn) {
    s.w->progress();
    check_alive(s, what);
  }
}

/// Puts the send buffer, its last byte set to `sn`, into the peer's registered buffer and waits
/// until the put completed (the data is in the peer's memory).
void put_psn(session& s, size_t size, uint8_t sn) {
  s.send_buf.data()[size - 1] = sn;
  comm::iov_entry local{s.send_buf.data(), size};
  complete(s, s.ep->put(&local, 1, s.remote_address, s.remote_key), "put");
}

/// put_lat client (ucx_perftest's ucp_put_lat): put, wait for the server's put back; reports
/// RTT/2.
void run_put_latency_client(session& s, const options& o, reporter& rep) {
  const uint64_t total = o.warmup + o.iters;
  for (uint64_t i = 0; i < total; ++i) {
    if (i == o.warmup) rep.start();
    put_psn(s, o.size, psn(i));
    wait_psn(s, o.size, psn(i), "put_lat reply");
    if (i >= o.warmup) rep.record(ticker::now());
  }
  rep.finish(ticker::now());
}

/// put_lat server: wait for the client's put, put back.
void run_put_latency_server(session& s, const options& o) {
  const uint64_t total = o.warmup + o.iters;
  for (uint64_t i = 0; i < total; ++i) {
    wait_psn(s, o.size, psn(i), "put_lat ping");
    put_psn(s, o.size, psn(i));
  }
}

// -- stream tests ---------------------------------------------------------------------------------

/// The endpoint the peer's stream arrives on: found by polling once its first bytes came.
comm::endpoint* stream_source(session& s, const char* what) {
  while (s.stream_rx == nullptr) {
    comm::stream_poll_entry ready;
    if (s.w->stream_poll(&ready, 1) == 1) {
      s.stream_rx = ready.ep;
      break;
    }
    s.w->progress();
    check_alive(s, what);
  }
  return s.stream_rx;
}

/// A wait-all receive of `size` stream bytes on `ep` into the receive buffer.
comm::op stream_recv_all(session& s, comm::endpoint* ep, size_t size) {
  comm::request_params p;
  p.flags = comm::request_stream_waitall;
  return ep->stream_recv(s.recv_buf.data(), size, nullptr, p);
}

/// stream_lat client: send `size` bytes of the stream, receive the server's `size` back (on our
/// own endpoint: the server answers on its partner of it); reports RTT/2.
void run_stream_latency_client(session& s, const options& o, reporter& rep) {
  const uint64_t total = o.warmup + o.iters;
  for (uint64_t i = 0; i < total; ++i) {
    if (i == o.warmup) rep.start();
    comm::op snd = s.ep->stream_send(s.send_buf.data(), o.size);
    complete(s, stream_recv_all(s, s.ep, o.size), "stream_lat reply");
    complete(s, snd, "stream_send");
    if (i >= o.warmup) rep.record(ticker::now());
  }
  rep.finish(ticker::now());
}

/// stream_lat server: receive `size` bytes, answer with as many on the same endpoint.
void run_stream_latency_server(session& s, const options& o) {
  comm::endpoint* rx = stream_source(s, "stream_lat first ping");
  const uint64_t total = o.warmup + o.iters;
  for (uint64_t i = 0; i < total; ++i) {
    complete(s, stream_recv_all(s, rx, o.size), "stream_lat ping");
    complete(s, rx->stream_send(s.send_buf.data(), o.size), "stream reply");
  }
}

/// stream_bw client: `count` sends of `size` bytes with a window of outstanding sends, then waits
/// for the server's one-byte acknowledgement.
void stream_bw_phase(session& s, const options& o, uint64_t count, reporter* rep) {
  op_window win(o.window);
  if (rep) rep->start();
  for (uint64_t i = 0; i < count; ++i) {
    win.make_room(s, "stream send window");
    win.push(s, s.ep->stream_send(s.send_buf.data(), o.size), "stream_send");
    if (!win.empty() || (i & 15) == 0) {
      s.w->progress();
      win.reap(s, "stream_send");
    }
    if (rep) rep->record(ticker::now());
  }
  win.drain(s, "stream_send completion");
  complete(s, stream_recv_all(s, s.ep, 1), "final ack");
  if (rep) rep->finish(ticker::now());
}

/// stream_bw server: `count` wait-all receives of `size` bytes with up to `window` posted, then
/// the acknowledgement.
void stream_sink_phase(session& s, const options& o, uint64_t count) {
  comm::endpoint* rx = stream_source(s, "stream_bw first bytes");
  op_window win(o.window);
  for (uint64_t posted = 0; posted < count; ++posted) {
    win.make_room(s, "stream receive window");
    win.push(s, stream_recv_all(s, rx, o.size), "stream_recv");
  }
  win.drain(s, "stream_recv completion");
  complete(s, rx->stream_send(s.send_buf.data(), 1), "ack");
}

// -- dispatch -------------------------------------------------------------------------------------

/// Runs the client's side of the test selected in `o`.
void run_client_test(session& s, const options& o, const ticker& clock) {
  const bool pingpong = is_pingpong_test(o.test);
  reporter rep(clock, o.size, pingpong ? 0.5 : 1.0, o.rank, o.final_only);
  print_table_header(shows_latency(o.test), o.final_only, o.rank);
  switch (o.test) {
    case test_kind::tag_lat:
    case test_kind::am_lat:
      run_latency_client(s, o, rep);
      return;
    case test_kind::stream_lat:
      run_stream_latency_client(s, o, rep);
      return;
    case test_kind::stream_bw:
      if (o.warmup > 0) stream_bw_phase(s, o, o.warmup, nullptr);
      stream_bw_phase(s, o, o.iters, &rep);
      return;
    case test_kind::put_lat:
      run_put_latency_client(s, o, rep);
      return;
    case test_kind::put_bw:
    case test_kind::get:
      if (o.warmup > 0) rma_phase(s, o, o.warmup, nullptr);
      rma_phase(s, o, o.iters, &rep);
      // The server only progresses; this tells it the test is over.
      complete(s, s.ep->tag_send(tag_ack, nullptr, 0), "end of test");
      return;
    case test_kind::tag_bw:
    case test_kind::am_bw:
      if (o.warmup > 0) stream_phase(s, o, o.warmup, nullptr);
      stream_phase(s, o, o.iters, &rep);
      return;
  }
}

/// Runs the server's side of the test selected in `o`.
void run_server_test(session& s, const options& o) {
  switch (o.test) {
    case test_kind::tag_lat:
    case test_kind::am_lat:
      run_latency_server(s, o);
      return;
    case test_kind::stream_lat:
      run_stream_latency_server(s, o);
      return;
    case test_kind::stream_bw:
      if (o.warmup > 0) stream_sink_phase(s, o, o.warmup);
      stream_sink_phase(s, o, o.iters);
      return;
    case test_kind::put_lat:
      run_put_latency_server(s, o);
      return;
    case test_kind::put_bw:
    case test_kind::get:
      // One-sided: progress (as ucx_perftest's responder does) until the client is done.
      complete(s, s.w->tag_recv(s.send_buf.data(), 0, tag_ack, comm::tag_mask_full),
               "end of test");
      return;
    case test_kind::tag_bw:
    case test_kind::am_bw: {
      uint64_t am_seen = 0;
      if (o.warmup > 0) sink_phase(s, o, o.warmup, am_seen);
      sink_phase(s, o, o.iters, am_seen);
      return;
    }
  }
}

// -- set-up and teardown --------------------------------------------------------------------------

/// Exchanges packed worker addresses over the bootstrap socket (the client sends first) and
/// connects an endpoint to the peer.
void connect_peer(session& s, int sock, bool client) {
  std::vector<uint8_t> mine = s.w->address();
  std::vector<uint8_t> theirs;
  if (client) {
    send_blob(sock, mine);
    theirs = recv_blob(sock);
  } else {
    theirs = recv_blob(sock);
    send_blob(sock, mine);
  }
  comm::status st = s.w->connect(theirs, &s.ep);
  if (st != comm::status::ok) fail("connect to the peer worker: %s", comm::to_string(st));
  s.ep->set_error_handler(on_endpoint_error, &s);
}

/// Installs the AM handlers and allocates the buffers for the test.
void prepare(session& s, const options& o) {
  auto check = [](comm::status st) {
    if (st != comm::status::ok) fail("set_am_handler: %s", comm::to_string(st));
  };
  const unsigned flags = comm::am_flag_whole_msg | comm::am_flag_fetch_rndv;
  check(s.w->set_am_handler(am_data_id, on_am_data, &s, flags));
  check(s.w->set_am_handler(am_ack_id, on_am_ack, &s, flags));
  s.send_buf.assign(o.size, 0xa5, o.memory);
  s.recv_buf.assign(o.size, 0, o.memory);
}

/// Remote-key message of the bootstrap: the sender's registration status, then (when ok) the
/// address of its registered buffer and the packed key.
struct wire_key {
  int32_t status = 0;     ///< comm::status of mem_map/rkey_pack
  uint32_t length = 0;    ///< bytes of packed key that follow
  uint64_t address = 0;   ///< start of the registered buffer
};

/// Registers this side's receive buffer and sends its key to the peer (or the error, so that the
/// peer fails with the reason rather than a closed socket).
void send_key(session& s, int sock) {
  std::vector<uint8_t> packed;
  comm::status st = s.w->mem_map(s.recv_buf.data(), s.recv_buf.size(), &s.local_reg);
  if (st == comm::status::ok) st = s.w->rkey_pack(s.local_reg, packed);
  if (st == comm::status::ok && (packed.empty() || packed.size() > 65536))
    st = comm::status::invalid_param;
  wire_key k;
  k.status = static_cast<int32_t>(st);
  if (st == comm::status::ok) {
    k.length = static_cast<uint32_t>(packed.size());
    k.address = reinterpret_cast<uintptr_t>(s.recv_buf.data());
  }
  send_all(sock, &k, sizeof k);
  if (k.length > 0) send_all(sock, packed.data(), packed.size());
  if (st != comm::status::ok) fail("registering the buffer: %s", comm::to_string(st));
}

/// Receives the peer's key and unpacks it for this side's endpoint.
void receive_key(session& s, int sock) {
  wire_key k;
  recv_all(sock, &k, sizeof k);
  auto st = static_cast<comm::status>(k.status);
  if (st != comm::status::ok) fail("the peer could not register its buffer: %s", comm::to_string(st));
  if (k.length == 0 || k.length > 65536) fail("bootstrap: bad remote key length %u", k.length);
  std::vector<uint8_t> packed(k.length);
  recv_all(sock, packed.data(), packed.size());
  st = s.ep->rkey_unpack(packed.data(), packed.size(), &s.remote_key);
  if (st != comm::status::ok)
    fail("rkey_unpack on transport %s: %s", std::string(s.ep->transport()).c_str(),
         comm::to_string(st));
  s.remote_address = k.address;
}

/// RMA tests: the server's buffer is the target of the client's puts and gets; for put_lat the
/// client's buffer is the target of the server's puts as well.
void exchange_keys(session& s, const options& o, int sock, bool client) {
  if (!is_rma_test(o.test)) return;
  const bool both = o.test == test_kind::put_lat;
  if (client) {
    receive_key(s, sock);
    if (both) send_key(s, sock);
  } else {
    send_key(s, sock);
    if (both) receive_key(s, sock);
  }
}

/// Closes the endpoint (bounded), after both sides finished the test; releases the keys first and
/// the registration last, when the peer can no longer use it.
void close_peer(session& s, int sock) {
  barrier(sock);
  if (s.remote_key != nullptr) {
    s.ep->rkey_destroy(s.remote_key);
    s.remote_key = nullptr;
  }
  comm::status st = s.w->wait(s.ep->close(), 5000);
  if (st != comm::status::ok && st != comm::status::connection_reset)
    std::fprintf(stderr, "comm_perftest: closing the endpoint: %s\n", comm::to_string(st));
  s.ep = nullptr;
  barrier(sock);
  if (s.local_reg != nullptr) {
    st = s.w->mem_unmap(s.local_reg);
    s.local_reg = nullptr;
    if (st != comm::status::ok)
      std::fprintf(stderr, "comm_perftest: mem_unmap: %s\n", comm::to_string(st));
  }
}

/// Creates the worker of one side.
std::unique_ptr<comm::worker> make_worker(comm::context& ctx, const options& o, const char* role) {
  comm::worker_params wp;
  wp.name = std::string("perftest-") + role;
  wp.wakeup = false;
  if (o.core >= 0) wp.cpus = {o.core};
  auto made = comm::worker::create(ctx, wp);
  if (!made) fail("cannot create a worker: %s", comm::to_string(made.error()));
  return std::move(*made);
}

/// The server: accept one client, run its test, exit.
void run_server(options o) {
  fd_guard sock = accept_client(o.port);
  wire_params p;
  recv_all(sock.get(), &p, sizeof p);
  apply_wire(p, o);
  comm::context ctx;
  auto w = make_worker(ctx, o, "server");
  session s;
  s.w = w.get();
  prepare(s, o);
  connect_peer(s, sock.get(), false);
  exchange_keys(s, o, sock.get(), false);
  print_banner(o, *s.ep);
  deadline limit(o.timeout_s);
  s.limit = &limit;
  barrier(sock.get());
  run_server_test(s, o);
  if (o.info) s.w->print_info(stderr);
  close_peer(s, sock.get());
}

/// The client: connect to the server, run the test, print the table.
void run_client(const options& o) {
  ticker clock;
  fd_guard sock = connect_server(o.server_host, o.port);
  wire_params p = to_wire(o);
  send_all(sock.get(), &p, sizeof p);
  comm::context ctx;
  auto w = make_worker(ctx, o, "client");
  session s;
  s.w = w.get();
  prepare(s, o);
  connect_peer(s, sock.get(), true);
  exchange_keys(s, o, sock.get(), true);
  deadline limit(o.timeout_s);
  s.limit = &limit;
  barrier(sock.get());
  run_client_test(s, o, clock);
  if (o.info) s.w->print_info(stderr);
  close_peer(s, sock.get());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    options o = parse_options(argc, argv);
    pin_to_core(o.core);
    if (o.server_host.empty())
      run_server(o);
    else
      run_client(o);
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "comm_perftest: error: %s\n", e.what());
    return 1;
  }
}
