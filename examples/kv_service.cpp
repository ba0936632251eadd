// A small distributed key-value service on remote actors.
//
// Three server processes each run a node and publish a "kv" actor. The client looks the three up
// by node address and name, and gets proxies that it uses like local actors: it monitors them,
// stores every key on two servers (a primary and the next one), and reads from the first that
// answers. Then one server is killed with SIGKILL: the client gets a down message for it within
// milliseconds, its requests to it fail instead of hanging, and every key is still readable from
// the surviving replica.
//
//   build/examples/kv_service            # runs the whole demo and prints what happens
#include <comm/actors/node.hpp>

#include <caf/all.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

using put_atom = caf::atom_constant<caf::atom("put")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using ok_atom = caf::atom_constant<caf::atom("ok")>;

constexpr int server_count = 3;
constexpr int key_count = 12;
constexpr auto request_timeout = std::chrono::seconds(2);

/// A key-value store actor: put answers ok, get answers the value or a no_elem error.
caf::behavior kv_store(caf::event_based_actor*) {
  auto data = std::make_shared<std::map<std::string, std::string>>();
  return {
    [data](put_atom, const std::string& key, const std::string& value) {
      (*data)[key] = value;
      return ok_atom::value;
    },
    [data](get_atom, const std::string& key) -> caf::result<std::string> {
      auto it = data->find(key);
      if (it == data->end()) return comm::actors::make_error(comm::status::no_elem);
      return it->second;
    },
  };
}

/// A server process: publishes "kv", writes its address to `fd`, serves until killed.
[[noreturn]] void run_server(int index, int fd) {
  caf::actor_system_config cfg;
  comm::actors::node::load(cfg);
  caf::actor_system sys{cfg};
  auto& node = *comm::actors::node::get(sys);
  node.publish(sys.spawn(kv_store), "kv");
  std::printf("[server %d] pid %d serves \"kv\" at %s\n", index, ::getpid(),
              node.address().c_str());
  std::fflush(stdout);
  const std::string line = node.address() + "\n";
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
  for (;;) ::pause();
}

struct server_process {
  pid_t pid = -1;
  std::string address;
};

server_process start_server(int index) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    run_server(index, fds[1]);
  }
  ::close(fds[1]);
  server_process s;
  s.pid = pid;
  char c;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') s.address += c;
  ::close(fds[0]);
  return s;
}

/// The client's view of one server.
struct replica {
  server_process process;
  caf::actor kv;
  bool alive = false;
};

/// Stores `key` on its primary and the next server; returns how many took it.
int put(caf::scoped_actor& self, std::vector<replica>& servers, int key_index,
        const std::string& key, const std::string& value) {
  int stored = 0;
  for (int copy = 0; copy < 2; ++copy) {
    replica& r = servers[(key_index + copy) % servers.size()];
    if (!r.alive) continue;
    self->request(r.kv, request_timeout, put_atom::value, key, value)
      .receive([&](ok_atom) { ++stored; },
               [&](const caf::error& e) {
                 std::printf("  put %s on %s failed: %s\n", key.c_str(),
                             r.process.address.c_str(), self->system().render(e).c_str());
               });
  }
  return stored;
}

/// Reads `key` from its primary, else from the other replica; empty when neither answers.
std::string get(caf::scoped_actor& self, std::vector<replica>& servers, int key_index,
                const std::string& key, std::string* from) {
  std::string value;
  for (int copy = 0; copy < 2 && value.empty(); ++copy) {
    replica& r = servers[(key_index + copy) % servers.size()];
    if (!r.alive) continue;
    self->request(r.kv, request_timeout, get_atom::value, key)
      .receive([&](const std::string& v) {
                 value = v;
                 *from = r.process.address;
               },
               [&](const caf::error& e) {
                 std::printf("  get %s from %s failed: %s\n", key.c_str(),
                             r.process.address.c_str(), self->system().render(e).c_str());
               });
  }
  return value;
}

/// Handles down messages that arrived, marking their servers dead.
void collect_down_messages(caf::scoped_actor& self, std::vector<replica>& servers,
                           std::chrono::steady_clock::time_point since,
                           std::chrono::milliseconds wait) {
  bool more = true;
  while (more) {
    self->receive(
      [&](caf::down_msg& down) {
        const double ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - since).count();
        for (auto& r : servers) {
          if (r.alive && caf::actor_addr(r.kv.address()) == down.source) {
            r.alive = false;
            std::printf("[client] down message %.1f ms after the kill: the kv actor at %s is "
                        "gone (%s)\n", ms, r.process.address.c_str(),
                        self->system().render(down.reason).c_str());
          }
        }
      },
      caf::after(wait) >> [&] { more = false; });
  }
}

int run_client(std::vector<replica>& servers) {
  caf::actor_system_config cfg;
  comm::actors::node_params params;
  params.listen_address.clear();  // a client only looks up
  comm::actors::node::load(cfg, params);
  caf::actor_system sys{cfg};
  auto& node = *comm::actors::node::get(sys);
  caf::scoped_actor self{sys};
  for (auto& r : servers) {
    auto found = node.lookup(r.process.address, "kv");
    if (!found) {
      std::printf("[client] lookup of kv at %s failed: %s\n", r.process.address.c_str(),
                  sys.render(found.error()).c_str());
      return 1;
    }
    r.kv = *found;
    r.alive = true;
    self->monitor(r.kv);
    std::printf("[client] found kv at %s, monitoring it\n", r.process.address.c_str());
  }
  for (int k = 0; k < key_count; ++k) {
    const std::string key = "key-" + std::to_string(k);
    const int copies = put(self, servers, k, key, "value of " + key);
    std::printf("[client] put %-6s -> %d copies (servers %d and %d)\n", key.c_str(), copies,
                k % server_count, (k + 1) % server_count);
  }
  std::printf("[client] killing server 0 (pid %d) with SIGKILL\n", servers[0].process.pid);
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(servers[0].process.pid, SIGKILL);
  collect_down_messages(self, servers, killed_at, std::chrono::milliseconds(500));
  if (servers[0].alive) std::printf("[client] no down message for server 0 yet\n");
  // Its proxy still exists; a request to it fails at once instead of waiting for the timeout.
  self->request(servers[0].kv, request_timeout, get_atom::value, std::string("key-0"))
    .receive([&](const std::string&) { std::printf("[client] the dead server answered?\n"); },
             [&](const caf::error& e) {
               std::printf("[client] a request to the dead server fails: %s\n",
                           sys.render(e).c_str());
             });
  int readable = 0;
  for (int k = 0; k < key_count; ++k) {
    const std::string key = "key-" + std::to_string(k);
    std::string from;
    const std::string value = get(self, servers, k, key, &from);
    if (value == "value of " + key) ++readable;
    std::printf("[client] get %-6s -> \"%s\" from %s\n", key.c_str(), value.c_str(),
                from.c_str());
  }
  std::printf("[client] %d of %d keys readable after losing a server\n", readable, key_count);
  return readable == key_count ? 0 : 1;
}

}  // namespace

int main() {
  std::vector<replica> servers(server_count);
  for (int i = 0; i < server_count; ++i) {
    servers[i].process = start_server(i);
    if (servers[i].process.address.empty()) {
      std::fprintf(stderr, "server %d did not start\n", i);
      return 1;
    }
  }
  const int rc = run_client(servers);
  for (auto& r : servers) {
    ::kill(r.process.pid, SIGKILL);
    ::waitpid(r.process.pid, nullptr, 0);
  }
  std::printf(rc == 0 ? "kv_service: done\n" : "kv_service: FAILED\n");
  return rc;
}
