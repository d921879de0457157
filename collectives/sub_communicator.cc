#include "troupe/collectives/sub_communicator.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "reduce.h"

namespace troupe::collectives {
namespace {

absl::Status WaitEach(const std::vector<Work>& works) {
  absl::Status first;
  for (const Work& w : works) {
    absl::Status s = w.Wait();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

absl::Status NotF32(const char* op) {
  return absl::InvalidArgumentError(
      absl::StrCat("SubCommunicator::", op, ": only float32 buffers are reduced"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SubCommunicator>> SubCommunicator::Create(Communicator* parent,
                                                                         std::vector<int> members) {
  const auto me = std::find(members.begin(), members.end(), parent->rank());
  bool increasing = true;
  for (size_t i = 0; i < members.size(); ++i) {
    increasing = increasing && members[i] >= 0 && members[i] < parent->size() &&
                 (i == 0 || members[i] > members[i - 1]);
  }
  if (!increasing || me == members.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SubCommunicator: members expected increasing ranks of a group of ", parent->size(),
        " including this rank (", parent->rank(), "), got [", absl::StrJoin(members, ", "), "]"));
  }
  const int rank = static_cast<int>(me - members.begin());
  return std::unique_ptr<SubCommunicator>(new SubCommunicator(parent, std::move(members), rank));
}

std::vector<Work> SubCommunicator::PostPointToPoint(const std::vector<PointToPoint>& ops,
                                                    const CollectiveOptions& opts) {
  std::vector<PointToPoint> translated = ops;
  for (PointToPoint& op : translated) {
    if (op.peer < 0 || op.peer >= size()) {
      return std::vector<Work>(
          ops.size(), Work::Done(absl::InvalidArgumentError(
                          absl::StrCat("SubCommunicator: no peer ", op.peer, " of ", size()))));
    }
    op.peer = members_[op.peer];
  }
  return parent_->PostPointToPoint(translated, opts);
}

Work SubCommunicator::Send(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& opts) {
  return PostPointToPoint({{PointToPoint::Kind::kSend, buffer, peer, tag}}, opts)[0];
}

Work SubCommunicator::Recv(Buffer buffer, int peer, uint32_t tag, const CollectiveOptions& opts) {
  return PostPointToPoint({{PointToPoint::Kind::kRecv, buffer, peer, tag}}, opts)[0];
}

absl::Status SubCommunicator::GatherAll(const void* in, size_t bytes, void* out,
                                        const CollectiveOptions& opts) {
  const uint32_t tag = kSubTagBase | (seq_++ & 0x07ffffffu);
  // Blocks travel as whole floats (the transport's unit): padded, then copied out.
  const size_t words = (bytes + sizeof(float) - 1) / sizeof(float);
  std::vector<float> blocks(words * size(), 0.0f);
  std::memcpy(blocks.data() + rank_ * words, in, bytes);
  std::vector<PointToPoint> ops;
  for (int j = 0; j < size() && words > 0; ++j) {
    if (j == rank_) continue;
    ops.push_back(
        {PointToPoint::Kind::kSend, Buffer::F32(blocks.data() + rank_ * words, words), j, tag});
    ops.push_back(
        {PointToPoint::Kind::kRecv, Buffer::F32(blocks.data() + j * words, words), j, tag});
  }
  absl::Status s = WaitEach(PostPointToPoint(ops, opts));
  if (!s.ok()) return s;
  for (int j = 0; j < size(); ++j) {
    std::memcpy(static_cast<uint8_t*>(out) + j * bytes, blocks.data() + j * words, bytes);
  }
  return absl::OkStatus();
}

Work SubCommunicator::AllGather(Buffer input, Buffer output, const CollectiveOptions& opts) {
  if (output.bytes() != input.bytes() * size()) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat("SubCommunicator::AllGather: output expected ", size(), " × the input's ",
                     input.bytes(), " bytes, got ", output.bytes())));
  }
  return Work::Done(GatherAll(input.data, input.bytes(), output.data, opts));
}

Work SubCommunicator::AllReduce(Buffer input, Buffer output, ReduceOp op,
                                const CollectiveOptions& opts) {
  if (input.dtype != DType::kF32 || output.dtype != DType::kF32)
    return Work::Done(NotF32("AllReduce"));
  if (input.count != output.count) {
    return Work::Done(absl::InvalidArgumentError("SubCommunicator::AllReduce: counts differ"));
  }
  const size_t n = input.count;
  std::vector<float> all(n * size());
  if (absl::Status s = GatherAll(input.data, n * sizeof(float), all.data(), opts); !s.ok()) {
    return Work::Done(s);
  }
  auto* out = static_cast<float*>(output.data);
  std::copy(all.begin(), all.begin() + n, out);
  for (int j = 1; j < size(); ++j) ReduceInto(out, all.data() + j * n, n, op);
  if (op == ReduceOp::kAvg) DivideBy(out, n, static_cast<float>(size()));
  return Work::Done(absl::OkStatus());
}

Work SubCommunicator::ReduceScatter(Buffer input, Buffer output, ReduceOp op,
                                    const CollectiveOptions& opts) {
  if (input.dtype != DType::kF32 || output.dtype != DType::kF32) {
    return Work::Done(NotF32("ReduceScatter"));
  }
  if (input.count != output.count * size()) {
    return Work::Done(absl::InvalidArgumentError(
        "SubCommunicator::ReduceScatter: input expected size() × the output's count"));
  }
  // Everyone's input reduced in rank order, my block kept: all of it moves (see the header).
  std::vector<float> sum(input.count);
  Work w = AllReduce(input, Buffer::F32(sum), op, opts);
  if (absl::Status s = w.Wait(); !s.ok()) return Work::Done(s);
  std::copy(sum.begin() + rank_ * output.count, sum.begin() + (rank_ + 1) * output.count,
            static_cast<float*>(output.data));
  return Work::Done(absl::OkStatus());
}

Work SubCommunicator::Broadcast(Buffer buffer, int root, const CollectiveOptions& opts) {
  if (root < 0 || root >= size()) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat("SubCommunicator::Broadcast: no root ", root, " of ", size())));
  }
  const uint32_t tag = kSubTagBase | (seq_++ & 0x07ffffffu);
  std::vector<PointToPoint> ops;
  if (rank_ == root) {
    for (int j = 0; j < size(); ++j) {
      if (j != root) ops.push_back({PointToPoint::Kind::kSend, buffer, j, tag});
    }
  } else {
    ops.push_back({PointToPoint::Kind::kRecv, buffer, root, tag});
  }
  return Work::Done(WaitEach(PostPointToPoint(ops, opts)));
}

Work SubCommunicator::Barrier(const CollectiveOptions& opts) {
  uint8_t mine = 1;
  std::vector<uint8_t> all(size());
  return Work::Done(GatherAll(&mine, 1, all.data(), opts));
}

std::string SubCommunicator::DebugString() const {
  return absl::StrCat("ranks [", absl::StrJoin(members_, " "), "] of ", parent_->DebugString());
}

}  // namespace troupe::collectives
