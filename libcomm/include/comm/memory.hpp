// Memory registration and remote keys, for RMA and rendezvous.
//
// Register a buffer with worker::mem_map, pack its key with worker::rkey_pack, send the bytes to a
// peer, which unpacks them with endpoint::rkey_unpack and reads or writes the buffer with
// endpoint::get / endpoint::put.
#pragma once

#include <comm/types.hpp>

#include <cstddef>
#include <memory>

namespace comm {

/// Allocates `length` bytes, page aligned, that peers on this host can reach without a system
/// call: a rendezvous or RMA over shm whose remote buffer lies in such a block is a plain copy
/// through a shared mapping instead of cross-memory attach. The block lives in a memfd segment of
/// a process-wide heap (pages allocated up front; freed blocks are reused), so it is shared
/// memory: a child forked after the allocation shares it with the parent instead of getting a
/// copy. Where no segment can be made it is plain heap memory (still valid, reached by CMA).
/// Thread-safe; null without memory.
void* mem_alloc(size_t length) noexcept;

/// Frees a block of mem_alloc or worker::mem_alloc, or data taken over with
/// worker::am_data_detach (whichever allocator it came from; anything else must be a malloc'd
/// block, which goes to std::free).
/// Thread-safe, and valid after every context and worker is gone. Null is ignored.
void mem_free(void* block) noexcept;

/// A registered memory region (ucp_mem_h): created by worker::mem_map, released by
/// worker::mem_unmap (or with its memh_ptr). Registrations of the same range share transport
/// state (a registration cache). The worker releases those still registered when it is
/// destroyed.
class memh;

/// An unpacked remote key (ucp_rkey_h): access to a peer's registered region through one
/// endpoint. Created by endpoint::rkey_unpack, released by endpoint::rkey_destroy (or with its
/// rkey_ptr); released with its endpoint if that goes first.
class rkey;

/// A peer's registered memory as this process sees it through a shared mapping
/// (endpoint::rkey_local_address, UCP's ucp_rkey_ptr). The bytes are the peer's own: what it
/// writes there shows here. A region the peer registered for remote reads only is mapped
/// read-only (shm): a write through `data` faults (SIGSEGV) instead of changing the peer's
/// bytes; writes into a region open to remote writes show there. With a mapping (shm), the
/// bytes stay readable memory while `mapping`, or a copy of it, lives, also after the key, the
/// endpoint, the worker or the peer process are gone; what they hold is the peer's to change
/// (after it freed the region, anything). Without one (self: the region is this process's), they
/// are valid while the peer keeps the region allocated.
struct local_memory {
  const void* data = nullptr;           ///< the first byte, in this process
  size_t length = 0;                    ///< bytes from `data`
  std::shared_ptr<const void> mapping;  ///< what keeps them mapped (null: no mapping needed)
};

namespace detail {
/// Links handles to what they own, and unlinks them (the library's side, handles.cpp).
struct handle_access;
}  // namespace detail

/// An owning handle of a registration (worker::mem_map): destroying it unmaps the region.
/// Move-only. If the worker is destroyed first it releases the registration and the handle
/// becomes empty.
class memh_ptr {
public:
  /// No registration.
  memh_ptr() noexcept = default;
  /// Takes over `handle`, a registration of the low-level worker::mem_map, which must not be
  /// unmapped by hand any more.
  explicit memh_ptr(memh* handle) noexcept : h_(handle) {
    if (h_ != nullptr) link();
  }
  /// Takes the registration of `other`, which becomes empty.
  memh_ptr(memh_ptr&& other) noexcept : h_(other.h_) {
    if (h_ != nullptr) relink(other);
  }
  /// Unmaps this handle's registration and takes that of `other`.
  memh_ptr& operator=(memh_ptr&& other) noexcept {
    if (this != &other) {
      reset();
      h_ = other.h_;
      if (h_ != nullptr) relink(other);
    }
    return *this;
  }
  memh_ptr(const memh_ptr&) = delete;
  memh_ptr& operator=(const memh_ptr&) = delete;
  /// Unmaps the registration.
  ~memh_ptr() { reset(); }

  /// The registration, or null.
  memh* get() const noexcept { return h_; }
  /// The registration (the handle must hold one), e.g. for worker::rkey_pack.
  memh& operator*() const noexcept { return *h_; }
  /// True while the handle holds a registration.
  explicit operator bool() const noexcept { return h_ != nullptr; }

  /// Unmaps the registration now; the handle is empty afterwards.
  void reset() noexcept {
    if (h_ != nullptr) unmap();
  }
  /// Gives the registration up without unmapping it (worker::mem_unmap is the caller's).
  memh* release() noexcept;

private:
  friend struct detail::handle_access;

  void link() noexcept;
  void relink(memh_ptr& other) noexcept;
  void unmap() noexcept;

  memh* h_ = nullptr;
};

/// An owning handle of an unpacked remote key (endpoint::rkey_unpack): destroying it destroys
/// the key. Move-only. If the key's endpoint goes first (closed, or its worker destroyed) the
/// key goes with it and the handle becomes empty.
class rkey_ptr {
public:
  /// No key.
  rkey_ptr() noexcept = default;
  /// Takes over `key`, a key of the low-level endpoint::rkey_unpack, which must not be destroyed
  /// by hand any more.
  explicit rkey_ptr(rkey* key) noexcept : k_(key) {
    if (k_ != nullptr) link();
  }
  /// Takes the key of `other`, which becomes empty.
  rkey_ptr(rkey_ptr&& other) noexcept : k_(other.k_) {
    if (k_ != nullptr) relink(other);
  }
  /// Destroys this handle's key and takes that of `other`.
  rkey_ptr& operator=(rkey_ptr&& other) noexcept {
    if (this != &other) {
      reset();
      k_ = other.k_;
      if (k_ != nullptr) relink(other);
    }
    return *this;
  }
  rkey_ptr(const rkey_ptr&) = delete;
  rkey_ptr& operator=(const rkey_ptr&) = delete;
  /// Destroys the key.
  ~rkey_ptr() { reset(); }

  /// The key, or null.
  rkey* get() const noexcept { return k_; }
  /// The key (the handle must hold one), e.g. for endpoint::put and endpoint::get.
  rkey& operator*() const noexcept { return *k_; }
  /// True while the handle holds a key.
  explicit operator bool() const noexcept { return k_ != nullptr; }

  /// Destroys the key now; the handle is empty afterwards.
  void reset() noexcept {
    if (k_ != nullptr) destroy();
  }
  /// Gives the key up without destroying it (endpoint::rkey_destroy is the caller's).
  rkey* release() noexcept;

private:
  friend struct detail::handle_access;

  void link() noexcept;
  void relink(rkey_ptr& other) noexcept;
  void destroy() noexcept;

  rkey* k_ = nullptr;
};

}  // namespace comm
