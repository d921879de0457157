# The coordinator's committed-step record, `<work_dir>/coordinator.state` (see
# coordinator_record.h): what a restarted coordinator resumes from. The file is the envelope of
# envelope.h (magic "TRPCOREC", length, CRC32C) around this message.
@0xd4f1a2b3c4d5e6f7;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::train::schema");

struct CoordinatorRecord {
  formatVersion @0 :UInt32;
  committed @1 :Int64;          # steps committed
  generation @2 :UInt64;        # the newest generation planned
  stepsLost @3 :Int64;
  awaitingRecovery @4 :Bool;    # a fault fired; the next commit measures recovery
  fired @5 :List(Int32);        # indices into the job's faults that have fired
  active @6 :List(Text);        # the committed configuration: worker of each rank
  dead @7 :List(Text);          # workers known dead
  buddy @8 :Int32 = 1;          # the committed configuration's buddy offset
}
