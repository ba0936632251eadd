// Memory registration and remote keys, for RMA and rendezvous.
//
// Register a buffer with worker::mem_map, pack its key with worker::rkey_pack, send the bytes to a
// peer, which unpacks them with endpoint::rkey_unpack and reads or writes the buffer with
// endpoint::get / endpoint::put.
#pragma once

#include <comm/types.hpp>

namespace comm {

/// A registered memory region (ucp_mem_h): created by worker::mem_map, released by
/// worker::mem_unmap. Registrations of the same range share transport state (a registration
/// cache).
class memh;

/// An unpacked remote key (ucp_rkey_h): access to a peer's registered region through one
/// endpoint. Created by endpoint::rkey_unpack, released by endpoint::rkey_destroy.
class rkey;

}  // namespace comm
