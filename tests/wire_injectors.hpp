// Hostile input for the conformance suite: one injector per transport that puts raw, malformed
// bytes on the wire to an interface, as a peer of that interface would, through the transport's own
// medium: cells written straight into the target's shm FIFO (bad am ids, lengths beyond the cell or
// the buffer, unknown kinds), frames on a raw tcp socket (no hello, a wrong magic, unknown ids and
// kinds, a 4 GiB length), and SENDs posted on a verbs queue pair of the verbs test device (too
// short for a header, unknown kinds, am ids out of range, reserved bits). Each input goes on a
// connection of its own where the transport has connections. self has no wire (its peers are
// calls inside this process), so it has no injector.
#pragma once

#include "tl_helpers.hpp"

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include "../transports/shm/shm_segment.hpp"
#include "tcp/tcp.capnp.h"
#include "verbs/testdev/testdev.hpp"
#include "verbs/verbs_ep.hpp"
#include "verbs/verbs_iface.hpp"
#include "verbs/verbs_wire.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace comm::test {

/// Puts malformed input on the wire to one interface (the target), as its peer would.
class wire_injector {
public:
  virtual ~wire_injector() = default;
  /// What each input is, by index.
  virtual std::vector<std::string> inputs() const = 0;
  /// Puts input `index` on the wire to the target (on a new connection where there are any).
  virtual void inject(size_t index) = 0;
  /// True once the target refused the last input: it closed the connection it came on, or, where
  /// nothing connects a sender (shm's FIFO), counted the input as malformed and skipped it.
  virtual bool refused() = 0;
  /// Connections the target holds from this injector now (0 once it let go of all of them).
  virtual size_t held() = 0;
};

/// A number the target's info() shows after `label`, or -1.
inline long info_number(const tl::iface& iface, const std::string& label) {
  const std::string text = iface.info();
  const size_t at = text.find(label);
  if (at == std::string::npos) return -1;
  return std::strtol(text.c_str() + at + label.size(), nullptr, 10);
}

// -- shm: cells written straight into the target's FIFO -------------------------------------------

/// Maps the target's segment like a sender and publishes cells with bad metadata.
class shm_injector final : public wire_injector {
public:
  explicit shm_injector(tl::iface& target) : target_(target) {
    const auto address = tl::shm::iface_addr::unpack(target.iface_address());
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
    if (!address || pidfd < 0 || tl::shm::segment::attach(pidfd, *address, &seg_) != status::ok) {
      if (pidfd >= 0) ::close(pidfd);
      throw std::runtime_error("shm injector: cannot map the target's segment");
    }
    ::close(pidfd);
  }

  std::vector<std::string> inputs() const override {
    return {"a cell with am id 200", "an inline cell longer than a cell",
            "a bcopy cell longer than a receive buffer", "a cell of unknown kind 77"};
  }

  void inject(size_t index) override {
    using tl::shm::cell_meta;
    static const cell_meta metas[] = {{200, tl::shm::cell_inline, 0, 8},
                                      {1, tl::shm::cell_inline, 0, 5000},
                                      {1, tl::shm::cell_bcopy, 0, 1u << 30},
                                      {1, 77, 0, 8}};
    malformed_before_ = info_number(target_, "shm: malformed cells ");
    const uint64_t cell =
        tl::shm::shared_word(seg_.control().head).fetch_add(1) & ~tl::shm::head_armed;
    seg_.cell(cell)->meta = metas[index].pack();
    tl::shm::shared_word(seg_.cell(cell)->seq).store(cell + 1, std::memory_order_release);
  }

  bool refused() override {
    return info_number(target_, "shm: malformed cells ") == malformed_before_ + 1;
  }

  size_t held() override { return 0; }  // the FIFO has no connection per sender

private:
  tl::iface& target_;
  tl::shm::segment seg_;
  long malformed_before_ = 0;
};

// -- tcp: frames on a raw socket ------------------------------------------------------------------

/// Connects raw sockets to the target's listener and writes bad hellos and frames.
class tcp_injector final : public wire_injector {
public:
  explicit tcp_injector(tl::iface& target) : target_(target) {
    const std::vector<uint8_t> device = target.device_address();
    const std::vector<uint8_t> address = target.iface_address();
    // Device address: family (4 or 6), 3 reserved bytes, 16 address bytes (IPv4: the first 4, in
    // network order), ...; interface address: port (host order), interface id, window.
    if (device.size() < 20 || address.size() < 10 || (device[0] != 4 && device[0] != 6)) {
      throw std::runtime_error("tcp injector: address");
    }
    ipv6_ = device[0] == 6;
    std::memcpy(ip_, device.data() + 4, 16);
    std::memcpy(&port_, address.data(), 2);
    std::memcpy(&iface_id_, address.data() + 2, 8);
    baseline_ = open_connections();
  }
  ~tcp_injector() override {
    if (fd_ >= 0) ::close(fd_);
  }

  std::vector<std::string> inputs() const override {
    return {"random bytes instead of a hello", "a hello with the wrong magic",
            "a frame with am id 200", "a frame announcing 4 GiB", "a frame of unknown kind 9"};
  }

  void inject(size_t index) override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = connect_raw();
    std::vector<uint8_t> bytes;
    switch (index) {
      case 0:
        bytes.assign(100, 0x5a);
        break;
      case 1:
        bytes = hello(0x0badc0de0badc0deull);
        break;
      case 2:
        bytes = with_hello(frame(200, 8, wire::schema::TcpFrameKind::MESSAGE));
        break;
      case 3:
        bytes = with_hello(frame(1, 0xffffffffu, wire::schema::TcpFrameKind::MESSAGE));
        break;
      default:
        bytes = with_hello(frame(1, 0, static_cast<wire::schema::TcpFrameKind>(9)));
        break;
    }
    if (fd_ < 0 || ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
                       static_cast<ssize_t>(bytes.size())) {
      throw std::runtime_error("tcp injector: cannot reach the target");
    }
  }

  bool refused() override {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 0) != 1) return false;
    char byte;
    return ::recv(fd_, &byte, 1, MSG_DONTWAIT) <= 0;
  }

  size_t held() override {
    const long now = open_connections();
    return now > baseline_ ? static_cast<size_t>(now - baseline_) : 0;
  }

private:
  long open_connections() const { return info_number(target_, "tcp: connections "); }

  int connect_raw() const {
    const int fd = ::socket(ipv6_ ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage to{};
    socklen_t length = 0;
    if (ipv6_) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&to);
      in6->sin6_family = AF_INET6;
      std::memcpy(&in6->sin6_addr, ip_, 16);
      in6->sin6_port = htons(port_);
      length = sizeof(sockaddr_in6);
    } else {
      auto* in4 = reinterpret_cast<sockaddr_in*>(&to);
      in4->sin_family = AF_INET;
      std::memcpy(&in4->sin_addr, ip_, 4);
      in4->sin_port = htons(port_);
      length = sizeof(sockaddr_in);
    }
    if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&to), length) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  template <class Writer>
  static std::vector<uint8_t> bytes_of(const Writer& writer) {
    const auto* p = static_cast<const uint8_t*>(writer.bytes());
    return std::vector<uint8_t>(p, p + writer.size());
  }

  std::vector<uint8_t> hello(uint64_t magic) const {
    wire::header_writer<wire::schema::TcpHello> writer;
    writer.fields().setMagic(magic);
    writer.fields().setVersion(3);
    writer.fields().setSrcPort(1);
    if (ipv6_) {
      uint64_t halves[2];
      std::memcpy(halves, ip_, 16);
      writer.fields().setSrcIpv6(true);
      writer.fields().setSrcAddress6a(halves[0]);
      writer.fields().setSrcAddress6b(halves[1]);
    } else {
      uint32_t ipv4 = 0;
      std::memcpy(&ipv4, ip_, 4);
      writer.fields().setSrcAddress(ipv4);
    }
    writer.fields().setSrcIfaceId(0x1badull);
    writer.fields().setDstIfaceId(iface_id_);
    writer.fields().setWindow(64);
    writer.fields().setNonce0(0x1234);
    writer.fields().setNonce1(0x5678);
    return bytes_of(writer);
  }

  std::vector<uint8_t> with_hello(const std::vector<uint8_t>& frame_bytes) const {
    std::vector<uint8_t> bytes = hello(0x434f4d4d54435000ull);  // the genuine magic
    bytes.insert(bytes.end(), frame_bytes.begin(), frame_bytes.end());
    return bytes;
  }

  static std::vector<uint8_t> frame(unsigned id, uint32_t length,
                                    wire::schema::TcpFrameKind kind) {
    wire::header_writer<wire::schema::TcpFrame> writer;
    writer.fields().setAmId(static_cast<uint8_t>(id));
    writer.fields().setLength(length);
    writer.fields().setKind(kind);
    return bytes_of(writer);
  }

  tl::iface& target_;
  bool ipv6_ = false;
  uint8_t ip_[16] = {};
  uint16_t port_ = 0;
  uint64_t iface_id_ = 0;
  long baseline_ = 0;
  int fd_ = -1;
};

// -- verbs: SENDs posted on a queue pair of the verbs test device ---------------------------------

/// Opens an interface of its own, connects an endpoint to the target for each input, and posts
/// the input as a raw SEND on that endpoint's queue pair, behind the transport's back.
class verbs_injector final : public wire_injector {
public:
  verbs_injector(tl::component& component, tl::iface& target) : target_(target) {
    tl::iface_params params;
    params.device = component.devices().front();
    if (component.open(params, own_) != status::ok) {
      throw std::runtime_error("verbs injector: cannot open an interface");
    }
    failures_.install(*own_);
    baseline_ = connections();
  }
  ~verbs_injector() override {
    ep_.reset();
    own_.reset();
  }

  std::vector<std::string> inputs() const override {
    return {"an empty SEND", "a SEND of 4 bytes, shorter than a header",
            "a header of unknown kind 9", "an active message with am id 200",
            "a header whose root pointer claims a pointer section",
            "a header whose root pointer has a data section short of the struct"};
  }

  void inject(size_t index) override {
    ep_.reset();
    ep_ = connect(*own_, target_);
    auto* conn = static_cast<verbs::verbs_ep&>(*ep_).conn();
    for (int round = 0; round < 1'000'000 && conn->state() == verbs::conn_state::connecting;
         ++round) {
      own_->progress();
      target_.progress();
    }
    if (conn->state() != verbs::conn_state::ready) {
      throw std::runtime_error("verbs injector: the connection never came up");
    }
    alignas(8) uint8_t h[verbs::message_header_size];
    verbs::message_header_writer writer;
    uint32_t length = sizeof(h);
    const uint8_t am_id = index == 3 ? 200 : 1;
    writer.write(h, verbs::message_kind::am, am_id, 0);
    if (index == 0) length = 0;
    if (index == 1) length = 4;
    if (index == 2) h[8 + 1] = 9;  // VerbsMessageHeader.kind: byte 1 of the data section
    uint64_t root;
    std::memcpy(&root, h, sizeof(root));
    if (index == 4) root |= uint64_t{1} << 48;  // one pointer word
    if (index == 5) root &= ~(uint64_t{0xffff} << 32);  // no data words
    std::memcpy(h, &root, sizeof(root));
    ibv_sge sge{reinterpret_cast<uintptr_t>(h), length, 0};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE;
    wr.sg_list = length != 0 ? &sge : nullptr;
    wr.num_sge = length != 0 ? 1 : 0;
    ibv_send_wr* bad = nullptr;
    if (verbs::testdev::table().post_send(conn->qp(), &wr, &bad) != 0) {
      throw std::runtime_error("verbs injector: post_send refused");
    }
  }

  bool refused() override {
    own_->progress();
    auto* ep = static_cast<verbs::verbs_ep*>(ep_.get());
    return ep != nullptr &&
           (ep->conn() == nullptr || ep->conn()->state() == verbs::conn_state::failed);
  }

  size_t held() override {
    const size_t now = connections();
    return now > baseline_ ? now - baseline_ : 0;
  }

private:
  size_t connections() const { return static_cast<verbs::verbs_iface&>(target_).connections(); }

  tl::iface& target_;
  std::unique_ptr<tl::iface> own_;
  std::unique_ptr<tl::ep> ep_;
  failure_log failures_;
  size_t baseline_ = 0;
};

/// The injector for `transport` towards `target`, or null with `why` when it has none.
inline std::unique_ptr<wire_injector> make_injector(tl::component& component, tl::iface& target,
                                                    std::string* why) {
  const std::string name(component.name());
  if (name == "shm") return std::make_unique<shm_injector>(target);
  if (name == "tcp") return std::make_unique<tcp_injector>(target);
  if (name == "verbs") return std::make_unique<verbs_injector>(component, target);
  *why = name == "self" ? "self has no wire: its peers are calls inside this process"
                        : "no injector is written for transport " + name;
  return nullptr;
}

}  // namespace comm::test
