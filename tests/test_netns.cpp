// Two hosts: client and server processes in network namespaces of their own, joined by veth
// pairs, talking through the connection manager and the tcp lane (a shared-memory lane cannot
// reach another network namespace), over IPv4, IPv6 and link-local IPv6 addresses (both the
// connection manager and the lane). AM, tagged eager and rendezvous messages both ways; a wrong
// key; the server or the client killed while data is moving. A slow receiver is not a dead one: a
// receiver stopped (SIGSTOP) for 20 s with thousands of sends waiting loses nothing; killed, every
// waiting send fails at once; its host silenced (link down), within COMM_TCP_PEER_TIMEOUT.
//
// The parent creates no libcomm object: each child enters its namespace first (transports read the
// namespace identity once per process).
#define BOOST_TEST_MODULE netns
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "fixture.hpp"
#include "test_util.hpp"
#include "netns.hpp"
#include "process_harness.hpp"

#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <poll.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <cstring>
#include <string>

using namespace comm;
using namespace comm::test;

namespace netns_test {

constexpr const char* cluster_key = "netns test key";
constexpr uint16_t echo_am = 1;
constexpr uint16_t reply_am = 2;

/// One namespace pair for the whole module.
struct hosts_fixture {
  hosts_fixture() { BOOST_REQUIRE_MESSAGE(hosts.ok(), "cannot create network namespaces (root and ip(8) are needed)"); }
  netns_pair hosts;
};

// -- address families ---------------------------------------------------------------------------

/// The addresses a case uses: "ipv4" (10.199.<n>.x), "ipv6" (fd00:199:<n>::x) or "link-local"
/// (fe80::199:x on the second link, reached through the local end of that link).
using family = std::string;

/// How a process in host `from` names host `which` in "host:port" for `f`: a link-local address
/// carries the interface of `from` it is reached through.
std::string host_of(const netns_pair& hosts, const family& f, int which, int from) {
  if (f == "ipv6") return "[" + hosts.address6(which) + "]";
  if (f == "link-local") return "[" + hosts.link_local(which) + "%" + hosts.link_device(from) + "]";
  return hosts.address(which);
}

/// What a process in host `which` shows as its tcp interface's address for `f` (its info()).
std::string lane_address_of(const netns_pair& hosts, const family& f, int which) {
  if (f == "ipv6") return hosts.address6(which);
  if (f == "link-local") return hosts.link_local(which) + "%" + hosts.link_device(which);
  return hosts.address(which);
}

/// shm and tcp with cluster key `key`; for IPv6 families the tcp lane takes IPv6 addresses, for
/// link-local ones the device of host `which`'s link-local link.
config host_config(const std::string& key, const netns_pair* hosts = nullptr,
                   const family& f = "ipv4", int which = 0) {
  config cfg = config::from_environment();
  cfg.transports = {"shm", "tcp"};
  cfg.auth_key = key;
  if (f != "ipv4") cfg.transport_options["COMM_TCP_AF_PRIO"] = "inet6";
  if (f == "link-local") cfg.transport_options["COMM_TCP_DEVICE"] = hosts->link_device(which);
  return cfg;
}

/// The families every cross-host basic case runs over, and the shorter list for the rest.
const std::vector<family> all_families = {"ipv4", "ipv6", "link-local"};
const std::vector<family> ip_families = {"ipv4", "ipv6"};

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// -- the server --------------------------------------------------------------------------------

/// Echo server state: every AM echo_am is answered with reply_am on the endpoint it came on;
/// every tagged message is sent back with the same tag.
struct echo_server {
  std::unique_ptr<worker> w;
  std::unique_ptr<listener> l;
  std::vector<endpoint*> eps;
  std::deque<std::vector<uint8_t>> replies;  ///< AM echo payloads (kept until the server ends)
  int errors = 0;
  status last_error = status::ok;
  clock_type::time_point error_time;
};

status on_echo_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                  const am_recv_params& params) {
  auto* s = static_cast<echo_server*>(arg);
  if (!(params.attr & am_recv_reply_ep)) return status::ok;
  // A large reply goes by rendezvous and reads the buffer later: send from a copy that lives on.
  auto& copy = s->replies.emplace_back(static_cast<uint8_t*>(data),
                                       static_cast<uint8_t*>(data) + length);
  op o = params.reply_ep->am_send(reply_am, header, header_length, copy.data(), copy.size());
  if (o.req != nullptr) s->w->release(o.req);
  return status::ok;
}

void on_server_ep_error(void* arg, endpoint*, status reason) {
  auto* s = static_cast<echo_server*>(arg);
  ++s->errors;
  s->last_error = reason;
  s->error_time = clock_type::now();
}

/// What `stop_server` tells the server: stop now, or once an endpoint error came.
enum server_stop : uint64_t { stop_now = 0, stop_after_an_error = 1 };

/// Runs an echo server in host 0 on family `f`: sends its port to `out`, serves until `in` says
/// stop (a server_stop word, at most 60 s), then reports errors seen, the last error and when it
/// came.
int run_server(const netns_pair& hosts, const channel& out, const channel& in,
               const std::string& key, const family& f) {
  CHILD_CHECK(hosts.enter(0));
  context ctx(host_config(key, &hosts, f, 0));
  echo_server s;
  worker_params wp;
  wp.name = "server";
  s.w = worker::create(ctx, wp).value();
  CHILD_CHECK(s.w->set_am_handler(echo_am, on_echo_am, &s,
                                  am_flag_whole_msg | am_flag_fetch_rndv) == status::ok);
  std::vector<conn_request*> requests;
  listener_params lp;
  lp.address = host_of(hosts, f, 0, 0) + ":0";
  lp.on_request = [](void* arg, conn_request* r) {
    static_cast<std::vector<conn_request*>*>(arg)->push_back(r);
  };
  lp.arg = &requests;
  CHILD_CHECK(s.w->listen(lp, &s.l) == status::ok);
  CHILD_CHECK(s.l->address() == host_of(hosts, f, 0, 0) + ":" + std::to_string(s.l->port()));
  out.send_word(s.l->port());
  std::vector<uint8_t> buffer(8 << 20);
  const auto start = clock_type::now();
  uint64_t word = 0;
  bool stop_at_error = false;
  while (seconds_since(start) < 60 && !(stop_at_error && s.errors > 0)) {
    s.w->progress();
    for (conn_request* r : requests) {
      conn_request_attr attr;
      CHILD_CHECK(s.l->query(r, &attr) == status::ok);
      CHILD_CHECK((attr.client_address[0] == '[') == (f != "ipv4"));  // the client's family
      endpoint_params p;
      p.on_error = on_server_ep_error;
      p.error_arg = &s;
      endpoint* ep = nullptr;
      CHILD_CHECK(s.w->accept(r, p, &ep) == status::ok);
      s.eps.push_back(ep);
    }
    requests.clear();
    tag_recv_info info;
    message* msg = nullptr;
    if (!s.eps.empty() && s.w->tag_probe(0, 0, &info, &msg)) {
      op r = s.w->tag_recv_message(msg, buffer.data(), buffer.size());
      const bool received = s.w->wait(r, 20000) == status::ok;  // fails if the client died
      endpoint* back = s.eps.back();
      if (received && back->state() == status::ok) {
        op e = back->tag_send(info.sender_tag, buffer.data(), info.length);
        if (e.pending()) (void)s.w->wait(e, 20000);
      }
    }
    pollfd command{in.fds[0], POLLIN, 0};
    if (::poll(&command, 1, 0) == 1 && in.receive_word(&word, 1000)) {
      if (word == stop_now) break;
      stop_at_error = word == stop_after_an_error;
    }
  }
  // A failure is reported once: progress on a while, so a second report would be counted.
  for (int i = 0; stop_at_error && i < 10000; ++i) s.w->progress();
  out.send_word(static_cast<uint64_t>(s.errors));
  out.send_word(static_cast<uint64_t>(static_cast<int64_t>(s.last_error)));
  out.send_word(static_cast<uint64_t>(s.error_time.time_since_epoch().count()));
  out.send_word(s.l->requests());
  return 0;
}

// -- the client --------------------------------------------------------------------------------

struct client_state {
  int connects = 0;
  int errors = 0;
  status error = status::ok;
  int replies = 0;
  std::vector<uint8_t> reply;
};

void on_client_connect(void* arg, endpoint*, const uint8_t*, size_t) {
  ++static_cast<client_state*>(arg)->connects;
}

void on_client_error(void* arg, endpoint*, status reason) {
  auto* c = static_cast<client_state*>(arg);
  ++c->errors;
  c->error = reason;
}

status on_reply_am(void* arg, const void*, size_t, void* data, size_t length,
                   const am_recv_params&) {
  auto* c = static_cast<client_state*>(arg);
  ++c->replies;
  c->reply.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + length);
  return status::ok;
}

/// A client in host 1 connected to the server at `address`; `connected` says whether it worked.
/// With `hosts`, its tcp lane takes family `f`.
struct host_client {
  host_client(const std::string& address, const std::string& key,
              const netns_pair* hosts = nullptr, const family& f = "ipv4")
      : ctx(host_config(key, hosts, f, 1)) {
    worker_params wp;
    wp.name = "client";
    w = worker::create(ctx, wp).value();
    (void)w->set_am_handler(reply_am, on_reply_am, &state, am_flag_whole_msg | am_flag_fetch_rndv);
    endpoint_params p;
    p.on_connect = on_client_connect;
    p.connect_arg = &state;
    p.on_error = on_client_error;
    p.error_arg = &state;
    started = w->connect(address, p, &ep) == status::ok;
    connected = started && spin_until([&] { w->progress(); },
                                      [&] { return state.connects + state.errors > 0; }, 15) &&
                state.connects == 1;
  }

  /// Sends `length` bytes tagged `tag` and waits for the echo; true when it matches.
  bool tag_echo(size_t length, uint32_t seed) {
    const auto data = pattern(length, seed);
    std::vector<uint8_t> got(length);
    op r = w->tag_recv(got.data(), got.size(), seed, tag_mask_full);
    op s = ep->tag_send(seed, data.data(), data.size());
    if (w->wait(s, 20000) != status::ok || w->wait(r, 20000) != status::ok) return false;
    return first_mismatch(got.data(), length, seed) < 0;
  }

  /// Sends an AM with `length` bytes and waits for the echo.
  bool am_echo(size_t length, uint32_t seed) {
    const auto data = pattern(length, seed);
    const uint64_t header = seed;
    const int before = state.replies;
    request_params p;
    p.flags = request_reply_endpoint;
    op s = ep->am_send(echo_am, &header, sizeof(header), data.data(), data.size(), p);
    if (w->wait(s, 20000) != status::ok) return false;
    if (!spin_until([&] { w->progress(); }, [&] { return state.replies > before; }, 20)) return false;
    return state.reply.size() == length && first_mismatch(state.reply.data(), length, seed) < 0;
  }

  context ctx;
  std::unique_ptr<worker> w;
  endpoint* ep = nullptr;
  client_state state;
  bool started = false;
  bool connected = false;
};

/// Starts a server child on family `f`; returns its pid and port through the arguments.
pid_t start_server(const netns_pair& hosts, channel& from_server, channel& to_server,
                   const std::string& key, uint64_t* port, const family& f = "ipv4") {
  const pid_t pid =
      fork_child([&] { return run_server(hosts, from_server, to_server, key, f); });
  BOOST_REQUIRE_MESSAGE(from_server.receive_word(port), "the server did not start");
  return pid;
}

/// What the server reported when it stopped.
struct server_report {
  uint64_t errors = 0;
  status last_error = status::ok;
  clock_type::time_point error_time;  ///< when its last endpoint error came (a system-wide clock)
  uint64_t requests = 0;
};

/// Stops the server (now, or once it saw an endpoint error: within 60 s of its start).
server_report stop_server(pid_t pid, channel& from_server, channel& to_server,
                          server_stop when = stop_now) {
  to_server.send_word(when);
  server_report r;
  uint64_t words[4] = {};
  for (auto& w : words) BOOST_REQUIRE(from_server.receive_word(&w, 60000));
  r.errors = words[0];
  r.last_error = static_cast<status>(static_cast<int64_t>(words[1]));
  r.error_time = clock_type::time_point(clock_type::duration(static_cast<int64_t>(words[2])));
  r.requests = words[3];
  BOOST_TEST(wait_child(pid) == 0);
  return r;
}

// -- a stream of thousands of tagged sends to a receiver that stalls -------------------------------

/// Messages in a stalled-receiver test: as many as the sends of the reported failure.
constexpr int stream_count = 10000;
/// Patterns a message may carry (message i carries pattern i % stream_seeds of its size).
constexpr uint32_t stream_seeds = 16;
constexpr size_t stream_sizes[] = {8, 64, 512, 4096, 32768, 1 << 20};

/// Index into stream_sizes of message i: every 500th is 1 MiB (rendezvous), the rest eager.
size_t stream_size_class(int i) { return i % 500 == 499 ? 5 : static_cast<size_t>(i % 5); }
size_t stream_size(int i) { return stream_sizes[stream_size_class(i)]; }
uint32_t stream_seed(int i) { return static_cast<uint32_t>(i) % stream_seeds; }

/// Receives stream_count tagged messages in host 0 and checks that message i has tag i, its size
/// and its pattern. Sends its port, then a word once message 0 came, then the number intact.
int run_stream_receiver(const netns_pair& hosts, const channel& out) {
  CHILD_CHECK(hosts.enter(0));
  context ctx(host_config(cluster_key));
  worker_params wp;
  wp.name = "receiver";
  auto w = worker::create(ctx, wp).value();
  std::vector<conn_request*> requests;
  listener_params lp;
  lp.address = hosts.address(0) + ":0";
  lp.on_request = [](void* arg, conn_request* r) {
    static_cast<std::vector<conn_request*>*>(arg)->push_back(r);
  };
  lp.arg = &requests;
  std::unique_ptr<listener> l;
  CHILD_CHECK(w->listen(lp, &l) == status::ok);
  out.send_word(l->port());
  CHILD_CHECK(spin_until([&] { w->progress(); }, [&] { return !requests.empty(); }, 30));
  endpoint* ep = nullptr;
  CHILD_CHECK(w->accept(requests.front(), endpoint_params{}, &ep) == status::ok);
  std::vector<uint8_t> buffer(stream_sizes[5]);
  uint64_t intact = 0;
  for (int i = 0; i < stream_count; ++i) {
    recv_tracker rt;
    request_params rp = recv_params(rt);
    rp.recv_info = &rt.info;
    op r = w->tag_recv(buffer.data(), buffer.size(), 0, 0, rp);
    if (r.pending()) {
      CHILD_CHECK(spin_until([&] { w->progress(); }, [&] { return rt.calls != 0; }, 90));
      w->release(r.req);
      r.st = rt.st;
    }
    CHILD_CHECK(r.st == status::ok);
    const bool right = rt.info.sender_tag == static_cast<tag_t>(i) &&
                       rt.info.length == stream_size(i) &&
                       first_mismatch(buffer.data(), rt.info.length, stream_seed(i)) < 0;
    if (!right) {
      std::fprintf(stderr, "receiver: message %d: tag %llu, %zu bytes, content %s\n", i,
                   static_cast<unsigned long long>(rt.info.sender_tag), rt.info.length,
                   first_mismatch(buffer.data(), rt.info.length, stream_seed(i)) < 0 ? "ok"
                                                                                      : "wrong");
      break;
    }
    ++intact;
    if (i == 0) out.send_word(1);
  }
  out.send_word(intact);
  // Stay until the sender is done with its checks and closes (bounded).
  spin_until([&] { w->progress(); }, [&] { return ep->state() != status::ok; }, 30);
  return intact == stream_count ? 0 : 1;
}

/// The sender's side: one buffer per size and pattern, and the requests of the sends.
struct stream_sender {
  explicit stream_sender(host_client& c) : client(c), ops(stream_count) {
    for (size_t size : stream_sizes) {
      for (uint32_t seed = 0; seed < stream_seeds; ++seed) payloads.push_back(pattern(size, seed));
    }
  }

  /// Sends message i.
  void post(int i) {
    const auto& data = payloads[stream_size_class(i) * stream_seeds + stream_seed(i)];
    ops[i] = client.ep->tag_send(static_cast<tag_t>(i), data.data(), data.size());
  }

  /// Sends messages from..stream_count-1 without waiting.
  void post_rest(int from) {
    for (int i = from; i < stream_count; ++i) post(i);
  }

  /// The status of send i (ok when it completed at once).
  status state(int i) const {
    return ops[i].pending() ? client.w->request_status(ops[i].req) : ops[i].st;
  }

  /// Sends still in progress.
  int outstanding() const {
    int n = 0;
    for (int i = 0; i < stream_count; ++i) n += state(i) == status::in_progress ? 1 : 0;
    return n;
  }

  /// Progresses (busy) until a word comes on `in` (bounded); false when none came.
  bool progress_until_word(const channel& in, double seconds) {
    pollfd command{in.fds[0], POLLIN, 0};
    uint64_t word = 0;
    return spin_until([&] { client.w->progress(); },
                      [&] { return ::poll(&command, 1, 0) == 1; }, seconds) &&
           in.receive_word(&word, 1000);
  }

  host_client& client;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<op> ops;
};

/// The processes of a stalled-receiver test and how the sender ended.
struct stalled_run {
  pid_t receiver = -1;     ///< stopped, or resumed / killed by the test's parent step
  int sender_exit = -1;    ///< the sender's exit code (0: its checks held)
};

/// A stalled-receiver test: the stream receiver in host 0, the sender in host 1 with
/// COMM_TCP_PEER_TIMEOUT=`peer_timeout` (unless null). Once the receiver holds message 0, it is
/// stopped (SIGSTOP) and `sender_body(client, stream, from_parent)` runs in the sender while
/// `parent_step(receiver_pid, to_sender)` runs here. The caller ends the receiver.
template <class SenderBody, class ParentStep>
stalled_run run_stalled_receiver(const netns_pair& hosts, const char* peer_timeout,
                                 SenderBody&& sender_body, ParentStep&& parent_step) {
  channel from_receiver, to_sender;
  uint64_t port = 0;
  stalled_run run;
  run.receiver = fork_child([&] { return run_stream_receiver(hosts, from_receiver); });
  BOOST_REQUIRE_MESSAGE(from_receiver.receive_word(&port), "the receiver did not start");
  const std::string address = hosts.address(0) + ":" + std::to_string(port);
  const pid_t sender = fork_child([&] {
    CHILD_CHECK(hosts.enter(1));
    if (peer_timeout != nullptr) ::setenv("COMM_TCP_PEER_TIMEOUT", peer_timeout, 1);
    host_client c(address, cluster_key);
    CHILD_CHECK(c.connected);
    CHILD_CHECK(c.ep->transport() == "tcp");
    stream_sender s(c);
    s.post(0);
    CHILD_CHECK(s.progress_until_word(to_sender, 30));  // the receiver has it and is stopped
    return sender_body(c, s, to_sender);
  });
  uint64_t word = 0;
  const bool first_arrived = from_receiver.receive_word(&word, 30000);
  BOOST_TEST(first_arrived);
  if (first_arrived) {
    ::kill(run.receiver, SIGSTOP);
    to_sender.send_word(1);
    parent_step(run.receiver, to_sender);
  }
  run.sender_exit = wait_child(sender, 12000);
  return run;
}

/// Kills a receiver (stopped or not) and reaps it.
void end_receiver(pid_t receiver) {
  ::kill(receiver, SIGKILL);
  BOOST_TEST(wait_child(receiver) == -1);
}

}  // namespace netns_test

using namespace netns_test;


BOOST_FIXTURE_TEST_SUITE(two_hosts, hosts_fixture)

BOOST_DATA_TEST_CASE(am_tag_and_rendezvous_cross_hosts_over_tcp,
                     boost::unit_test::data::make(all_families), f) {
  channel from_server, to_server, from_client;
  uint64_t port = 0;
  const pid_t server = start_server(hosts, from_server, to_server, cluster_key, &port, f);
  const std::string address = host_of(hosts, f, 0, 1) + ":" + std::to_string(port);
  const pid_t client = fork_child([&] {
    CHILD_CHECK(hosts.enter(1));
    host_client c(address, cluster_key, &hosts, f);
    CHILD_CHECK(c.connected);
    CHILD_CHECK(c.ep->transport() == "tcp");
    // The lane runs over the family's addresses too.
    CHILD_CHECK(c.w->info().find("address " + lane_address_of(hosts, f, 1) + " port") !=
                std::string::npos);
    CHILD_CHECK(c.am_echo(100, 1));
    CHILD_CHECK(c.am_echo(300 << 10, 2));  // rendezvous AM
    CHILD_CHECK(c.tag_echo(8, 3));
    CHILD_CHECK(c.tag_echo(64 << 10, 4));
    CHILD_CHECK(c.tag_echo(4 << 20, 5));   // rendezvous
    return 0;
  });
  BOOST_TEST(wait_child(client) == 0);
  const server_report r = stop_server(server, from_server, to_server);
  BOOST_TEST(r.requests == 1u);
}

BOOST_DATA_TEST_CASE(a_client_with_the_wrong_key_is_rejected_across_hosts,
                     boost::unit_test::data::make(ip_families), f) {
  channel from_server, to_server;
  uint64_t port = 0;
  const pid_t server = start_server(hosts, from_server, to_server, cluster_key, &port, f);
  const std::string address = host_of(hosts, f, 0, 1) + ":" + std::to_string(port);
  const pid_t client = fork_child([&] {
    CHILD_CHECK(hosts.enter(1));
    host_client c(address, "not the key", &hosts, f);
    CHILD_CHECK(c.started && !c.connected);
    CHILD_CHECK(c.state.error == status::rejected);
    host_client good(address, cluster_key, &hosts, f);
    CHILD_CHECK(good.connected);
    CHILD_CHECK(good.tag_echo(1000, 9));
    return 0;
  });
  BOOST_TEST(wait_child(client) == 0);
  const server_report r = stop_server(server, from_server, to_server);
  BOOST_TEST(r.requests == 1u);  // only the good client reached the server
}

BOOST_DATA_TEST_CASE(the_server_killed_mid_transfer_fails_the_client_promptly,
                     boost::unit_test::data::make(ip_families), f) {
  channel from_server, to_server, from_client;
  uint64_t port = 0;
  const pid_t server = start_server(hosts, from_server, to_server, cluster_key, &port, f);
  const std::string address = host_of(hosts, f, 0, 1) + ":" + std::to_string(port);
  const pid_t client = fork_child([&] {
    CHILD_CHECK(hosts.enter(1));
    host_client c(address, cluster_key, &hosts, f);
    CHILD_CHECK(c.connected);
    const auto data = pattern(1 << 20, 11);
    std::vector<op> sends;
    for (int i = 0; i < 64; ++i) sends.push_back(c.ep->tag_send(i, data.data(), data.size()));
    from_client.send_word(1);  // streaming: kill the server now
    const auto start = clock_type::now();
    CHILD_CHECK(spin_until([&] { c.w->progress(); }, [&] { return c.state.errors == 1; }, 20));
    const double delay = seconds_since(start);
    int failed = 0;
    for (op& o : sends) {
      if (o.req == nullptr) continue;
      CHILD_CHECK(c.w->request_status(o.req) != status::in_progress);
      failed += is_error(c.w->request_status(o.req)) ? 1 : 0;
      c.w->release(o.req);
    }
    std::fprintf(stderr, "client: server death noticed after %.3f s (%s), %d sends failed\n",
                 delay, to_string(c.state.error), failed);
    CHILD_CHECK(c.state.error == status::connection_reset);
    CHILD_CHECK(failed > 0);
    CHILD_CHECK(delay < 5.0);
    return 0;
  });
  uint64_t word = 0;
  BOOST_REQUIRE(from_client.receive_word(&word));
  ::kill(server, SIGKILL);
  BOOST_TEST(wait_child(client) == 0);
  BOOST_TEST(wait_child(server) == -1);  // killed
}

BOOST_DATA_TEST_CASE(the_client_killed_mid_transfer_fails_the_server_endpoint_promptly,
                     boost::unit_test::data::make(ip_families), f) {
  channel from_server, to_server, from_client;
  uint64_t port = 0;
  const pid_t server = start_server(hosts, from_server, to_server, cluster_key, &port, f);
  const std::string address = host_of(hosts, f, 0, 1) + ":" + std::to_string(port);
  const pid_t client = fork_child([&] {
    CHILD_CHECK(hosts.enter(1));
    host_client c(address, cluster_key, &hosts, f);
    CHILD_CHECK(c.connected);
    const auto data = pattern(1 << 20, 12);
    std::vector<op> sends;
    for (int i = 0; i < 32; ++i) sends.push_back(c.ep->tag_send(i, data.data(), data.size()));
    for (int i = 0; i < 1000; ++i) c.w->progress();
    from_client.send_word(1);
    for (int i = 0; i < 2000; ++i) {  // keep moving data until killed (bounded: 20 s)
      c.w->progress();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 1;
  });
  uint64_t word = 0;
  BOOST_REQUIRE(from_client.receive_word(&word));
  const auto kill_time = clock_type::now();
  ::kill(client, SIGKILL);
  BOOST_TEST(wait_child(client) == -1);
  const server_report r = stop_server(server, from_server, to_server, stop_after_an_error);
  BOOST_TEST(r.errors == 1u);
  BOOST_TEST(r.last_error == status::connection_reset);  // the reset, not the liveness timer
  const double delay = std::chrono::duration<double>(r.error_time - kill_time).count();
  BOOST_TEST_MESSAGE("server noticed the client's death after " << delay << " s");
  BOOST_TEST(delay >= 0.0);
  BOOST_TEST(delay < 5.0);  // far inside the 11 s COMM_TCP_PEER_TIMEOUT default
}

BOOST_AUTO_TEST_CASE(a_receiver_stopped_for_20_s_loses_nothing) {
  // Thousands of sends wait behind a receiver stopped for 20 s (its kernel answers every window
  // probe). Resumed, it gets every message intact and in order, and every send completes ok.
  // Before, TCP_USER_TIMEOUT (11 s) cut the connection and every waiting send failed.
  const stalled_run run = run_stalled_receiver(
      hosts, nullptr,
      [](host_client& c, stream_sender& s, const channel& from_parent) {
        s.post_rest(1);
        CHILD_CHECK(s.progress_until_word(from_parent, 60));  // the receiver resumes now
        const int waiting = s.outstanding();
        std::fprintf(stderr, "sender: %d of %d sends waited through the 20 s stop\n", waiting,
                     stream_count);
        CHILD_CHECK(waiting > stream_count / 2);
        CHILD_CHECK(spin_until([&] { c.w->progress(); }, [&] { return s.outstanding() == 0; },
                               90));
        for (int i = 0; i < stream_count; ++i) CHILD_CHECK(s.state(i) == status::ok);
        CHILD_CHECK(c.state.errors == 0);
        return 0;
      },
      [](pid_t receiver, const channel& to_sender) {
        std::this_thread::sleep_for(std::chrono::seconds(20));
        to_sender.send_word(1);
        ::kill(receiver, SIGCONT);
      });
  BOOST_TEST(run.sender_exit == 0);
  BOOST_TEST(wait_child(run.receiver, 9000) == 0);  // every message intact, in order
}

BOOST_AUTO_TEST_CASE(a_killed_receiver_fails_every_waiting_send_at_once) {
  // Killed, the stopped receiver's kernel resets the connection: every send still waiting ends at
  // once. Those that need the receiver's answer (zcopy, rendezvous) and those still queued here
  // fail; only eager bcopy sends its kernel had taken before it stopped completed ok (the bcopy
  // contract), reported in send order behind the zcopy sends among them.
  const stalled_run run = run_stalled_receiver(
      hosts, nullptr,
      [](host_client& c, stream_sender& s, const channel& from_parent) {
        s.post_rest(1);
        CHILD_CHECK(s.progress_until_word(from_parent, 30));  // it is killed now
        const auto killed = clock_type::now();
        const int waiting = s.outstanding();
        CHILD_CHECK(waiting > stream_count / 2);
        CHILD_CHECK(spin_until([&] { c.w->progress(); },
                               [&] { return s.outstanding() == 0 && c.state.errors == 1; }, 20));
        const double delay = seconds_since(killed);
        int failed = 0;
        for (int i = 1; i < stream_count; ++i) {
          const bool needs_answer = stream_size(i) >= 16384;  // zcopy or rendezvous
          CHILD_CHECK(is_error(s.state(i)) || (s.state(i) == status::ok && !needs_answer));
          failed += is_error(s.state(i)) ? 1 : 0;
        }
        std::fprintf(stderr, "sender: %d of %d waiting sends failed %.3f s after the kill (%s)\n",
                     failed, waiting, delay, to_string(c.state.error));
        CHILD_CHECK(failed > stream_count / 2);
        CHILD_CHECK(c.state.error == status::connection_reset);
        CHILD_CHECK(delay < 3.0);
        return 0;
      },
      [](pid_t receiver, const channel& to_sender) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        to_sender.send_word(1);
        ::kill(receiver, SIGKILL);
      });
  BOOST_TEST(run.sender_exit == 0);
  end_receiver(run.receiver);
}

BOOST_AUTO_TEST_CASE(a_silent_host_fails_waiting_sends_within_the_peer_timeout) {
  // The receiver is stopped with thousands of sends waiting behind its zero window, then its
  // host goes silent (link down): its kernel no longer answers the window probes. The sender
  // sleeps in worker::wait; the liveness timer wakes it and fails the endpoint within
  // COMM_TCP_PEER_TIMEOUT (4 s here), where the kernel alone would probe on for many seconds.
  const stalled_run run = run_stalled_receiver(
      hosts, "4",
      [](host_client& c, stream_sender& s, const channel& from_parent) {
        s.post_rest(1);
        CHILD_CHECK(s.progress_until_word(from_parent, 30));  // the link goes down now
        const auto silenced = clock_type::now();
        const int waiting = s.outstanding();
        CHILD_CHECK(waiting > stream_count / 2);
        CHILD_CHECK(spin_until([&] { (void)c.w->wait(10000); },
                               [&] { return c.state.errors == 1; }, 20));
        const double delay = seconds_since(silenced);
        CHILD_CHECK(spin_until([&] { c.w->progress(); }, [&] { return s.outstanding() == 0; },
                               5));
        std::fprintf(stderr, "sender: silent host noticed after %.2f s (%s)\n", delay,
                     to_string(c.state.error));
        CHILD_CHECK(c.state.error == status::endpoint_timeout);
        CHILD_CHECK(delay < 4.0 + 2.0);
        return 0;
      },
      [&](pid_t, const channel& to_sender) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        to_sender.send_word(1);
        BOOST_TEST(hosts.set_link(0, false));
      });
  BOOST_TEST(run.sender_exit == 0);
  BOOST_TEST(hosts.set_link(0, true));
  end_receiver(run.receiver);
}

BOOST_AUTO_TEST_CASE(a_silent_peer_is_noticed_by_keepalive) {
  // An idle connection, the default COMM_TCP_PEER_TIMEOUT (11 s): keepalive finds the silence.
  channel from_server, to_server, from_client;
  uint64_t port = 0;
  const pid_t server = start_server(hosts, from_server, to_server, cluster_key, &port);
  const std::string address = hosts.address(0) + ":" + std::to_string(port);
  const pid_t client = fork_child([&] {
    CHILD_CHECK(hosts.enter(1));
    host_client c(address, cluster_key);
    CHILD_CHECK(c.connected);
    CHILD_CHECK(c.tag_echo(100, 21));
    from_client.send_word(1);  // idle now: the link goes down
    const auto start = clock_type::now();
    CHILD_CHECK(spin_until([&] { (void)c.w->wait(100); }, [&] { return c.state.errors == 1; }, 40));
    const double delay = seconds_since(start);
    std::fprintf(stderr, "client: silent server noticed after %.1f s (%s)\n", delay,
                 to_string(c.state.error));
    CHILD_CHECK(c.state.error == status::endpoint_timeout);
    CHILD_CHECK(delay < 11.0 + 2.0);
    return 0;
  });
  uint64_t word = 0;
  BOOST_REQUIRE(from_client.receive_word(&word));
  BOOST_REQUIRE(hosts.set_link(0, false));
  BOOST_TEST(wait_child(client, 4500) == 0);
  BOOST_REQUIRE(hosts.set_link(0, true));
  ::kill(server, SIGKILL);
  BOOST_TEST(wait_child(server) == -1);
}

BOOST_AUTO_TEST_SUITE_END()
