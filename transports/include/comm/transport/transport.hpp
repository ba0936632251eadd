// The transport interface (libcomm's UCT): what every transport under transports/ implements and
// all the protocol layer may use. A transport moves bytes between interfaces; it knows nothing of
// requests, actors or protocols (an interface that offers tag matching matches tags as a NIC does,
// see the tag section).
//
// Every transport provides
//   - a component: its name, its devices, and how to open an interface on one;
//   - an iface: capabilities, active-message handlers, progress, an event fd for blocking
//     progress, its address, and endpoints to peers' interfaces;
//   - an ep: am short/bcopy/zcopy, put/get zcopy where supported, a pending queue, flush, fence;
//   - optionally, tag matching: tagged eager and rendezvous sends on the ep, posted receives and
//     unexpected-message handlers on the iface (cap_tag_*);
//   - a memory domain (md): register memory, pack and unpack remote keys.
// The capability flags of an iface match the operations it actually implements; unsupported
// operations return status::unsupported.
#pragma once

#include <comm/status.hpp>
#include <comm/transport/options.hpp>

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace comm::tl {

/// Transport-level active-message id. The protocol layer owns the id space.
using am_id = uint8_t;

/// Number of transport-level active-message ids.
inline constexpr unsigned am_id_count = 32;

/// One scatter/gather entry of a zero-copy operation.
struct iov {
  const void* buffer = nullptr;  ///< start of the entry
  size_t length = 0;             ///< bytes in the entry
};

/// Completion of an operation that finishes later (zcopy, flush). `count` is the number of
/// outstanding operations still to finish; `func` runs when it drops to zero, with the first error
/// seen, or status::ok. Every zcopy operation (am, put, get, tagged eager) accepts a null
/// completion (UCT's `req == NULL`): the caller then learns that it finished from a completion of
/// a later operation on the same endpoint (completions come in issue order) or from ep::flush.
struct completion {
  void (*func)(completion* self) = nullptr;  ///< called once `count` reaches zero
  int count = 0;                             ///< operations still outstanding
  status result = status::ok;                ///< first error seen, else ok
};

/// Marks one operation of `comp` finished with `st`, calling comp->func when none are left.
inline void complete(completion* comp, status st) {
  if (is_error(st) && comp->result == status::ok) comp->result = st;
  if (--comp->count == 0 && comp->func != nullptr) comp->func(comp);
}

/// An operation parked on an endpoint's pending queue after status::no_resource. The transport
/// calls `func` when resources may be available: it returns ok (done, drop it), in_progress (done
/// for now, it re-added itself) or no_resource (keep it at the head and stop dispatching).
struct pending_req {
  status (*func)(pending_req* self) = nullptr;  ///< retries the parked operation
  pending_req* next = nullptr;                  ///< owned by the transport while queued
};

/// Packs the payload of a bcopy operation into `dest` (room for iface_attr::max_bcopy bytes) and
/// returns the number of bytes written.
using pack_fn = size_t (*)(void* dest, void* arg);

/// Flag passed to an am handler: `data` is a transport descriptor the handler may keep by returning
/// status::in_progress, releasing it later with iface::release_am_desc (UCT's
/// UCT_CB_PARAM_FLAG_DESC). An interface lends at most iface_attr::max_am_descs at once; past that,
/// and for messages it cannot lend (shm's am_short, which lives in the FIFO cell), the flag is
/// absent.
inline constexpr unsigned am_flag_desc = 1u << 0;

/// Receives an active message. `data` is 8-byte aligned and valid until the handler returns
/// (unless am_flag_desc was given and the handler returned in_progress: then until
/// iface::release_am_desc). Returns ok, or in_progress to keep a descriptor; in_progress without
/// am_flag_desc counts as ok.
using am_handler_fn = status (*)(void* arg, void* data, size_t length, unsigned flags);

class ep;

/// Called when the peer of `failed` is gone (exited, killed, reset). Outstanding operations on the
/// endpoint have already completed with `reason`.
using error_handler_fn = void (*)(void* arg, ep* failed, status reason);

/// Capability flags of an interface.
enum cap : uint64_t {
  cap_am_short = 1u << 0,        ///< am_short
  cap_am_bcopy = 1u << 1,        ///< am_bcopy
  cap_am_zcopy = 1u << 2,        ///< am_zcopy, completion once the peer holds the data
  cap_put_zcopy = 1u << 3,       ///< put_zcopy
  cap_get_zcopy = 1u << 4,       ///< get_zcopy
  cap_pending = 1u << 5,         ///< pending queue on endpoints
  cap_event_fd = 1u << 6,        ///< event_fd/event_arm for blocking progress
  cap_connect_to_iface = 1u << 7,///< endpoints from an interface address alone
  cap_peer_failure = 1u << 8,    ///< detects peer failure and reports it to the error handler
  cap_costly_progress = 1u << 9, ///< progress() makes a system call: polled less often when idle
  cap_tag_eager_short = 1u << 10, ///< tag_eager_short (and posted receives: tag_recv_zcopy)
  cap_tag_eager_bcopy = 1u << 11, ///< tag_eager_bcopy
  cap_tag_eager_zcopy = 1u << 12, ///< tag_eager_zcopy, completion once the peer holds the data
  cap_tag_rndv_zcopy = 1u << 13,  ///< tag_rndv_zcopy, tag_rndv_cancel and tag_rndv_request
  /// get_zcopy is answered by the peer's progress() (an emulated get), not by the device or the
  /// kernel alone as an RDMA read or shm's process_vm_readv are: a reader waits for the owner.
  cap_get_needs_peer = 1u << 14,
};

/// Every tag-matching capability: an interface with any of them matches posted receives.
inline constexpr uint64_t cap_tag_any =
    cap_tag_eager_short | cap_tag_eager_bcopy | cap_tag_eager_zcopy | cap_tag_rndv_zcopy;

// -- tag matching (optional: the cap_tag_* flags) -------------------------------------------------
//
// UCT's tag-matching offload. The receiving interface keeps a list of posted receives (tag, mask,
// iov: iface::tag_recv_zcopy) and matches each arriving tagged message against it in post order,
// as a NIC with tag matching does. A message that matches lands in the receive's iov and is
// reported through its tag_context; one that matches nothing goes to the unexpected handlers
// (iface::set_tag_handlers). Endpoints send eager messages (short, bcopy with an immediate value,
// zcopy) and rendezvous: tag_rndv_zcopy announces a registered buffer that the receiver fetches
// itself when a posted receive matches (or hands to the unexpected rendezvous handler with its
// address, length and remote key), tag_rndv_request sends only a header for a rendezvous the
// protocol layer completes in software. An interface without the flags answers unsupported and
// reports zero tag limits. Callbacks run inside progress() (or the call that posts or cancels),
// on the interface's thread, and may call other communication routines.

/// A transport-level tag.
using tag_t = uint64_t;

/// Flag of an unexpected eager fragment: the first fragment of its message (UCT's
/// UCT_CB_PARAM_FLAG_FIRST). A message delivered whole comes as one fragment with this flag alone.
inline constexpr unsigned tag_flag_first = 1u << 1;

/// Flag of an unexpected eager fragment: more fragments of the same message follow, in order
/// (UCT_CB_PARAM_FLAG_MORE). Fragments of other messages may come in between on a transport that
/// interleaves them (the per-message context tells them apart); self and shm do not.
inline constexpr unsigned tag_flag_more = 1u << 2;

/// Receives a fragment of a tagged eager message that matched no posted receive: `length` bytes at
/// `data`, sent with tag `stag` and immediate value `imm`. `flags` holds tag_flag_first and/or
/// tag_flag_more, and am_flag_desc when the handler may keep `data` by returning in_progress (then
/// released with iface::release_am_desc, as for active messages; counted in max_am_descs).
/// `*context` is per message: null on the first fragment, where the handler may set it (a message
/// of one fragment needs none); the value it holds after a fragment is passed with the next one.
/// The handler owns what it points to. Returns ok, or in_progress to keep a descriptor.
using tag_unexp_eager_fn = status (*)(void* arg, void* data, size_t length, unsigned flags,
                                      tag_t stag, uint64_t imm, void** context);

/// Receives a rendezvous that matched no posted receive: tag `stag`, the sender's `header`, and
/// the sender's buffer: `length` bytes at `remote_address` in the sender, readable with get_zcopy
/// through an endpoint to the sender with the remote key packed in `rkey` (`rkey_length` bytes,
/// for md::rkey_unpack). A software rendezvous request (ep::tag_rndv_request) comes here with
/// remote_address 0, length 0 and no key. Everything is valid until the handler returns; `flags`
/// is 0. The sender's operation stays outstanding until it cancels it (ep::tag_rndv_cancel), so
/// its buffer stays registered meanwhile. Returns ok.
using tag_unexp_rndv_fn = status (*)(void* arg, unsigned flags, tag_t stag, const void* header,
                                     size_t header_length, uint64_t remote_address, size_t length,
                                     const void* rkey, size_t rkey_length);

/// Bytes of tag_context::priv.
inline constexpr size_t tag_priv_length = 32;

/// A posted receive (UCT's uct_tag_context): the caller fills the callbacks, posts it with
/// iface::tag_recv_zcopy and keeps it alive until it completed or was canceled. At most one of
/// `completed` and `rndv` is called, once, ending the receive.
struct tag_context {
  /// Called when a message matched the receive and the transport starts delivering it (the tag
  /// must no longer be matched in software). May be null.
  void (*tag_consumed)(tag_context* self) = nullptr;
  /// Called when the receive ends: a message tagged `stag` with immediate value `imm` (0 for short
  /// sends and rendezvous) and `length` bytes landed in the iov, with `result` ok; or
  /// message_truncated when `length` exceeds the iov (which holds its first bytes); another error
  /// when a rendezvous fetch failed; canceled after iface::tag_recv_cancel without force.
  void (*completed)(tag_context* self, tag_t stag, uint64_t imm, size_t length,
                    status result) = nullptr;
  /// Called instead of `completed` when the receive matched a software rendezvous request
  /// (ep::tag_rndv_request): the protocol layer completes it, starting from `header`, valid
  /// during the call. `result` is ok.
  void (*rndv)(tag_context* self, tag_t stag, const void* header, size_t header_length,
               status result) = nullptr;
  /// The transport's state of the receive while it is posted.
  alignas(8) unsigned char priv[tag_priv_length] = {};
};

/// Limits of the tag-matching operations (all zero without the cap_tag_* flags). Sizes in bytes.
struct tag_limits {
  /// Eager sends.
  struct eager_limits {
    size_t max_short = 0;  ///< largest tag_eager_short
    size_t max_bcopy = 0;  ///< most tag_eager_bcopy's pack may write
    size_t max_zcopy = 0;  ///< largest tag_eager_zcopy (sum of the iov)
    size_t max_iov = 0;    ///< most tag_eager_zcopy iov entries
  };
  /// Rendezvous sends.
  struct rndv_limits {
    size_t max_zcopy = 0;  ///< largest tag_rndv_zcopy (sum of the iov)
    size_t max_hdr = 0;    ///< largest header of tag_rndv_zcopy and tag_rndv_request
    size_t max_iov = 0;    ///< most tag_rndv_zcopy iov entries
  };
  /// Posted receives.
  struct recv_limits {
    size_t max_zcopy = 0;        ///< largest posted iov (sum of its entries)
    size_t max_iov = 0;          ///< most iov entries of a posted receive
    size_t max_outstanding = 0;  ///< receives posted at once (then exceeds_limit)
  };
  eager_limits eager;  ///< eager sends
  rndv_limits rndv;    ///< rendezvous sends
  recv_limits recv;    ///< posted receives
};

/// What an interface can do and its limits. Sizes are in bytes.
struct iface_attr {
  uint64_t caps = 0;            ///< cap flags
  size_t max_short = 0;         ///< largest am_short, protocol header included
  size_t max_bcopy = 0;         ///< largest am_bcopy payload (what pack may write)
  size_t max_zcopy = 0;         ///< largest am_zcopy payload (sum of the iov)
  size_t max_hdr = 0;           ///< largest am_zcopy header
  size_t max_iov = 0;           ///< most am_zcopy iov entries
  size_t max_get_zcopy = 0;     ///< largest get_zcopy
  size_t max_put_zcopy = 0;     ///< largest put_zcopy
  size_t max_outstanding_reads = 0; ///< gets in flight per endpoint the peer accepts
  size_t max_am_descs = 0;      ///< am descriptors handlers may keep at once (am_flag_desc)
  tag_limits tag;               ///< tag-matching limits (zero without cap_tag_* flags)
  double latency_ns = 0;        ///< one-way latency estimate
  double bandwidth_bytes_per_s = 0; ///< bandwidth estimate
  unsigned priority = 0;        ///< tie breaker when choosing lanes: higher wins
  /// Messages shorter than this move faster as copies through the transport's own buffers
  /// (am_bcopy, in fragments) than by its zero-copy paths (am_zcopy, get_zcopy), unless their
  /// memory is memory the peer maps (md::maps_for_peers); 0: no such size. shm: its ring's
  /// capacity, since a cross-memory read spends most of its time pinning the sender's pages.
  size_t copies_preferred_below = 0;
  /// Reaches only interfaces on this machine (self, shm): a network-only worker address
  /// (comm::address_net_only) leaves it out.
  bool node_local = false;
};

/// Memory registered with a memory domain.
struct mem_handle {
  void* address = nullptr;      ///< start of the region
  size_t length = 0;            ///< bytes in the region
  void* transport = nullptr;    ///< transport-private state
};

/// An unpacked remote key: access to a peer's registered region.
struct remote_key {
  uint64_t address = 0;         ///< start of the remote region
  uint64_t length = 0;          ///< bytes in the remote region
  void* transport = nullptr;    ///< transport-private state
};

/// A peer's memory as this process sees it through a mapping (ep::rkey_local_address).
struct local_bytes {
  const void* data = nullptr;          ///< the first byte, here
  std::shared_ptr<const void> mapping; ///< keeps the mapping (null: the memory is this process's)
};

/// Memory domain: registration and remote keys.
class md {
public:
  virtual ~md() = default;
  /// Registers [address, address + length). The handle is released with mem_dereg.
  virtual status mem_reg(void* address, size_t length, mem_handle** out) = 0;
  /// Registers [address, address + length) for peers to read only (UCT's
  /// UCT_MD_MEM_ACCESS_REMOTE_GET without REMOTE_PUT): a peer's put_zcopy into it fails with
  /// privileges_violation whatever its key claims, and ep::rkey_local_address gives a peer a
  /// read-only mapping of it. Released with mem_dereg. unsupported when this md cannot enforce
  /// the right (the default): the caller then serves the region by other means.
  virtual status mem_reg_read_only(void* address, size_t length, mem_handle** out) {
    return status::unsupported;
  }
  /// Releases a registration.
  virtual status mem_dereg(mem_handle* handle) = 0;
  /// Appends the remote key of `handle` to `out`.
  virtual status rkey_pack(const mem_handle* handle, std::vector<uint8_t>& out) = 0;
  /// Unpacks a key packed by a peer; invalid bytes give status::invalid_param.
  virtual status rkey_unpack(const void* data, size_t length, remote_key* out) = 0;
  /// Releases an unpacked key.
  virtual void rkey_release(remote_key* key) = 0;
  /// True when a peer reads [address, address + length), once registered and its key packed,
  /// through a mapping of it (a copy, as shm does for comm::mem_alloc memory) rather than through
  /// the kernel or a device: then its zero-copy paths beat copies at every size. False by
  /// default.
  virtual bool maps_for_peers(const void* address, size_t length) const { return false; }
};

/// An endpoint: a one-way connection from a local interface to a peer's interface.
class ep {
public:
  virtual ~ep() = default;

  /// Sends header + payload inline; header+payload <= max_short. Complete on return, or
  /// no_resource.
  virtual status am_short(am_id id, const void* header, size_t header_length,
                          const void* payload, size_t payload_length) = 0;

  /// Sends what `pack` writes (at most max_bcopy bytes). Returns the packed length, or a negative
  /// status (no_resource). Complete on return.
  virtual ssize_t am_bcopy(am_id id, pack_fn pack, void* arg) = 0;

  /// Sends header + the iov without copying it on the sender. Returns ok when already complete,
  /// in_progress when `comp` will be completed once the peer holds the data, or an error.
  virtual status am_zcopy(am_id id, const void* header, size_t header_length,
                          const iov* entries, size_t count, completion* comp) {
    return status::unsupported;
  }

  /// Writes the local iov to the peer's registered memory.
  virtual status put_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                           const remote_key& key, completion* comp) {
    return status::unsupported;
  }

  /// Reads the peer's registered memory into the local iov, filled in order.
  virtual status get_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                           const remote_key& key, completion* comp) {
    return status::unsupported;
  }

  /// Where [remote_address, remote_address + length) of the peer's registered memory (inside
  /// `key`'s region) lies in this process, when the transport has that memory mapped here
  /// (uct_rkey_ptr). `out->data` stays valid while `out->mapping` (or a copy of it) lives, also
  /// after the endpoint, its interface or the peer is gone. The mapping is read-only (a write
  /// through it faults) when the region was registered with md::mem_reg_read_only. unsupported
  /// when this transport or this key cannot map the memory (then get_zcopy still reads it);
  /// other errors as get_zcopy's.
  virtual status rkey_local_address(uint64_t remote_address, size_t length, const remote_key& key,
                                    local_bytes* out) {
    return status::unsupported;
  }

  /// A pidfd of the peer's process, owned by the endpoint (valid while it lives; the caller
  /// duplicates it to keep it), when the transport reaches a process on this host it identified;
  /// -1 otherwise (the default).
  virtual int peer_process_fd() const { return -1; }

  /// Parks `req`; returns busy when resources are available now (then the caller retries).
  virtual status pending_add(pending_req* req) = 0;

  /// Removes every parked request, handing each to `cb`.
  virtual void pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) = 0;

  /// ok when every operation started on the endpoint is complete; otherwise in_progress and
  /// `comp` (if not null) is completed when they are.
  virtual status flush(completion* comp) = 0;

  /// Orders operations issued after the fence after those issued before it.
  virtual status fence() { return status::ok; }

  // -- tag matching (cap_tag_*; see the tag section above) --

  /// Sends `length` bytes (<= attr().tag.eager.max_short) tagged `tag`, immediate value 0.
  /// Complete on return: ok, or no_resource.
  virtual status tag_eager_short(tag_t tag, const void* data, size_t length) {
    return status::unsupported;
  }

  /// Sends what `pack` writes (room for attr().tag.eager.max_bcopy bytes) tagged `tag`, with the
  /// immediate value `imm`. Returns the packed length, or a negative status (no_resource).
  /// Complete on return.
  virtual ssize_t tag_eager_bcopy(tag_t tag, uint64_t imm, pack_fn pack, void* arg) {
    return static_cast<ssize_t>(status::unsupported);
  }

  /// Sends the iov (attr().tag.eager limits) tagged `tag` with immediate value `imm`, without
  /// copying it on the sender. ok when already complete, in_progress when `comp` will be completed
  /// once the peer holds the data, or an error.
  virtual status tag_eager_zcopy(tag_t tag, uint64_t imm, const iov* entries, size_t count,
                                 completion* comp) {
    return status::unsupported;
  }

  /// Announces the iov (attr().tag.rndv limits) tagged `tag` with `header`: the receiver fetches
  /// the data when a posted receive matches, and `comp` is completed once it holds it; otherwise
  /// its unexpected rendezvous handler gets the header, address, length and key. Returns
  /// in_progress with `*handle` set for tag_rndv_cancel, or an error (no_resource).
  virtual status tag_rndv_zcopy(tag_t tag, const void* header, size_t header_length,
                                const iov* entries, size_t count, completion* comp,
                                uint64_t* handle) {
    return status::unsupported;
  }

  /// Forgets the outstanding rendezvous `handle` without completing its completion; its buffer is
  /// released. One the receiver has not taken yet is never delivered. ok, or no_elem when
  /// `handle` is not outstanding on this endpoint (completed, canceled, or never issued).
  virtual status tag_rndv_cancel(uint64_t handle) { return status::unsupported; }

  /// Sends a software rendezvous request: `header` (<= attr().tag.rndv.max_hdr) tagged `tag`,
  /// which reaches a matching posted receive's tag_context::rndv or the unexpected rendezvous
  /// handler. Complete on return: ok, or no_resource.
  virtual status tag_rndv_request(tag_t tag, const void* header, size_t header_length) {
    return status::unsupported;
  }

  /// The protocol layer's pointer for this endpoint.
  void* user_data = nullptr;
};

/// Parameters to open an interface.
struct iface_params {
  std::string device;           ///< one of component::devices()
  /// The transport's own knobs (COMM_<TL>_* by name), the environment's unless the opener sets
  /// them (libcomm passes comm::config::transport_options); unset ones take their defaults.
  options opts = environment_options();
  size_t fifo_size = 0;         ///< receive queue entries, 0 for the transport's knob
  size_t segment_size = 0;      ///< bytes of one receive buffer, 0 for the transport's knob
  /// Cores the interface's user works from (OS indices; UCX's cpu_mask): a placement hint, never
  /// a pinning. May be empty.
  std::vector<int> cpus;
  /// NUMA nodes (OS indices) local to `cpus`, where the interface places the memory it allocates
  /// (shm: its receive segment); empty: where the kernel puts it. A placement that fails is
  /// logged and shown by info(); the interface still opens.
  std::vector<unsigned> numa_nodes;
  /// Cluster secret: when set, a transport that accepts connections admits only peers that prove
  /// they know it (see base/auth.hpp); empty admits everyone.
  std::string auth_key;
};

/// An interface: one transport on one device, owned by one worker.
class iface {
public:
  virtual ~iface() = default;

  /// Capabilities and limits.
  virtual const iface_attr& attr() const = 0;

  /// Name of the transport ("shm").
  virtual std::string_view transport_name() const = 0;

  /// Installs the handler for active-message `id` (< am_id_count).
  virtual void set_am_handler(am_id id, am_handler_fn fn, void* arg) = 0;

  /// Installs the handler told about failed peers.
  virtual void set_error_handler(error_handler_fn fn, void* arg) = 0;

  /// Delivers what has arrived and advances outstanding operations; returns the number of events.
  virtual unsigned progress() = 0;

  /// A file descriptor that becomes readable when progress() has something to do after
  /// event_arm() returned ok; -1 without cap_event_fd.
  virtual int event_fd() const = 0;

  /// Arms the event fd. Returns busy when events are already pending (call progress instead of
  /// sleeping).
  virtual status event_arm() = 0;

  /// Device address: who can reach this interface (host, boot, namespace identity).
  virtual std::vector<uint8_t> device_address() const = 0;

  /// Interface address: how to reach this interface.
  virtual std::vector<uint8_t> iface_address() const = 0;

  /// True when an endpoint from here can reach the interface with these addresses.
  virtual bool is_reachable(const std::vector<uint8_t>& device_address,
                            const std::vector<uint8_t>& iface_address) const = 0;

  /// Creates an endpoint to the interface with these addresses.
  virtual status create_ep(const std::vector<uint8_t>& device_address,
                           const std::vector<uint8_t>& iface_address,
                           std::unique_ptr<ep>& out) = 0;

  /// Releases a descriptor kept by an am handler that returned in_progress: `data` is the pointer
  /// the handler was given. A pointer that is not a kept descriptor is refused with a log line.
  virtual void release_am_desc(void* data) = 0;

  // -- tag matching (cap_tag_*; see the tag section above) --

  /// Installs the handlers of unexpected eager messages and rendezvous (either may be null; what
  /// arrives for a missing one is dropped and counted). ok, or unsupported.
  virtual status set_tag_handlers(tag_unexp_eager_fn eager, void* eager_arg,
                                  tag_unexp_rndv_fn rndv, void* rndv_arg) {
    return status::unsupported;
  }

  /// Posts a receive: the next arriving message whose tag equals `tag` in the bits set in
  /// `tag_mask` (earliest posted receive first) lands in the iov (attr().tag.recv limits) and is
  /// reported through `ctx`, which stays the caller's until then. ok, exceeds_limit when
  /// attr().tag.recv.max_outstanding receives are posted, invalid_param for a bad iov.
  virtual status tag_recv_zcopy(tag_t tag, tag_t tag_mask, const iov* entries, size_t count,
                                tag_context* ctx) {
    return status::unsupported;
  }

  /// Cancels a posted receive: unless `force`, ctx->completed is called with canceled before
  /// this returns. ok, or no_elem when `ctx` is not posted here (already completed: its callback
  /// ran with the outcome).
  virtual status tag_recv_cancel(tag_context* ctx, bool force) { return status::unsupported; }

  /// The memory domain of this interface, or null.
  virtual md* memory_domain() { return nullptr; }

  /// One line per fact about the interface, for print_info.
  virtual std::string info() const = 0;
};

// -- connection manager (client-server over socket addresses) ------------------------------------
//
// Two ways through a connection manager:
//   - the short handshake (cm::connect, cm::accept): private data both ways, then the connection
//     is done (cm_handler::on_established or on_failed) and released;
//   - the client-server flow of UCT (seed 001; cm::resolve, cm::accept_flow): the client resolves
//     the server's address to a local device first (cm_flow_handler::on_resolved), then connects
//     (cm_conn::connect) with private data it gives or packs for that device (pack_private_data,
//     which may refuse); the server answers with its own; the client is told (on_connect) and
//     notifies the server (cm_conn::notify, the server's on_notify). The connection then stays
//     until either side disconnects (cm_conn::disconnect; both are told on_disconnect) and its
//     owner closes it (cm::close).
// Addresses are "host:port" (a name, or dotted IPv4), "[v6]:port" ("[::1]:7000",
// "[fe80::1%eth0]:7000") where the transport has IPv6.

/// What a connection manager can carry (UCT's uct_cm_attr).
struct cm_attr {
  size_t max_conn_priv = 0;   ///< largest private data a client's request carries
  size_t max_reply_priv = 0;  ///< largest private data a server's answer carries
};

/// Private data to send in a flow: bytes given here, or what cm_flow_handler::pack_private_data
/// writes (UCT's uct_cm_ep_priv_data_pack_callback_t).
struct cm_private_data {
  const uint8_t* data = nullptr;  ///< the bytes, when `pack` is false
  size_t length = 0;              ///< their length
  bool pack = false;              ///< ask the handler's pack_private_data instead
};

/// One connection being established through a connection manager. A server-side connection
/// handed over by cm_handler::on_request belongs to whoever received it until it goes back to a
/// cm with cm::accept or cm::accept_flow; destroying it unanswered rejects it.
class cm_conn {
public:
  virtual ~cm_conn() = default;
  /// The peer's socket address, "ip:port" or "[ip6]:port".
  virtual std::string peer_address() const = 0;
  /// Server, request not yet answered: refuses it. The client's connection fails with `reason`
  /// (rejected: the server said no; unreachable: the server cannot reach the client on any lane)
  /// where the transport carries a reason, else with rejected (verbs).
  virtual void reject(status reason) = 0;
  /// reject(status::rejected): the server said no.
  void reject() { reject(status::rejected); }

  /// The local device the connection goes through (one of the component's devices(), e.g. "lo"
  /// or "mlx5_0:1"): a client's once it was resolved, a server's from the request on. Empty
  /// before.
  virtual std::string device_name() const { return {}; }
  /// Flow client, after on_resolved said ok: sends the connection request with `data` (at most
  /// cm_attr::max_conn_priv bytes, packed for device_name() when `data.pack`). Returns ok (the
  /// server's answer comes to on_connect), busy (not resolved yet), exceeds_limit, or the
  /// status the pack callback refused with: then the connection is over (nothing more is told;
  /// close it).
  virtual status connect(const cm_private_data& data) { return status::unsupported; }
  /// Flow client, after on_connect said ok: tells the server the client is connected (its
  /// on_notify). ok, or busy before on_connect.
  virtual status notify() { return status::unsupported; }
  /// Flow, either side: disconnects (UCT's uct_ep_disconnect). The peer is told on_disconnect and
  /// is expected to disconnect too; this side is told on_disconnect once the peer did (or is
  /// gone). Returns in_progress (the peer has not disconnected yet), ok (it had: both are done),
  /// busy (not connected yet: before on_connect / on_notify), or not_connected (disconnected
  /// already).
  virtual status disconnect() { return status::unsupported; }

  /// The protocol layer's pointer for this connection.
  void* user_data = nullptr;
};

/// A listening socket of a connection manager; destroying it stops accepting (handshakes under
/// way are dropped, requests already handed over are not affected).
class cm_listener {
public:
  virtual ~cm_listener() = default;
  /// The address actually bound, "ip:port" or "[ip6]:port".
  virtual std::string address() const = 0;
  /// The port actually bound.
  virtual uint16_t port() const = 0;
  /// Requests handed over so far.
  virtual uint64_t requests() const = 0;
  /// The protocol layer's pointer for this listener.
  void* user_data = nullptr;
};

/// What a connection manager reports during cm::progress(). Callbacks may call cm::close on the
/// connection they are told about.
class cm_handler {
public:
  virtual ~cm_handler() = default;
  /// Server: a client connected to `from`, passed authentication and sent `data`. The connection
  /// is handed over: nobody polls it until it returns through cm::accept or cm::accept_flow (its
  /// device_name() is the local device it came through).
  virtual void on_request(cm_listener* from, std::unique_ptr<cm_conn> conn, const uint8_t* data,
                          size_t length) = 0;
  /// Client: the server accepted, with its private data. Server: the client confirmed (no data).
  /// The connection manager is done with `conn` (it is closed and released after this call).
  /// Short handshake only: flow connections report to their cm_flow_handler.
  virtual void on_established(cm_conn* conn, const uint8_t* data, size_t length) = 0;
  /// The connection failed: rejected, unreachable, endpoint_timeout, connection_reset or
  /// protocol_error. `conn` is released after this call. Short handshake only.
  virtual void on_failed(cm_conn* conn, status reason) = 0;
};

/// The callbacks of one flow connection (UCT's resolve, pack, client connect, server notify and
/// disconnect callbacks). They run in cm::progress() on the owner's thread, pack_private_data in
/// cm_conn::connect or cm::accept_flow. Each may call any cm or cm_conn function but cm::progress
/// and the destruction of the connection manager; a flow connection stays until cm::close.
class cm_flow_handler {
public:
  virtual ~cm_flow_handler() = default;
  /// Client: the server's address (and a route to it) resolved to the local device `device`
  /// (`result` ok), or did not (unreachable, or a local error; then the connection is over).
  /// Returning ok goes on: call conn->connect(), here or later. An error ends the connection
  /// (nothing more is told).
  virtual status on_resolved(cm_conn* conn, std::string_view device, status result) = 0;
  /// Writes the private data for the peer into `dest` (room for `room` bytes) for the local
  /// device `device`: a client's request (cm_conn::connect) or a server's answer
  /// (cm::accept_flow), when cm_private_data::pack is set. Returns the bytes written, or a
  /// negative status to refuse: the client's connect fails with it, the server rejects.
  virtual ssize_t pack_private_data(cm_conn* conn, std::string_view device, uint8_t* dest,
                                    size_t room) {
    return 0;
  }
  /// Client: the server answered with its private data (`result` ok: call conn->notify()), or
  /// the connection failed: rejected, unreachable, endpoint_timeout, connection_reset or
  /// protocol_error.
  virtual void on_connect(cm_conn* conn, status result, const uint8_t* data, size_t length) = 0;
  /// Server: the client notified (`result` ok: the connection is established), or the connection
  /// failed before it: endpoint_timeout, connection_reset or protocol_error.
  virtual void on_notify(cm_conn* conn, status result) = 0;
  /// Either side, connected: the peer disconnected, answered our disconnect, or is gone.
  virtual void on_disconnect(cm_conn* conn) = 0;
};

/// Parameters of a flow client (UCT's uct_ep_create on a connection manager).
struct cm_client_params {
  std::string address;                 ///< the server: "host:port" or "[v6]:port"
  cm_flow_handler* handler = nullptr;  ///< told every event of the connection (required)
  /// Resolution must end within this; so must the server's answer after cm_conn::connect.
  int timeout_ms = 10000;
};

/// Parameters of a flow server's answer (UCT's uct_ep_create on a connection request).
struct cm_server_params {
  cm_flow_handler* handler = nullptr;  ///< told every event of the connection (required)
  cm_private_data reply;               ///< the answer's private data
  int timeout_ms = 10000;              ///< the client's notify must come within this
};

/// Parameters of a connection manager.
struct cm_params {
  /// The transport's own knobs (COMM_<TL>_* by name), the environment's unless the opener sets
  /// them (libcomm passes comm::config::transport_options).
  options opts = environment_options();
  std::string auth_key;          ///< cluster secret; both sides must hold the same (or none)
  cm_handler* handler = nullptr; ///< told about every event
};

/// A connection manager (UCT sockaddr CM): listens on and connects to socket addresses and
/// exchanges private data both ways, with an optional challenge-response on a shared secret.
/// Driven by progress() on its owner's thread.
class cm {
public:
  virtual ~cm() = default;
  /// Readable when progress() has work (level triggered); includes the earliest timeout.
  virtual int event_fd() const = 0;
  /// Accepts, reads, writes and times out connections; returns the number of events.
  virtual unsigned progress() = 0;
  /// True while a listener or connection needs progress().
  virtual bool active() const = 0;
  /// What it can carry (UCT's uct_cm_query).
  virtual cm_attr query() const { return {}; }
  /// Listens on "host:port" or "[v6]:port" (port 0: any). A wildcard host (0.0.0.0, [::]) without
  /// an auth key becomes loopback.
  virtual status listen(const std::string& address, int backlog,
                        std::unique_ptr<cm_listener>& out) = 0;
  /// Connects to "host:port", sending `data` once the server proved itself (when keyed).
  /// `*out` stays valid until the handler is told the outcome or close() is called.
  virtual status connect(const std::string& address, const uint8_t* data, size_t length,
                         int timeout_ms, cm_conn** out) = 0;
  /// Server: answers a handed-over request with `data`; the handler is told on_established once
  /// the client confirms (or on_failed).
  virtual status accept(std::unique_ptr<cm_conn> conn, const uint8_t* data, size_t length,
                        int timeout_ms, cm_conn** out) = 0;
  /// Flow client: starts resolving params.address; its handler is told on_resolved. `*out` is
  /// the connection's, until close().
  virtual status resolve(const cm_client_params& params, cm_conn** out) {
    return status::unsupported;
  }
  /// Flow server: answers a handed-over request with params.reply; the handler is told on_notify
  /// once the client notifies. A reply the pack callback refuses rejects the request and returns
  /// that status. `*out` is the connection's, until close().
  virtual status accept_flow(std::unique_ptr<cm_conn> conn, const cm_server_params& params,
                             cm_conn** out) {
    return status::unsupported;
  }
  /// Drops a connection (a flow connection: UCT's uct_ep_destroy); its handler is not told
  /// anything more.
  virtual void close(cm_conn* conn) = 0;
};

/// A transport: its devices, and interfaces opened on them.
class component {
public:
  virtual ~component() = default;

  /// Transport name, as used in COMM_TLS.
  virtual std::string_view name() const = 0;

  /// Devices this transport can use here under `opts`; empty when it cannot run on this machine.
  virtual std::vector<std::string> devices(const options& opts) const = 0;

  /// devices() under the environment's options.
  std::vector<std::string> devices() const { return devices(environment_options()); }

  /// Why devices(opts) is empty, for comm_info; empty when it is not.
  virtual std::string unavailable_reason(const options& opts) const { return {}; }

  /// unavailable_reason() under the environment's options.
  std::string unavailable_reason() const { return unavailable_reason(environment_options()); }

  /// This transport's variables (COMM_<TL>_*), with help text and defaults, for comm_info.
  virtual std::span<const knob> knobs() const { return {}; }

  /// Checks this transport's options in `opts` (other transports' are ignored): ok, or
  /// invalid_param with the refusal (variable, value, what it accepts) in `*why`.
  virtual status check_options(const options& opts, std::string* why) const {
    return option_reader(name(), knobs(), opts).result(why);
  }

  /// Opens an interface.
  virtual status open(const iface_params& params, std::unique_ptr<iface>& out) = 0;

  /// Opens a connection manager; unsupported for transports without socket addresses.
  virtual status open_cm(const cm_params& params, std::unique_ptr<cm>& out) {
    return status::unsupported;
  }
};

/// Every transport built into this library, in preference order (self, shm, tcp, verbs).
std::vector<component*> all_components();

}  // namespace comm::tl
