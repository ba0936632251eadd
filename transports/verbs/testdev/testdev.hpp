// The verbs test device: an in-process software RDMA fabric that fills the verbs table
// (verbs/verbs_api.hpp) for tests. It models what an RC transport relies on: devices, ports and
// GIDs, PDs, MRs with keys and access flags, RC QPs and their state machine, SRQs, CQs and
// completion channels, RNR and transport retries, RDMA READ/WRITE with key, bounds and access
// checks, reads in flight bounded on both sides, flushes, async events, and rdmacm across the
// devices of this process. It never touches real hardware, and its timings mean nothing about RDMA.
// See transports/verbs/README.md for what it models and what it does not.
//
// Only tests link this target (comm_verbs_testdev); libcomm never does.
#pragma once

#include "verbs/verbs_api.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace comm::verbs::testdev {

/// Limits a test device reports in ibv_device_attr (and the inline size it grants a QP). The
/// defaults are small, so a test can reach them.
struct device_limits {
  int max_qp = 256;                   ///< queue pairs per device
  int max_qp_wr = 4096;               ///< send or receive work requests per queue
  int max_sge = 16;                   ///< scatter/gather entries per send or receive
  int max_sge_rd = 16;                ///< scatter entries of an RDMA READ
  int max_cq = 256;                   ///< completion queues per device
  int max_cqe = 65536;                ///< entries per completion queue
  int max_mr = 4096;                  ///< memory regions per device
  uint64_t max_mr_size = 1ull << 32;  ///< bytes per memory region
  int max_pd = 64;                    ///< protection domains per device
  int max_qp_rd_atom = 16;            ///< RDMA READs a QP answers at once (max_dest_rd_atomic)
  int max_qp_init_rd_atom = 16;       ///< RDMA READs a QP has in flight (max_rd_atomic)
  int max_srq = 64;                   ///< shared receive queues per device
  int max_srq_wr = 16384;             ///< work requests per SRQ
  int max_srq_sge = 16;               ///< scatter entries per SRQ receive
  uint32_t max_inline_data = 256;     ///< inline bytes a QP may ask for
  uint32_t max_msg_sz = 1u << 30;     ///< largest message (ibv_port_attr::max_msg_sz)
  /// Tag matching offered through IBV_SRQT_TM shared receive queues (ibv_device_attr_ex::tm_caps,
  /// the test device's model of them: see README). All zero, the default, offers none.
  ibv_tm_caps tm{};
};

/// One port of a test device. An Ethernet (RoCE) port has GIDs derived from its addresses (RoCE v1
/// and v2 for each, after a link-local pair); an InfiniBand port has a LID and one GID.
struct port_spec {
  uint8_t link_layer = IBV_LINK_LAYER_ETHERNET;  ///< IBV_LINK_LAYER_ETHERNET or _INFINIBAND
  std::vector<std::string> addresses;            ///< IPv4/IPv6 addresses rdmacm binds to
  ibv_mtu mtu = IBV_MTU_4096;                    ///< active and maximum MTU
};

/// One verbs test device ("testdev0"...).
struct device_spec {
  std::string name = "testdev0";  ///< ibv_get_device_name
  std::vector<port_spec> ports;   ///< port 1, 2...
  device_limits limits;           ///< what ibv_query_device reports and enforces
};

/// A device with one RoCE port that owns `address` (e.g. "10.0.0.1").
device_spec roce_device(const std::string& name, const std::string& address);

/// A device with one InfiniBand port that owns `address` (its IPoIB address, for rdmacm).
device_spec ib_device(const std::string& name, const std::string& address);

/// `spec` with tag matching (the test device's model of TM-SRQs): `max_num_tags` tagged buffers
/// per list, 64 list operations outstanding, `max_sge` scatter entries per tagged buffer, and
/// rendezvous requests of at most `max_rndv_hdr_size` bytes (TMH, RVH and header) matched.
device_spec with_tag_matching(device_spec spec, uint32_t max_num_tags = 128, uint32_t max_sge = 4,
                              uint32_t max_rndv_hdr_size = 160);

/// The verbs table of the test device.
const api& table() noexcept;

/// Creates the fabric with these devices; the table works from now on. One fabric at a time.
void install(const std::vector<device_spec>& devices);

/// Destroys the fabric and everything left in it. Returns how many objects (contexts, PDs, MRs,
/// channels, CQs, SRQs, QPs, device lists, rdmacm channels and ids) the user had not released.
size_t uninstall();

/// Objects the user holds now (what uninstall() would count as leaked).
size_t live_objects();

/// Installs a fabric for a scope; uninstalls it on the way out and keeps the leak count.
class fabric_scope {
 public:
  /// Installs `devices`.
  explicit fabric_scope(const std::vector<device_spec>& devices) { install(devices); }
  /// Uninstalls (unless done already).
  ~fabric_scope() { finish(); }
  fabric_scope(const fabric_scope&) = delete;
  fabric_scope& operator=(const fabric_scope&) = delete;
  /// Uninstalls now and returns the number of objects left behind.
  size_t finish() {
    if (!done_) {
      leaked_ = uninstall();
      done_ = true;
    }
    return leaked_;
  }

 private:
  bool done_ = false;
  size_t leaked_ = 0;
};

/// What the fabric did, for tests that check retries happened.
struct counters {
  uint64_t rnr_naks = 0;        ///< receiver-not-ready answers to SENDs
  uint64_t ack_timeouts = 0;    ///< transport timeouts (no answer from the responder)
  uint64_t read_responses = 0;  ///< RDMA READ responses delivered
  uint64_t tm_matched = 0;      ///< tagged messages a TM-SRQ matched to a tagged buffer
  uint64_t tm_unexpected = 0;   ///< tagged messages a TM-SRQ put in an ordinary buffer
  uint64_t tm_fins = 0;         ///< rendezvous FIN messages the device sent
};

/// The counters since install().
counters stats();

/// Send completions `qp` has generated so far: one per signaled send and one per failed send
/// (signaled or not), as hardware generates them; 0 for an unknown QP.
uint64_t send_completions(ibv_qp* qp);

// -- injected faults (each returns 0, or an errno value for an unknown object) --

/// The next send work request the QP executes fails with `status` (retry exceeded by default)
/// and the QP goes to the error state, flushing the rest.
int fail_next_send(ibv_qp* qp, ibv_wc_status status = IBV_WC_RETRY_EXC_ERR);

/// Moves the QP to the error state as a fatal hardware error would: IBV_EVENT_QP_FATAL, flush.
int fail_qp(ibv_qp* qp);

/// Overruns the CQ: IBV_EVENT_CQ_ERR, later completions are lost, and the QPs that complete into
/// it go to the error state (IBV_EVENT_QP_FATAL).
int overrun_cq(ibv_cq* cq);

/// How a peer disappears.
enum class peer_failure {
  process_exit,  ///< its process died: the kernel closes its rdmacm connections (DISCONNECTED)
  host_lost,     ///< its host went silent: nothing is announced, only retries time out
};

/// Every object on `device` vanishes, as if the process (or host) using it were gone: its QPs
/// stop answering (peers see IBV_WC_RETRY_EXC_ERR after their ACK timeout), its rdmacm ids are
/// closed (process_exit) or just silent (host_lost). Calls on the vanished objects fail with EIO,
/// except destroy and close, which release them. The device stays; it can be opened again.
int peer_gone(const std::string& device, peer_failure how);

/// Sets a port's state (IBV_PORT_ACTIVE or IBV_PORT_DOWN) and raises IBV_EVENT_PORT_ACTIVE or
/// IBV_EVENT_PORT_ERR on every context of the device. Traffic through a down port gets no answer.
int set_port_state(const std::string& device, uint8_t port_num, ibv_port_state state);

/// While held, RDMA READ responses do not arrive: reads stay in flight, so tests can see the
/// limits on reads in flight and IBV_SEND_FENCE at work. Releasing delivers them.
void hold_read_responses(bool hold);

}  // namespace comm::verbs::testdev
