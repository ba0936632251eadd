@0xb483a564c3262b33;
# The actor layer's wire headers (actors/): the envelope in front of every frame one node sends
# another, and the hello both sides of a connection put in the connection manager's private data.
# The envelope is data-only (read in place, see comm/wire/codec.hpp); the hello is read once per
# connection with a checked reader.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("comm::wire::schema");

# Travels as the user header of an active message; the frame's payload is the AM's data.
struct ActorEnvelope {
  kind      @0 :UInt8;    # 1 message, 2 monitor, 3 down, 4 link, 5 unlink, 6 lookup, 7 lookupReply,
                          # 8 release (the payload is an ActorReleases)
  flags     @1 :UInt8;    # bits 0-1: where the sender lives (0 nowhere: anonymous, 1 the sending
                          # node, 2 the receiving node, 3 elsewhere: its handle leads the payload);
                          # bit 2: the payload carries a forwarding stack; bit 3 (message):
                          # the attachments are lent, the AM's data is an ActorLends
  status    @2 :Int16;    # lookupReply: 0 or the comm::status explaining a failure
  seq       @3 :UInt32;   # per-connection frame number: frames are handled in this order
  sender    @4 :UInt64;   # actor id of the sender (message, link, unlink), or of the actor that
                          # terminated (down)
  receiver  @5 :UInt64;   # actor id of the receiver (message, monitor, link, unlink), or the
                          # actor found (lookupReply, 0 when none)
  messageId @6 :UInt64;   # CAF message id, raw (message); the lookup's number (lookup, lookupReply)
  typeCount @7 :UInt16;   # message: number of elements of the CAF message in the payload, whose
                          # type names lead it (CAF's own message format)
  attached  @8 :UInt64;   # message: bytes of attachments (the message's large raw runs, in the
                          # order it reads them) at the end of the AM's data; 0: none. With
                          # attachments the payload may follow the envelope in the AM header,
                          # then the AM's data holds the attachments only
}

# Payloads: message: [sender handle] [forwarding stack] CAF message (caf::binary_serializer);
# down: the exit reason (caf::error); lookup: the name (bytes); release:
# an ActorReleases; others: empty.

# Lent attachments (envelope flag bit 3): instead of its bytes, each attachment names memory of
# the sender's that the receiver maps and reads in place (comm::endpoint::rkey_local_address),
# until it sends back a release of the lend's id. The payload then rides in the AM header after
# the envelope, and the AM's data is this message (a flat Cap'n Proto array).
struct ActorLend {
  id       @0 :UInt64;    # the sender's number for the lend, named again by the release
  address  @1 :UInt64;    # where the bytes start, in the sender's address space
  length   @2 :UInt64;    # how many (at least the attachment threshold)
  key      @3 :Data;      # the packed remote key of the region (comm::worker::rkey_pack)
  returned @4 :Bool;      # the bytes of the receiver's own lend `id` coming back (no key, no
                          # address: the receiver reads its own buffer)
}

struct ActorLends {
  runs @0 :List(ActorLend);  # the attachments in the order the reader takes them
}

# The receiver of lends lets go of them: every id must name a lend not released yet.
struct ActorReleases {
  ids @0 :List(UInt64);
}

struct ActorNodeHello {
  magic   @0 :UInt64;     # "COMMACT" followed by the protocol version byte
  nodeId  @1 :Data;       # the node's CAF node id (caf::binary_serializer)
  address @2 :Text;       # where the node listens ("ip:port"), empty when it does not
}
