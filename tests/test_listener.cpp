// Client-server connections in one process: listen, connection requests with private data both
// ways, accept (also on another worker, or by the listener itself), reject, unreachable,
// timeouts, authentication, hostile bytes at the listener, disconnects, and a
// connect/exchange/close loop that must not leak. Over
// IPv6 too: [::1] and [::] listeners, clients by IPv6 literal and by names with IPv6 addresses
// (a private resolver), a tcp lane over ::1.
#define BOOST_TEST_MODULE listener
#include <boost/test/unit_test.hpp>

#include "listener_fixture.hpp"
#include "process_harness.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

using namespace comm;
using namespace comm::test;


namespace {

/// Gives this process a resolver of its own (it needs root): a private mount and network
/// namespace (loopback up) in which /etc is an overlay, its upper layer a tmpfs mounted on
/// `scratch` (an empty directory). There the names of `hosts` (a hosts file) resolve from it, and
/// any other name goes to a DNS server at 127.0.0.1:53 that never answers (a bound UDP socket,
/// returned in `*silent_dns`), so its lookup hangs for the resolver's 30 s timeout.
bool private_resolver(const std::string& hosts, const std::string& scratch, int* silent_dns) {
  if (::unshare(CLONE_NEWNS | CLONE_NEWNET) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", scratch.c_str(), "tmpfs", 0, "size=1m") != 0 ||
      std::system("ip link set lo up >/dev/null 2>&1") != 0) {
    return false;
  }
  const std::string upper = scratch + "/upper", work = scratch + "/work";
  if (::mkdir(upper.c_str(), 0755) != 0 || ::mkdir(work.c_str(), 0755) != 0) return false;
  std::ofstream(upper + "/hosts") << hosts;
  std::ofstream(upper + "/nsswitch.conf") << "hosts: files dns\n";
  std::ofstream(upper + "/resolv.conf") << "nameserver 127.0.0.1\noptions timeout:30 attempts:1\n";
  const std::string options = "lowerdir=/etc,upperdir=" + upper + ",workdir=" + work;
  if (::mount("overlay", "/etc", "overlay", 0, options.c_str()) != 0) return false;
  *silent_dns = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in dns{};
  dns.sin_family = AF_INET;
  dns.sin_port = htons(53);
  dns.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return *silent_dns >= 0 &&
         ::bind(*silent_dns, reinterpret_cast<const sockaddr*>(&dns), sizeof(dns)) == 0;
}

/// The child's part of host_names_are_resolved_off_the_worker_thread: 0 when a connect to a name
/// whose lookup hangs returned at once, a connect by a resolvable name went through meanwhile,
/// and the first then failed with UNREACHABLE at its timeout, its lookup still hanging.
int connect_while_a_lookup_hangs(const std::string& scratch) {
  int silent_dns = -1;
  if (!private_resolver("127.0.0.1 localhost comm-test-server\n", scratch, &silent_dns)) return 2;
  connected_pair p(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  ep_events hung;
  endpoint* hep = nullptr;
  endpoint_params hp = params_for(hung);
  hp.timeout_ms = 1000;
  if (p.cli.w->connect("hangs.example:7000", hp, &hep) != status::ok) return 3;
  if (!p.establish("hello", "welcome", "comm-test-server")) return 4;  // the worker is not stuck
  if (hung.errors != 0) return 5;  // the lookup is still hanging
  if (!run(*p.srv.w, *p.cli.w, [&] { return hung.errors == 1; })) return 6;
  return hung.error == status::unreachable && hung.connects == 0 ? 0 : 7;
}

/// The child's part of names_resolving_to_ipv6_addresses_connect: 0 when a name with only an
/// IPv6 address connects, a name with both connects whichever of its addresses listens (the
/// other refuses: the next is tried), and listening on a name takes its IPv4 address first.
int connect_by_names_of_both_families(const std::string& scratch) {
  int silent_dns = -1;
  const std::string hosts =
      "127.0.0.1 localhost\n::1 comm-v6-only\n::1 comm-both\n127.0.0.1 comm-both\n";
  if (!private_resolver(hosts, scratch, &silent_dns)) return 2;
  for (const char* server_address : {"[::1]:0", "127.0.0.1:0"}) {
    ep_events ce, se;  // first: destroying the workers below still reports to them
    server srv(config_with({"shm", "tcp"}), server_address);
    client cli(config_with({"shm", "tcp"}));
    const bool v6 = server_address[0] == '[';
    for (const std::string host : {v6 ? "comm-v6-only" : "comm-both", "comm-both"}) {
      const int before = ce.connects;
      endpoint* cep = nullptr;
      endpoint* sep = nullptr;
      const std::string address = host + ":" + std::to_string(srv.port);
      if (cli.w->connect(address, params_for(ce), &cep) != status::ok) return 3;
      if (!run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); })) return 4;
      conn_request* r = srv.requests.front();
      srv.requests.pop_front();
      if (srv.w->accept(r, params_for(se), &sep) != status::ok) return 5;
      if (!run(*srv.w, *cli.w, [&] { return ce.connects == before + 1; })) return 6;
    }
    if (ce.errors != 0) return 7;
  }
  server by_name(config_with({"shm", "tcp"}), "comm-both:0");
  if (by_name.l->address().rfind("127.0.0.1:", 0) != 0) return 8;
  server v6_name(config_with({"shm", "tcp"}), "comm-v6-only:0");
  if (v6_name.l->address().rfind("[::1]:", 0) != 0) return 9;
  return 0;
}

/// A configuration of `transports` whose tcp interfaces take IPv6 loopback (::1).
config ipv6_loopback_config(const std::vector<std::string>& transports) {
  config cfg = config_with(transports);
  cfg.transport_options["COMM_TCP_AF_PRIO"] = "inet6";
  cfg.transport_options["COMM_TCP_DEVICE"] = "lo";
  return cfg;
}

}  // namespace

BOOST_AUTO_TEST_CASE(listen_on_port_zero_reports_the_real_port) {
  server srv(config_with({"shm", "tcp"}));
  BOOST_TEST(srv.l->port() != 0);
  BOOST_TEST(srv.l->address() == "127.0.0.1:" + std::to_string(srv.l->port()));
  BOOST_TEST(srv.w->info().find("listener " + srv.l->address()) != std::string::npos);
  std::unique_ptr<listener> again;
  listener_params lp;
  lp.address = srv.l->address();
  BOOST_TEST(srv.w->listen(lp, &again) == status::busy);
  lp.address = "not an address:x";
  BOOST_TEST(srv.w->listen(lp, &again) == status::invalid_addr);
}

BOOST_AUTO_TEST_CASE(wildcard_without_a_key_listens_on_loopback_only) {
  server srv(config_with({"shm", "tcp"}), "0.0.0.0:0");
  BOOST_TEST(srv.l->address().rfind("127.0.0.1:", 0) == 0u);
  server keyed(config_with({"shm", "tcp"}, "secret"), "0.0.0.0:0");
  BOOST_TEST(keyed.l->address().rfind("0.0.0.0:", 0) == 0u);
}

BOOST_AUTO_TEST_CASE(listen_on_ipv6_loopback_reports_the_real_address) {
  server srv(config_with({"shm", "tcp"}), "[::1]:0");
  BOOST_TEST(srv.l->port() != 0);
  BOOST_TEST(srv.l->address() == "[::1]:" + std::to_string(srv.l->port()));
  BOOST_TEST(srv.w->info().find("listener " + srv.l->address()) != std::string::npos);
  std::unique_ptr<listener> again;
  listener_params lp;
  lp.address = srv.l->address();
  BOOST_TEST(srv.w->listen(lp, &again) == status::busy);
  for (const char* malformed : {"[::1:0", "[::1]x:0", "[]:0", "[::1]:http", "::1]:0"}) {
    lp.address = malformed;
    BOOST_TEST(srv.w->listen(lp, &again) == status::invalid_addr, malformed);
  }
}

BOOST_AUTO_TEST_CASE(ipv6_wildcard_without_a_key_listens_on_ipv6_loopback_only) {
  server srv(config_with({"shm", "tcp"}), "[::]:0");
  BOOST_TEST(srv.l->address().rfind("[::1]:", 0) == 0u);
  server keyed(config_with({"shm", "tcp"}, "secret"), "[::]:0");
  BOOST_TEST(keyed.l->address().rfind("[::]:", 0) == 0u);
}

namespace {

/// Connects `cli` to `srv` at "[::1]:port" and accepts; the endpoints in `*cep` and `*sep`.
bool connect_over_ipv6(server& srv, client& cli, ep_events& ce, ep_events& se, endpoint** cep,
                       endpoint** sep, conn_request_attr* attr) {
  const std::string address = "[::1]:" + std::to_string(srv.port);
  if (cli.w->connect(address, params_for(ce, "hi"), cep) != status::ok) return false;
  if (!run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); })) return false;
  conn_request* r = srv.requests.front();
  srv.requests.pop_front();
  if (srv.l->query(r, attr) != status::ok) return false;
  if (srv.w->accept(r, params_for(se), sep) != status::ok) return false;
  return run(*srv.w, *cli.w, [&] { return ce.connects == 1 && se.connects == 1; });
}

}  // namespace

BOOST_AUTO_TEST_CASE(clients_connect_over_ipv6_loopback_on_either_lane) {
  {
    // The connection manager over ::1, the lane shared memory.
    ep_events ce, se;  // first: destroying the workers below still reports to them
    server srv(config_with({"shm", "tcp"}), "[::1]:0");
    client cli(config_with({"shm", "tcp"}));
    endpoint *cep = nullptr, *sep = nullptr;
    conn_request_attr attr;
    BOOST_REQUIRE(connect_over_ipv6(srv, cli, ce, se, &cep, &sep, &attr));
    BOOST_TEST(attr.client_address.rfind("[::1]:", 0) == 0u, attr.client_address);
    BOOST_TEST(cep->transport() == "shm");
    BOOST_TEST(tag_exchange(*cli.w, cep, *srv.w, 100, 11));
  }
  // Both over IPv6: the connection manager and the tcp lane (COMM_TCP_AF_PRIO=inet6 on lo).
  ep_events ce, se;
  server srv(ipv6_loopback_config({"tcp"}), "[::1]:0");
  client cli(ipv6_loopback_config({"tcp"}));
  endpoint *cep = nullptr, *sep = nullptr;
  conn_request_attr attr;
  BOOST_REQUIRE(connect_over_ipv6(srv, cli, ce, se, &cep, &sep, &attr));
  BOOST_TEST(cep->transport() == "tcp");
  BOOST_TEST(cli.w->info().find("tcp: device lo address ::1 port") != std::string::npos);
  BOOST_TEST(tag_exchange(*cli.w, cep, *srv.w, 8, 12));
  BOOST_TEST(tag_exchange(*srv.w, sep, *cli.w, 2 << 20, 13));  // rendezvous
}

BOOST_AUTO_TEST_CASE(a_keyed_ipv6_wildcard_takes_clients_of_both_families) {
  ep_events events[2][2];  // first: destroying the workers below still reports to them
  server srv(config_with({"shm", "tcp"}, "secret"), "[::]:0");
  client cli(config_with({"shm", "tcp"}, "secret"));
  int round = 0;
  for (const std::string host : {"127.0.0.1", "[::1]"}) {
    ep_events& ce = events[round][0];
    ep_events& se = events[round++][1];
    endpoint *cep = nullptr, *sep = nullptr;
    BOOST_REQUIRE_EQUAL(
        cli.w->connect(host + ":" + std::to_string(srv.port), params_for(ce), &cep), status::ok);
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); }));
    conn_request_attr attr;
    BOOST_REQUIRE(srv.l->query(srv.requests.front(), &attr) == status::ok);
    // An IPv4 client of a dual-stack listener shows as IPv4, not as ::ffff:127.0.0.1.
    BOOST_TEST(attr.client_address.rfind(host + ":", 0) == 0u, attr.client_address);
    BOOST_REQUIRE(srv.w->accept(srv.requests.front(), params_for(se), &sep) == status::ok);
    srv.requests.pop_front();
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.connects == 1 && se.connects == 1; }));
  }
}

BOOST_AUTO_TEST_CASE(nobody_listening_on_ipv6_is_unreachable) {
  uint16_t port = 0;
  {
    server gone(config_with({"shm", "tcp"}), "[::1]:0");
    port = gone.l->port();
  }
  ep_events ce;
  client cli(config_with({"shm", "tcp"}));
  endpoint* cep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect("[::1]:" + std::to_string(port), params_for(ce), &cep),
                      status::ok);
  BOOST_REQUIRE(spin_until([&] { cli.w->progress(); }, [&] { return ce.errors == 1; }, 10));
  BOOST_TEST(ce.error == status::unreachable);
}

BOOST_AUTO_TEST_CASE(names_resolving_to_ipv6_addresses_connect) {
  // In a child with a resolver of its own: names with an IPv6 address only, and with both.
  char scratch[] = "/tmp/comm-hosts-XXXXXX";
  BOOST_REQUIRE(::mkdtemp(scratch) != nullptr);
  const pid_t child =
      comm::test::fork_child([&] { return connect_by_names_of_both_families(scratch); });
  const int outcome = comm::test::wait_child(child);
  ::rmdir(scratch);
  BOOST_TEST_INFO("2: no private resolver (root and ip(8) are needed)");
  BOOST_TEST(outcome == 0);
}

BOOST_AUTO_TEST_CASE(private_data_travels_both_ways_and_the_lane_is_shared_memory) {
  connected_pair p(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  BOOST_REQUIRE(p.establish("from the client", "from the server"));
  BOOST_TEST(p.attr.client_id == 7u);
  BOOST_TEST(p.attr.client_name == "client");
  BOOST_TEST(std::string(p.attr.private_data.begin(), p.attr.private_data.end()) ==
             "from the client");
  BOOST_TEST(p.attr.client_address.rfind("127.0.0.1:", 0) == 0u);
  BOOST_TEST(std::string(p.ce.peer_data.begin(), p.ce.peer_data.end()) == "from the server");
  BOOST_TEST(p.se.peer_data.empty());
  BOOST_TEST(p.cep->transport() == "shm");
  BOOST_TEST(p.sep->transport() == "shm");
  BOOST_TEST(p.cep->peer_name() == "server");
  BOOST_TEST(p.sep->peer_name() == "client");
  BOOST_TEST(tag_exchange(*p.cli.w, p.cep, *p.srv.w, 100, 1));
  BOOST_TEST(tag_exchange(*p.srv.w, p.sep, *p.cli.w, 3 << 20, 2));  // rendezvous
  BOOST_TEST(p.srv.l->requests() == 1u);
}

BOOST_AUTO_TEST_CASE(tcp_only_contexts_connect_over_tcp) {
  connected_pair p(config_with({"tcp"}), config_with({"tcp"}));
  BOOST_REQUIRE(p.establish());
  BOOST_TEST(p.cep->transport() == "tcp");
  BOOST_TEST(p.sep->transport() == "tcp");
  BOOST_TEST(tag_exchange(*p.cli.w, p.cep, *p.srv.w, 8, 3));
  BOOST_TEST(tag_exchange(*p.srv.w, p.sep, *p.cli.w, 2 << 20, 4));
}

BOOST_AUTO_TEST_CASE(sends_issued_before_the_answer_wait_for_it) {
  connected_pair p(config_with({"shm"}), config_with({"shm"}));
  BOOST_REQUIRE_EQUAL(p.cli.w->connect(p.srv.address(), params_for(p.ce), &p.cep), status::ok);
  const auto data = pattern(5000, 9);
  send_tracker s;
  op sop = p.cep->tag_send(9, data.data(), data.size(), send_params(s));
  BOOST_REQUIRE(sop.pending());
  BOOST_REQUIRE(run(*p.srv.w, *p.cli.w, [&] { return !p.srv.requests.empty(); }));
  BOOST_TEST(s.calls == 0);
  BOOST_REQUIRE_EQUAL(p.srv.w->accept(p.srv.requests.front(), params_for(p.se), &p.sep),
                      status::ok);
  std::vector<uint8_t> got(5000);
  recv_tracker r;
  op rop = p.srv.w->tag_recv(got.data(), got.size(), 9, tag_mask_full, recv_params(r));
  BOOST_REQUIRE(run(*p.srv.w, *p.cli.w, [&] { return s.calls == 1 && (rop.done() || r.calls); }));
  BOOST_TEST(s.st == status::ok);
  BOOST_TEST(first_mismatch(got.data(), got.size(), 9) == -1);
  p.cli.w->release(sop.req);
  if (rop.req) p.srv.w->release(rop.req);
}

BOOST_AUTO_TEST_CASE(accept_on_another_worker_of_the_context) {
  ep_events ce, se;  // outlive the workers, whose destruction still reports to them
  server srv(config_with({"shm", "tcp"}));
  worker_params wp;
  wp.name = "second";
  auto second = worker::create(srv.ctx, wp).value();
  client cli(config_with({"shm", "tcp"}));
  endpoint* cep = nullptr;
  endpoint* sep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); }));
  BOOST_REQUIRE_EQUAL(second->accept(srv.requests.front(), params_for(se), &sep), status::ok);
  BOOST_REQUIRE(spin_until([&] { srv.w->progress(); second->progress(); cli.w->progress(); },
                           [&] { return ce.connects == 1 && se.connects == 1; }, 10));
  BOOST_TEST(cep->peer_name() == "second");
  BOOST_TEST(tag_exchange(*cli.w, cep, *second, 64, 5));
  BOOST_TEST(tag_exchange(*second, sep, *cli.w, 64, 6));
}

BOOST_AUTO_TEST_CASE(a_listener_with_an_accept_handler_makes_the_endpoints_itself) {
  ep_events se, first, second;  // outlive the workers, whose destruction still reports to them
  context ctx(config_with({"shm", "tcp"}));
  worker_params wp;
  wp.name = "server";
  auto w = worker::create(ctx, wp).value();
  /// What the accept handler was given.
  struct accepted_t {
    std::vector<endpoint*> eps;
  } accepted;
  listener_params lp;
  lp.address = "127.0.0.1:0";
  lp.on_accept = [](void* arg, endpoint* ep) {
    static_cast<accepted_t*>(arg)->eps.push_back(ep);
  };
  lp.accept_arg = &accepted;
  lp.accept_params = params_for(se, "from the server");
  std::unique_ptr<listener> l;
  BOOST_REQUIRE_EQUAL(w->listen(lp, &l), status::ok);
  const std::string address = "127.0.0.1:" + std::to_string(l->port());
  client cli(config_with({"shm", "tcp"}));
  endpoint *a = nullptr, *b = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect(address, params_for(first, "one"), &a), status::ok);
  BOOST_REQUIRE_EQUAL(cli.w->connect(address, params_for(second, "two"), &b), status::ok);
  BOOST_REQUIRE(run(*w, *cli.w, [&] {
    return first.connects == 1 && second.connects == 1 && se.connects == 2;
  }));
  BOOST_TEST(accepted.eps.size() == 2u);
  BOOST_TEST(l->requests() == 2u);
  BOOST_TEST(std::string(first.peer_data.begin(), first.peer_data.end()) == "from the server");
  BOOST_TEST(std::string(second.peer_data.begin(), second.peer_data.end()) == "from the server");
  BOOST_TEST(first.errors + second.errors + se.errors == 0);
  // The endpoints it made carry traffic both ways.
  BOOST_REQUIRE(accepted.eps.size() == 2u);
  BOOST_TEST(tag_exchange(*cli.w, a, *w, 100, 11));
  BOOST_TEST(tag_exchange(*w, accepted.eps[0], *cli.w, 100, 12));
  BOOST_TEST(tag_exchange(*w, accepted.eps[1], *cli.w, 100, 13));
  // Private data too large for the endpoints it would make is refused at listen.
  listener_params too_big = lp;
  too_big.accept_params.private_data.assign(max_private_data + 1, 0);
  std::unique_ptr<listener> refused;
  BOOST_TEST(w->listen(too_big, &refused) == status::exceeds_limit);
  BOOST_TEST(!refused);
}

BOOST_AUTO_TEST_CASE(reject_fails_the_client_endpoint_and_its_sends) {
  server srv(config_with({"shm", "tcp"}));
  client cli(config_with({"shm", "tcp"}));
  ep_events ce;
  endpoint* cep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
  send_tracker s;
  const uint64_t word = 1;
  op sop = cep->tag_send(1, &word, sizeof(word), send_params(s));
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); }));
  conn_request* r = srv.requests.front();
  conn_request_attr attr;
  BOOST_TEST(srv.l->query(r, &attr) == status::ok);
  BOOST_TEST(srv.l->reject(r) == status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.errors == 1; }));
  BOOST_TEST(ce.error == status::rejected);
  BOOST_TEST(ce.connects == 0);
  BOOST_TEST(cep->state() == status::rejected);
  BOOST_TEST(s.st == status::rejected);
  cli.w->release(sop.req);
  op c = cep->close();
  BOOST_TEST(c.done());
}

BOOST_AUTO_TEST_CASE(listening_works_whatever_the_transports_and_the_lane_follows_them) {
  // The listener is the tcp connection manager whatever COMM_TLS says; the lane is picked from
  // the transports both sides enabled (two contexts of one process: self reaches too).
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"self"}, "self"}, {{"shm"}, "shm"}, {{"shm", "self"}, "self"}, {{"tcp"}, "tcp"}};
  for (const auto& [transports, lane] : cases) {
    BOOST_TEST_CONTEXT("COMM_TLS=" << transports.front() << (transports.size() > 1 ? ",..." : "")) {
      connected_pair p(config_with(transports), config_with(transports));
      BOOST_REQUIRE(p.establish());
      BOOST_TEST(p.cep->transport() == lane);
      BOOST_TEST(p.sep->transport() == lane);
      BOOST_TEST(tag_exchange(*p.cli.w, p.cep, *p.srv.w, 100, 5));
      BOOST_TEST(tag_exchange(*p.srv.w, p.sep, *p.cli.w, 100, 6));
    }
  }
}

namespace {

/// A child's exit code for the status its endpoint failed with.
int exit_code_of(status st) {
  if (st == status::unreachable) return 0;
  if (st == status::rejected) return 2;
  return 3;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_client_no_lane_reaches_is_told_unreachable_as_the_server_is) {
  // COMM_TLS=self on both sides, the client in another process: the server's accept finds no
  // lane to it. Both sides must see unreachable (the client was told rejected before).
  channel to_child;
  const pid_t child = fork_child([&] {
    uint64_t port = 0;
    CHILD_CHECK(to_child.receive_word(&port));
    client cli(config_with({"self"}));
    ep_events ce;
    endpoint* cep = nullptr;
    CHILD_CHECK(cli.w->connect("127.0.0.1:" + std::to_string(port), params_for(ce), &cep) ==
                status::ok);
    CHILD_CHECK(spin_until([&] { cli.w->progress(); }, [&] { return ce.errors == 1; }, 20));
    CHILD_CHECK(ce.connects == 0);
    CHILD_CHECK(cep->state() == ce.error);
    CHILD_CHECK(cep->transport() == "none");
    std::fprintf(stderr, "child: the client's endpoint failed with %s\n", to_string(ce.error));
    return exit_code_of(ce.error);
  });
  server srv(config_with({"self"}));
  to_child.send_word(srv.port);
  BOOST_REQUIRE(spin_until([&] { srv.w->progress(); }, [&] { return !srv.requests.empty(); }, 20));
  ep_events se;
  endpoint* sep = nullptr;
  BOOST_TEST(srv.w->accept(srv.requests.front(), params_for(se), &sep) == status::unreachable);
  srv.requests.pop_front();
  int code = -1;
  spin_until([&] { srv.w->progress(); },
             [&] {
               int wstatus = 0;
               if (::waitpid(child, &wstatus, WNOHANG) != child) return false;
               code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
               return true;
             },
             20);
  if (code == -1) code = wait_child(child, 100);
  BOOST_TEST(code == 0);  // 2: the client was told rejected
  BOOST_TEST(se.errors == 0);
}

BOOST_AUTO_TEST_CASE(nobody_listening_is_unreachable) {
  uint16_t port = 0;
  {
    server gone(config_with({"shm", "tcp"}));
    port = gone.l->port();
  }
  client cli(config_with({"shm", "tcp"}));
  ep_events ce;
  endpoint* cep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect("127.0.0.1:" + std::to_string(port), params_for(ce), &cep),
                      status::ok);
  BOOST_REQUIRE(spin_until([&] { cli.w->progress(); }, [&] { return ce.errors == 1; }, 10));
  BOOST_TEST(ce.error == status::unreachable);
  BOOST_TEST(cli.w->connect("127.0.0.1:http", params_for(ce), &cep) == status::invalid_addr);
  (void)cep;
}

BOOST_AUTO_TEST_CASE(host_names_are_resolved_off_the_worker_thread) {
  // In a child with a resolver of its own: a lookup that hangs does not hold up the worker, and
  // a name that resolves connects.
  char scratch[] = "/tmp/comm-hosts-XXXXXX";
  BOOST_REQUIRE(::mkdtemp(scratch) != nullptr);
  const pid_t child = comm::test::fork_child([&] { return connect_while_a_lookup_hangs(scratch); });
  const int outcome = comm::test::wait_child(child);
  ::rmdir(scratch);
  BOOST_TEST_INFO("2: no private resolver (root and ip(8) are needed)");
  BOOST_TEST(outcome == 0);
  // A name that does not resolve: the connect call returns at once, and the endpoint fails with
  // UNREACHABLE later.
  client cli(config_with({"shm", "tcp"}));
  ep_events bad;
  endpoint* bep = nullptr;
  endpoint_params p = params_for(bad);
  p.timeout_ms = 3000;
  BOOST_REQUIRE_EQUAL(cli.w->connect("no-such-host.invalid:7000", p, &bep), status::ok);
  BOOST_REQUIRE(spin_until([&] { cli.w->progress(); }, [&] { return bad.errors == 1; }, 10));
  BOOST_TEST(bad.error == status::unreachable);
  BOOST_TEST(bad.connects == 0);
}

BOOST_AUTO_TEST_CASE(an_unanswered_request_times_out_on_the_client) {
  server srv(config_with({"shm", "tcp"}));
  client cli(config_with({"shm", "tcp"}));
  ep_events ce;
  endpoint* cep = nullptr;
  endpoint_params p = params_for(ce);
  p.timeout_ms = 300;
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), p, &cep), status::ok);
  // The client sleeps in wait(): the timeout must wake it.
  BOOST_REQUIRE(spin_until([&] { srv.w->progress(); (void)cli.w->wait(50); },
                           [&] { return ce.errors == 1; }, 10));
  BOOST_TEST(ce.error == status::endpoint_timeout);
  BOOST_TEST(srv.requests.size() == 1u);
}

BOOST_AUTO_TEST_CASE(destroying_the_listener_rejects_unanswered_requests) {
  server srv(config_with({"shm", "tcp"}));
  client cli(config_with({"shm", "tcp"}));
  ep_events ce;
  endpoint* cep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); }));
  srv.l.reset();
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.errors == 1; }));
  BOOST_TEST(ce.error == status::rejected);
}

BOOST_AUTO_TEST_CASE(matching_keys_connect) {
  connected_pair p(config_with({"shm", "tcp"}, "cluster secret"),
                   config_with({"shm", "tcp"}, "cluster secret"));
  BOOST_REQUIRE(p.establish());
  BOOST_TEST(tag_exchange(*p.cli.w, p.cep, *p.srv.w, 64, 7));
}

BOOST_AUTO_TEST_CASE(a_wrong_or_missing_key_is_rejected_before_the_server_sees_anything) {
  server srv(config_with({"shm", "tcp"}, "right"));
  for (const std::string key : {"wrong", ""}) {
    client cli(config_with({"shm", "tcp"}, key));
    ep_events ce;
    endpoint* cep = nullptr;
    BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.errors == 1; }));
    BOOST_TEST(ce.error == status::rejected);
    BOOST_TEST(srv.requests.empty());
  }
  BOOST_TEST(srv.l->requests() == 0u);
  // A server without the key cannot prove it: a keyed client refuses it.
  server open_server(config_with({"shm", "tcp"}));
  client keyed(config_with({"shm", "tcp"}, "right"));
  ep_events ke;
  endpoint* kep = nullptr;
  BOOST_REQUIRE_EQUAL(keyed.w->connect(open_server.address(), params_for(ke), &kep), status::ok);
  BOOST_REQUIRE(run(*open_server.w, *keyed.w, [&] { return ke.errors == 1; }));
  BOOST_TEST(ke.error == status::rejected);
  BOOST_TEST(open_server.requests.empty());
}

BOOST_AUTO_TEST_CASE(garbage_and_half_open_sockets_do_not_stop_the_listener) {
  ep_events ce, se;  // outlive the workers, whose destruction still reports to them
  server srv(config_with({"shm", "tcp"}));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(srv.l->port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> sockets;
  for (int i = 0; i < 3; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    BOOST_REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0);
    sockets.push_back(fd);
  }
  const char junk[] = "GET / HTTP/1.0\r\n\r\n and then some more bytes that are no frame";
  BOOST_REQUIRE(::send(sockets[0], junk, sizeof(junk), 0) > 0);
  const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4};
  BOOST_REQUIRE(::send(sockets[1], huge, sizeof(huge), 0) > 0);
  // sockets[2] says nothing at all (half open).
  client cli(config_with({"shm", "tcp"}));
  endpoint* cep = nullptr;
  endpoint* sep = nullptr;
  BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); }));
  BOOST_REQUIRE_EQUAL(srv.w->accept(srv.requests.front(), params_for(se), &sep), status::ok);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.connects == 1 && se.connects == 1; }));
  BOOST_TEST(tag_exchange(*cli.w, cep, *srv.w, 256, 8));
  // The garbage senders were cut off.
  for (int i = 0; i < 2; ++i) {
    char buf[64];
    bool closed = spin_until([&] { srv.w->progress(); },
                             [&] { return ::recv(sockets[i], buf, sizeof(buf), MSG_DONTWAIT) == 0 ||
                                          errno == ECONNRESET; }, 5);
    BOOST_TEST(closed);
  }
  BOOST_TEST(srv.l->requests() == 1u);
  for (int fd : sockets) ::close(fd);
}

BOOST_AUTO_TEST_CASE(disconnect_from_either_side_tells_the_other) {
  for (int closer = 0; closer < 2; ++closer) {
    connected_pair p(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
    BOOST_REQUIRE(p.establish());
    endpoint* closing = closer == 0 ? p.cep : p.sep;
    worker& closing_worker = closer == 0 ? *p.cli.w : *p.srv.w;
    ep_events& other = closer == 0 ? p.se : p.ce;
    endpoint* remaining = closer == 0 ? p.sep : p.cep;
    send_tracker closed;
    op c = closing->close(send_params(closed));
    BOOST_REQUIRE(run(*p.srv.w, *p.cli.w, [&] {
      return (c.done() || closed.calls == 1) && other.errors == 1;
    }));
    BOOST_TEST(other.error == status::not_connected);
    if (c.req) closing_worker.release(c.req);
    op c2 = remaining->close();
    BOOST_TEST(!c2.failed());
  }
}

BOOST_AUTO_TEST_CASE(a_server_closing_before_the_client_confirmed_still_tells_the_client) {
  for (int progress_first = 0; progress_first < 2; ++progress_first) {
    ep_events ce, se;  // outlive the workers, whose destruction still reports to them
    server srv(config_with({"shm", "tcp"}));
    client cli(config_with({"shm", "tcp"}));
    endpoint* cep = nullptr;
    endpoint* sep = nullptr;
    BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce), &cep), status::ok);
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); }));
    BOOST_REQUIRE_EQUAL(srv.w->accept(srv.requests.front(), params_for(se), &sep), status::ok);
    // The client may or may not have the server's answer when the server closes.
    for (int i = 0; i < 50 * progress_first; ++i) cli.w->progress(), srv.w->progress();
    BOOST_TEST(!sep->close().failed());
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.errors == 1; }));
    BOOST_TEST((ce.error == status::not_connected || ce.error == status::connection_reset));
    if (progress_first == 0) BOOST_TEST(se.connects == 0);  // closed while still in wireup
  }
}

BOOST_AUTO_TEST_CASE(five_hundred_clients_connect_exchange_and_disconnect_without_leaks) {
  server srv(config_with({"shm", "tcp"}));
  client cli(config_with({"shm", "tcp"}));
  std::vector<endpoint*> server_eps;
  auto one_round = [&](int round) {
    constexpr int batch = 25;
    std::vector<ep_events> ce(batch), se(batch);
    std::vector<endpoint*> ceps(batch), seps(batch);
    for (int i = 0; i < batch; ++i) {
      BOOST_REQUIRE_EQUAL(cli.w->connect(srv.address(), params_for(ce[i]), &ceps[i]), status::ok);
    }
    for (int i = 0; i < batch; ++i) {
      BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); }));
      BOOST_REQUIRE_EQUAL(srv.w->accept(srv.requests.front(), params_for(se[i]), &seps[i]),
                          status::ok);
      srv.requests.pop_front();
    }
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] {
      for (int i = 0; i < batch; ++i) {
        if (ce[i].connects != 1 || se[i].connects != 1) return false;
      }
      return true;
    }));
    for (int i = 0; i < batch; ++i) {
      BOOST_REQUIRE(tag_exchange(*cli.w, ceps[i], *srv.w, 16, 1000 + round * batch + i));
    }
    std::vector<op> closes;
    for (int i = 0; i < batch; ++i) closes.push_back(ceps[i]->close());
    BOOST_REQUIRE(run(*srv.w, *cli.w, [&] {
      for (int i = 0; i < batch; ++i) {
        if (se[i].errors != 1) return false;
      }
      return true;
    }));
    for (int i = 0; i < batch; ++i) {
      BOOST_REQUIRE(!seps[i]->close().failed());
      if (closes[i].req) cli.w->release(closes[i].req);
    }
    for (int i = 0; i < 10; ++i) {
      srv.w->progress();
      cli.w->progress();
    }
  };
  one_round(0);  // warm up pools and lanes
  const size_t fds_before = comm::test::open_fds();
  for (int round = 1; round < 20; ++round) one_round(round);
  BOOST_TEST(comm::test::open_fds() == fds_before);
  BOOST_TEST(srv.l->requests() == 500u);
}
