// Helpers of the client-server suites (test_listener, test_cm_hostile): configurations, endpoint
// callbacks that record what they were told, a listening server and a client worker, and a tagged
// exchange between two workers.
#pragma once

#include "fixture.hpp"
#include "test_util.hpp"

#include <comm/context.hpp>
#include <comm/listener.hpp>
#include <comm/worker.hpp>

#include <deque>
#include <functional>
#include <string>
#include <vector>

namespace comm::test {

inline std::vector<uint8_t> bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

/// The environment's configuration with these transports and this cluster key.
inline config config_with(const std::vector<std::string>& transports,
                          const std::string& key = {}) {
  config cfg = config::from_environment();
  cfg.transports = transports;
  cfg.auth_key = key;
  return cfg;
}

/// What an endpoint's callbacks were told.
struct ep_events {
  int connects = 0;
  std::vector<uint8_t> peer_data;
  int errors = 0;
  status error = status::ok;
};

inline void on_connect(void* arg, endpoint*, const uint8_t* data, size_t length) {
  auto* e = static_cast<ep_events*>(arg);
  ++e->connects;
  e->peer_data.assign(data, data + length);
}

inline void on_error(void* arg, endpoint*, status reason) {
  auto* e = static_cast<ep_events*>(arg);
  ++e->errors;
  e->error = reason;
}

/// Endpoint parameters whose callbacks record into `e`, with `data` as private data.
inline endpoint_params params_for(ep_events& e, const std::string& data = {}) {
  endpoint_params p;
  p.private_data = bytes(data);
  p.on_connect = on_connect;
  p.connect_arg = &e;
  p.on_error = on_error;
  p.error_arg = &e;
  return p;
}

/// A server: one worker listening. Requests are queued for the test to answer, or given to
/// `answer` (inside the listener's callback) when it is set.
struct server {
  explicit server(config cfg, const std::string& address = "127.0.0.1:0")
      : ctx(std::move(cfg)) {
    worker_params wp;
    wp.name = "server";
    w = worker::create(ctx, wp).value();
    listener_params lp;
    lp.address = address;
    lp.on_request = [](void* arg, conn_request* r) {
      auto* self = static_cast<server*>(arg);
      if (self->answer) {
        self->answer(r);
      } else {
        self->requests.push_back(r);
      }
    };
    lp.arg = this;
    BOOST_REQUIRE_EQUAL(w->listen(lp, &l), status::ok);
    port = l->port();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  context ctx;
  std::unique_ptr<worker> w;
  std::unique_ptr<listener> l;
  uint16_t port = 0;
  std::deque<conn_request*> requests;
  std::function<void(conn_request*)> answer;
};

/// A client worker on its own context.
struct client {
  explicit client(config cfg, uint64_t id = 7) : ctx(std::move(cfg)) {
    worker_params wp;
    wp.name = "client";
    wp.client_id = id;
    w = worker::create(ctx, wp).value();
  }
  context ctx;
  std::unique_ptr<worker> w;
};

/// Progresses both workers until `done` or about 10 s.
template <class Done>
bool run(worker& a, worker& b, Done&& done, double seconds = 10.0) {
  return spin_until([&] { a.progress(); b.progress(); }, done, seconds);
}

/// Sends `length` bytes tagged `seed` from `from` and receives them on `to_worker`.
inline bool tag_exchange(worker& from_worker, endpoint* from, worker& to_worker, size_t length,
                         uint32_t seed) {
  const auto data = pattern(length, seed);
  std::vector<uint8_t> got(length);
  recv_tracker r;
  send_tracker s;
  op rop = to_worker.tag_recv(got.data(), got.size(), seed, tag_mask_full, recv_params(r));
  op sop = from->tag_send(seed, data.data(), data.size(), send_params(s));
  if (rop.failed() || sop.failed()) return false;
  const bool ok = run(from_worker, to_worker, [&] {
    return (rop.done() || r.calls == 1) && (sop.done() || s.calls == 1);
  });
  if (rop.req) to_worker.release(rop.req);
  if (sop.req) from_worker.release(sop.req);
  return ok && (rop.done() || r.st == status::ok) && first_mismatch(got.data(), length, seed) < 0;
}

/// A connected pair: the server accepted the client's connection.
struct connected_pair {
  connected_pair(config server_cfg, config client_cfg)
      : srv(std::move(server_cfg)), cli(std::move(client_cfg)) {}

  /// Connects (to `host`, the server's address when empty) and accepts.
  bool establish(const std::string& client_data = "hello", const std::string& reply = "welcome",
                 const std::string& host = {}) {
    const std::string address =
        host.empty() ? srv.address() : host + ":" + std::to_string(srv.port);
    if (cli.w->connect(address, params_for(ce, client_data), &cep) != status::ok) return false;
    if (!run(*srv.w, *cli.w, [&] { return !srv.requests.empty(); })) return false;
    conn_request* r = srv.requests.front();
    srv.requests.pop_front();
    if (srv.l->query(r, &attr) != status::ok) return false;
    if (srv.w->accept(r, params_for(se, reply), &sep) != status::ok) return false;
    return run(*srv.w, *cli.w, [&] { return ce.connects == 1 && se.connects == 1; });
  }

  ep_events ce, se;  // first: destroying the workers below still reports to them
  server srv;
  client cli;
  endpoint* cep = nullptr;
  endpoint* sep = nullptr;
  conn_request_attr attr;
};

}  // namespace comm::test
