@0xa4f5ea07787b7a05;
# The bootstrap's wire headers (libcomm/src/bootstrap_address.cpp): processes started by hand find
# each other through rank 0, which listens at a known address. Every other rank connects to it
# with a BootstrapHello as the connection's private data, and rank 0 answers with its own. A fence
# is one active message from each rank to rank 0 (its committed records) and one back from rank 0
# to each rank (every rank's records), each a BootstrapFence header (data-only, read in place)
# followed by BootstrapRecords (read with a checked reader, bounded by the message's length).

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("comm::wire::schema");

struct BootstrapHello {
  magic @0 :UInt64;   # "COMMBOT" followed by the protocol version byte
  rank  @1 :UInt32;   # the sender's rank
  size  @2 :UInt32;   # the number of ranks the sender was told the job has
}

struct BootstrapFence {
  kind   @0 :UInt8;   # 1 contribute (rank to rank 0), 2 release (rank 0 to every rank),
                      # 3 abort (rank 0 to every rank: the fence failed)
  status @1 :Int16;   # abort: the comm::status the fence fails with
  rank   @2 :UInt32;  # contribute: the sender; abort: the rank that failed the fence
  epoch  @3 :UInt32;  # the fence's number: 0 is the join inside create(), then one per fence
}

struct BootstrapRecord {
  rank  @0 :UInt32;   # the rank that put the value
  key   @1 :Data;
  value @2 :Data;
}

struct BootstrapRecords {
  records @0 :List(BootstrapRecord);
}
