// troupe/collectives/sub_communicator.h — some ranks of a communicator as a communicator of their
// own: training's low-communication mode runs each group's data parallelism on the ranks of the
// group, over the one communicator a generation connects (train/lowcomm_rank.h).
//
//   std::vector<int> members = {1, 3, 4};      // ranks of `world`, increasing; world.rank() in it
//   auto group = SubCommunicator::Create(&world, members);   // (*group)->rank() is 0 at world 1
//
// Point-to-point operations are the parent's, with the peer's rank translated; tags are the
// caller's (a pair of ranks of the group never carries another group's traffic). Collectives run
// over the parent's point-to-point operations, in the caller's thread, complete when they return
// (Work::Done), and reduce in rank order — bit-identical on every member. They move every block
// to every member: meant for what a data-parallel step sends as collectives (the gradient norm's
// chunk sums, a CRC), not for bulk data. Their tags are kSubTagBase | a sequence number every
// member advances alike. An Abort aborts the parent: one failure ends the generation for all. A
// failure blamed on a peer (BlamedPeer) names it by its rank in the parent, as whoever planned
// the parent's ranks knows it.
#ifndef TROUPE_COLLECTIVES_SUB_COMMUNICATOR_H_
#define TROUPE_COLLECTIVES_SUB_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "troupe/collectives/communicator.h"

namespace troupe::collectives {

class SubCommunicator final : public Communicator {
 public:
  // Tags of the group's own collectives: bits 28..30 set (training's point-to-point tags never
  // set all three), a sequence number in bits 0..26.
  static constexpr uint32_t kSubTagBase = 0x70000000u;

  // `members`: increasing ranks of `parent` (which must outlive the view), including its own.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SubCommunicator>> Create(
      Communicator* parent, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  uint64_t generation() const override { return parent_->generation(); }
  const std::vector<int>& members() const { return members_; }

  Work AllReduce(Buffer input, Buffer output, ReduceOp op, const CollectiveOptions& opts) override;
  Work ReduceScatter(Buffer input, Buffer output, ReduceOp op,
                     const CollectiveOptions& opts) override;
  Work AllGather(Buffer input, Buffer output, const CollectiveOptions& opts) override;
  Work Broadcast(Buffer buffer, int root, const CollectiveOptions& opts) override;
  Work Send(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& opts) override;
  Work Recv(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& opts) override;
  Work Barrier(const CollectiveOptions& opts) override;
  std::vector<Work> PostPointToPoint(const std::vector<PointToPoint>& ops,
                                     const CollectiveOptions& opts) override;
  void Abort(absl::Status status) override { parent_->Abort(std::move(status)); }
  CommStats stats() const override { return parent_->stats(); }
  std::string DebugString() const override;
  bool PeersShareHost() const override { return parent_->PeersShareHost(); }
  bool MatchesByTag() const override { return parent_->MatchesByTag(); }

 private:
  SubCommunicator(Communicator* parent, std::vector<int> members, int rank)
      : parent_(parent), members_(std::move(members)), rank_(rank) {}
  // Every member's `bytes` of `in` into `out` (size() blocks, rank order) through the parent.
  absl::Status GatherAll(const void* in, size_t bytes, void* out, const CollectiveOptions& opts);

  Communicator* parent_;
  std::vector<int> members_;
  int rank_;
  uint32_t seq_ = 0;
};

}  // namespace troupe::collectives

#endif  // TROUPE_COLLECTIVES_SUB_COMMUNICATOR_H_
