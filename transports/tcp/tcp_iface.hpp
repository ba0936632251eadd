// The tcp transport (UCX's uct tcp counterpart): active messages over nonblocking TCP sockets.
//
// An interface listens on its device's address (IPv4 or IPv6, COMM_TCP_AF_PRIO; port 0, the real
// port is its address) and reaches peer interfaces of the same family; a link-local IPv6 peer is
// reached through the interface's own device. Two
// interfaces that talk share ONE connection, both ways: every endpoint from A to B and every
// endpoint from B to A sends on it, and acknowledgements ride on the messages going the other way
// (tcp_wire.hpp has the records, tcp_conn.hpp the connection, tcp_ep.hpp the endpoint).
//
// A handler may keep a message (am_flag_desc, at most max_am_descs at once): the connection's
// receive buffer (or large-frame buffer) holding it is lent out, the bytes after it move to a
// replacement (UCX's tcp hands over its receive buffer the same way).
//   am_short  copied into the connection's send buffer, written at once (max_short 8 KiB, as
//             UCX's tcp);
//   am_bcopy  packed into the send buffer, written at once (max_bcopy 256 KiB);
//   am_zcopy  written with sendmsg straight from the caller's iov (max_zcopy 1 MiB, 16 entries),
//             the rest kept for EPOLLOUT after a partial write; it completes when the peer's
//             acknowledgement says the frame was delivered (the contract: the peer holds the data).
//   put_zcopy/get_zcopy  unless COMM_TCP_RMA=0 (then unsupported, and no memory domain: the
//             protocol layer's rendezvous and RMA go by messages). cap_get_needs_peer: a get is
//             answered by the owner's progress (README.md says what follows from it).
//             max_rma_bytes 4 MiB, 16 entries, on memory registered with the interface's
//             memory domain (tcp_md.hpp): emulated over the connection the way UCX's
//             tcp emulates put. The data moves with no copy of ours on either side: a put is
//             written from the caller's iov, a get's answer from the owner's registered memory,
//             and the receiving side reads it from the socket straight into the target memory;
//             the owner checks every access against its region table (tcp_conn.hpp has the flow).
//             The protocol layer's rendezvous uses get: the receiver reads the sender's buffer.
//
// Who keeps which connection. The interface maps peer interface ids to the connection its
// endpoints use. create_ep reuses the mapped connection or connects (the new one is mapped). An
// accepted connection names its interface in its hello; once the handshake checked it, the
// acceptor decides:
//   - no connection to that peer: the accepted one is mapped;
//   - our mapped connection to it is open: the peer no longer sends on it (it said bye, or lost
//     it), or this is a socket it gave up in a simultaneous connect (about to close). The new one
//     is served but left unmapped; our endpoints stay on the mapped one (the peer reads it until
//     both sides said bye), and create_ep takes the new one once the old one is gone;
//   - our own connect to it is still under way (both connected at once): the connection opened by
//     the interface with the smaller id is kept. If that is ours, the welcome says "duplicate" and
//     the peer's connect is closed; the peer waits (bounded, 10 s) for ours, whose hello is
//     already on its way. If it is the peer's, its socket moves into our connection object,
//     whose own connect is closed. Frames go out only after the welcome, so nothing sent on the
//     losing socket is lost or reordered: messages wait in the connection's buffer meanwhile;
//   - a connection of an interface to itself is served by both of its ends (the accepting end is
//     kept apart from the map).
//
// Authentication (iface_params::auth_key). The acceptor sends a challenge with a fresh nonce right
// after accept, keyed or not:
//
//   connector                                   acceptor
//   TcpHello {ids, window, nonce_c}      ->
//                                        <-     TcpChallenge {keyed, nonce_a}
//   TcpProof {P_c}                       ->                              (keyed only)
//                                        <-     TcpWelcome {outcome, P_a}
//
// with P_c = HMAC-SHA256(key, "comm tcp connector" || nonce_a || nonce_c) and
// P_a = HMAC-SHA256(key, "comm tcp acceptor" || nonce_c || nonce_a) (base/auth.hpp). A keyed
// acceptor reads nothing past the hello but the proof: a wrong proof, anything else in its place,
// or no proof within 10 s closes that connection (logged, counted in info(): "authentication
// refused") before any frame from it is delivered; the connector is told "refused" when it is
// still there and its endpoints fail with status::rejected. The check is mutual: a keyed connector
// delivers nothing from an acceptor whose P_a is wrong, and refuses one that is not keyed; a
// connector without a key refuses a keyed acceptor at once. Either way its endpoints fail
// (rejected) and the error handler is called; other connections are not affected. Nonces are
// fresh on both sides, so a recorded handshake cannot be replayed. Without a key, any host that
// reaches the listener is trusted as the interface it names.
//
// Backpressure, all bounded per connection: bytes the kernel does not take stay in the send buffer
// (send_buffer_size); behind a half-written zcopy, with the send buffer full, or with the peer's
// window (its fifo_size: messages undelivered) used up, sends answer no_resource and the caller
// parks on its endpoint's pending queue, resumed when EPOLLOUT says the socket drained or an
// acknowledgement returns credits. A slow receiver costs the sender one send buffer per peer,
// nothing per message. A peer's puts and gets cost the owner at most max_rma_in_flight queued
// answers per connection (a peer asking for more is closed as broken); a requester's own operations
// beyond that wait in its connection's queue (memory of the caller's outstanding operations).
//
// Everything is driven by one epoll fd per interface, which is also the event fd (level
// triggered: it stays readable while a socket has something for progress()). While a single
// connection is all there is (no other connection, no closing socket), progress() reads it
// directly and asks epoll only every 16th call (for the listener, and EPOLLOUT whenever the
// connection waits for it), saving a system call per message; otherwise it handles at most
// progress_batch socket events. At most frames_per_call frames go per connection per call.
//
// Peer failure: EOF, a reset or any socket error on a connection with endpoints fails them: later
// sends return connection_reset, and progress() completes their outstanding zcopy and flush
// operations with connection_reset and then calls the error handler, once per endpoint. A refused
// connect reports unreachable, a handshake that does not finish within 10 s too. Garbage from a
// peer closes that connection only (logged and counted; its endpoints fail with protocol_error).
//
// A slow peer is not a dead one (tcp_config.hpp has the knobs). What answers while a peer stalls
// was measured on Linux 6.18 with a receiver stopped by SIGSTOP: its kernel acknowledges every
// window probe and keepalive, so the sender's tcpi_last_ack_recv stays below the probe interval
// and tcpi_probes at 0; a host that vanished (its link down) answers nothing, so tcpi_probes (or
// tcpi_retransmits) grows while tcpi_last_ack_recv does; a killed process's kernel resets the
// connection at once. TCP_USER_TIMEOUT is not used: it cut the stopped receiver's connection off
// after its 11 s although every probe was answered. Instead:
//   - a killed peer: the reset or EOF fails its endpoints with connection_reset at once;
//   - a silent host, connection idle: keepalive (answered by the peer's kernel, so a stopped
//     process passes) fails it within COMM_TCP_PEER_TIMEOUT, with endpoint_timeout;
//   - a silent host while bytes of ours wait (unacknowledged, or behind a zero window): while any
//     connection waits, a timer (a timerfd in the epoll set, so a sleeping worker wakes for it)
//     reads TCP_INFO every check period; a connection whose host acknowledged nothing for
//     silence_limit_ms() with a probe or retransmission unanswered at two checks in a row fails
//     with endpoint_timeout, within COMM_TCP_PEER_TIMEOUT. The kernel's probe interval is capped
//     (TCP_RTO_MAX_MS) so a live host answers many times within that bound; a kernel before 6.15
//     backs its probes off to 120 s, and a host that vanishes during a long stall is then noticed
//     only at the next unanswered probe;
//   - a stopped or busy peer process: never failed by default, however long it stalls; nothing is
//     lost, sends wait on the pending queue. With COMM_TCP_STALL_TIMEOUT=s, a connection on which
//     messages of ours stay undelivered asks for an acknowledgement (a heartbeat: an ack frame
//     with ackRequested, answered by the peer's progress) and fails with endpoint_timeout once the
//     peer's delivered count has not moved for s seconds.
//
// Devices: the interfaces that are up with an address of the families COMM_TCP_AF_PRIO lists
// (default inet,inet6: each device's IPv4 address, else its IPv6 one; a global IPv6 address
// before a link-local one), non-loopback first; COMM_TCP_DEVICE=<name>[,<name>] restricts and
// orders them (e.g. COMM_TCP_DEVICE=lo, with COMM_TCP_AF_PRIO=inet6 for ::1).
//
// Lifetime rules as for every transport: completion and pending callbacks must not destroy the
// endpoint that runs them; the error handler may. Destroying an endpoint drops its in-flight zcopy
// completions; what it accepted still goes out (a half-written zcopy frame is copied first, so the
// caller may free its memory at once). When the last endpoint on a connection is gone, that side
// says bye (after its messages) and forgets the connection; once both sides said bye the socket
// is closed gracefully (what is left is written, then the sending side shut down and the rest read
// until the peer's EOF, bounded in time). Endpoints go before their interface. One thread uses an
// interface and its endpoints.
#pragma once

#include "base/desc_pool.hpp"
#include "base/iface_base.hpp"
#include "tcp/tcp_buffer.hpp"
#include "tcp/tcp_config.hpp"
#include "tcp/tcp_md.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include <sys/epoll.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace comm::tl::tcp {

/// Messages handlers may keep at once per interface (am_flag_desc): each holds a connection's
/// receive buffer (256 KiB) or a large frame's own (up to 1 MiB), so at most 16 MiB lent and as
/// much in spares.
inline constexpr size_t max_am_descs = 16;

/// The tcp transport's component.
component& tcp_component();

class tcp_ep;
class tcp_conn;

/// A socket whose connection is over, closed gracefully: what it still holds is written, then its
/// sending side is shut down, and whatever comes is read (and dropped) until the peer closes too.
/// Closing at once would make the kernel reset the connection and drop queued data.
struct lingering_socket {
  int fd = -1;
  bool shut = false;         ///< everything was written and the sending side shut down
  byte_queue bytes;          ///< what is left to write
  uint64_t deadline_ns = 0;  ///< closed then, whatever is left
  poll_target target;
};

/// Byte and message counters of an interface, for info().
struct tcp_counters {
  uint64_t messages_sent = 0;
  uint64_t bytes_sent = 0;        ///< bytes handed to the kernel, framing included
  uint64_t would_block = 0;       ///< writes the kernel did not take in full
  uint64_t no_resource = 0;       ///< sends refused with no_resource
  uint64_t acks_sent = 0;         ///< acknowledgements that went alone (not on a message)
  uint64_t messages_received = 0;
  uint64_t bytes_received = 0;    ///< bytes read from sockets
  uint64_t unhandled = 0;         ///< messages for an am id without handler
  uint64_t malformed = 0;         ///< connections closed for bytes that are not our protocol
  uint64_t auth_checks = 0;       ///< proofs of the key checked
  uint64_t auth_failures = 0;     ///< connections closed because authentication failed
  uint64_t duplicates = 0;        ///< simultaneous connects answered "duplicate"
  uint64_t taken_over = 0;        ///< accepted sockets that replaced our own connect
  uint64_t accepted = 0;          ///< connections accepted
  uint64_t connected = 0;         ///< connections opened
  uint64_t closed = 0;            ///< connections closed
  uint64_t peers_failed = 0;      ///< endpoints failed
  uint64_t silent_hosts = 0;      ///< connections failed: the peer's host stopped answering
  uint64_t stalled_peers = 0;     ///< connections failed: COMM_TCP_STALL_TIMEOUT passed
  uint64_t heartbeats_sent = 0;   ///< acknowledgements asked for by the stall check
  uint64_t liveness_checks = 0;   ///< timer ticks that checked the connections
  uint64_t rma_requests = 0;      ///< puts and gets of ours put on the wire
  uint64_t rma_answers = 0;       ///< answers to peers' puts and gets
  uint64_t rma_bytes_received = 0;  ///< data of puts and get answers read into memory
};

/// A tcp interface: a data listener on one device, its connections to peer interfaces and the
/// endpoints opened from it.
class tcp_iface final : public iface_base {
public:
  /// Opens an interface on `device`; the constructor leaves `open_status()` set.
  tcp_iface(const iface_params& params, const net_device& device);
  ~tcp_iface() noexcept override;

  /// ok, or why the interface could not be opened.
  status open_status() const { return open_status_; }

  // -- iface --

  const iface_attr& attr() const override { return attr_; }
  std::string_view transport_name() const override { return "tcp"; }
  unsigned progress() override;
  int event_fd() const override { return epoll_fd_; }
  status event_arm() override;
  std::vector<uint8_t> device_address() const override;
  std::vector<uint8_t> iface_address() const override;
  bool is_reachable(const std::vector<uint8_t>& device_address,
                    const std::vector<uint8_t>& iface_address) const override;
  status create_ep(const std::vector<uint8_t>& device_address,
                   const std::vector<uint8_t>& iface_address, std::unique_ptr<ep>& out) override;
  std::string info() const override;
  void release_am_desc(void* data) override;
  md* memory_domain() override;

  // -- used by tcp_ep and tcp_conn --

  /// Adds `fd` to the epoll set with `events`, pointing at `target`. False on failure (logged).
  bool watch(int fd, uint32_t events, poll_target* target);
  /// Changes the events of a watched `fd`.
  void rewatch(int fd, uint32_t events, poll_target* target);
  /// Points the registration of `fd` at `to` instead of `from` (whose fetched events are dropped).
  void retarget(int fd, uint32_t events, poll_target* from, poll_target* to);
  /// Removes `fd` from the epoll set; events already fetched for `target` are dropped.
  void unwatch(int fd, poll_target* target);

  /// What the acceptor does with a connection whose handshake checked out (see the header).
  struct admission {
    enum class kind { open, duplicate, adopt };
    kind verdict = kind::open;
    tcp_conn* into = nullptr;  ///< adopt: the connection that takes the socket over
  };
  /// Decides about the accepted `conn` from the interface it named; maps it when it opens.
  admission admit(tcp_conn* conn);
  /// Forgets `conn` as the connection to its peer (it said bye or failed).
  void unmap(tcp_conn* conn);
  /// Removes `conn` (finished) at the next safe point.
  void reap(tcp_conn* conn);
  /// Puts `conn` (complete frames left over) on the list progress() drains first.
  void add_backlog(tcp_conn* conn);

  /// Called after bytes went to a socket: makes sure the liveness timer runs, which checks the
  /// connections while any of them waits for its peer.
  void expect_answers() {
    if (!timer_armed_) [[unlikely]] arm_timer(true);
  }
  /// The knobs this interface runs with.
  const tcp_config& config() const { return config_; }
  /// When the liveness timer last started (it stops while no connection waits).
  uint64_t timer_started_ns() const { return timer_started_ns_; }

  /// Queues `ep` (its connection failed) for progress() to fail and report.
  void notice_failure(tcp_ep* ep);
  /// Gives `ep` another pending dispatch in the next progress().
  void redispatch(tcp_ep* ep);
  /// Forgets `ep` (destroyed).
  void forget(tcp_ep* ep);
  /// Takes over `fd` (unwatched) until `bytes` are written and the peer closed.
  void linger(int fd, byte_queue bytes);

  /// Calls the handler of `id` with a received message (8-byte aligned); true when the handler
  /// kept it as a descriptor (then the buffer holding it goes to descs()).
  bool deliver(am_id id, void* data, size_t length);

  /// Receive buffers lent to handlers that kept a message, and their replacements.
  desc_pool& descs() { return descs_; }

  /// A receive buffer for a frame of `bytes` bytes (the spare one when it is large enough).
  std::unique_ptr<uint64_t[]> take_frame_buffer(size_t bytes, size_t* capacity);
  /// Returns a frame buffer of `capacity` bytes for reuse.
  void give_frame_buffer(std::unique_ptr<uint64_t[]> buffer, size_t capacity);

  /// The record builders every connection of this interface uses (one thread).
  record_writer& writer() { return writer_; }

  /// The memory domain whose regions peers' puts and gets reach.
  tcp_md& tcp_memory_domain() { return *md_; }
  /// Our region `slot` of `generation` was deregistered: tells every connection.
  void region_gone(uint32_t slot, uint64_t generation);
  /// A buffer that data nobody receives is read into and dropped; `*capacity` is its size.
  void* scratch(size_t* capacity);

  tcp_counters& counters() { return counters_; }

  /// The random id of this interface (in its address; hellos must name it).
  uint64_t id() const { return iface_id_; }
  /// The listening port (host byte order) and address.
  uint16_t port() const { return port_; }
  const ip_address& address() const { return device_.address; }
  /// Messages a peer may have undelivered on its connection to this interface.
  uint32_t window() const { return window_; }
  /// The cluster secret; empty when connections are not authenticated.
  const std::string& auth_key() const { return auth_key_; }

  /// CLOCK_MONOTONIC_COARSE in nanoseconds.
  static uint64_t now_ns();

private:
  status open_listener();
  /// The address to connect to for the device address `device` (a link-local one through our
  /// device).
  ip_address reach(const device_addr& device) const;
  unsigned poll_events();
  unsigned dispatch(poll_target* target, uint32_t events);
  unsigned accept_connections();
  unsigned on_connection(tcp_conn* conn, uint32_t events);
  /// After `conn` was handled: removes it when it is over, else queues its leftover frames.
  void settle(tcp_conn* conn);
  void add_connection(std::unique_ptr<tcp_conn> conn);
  void close_connection(tcp_conn* conn);
  void map(tcp_conn* conn);
  /// An open connection from `peer` accepted while another one was mapped, usable now; or null.
  tcp_conn* spare(uint64_t peer) const;
  void remove_reaped();
  unsigned drain_backlog();
  unsigned run_redispatch();
  unsigned on_lingering(lingering_socket* l, uint32_t events);
  /// Handles the events of `l`; false when it is done (the peer closed too) or failed.
  bool lingering_goes_on(lingering_socket* l, uint32_t events);
  /// Writes what `l` still holds, then shuts its sending side down; false when it is done or
  /// failed (then close it).
  bool linger_write(lingering_socket* l);
  void close_lingering(lingering_socket* l);
  void housekeeping();
  status open_timer();
  void arm_timer(bool on);
  /// Remembers (and logs once) that the kernel refused to cap the probe interval.
  void note_probe_cap(bool capped);
  /// A tick of the liveness timer: checks every open connection, stops the timer when none waits.
  unsigned on_timer();
  unsigned report_failures();
  bool any_parked_ep_ready() const;

  status open_status_ = status::ok;
  iface_attr attr_;
  net_device device_;
  uint16_t port_ = 0;
  uint64_t iface_id_ = 0;
  uint32_t window_ = default_window;
  std::string auth_key_;
  int epoll_fd_ = -1;
  int listen_fd_ = -1;
  poll_target listener_target_;
  tcp_config config_;
  int timer_fd_ = -1;            ///< the liveness timer (a timerfd in the epoll set)
  poll_target timer_target_;
  bool timer_armed_ = false;
  uint64_t timer_started_ns_ = 0;
  bool probes_capped_ = true;    ///< the kernel took TCP_RTO_MAX_MS (see set_liveness)


  // The batch of epoll events being dispatched; unwatch() nulls entries of targets that go away.
  epoll_event events_[64];
  int event_count_ = 0;
  int event_cursor_ = 0;
  /// The connection that delivered last: progress() reads it directly between epoll calls.
  tcp_conn* hot_ = nullptr;
  unsigned direct_reads_ = 0;

  std::vector<tcp_ep*> eps_;                       ///< every endpoint of this interface
  std::vector<tcp_ep*> failed_;                    ///< failed endpoints not yet reported
  std::vector<tcp_ep*> redispatch_;                ///< endpoints whose parked requests may go
  std::vector<std::unique_ptr<tcp_conn>> conns_;   ///< every connection, both roles
  std::unordered_map<uint64_t, tcp_conn*> peers_;  ///< peer interface id -> its connection
  std::vector<tcp_conn*> reaped_;                  ///< finished connections to remove
  std::vector<tcp_conn*> backlog_;                 ///< connections with complete frames left
  std::vector<tcp_conn*> backlog_work_;            ///< the backlog being drained
  std::vector<std::unique_ptr<lingering_socket>> lingering_;
  std::unique_ptr<uint64_t[]> spare_frame_;        ///< a large-frame buffer kept for reuse
  size_t spare_capacity_ = 0;
  desc_pool descs_{max_am_descs};                  ///< receive buffers kept by handlers

  record_writer writer_;
  std::unique_ptr<tcp_md> md_;
  std::unique_ptr<uint64_t[]> scratch_;  ///< see scratch()
  unsigned progress_calls_ = 0;
  uint64_t accept_failures_ = 0;
  tcp_counters counters_;
};

}  // namespace comm::tl::tcp
