// The tcp transport's connection manager (UCT's sockaddr CM): client-server connection
// establishment over a TCP socket of its own, separate from the data connections.
//
// The handshake (every message a 4-byte little-endian length and a Cap'n Proto CmMessage):
//
//   client                                   server
//   hello {nonce_c}                 ->
//                                   <-       challenge {nonce_s, proof_s}
//   request {proof_c, private data} ->       (checked; only then the request is handed over)
//                                   <-       reply {status, private data}
//   confirm                         ->
//
// With a key, proof_s = HMAC(key, "server" || nonce_c || nonce_s) and proof_c = HMAC(key,
// "client" || nonce_s || nonce_c): each side proves it holds the key against the other's fresh
// nonce, so a recorded handshake cannot be replayed. A client that fails the check gets a
// REJECTED reply and its request never reaches the server's handler; a server that fails it is
// refused by the client. Without a key the proofs are empty.
//
// The socket only carries this handshake: after the confirm both sides close it and the data goes
// over the lanes the protocol layer picks from the exchanged private data.
//
// Limits: a message is at most 72 KiB (private data up to 64 KiB); a server-side handshake that
// stalls for 10 s is dropped (half-open and silent clients cost nothing after that); at most 4096
// connections at a time, beyond which new sockets are closed at once. Garbage closes only the
// connection that sent it. A wildcard listen address without a key is narrowed to loopback.
#pragma once

#include <comm/transport/transport.hpp>

#include <memory>

namespace comm::tl::tcp {

/// Creates the tcp connection manager.
status open_tcp_cm(const cm_params& params, std::unique_ptr<cm>& out);

}  // namespace comm::tl::tcp
