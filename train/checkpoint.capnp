# The manifest of one checkpoint, `ckpt/step-<n>/manifest.bin` (see checkpoint_store.h).
#
# The file is a 16-byte envelope (magic "TRPCKMAN", u32 message length in bytes, u32 CRC32C of the
# message) followed by this message in Cap'n Proto's flat (unpacked, single-segment) encoding.
# Readers bound the message (size, traversal and nesting limits) and validate every field.
@0x9797cb21caa52c1d;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::train::schema");

# model::GptConfig's fields; all zero when the checkpoint holds a model that is not the GPT.
struct GptConfig {
  vocabSize @0 :Int32;
  contextLength @1 :Int32;
  numLayers @2 :Int32;
  numHeads @3 :Int32;
  width @4 :Int32;
}

# Who held the parameters when the checkpoint was taken.
struct WorldLayout {
  worldSize @0 :Int32;
  generation @1 :Int64;
}

# One raw little-endian file holding elements [begin, end) of the flat fp32 parameter vector,
# followed (when hasMoments) by the same range of AdamW's m, then of v, then (when hasOuter) of the
# low-communication mode's θ_global, then of its outer momentum.
struct ShardFile {
  name @0 :Text;
  begin @1 :Int64;
  end @2 :Int64;
  byteSize @3 :UInt64;
  crc32c @4 :UInt32;
}

struct Manifest {
  formatVersion @0 :UInt32;
  model @1 :GptConfig;
  numParams @2 :Int64;      # length of the flat vector; shards cover [0, numParams) in order
  step @3 :Int64;           # the committed step this state follows
  seed @4 :UInt64;
  layout @5 :WorldLayout;
  hasMoments @6 :Bool;      # shard files carry AdamW m and v after the parameters
  optimizerStep @7 :Int64;  # AdamW's step count (bias corrections)
  shards @8 :List(ShardFile);
  hasOuter @9 :Bool;        # shard files carry [lowcomm]'s θ_global and outer momentum last
}
