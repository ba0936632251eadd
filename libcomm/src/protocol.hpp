// Protocol modules: the interface every protocol of the protocol layer implements.
//
// The worker (worker_impl.hpp) dispatches: it owns the transports' interfaces, the endpoints with
// their pending and ordered-completion queues, the request pool, the tag matcher, progress, and
// the worker-level services (endpoint creation and wireup's lanes, control messages, the send
// engine of send.hpp, the limits of limits.cpp, the listener glue). It knows no protocol's
// internals. Each protocol is a module (a class derived from `protocol`, one file pair):
//
//   wireup.hpp  endpoint handshake and close notices    ids 1-3
//   tag.hpp     tagged messages: eager, matching        ids 4-7
//   am.hpp      active messages and their handlers      ids 8-10
//   rndv.hpp    rendezvous for tagged and active msgs   ids 11-15, 18
//   rma.hpp     registration, keys, put/get             ids 16-17
//   stream.hpp  ordered byte streams per endpoint       ids 19-21
//
// A module registers its receive handlers (one per wire id it owns) with the worker, keeps its
// requests' state in the request (request::init<S>), its per-endpoint state in the endpoint
// (state_of<S>), and answers the worker's hooks: an endpoint failing or going away, worker
// teardown, deferred work, info(). A module finds another with module_of<P>(worker)
// (protocols.hpp).
//
// What the author of a new protocol (say streams) writes:
//   1. stream.hpp / stream.cpp with `class stream_protocol final : public protocol`:
//      - its wire ids, `enum class stream_id : tl::am_id { data = 19, ... }` (ids below
//        tl::am_id_count that no other module uses: the worker refuses a duplicate at creation),
//        and in its constructor one `receive<&stream_protocol::on_data>(stream_id::data)` per id;
//      - its request state (trivially copyable structs given to request::init<S>), and one
//        `request_ops` table per kind of request it makes (progress for sends, notify, release,
//        cancel): the worker calls only those;
//      - its state per endpoint if it needs one (a struct derived from endpoint_state, reached
//        with state_of<S>(ep), freed with the endpoint);
//      - the hooks it needs (forget_peer, endpoint_failed, endpoint_deleted, teardown, progress,
//        info), and its public entry points (endpoint::stream_send, ...), which take the worker's
//        guard and find the module with module_of<stream_protocol>(w). Sends go through
//        start_send (endpoint.cpp) and may use the send engine's framing (send.hpp).
//   2. one registration line: its type in `protocol_list` (protocols.hpp), plus its .cpp in
//      libcomm/CMakeLists.txt.
#pragma once

#include <comm/transport/transport.hpp>
#include <comm/types.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string_view>

namespace comm {
class request;
}

namespace comm::detail {

class endpoint_impl;
class protocol;
class worker_impl;

/// Most modules a worker runs (protocols.hpp's list).
inline constexpr size_t max_protocols = 8;

/// The functions a module gives the worker for one kind of request: a static table in the
/// module's file, pointed to by every request of that kind.
struct request_ops {
  const char* name;  ///< the kind, for logs
  /// A send: issues what the transport takes now. ok when all of it went out (or the rest waits
  /// for the peer), no_resource when it must wait for resources, or an error. Null for requests
  /// that never sit in an endpoint's pending queue.
  status (*progress)(request* req) = nullptr;
  /// Tells the user the outcome (the request's `st`); null: params.send_cb, if set.
  void (*notify)(request* req, status st) = nullptr;
  /// Releases what the module keeps for the request (table entries, keys, registrations); the
  /// worker calls it at completion when request::holds is set. Must be idempotent.
  void (*release)(request* req) = nullptr;
  /// Cancels the request (worker::cancel): ok, busy when it is too late, or unsupported (null).
  status (*cancel)(request* req, cancel_mode mode) = nullptr;
  /// The wakeup_event kinds (comm/worker.hpp) its completion counts as, for worker::wait; 0 for
  /// the worker's internal requests.
  unsigned events = 0;
};

/// A module's state on one endpoint (protocol::state_of), freed with the endpoint.
struct endpoint_state {
  virtual ~endpoint_state() = default;
};

/// What becomes of the messages a peer sent that nobody received yet, when its endpoint fails or
/// goes away (rendezvous announcements and deferred AMs are always dropped: their data stays at
/// the peer).
enum class held_fate : uint8_t {
  keep,    ///< they stay tied to the endpoint (it failed but still exists)
  detach,  ///< they stay receivable, tied to no endpoint (it is going away)
  drop,    ///< they are freed (the peer passed a limit)
};

/// What a handler that may keep transport descriptors is called with (protocol::receive_desc): its
/// module, and the interface that delivered the message, to give a kept descriptor back to
/// (tl::iface::release_am_desc). The interface is null for messages handed over by
/// worker_impl::deliver, which never come as descriptors.
struct desc_source {
  protocol* module = nullptr;  ///< the module whose handler runs
  tl::iface* iface = nullptr;  ///< the interface that delivered the message, or null
};

/// Wire id of a module's enum value.
template <class Id>
constexpr tl::am_id wire_id(Id id) {
  return static_cast<tl::am_id>(id);
}

/// A protocol module (see the top of this file). One instance per worker, made by the worker at
/// creation in protocols.hpp's order, which is also the order its hooks run in.
class protocol {
public:
  /// @param index its place in protocols.hpp's list
  protocol(worker_impl& w, unsigned index) : w(w), index_(index) {}
  virtual ~protocol() = default;
  protocol(const protocol&) = delete;
  protocol& operator=(const protocol&) = delete;

  /// Short name, for info() and logs.
  virtual std::string_view name() const noexcept = 0;
  /// Its place in the worker's list.
  unsigned index() const noexcept { return index_; }

  // -- hooks (all optional) ----------------------------------------------------------------------

  /// Frees or keeps, as `fate` says, what `ep`'s peer sent and nobody received yet. Runs when
  /// `ep` fails (keep), before it goes away (detach) and when its peer passed a limit (drop).
  virtual void forget_peer(endpoint_impl& ep, held_fate fate) {}
  /// `ep` failed with `reason` (after every module's forget_peer; its queued sends are the
  /// endpoint's): completes or drops what waits for its peer, such as receives of its data.
  virtual void endpoint_failed(endpoint_impl& ep, status reason) {}
  /// `ep` is being deleted (its lane is gone: the transport writes nothing more for it): frees
  /// what the module still keeps for it and ends what still waits on it.
  virtual void endpoint_deleted(endpoint_impl& ep) {}
  /// True while the module has an operation on `ep` that the transport or the peer still writes
  /// into our memory for (a rendezvous fetch): a closing endpoint waits for it before it tells the
  /// peer, and calls endpoint_impl::complete_in_order once it ended.
  virtual bool busy_on(const endpoint_impl& ep) const { return false; }
  /// Worker teardown, once every endpoint failed and before they are deleted: cancels what the
  /// user posted and frees what arrived.
  virtual void teardown() {}
  /// Deferred work, called from worker::progress while the module asks with want_progress.
  virtual void progress() {}
  /// Appends the module's lines to worker::info().
  virtual void info(std::ostream& out) const {}

protected:
  /// Registers `Handler` (a member `void (const uint8_t* data, size_t length)` of the module) for
  /// the transport AMs with wire id `id`.
  template <auto Handler, class Id>
  void receive(Id id);
  /// Registers `Handler` (a member `status (tl::iface* from, uint8_t* data, size_t length,
  /// unsigned flags)` of the module) for wire id `id`: it is told the interface the message came
  /// from and may keep `data` when `flags` has tl::am_flag_desc by returning in_progress, then
  /// gives it back with from->release_am_desc(data).
  template <auto Handler, class Id>
  void receive_desc(Id id);
  /// The module's state of type S on `ep`, made on first use.
  template <class S>
  S& state_of(endpoint_impl& ep);
  /// The module's state of type S on `ep`, or null if it has none yet.
  template <class S>
  S* find_state(const endpoint_impl& ep) const;
  /// Asks for (or stops asking for) progress() calls.
  void want_progress(bool wanted);

  worker_impl& w;  ///< the worker

private:
  /// Calls `Handler` of the module at `arg` (a transport AM handler).
  template <class P, auto Handler>
  static status trampoline(void* arg, void* data, size_t length, unsigned) {
    (static_cast<P*>(arg)->*Handler)(static_cast<const uint8_t*>(data), length);
    return status::ok;
  }
  /// Calls `Handler` of the module that `arg` (a desc_source) names, with its interface.
  template <class P, auto Handler>
  static status desc_trampoline(void* arg, void* data, size_t length, unsigned flags) {
    auto* source = static_cast<desc_source*>(arg);
    return (static_cast<P*>(source->module)->*Handler)(source->iface,
                                                        static_cast<uint8_t*>(data), length, flags);
  }
  /// The class of a member function pointer type.
  template <class T>
  struct member_of;
  template <class C>
  struct member_of<void (C::*)(const uint8_t*, size_t)> {
    using type = C;
  };
  template <class C>
  struct member_of<status (C::*)(tl::iface*, uint8_t*, size_t, unsigned)> {
    using type = C;
  };
  /// Registers `fn` with `arg` for wire id `id` (worker_impl::add_receiver); with `per_iface`,
  /// `fn` takes a desc_source naming this module and the delivering interface instead of `arg`.
  void add_receiver(tl::am_id id, tl::am_handler_fn fn, void* arg, bool per_iface = false);

  unsigned index_;
};

template <auto Handler, class Id>
void protocol::receive(Id id) {
  using P = typename member_of<decltype(Handler)>::type;
  add_receiver(wire_id(id), &trampoline<P, Handler>, static_cast<P*>(this));
}

template <auto Handler, class Id>
void protocol::receive_desc(Id id) {
  using P = typename member_of<decltype(Handler)>::type;
  add_receiver(wire_id(id), &desc_trampoline<P, Handler>, this, true);
}

}  // namespace comm::detail
