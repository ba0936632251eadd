// What the tcp transport puts on the wire and into its addresses.
//
// One connection carries messages both ways between two interfaces. The connecting side speaks
// first; neither side sends frames before the handshake is over:
//
//   connector                                   acceptor
//   TcpHello {ids, window, nonce_c}      ->
//                                        <-     TcpChallenge {keyed, nonce_a}   (right after accept)
//   TcpProof {HMAC over nonce_a, nonce_c} ->                                    (keyed acceptor only)
//                                        <-     TcpWelcome {outcome, HMAC over nonce_c, nonce_a}
//   TcpFrame | bytes | pad ...          <->     TcpFrame | bytes | pad ...
//
// Every record after the handshake is a TcpFrame header followed by `length` bytes padded to a
// multiple of 8: a message (kind message), a bare acknowledgement (kind ack, length 0) or a bye.
// Every header carries `delivered`, the number of messages of the other direction delivered so
// far, so acknowledgements ride on the traffic going back; a bare ack goes only when one is due
// and nothing else is sent. Acknowledgements do two things. A zcopy completes once the peer holds
// its data (the transport contract), not merely when the kernel took it: its frame asks for a
// prompt ack. And they return send credits: a side has at most `window` messages undelivered (the
// receiving interface's fifo_size, its "receive queue entries", in its address and its hello);
// other acks are due once half a window was delivered, so a ping-pong never waits for one. A bare
// ack that asks for an acknowledgement itself (ackRequested) is a heartbeat: the receiver answers
// with its count as soon as its process reads it (the stall check of tcp_iface.hpp). A bye
// says the sender has no endpoints on the connection left and will send no more messages; once
// both sides said it, the connection closes gracefully.
//
// All records are data-only Cap'n Proto structs (serialization/schema/wire.capnp), read in place
// with wire::read_header after the checks below. Padding keeps every frame, and so every payload
// handed to an am handler, 8-byte aligned in the receive buffer.
//
// Device address: the device's address (IPv4 or IPv6, family first) plus this host's boot and
// network namespace identity (a loopback address only reaches the same host and namespace). A
// link-local IPv6 address travels without its scope (an interface index means nothing to the
// peer): the connecting side reaches it through its own device. Interface address: the port of the
// interface's data listener, a random interface id that the hello must name (so a connection to a
// reused port of a closed interface is refused instead of delivering to a stranger), and the
// interface's window.
#pragma once

#include <comm/status.hpp>
#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include "tcp/tcp.capnp.h"
#include "tcp/tcp_address.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace comm::tl::tcp {

// -- limits ---------------------------------------------------------------------------------------

inline constexpr size_t max_short = 256;               ///< am_short header + payload
/// am_bcopy payload. Software rendezvous streams bcopy fragments of this size: 256 KiB moved 4 MiB
/// messages over loopback at ~1.5x the speed of 64 KiB ones (and of 128 KiB, 512 KiB or 1 MiB);
/// the connection's send buffer holds two of them.
inline constexpr size_t max_bcopy = 256 * 1024;
inline constexpr size_t max_zcopy = 1024 * 1024;       ///< am_zcopy iov total
inline constexpr size_t max_hdr = 256;                 ///< am_zcopy header
inline constexpr size_t max_iov = 16;                  ///< am_zcopy iov entries
/// Largest `length` a frame may announce (what a zcopy can send).
inline constexpr size_t max_frame_payload = max_hdr + max_zcopy;

/// Bytes of a TcpFrame header as we write it.
inline constexpr size_t frame_header_size = wire::header_size<wire::schema::TcpFrame>();
/// Bytes of a TcpHello as we write it.
inline constexpr size_t hello_size = wire::header_size<wire::schema::TcpHello>();
/// Bytes of the other handshake records as we write them.
inline constexpr size_t challenge_size = wire::header_size<wire::schema::TcpChallenge>();
inline constexpr size_t proof_record_size = wire::header_size<wire::schema::TcpProof>();
inline constexpr size_t welcome_size = wire::header_size<wire::schema::TcpWelcome>();
/// Largest header a (newer) peer may send: data sections beyond this are garbage to us.
inline constexpr size_t max_header_bytes = 16 * sizeof(uint64_t);

inline constexpr uint64_t hello_magic = 0x434f4d4d54435000ull;      ///< "COMMTCP\0"
inline constexpr uint64_t challenge_magic = 0x434f4d4d54435043ull;  ///< "COMMTCPC"
inline constexpr uint64_t proof_magic = 0x434f4d4d54435050ull;      ///< "COMMTCPP"
inline constexpr uint64_t welcome_magic = 0x434f4d4d54435057ull;    ///< "COMMTCPW"
/// Version 2: one connection both ways, the challenge and welcome, piggybacked acks. Version 3:
/// the connector's IPv6 listening address.
inline constexpr uint16_t hello_version = 3;

/// `length` rounded up to a multiple of 8.
constexpr size_t pad8(size_t length) { return (length + 7) & ~size_t{7}; }

/// Bytes a frame with `length` bytes after our header occupies on the wire.
constexpr size_t frame_size(size_t length) { return frame_header_size + pad8(length); }

// -- addresses ------------------------------------------------------------------------------------

/// Family byte of an IPv4 device address.
inline constexpr uint8_t device_family_ipv4 = 4;
/// Family byte of an IPv6 device address.
inline constexpr uint8_t device_family_ipv6 = 6;

/// Device address: where the interface listens and who can reach a loopback address.
struct [[gnu::packed]] device_addr {
  uint8_t family = 0;        ///< device_family_ipv4 or device_family_ipv6
  uint8_t reserved[3] = {};  ///< zero
  uint8_t ip[16] = {};       ///< IPv4: the first 4 bytes (network order), the rest zero; IPv6
  uint8_t boot_id[16] = {};  ///< host boot (host_identity)
  uint64_t net_ns = 0;       ///< network namespace (host_identity)

  /// This process on `address` (IPv4 or IPv6).
  static device_addr local(const ip_address& address);
  std::vector<uint8_t> pack() const;
  /// Nothing when `bytes` is not a device address: not its size, an unknown family, reserved or
  /// unused bytes not zero, an unspecified, multicast, broadcast or IPv4-mapped address.
  static std::optional<device_addr> unpack(const std::vector<uint8_t>& bytes);
  /// The address (without a scope: a link-local one is reached through a device of ours).
  ip_address address() const;
  /// True for 127.0.0.0/8 and ::1.
  bool loopback() const;
};

/// Frames a connection assumes the peer accepts undelivered until its hello gives its window
/// (an interface's own window is COMM_TCP_WINDOW, or iface_params::fifo_size when set).
inline constexpr uint32_t default_window = 1024;
/// Bounds of a window (fifo_size) an interface accepts.
inline constexpr uint32_t min_window = 2;
inline constexpr uint32_t max_window = 1u << 20;

/// Interface address: the listening port, the interface's id and its window.
struct [[gnu::packed]] iface_addr {
  uint16_t port = 0;      ///< host byte order
  uint64_t iface_id = 0;  ///< random, never zero
  uint32_t window = 0;    ///< frames a sender may have undelivered (min_window..max_window)

  std::vector<uint8_t> pack() const;
  /// Nothing when `bytes` is not an interface address (port or id 0, window out of bounds).
  static std::optional<iface_addr> unpack(const std::vector<uint8_t>& bytes);
};

// -- frame parsing --------------------------------------------------------------------------------

/// What parse_frame_header found at the start of some received bytes.
enum class parse_result {
  frame,       ///< a valid header: see parsed_frame
  incomplete,  ///< too few bytes yet to tell
  garbage,     ///< not a header we accept: the connection must be closed
};

/// Checks only the root word of the record at `data`: garbage, incomplete, or a data-only record of
/// `*bytes` bytes that is all there.
parse_result record_extent(const uint8_t* data, size_t available, size_t* bytes);

/// What a frame carries.
enum class frame_kind : uint8_t { message, ack, bye };

/// A validated frame header.
struct parsed_frame {
  am_id id = 0;
  frame_kind kind = frame_kind::message;
  bool ack = false;         ///< the sender wants an acknowledgement once it is delivered
  uint64_t delivered = 0;   ///< the sender's count of messages it delivered from us
  size_t header_bytes = 0;  ///< bytes of the TcpFrame struct (payload starts here)
  size_t length = 0;        ///< payload bytes announced
  size_t total = 0;         ///< header + payload + padding
  const char* problem = nullptr;  ///< why, for garbage
};

/// Checks the frame header at `data` (8-byte aligned, `available` bytes): a data-only TcpFrame of a
/// known kind, an am id below am_id_count and a length within max_frame_payload (0 for acks and
/// byes).
parse_result parse_frame_header(const uint8_t* data, size_t available, parsed_frame* out);

/// The fields of a hello that matter once it was checked.
struct parsed_hello {
  uint64_t src_iface_id = 0;
  ip_address src_address;    ///< the connector's listening address (IPv4 or IPv6, no scope)
  uint16_t src_port = 0;     ///< and port (host byte order)
  uint32_t window = 0;       ///< messages the connector accepts undelivered
  uint8_t nonce[16] = {};    ///< the connector's challenge
};

/// Checks the hello at `data` (8-byte aligned) for interface `own_id`: magic, version, destination
/// and window. Sets `*consumed` and fills `*out` when it is valid, `*problem` when it is garbage.
parse_result parse_hello(const uint8_t* data, size_t available, uint64_t own_id, size_t* consumed,
                         parsed_hello* out, const char** problem);

/// Checks the challenge at `data`; fills `*iface_id` (the acceptor's), `*keyed` and `nonce`.
parse_result parse_challenge(const uint8_t* data, size_t available, size_t* consumed,
                             uint64_t* iface_id, bool* keyed, uint8_t nonce[16],
                             const char** problem);

/// Checks the proof record at `data`; copies the 32-byte proof to `proof`.
parse_result parse_proof(const uint8_t* data, size_t available, size_t* consumed,
                         uint8_t proof[32], const char** problem);

/// Outcome of a handshake, as a welcome says it.
enum class outcome : uint8_t { accepted, duplicate, refused };

/// Checks the welcome at `data`; fills `*result` and `proof` (32 bytes).
parse_result parse_welcome(const uint8_t* data, size_t available, size_t* consumed,
                           outcome* result, uint8_t proof[32], const char** problem);

// -- writing --------------------------------------------------------------------------------------

/// The long-lived header builders of one interface (one thread): only setters run per record.
class record_writer {
public:
  /// Writes the header of a frame of `kind` with `length` bytes after it at `dest`; returns its
  /// size (frame_header_size).
  size_t frame(frame_kind kind, am_id id, size_t length, bool ack, uint64_t delivered,
               void* dest) {
    auto& f = frame_.fields();
    f.setAmId(id);
    f.setLength(static_cast<uint32_t>(length));
    f.setAckRequested(ack);
    f.setKind(static_cast<wire::schema::TcpFrameKind>(kind));
    f.setDelivered(delivered);
    return frame_.copy_to(dest);
  }

  /// Writes a hello (hello_size bytes) at `dest`.
  void hello(uint16_t src_port, const ip_address& src_address, uint64_t src_id, uint64_t dst_id,
             uint32_t window, const uint8_t nonce[16], void* dest);
  /// Writes a challenge (challenge_size bytes) at `dest`.
  void challenge(uint64_t own_id, bool keyed, const uint8_t nonce[16], void* dest);
  /// Writes a proof record (proof_record_size bytes) at `dest`.
  void proof(const uint8_t proof[32], void* dest);
  /// Writes a welcome (welcome_size bytes) at `dest`; `proof` may be null (zeros).
  void welcome(outcome result, const uint8_t* proof, void* dest);

private:
  wire::header_writer<wire::schema::TcpFrame> frame_;
  wire::header_writer<wire::schema::TcpHello> hello_;
  wire::header_writer<wire::schema::TcpChallenge> challenge_;
  wire::header_writer<wire::schema::TcpProof> proof_;
  wire::header_writer<wire::schema::TcpWelcome> welcome_;
};

}  // namespace comm::tl::tcp
