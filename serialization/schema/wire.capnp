@0xc7d1e2f3a4b5c697;
# Every header libcomm's protocol layer puts on the wire (a transport's own headers are in its
# folder: transports/<tl>/<tl>.capnp). Hot-path headers are data-only structs, so a receiver
# validates the root pointer word and then reads the fields in place (see comm/wire/codec.hpp).
# Headers that carry variable data (addresses, keys) use pointers and are read with a checked reader.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("comm::wire::schema");

# -- worker addresses -----------------------------------------------------------------------------

struct TransportAddress {
  name   @0 :Text;   # transport name: self, shm, tcp, verbs
  device @1 :Data;   # device address: who can reach this interface (host/boot/namespace identity)
  iface  @2 :Data;   # interface address: how to reach it
  readsIn @3 :UInt32; # RDMA reads a peer may have outstanding per endpoint (0: not said)
  eagerWindow @4 :UInt64; # bytes of large eager copies a peer may have outstanding per endpoint
                          # (0: not said, send them by rendezvous)
}

struct WorkerAddress {
  uid        @0 :UInt64;   # unique id of the worker
  name       @1 :Text;
  clientId   @2 :UInt64;
  transports @3 :List(TransportAddress);
}

# -- endpoint wireup ------------------------------------------------------------------------------

struct WireupRequest {
  srcEp   @0 :UInt32;       # the requester's endpoint id, used as dstEp in replies
  address @1 :Data;         # packed WorkerAddress of the requester
}

struct WireupReply {
  dstEp  @0 :UInt32;        # the requester's endpoint id
  srcEp  @1 :UInt32;        # the replier's endpoint id
  status @2 :Int16;         # 0, or a comm::status explaining a refusal
}

struct EndpointClose {
  dstEp @0 :UInt32;
}

# -- tag matching, eager protocols ----------------------------------------------------------------

struct TagEager {           # a whole eager message; the payload follows the header
  dstEp @0 :UInt32;
  tag   @1 :UInt64;
}

struct TagEagerImm {        # a whole eager message with the sender's immediate value
  dstEp @0 :UInt32;
  tag   @1 :UInt64;
  imm   @2 :UInt64;
}

struct TagEagerFirst {      # first fragment of a multi-fragment eager message
  dstEp       @0 :UInt32;
  tag         @1 :UInt64;
  msgId       @2 :UInt64;
  totalLength @3 :UInt64;
  imm         @4 :UInt64;   # the sender's immediate value, or 0
  windowed    @5 :Bool;     # a large eager copy: counts against the receiver's eager window
}

struct TagCredit {          # the receiver gives back room of its eager window (large eager copies
  dstEp @0 :UInt32;         # that receives took)
  bytes @1 :UInt64;
}

struct FragmentMiddle {     # any later fragment of a multi-fragment message (tag or AM)
  dstEp  @0 :UInt32;
  msgId  @1 :UInt64;
  offset @2 :UInt64;
}

# -- active messages ------------------------------------------------------------------------------

struct ActiveMessage {      # a whole user AM: user header, then data, follow this header
  dstEp        @0 :UInt32;
  amId         @1 :UInt16;
  flags        @2 :UInt16;  # bit 0: the sender asks for a reply endpoint
  headerLength @3 :UInt32;
}

struct ActiveMessageFirst { # first fragment of a multi-fragment user AM
  dstEp        @0 :UInt32;
  amId         @1 :UInt16;
  flags        @2 :UInt16;
  headerLength @3 :UInt32;
  msgId        @4 :UInt64;
  totalLength  @5 :UInt64;  # user header plus data
}

# -- streams --------------------------------------------------------------------------------------

struct StreamData {         # stream bytes sent whole; they follow the header
  dstEp @0 :UInt32;
}

struct StreamFirst {        # first fragment of a stream send cut in fragments (FragmentMiddle next)
  dstEp       @0 :UInt32;
  msgId       @1 :UInt64;
  totalLength @2 :UInt64;   # bytes of the whole send
}

# -- rendezvous -----------------------------------------------------------------------------------

struct RndvRts {            # ready to send: the receiver fetches `length` bytes at `address`
  dstEp    @0 :UInt32;
  isAm     @1 :Bool;        # an active message rather than a tagged message
  tag      @2 :UInt64;
  imm      @3 :UInt64;
  sreqId   @4 :UInt64;      # the sender's request, echoed in RndvAts / RndvRtr
  length   @5 :UInt64;
  address  @6 :UInt64;
  amId     @7 :UInt16;
  amFlags  @8 :UInt16;
  rkey     @9 :Data;        # the sender's packed key for its transport's memory domain
  header   @10 :Data;       # the AM user header
  isStream @11 :Bool;       # bytes of the endpoint's byte stream (no tag, AM id or header)
}

struct RndvAts {            # acknowledgement: the receiver is done with the sender's buffer
  dstEp  @0 :UInt32;
  sreqId @1 :UInt64;
  status @2 :Int16;         # 0, or why the receiver could not take the data
}

struct RndvRtr {            # software rendezvous: the receiver asks the sender to push the data
  dstEp  @0 :UInt32;
  sreqId @1 :UInt64;
  rreqId @2 :UInt64;
  length @3 :UInt64;        # bytes the receiver takes (its buffer may be shorter)
}

struct RndvData {           # software rendezvous: data for a receive request, at an offset
  dstEp  @0 :UInt32;
  rreqId @1 :UInt64;
  offset @2 :UInt64;
}

struct RndvCancel {         # the sender cancelled a rendezvous send
  dstEp  @0 :UInt32;
  sreqId @1 :UInt64;
}

struct TagOffloadRndv {     # header of a tagged rendezvous sent through a transport's tag matching
  dstEp  @0 :UInt32;        # the receiver's endpoint for the sender
  sreqId @1 :UInt64;        # the sender's request, echoed in RndvAts / RndvRtr when the receiver
                            # fetches in software (the announcement reached it unmatched)
}

# -- memory keys ----------------------------------------------------------------------------------

struct RemoteKeyEntry {
  transport @0 :Text;
  key       @1 :Data;
  iface     @2 :UInt32;     # the owner's interface the key is for: its position in the owner's
                            # WorkerAddress.transports (a transport may have one per device)
}

struct RemoteKeyBundle {    # a worker's packed key for one registration, one entry per transport
  address @0 :UInt64;
  length  @1 :UInt64;
  entries @2 :List(RemoteKeyEntry);
  token   @3 :UInt64;       # names the registration to the owner's software RMA (lanes without
                            # get/put): the owner checks it and the range before every access
  access  @4 :UInt32;       # the region's remote rights (comm::mem_access bits; 0: every right)
}

# -- software RMA (lanes without get/put) ---------------------------------------------------------

struct RmaRequest {         # put: `length` bytes of data follow; get: the owner answers with them
  dstEp   @0 :UInt32;
  isGet   @1 :Bool;
  reqId   @2 :UInt64;
  token   @3 :UInt64;
  address @4 :UInt64;
  length  @5 :UInt64;
}

struct RmaReply {           # the owner's answer to one RmaRequest; for a get the data follows
  dstEp   @0 :UInt32;
  reqId   @1 :UInt64;
  address @2 :UInt64;       # echoes the request, so the requester knows where the data goes
  status  @3 :Int16;
}

struct RndvRefuse {         # the sender no longer has the rendezvous send a RndvRtr asked for
  dstEp  @0 :UInt32;
  rreqId @1 :UInt64;
  status @2 :Int16;
}

# -- connection manager private data --------------------------------------------------------------

# What libcomm's client and server put in the CM private data: how to reach their worker, the
# endpoint the peer must address, and the user's private data.
struct CmEndpointData {
  srcEp   @0 :UInt32;
  address @1 :Data;         # packed WorkerAddress
  user    @2 :Data;
}
