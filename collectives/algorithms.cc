#include "algorithms.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mailbox.h"
#include "reduce.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"

namespace troupe::collectives {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Posts one send and one receive and waits for both.
absl::Status SendRecv(const OpContext& c, int to, const void* sbuf, size_t sbytes, int from,
                      void* rbuf, size_t rbytes, uint64_t tag) {
  ReqId reqs[2];
  int k = 0;
  if (sbytes > 0) {
    TROUPE_ASSIGN_OR_RETURN(auto s, c.t->PostSend(to, tag, sbuf, sbytes));
    reqs[k++] = s;
  }
  if (rbytes > 0) {
    auto r = c.t->PostRecv(from, tag, rbuf, rbytes);
    if (!r.ok()) {
      if (k > 0) (void)c.t->WaitAll(absl::MakeSpan(reqs, k), base::MonotonicNow());
      return r.status();
    }
    reqs[k++] = *r;
  }
  return c.t->WaitAll(absl::MakeSpan(reqs, k), c.deadline);
}

}  // namespace

absl::Status SingleCopyAllReduce(const OpContext& c, float* w, const std::vector<size_t>& off,
                                 ReduceOp op, bool gather, uint32_t phase, SingleCopyVote* vote) {
  const int n = c.t->size(), r = c.t->rank();
  if (n == 1) return absl::OkStatus();
  // Every rank's buffer address (and, measured, its estimates), gathered; then the two barriers
  // below, on phases of their own.
  struct Entry {
    uint64_t addr;
    double staged, single_copy;
  };
  std::vector<Entry> entry(n);
  entry[r] = {reinterpret_cast<uintptr_t>(w), vote ? vote->mine.staged : 0,
              vote ? vote->mine.single_copy : 0};
  std::vector<size_t> entry_off(n + 1);
  for (int j = 0; j <= n; ++j) entry_off[j] = j * sizeof(Entry);
  TROUPE_RETURN_IF_ERROR(
      RingAllGather(c, reinterpret_cast<uint8_t*>(entry.data()), entry_off, phase));
  const absl::Time start = base::MonotonicNow();
  if (vote != nullptr) {
    vote->all.resize(n);
    for (int j = 0; j < n; ++j) vote->all[j] = {entry[j].staged, entry[j].single_copy};
  }
  // Reduce segment r chunk by chunk; a chunk read into scratch is still in cache when added.
  constexpr size_t kChunk = 64 * 1024;  // floats
  float* tmp = static_cast<float*>(c.t->Scratch(0, kChunk * sizeof(float)));
  for (size_t b = off[r]; b < off[r + 1]; b += kChunk) {
    const size_t len = std::min(kChunk, off[r + 1] - b);
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      TROUPE_RETURN_IF_ERROR(
          c.t->ReadPeer(j, entry[j].addr + b * sizeof(float), tmp, len * sizeof(float)));
      ReduceInto(w + b, tmp, len, op);
    }
  }
  if (gather) {
    // Every segment is reduced (and nobody reads unreduced data any more): fetch the others.
    TROUPE_RETURN_IF_ERROR(DisseminationBarrier(c, phase + 1));
    for (int j = 0; j < n; ++j) {
      if (j == r || off[j + 1] == off[j]) continue;
      TROUPE_RETURN_IF_ERROR(c.t->ReadPeer(j, entry[j].addr + off[j] * sizeof(float), w + off[j],
                                           (off[j + 1] - off[j]) * sizeof(float)));
    }
  }
  // Nobody returns (and lets its caller reuse the buffer) while another rank may still read it.
  TROUPE_RETURN_IF_ERROR(DisseminationBarrier(c, phase + 2));
  if (vote != nullptr) vote->seconds = absl::ToDoubleSeconds(base::MonotonicNow() - start);
  return absl::OkStatus();
}

absl::Status StagedAllReduce(const OpContext& c, float* w, const std::vector<size_t>& off,
                             ReduceOp op, bool gather, StagingCopy::Choice mode) {
  const int n = c.t->size(), r = c.t->rank();
  Mailboxes& m = *c.t->HostShared();
  // Floats per segment per step: a slot holds one piece of every segment, 64-byte aligned.
  const size_t piece = Mailboxes::kStageBytes / sizeof(float) / n / 16 * 16;
  size_t max_seg = 0;
  for (int q = 0; q < n; ++q) max_seg = std::max(max_seg, off[q + 1] - off[q]);
  auto len = [&](int q, size_t step) {
    const size_t seg = off[q + 1] - off[q];
    return step * piece >= seg ? 0 : std::min(piece, seg - step * piece);
  };
  // Waits until every rank's counter `k` reached `v`.
  auto await_all = [&](Mailboxes::Counter k, uint64_t v) {
    return c.t->WaitUntil(
        [&] {
          for (int q = 0; q < n; ++q) {
            if (m.counter(q, k).load(std::memory_order_acquire) < v) return false;
          }
          return true;
        },
        c.deadline);
  };
  // Timed from the first hand-off, when every rank has arrived (not from this rank's arrival).
  const size_t bytes = off.back() * sizeof(float);
  const bool streamed = mode.streamed;
  absl::Time start = absl::InfiniteFuture();
  size_t received = 0;
  for (size_t step = 0; step * piece < max_seg; ++step) {
    // g numbers the chunks this group staged since it was created (every rank runs the same
    // operations); slots go round.
    const uint64_t g = m.counter(r, Mailboxes::kStaged).load(std::memory_order_relaxed);
    const int slot = static_cast<int>(g % Mailboxes::kStageSlots);
    if (g >= Mailboxes::kStageSlots) {  // every rank is done with the slot's previous chunk
      TROUPE_RETURN_IF_ERROR(await_all(Mailboxes::kCopiedOut, g - Mailboxes::kStageSlots + 1));
    }
    // The other ranks' pieces go into the slot; this rank's own piece stays in w.
    float* mine = reinterpret_cast<float*>(m.stage(r, slot));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      StagingCopy::Copy(streamed, mine + q * piece, w + off[q] + step * piece,
                        len(q, step) * sizeof(float));
    }
    m.counter(r, Mailboxes::kStaged).store(g + 1, std::memory_order_release);
    TROUPE_RETURN_IF_ERROR(await_all(Mailboxes::kStaged, g + 1));
    if (step == 0 && mode.measure) start = base::MonotonicNow();
    // This rank's piece, reduced in w; with `gather` published in the slot's own piece, which
    // the others read only after kReduced.
    float* acc = w + off[r] + step * piece;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      ReduceInto(acc, reinterpret_cast<const float*>(m.stage(q, slot)) + r * piece, len(r, step),
                 op);
      received += len(r, step) * sizeof(float);
    }
    if (gather) StagingCopy::Copy(streamed, mine + r * piece, acc, len(r, step) * sizeof(float));
    m.counter(r, Mailboxes::kReduced).store(g + 1, std::memory_order_release);
    if (gather) {
      TROUPE_RETURN_IF_ERROR(await_all(Mailboxes::kReduced, g + 1));
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        VectorCopy(w + off[q] + step * piece,
                   reinterpret_cast<const float*>(m.stage(q, slot)) + q * piece,
                   len(q, step) * sizeof(float));
        received += len(q, step) * sizeof(float);
      }
    }
    m.counter(r, Mailboxes::kCopiedOut).store(g + 1, std::memory_order_release);
  }
  if (mode.measure && start != absl::InfiniteFuture()) {
    m.staging_copy().Record(bytes, gather, mode,
                            absl::ToDoubleSeconds(base::MonotonicNow() - start));
  }
  c.t->CountRecv(received);
  return absl::OkStatus();
}

bool PreferSingleCopy(size_t segment_bytes, size_t l2_bytes) {
  return l2_bytes > 0 && segment_bytes >= l2_bytes && segment_bytes <= 4 * l2_bytes;
}

size_t L2Bytes() {
  static const size_t bytes = [] {
    std::ifstream level("/sys/devices/system/cpu/cpu0/cache/index2/level");
    std::ifstream size("/sys/devices/system/cpu/cpu0/cache/index2/size");
    int l = 0;
    size_t n = 0;
    char unit = 0;
    if (!(level >> l) || l != 2 || !(size >> n)) return size_t{0};
    size >> unit;
    return unit == 'K' ? n << 10 : unit == 'M' ? n << 20 : size_t{0};
  }();
  return bytes;
}

uint64_t CanonicalMid(uint64_t lo, uint64_t hi) {
  uint64_t len = hi - lo, p = 1;
  while (p * 2 < len) p *= 2;
  return lo + p;
}

std::vector<size_t> EvenSegments(size_t count, int n) {
  std::vector<size_t> off(n + 1);
  for (int i = 0; i <= n; ++i) off[i] = count * i / n;
  return off;
}

absl::Status RingReduceScatter(const OpContext& c, float* w, const std::vector<size_t>& off,
                               ReduceOp op, uint32_t phase) {
  const int n = c.t->size(), r = c.t->rank();
  if (n == 1) return absl::OkStatus();
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  size_t max_seg = 0;
  for (int i = 0; i < n; ++i) max_seg = std::max(max_seg, off[i + 1] - off[i]);
  size_t piece = std::max<size_t>(c.piece_bytes / 4, (max_seg + 4095) / 4096);
  piece = std::max<size_t>(piece, 1);
  float* tmp = static_cast<float*>(c.t->Scratch(0, 2 * piece * sizeof(float)));
  std::vector<ReqId> sends;
  for (int s = 0; s < n - 1; ++s) {
    const int ss = Mod(r - s - 1, n), rs = Mod(r - s - 2, n);
    const size_t slen = off[ss + 1] - off[ss], rlen = off[rs + 1] - off[rs];
    sends.clear();
    for (size_t p = 0; p * piece < slen; ++p) {
      size_t len = std::min(piece, slen - p * piece);
      TROUPE_ASSIGN_OR_RETURN(
          auto id, c.t->PostSend(right, c.Tag(phase, s, p), w + off[ss] + p * piece, len * 4));
      sends.push_back(id);
    }
    const size_t npieces = (rlen + piece - 1) / piece;
    ReqId pending = 0;
    auto post = [&](size_t p) -> absl::Status {
      size_t len = std::min(piece, rlen - p * piece);
      TROUPE_ASSIGN_OR_RETURN(
          auto id, c.t->PostRecv(left, c.Tag(phase, s, p), tmp + (p % 2) * piece, len * 4));
      pending = id;
      return absl::OkStatus();
    };
    if (npieces > 0) {
      TROUPE_RETURN_IF_ERROR(post(0));
    }
    for (size_t p = 0; p < npieces; ++p) {
      ReqId cur = pending;
      if (p + 1 < npieces) {
        TROUPE_RETURN_IF_ERROR(post(p + 1));
      }
      TROUPE_RETURN_IF_ERROR(c.t->WaitAll({&cur, 1}, c.deadline));
      size_t len = std::min(piece, rlen - p * piece);
      ReduceInto(w + off[rs] + p * piece, tmp + (p % 2) * piece, len, op);
    }
    TROUPE_RETURN_IF_ERROR(c.t->WaitAll(sends, c.deadline));
  }
  return absl::OkStatus();
}

absl::Status RingAllGather(const OpContext& c, uint8_t* w, const std::vector<size_t>& off,
                           uint32_t phase) {
  const int n = c.t->size(), r = c.t->rank();
  for (int s = 0; s < n - 1; ++s) {
    const int ss = Mod(r - s, n), rs = Mod(r - s - 1, n);
    auto st = SendRecv(c, Mod(r + 1, n), w + off[ss], off[ss + 1] - off[ss], Mod(r - 1, n),
                       w + off[rs], off[rs + 1] - off[rs], c.Tag(phase, s, 0));
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// Posts DirectAllGather's sends and receives into *reqs. A request that cannot be posted ends
// those already posted at once.
absl::Status PostDirectAllGather(const OpContext& c, uint8_t* w, const std::vector<size_t>& off,
                                 uint32_t phase, std::vector<ReqId>* reqs) {
  const int n = c.t->size(), r = c.t->rank();
  auto post = [&](absl::StatusOr<ReqId> id) {
    if (id.ok()) {
      reqs->push_back(*id);
    } else if (!reqs->empty()) {
      (void)c.t->WaitAll(*reqs, base::MonotonicNow());
    }
    return id.status();
  };
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    if (off[q + 1] > off[q]) {
      TROUPE_RETURN_IF_ERROR(
          post(c.t->PostRecv(q, c.Tag(phase, 0, 0), w + off[q], off[q + 1] - off[q])));
    }
    if (off[r + 1] > off[r]) {
      TROUPE_RETURN_IF_ERROR(
          post(c.t->PostSend(q, c.Tag(phase, 0, 0), w + off[r], off[r + 1] - off[r])));
    }
  }
  return absl::OkStatus();
}

absl::Status DirectAllGather(const OpContext& c, uint8_t* w, const std::vector<size_t>& off,
                             uint32_t phase) {
  std::vector<ReqId> reqs;
  TROUPE_RETURN_IF_ERROR(PostDirectAllGather(c, w, off, phase, &reqs));
  return c.t->WaitAll(reqs, c.deadline);
}

absl::Status AllGatherSegments(const OpContext& c, uint8_t* w, const std::vector<size_t>& off,
                               uint32_t phase) {
  return c.t->size() <= kDirectAllGatherRanks ? DirectAllGather(c, w, off, phase)
                                              : RingAllGather(c, w, off, phase);
}

absl::Status RecursiveDoublingAllReduce(const OpContext& c, float* w, size_t count, ReduceOp op,
                                        uint32_t phase) {
  const int n = c.t->size(), r = c.t->rank();
  if (n == 1 || count == 0) return absl::OkStatus();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  const size_t bytes = count * sizeof(float);
  float* tmp = static_cast<float*>(c.t->Scratch(0, bytes));
  int vr;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      TROUPE_RETURN_IF_ERROR(SendRecv(c, r + 1, w, bytes, -1, nullptr, 0, c.Tag(phase, 0, 0)));
      vr = -1;
    } else {
      TROUPE_RETURN_IF_ERROR(SendRecv(c, -1, nullptr, 0, r - 1, tmp, bytes, c.Tag(phase, 0, 0)));
      Combine(w, tmp, w, count, op);
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    int step = 1;
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      const int pv = vr ^ mask;
      const int peer = pv < rem ? pv * 2 + 1 : pv + rem;
      auto st = SendRecv(c, peer, w, bytes, peer, tmp, bytes, c.Tag(phase, step, 0));
      if (!st.ok()) return st;
      if (peer < r) {
        Combine(w, tmp, w, count, op);
      } else {
        Combine(w, w, tmp, count, op);
      }
    }
  }
  if (r < 2 * rem) {
    const uint64_t tag = c.Tag(phase, 255, 0);
    if (r % 2 == 0) return SendRecv(c, -1, nullptr, 0, r + 1, w, bytes, tag);
    return SendRecv(c, r - 1, w, bytes, -1, nullptr, 0, tag);
  }
  return absl::OkStatus();
}

absl::Status OrderedReduceScatter(const OpContext& c, const float* w,
                                  const std::vector<size_t>& off, uint64_t lo, uint64_t hi,
                                  ReduceOp op, float* out, uint64_t* contributions,
                                  uint32_t phase) {
  const int n = c.t->size(), r = c.t->rank();
  // 1. Everyone learns everyone's interval: in a small group at the same time as step 2 (one
  // message latency for both), else by the ring before it.
  std::vector<uint64_t> iv(2 * n);
  iv[2 * r] = lo;
  iv[2 * r + 1] = hi;
  std::vector<size_t> ioff(n + 1);
  for (int i = 0; i <= n; ++i) ioff[i] = i * 2 * sizeof(uint64_t);
  uint8_t* ivb = reinterpret_cast<uint8_t*>(iv.data());
  std::vector<ReqId> reqs;
  TROUPE_RETURN_IF_ERROR(n <= kDirectAllGatherRanks
                             ? PostDirectAllGather(c, ivb, ioff, phase, &reqs)
                             : RingAllGather(c, ivb, ioff, phase));
  // 2. Every rank sends its partial of block b to owner b.
  const size_t blen = off[r + 1] - off[r];
  float* recv = static_cast<float*>(c.t->Scratch(1, std::max<size_t>(1, n * blen) * 4));
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    if (blen > 0) {
      TROUPE_ASSIGN_OR_RETURN(auto id,
                              c.t->PostRecv(q, c.Tag(phase + 1, 0, 0), recv + q * blen, blen * 4));
      reqs.push_back(id);
    }
    const size_t qlen = off[q + 1] - off[q];
    if (qlen > 0) {
      TROUPE_ASSIGN_OR_RETURN(auto id,
                              c.t->PostSend(q, c.Tag(phase + 1, 0, 0), w + off[q], qlen * 4));
      reqs.push_back(id);
    }
  }
  TROUPE_RETURN_IF_ERROR(c.t->WaitAll(reqs, c.deadline));
  std::vector<std::pair<uint64_t, uint64_t>> intervals(n);
  for (int i = 0; i < n; ++i) intervals[i] = {iv[2 * i], iv[2 * i + 1]};
  TROUPE_ASSIGN_OR_RETURN(CombinePlan plan, PlanCanonicalCombine(intervals));
  *contributions = plan.total;
  // 3. Combine the partials in canonical tree order: temporaries (~one per tree level) in scratch,
  // the root straight into `out` (which may be this rank's own partial: Combine is elementwise).
  float* inner = static_cast<float*>(c.t->Scratch(4, std::max<size_t>(1, plan.inner * blen) * 4));
  auto at = [&](const CombineOperand& o) -> float* {
    switch (o.kind) {
      case CombineOperand::Kind::kPartial:
        return o.index == r ? const_cast<float*>(w + off[r]) : recv + o.index * blen;
      case CombineOperand::Kind::kInner:
        return inner + o.index * blen;
      case CombineOperand::Kind::kOutput:
        return out;
      case CombineOperand::Kind::kNone:
        break;
    }
    return nullptr;
  };
  for (const CombineStep& s : plan.steps) {
    if (s.y.kind == CombineOperand::Kind::kNone) {
      if (at(s.dst) != at(s.x)) std::memmove(at(s.dst), at(s.x), blen * 4);
    } else {
      Combine(at(s.dst), at(s.x), at(s.y), blen, op);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CombinePlan> PlanCanonicalCombine(
    const std::vector<std::pair<uint64_t, uint64_t>>& intervals_by_rank) {
  using Kind = CombineOperand::Kind;
  const int n = static_cast<int>(intervals_by_rank.size());
  CombinePlan plan;
  for (const auto& [lo, hi] : intervals_by_rank) plan.total = std::max(plan.total, hi);
  if (plan.total == 0)
    return absl::InvalidArgumentError("ordered reduce-scatter: no contributions");
  const uint64_t total = plan.total;
  std::map<std::pair<uint64_t, uint64_t>, int> holder;  // the lowest rank holding each interval
  for (int q = 0; q < n; ++q) holder.emplace(intervals_by_rank[q], q);
  std::vector<bool> used(n, false);
  std::vector<int> free_inner;  // temporaries whose value a later step no longer reads
  absl::Status bad;
  // The operand that holds T(a, b) once plan.steps ran; kNone (and `bad`) when none can.
  auto node = [&](auto& self, uint64_t a, uint64_t b) -> CombineOperand {
    if (auto it = holder.find({a, b}); it != holder.end()) {
      used[it->second] = true;
      return {Kind::kPartial, it->second};
    }
    if (b - a <= 1) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "ordered reduce-scatter: no rank holds contribution [", a, ", ", b,
          "); intervals must be disjoint power-of-two-aligned subtrees covering [0, ", total, ")"));
      return {};
    }
    const uint64_t mid = CanonicalMid(a, b);
    const CombineOperand x = self(self, a, mid);
    if (x.kind == Kind::kNone) return {};
    const CombineOperand y = self(self, mid, b);
    if (y.kind == Kind::kNone) return {};
    // A temporary is reused once read: x's in place (x + y elementwise into x), else a freed
    // one. Depth first, that keeps at most one per level of the tree live: ~log2(W) temporaries
    // of a block each, where one per inner node (W − 2) took as much memory as the whole model.
    CombineOperand dst{Kind::kOutput, 0};
    if (!(a == 0 && b == total)) {
      if (x.kind == Kind::kInner) {
        dst = x;
      } else if (!free_inner.empty()) {
        dst = {Kind::kInner, free_inner.back()};
        free_inner.pop_back();
      } else {
        dst = {Kind::kInner, plan.inner++};
      }
    }
    for (const CombineOperand& o : {x, y}) {
      if (o.kind == Kind::kInner && !(o == dst)) free_inner.push_back(o.index);
    }
    plan.steps.push_back({dst, x, y});
    return dst;
  };
  const CombineOperand root = node(node, 0, total);
  if (root.kind == Kind::kNone) return bad;
  if (root.kind == Kind::kPartial) plan.steps.push_back({{Kind::kOutput, 0}, root, {}});
  for (int q = 0; q < n; ++q) {
    if (used[q]) continue;
    const auto [lo, hi] = intervals_by_rank[q];
    return absl::InvalidArgumentError(absl::StrCat(
        "ordered reduce-scatter: rank ", q, "'s contribution [", lo, ", ", hi,
        ") is not used (empty, or overlapping another rank's); intervals must be disjoint "
        "power-of-two-aligned subtrees covering [0, ",
        total, ")"));
  }
  return plan;
}

absl::Status BinomialBroadcast(const OpContext& c, uint8_t* buf, size_t bytes, int root,
                               uint32_t phase) {
  const int n = c.t->size(), r = c.t->rank();
  const int vr = Mod(r - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      auto st =
          SendRecv(c, -1, nullptr, 0, Mod(vr - mask + root, n), buf, bytes, c.Tag(phase, 0, 0));
      if (!st.ok()) return st;
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  std::vector<ReqId> reqs;
  for (; mask > 0; mask >>= 1) {
    if (vr + mask < n && bytes > 0) {
      TROUPE_ASSIGN_OR_RETURN(
          auto id, c.t->PostSend(Mod(vr + mask + root, n), c.Tag(phase, 0, 0), buf, bytes));
      reqs.push_back(id);
    }
  }
  return c.t->WaitAll(reqs, c.deadline);
}

absl::Status ScatterAllGatherBroadcast(const OpContext& c, uint8_t* buf, size_t bytes, int root,
                                       uint32_t phase) {
  const int n = c.t->size(), r = c.t->rank();
  std::vector<size_t> off = EvenSegments(bytes, n);
  std::vector<ReqId> reqs;
  if (r == root) {
    for (int q = 0; q < n; ++q) {
      if (q == r || off[q + 1] == off[q]) continue;
      TROUPE_ASSIGN_OR_RETURN(
          auto id, c.t->PostSend(q, c.Tag(phase, 0, 0), buf + off[q], off[q + 1] - off[q]));
      reqs.push_back(id);
    }
  } else if (off[r + 1] > off[r]) {
    TROUPE_ASSIGN_OR_RETURN(
        auto id, c.t->PostRecv(root, c.Tag(phase, 0, 0), buf + off[r], off[r + 1] - off[r]));
    reqs.push_back(id);
  }
  TROUPE_RETURN_IF_ERROR(c.t->WaitAll(reqs, c.deadline));
  return RingAllGather(c, buf, off, phase + 1);
}

absl::Status DisseminationBarrier(const OpContext& c, uint32_t phase) {
  const int n = c.t->size(), r = c.t->rank();
  uint8_t out = 1, in = 0;
  int step = 0;
  for (int k = 1; k < n; k <<= 1, ++step) {
    auto st = SendRecv(c, Mod(r + k, n), &out, 1, Mod(r - k, n), &in, 1, c.Tag(phase, step, 0));
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace troupe::collectives
