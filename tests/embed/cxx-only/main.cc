// Links troupe::train, Cap'n Proto included, into a C++-only project: a checkpoint manifest
// encoded and decoded through its Cap'n Proto schema.
#include <iostream>

#include "troupe/train/manifest.h"

static_assert(__cplusplus >= 201703L, "troupe::train should have raised the standard to C++17");

int main() {
  namespace tt = troupe::train;
  tt::CheckpointManifest manifest;
  manifest.num_params = 1000;
  manifest.step = 7;
  manifest.shards.push_back(
      {"shard-00000.bin", 0, 1000, tt::ShardByteSize(0, 1000, manifest.has_moments), 0});
  const std::string bytes = tt::EncodeManifest(manifest);
  absl::StatusOr<tt::CheckpointManifest> back = tt::DecodeManifest(bytes, "manifest.bin");
  if (!back.ok() || !(*back == manifest)) {
    std::cerr << "cxx-only: manifest round trip failed: " << back.status() << "\n";
    return 1;
  }
  std::cout << "cxx-only: manifest round trip, " << bytes.size() << " bytes, step " << back->step
            << "\n";
  return 0;
}
