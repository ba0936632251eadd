// The verbs interface: one port of one device, its protection domain, one completion queue for
// sends and receives, a shared receive queue of pre-posted bcopy buffers, a pool of registered send
// buffers, an rdmacm listener through which peers' endpoints connect, and the RC connections
// (verbs_conn.hpp). The event fd is an epoll set of the completion channel, the device's async
// events and the rdmacm channel.
#pragma once

#include "verbs/verbs_config.hpp"
#include "verbs/verbs_conn.hpp"
#include "verbs/verbs_device.hpp"
#include "verbs/verbs_md.hpp"
#include "verbs/verbs_tag.hpp"

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace comm::verbs {

struct cm_event_copy;

/// One verbs interface. Not thread safe: its owner calls it from one thread.
class verbs_iface final : public tl::iface {
public:
  /// Opens `port` with `config`; check open_status().
  verbs_iface(const api& table, const port_info& port, const verbs_config& config);
  ~verbs_iface() override;
  verbs_iface(const verbs_iface&) = delete;
  verbs_iface& operator=(const verbs_iface&) = delete;

  /// ok, or why opening failed.
  status open_status() const { return open_status_; }

  const tl::iface_attr& attr() const override { return attr_; }
  std::string_view transport_name() const override { return "verbs"; }
  void set_am_handler(tl::am_id id, tl::am_handler_fn fn, void* arg) override;
  void set_error_handler(tl::error_handler_fn fn, void* arg) override;
  unsigned progress() override;
  int event_fd() const override { return epoll_fd_; }
  status event_arm() override;
  std::vector<uint8_t> device_address() const override;
  std::vector<uint8_t> iface_address() const override;
  bool is_reachable(const std::vector<uint8_t>& device_address,
                    const std::vector<uint8_t>& iface_address) const override;
  status create_ep(const std::vector<uint8_t>& device_address,
                   const std::vector<uint8_t>& iface_address,
                   std::unique_ptr<tl::ep>& out) override;
  void release_am_desc(void* data) override;
  status set_tag_handlers(tl::tag_unexp_eager_fn eager, void* eager_arg,
                          tl::tag_unexp_rndv_fn rndv, void* rndv_arg) override;
  status tag_recv_zcopy(tl::tag_t tag, tl::tag_t tag_mask, const tl::iov* entries, size_t count,
                        tl::tag_context* ctx) override;
  status tag_recv_cancel(tl::tag_context* ctx, bool force) override;
  tl::md* memory_domain() override { return md_.get(); }
  std::string info() const override;

  // -- for connections and endpoints --

  /// The verbs table.
  const api& table() const { return t_; }
  /// The configuration.
  const verbs_config& config() const { return config_; }
  /// The memory domain.
  verbs_md& md() { return *md_; }
  /// A free send buffer, or -1 when all are in use.
  int32_t take_tx_buffer();
  /// True when fewer than half the send buffers are free: a send holding one then asks for a
  /// completion, so the buffers held behind unsignaled sends can never be all of them.
  bool tx_buffers_low() const { return free_tx_.size() < config_.tx_buffers / 2; }
  /// Returns a send buffer.
  void return_tx_buffer(int32_t index) { free_tx_.push_back(index); }
  /// Address of send buffer `index`.
  uint8_t* tx_buffer(int32_t index) { return tx_pool_ + static_cast<size_t>(index) * seg_; }
  /// Local key of the send buffers.
  uint32_t tx_lkey() const { return tx_mr_->lkey; }
  /// Largest inline send the QPs take.
  uint32_t max_inline() const { return max_inline_; }
  /// Bytes in front of an active message's payload: a NO_TAG TMH when the SRQs match tags, then
  /// the VerbsMessageHeader.
  size_t header_size() const { return prefix_ + message_header_size; }
  /// Writes the header of a SEND to `dst` (header_size() bytes) and returns that size.
  size_t write_header(void* dst, message_kind kind, uint8_t am_id, uint16_t credits,
                      uint32_t op_id = 0) {
    if (prefix_ != 0 && kind == message_kind::am) {
      write_tmh(dst, IBV_TMH_EAGER, am_app_ctx, am_tag);
    } else if (prefix_ != 0) {
      write_tmh(dst, IBV_TMH_NO_TAG, 0, 0);
    }
    return prefix_ + header_writer_->write(static_cast<uint8_t*>(dst) + prefix_, kind, am_id,
                                           credits, op_id);
  }
  /// True when the SRQ is a tag-matching one (cap_tag_*).
  bool tag_matching() const { return tm_; }
  /// The tag matching (null without it).
  verbs_tags* tags() { return tags_.get(); }
  /// The SRQ.
  ibv_srq* srq() const { return srq_; }
  /// The protection domain.
  ibv_pd* pd() const { return pd_; }
  /// What the device's tag matching allows.
  const ibv_tm_caps& tm_caps() const { return tm_caps_; }
  /// A new rendezvous operation id (never 0 or sw_rndv_app_ctx).
  uint32_t next_rndv_id() {
    if (++next_rndv_id_ == 0 || next_rndv_id_ == sw_rndv_app_ctx) next_rndv_id_ = 1;
    return next_rndv_id_;
  }
  /// Receive buffer `index` (of segment size).
  uint8_t* rx_buffer(uint32_t index) { return rx_pool_ + static_cast<size_t>(index) * seg_; }
  /// True when a handler may keep one more receive buffer.
  bool can_lend() const { return rx_lent_count_ < max_am_descs(); }
  /// A handler keeps receive buffer `buffer` of `c` until release_am_desc.
  void lend(verbs_conn& c, uint32_t buffer);
  /// Reposts receive buffer `buffer` of `c` and counts the credit to return.
  void return_buffer(verbs_conn& c, uint32_t buffer);
  /// Reposts receive buffer `buffer` (no credit: the device, not the peer's software, used it).
  bool repost(uint32_t buffer);
  /// The connection of QP `qp_num`, or null.
  verbs_conn* conn_of_qp(uint32_t qp_num);
  /// Reads the connection events and async events waiting (a message about to be fetched from a
  /// peer may come from one that is gone).
  unsigned poll_events();
  /// Reads completions into the stash (handled by the next progress()), taking tag-matching list
  /// operations at once: they run no callback.
  void stash_completions();
  /// Takes the stashed completion with `wr_id` into `*out`; false when there is none.
  bool take_stashed(uint64_t wr_id, work_completion* out);
  /// The stashed completion with `wr_id`, or null.
  work_completion* find_stashed(uint64_t wr_id);
  /// Schedules the error handler for `c`'s endpoint (called from progress, never re-entrantly).
  void report_failure(verbs_conn& c);
  /// Has progress() look at `c` for a grant and parked operations until it needs neither.
  void watch(verbs_conn& c);
  /// Closes `c` now, or at the end of the current progress() call.
  void close_conn(verbs_conn& c);
  /// The endpoint on `c` is gone. `c` closes now when the peer cannot be using it (it never
  /// became ready, failed, or the peer left it too) or when operations on it still touch the
  /// user's memory; otherwise the peer is told (a release message) and `c` stays for the peer's
  /// endpoint, closing once the peer leaves it too. So destroying an endpoint never fails the
  /// peer's endpoint that shares its connection.
  void release_conn(verbs_conn& c);
  /// Creates an RC QP on this interface's PD, CQ and SRQ, moved to INIT; null on failure.
  ibv_qp* create_qp();
  /// This side's handshake for a connection on `qp` starting at `psn`.
  handshake local_handshake(const ibv_qp* qp, uint32_t psn) const;
  /// Moves `qp` to RTR and RTS towards the peer described by `peer`; 0 or an errno value.
  int connect_qp(ibv_qp* qp, uint32_t local_psn, const handshake& peer);
  /// Connections alive now (for tests and info).
  size_t connections() const { return conns_.size(); }
  /// The completion queue (for tests that inject faults into it).
  ibv_cq* completion_queue() const { return cq_; }
  /// Receive buffers posted on the shared receive queue now.
  size_t rx_posted() const { return rx_posted_; }
  /// Send buffers free now (for tests).
  size_t tx_buffers_free() const { return free_tx_.size(); }
  /// Connections progress() looks at for a grant or parked operations (for tests).
  size_t watched_connections() const { return watched_.size(); }

private:
  bool open_device();
  bool open_queues();
  bool open_buffers();
  bool open_listener();
  bool open_event_fd();
  void fill_attr();
  void close_everything();

  size_t max_connections() const;
  /// Receive buffers handlers may keep at once (am_flag_desc; not reposted until released): half
  /// of one peer's credits, so keeping them never stalls a peer and fits the reserve of
  /// max_connections().
  size_t max_am_descs() const;
  unsigned poll_cq();
  int read_cq(work_completion* out, int max);
  unsigned handle_stash();
  void handle_wc(const work_completion& c);
  void handle_receive(const work_completion& c);
  ibv_srq* create_tm_srq();
  void fill_tag_attr();
  void close_tags();
  void deliver(verbs_conn& c, tl::am_id id, uint32_t buffer, size_t length);
  void handle_release(verbs_conn& c);
  void drain_cq_events();
  unsigned poll_cm_events();
  void handle_cm_event(cm_event_copy& copy);
  void handle_connect_request(const cm_event_copy& copy);
  void handle_connect_response(verbs_conn& c, const cm_event_copy& copy);
  void send_connect(verbs_conn& c);
  unsigned poll_async_events();
  void handle_async_event(const ibv_async_event& event);
  unsigned serve_watched();
  void report_failures();
  void reap_closed();
  void fail_all(status reason);
  verbs_conn* conn_of_id(rdma_cm_id* id);
  verbs_conn* claimable_conn(uint64_t peer_iface_id);
  verbs_conn& add_conn(std::unique_ptr<verbs_conn> c);
  void destroy_conn(verbs_conn& c);

  const api& t_;
  port_info port_;
  verbs_config config_;
  status open_status_ = status::ok;
  uint64_t iface_id_ = 0;
  size_t seg_ = 0;

  ibv_context* ctx_ = nullptr;
  ibv_device_attr device_attr_{};
  ibv_tm_caps tm_caps_{};  ///< the device's tag matching
  bool tm_ = false;        ///< the SRQ is a tag-matching one (cap_tag_*)
  size_t prefix_ = 0;      ///< bytes of TMH in front of every SEND (tmh_size with tm_)
  ibv_cq_ex* cq_ex_ = nullptr;  ///< cq_ as an extended CQ (with tm_)
  std::unique_ptr<verbs_tags> tags_;
  uint32_t next_rndv_id_ = 0;
  ibv_port_attr port_attr_{};
  gid_choice gid_;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_srq* srq_ = nullptr;
  uint32_t max_inline_ = 0;
  uint8_t max_rd_atom_ = 0;
  uint8_t max_init_rd_atom_ = 0;
  std::unique_ptr<verbs_md> md_;

  uint8_t* rx_pool_ = nullptr;
  ibv_mr* rx_mr_ = nullptr;
  size_t rx_posted_ = 0;
  std::vector<uint32_t> rx_owner_;  // QP number each kept receive buffer came from
  std::vector<bool> rx_lent_;       // receive buffers kept by handlers (not reposted)
  size_t rx_lent_count_ = 0;
  uint8_t* tx_pool_ = nullptr;
  ibv_mr* tx_mr_ = nullptr;
  std::vector<int32_t> free_tx_;

  rdma_event_channel* cm_channel_ = nullptr;
  rdma_cm_id* listener_ = nullptr;
  sockaddr_storage listen_address_{};
  int epoll_fd_ = -1;
  bool armed_ = false;
  unsigned tick_ = 0;
  bool in_progress_ = false;
  std::vector<work_completion> stash_;  // completions read ahead, handled by the next progress()

  struct handler {
    tl::am_handler_fn fn = nullptr;
    void* arg = nullptr;
  };
  handler handlers_[tl::am_id_count];
  tl::error_handler_fn error_fn_ = nullptr;
  void* error_arg_ = nullptr;

  std::unordered_map<uint64_t, std::unique_ptr<verbs_conn>> conns_;  // by serial
  std::unordered_map<uint32_t, verbs_conn*> by_qp_;
  std::unordered_map<rdma_cm_id*, verbs_conn*> by_id_;
  std::vector<uint64_t> failed_;  // serials whose failure is still to be reported
  std::vector<uint64_t> closing_; // serials to destroy at the end of progress()
  std::vector<uint64_t> watched_; // serials with a grant due or parked operations
  uint64_t next_serial_ = 1;
  uint32_t next_psn_ = 0;
  uint64_t dropped_ = 0;
  tl::iface_attr attr_;
  /// Encodes every SEND header of this interface (held by pointer: a capnp builder's destructor
  /// may throw, an iface's may not).
  std::unique_ptr<message_header_writer> header_writer_ = std::make_unique<message_header_writer>();
};

}  // namespace comm::verbs
