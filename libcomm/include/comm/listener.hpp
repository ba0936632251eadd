// Client-server connection establishment (UCP listener / connection request, UCT sockaddr CM).
//
// A server listens on a socket address; each client that connects arrives as a conn_request
// carrying its address, client id, name and private data, which the server accepts (on any worker
// of the same context) or rejects. A client connects to "host:port" with private data and gets an
// endpoint at once: sends issued before the server answers wait, and complete with REJECTED or
// UNREACHABLE when the connection cannot be made. After the handshake each side picks the lane that
// reaches the other: shared memory on the same host, otherwise tcp (COMM_TLS restricts the choice).
//
// With a cluster secret (config::auth_key, COMM_AUTH_KEY or COMM_AUTH_KEY_FILE) both sides prove
// they know it in a challenge-response (HMAC-SHA256) before the server sees the request: a client
// without it is rejected and nothing it sent is delivered. Without a secret a wildcard listen address
// is narrowed to loopback, and the log says so.
#pragma once

#include <comm/endpoint.hpp>
#include <comm/types.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace comm {

class conn_request;
class listener;

/// What a connection request says about the client (ucp_conn_request_attr_t).
struct conn_request_attr {
  std::string client_address;         ///< "ip:port" of the client's socket
  uint64_t client_id = 0;             ///< the client worker's worker_params::client_id
  std::string client_name;            ///< the client worker's name
  std::vector<uint8_t> private_data;  ///< what the client passed in endpoint_params::private_data
};

/// Called on the listener's worker (inside progress) for each client that connected. The request
/// must be answered with worker::accept or listener::reject; requests left unanswered are rejected
/// when the listener is destroyed.
using conn_request_callback = void (*)(void* arg, conn_request* request);

/// Called once a connection is established: on the client when the server accepted (with the
/// server's private data), on the server when the client confirmed (no private data).
using connect_callback = void (*)(void* arg, endpoint* ep, const uint8_t* private_data,
                                  size_t length);

/// Called on the listener's worker (inside progress) with each endpoint a listener created by
/// itself (listener_params::on_accept; ucp_listener_accept_callback_t). The endpoint is the
/// user's, as one from worker::accept: its on_connect (accept_params) tells when it is
/// established.
using accept_callback = void (*)(void* arg, endpoint* ep);

/// Parameters of a client connect or a server accept.
struct endpoint_params {
  /// Bytes for the peer: the client's reach the server's conn_request, the server's reach the
  /// client's on_connect. At most max_private_data bytes.
  std::vector<uint8_t> private_data;
  /// Told when the endpoint fails (also REJECTED, UNREACHABLE); posted tag receives stay posted
  /// (see endpoint_error_callback).
  endpoint_error_callback on_error = nullptr;
  void* error_arg = nullptr;              ///< passed to on_error
  connect_callback on_connect = nullptr;  ///< told when the connection is established
  void* connect_arg = nullptr;            ///< passed to on_connect
  int timeout_ms = 10000;                 ///< connection establishment limit (ENDPOINT_TIMEOUT)
};

/// Parameters of worker::listen (ucp_listener_params_t). Set one of on_request (the user
/// answers each request) and on_accept (the listener accepts each itself); with neither, every
/// request is rejected.
struct listener_params {
  /// "host:port" or ":port" to listen on. Port 0 picks a free port (see listener::port). Empty
  /// or "0.0.0.0" means every interface, which without an auth key is narrowed to loopback.
  std::string address;
  int backlog = 0;                        ///< listen(2) backlog; 0 for the system maximum
  conn_request_callback on_request = nullptr; ///< told about each connection request
  void* arg = nullptr;                    ///< passed to on_request
  /// Without on_request: the listener accepts every request on its own worker with
  /// `accept_params` and tells the endpoint here (ucp_listener_accept_handler). A request the
  /// accept fails for (unreachable client) is rejected with that status, untold.
  accept_callback on_accept = nullptr;
  void* accept_arg = nullptr;             ///< passed to on_accept
  endpoint_params accept_params;          ///< the endpoints on_accept gets are made with these
};

/// Largest private data a connect or accept may carry.
inline constexpr size_t max_private_data = 64 * 1024;

/// A listening socket owned by a worker (ucp_listener). Destroy it on the worker's thread;
/// established endpoints are not affected.
class listener {
public:
  virtual ~listener() = default;

  /// The address actually bound, "ip:port".
  virtual std::string address() const = 0;
  /// The port actually bound.
  virtual uint16_t port() const = 0;
  /// Connection requests received so far.
  virtual uint64_t requests() const = 0;

  /// Rejects a connection request (ucp_listener_reject): the client's endpoint fails with
  /// REJECTED. The request is released.
  virtual status reject(conn_request* request) = 0;

  /// Describes a pending connection request; invalid_param for a request not of this listener.
  virtual status query(const conn_request* request, conn_request_attr* out) const = 0;
};

}  // namespace comm
