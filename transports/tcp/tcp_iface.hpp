// The tcp transport (UCX's uct tcp counterpart): active messages over nonblocking TCP sockets.
//
// An interface listens on its device's IPv4 address (port 0, the real port is its address). An
// endpoint connects to a peer interface's listener and sends on that connection; the accepting
// interface receives on it and writes back only acknowledgements (tcp_wire.hpp has the format).
// Connections are one-way for messages: two interfaces that talk both ways use two connections.
//
//   am_short  copied into the endpoint's send buffer, written at once (max_short 256);
//   am_bcopy  packed into the send buffer, written at once (max_bcopy 64 KiB);
//   am_zcopy  written with sendmsg straight from the caller's iov (max_zcopy 1 MiB, 16 entries),
//             the rest kept for EPOLLOUT after a partial write; it completes when the peer's
//             acknowledgement says the frame was delivered (the contract: the peer holds the data).
// No get/put: the protocol layer uses its software rendezvous, streaming bcopy fragments.
//
// Backpressure, all bounded per endpoint: bytes the kernel does not take stay in the send buffer
// (send_buffer_size); behind a half-written zcopy, with the send buffer full, or with the peer's
// window (its fifo_size: frames undelivered) used up, sends answer no_resource and the caller parks
// on the pending queue, resumed when EPOLLOUT says the socket drained or an acknowledgement returns
// credits. A slow receiver costs the sender one send buffer per endpoint, nothing per message.
//
// Everything is driven by one epoll fd per interface, which is also the event fd (level
// triggered: it stays readable while a socket has something for progress()). progress() handles at
// most progress_batch socket events and frames_per_call frames per connection per call.
//
// Peer failure: EOF, a reset or any socket error on an endpoint's connection fails the endpoint:
// later sends return connection_reset, and progress() completes its outstanding zcopy and flush
// operations with connection_reset and then calls the error handler, once. A refused connect
// reports unreachable. Garbage from a peer closes that connection only (logged and counted), and a
// connection that says no hello within 10 s is dropped. Keepalive with short timers (and
// TCP_USER_TIMEOUT) notices silent peers within about 11 s.
//
// Devices: the IPv4 interfaces that are up, non-loopback first; COMM_TCP_DEVICE=<name>[,<name>]
// restricts and orders them (e.g. COMM_TCP_DEVICE=lo).
//
// Lifetime rules as for every transport: completion and pending callbacks must not destroy the
// endpoint that runs them; the error handler may. Destroying an endpoint drops its in-flight zcopy
// completions; what it accepted still goes out and its socket is closed gracefully (bounded in
// time). Endpoints go before their interface. One thread uses an interface and its endpoints.
#pragma once

#include "tcp/tcp_buffer.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include <sys/epoll.h>

#include <memory>
#include <string>
#include <vector>

namespace comm::tl::tcp {

/// The tcp transport's component.
component& tcp_component();

class tcp_ep;
class tcp_conn;

/// The socket of a destroyed endpoint, closed gracefully: what its send buffer holds is written,
/// then its sending side is shut down, and acknowledgements are read (and dropped) until the peer
/// closes too. Closing at once would make the kernel reset the connection and drop queued data.
struct lingering_socket {
  int fd = -1;
  bool connecting = false;   ///< its connect has not finished yet
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
  uint64_t messages_received = 0;
  uint64_t bytes_received = 0;    ///< bytes read from sockets
  uint64_t unhandled = 0;         ///< messages for an am id without handler
  uint64_t malformed = 0;         ///< connections closed for bytes that are not our protocol
  uint64_t accepted = 0;          ///< connections accepted
  uint64_t closed = 0;            ///< accepted connections closed
  uint64_t peers_failed = 0;      ///< endpoints failed
};

/// A tcp interface: a data listener on one device, the connections it accepted and the endpoints
/// opened from it.
class tcp_iface final : public iface {
public:
  /// Opens an interface on `device`; the constructor leaves `open_status()` set.
  tcp_iface(const iface_params& params, const ipv4_device& device);
  ~tcp_iface() noexcept override;

  /// ok, or why the interface could not be opened.
  status open_status() const { return open_status_; }

  // -- iface --

  const iface_attr& attr() const override { return attr_; }
  std::string_view transport_name() const override { return "tcp"; }
  void set_am_handler(am_id id, am_handler_fn fn, void* arg) override;
  void set_error_handler(error_handler_fn fn, void* arg) override;
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

  // -- used by tcp_ep and tcp_conn --

  /// Adds `fd` to the epoll set with `events`, pointing at `target`. False on failure (logged).
  bool watch(int fd, uint32_t events, poll_target* target);
  /// Changes the events of a watched `fd`.
  void rewatch(int fd, uint32_t events, poll_target* target);
  /// Removes `fd` from the epoll set; events already fetched for `target` are dropped.
  void unwatch(int fd, poll_target* target);

  /// Queues `ep` (its connection failed) for progress() to fail and report.
  void notice_failure(tcp_ep* ep);
  /// Gives `ep` another pending dispatch in the next progress().
  void redispatch(tcp_ep* ep);
  /// Forgets `ep` (destroyed).
  void forget(tcp_ep* ep);
  /// Takes over the socket of a destroyed endpoint until `bytes` are written.
  void linger(int fd, bool connecting, byte_queue bytes);

  /// Calls the handler of `id` with a received message (8-byte aligned).
  void deliver(am_id id, void* data, size_t length);
  /// Puts `conn` (complete frames left over) on the list progress() drains first.
  void add_backlog(tcp_conn* conn);

  /// A receive buffer for a frame of `bytes` bytes (the spare one when it is large enough).
  std::unique_ptr<uint64_t[]> take_frame_buffer(size_t bytes, size_t* capacity);
  /// Returns a frame buffer of `capacity` bytes for reuse.
  void give_frame_buffer(std::unique_ptr<uint64_t[]> buffer, size_t capacity);

  /// The frame header writer every endpoint of this interface uses (one thread).
  wire::header_writer<wire::schema::TcpFrame>& frame_writer() { return frame_writer_; }
  /// Writes the hello for a connection to the interface `peer_id` at `dest` (hello_size bytes).
  void write_hello(uint64_t peer_id, void* dest);
  /// Writes an acknowledgement of `delivered` zcopy frames at `dest` (ack_size bytes).
  void write_ack(uint64_t delivered, void* dest);

  tcp_counters& counters() { return counters_; }

  /// The random id of this interface (in its address; hellos must name it).
  uint64_t id() const { return iface_id_; }

  /// Frames a sender may have undelivered on one connection to this interface.
  uint32_t window() const { return window_; }

private:
  struct handler {
    am_handler_fn fn = nullptr;
    void* arg = nullptr;
  };

  status open_listener();
  unsigned poll_events();
  unsigned dispatch(poll_target* target, uint32_t events);
  unsigned accept_connections();
  unsigned on_connection(tcp_conn* conn, uint32_t events);
  /// After `conn` delivered: closes it when it is over, else queues its leftover frames.
  void settle(tcp_conn* conn);
  void close_connection(tcp_conn* conn);
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
  unsigned report_failures();
  bool any_parked_ep_ready() const;

  status open_status_ = status::ok;
  iface_attr attr_;
  ipv4_device device_;
  uint16_t port_ = 0;
  uint64_t iface_id_ = 0;
  uint32_t window_ = default_window;
  int epoll_fd_ = -1;
  int listen_fd_ = -1;
  poll_target listener_target_;

  handler handlers_[am_id_count];
  error_handler_fn error_fn_ = nullptr;
  void* error_arg_ = nullptr;

  // The batch of epoll events being dispatched; unwatch() nulls entries of targets that go away.
  epoll_event events_[64];
  int event_count_ = 0;
  int event_cursor_ = 0;

  std::vector<tcp_ep*> eps_;                       ///< every endpoint of this interface
  std::vector<tcp_ep*> failed_;                    ///< failed endpoints not yet reported
  std::vector<tcp_ep*> redispatch_;                ///< endpoints whose parked requests may go
  std::vector<std::unique_ptr<tcp_conn>> conns_;   ///< accepted connections
  std::vector<tcp_conn*> backlog_;                 ///< connections with complete frames left
  std::vector<tcp_conn*> backlog_work_;            ///< the backlog being drained
  std::vector<std::unique_ptr<lingering_socket>> lingering_;
  std::unique_ptr<uint64_t[]> spare_frame_;        ///< a large-frame buffer kept for reuse
  size_t spare_capacity_ = 0;

  wire::header_writer<wire::schema::TcpFrame> frame_writer_;
  wire::header_writer<wire::schema::TcpHello> hello_writer_;
  wire::header_writer<wire::schema::TcpAck> ack_writer_;
  unsigned progress_calls_ = 0;
  uint64_t accept_failures_ = 0;
  tcp_counters counters_;
};

}  // namespace comm::tl::tcp
