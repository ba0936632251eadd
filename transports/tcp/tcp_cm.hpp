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
// The client-server flow (cm::resolve, cm::accept_flow; transport.hpp) runs the same messages:
//   - resolve: the host name is resolved (on a thread) and the route to its first address is
//     looked up (a datagram socket connected to it: nothing is sent); the interface owning the
//     route's source address is the device on_resolved is told. Addresses routed through another
//     device are dropped. Numeric addresses are resolved in the next progress().
//   - connect (cm_conn::connect): the private data is given or packed for that device, then the
//     TCP connect, hello, challenge and request go as above; the reply is on_connect.
//   - notify (cm_conn::notify) sends the confirm: the server's on_notify.
//   - the socket then stays open. disconnect shuts its sending side down (after anything queued);
//     the peer reads the end (on_disconnect) and disconnects too, which the first side reads in
//     turn (its on_disconnect). The end of the socket, a reset, or any byte received once
//     connected (nothing belongs there) counts as the peer's disconnect. cm::close closes it.
// A flow connection is released only by cm::close; after a failure it stays, dead, until then.
//
// Addresses: "host:port", "[v6]:port", "[fe80::1%eth0]:port" (a link-local address with its
// interface). A name is tried address by address (IPv4 and IPv6, the resolver's order) until one
// accepts the TCP connect; listening on a name takes its first IPv4 address, else its first. A
// wildcard listen address without a key becomes loopback: 0.0.0.0 gives 127.0.0.1, [::] gives
// ::1; with a key [::] also takes IPv4 clients (IPv4-mapped addresses are shown as IPv4). The
// listener's address() is the address actually bound ("[::1]:40123").
//
// Ownership across callbacks: a request handed to cm_handler::on_request leaves the connection
// manager before the call, so the handler may accept it (here or on another worker), reject it
// or drop it at once. Other connections stay owned by the connection manager until the outermost
// progress() returns, so a handler may close them, connect, or progress again. The connection
// manager (its owner, a worker) must not be destroyed inside its own callbacks: that aborts with a
// message rather than using freed memory.
//
// Limits against hostile or broken clients (server side), knobs of tcp (tcp_config.hpp) read from
// cm_params::opts when the connection manager opens (a bad value: it does not open). A handshake
// is "unauthenticated" from accept until its request arrives:
//   - COMM_TCP_CM_HELLO_TIMEOUT (ms, default 3000): the whole hello must arrive within this time of
//     the accept; a silent or trickling socket is closed then.
//   - COMM_TCP_CM_HANDSHAKE_TIMEOUT (ms, default 10000): the request must arrive within this time
//     of the accept.
//   - COMM_TCP_CM_MAX_HANDSHAKES (default 1024): unauthenticated handshakes held at once, and never
//     more than a quarter of the descriptor limit (RLIMIT_NOFILE), so half-open sockets cannot
//     take the descriptors that accepted clients and their data connections need. When full, a new
//     socket is still accepted and the oldest handshake of the source address holding the most is
//     closed (shed): a flood sheds its own sockets first, and a good client, being newest, gets in.
//     IPv6 sources are counted by /64 (a host usually holds a whole /64).
//   - Out of descriptors (EMFILE, ENFILE): the oldest handshake of the busiest source is shed to
//     make room; with none to shed, accepting pauses for 100 ms (clients wait in the backlog)
//     instead of spinning on a listening socket that stays readable.
//   - A hello, challenge or confirm is at most 256 bytes, a request or reply at most 72 KiB
//     (private data up to 72 KiB less 256 bytes, cm_attr; more is refused with exceeds_limit):
//     at most COMM_TCP_CM_MAX_HANDSHAKES x 72 KiB is buffered.
//   - Garbage closes only the connection that sent it. A wildcard listen address without a key is
//     narrowed to loopback. Shedding, pauses, garbage and failed authentication are logged at
//     warn, each at most once per 10 s with a count.
#pragma once

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace comm::tl::tcp {

/// Creates the tcp connection manager.
status open_tcp_cm(const cm_params& params, std::unique_ptr<cm>& out);

// -- wire format (pure functions, usable on their own) -------------------------------------------

/// One connection manager message, decoded.
struct cm_message {
  /// Which message of the handshake it is.
  enum class kind : uint8_t { hello, challenge, request, reply, confirm };
  kind type = kind::confirm;
  uint16_t version = 0;               ///< hello: the protocol version
  std::vector<uint8_t> nonce;         ///< hello, challenge: the sender's nonce
  std::vector<uint8_t> proof;         ///< challenge, request: HMAC proof (empty without a key)
  int16_t status = 0;                 ///< reply: 0 when accepted, else why not
  std::vector<uint8_t> private_data;  ///< request, reply
};

/// What the front of a receive buffer holds.
struct cm_frame {
  /// Whether a whole frame is there.
  enum class state : uint8_t { incomplete, complete, invalid };
  state at = state::incomplete;
  size_t length = 0;  ///< complete: bytes of the message after the 4-byte length
};

/// Bytes of a frame's length prefix.
inline constexpr size_t cm_frame_prefix = 4;

/// Looks for one frame at the front of `data`: its length is 4 bytes little-endian, then the
/// message. A length of 0, not a multiple of 8, or above `max_length` is invalid.
cm_frame find_cm_frame(const uint8_t* data, size_t size, size_t max_length);

/// Decodes one message (the bytes after a frame's prefix); false when it is malformed.
bool parse_cm_message(const uint8_t* data, size_t length, cm_message* out);

/// Encodes `message` as a whole frame (prefix included).
std::vector<uint8_t> encode_cm_message(const cm_message& message);

}  // namespace comm::tl::tcp
