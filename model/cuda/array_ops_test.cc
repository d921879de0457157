// The CUDA ArrayOps' device code (array_ops.cuh) through the SIMT layer in the three schedules,
// bit for bit against what the elastic trainer runs on the host: HostArrayOps' Add and Fill,
// model::RangeChunkSquareSums and model::AdamWUpdateRange, on awkward shapes.
#include "array_ops.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bits_test_util.h"
#include "cuda_test_util.h"
#include "test_util.h"
#include "troupe/kernels/adamw.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/array_ops.h"
#include "troupe/model/config.h"
#include "troupe/model/optimizer.h"

namespace troupe::model::cuda {
namespace {

using kernels::kNormChunk;
using kernels::cuda::testing::ExpectSameBits;
using kernels::cuda::testing::SpreadFloatsWithZeros;
using kernels::testing::RandomVector;

class ArrayOpsCudaTest : public testing::ScheduledTest {};
TROUPE_INSTANTIATE_SCHEDULES(ArrayOpsCudaTest);

const int64_t kSizes[] = {1, 31, 33, 255, 257, 1000};
const float kGuard = 12345.0f;  // past the end of every output: must stay

TEST_P(ArrayOpsCudaTest, AddMatchesHostArrayOps) {
  model::ArrayOps& host = model::HostArrayOps();
  for (int64_t n : kSizes) {
    for (int block : {32, 96, 256}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " block=" << block);
      const std::vector<float> a = SpreadFloatsWithZeros(n, n), b = SpreadFloatsWithZeros(n, n + 7);
      // Into a third array, the operands untouched.
      std::vector<float> want(n, kGuard), got(n + 1, kGuard), x = a, y = b;
      ASSERT_TRUE(host.Add(want.data(), a.data(), b.data(), n).ok());
      ASSERT_TRUE(add(got.data(), x.data(), y.data(), n, nullptr, block).ok());
      EXPECT_EQ(got.back(), kGuard) << "wrote past n";
      got.pop_back();
      ExpectSameBits(got, want, "out");
      ExpectSameBits(x, a, "x");
      ExpectSameBits(y, b, "y");
      // In place into either operand: the same bits.
      std::vector<float> into_x = a, into_y = b;
      ASSERT_TRUE(add(into_x.data(), into_x.data(), b.data(), n, nullptr, block).ok());
      ExpectSameBits(into_x, want, "out == x");
      ASSERT_TRUE(add(into_y.data(), a.data(), into_y.data(), n, nullptr, block).ok());
      ExpectSameBits(into_y, want, "out == y");
      // x and y the same array: x + x.
      std::vector<float> twice = a, twice_host = a;
      ASSERT_TRUE(host.Add(twice_host.data(), twice_host.data(), twice_host.data(), n).ok());
      ASSERT_TRUE(add(twice.data(), twice.data(), twice.data(), n, nullptr, block).ok());
      ExpectSameBits(twice, twice_host, "x + x");
    }
  }
}

TEST_P(ArrayOpsCudaTest, FillMatchesHostArrayOps) {
  model::ArrayOps& host = model::HostArrayOps();
  for (int64_t n : kSizes) {
    for (float value : {-0.0f, 0.0f, 3.25f, std::numeric_limits<float>::denorm_min()}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " value=" << value);
      std::vector<float> want = SpreadFloatsWithZeros(n + 1, 3), got = want;
      ASSERT_TRUE(host.Fill(want.data(), n, value).ok());
      ASSERT_TRUE(fill(got.data(), n, value, nullptr, n == 1 ? 32 : 96).ok());
      ExpectSameBits(got, want, "dst");  // element n (not filled) included
    }
  }
}

TEST_P(ArrayOpsCudaTest, NothingHappensForEmptyArraysAndBadBlocksAreRefused) {
  std::vector<float> x = {1.0f, 2.0f};
  EXPECT_TRUE(add(x.data(), x.data(), x.data(), 0, nullptr).ok());
  EXPECT_TRUE(fill(x.data(), -3, 7.0f, nullptr).ok());
  EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(add(x.data(), x.data(), x.data(), 2, nullptr, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fill(x.data(), 2, 0.0f, nullptr, 2048).code(), absl::StatusCode::kInvalidArgument);
}

// --- RangeChunkSquareSums -----------------------------------------------------------------------

uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// A buffer of 3 full chunks and 77 elements; every chunk-aligned range of it, the empty ones
// included, has the host's chunk sums (count and bits), and nothing is written past them.
TEST_P(ArrayOpsCudaTest, RangeChunkSquareSumsMatchTheModel) {
  const int64_t c = kNormChunk, total = 3 * c + 77;
  const std::vector<float> x = SpreadFloatsWithZeros(total, 5);
  const std::pair<int64_t, int64_t> ranges[] = {
      {0, total}, {0, c}, {c, total}, {c, 2 * c}, {2 * c, total}, {3 * c, total}, {2 * c, 2 * c}};
  for (const auto& [begin, end] : ranges) {
    for (int block : {32, 256}) {
      SCOPED_TRACE(::testing::Message() << "[" << begin << ", " << end << ") block=" << block);
      absl::StatusOr<std::vector<double>> want =
          model::RangeChunkSquareSums(x.data() + begin, begin, end, total);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<int64_t> count = RangeChunkCount(begin, end, total);
      ASSERT_TRUE(count.ok()) << count.status();
      ASSERT_EQ(*count, static_cast<int64_t>(want->size()));
      std::vector<double> got(*count + 1, std::numeric_limits<double>::quiet_NaN());
      ASSERT_TRUE(
          range_chunk_square_sums(got.data(), x.data() + begin, begin, end, total, nullptr, block)
              .ok());
      for (int64_t i = 0; i < *count; ++i) {
        ASSERT_EQ(Bits(got[i]), Bits((*want)[i])) << "chunk " << i;
      }
      EXPECT_TRUE(std::isnan(got[*count])) << "wrote past the last chunk";
    }
  }
}

// Misaligned or out-of-order bounds: the model's error, word for word, and nothing written.
TEST_P(ArrayOpsCudaTest, RangeChunkSquareSumsRefusesWhatTheModelRefuses) {
  const int64_t c = kNormChunk, total = 2 * c + 5;
  const std::vector<float> x = SpreadFloatsWithZeros(total, 9);
  const std::pair<int64_t, int64_t> ranges[] = {{1, total},     {0, c + 1},        {-c, 0},
                                                {c, 0},         {0, total + 1},    {total, total},
                                                {c, total - 1}, {2 * c + 5, total}};
  for (const auto& [begin, end] : ranges) {
    SCOPED_TRACE(::testing::Message() << "[" << begin << ", " << end << ")");
    const absl::StatusOr<std::vector<double>> want =
        model::RangeChunkSquareSums(x.data(), begin, end, total);
    ASSERT_FALSE(want.ok());
    const absl::StatusOr<int64_t> count = RangeChunkCount(begin, end, total);
    EXPECT_EQ(count.status(), want.status());
    double out = -1.0;
    EXPECT_EQ(range_chunk_square_sums(&out, x.data(), begin, end, total, nullptr), want.status());
    EXPECT_EQ(out, -1.0);
  }
}

// --- AdamWUpdateRange ---------------------------------------------------------------------------

// Tensors of sizes that are not multiples of 32 or 256, decay on and off, one of a single element.
std::vector<model::ParamTensor> Tensors() {
  const int64_t sizes[] = {5, 300, 1, 64, 1000, 37};
  const bool decay[] = {true, false, false, true, true, false};
  std::vector<model::ParamTensor> tensors;
  int64_t offset = 0;
  for (int i = 0; i < 6; ++i) {
    model::ParamTensor t;
    t.name = "t" + std::to_string(i);
    t.offset = offset;
    t.size = sizes[i];
    t.shape = {sizes[i]};
    t.decay = decay[i];
    tensors.push_back(t);
    offset += sizes[i];
  }
  return tensors;
}

AdamWScalars Scalars(int64_t step) {
  model::AdamWConfig config;
  config.weight_decay = 0.1f;
  model::LrSchedule schedule;
  schedule.warmup_steps = 2;
  schedule.total_steps = 10;
  return model::StepScalars(config, schedule, step, /*grad_norm=*/2.7);  // clipped: 1/2.7
}

// Ranges that start and end inside tensors, cover one tensor exactly, one element, the whole
// buffer, nothing; two steps each (the second from non-zero moments), range-local storage; every
// output equal to the model's bits and nothing past the range touched.
TEST_P(ArrayOpsCudaTest, AdamWUpdateRangeMatchesTheModel) {
  const std::vector<model::ParamTensor> tensors = Tensors();
  const int64_t total = tensors.back().offset + tensors.back().size;
  const model::AdamWConfig config;
  const std::vector<float> params = SpreadFloatsWithZeros(total, 11),
                           grads = SpreadFloatsWithZeros(total, 12);
  const std::pair<int64_t, int64_t> ranges[] = {{0, total},   {3, 700},   {305, 306},  {306, 307},
                                                {700, total}, {369, 370}, {1000, 1000}};
  for (const auto& [begin, end] : ranges) {
    for (int block : {32, 256}) {
      SCOPED_TRACE(::testing::Message() << "[" << begin << ", " << end << ") block=" << block);
      const int64_t n = end - begin;
      // Range-local buffers with one guard element each.
      std::vector<float> p(params.begin() + begin, params.begin() + end);
      const std::vector<float> g(grads.begin() + begin, grads.begin() + end);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      p.push_back(kGuard), m.push_back(kGuard), v.push_back(kGuard);
      std::vector<float> hp = p, hm = m, hv = v, dp = p, dm = m, dv = v;
      for (int64_t step = 0; step < 2; ++step) {
        const AdamWScalars s = Scalars(step);
        model::AdamWUpdateRange(tensors, begin, end, hp.data(), g.data(), hm.data(), hv.data(),
                                config, s);
        ASSERT_TRUE(adamw_update_range(tensors, begin, end, dp.data(), g.data(), dm.data(),
                                       dv.data(), s, nullptr, block)
                        .ok());
      }
      ExpectSameBits(dp, hp, "params");
      ExpectSameBits(dm, hm, "m");
      ExpectSameBits(dv, hv, "v");
      EXPECT_EQ(dp.back(), kGuard);
      EXPECT_EQ(dm.back(), kGuard);
      EXPECT_EQ(dv.back(), kGuard);
    }
  }
}

// Out of place (the elastic trainer's staged update): the same bits as in place, the sources and
// the destinations' guards untouched, on the host and on the device.
TEST_P(ArrayOpsCudaTest, AdamWUpdateRangeOutOfPlaceGivesTheInPlaceBits) {
  const std::vector<model::ParamTensor> tensors = Tensors();
  const int64_t total = tensors.back().offset + tensors.back().size;
  const model::AdamWConfig config;
  const int64_t begin = 3, end = 700, n = end - begin;
  std::vector<float> p = SpreadFloatsWithZeros(total, 31), m = SpreadFloatsWithZeros(total, 33),
                     v = SpreadFloatsWithZeros(total, 34);
  for (float& x : v) x = x * x;  // a second moment is non-negative
  const std::vector<float> g = SpreadFloatsWithZeros(total, 32);
  const AdamWScalars s = Scalars(4);
  std::vector<float> ip = p, im = m, iv = v;
  model::AdamWUpdateRange(tensors, begin, end, ip.data() + begin, g.data() + begin,
                          im.data() + begin, iv.data() + begin, config, s);
  const std::vector<float> sp = p, sm = m, sv = v;
  const kernels::AdamWSources from{sp.data() + begin, sm.data() + begin, sv.data() + begin};
  for (const bool device : {false, true}) {
    SCOPED_TRACE(device ? "device" : "host");
    std::vector<float> op(n + 1, kGuard), om(n + 1, kGuard), ov(n + 1, kGuard);
    if (device) {
      ASSERT_TRUE(adamw_update_range(tensors, begin, end, op.data(), g.data() + begin, om.data(),
                                     ov.data(), s, nullptr, /*block=*/32, &from)
                      .ok());
    } else {
      model::AdamWUpdateRange(tensors, begin, end, op.data(), g.data() + begin, om.data(),
                              ov.data(), config, s, &from);
    }
    ExpectSameBits(std::vector<float>(op.begin(), op.end() - 1),
                   std::vector<float>(ip.begin() + begin, ip.begin() + end), "params");
    ExpectSameBits(std::vector<float>(om.begin(), om.end() - 1),
                   std::vector<float>(im.begin() + begin, im.begin() + end), "m");
    ExpectSameBits(std::vector<float>(ov.begin(), ov.end() - 1),
                   std::vector<float>(iv.begin() + begin, iv.begin() + end), "v");
    EXPECT_EQ(op.back(), kGuard);
    EXPECT_EQ(om.back(), kGuard);
    EXPECT_EQ(ov.back(), kGuard);
    ExpectSameBits(sp, p, "source params");
    ExpectSameBits(sm, m, "source m");
    ExpectSameBits(sv, v, "source v");
  }
}

// The split by tensor has teeth: one update of the whole buffer with weight decay everywhere
// gives other bits for the tensors without decay.
TEST_P(ArrayOpsCudaTest, AdamWUpdateRangeAppliesDecayPerTensor) {
  const std::vector<model::ParamTensor> tensors = Tensors();
  const int64_t total = tensors.back().offset + tensors.back().size;
  std::vector<float> p = SpreadFloatsWithZeros(total, 21), m(total, 0.0f), v(total, 0.0f);
  const std::vector<float> g = SpreadFloatsWithZeros(total, 22);
  std::vector<float> up = p, um = m, uv = v;
  const AdamWScalars s = Scalars(3);
  ASSERT_TRUE(
      adamw_update_range(tensors, 0, total, p.data(), g.data(), m.data(), v.data(), s, nullptr)
          .ok());
  ASSERT_TRUE(
      adamw_update<float>(up.data(), nullptr, g.data(), um.data(), uv.data(), total, s, nullptr)
          .ok());
  for (const model::ParamTensor& t : tensors) {
    int differing = 0;
    for (int64_t i = t.offset; i < t.offset + t.size; ++i) differing += p[i] != up[i];
    if (t.decay) {
      EXPECT_EQ(differing, 0) << t.name;
    } else {
      EXPECT_GT(differing, 0) << t.name;
    }
  }
}

}  // namespace
}  // namespace troupe::model::cuda
