// The protocol modules every worker runs (protocol.hpp says what a module is). Adding a protocol
// adds its type to protocol_list.
#pragma once

#include "am.hpp"
#include "rma.hpp"
#include "rndv.hpp"
#include "tag.hpp"
#include "wireup.hpp"

#include <cstddef>
#include <type_traits>

namespace comm::detail {

/// A list of module types.
template <class... P>
struct module_list {
  /// Number of modules.
  static constexpr size_t size = sizeof...(P);
  /// Index of Q in the list, or `size` when it is not in it.
  template <class Q>
  static constexpr size_t index_of() {
    size_t i = 0, found = size;
    ((std::is_same_v<Q, P> && found == size ? found = i : 0, ++i), ...);
    return found;
  }
};

/// The modules every worker runs, in the order their hooks run. Rendezvous comes before tag, so
/// that on a failed endpoint the receives waiting for rendezvous data complete before the one
/// whose fragments were arriving.
using protocol_list =
    module_list<wireup_protocol, rndv_protocol, tag_protocol, am_protocol, rma_protocol>;

static_assert(protocol_list::size <= max_protocols, "raise max_protocols");

/// The module P of worker `w`.
template <class P>
P& module_of(worker_impl& w) {
  constexpr size_t i = protocol_list::index_of<P>();
  static_assert(i < protocol_list::size, "not a module of protocol_list");
  return static_cast<P&>(*w.protocols[i]);
}

/// The module P of worker `w`.
template <class P>
const P& module_of(const worker_impl& w) {
  return module_of<P>(const_cast<worker_impl&>(w));
}

}  // namespace comm::detail
