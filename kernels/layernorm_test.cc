#include "troupe/kernels/layernorm.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

TEST(LayerNormTest, ForwardNormalisesRows) {
  const int64_t n = 5, c = 17;
  auto inp = RandomVector(n * c, 1, 3.0);
  std::vector<double> w(c, 1.0), b(c, 0.0), out(n * c), mean(n), rstd(n);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), n, c);
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < c; ++j) m += out[i * c + j];
    m /= c;
    for (int64_t j = 0; j < c; ++j) v += (out[i * c + j] - m) * (out[i * c + j] - m);
    EXPECT_NEAR(m, 0, 1e-12);
    EXPECT_NEAR(v / c, 1.0, 1e-4);  // eps = 1e-5 shrinks the variance slightly
  }
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 7, c = 13;
  auto inp = RandomVector(n * c, 2), w = RandomVector(c, 3), b = RandomVector(c, 4);
  const auto probe = RandomVector(n * c, 5);
  std::vector<double> out(n * c), mean(n), rstd(n);
  auto objective = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), n, c);
    return testing::Dot(out, probe);
  };
  objective();
  std::vector<double> dinp(n * c, 0), dw(c, 0), db(c, 0);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), probe.data(), inp.data(), w.data(),
                    mean.data(), rstd.data(), n, c);
  testing::ExpectGradientMatchesFd("dinp", inp, dinp, objective);
  testing::ExpectGradientMatchesFd("dweight", w, dw, objective);
  testing::ExpectGradientMatchesFd("dbias", b, db, objective);
}

TEST(LayerNormTest, FloatMatchesDoubleAndIsBitIdenticalAcrossThreads) {
  const int64_t n = 203, c = 97;
  auto inp = RandomVector(n * c, 6), w = RandomVector(c, 7), b = RandomVector(c, 8),
       dout = RandomVector(n * c, 9);
  std::vector<double> out_d(n * c), mean_d(n), rstd_d(n), dinp_d(n * c, 0), dw_d(c, 0), db_d(c, 0);
  LayerNormForward(out_d.data(), mean_d.data(), rstd_d.data(), inp.data(), w.data(), b.data(), n,
                   c);
  LayerNormBackward(dinp_d.data(), dw_d.data(), db_d.data(), dout.data(), inp.data(), w.data(),
                    mean_d.data(), rstd_d.data(), n, c);
  auto inp_f = testing::ToFloat(inp), w_f = testing::ToFloat(w), b_f = testing::ToFloat(b),
       dout_f = testing::ToFloat(dout);
  testing::ExpectSameBitsAtThreadCounts([&] {
    std::vector<float> out(n * c), mean(n), rstd(n), dinp(n * c, 0), dw(c, 0), db(c, 0);
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp_f.data(), w_f.data(), b_f.data(), n,
                     c);
    LayerNormBackward(dinp.data(), dw.data(), db.data(), dout_f.data(), inp_f.data(), w_f.data(),
                      mean.data(), rstd.data(), n, c);
    EXPECT_LT(testing::RelErr(out, out_d), 1e-5);
    EXPECT_LT(testing::RelErr(dinp, dinp_d), 1e-5);
    EXPECT_LT(testing::RelErr(dw, dw_d), 1e-5);
    EXPECT_LT(testing::RelErr(db, db_d), 1e-5);
    std::vector<float> all;
    for (auto* v : {&out, &mean, &rstd, &dinp, &dw, &db}) testing::Append(all, *v);
    return all;
  });
}

}  // namespace
}  // namespace troupe::kernels
