// A tcp connection: one socket that carries messages both ways between two interfaces, shared by
// every endpoint of either interface towards the other (see tcp_iface.hpp for who keeps which
// connection and tcp_wire.hpp for the records).
//
// Sending: endpoints append frames to the connection's send buffer (short and bcopy, copied) or
// queue one zcopy frame whose iov the kernel has not taken completely; the order on the wire is the
// order of the calls. Nothing but handshake records goes out before the handshake is over; frames
// sent meanwhile wait in the buffer. Every message counts against the peer's window until a
// `delivered` count coming back covers it.
//
// Receiving: the connection reads into its receive buffer, runs the handshake, then cuts complete
// frames out of the byte stream and hands messages to the interface's handlers in place (frames
// are padded to 8 bytes, so payloads stay 8-byte aligned). A frame too large for the receive buffer
// is read straight into a frame buffer of its own. At most frames_per_call frames go per call.
//
// Acknowledging: each header we send carries how many messages we delivered; a bare ack goes at
// the end of a call that delivered a zcopy frame, or once half of our window was delivered
// unacknowledged, and only when nothing else carried it.
//
// Put and get (tcp_md.hpp has the memory domain). A requester's operations wait in the connection's
// queue in call order and go on the wire in that order, at most max_rma_in_flight unanswered: a get
// as a small request frame in the send buffer, a put as a zcopy frame straight from the caller's
// iov. While operations wait, messages sent after them wait too (no_resource), so the order on the
// wire is the order of the calls. The owner checks each against its region table and answers in
// the order asked: a get's answer is a zcopy frame straight from the registered memory, a put's (or
// a refusal) a small frame. Data arriving for a put or a get is read from the socket straight into
// the target memory (only what came in one read with its header is copied out of the receive
// buffer); data nobody may receive any more (a refused put, the get of an endpoint destroyed
// meanwhile) is read and dropped. Operations complete with the answer, from progress().
#pragma once

#include "base/auth.hpp"
#include "base/ring_queue.hpp"
#include "tcp/tcp_buffer.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

#include <comm/transport/transport.hpp>

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace comm::tl::tcp {

class tcp_iface;
class tcp_ep;

/// Bytes of a connection's receive buffer (a frame larger than half of it gets a buffer of its
/// own).
inline constexpr size_t receive_buffer_size = 256 * 1024;
/// Frames delivered per connection per progress() call.
inline constexpr unsigned frames_per_call = 64;
/// Bytes of messages a connection buffers beyond what the kernel took: two largest bcopy frames.
inline constexpr size_t send_buffer_size = 2 * frame_size(max_bcopy);
/// Room beyond send_buffer_size for the records the connection adds itself (acks, the bye).
inline constexpr size_t control_room = 16 * frame_header_size;

class tcp_conn {
public:
  /// Who opened the socket.
  enum class role : uint8_t { connector, acceptor };

  /// Where the connection stands.
  enum class phase : uint8_t {
    connecting,  ///< connector: the nonblocking connect is under way
    handshake,   ///< hello, challenge, proof and welcome are being exchanged
    awaiting,    ///< connector told "duplicate": no socket, the peer's own connection is coming
    open,        ///< frames go both ways
    finished,    ///< over (failed, refused, handed on or closed): the interface removes it
  };

  /// A connection we open to the interface `peer` at `peer_ip` over `fd` (connected, or with its
  /// connect in progress). Check finished() afterwards: registering the socket may fail.
  tcp_conn(tcp_iface& owner, int fd, bool connected, const ip_address& peer_ip,
           const iface_addr& peer,
           uint64_t now_ns);
  /// A connection accepted from `peer_ip`:`peer_port`; its challenge goes out at once.
  tcp_conn(tcp_iface& owner, int fd, const ip_address& peer_ip, uint16_t peer_port,
           uint64_t now_ns);
  ~tcp_conn();
  tcp_conn(const tcp_conn&) = delete;
  tcp_conn& operator=(const tcp_conn&) = delete;

  // -- sending (tcp_ep) --

  /// Room for a message frame of `bytes` bytes in the send buffer, or null: the peer's window is
  /// used up, a zcopy frame is half written, or the buffer is full. commit_message() what is
  /// written there.
  uint8_t* reserve_message(size_t bytes) {
    if (zcopy_queued_ || !window_open() || tx_.size() + bytes > send_buffer_size ||
        !rma_waiting_.empty()) [[unlikely]] {
      return nullptr;
    }
    return tx_.reserve(bytes);
  }

  /// Writes the header of a message frame (`length` bytes follow) at `dest`; returns its size.
  size_t put_header(am_id id, size_t length, bool ack, uint8_t* dest);

  /// Pads and appends the message frame written at `frame`, and writes when the socket is idle.
  void commit_message(uint8_t* frame, size_t length);

  /// True when a zcopy frame may be queued now (window open, none half written, no put or get
  /// waiting to go before it).
  bool zcopy_room() const { return !zcopy_queued_ && window_open() && rma_waiting_.empty(); }

  /// Queues a zcopy frame of `by`: header + the iov, `total` bytes of iov in all. Returns the
  /// number of the frame (what `delivered` must reach for it to be acknowledged).
  uint64_t queue_zcopy(tcp_ep* by, am_id id, const void* header, size_t header_length,
                       const iov* entries, size_t count, size_t total);

  /// True when parked requests may run: a largest bcopy frame fits and a zcopy may be queued.
  bool has_room() const {
    return zcopy_room() && tx_.size() + frame_size(max_bcopy) <= send_buffer_size;
  }

  /// A put or get of endpoint `by`, checked by it: `entries` (up to max_iov, total `length` > 0
  /// bytes) from or into [address, address + length) of the peer's region in `slot` with
  /// `generation`. Queued behind earlier ones; `comp` completes from progress() with the owner's
  /// answer (by->rma_done()).
  void queue_rma(tcp_ep* by, bool write, const iov* entries, size_t count, uint32_t slot,
                 uint64_t generation, uint64_t address, uint64_t length, completion* comp);

  /// The region in `slot` with `generation` of our memory domain was deregistered: answers not
  /// started refuse, a get answer half written is copied, a put arriving into it is dropped.
  void region_gone(uint32_t slot, uint64_t generation);

  /// True when the kernel took every message frame given to the connection (the handshake's own
  /// records are not messages: a connection still being set up with nothing sent is written).
  bool all_written() const { return tx_.empty() && !zcopy_queued_; }

  /// Messages of ours the peer said it delivered.
  uint64_t peer_delivered() const { return peer_delivered_; }

  /// Adds an endpoint that sends on this connection.
  void attach(tcp_ep* ep);
  /// Removes an endpoint (destroyed): a half-written zcopy frame of it is copied, so it still goes
  /// out in full after the caller frees its memory; the last one gone makes us say bye.
  void detach(tcp_ep* ep);

  // -- events (tcp_iface) --

  /// Handles epoll events (or EPOLLIN for a direct read); returns the number of messages
  /// delivered. Afterwards finished() tells whether the interface must remove the connection.
  unsigned on_events(uint32_t events);

  /// Delivers complete frames already in the receive buffer; returns the number delivered.
  unsigned deliver_buffered();

  /// True when complete frames (or handshake records) wait in the receive buffer.
  bool has_frames() const;

  /// After reading or writing: completes the zcopy operations the peer acknowledged, completes
  /// flushes, dispatches parked requests, sends a bare ack or the bye when due, closes once both
  /// sides said bye. Returns the number of operations advanced.
  unsigned after_io();

  /// Fails the connection: its endpoints fail with `reason` (reported from progress) and the
  /// interface removes it. `why`/`error` are logged.
  void fail(status reason, const char* why, int error);

  /// Takes over the socket of `from`, an accepted connection whose handshake made it this
  /// connection's (the peer connected to us while our own connect was under way, or after it was
  /// called a duplicate). Our own socket, if any, is closed; `from` is finished.
  void take_socket(tcp_conn& from);

  /// Marks the connection as over without failing anything (its socket is gone or handed on);
  /// the interface removes it.
  void finish();

  /// Gives up waiting for the peer's connection at `now_ns`: true when the deadline passed
  /// (handshake or awaiting), after which the connection has failed.
  bool check_deadline(uint64_t now_ns);

  /// A tick of the interface's liveness timer at `now_ns` (see tcp_iface.hpp): fails the
  /// connection with endpoint_timeout when the peer's host went silent, or when the peer process
  /// left our messages undelivered for COMM_TCP_STALL_TIMEOUT (asking it for an acknowledgement
  /// first). Returns true while the connection waits for its peer: bytes of ours unacknowledged by
  /// its kernel, or, with a stall timeout, messages it has not delivered.
  bool check_liveness(uint64_t now_ns);

  // -- state --

  phase state() const { return phase_; }
  bool finished() const { return phase_ == phase::finished; }
  role side() const { return role_; }
  /// The peer interface's id (from its address or its hello; 0 before the hello).
  uint64_t peer_id() const { return peer_id_; }
  /// Endpoints sending on this connection.
  size_t endpoints() const { return eps_.size() - holes_; }
  /// True when the bye went / came.
  bool bye_sent() const { return bye_sent_; }
  bool bye_received() const { return bye_received_; }
  /// True while the connection needs EPOLLOUT (bytes the kernel did not take, or the connect).
  bool out_watched() const { return out_watched_; }

  int fd() const { return fd_; }
  poll_target* target() { return &target_; }

  /// Set by the interface while the connection is on its backlog list / in its peer map.
  bool in_backlog = false;
  bool mapped = false;
  /// Position in the interface's connection list (kept by the interface).
  size_t index = 0;

  /// "ip:port (interface ip:port, state)" for logs and info().
  std::string describe() const;

private:
  /// The zcopy frame the kernel has not taken completely: frame header + protocol header, the
  /// caller's iov, padding.
  struct zcopy_frame {
    alignas(8) uint8_t head[frame_header_size + max_hdr];
    iovec vec[max_iov + 2];
    size_t count = 0;        ///< entries in vec
    size_t first = 0;        ///< first entry not written completely
  };

  /// A put or get of ours, from the call until the owner's answer.
  struct rma_op {
    uint64_t number = 0;        ///< on this connection (1, 2, ...) once on the wire
    tcp_ep* ep = nullptr;       ///< null once the endpoint is gone (a get's data is then dropped)
    completion* comp = nullptr;
    bool write = false;         ///< a put
    uint32_t slot = 0;
    uint64_t generation = 0;
    uint64_t address = 0;
    uint64_t length = 0;
    size_t count = 0;
    iov entries[max_iov];
  };
  /// An answer we owe the peer for its put or get, in the order asked.
  struct rma_answer {
    uint64_t op = 0;
    status result = status::ok;
    uint32_t slot = 0;               ///< the region read by a get that succeeded
    uint64_t generation = 0;
    const uint8_t* data = nullptr;   ///< a get that succeeded: the bytes to send
    uint64_t length = 0;
    /// `data` copied out of the region (a later put of the peer writes over it first).
    std::unique_ptr<uint8_t[]> copy;
  };
  /// Where the data of an rma frame being read goes: straight into memory, or dropped.
  struct rma_sink {
    bool active = false;
    bool keep = false;           ///< into vec; else read into the scratch buffer and dropped
    bool put = false;            ///< the data of a peer's put (else the answer to a get of ours)
    iovec vec[max_iov + 1];      ///< the target memory, then the padding
    size_t count = 0;
    size_t first = 0;
    size_t left = 0;             ///< bytes still to read: data and padding
    // a put: what to answer once it is in
    uint64_t op = 0;
    status result = status::ok;
    uint32_t slot = 0;
    uint64_t generation = 0;
    // a get of ours: whom to tell
    tcp_ep* ep = nullptr;
    completion* comp = nullptr;
  };

  bool window_open() const { return frames_sent_ - peer_delivered_ < window_; }
  /// Fills zop_ with `head` bytes at zop_.head, then `entries` (empty ones left out), then the
  /// padding of the frame, and marks it queued.
  void queue_zcopy_frame(size_t head, const iov* entries, size_t count);

  // put and get
  /// Puts waiting operations on the wire while the in-flight bound, the send buffer and the zcopy
  /// slot allow.
  void send_rma_requests();
  /// Writes the answers owed, in order, while the send buffer and the zcopy slot allow.
  void send_rma_answers();
  /// Room in the send buffer (within send_buffer_size) for an rma frame without data, or null.
  uint8_t* reserve_rma_record();
  /// Handles the rma frame `frame` at the head of the receive buffer; false when its record is not
  /// all there yet or the frame was garbage.
  bool take_rma(parsed_frame& frame);
  void take_get_request(const parsed_rma& rma);
  void start_put(const parsed_rma& rma, size_t rest);
  /// Copies the data of answers not written yet that [address, address + length) overlaps: the
  /// peer's put there comes after its get, so the get must see the bytes from before it.
  void keep_answers_before_put(uint64_t address, uint64_t length);
  void take_answer(const parsed_rma& rma, size_t rest);
  /// Moves what the receive buffer holds of the sink's data into it.
  void sink_from_buffer();
  /// Reads the sink's data from the socket; true when it is complete.
  bool read_sink();
  void advance_sink(size_t bytes);
  void finish_sink();
  /// Hands a finished operation to its endpoint (completed from after_io()).
  void rma_finished(tcp_ep* ep, completion* comp, status result);
  /// The peer failed: every operation of ours completes with `reason` through its endpoint.
  void fail_rma(status reason);
  /// Drops the operations of `ep` (destroyed): waiting ones are forgotten, data still coming for
  /// its gets is dropped.
  void orphan_rma(tcp_ep* ep);
  /// Notes the `delivered` count a frame carries; false (connection closed) when it is impossible.
  bool note_delivered(const parsed_frame& frame);

  // reading
  unsigned on_readable();
  bool read_large();
  bool read_small();
  bool account(ssize_t got);
  void start_large(const parsed_frame& frame);
  unsigned finish_large();
  /// Handles one checked frame at `start`; returns 1 when it was a message.
  unsigned take_frame(const parsed_frame& frame, uint8_t* start);
  void garbage(const char* why);

  // liveness
  /// Counts checks at which the kernel waits for the peer's host, asks and hears nothing; true
  /// (and the connection failed) at the second in a row.
  bool host_silent(const peer_answers& answers);
  /// True (and the connection failed) when the peer's delivered count has not moved for the stall
  /// timeout while messages of ours wait; asks for an acknowledgement once per such wait.
  bool peer_stalled(uint64_t now_ns, bool undelivered);

  // handshake
  /// Consumes one handshake record; false when it is incomplete or the handshake ended badly.
  bool take_handshake_record();
  bool take_hello();
  bool take_proof();
  bool take_challenge();
  bool take_welcome();
  /// Acceptor: hello (and proof) checked; asks the interface what to do with us.
  void decide();
  /// Acceptor: answers with `result` and hands the socket to the interface's lingering list.
  void refuse(outcome result);
  /// Connector: the peer does not pass our authentication rules.
  void reject_peer(const char* why);
  void queue_welcome(outcome result);
  void become_open();
  void finish_connect();

  // writing
  /// Appends a control frame (ack or bye; `ask`: the peer acknowledges at once) carrying our
  /// delivered count; false when it cannot go now (behind a half-written zcopy, or no room).
  bool append_control(frame_kind kind, bool ask);
  void write_queued();
  void consume_written(size_t sent);
  void update_interest();
  /// Appends a bare ack when one is due and the buffer has room.
  void send_ack_if_due();
  bool ack_due() const;
  /// Says bye when we have no endpoints left here (or the peer said it and we have none).
  void maybe_bye();
  /// Hands the socket to the lingering list once both sides said bye.
  void close_gracefully();
  /// Bytes still to write: handshake records, the send buffer, the rest of a zcopy frame.
  byte_queue leftovers();
  /// Copies the unwritten rest of the queued zcopy frame into memory of our own.
  void own_zcopy_rest();

  template <class F>
  void for_each_ep(F&& f);

  tcp_iface& owner_;
  int fd_ = -1;
  role role_;
  phase phase_;
  bool out_watched_ = false;
  const uint64_t started_ns_;    ///< connect started / accepted
  uint64_t deadline_ns_ = 0;     ///< awaiting: give up then

  // the peer
  ip_address peer_ip_;           ///< the socket's peer
  uint16_t peer_port_ = 0;
  uint64_t peer_id_ = 0;
  ip_address listen_ip_;         ///< the peer interface's listener (from its address or hello)
  uint16_t listen_port_ = 0;
  uint32_t window_ = default_window;  ///< messages the peer accepts undelivered

  // handshake
  auth::nonce own_nonce_{};
  uint8_t peer_nonce_[auth::nonce_size] = {};
  bool keyed_ = false;           ///< proofs are exchanged on this connection
  bool hello_done_ = false;      ///< acceptor: the hello arrived / connector: the challenge did
  byte_queue hs_out_;            ///< handshake records not yet written

  // sending
  byte_queue tx_;
  zcopy_frame zop_;
  bool zcopy_queued_ = false;
  tcp_ep* zop_owner_ = nullptr;  ///< whose iov zop_ points into (null once copied)
  bool zop_answer_ = false;      ///< zop_ is a get answer from our region zop_slot_/generation
  uint32_t zop_slot_ = 0;
  uint64_t zop_generation_ = 0;
  std::unique_ptr<uint8_t[]> zop_copy_;
  uint64_t frames_sent_ = 0;     ///< messages accepted for sending
  uint64_t peer_delivered_ = 0;  ///< messages the peer said it delivered
  bool acks_advanced_ = false;   ///< peer_delivered_ grew since after_io() last ran

  // receiving
  byte_queue in_;
  std::unique_ptr<uint64_t[]> large_;   ///< a frame larger than half of the receive buffer
  size_t large_capacity_ = 0;
  size_t large_total_ = 0;              ///< bytes of that frame, 0 when none
  size_t large_filled_ = 0;
  parsed_frame large_frame_;
  uint64_t delivered_ = 0;       ///< messages delivered from the peer
  bool desc_kept_ = false;       ///< the handler kept the frame take_frame just delivered
  uint64_t ack_sent_ = 0;        ///< the largest `delivered` put on the wire
  bool ack_urgent_ = false;      ///< a zcopy frame was delivered since then

  // put and get
  // Rings, not deques: a put or get queued on a warm connection allocates nothing.
  ring_queue<rma_op> rma_waiting_;  ///< ours, not on the wire yet
  ring_queue<rma_op> rma_sent_;     ///< ours, on the wire, unanswered (max_rma_in_flight)
  uint64_t rma_numbered_ = 0;       ///< operations of ours put on the wire
  struct rma_result {
    tcp_ep* ep;
    completion* comp;
    status result;
  };
  std::vector<rma_result> rma_done_;  ///< finished, to complete from after_io()
  std::deque<rma_answer> answers_;    ///< owed to the peer (max_rma_in_flight)
  rma_sink sink_;
  uint64_t pad_sink_ = 0;             ///< where the padding after rma data is read to

  // liveness
  uint8_t silent_checks_ = 0;    ///< checks in a row that found the peer's host silent
  uint64_t delivered_seen_ = 0;  ///< peer_delivered_ at the last check
  uint64_t progress_ns_ = 0;     ///< when the last check saw it move or nothing waiting
  bool heartbeat_sent_ = false;  ///< an acknowledgement was asked for since then

  // endpoints and closing
  std::vector<tcp_ep*> eps_;
  size_t holes_ = 0;             ///< null entries left by detach() during for_each_ep
  int iterating_ = 0;
  bool had_eps_ = false;
  bool bye_sent_ = false;
  bool bye_received_ = false;

  poll_target target_;
};

}  // namespace comm::tl::tcp
