// A model of your own, trained elastically by troupe's actors: a one-hidden-layer MLP fitting
// y = sin(x0 + 2·x1) · cos(x2) on synthetic inputs. The program is every process of its job:
// RunMain runs it as head, node agent or worker when the embedded cluster starts it that way;
// otherwise it is the driver and runs the job (3 workers, one killed with SIGKILL at step 15).
//
//   custom_model [--steps N] [--work_dir DIR]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/training.h"
#include "troupe/model/rng.h"
#include "troupe/runtime/cluster.h"

namespace {

constexpr int kIn = 4;

// Flat parameters: w1 [hidden, kIn], b1 [hidden], w2 [hidden], b2 [1].
class Mlp : public troupe::train::Trainable {
 public:
  Mlp(int hidden, int batch, int microbatches, uint64_t seed)
      : hidden_(hidden), batch_(batch), microbatches_(microbatches), seed_(seed) {
    int64_t off = 0;
    auto add = [&](const char* name, std::vector<int64_t> shape, bool decay) {
      int64_t size = 1;
      for (int64_t d : shape) size *= d;
      tensors_.push_back({name, off, size, shape, decay});
      off += size;
    };
    add("w1", {hidden, kIn}, true);
    add("b1", {hidden}, false);
    add("w2", {hidden}, true);
    add("b2", {1}, false);
    params_.resize(off);
    grads_.resize(off);
  }

  int64_t num_params() const override { return static_cast<int64_t>(params_.size()); }
  const std::vector<troupe::model::ParamTensor>& tensors() const override { return tensors_; }
  float* params() override { return params_.data(); }
  const float* grads() const override { return grads_.data(); }
  int64_t tokens_per_microbatch() const override { return batch_; }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i] = 0.5f * troupe::model::NormalFloat(seed, troupe::model::RngPurpose::kInit, 0, i);
    }
  }

  // Mean squared error of microbatch k of step `step`, weighted 1/(M·batch) so that the step's
  // gradient is the sum over the M microbatches. Inputs are a pure function of the sample index.
  absl::StatusOr<double> ComputeGradient(int64_t step, int32_t k) override {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    const float* w1 = params_.data();
    const float* b1 = w1 + hidden_ * kIn;
    const float* w2 = b1 + hidden_;
    const float b2 = w2[hidden_];
    float* gw1 = grads_.data();
    float* gb1 = gw1 + hidden_ * kIn;
    float* gw2 = gb1 + hidden_;
    float* gb2 = gw2 + hidden_;
    const float weight = 1.0f / static_cast<float>(microbatches_ * batch_);
    double loss = 0;
    std::vector<float> h(hidden_);
    for (int r = 0; r < batch_; ++r) {
      const uint64_t sample = (static_cast<uint64_t>(step) * microbatches_ + k) * batch_ + r;
      float x[kIn];
      for (int i = 0; i < kIn; ++i) {
        x[i] = troupe::model::NormalFloat(seed_, troupe::model::RngPurpose::kTest, i, sample);
      }
      const float target = std::sin(x[0] + 2 * x[1]) * std::cos(x[2]);
      float y = b2;
      for (int j = 0; j < hidden_; ++j) {
        float a = b1[j];
        for (int i = 0; i < kIn; ++i) a += w1[j * kIn + i] * x[i];
        h[j] = std::tanh(a);
        y += w2[j] * h[j];
      }
      const float err = y - target;
      loss += static_cast<double>(err) * err;
      const float dy = 2 * err * weight;
      *gb2 += dy;
      for (int j = 0; j < hidden_; ++j) {
        gw2[j] += dy * h[j];
        const float da = dy * w2[j] * (1 - h[j] * h[j]);
        gb1[j] += da;
        for (int i = 0; i < kIn; ++i) gw1[j * kIn + i] += da * x[i];
      }
    }
    return loss / batch_;
  }

 private:
  int hidden_, batch_, microbatches_;
  uint64_t seed_;
  std::vector<troupe::model::ParamTensor> tensors_;
  std::vector<float> params_, grads_;
};

}  // namespace

int main(int argc, char** argv) {
  // 1. The model, by name, in every process (workers build it from the job spec).
  troupe::train::TrainableRegistry::Global().Register(
      "mlp",
      [](const troupe::train::ModelSpec& spec)
          -> absl::StatusOr<std::unique_ptr<troupe::train::Trainable>> {
        auto hidden = spec.options.count("hidden") ? std::stoi(spec.options.at("hidden")) : 32;
        return std::make_unique<Mlp>(hidden, spec.microbatch_size, spec.microbatches, spec.seed);
      });
  // 2. The training actors; then, if the cluster started this process in a role, run it.
  troupe::runtime::ActorRegistry registry;
  if (absl::Status s = troupe::actors::RegisterTrainingActors(registry); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  if (int rc = troupe::runtime::RunMain(argc, argv, registry); rc >= 0) return rc;

  // 3. The driver: the job, with a fault.
  troupe::train::JobSpec spec;
  spec.name = "mlp";
  spec.steps = 40;
  spec.work_dir = "custom-model-job";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) spec.steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--work_dir") == 0) spec.work_dir = argv[i + 1];
  }
  spec.model.type = "mlp";
  spec.model.microbatch_size = 32;
  spec.model.microbatches = 8;
  spec.model.options["hidden"] = "32";
  spec.schedule.max_lr = 3e-2f;
  spec.schedule.min_lr = 3e-3f;
  spec.schedule.warmup_steps = 2;
  spec.schedule.total_steps = spec.steps;
  spec.adamw.weight_decay = 0;
  spec.workers = 3;
  spec.checkpoint_every = 10;
  spec.faults.push_back({troupe::train::FaultKind::kKillWorker, 15, 1});
  absl::StatusOr<troupe::actors::JobReport> report = troupe::actors::RunTrainingJob(spec, {});
  if (!report.ok()) {
    std::fprintf(stderr, "custom_model: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::printf("custom_model: %lld steps, final loss %.4f, world %d, recovery %.3f s\n",
              static_cast<long long>(report->committed_steps), report->losses.back(),
              report->final_world, report->recovery_seconds);
  return 0;
}
