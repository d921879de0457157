#include "troupe/kernels/matmul.h"

#include <gtest/gtest.h>

#include <limits>

#include "test_util.h"

namespace troupe::kernels {
namespace {

using testing::RandomVector;

TEST(MatmulTest, ForwardMatchesNaiveInDouble) {
  const int64_t n = 37, c = 19, oc = 23;
  auto inp = RandomVector(n * c, 1), w = RandomVector(oc * c, 2), b = RandomVector(oc, 3);
  std::vector<double> out(n * oc);
  MatmulForward(out.data(), inp.data(), w.data(), b.data(), n, c, oc);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < oc; ++o) {
      double s = b[o];
      for (int64_t k = 0; k < c; ++k) s += inp[i * c + k] * w[o * c + k];
      EXPECT_NEAR(out[i * oc + o], s, 1e-12);
    }
  }
}

TEST(MatmulTest, GemmAllTransposesMatchNaive) {
  const int64_t m = 7, n = 9, k = 5;
  auto a = RandomVector(m * k, 4), b = RandomVector(k * n, 5), c0 = RandomVector(m * n, 6);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto c = c0;
      Gemm<double>(ta, tb, m, n, k, 0.5, a.data(), ta ? m : k, b.data(), tb ? k : n, 2.0, c.data(),
                   n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            s += (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
          }
          EXPECT_NEAR(c[i * n + j], 2.0 * c0[i * n + j] + 0.5 * s, 1e-12) << ta << tb;
        }
      }
    }
  }
}

TEST(MatmulTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 13, c = 11, oc = 7;
  auto inp = RandomVector(n * c, 7), w = RandomVector(oc * c, 8), b = RandomVector(oc, 9);
  const auto probe = RandomVector(n * oc, 10);  // objective = sum(out * probe)
  std::vector<double> out(n * oc);
  auto objective = [&] {
    MatmulForward(out.data(), inp.data(), w.data(), b.data(), n, c, oc);
    return testing::Dot(out, probe);
  };
  // dinp is overwritten (what it held must not reach it); dw and db accumulate.
  std::vector<double> dinp(n * c, std::numeric_limits<double>::quiet_NaN()), dw(oc * c, 0),
      db(oc, 0);
  MatmulBackward(dinp.data(), dw.data(), db.data(), probe.data(), inp.data(), w.data(), n, c, oc);
  testing::ExpectGradientMatchesFd("dinp", inp, dinp, objective);
  testing::ExpectGradientMatchesFd("dweight", w, dw, objective);
  testing::ExpectGradientMatchesFd("dbias", b, db, objective);
}

TEST(MatmulTest, FloatMatchesDoubleAndIsBitIdenticalAcrossThreads) {
  const int64_t n = 601, c = 53, oc = 521;  // two row blocks and two weight-row blocks
  auto inp = RandomVector(n * c, 11), w = RandomVector(oc * c, 12), b = RandomVector(oc, 13);
  auto dout = RandomVector(n * oc, 14);
  std::vector<double> out_d(n * oc), dinp_d(n * c, 0), dw_d(oc * c, 0), db_d(oc, 0);
  MatmulForward(out_d.data(), inp.data(), w.data(), b.data(), n, c, oc);
  MatmulBackward(dinp_d.data(), dw_d.data(), db_d.data(), dout.data(), inp.data(), w.data(), n, c,
                 oc);
  auto inp_f = testing::ToFloat(inp), w_f = testing::ToFloat(w), b_f = testing::ToFloat(b),
       dout_f = testing::ToFloat(dout);
  auto run = [&] {
    std::vector<float> out(n * oc), dinp(n * c, std::numeric_limits<float>::quiet_NaN()),
        dw(oc * c, 0.25f), db(oc, 0.125f);
    MatmulForward(out.data(), inp_f.data(), w_f.data(), b_f.data(), n, c, oc);
    MatmulBackward(dinp.data(), dw.data(), db.data(), dout_f.data(), inp_f.data(), w_f.data(), n, c,
                   oc);
    for (auto& x : dw) x -= 0.25f;
    for (auto& x : db) x -= 0.125f;
    EXPECT_LT(testing::RelErr(out, out_d), 1e-5);
    EXPECT_LT(testing::RelErr(dinp, dinp_d), 1e-5);
    EXPECT_LT(testing::RelErr(dw, dw_d), 1e-5);
    EXPECT_LT(testing::RelErr(db, db_d), 1e-5);
    std::vector<float> all;
    testing::Append(all, out);
    testing::Append(all, dinp);
    testing::Append(all, dw);
    testing::Append(all, db);
    return all;
  };
  testing::ExpectSameBitsAtThreadCounts(run);
}

}  // namespace
}  // namespace troupe::kernels
