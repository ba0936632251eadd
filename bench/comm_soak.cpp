// comm_soak: a libcomm listener and an actor node under attack, with a good client of each
// measuring what a user would see. Prints one row a second and writes it to <out>/soak.dat, then
// plots it (<out>/soak.png, with gnuplot), so a regression in fds, memory or latency shows.
//
//   comm_soak [-t seconds] [-o dir] [-a attacks] [-n half_open]
//
// Two server processes (forked first, so no threads exist yet):
//   - the listener server: a worker listening on 127.0.0.1, accepting every request, echoing
//     active messages (id 1) back on the reply endpoint (id 2);
//   - the node server: an actor node listening on 127.0.0.1 that publishes an echo actor.
// The attacks (threads of this process, all on loopback, all bounded by the duration; -a picks a
// comma-separated subset, default all; -a none measures the good clients alone, the baseline):
//   garbage   connections to both ports that send random bytes and close (about 200 a second);
//   halfopen  up to -n connections to both ports (default 1000) that send nothing or half a frame
//             and stay open, the oldest replaced by new ones (about 200 a second);
//   churn     libcomm clients that connect to both servers and close again, as fast as they can
//             (the node rejects a plain libcomm client);
//   hostile   a libcomm client that floods the listener server with unexpected tagged messages,
//             and a fake node that speaks the node protocol: frames far out of order, messages for
//             actors that do not exist, long lookups; reconnecting when the node closes it.
// The good clients: a libcomm client with one endpoint doing an AM round trip every 50 ms plus a
// new connection every second (connect + first round trip), and an actor client doing a request to
// the echo actor every 50 ms. Each row: time, each server's descriptors and resident memory, the
// good clients' median and worst latency in that second and their failures, and attack counts.
// Exit status 1 when a server died or a good client had no success in the last 5 seconds.
#include <comm/actors/node.hpp>
#include <comm/context.hpp>
#include <comm/endpoint.hpp>
#include <comm/listener.hpp>
#include <comm/log.hpp>
#include <comm/worker.hpp>

#include "frame.hpp"

#include <caf/all.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// The command line.
struct options {
  int seconds = 60;
  std::string out = "soak";
  std::set<std::string> attacks = {"garbage", "halfopen", "churn", "hostile"};
  size_t half_open = 1000;
};

/// Set by SIGTERM (servers) or at the end of the run (this process): every loop ends.
std::atomic<bool> stopping{false};

/// SIGTERM handler of the servers.
void on_term(int) { stopping = true; }

// -- servers ---------------------------------------------------------------------------------------

constexpr uint16_t echo_request = 1;
constexpr uint16_t echo_reply = 2;

/// The listener server's AM handler: sends the data back on the reply endpoint.
comm::status echo(void* arg, const void*, size_t, void* data, size_t length,
                  const comm::am_recv_params& params) {
  if (!(params.attr & comm::am_recv_reply_ep) || params.reply_ep == nullptr) {
    return comm::status::ok;
  }
  comm::op o = params.reply_ep->am_send(echo_reply, nullptr, 0, data, length);
  if (o.pending()) static_cast<comm::worker*>(arg)->release(o.req);
  return comm::status::ok;
}

/// The listener server's state: its worker and the endpoints that failed (their peer closed or
/// died), which it closes as a server must, outside the callback that reported them.
struct listener_state {
  std::unique_ptr<comm::worker> w;
  std::vector<comm::endpoint*> failed;
};

/// Queues a failed endpoint for closing.
void on_server_ep_error(void* arg, comm::endpoint* ep, comm::status) {
  static_cast<listener_state*>(arg)->failed.push_back(ep);
}

/// Accepts every connection request.
void accept_all(void* arg, comm::conn_request* request) {
  auto* s = static_cast<listener_state*>(arg);
  comm::endpoint_params params;
  params.on_error = on_server_ep_error;
  params.error_arg = s;
  comm::endpoint* ep = nullptr;
  (void)s->w->accept(request, params, &ep);
}

/// The listener server: runs until SIGTERM, writes its port to `report`.
[[noreturn]] void listener_server(int report) {
  comm::context ctx;
  listener_state s;
  s.w = comm::worker::create(ctx).value();
  comm::worker& w = *s.w;
  w.set_am_handler(echo_request, echo, &w);
  comm::listener_params lp;
  lp.address = "127.0.0.1:0";
  lp.on_request = accept_all;
  lp.arg = &s;
  std::unique_ptr<comm::listener> l;
  if (w.listen(lp, &l) != comm::status::ok) std::_Exit(2);
  const std::string port = std::to_string(l->port()) + "\n";
  (void)!::write(report, port.data(), port.size());
  while (!stopping) {
    w.progress();
    for (comm::endpoint* ep : std::exchange(s.failed, {})) {
      comm::op o = ep->close();
      if (o.pending()) w.release(o.req);
    }
    (void)w.wait(10);
  }
  std::_Exit(0);
}

/// The node server: publishes "echo", runs until SIGTERM, writes its address to `report`.
[[noreturn]] void node_server(int report) {
  caf::actor_system_config cfg;
  comm::actors::node::load(cfg);
  {
    caf::actor_system sys{cfg};
    auto& node = *comm::actors::node::get(sys);
    auto echo_actor = sys.spawn([]() -> caf::behavior {
      return {[](const std::string& s) { return s; }};
    });
    if (node.publish(echo_actor, "echo")) std::_Exit(2);
    const std::string address = node.address() + "\n";
    (void)!::write(report, address.data(), address.size());
    while (!stopping) std::this_thread::sleep_for(50ms);
    caf::anon_send_exit(echo_actor, caf::exit_reason::user_shutdown);
  }
  std::_Exit(0);
}

/// Forks `body`, returns its pid and the first line it reports.
pid_t start_server(void (*body)(int), std::string* line) {
  int fds[2];
  if (::pipe(fds) != 0) std::exit(2);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGTERM, on_term);
    body(fds[1]);
  }
  ::close(fds[1]);
  char buf[128] = {};
  ssize_t n = ::read(fds[0], buf, sizeof(buf) - 1);
  ::close(fds[0]);
  if (n <= 0) {
    std::fprintf(stderr, "a server did not start\n");
    std::exit(2);
  }
  *line = std::string(buf, static_cast<size_t>(n));
  line->erase(line->find('\n'));
  return pid;
}

/// The port of "ip:port".
uint16_t port_of(const std::string& address) {
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

// -- measurements ----------------------------------------------------------------------------------

/// Latencies and failures of one good client in the current second.
struct probe {
  std::mutex mtx;
  std::vector<double> us;
  uint64_t failures = 0;
  clock_type::time_point last_success = clock_type::now();

  void ok(double micros) {
    std::lock_guard<std::mutex> g(mtx);
    us.push_back(micros);
    last_success = clock_type::now();
  }
  void failed() {
    std::lock_guard<std::mutex> g(mtx);
    ++failures;
  }
  /// Median and worst of the second (-1 without a sample), failures; clears them.
  void take(double* median, double* worst, uint64_t* fails, double* idle_s) {
    std::lock_guard<std::mutex> g(mtx);
    std::sort(us.begin(), us.end());
    *median = us.empty() ? -1 : us[us.size() / 2];
    *worst = us.empty() ? -1 : us.back();
    *fails = failures;
    *idle_s = std::chrono::duration<double>(clock_type::now() - last_success).count();
    us.clear();
    failures = 0;
  }
};

probe comm_rtt, comm_connect, actor_rtt;
std::atomic<uint64_t> garbage_sent{0}, half_open_made{0}, churned{0}, hostile_frames{0};

/// Open descriptors of process `pid`.
size_t fd_count(pid_t pid) {
  size_t n = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

/// Resident memory of process `pid` in MB, or -1.
double rss_mb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

/// True while child `pid` has not exited.
bool alive(pid_t pid) { return ::waitpid(pid, nullptr, WNOHANG) == 0; }

// -- raw sockets -----------------------------------------------------------------------------------

/// A plain TCP connection to `port` on loopback, or -1.
int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  const linger reset{1, 0};  // close() resets: no TIME_WAIT piling up on the ports
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// True until `end` or the end of the run.
bool running(clock_type::time_point end) { return !stopping && clock_type::now() < end; }

/// The garbage attack: connect, send random bytes, close.
void garbage(std::vector<uint16_t> ports, clock_type::time_point end) {
  std::mt19937 rng(1);
  std::vector<uint8_t> bytes(2048);
  for (size_t i = 0; running(end); ++i) {
    const int fd = raw_connect(ports[i % ports.size()]);
    if (fd >= 0) {
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      (void)::send(fd, bytes.data(), 1 + rng() % bytes.size(), MSG_NOSIGNAL);
      ::close(fd);
      ++garbage_sent;
    }
    std::this_thread::sleep_for(5ms);
  }
}

/// The half-open attack: connections that never finish a handshake, the oldest replaced.
void half_open(std::vector<uint16_t> ports, size_t limit, clock_type::time_point end) {
  std::deque<int> open;
  const uint8_t half_frame[4] = {0x40, 0, 0, 0};  // a length, and never the message
  for (size_t i = 0; running(end); ++i) {
    const int fd = raw_connect(ports[i % ports.size()]);
    if (fd >= 0) {
      if (i % 2 == 0) (void)::send(fd, half_frame, sizeof(half_frame), MSG_NOSIGNAL);
      open.push_back(fd);
      ++half_open_made;
    }
    while (open.size() > limit) {
      ::close(open.front());
      open.pop_front();
    }
    std::this_thread::sleep_for(5ms);
  }
  for (int fd : open) ::close(fd);
}

// -- libcomm clients -------------------------------------------------------------------------------

/// Progresses `w` until `done()` or `timeout`; false on timeout.
template <class Done>
bool progress_until(comm::worker& w, std::chrono::milliseconds timeout, Done done) {
  const auto deadline = clock_type::now() + timeout;
  while (!done()) {
    if (clock_type::now() >= deadline) return false;
    w.progress();
  }
  return true;
}

/// What a client endpoint's callbacks were told.
struct connection_state {
  bool connected = false;
  bool failed = false;
};

/// Connect callback of the clients.
void on_connected(void* arg, comm::endpoint*, const uint8_t*, size_t) {
  static_cast<connection_state*>(arg)->connected = true;
}

/// Error callback of the clients.
void on_failed(void* arg, comm::endpoint*, comm::status) {
  static_cast<connection_state*>(arg)->failed = true;
}

/// Connects `w` to `address`; null when it failed or took more than 5 s.
comm::endpoint* connect(comm::worker& w, const std::string& address, connection_state& state,
                        std::vector<uint8_t> private_data = {}) {
  comm::endpoint_params params;
  params.on_connect = on_connected;
  params.connect_arg = &state;
  params.on_error = on_failed;
  params.error_arg = &state;
  params.timeout_ms = 5000;
  params.private_data = std::move(private_data);
  comm::endpoint* ep = nullptr;
  if (w.connect(address, params, &ep) != comm::status::ok) return nullptr;
  if (!progress_until(w, 6000ms, [&] { return state.connected || state.failed; }) ||
      state.failed) {
    return nullptr;
  }
  return ep;
}

/// Closes `ep`, progressing until done (bounded).
void close(comm::worker& w, comm::endpoint* ep) {
  comm::op o = ep->close();
  if (!o.pending()) return;
  progress_until(w, 2000ms, [&] { return w.request_status(o.req) != comm::status::in_progress; });
  w.release(o.req);
}

/// Whether the echo of the last round trip arrived.
struct echo_box {
  bool arrived = false;
};

/// The good client's AM handler for echoes.
comm::status on_echo(void* arg, const void*, size_t, void*, size_t, const comm::am_recv_params&) {
  static_cast<echo_box*>(arg)->arrived = true;
  return comm::status::ok;
}

/// One AM round trip on `ep`; its time in microseconds, or -1.
double round_trip(comm::worker& w, comm::endpoint* ep, echo_box& box) {
  static const std::vector<uint8_t> payload(64, 0x42);
  box.arrived = false;
  const auto start = clock_type::now();
  comm::request_params rp;
  rp.flags = comm::request_reply_endpoint;
  comm::op o = ep->am_send(echo_request, nullptr, 0, payload.data(), payload.size(), rp);
  if (o.failed()) return -1;
  const bool answered = progress_until(w, 2000ms, [&] { return box.arrived; });
  if (o.pending()) w.release(o.req);
  if (!answered) return -1;
  return std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
}

/// The good libcomm client: a round trip every 50 ms, a new connection every second.
void good_comm_client(std::string address, clock_type::time_point end) {
  // Declared before the worker: they outlive the endpoints that report to them (a close may time
  // out and report later, and destroying the worker fails what is left).
  echo_box box;
  connection_state state, fresh;
  comm::context ctx;
  auto w = comm::worker::create(ctx).value();
  w->set_am_handler(echo_reply, on_echo, &box);
  comm::endpoint* ep = nullptr;
  auto next_connect = clock_type::now();
  while (running(end)) {
    if (ep == nullptr || state.failed) {
      state = {};
      ep = connect(*w, address, state);
      if (ep == nullptr) comm_rtt.failed();
    }
    if (ep != nullptr) {
      const double us = round_trip(*w, ep, box);
      us < 0 ? comm_rtt.failed() : comm_rtt.ok(us);
    }
    if (clock_type::now() >= next_connect) {
      next_connect += 1s;
      fresh = {};
      const auto start = clock_type::now();
      comm::endpoint* another = connect(*w, address, fresh);
      const double us = another ? round_trip(*w, another, box) : -1;
      const double total = std::chrono::duration<double, std::micro>(clock_type::now() - start)
                               .count();
      us < 0 ? comm_connect.failed() : comm_connect.ok(total);
      if (another != nullptr) close(*w, another);
    }
    progress_until(*w, 50ms, [] { return false; });
  }
  if (ep != nullptr && !state.failed) close(*w, ep);
}

/// The churn attack: connect and close, as fast as possible, to both servers.
void churn(std::vector<std::string> addresses, clock_type::time_point end) {
  connection_state state;  // before the worker: outlives the endpoints that report to it
  comm::context ctx;
  auto w = comm::worker::create(ctx).value();
  for (size_t i = 0; running(end); ++i) {
    state = {};
    comm::endpoint* ep = connect(*w, addresses[i % addresses.size()], state);
    if (ep != nullptr) close(*w, ep);
    ++churned;
  }
}

/// Floods the listener server with tagged messages nobody receives.
void hostile_comm(std::string address, clock_type::time_point end) {
  connection_state state;  // before the worker: outlives the endpoints that report to it
  comm::context ctx;
  auto w = comm::worker::create(ctx).value();
  const std::vector<uint8_t> payload(16384, 0x13);
  while (running(end)) {
    state = {};
    comm::endpoint* ep = connect(*w, address, state);
    for (int i = 0; ep != nullptr && !state.failed && running(end) && i < 1000; ++i) {
      comm::op o = ep->tag_send(0xbad0000 + static_cast<uint64_t>(i), payload.data(),
                                payload.size());
      if (o.pending()) w->release(o.req);
      ++hostile_frames;
      progress_until(*w, 10ms, [] { return false; });
    }
    if (ep != nullptr && !state.failed) close(*w, ep);
  }
}

/// Speaks the node protocol as a fake node: frames far ahead of sequence, messages to actors that
/// do not exist, long lookups.
void hostile_node(caf::actor_system& sys, std::string address, clock_type::time_point end) {
  connection_state state;  // before the worker: outlives the endpoints that report to it
  comm::context ctx;
  auto w = comm::worker::create(ctx).value();
  namespace d = comm::actors::detail;
  d::envelope_writer writer;
  const std::vector<char> big(256 * 1024, 'h');
  const std::string long_name(4000, 'n');
  std::mt19937 rng(2);
  while (running(end)) {
    caf::node_id::default_data::host_id_type host{};
    for (auto& b : host) b = static_cast<uint8_t>(rng());
    const auto hello = d::encode_hello(sys, {caf::make_node_id(rng(), host), ""});
    state = {};
    comm::endpoint* ep = connect(*w, address, state, hello);
    for (uint32_t seq = 0; ep != nullptr && !state.failed && running(end) && seq < 2000; ++seq) {
      d::frame_header h;
      const unsigned pick = seq % 3;
      h.kind = pick == 2 ? d::frame_kind::lookup : d::frame_kind::message;
      h.seq = pick == 0 ? seq + 1000 : seq;  // every third frame far ahead: held for order
      h.receiver = 1000000 + seq;             // no such actor
      h.message_id = seq;
      const void* head = writer.encode(h);
      const void* data = pick == 2 ? static_cast<const void*>(long_name.data()) : big.data();
      const size_t length = pick == 2 ? long_name.size() : big.size();
      comm::request_params rp;
      rp.flags = comm::request_reply_endpoint;
      comm::op o = ep->am_send(d::frame_am_id, head, d::envelope_writer::size(), data, length, rp);
      if (o.pending()) w->release(o.req);
      ++hostile_frames;
      progress_until(*w, 20ms, [] { return false; });
    }
    if (ep != nullptr && !state.failed) close(*w, ep);
  }
}

// -- the actor client ------------------------------------------------------------------------------

/// The good actor client: a request to the echo actor every 50 ms.
void good_actor_client(caf::actor_system& sys, std::string address, clock_type::time_point end) {
  auto& node = *comm::actors::node::get(sys);
  caf::scoped_actor self{sys};
  caf::actor echo;
  while (running(end)) {
    if (!echo) {
      auto found = node.lookup(address, "echo", 2000ms);
      if (!found) {
        actor_rtt.failed();
        std::this_thread::sleep_for(50ms);
        continue;
      }
      echo = *found;
    }
    const auto start = clock_type::now();
    self->request(echo, 2s, std::string(64, 'e'))
        .receive(
            [&](const std::string&) {
              actor_rtt.ok(
                  std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
            },
            [&](caf::error&) {
              actor_rtt.failed();
              echo = nullptr;
            });
    std::this_thread::sleep_for(50ms);
  }
}

// -- main ------------------------------------------------------------------------------------------

/// Reads the command line.
options parse(int argc, char** argv) {
  options o;
  for (int c; (c = ::getopt(argc, argv, "t:o:a:n:")) != -1;) {
    switch (c) {
      case 't': o.seconds = std::atoi(optarg); break;
      case 'o': o.out = optarg; break;
      case 'n': o.half_open = static_cast<size_t>(std::atol(optarg)); break;
      case 'a': {
        o.attacks.clear();
        std::stringstream list(optarg);
        for (std::string a; std::getline(list, a, ',');) o.attacks.insert(a);
        break;
      }
      default:
        std::fprintf(stderr, "usage: comm_soak [-t seconds] [-o dir] [-a attacks] [-n half_open]\n");
        std::exit(2);
    }
  }
  return o;
}

/// Plots dir/soak.dat into dir/soak.png when gnuplot is installed.
void plot(const options& o) {
  const std::string script = std::string(COMM_SOURCE_DIR) + "/bench/plot_soak.gnuplot";
  const std::string cmd = "gnuplot -e \"dir='" + o.out + "'\" " + script + " 2>/dev/null";
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0 && std::system(cmd.c_str()) == 0) {
    std::printf("plot: %s/soak.png\n", o.out.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  // Every rejected attacker is logged at warn: quiet unless asked for.
  if (std::getenv("COMM_LOG_LEVEL") == nullptr) comm::set_log_level(comm::log_level::error);
  std::string listener_port_text, node_address;
  const pid_t listener_pid = start_server(listener_server, &listener_port_text);
  const pid_t node_pid = start_server(node_server, &node_address);
  const std::string listener_address = "127.0.0.1:" + listener_port_text;
  const std::vector<uint16_t> ports = {port_of(listener_address), port_of(node_address)};
  std::printf("listener server %d on %s, node server %d on %s; %d s; attacks:", listener_pid,
              listener_address.c_str(), node_pid, node_address.c_str(), o.seconds);
  for (const auto& a : o.attacks) std::printf(" %s", a.c_str());
  std::printf("\n");

  caf::actor_system_config cfg;
  comm::actors::node_params np;
  np.listen_address = "";
  comm::actors::node::load(cfg, np);
  caf::actor_system sys{cfg};

  const auto end = clock_type::now() + std::chrono::seconds(o.seconds);
  // The threads run past the last sample (stopping ends them), so it is not taken mid-teardown.
  const auto threads_end = end + 5s;
  std::vector<std::thread> threads;
  threads.emplace_back(good_comm_client, listener_address, threads_end);
  threads.emplace_back(good_actor_client, std::ref(sys), node_address, threads_end);
  if (o.attacks.count("garbage")) threads.emplace_back(garbage, ports, threads_end);
  if (o.attacks.count("halfopen")) {
    threads.emplace_back(half_open, ports, o.half_open, threads_end);
  }
  if (o.attacks.count("churn")) {
    threads.emplace_back(churn, std::vector<std::string>{listener_address, node_address},
                         threads_end);
  }
  if (o.attacks.count("hostile")) {
    threads.emplace_back(hostile_comm, listener_address, threads_end);
    threads.emplace_back(hostile_node, std::ref(sys), node_address, threads_end);
  }

  ::mkdir(o.out.c_str(), 0755);
  std::FILE* dat = std::fopen((o.out + "/soak.dat").c_str(), "w");
  const char* header =
      "# t_s lsn_fds lsn_rss_mb node_fds node_rss_mb comm_p50_us comm_max_us comm_fail "
      "connect_p50_us connect_fail actor_p50_us actor_max_us actor_fail garbage halfopen churn "
      "hostile\n";
  std::fputs(header, stdout);
  if (dat != nullptr) std::fputs(header, dat);
  bool servers_alive = true;
  double comm_idle = 0, actor_idle = 0;
  for (int t = 1; clock_type::now() < end && servers_alive; ++t) {
    std::this_thread::sleep_for(1s);
    servers_alive = alive(listener_pid) && alive(node_pid);
    double c50, cmax, k50, kmax, a50, amax, idle;
    uint64_t cfail, kfail, afail;
    comm_rtt.take(&c50, &cmax, &cfail, &comm_idle);
    comm_connect.take(&k50, &kmax, &kfail, &idle);
    actor_rtt.take(&a50, &amax, &afail, &actor_idle);
    char row[512];
    std::snprintf(row, sizeof(row),
                  "%d %zu %.1f %zu %.1f %.1f %.1f %llu %.1f %llu %.1f %.1f %llu %llu %llu %llu "
                  "%llu\n",
                  t, fd_count(listener_pid), rss_mb(listener_pid), fd_count(node_pid),
                  rss_mb(node_pid), c50, cmax, static_cast<unsigned long long>(cfail), k50,
                  static_cast<unsigned long long>(kfail), a50, amax,
                  static_cast<unsigned long long>(afail),
                  static_cast<unsigned long long>(garbage_sent.load()),
                  static_cast<unsigned long long>(half_open_made.load()),
                  static_cast<unsigned long long>(churned.load()),
                  static_cast<unsigned long long>(hostile_frames.load()));
    std::fputs(row, stdout);
    std::fflush(stdout);
    if (dat != nullptr) std::fputs(row, dat);
  }
  stopping = true;
  for (auto& th : threads) th.join();
  if (dat != nullptr) std::fclose(dat);
  const bool listener_ok = alive(listener_pid);
  const bool node_ok = alive(node_pid);
  ::kill(listener_pid, SIGTERM);
  ::kill(node_pid, SIGTERM);
  ::waitpid(listener_pid, nullptr, 0);
  ::waitpid(node_pid, nullptr, 0);
  plot(o);
  const bool answered = comm_idle < 5 && actor_idle < 5;
  std::printf("listener server %s, node server %s, good clients %s\n",
              listener_ok ? "alive" : "DIED", node_ok ? "alive" : "DIED",
              answered ? "answered to the end" : "NOT ANSWERED in the last 5 s");
  return listener_ok && node_ok && answered ? 0 : 1;
}
