#include "troupe/train/trainable.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "troupe/base/status_macros.h"
#include "troupe/kernels/matmul.h"
#include "troupe/model/data_source.h"
#include "troupe/model/gpt.h"
#include "troupe/model/token_shard.h"

#ifdef TROUPE_TRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpt_device.h"  // kernels/cuda: the GPT's training step on a GPU
#include "gpt_device_trainable.h"
#endif

namespace troupe::train {
namespace {

class GptTrainable : public Trainable, public StagedTrainable {
 public:
  GptTrainable(model::Gpt gpt, model::DataSource data, std::optional<model::DataSource> eval)
      : gpt_(std::move(gpt)), data_(std::move(data)), eval_(std::move(eval)) {}

  int64_t num_params() const override { return gpt_.num_params(); }
  const std::vector<model::ParamTensor>& tensors() const override {
    return gpt_.layout().tensors();
  }
  float* params() override { return gpt_.params(); }
  const float* grads() const override { return gpt_.grads(); }
  void InitParams(uint64_t seed) override { gpt_.InitParams(seed); }
  int64_t tokens_per_microbatch() const override {
    return int64_t{data_.options().microbatch_size} * data_.options().seq_len;
  }
  std::optional<model::GptConfig> gpt_config() const override { return gpt_.config(); }

  // The same arithmetic as model::Trainer::Step for one microbatch: loss weight 1/(M·m·T).
  absl::StatusOr<double> ComputeGradient(int64_t step, int32_t k) override {
    return ComputeGradientReporting(step, k, nullptr);
  }
  absl::StatusOr<double> ComputeGradientReporting(int64_t step, int32_t k,
                                                  const GradientReady& ready) override {
    TROUPE_RETURN_IF_ERROR(data_.Get(step, k, &mb_));
    TROUPE_ASSIGN_OR_RETURN(
        double loss, gpt_.Forward(mb_.inputs.data(), mb_.targets.data(), mb_.batch, mb_.seq_len));
    gpt_.ZeroGrad();
    TROUPE_RETURN_IF_ERROR(gpt_.Backward(LossWeight(), ready));
    return loss;
  }

  absl::StatusOr<double> EvalLoss(int32_t k) override {
    if (!eval_) return Trainable::EvalLoss(k);
    TROUPE_RETURN_IF_ERROR(eval_->Get(0, k, &mb_));
    return gpt_.Forward(mb_.inputs.data(), mb_.targets.data(), mb_.batch, mb_.seq_len);
  }
  absl::Status SetDataStream(int32_t stream, int32_t streams) override {
    return data_.SetStream(stream, streams);
  }

  // Pipeline stages: the units are the blocks.
  StagedTrainable* staged() override { return this; }
  int num_units() const override { return gpt_.config().num_layers; }
  // Multiply-adds per token: a block's four matmuls (12 C²) and attention (~T·C); the last
  // stage's head (C·V). The embedding's lookups cost next to nothing.
  StageCosts costs() const override {
    const double c = gpt_.config().width, t = data_.options().seq_len;
    return StageCosts{std::vector<double>(static_cast<size_t>(num_units()), 12 * c * c + t * c), 0,
                      c * gpt_.config().vocab_size};
  }
  int64_t boundary_size() const override { return tokens_per_microbatch() * gpt_.config().width; }
  std::vector<std::pair<int64_t, int64_t>> GradientRanges(int first_unit,
                                                          int end_unit) const override {
    return gpt_.StageGradientRanges({first_unit, end_unit});
  }
  std::vector<std::pair<int64_t, int64_t>> TiedRanges() const override {
    const int64_t wte = gpt_.layout().wte();
    return {{wte, wte + int64_t{gpt_.config().vocab_size} * gpt_.config().width}};
  }
  void InitParamRange(uint64_t seed, int64_t begin, int64_t end) override {
    gpt_.InitParams(seed, begin, end);
  }
  absl::Status SetStage(int first_unit, int end_unit, int slots) override {
    slot_batches_.assign(std::max(0, slots), model::Microbatch{});
    return gpt_.SetStage({first_unit, end_unit}, slots);
  }
  absl::StatusOr<double> StageForward(int64_t step, int32_t k, int slot,
                                      const float* input) override {
    if (slot < 0 || slot >= static_cast<int>(slot_batches_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("StageForward: no slot ", slot));
    }
    model::Microbatch& mb = slot_batches_[slot];
    TROUPE_RETURN_IF_ERROR(data_.Get(step, k, &mb));
    return gpt_.ForwardStage(slot, mb.inputs.data(), mb.targets.data(), input, mb.batch,
                             mb.seq_len);
  }
  const float* StageOutput(int slot) const override { return gpt_.stage_output(slot); }
  absl::Status StageBackward(int slot, const float* d_output) override {
    for (const auto& [lo, hi] : gpt_.StageGradientRanges(gpt_.stage())) {
      std::fill(gpt_.grads() + lo, gpt_.grads() + hi, 0.0f);
    }
    return gpt_.BackwardStage(slot, LossWeight(), d_output);
  }
  const float* InputGradient() const override { return gpt_.input_gradient(); }
  absl::Status AddTiedGradient(int64_t step, int32_t k, const float* first_input_gradient,
                               float* tied) override {
    TROUPE_RETURN_IF_ERROR(data_.Get(step, k, &mb_));
    gpt_.AddTokenEmbeddingGradient(tied, first_input_gradient, mb_.inputs.data(), mb_.batch,
                                   mb_.seq_len);
    return absl::OkStatus();
  }

 private:
  float LossWeight() const {
    const model::DataSourceOptions& d = data_.options();
    return 1.0f /
           static_cast<float>(int64_t{d.microbatches_per_step} * d.microbatch_size * d.seq_len);
  }

  model::Gpt gpt_;
  model::DataSource data_;
  std::optional<model::DataSource> eval_;
  model::Microbatch mb_;
  std::vector<model::Microbatch> slot_batches_;  // the microbatch each stage slot holds
};

}  // namespace

std::string Device::ToString() const { return is_cuda() ? absl::StrCat("cuda:", ordinal) : "cpu"; }

absl::StatusOr<Device> ParseDevice(const std::string& text) {
  if (text == "cpu") return Device{};
  if (text == "cuda") return Device{Device::Kind::kCuda, 0};
  int ordinal = -1;
  if (text.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(text.substr(5), &ordinal) && ordinal >= 0) {
    return Device{Device::Kind::kCuda, ordinal};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"", text, "\""));
}

absl::StatusOr<int> CudaDeviceCount() {
#ifdef TROUPE_TRAIN_HAVE_CUDA
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
                     static_cast<int>(e), "): ", cudaGetErrorString(e)));
  }
  return count;
#else
  return absl::FailedPreconditionError(
      "this troupe was built without the CUDA backend (TROUPE_CUDA=OFF)");
#endif
}

absl::Status CheckDeviceUsable(const Device& device) {
  if (!device.is_cuda()) return absl::OkStatus();
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device.ToString(), ": ", count.status().message()));
  }
  if (device.ordinal >= *count) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device.ToString(), ": this process sees ", *count,
                     " CUDA device(s) (in a cluster a worker sees only its own: use \"cuda\")"));
  }
  return absl::OkStatus();
}

namespace {

// The training shards (train-*.tok) in `data_dir`, sorted by name.
absl::StatusOr<std::vector<std::string>> TrainShards(const std::string& data_dir) {
  std::vector<std::string> shards;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("train-", 0) == 0 && e.path().extension() == ".tok") {
      shards.push_back(e.path().string());
    }
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat("model.data_dir: cannot read '", data_dir, "': ",
                                            ec.message(), " (run `troupe data prepare` first)"));
  }
  if (shards.empty()) {
    return absl::NotFoundError(absl::StrCat("model.data_dir: expected train-*.tok shards in '",
                                            data_dir, "', found none"));
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

// [eval]'s held-out shard: as given (relative to data_dir), else data_dir's first val-*.tok.
absl::StatusOr<std::string> EvalShardPath(const ModelSpec& spec) {
  if (!spec.eval_shard.empty()) {
    const std::filesystem::path p(spec.eval_shard);
    return p.is_absolute() ? p.string() : (std::filesystem::path(spec.data_dir) / p).string();
  }
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(spec.data_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("val-", 0) == 0 && e.path().extension() == ".tok") {
      found.push_back(e.path().string());
    }
  }
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "eval.shard: expected a val-*.tok shard in '", spec.data_dir,
        "' (`troupe data prepare` writes one), found none; or name one in [eval] shard"));
  }
  return *std::min_element(found.begin(), found.end());
}

// model.size's GPT over the shards' vocabulary, checked against model.seq_len.
absl::StatusOr<model::GptConfig> ConfigForSize(const ModelSpec& spec, int32_t vocab) {
  model::GptConfig config;
  if (spec.size == "tiny") {
    config = model::GptConfig::Tiny(vocab);
  } else if (spec.size == "tiny4") {
    config = model::GptConfig::Tiny(vocab);
    config.num_layers = 4;
  } else if (spec.size == "small20m") {
    config = model::GptConfig::Small20M(vocab);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("model.size: expected tiny, tiny4 or small20m, got '", spec.size, "'"));
  }
  if (spec.seq_len > config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("model.seq_len: expected at most ",
                                                   config.context_length, " for size ", spec.size,
                                                   ", got ", spec.seq_len));
  }
  return config;
}

#ifdef TROUPE_TRAIN_HAVE_CUDA
// The same GPT and data on a GPU: parameters, gradients and moments stay in device memory. Same
// tensor layout as the CPU model, so checkpoints move between CPU and GPU runs.
absl::StatusOr<std::unique_ptr<Trainable>> CreateGpuTrainable(
    const ModelSpec& spec, const Device& device, const model::GptConfig& config,
    model::DataSource data, std::optional<model::DataSource> eval) {
  absl::StatusOr<std::unique_ptr<model::cuda::GptDevice>> gpu =
      model::cuda::GptDevice::Create(config, device.ordinal, spec.precision == "bf16");
  if (!gpu.ok()) {
    return absl::Status(gpu.status().code(), absl::StrCat("model.device = \"", spec.device,
                                                          "\": ", gpu.status().message()));
  }
  absl::StatusOr<std::unique_ptr<GptDeviceTrainable<model::cuda::GptDevice>>> t =
      GptDeviceTrainable<model::cuda::GptDevice>::Create(*std::move(gpu), std::move(data), device,
                                                         std::move(eval));
  if (!t.ok()) return t.status();
  return std::unique_ptr<Trainable>(*std::move(t));
}
#endif

absl::StatusOr<std::unique_ptr<Trainable>> CreateCpuTrainable(
    const ModelSpec& spec, const model::GptConfig& config, model::DataSource data,
    std::optional<model::DataSource> eval) {
  // Every rank would stop at its first matrix product, and be restarted to stop again: say it
  // here, before any process starts (the driver probes the model).
  if (const std::string gemm = kernels::GemmBackend(); gemm.rfind("unavailable: ", 0) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("model.device = \"cpu\": the CPU model's matrix products are ",
                     gemm.substr(0, 11), " (", gemm.substr(13), ")"));
  }
  if (spec.precision != "fp32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.precision: expected \"fp32\" on the CPU (bf16 is the GPU path's), got \"",
        spec.precision, "\""));
  }
  TROUPE_ASSIGN_OR_RETURN(model::Gpt gpt, model::Gpt::Create(config));
  return std::make_unique<GptTrainable>(std::move(gpt), std::move(data), std::move(eval));
}

}  // namespace

ModelSpec HostLayoutSpec(ModelSpec spec) {
  spec.device = "cpu";
  spec.precision = "fp32";
  return spec;
}

absl::StatusOr<std::unique_ptr<Trainable>> CreateGptTrainable(const ModelSpec& spec) {
  absl::StatusOr<Device> device = ParseDevice(spec.device);
  if (!device.ok()) return device.status();
  if (absl::Status s = CheckDeviceUsable(*device); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("model.device = \"", spec.device, "\": ", s.message()));
  }
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> shards, TrainShards(spec.data_dir));
  absl::StatusOr<std::unique_ptr<model::TokenShard>> first = model::TokenShard::Open(shards[0], 0);
  if (!first.ok()) return first.status();
  const int32_t vocab = (*first)->vocab_size();
  TROUPE_ASSIGN_OR_RETURN(model::GptConfig config, ConfigForSize(spec, vocab));
  absl::StatusOr<model::DataSource> data =
      model::DataSource::Open(shards, vocab,
                              {.seq_len = spec.seq_len,
                               .microbatch_size = spec.microbatch_size,
                               .microbatches_per_step = spec.microbatches,
                               .seed = spec.seed});
  if (!data.ok()) return data.status();
  std::optional<model::DataSource> eval;
  if (spec.eval_microbatches > 0) {
    TROUPE_ASSIGN_OR_RETURN(std::string path, EvalShardPath(spec));
    absl::StatusOr<model::DataSource> e =
        model::DataSource::Open({path}, vocab,
                                {.seq_len = spec.seq_len,
                                 .microbatch_size = spec.microbatch_size,
                                 .microbatches_per_step = spec.eval_microbatches,
                                 .seed = spec.seed});
    if (!e.ok()) {
      return absl::Status(e.status().code(),
                          absl::StrCat("eval.shard: ", path, ": ", e.status().message()));
    }
    eval = *std::move(e);
  }
#ifdef TROUPE_TRAIN_HAVE_CUDA
  if (device->is_cuda()) {
    return CreateGpuTrainable(spec, *device, config, *std::move(data), std::move(eval));
  }
#endif
  return CreateCpuTrainable(spec, config, *std::move(data), std::move(eval));
}

absl::StatusOr<std::vector<std::pair<int32_t, double>>> EvalShare(Trainable& model,
                                                                  int32_t microbatches, int rank,
                                                                  int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("EvalShare: rank ", rank, " of ", world));
  }
  std::vector<std::pair<int32_t, double>> out;
  const int64_t lo = int64_t{microbatches} * rank / world;
  const int64_t hi = int64_t{microbatches} * (rank + 1) / world;
  for (int64_t k = lo; k < hi; ++k) {
    TROUPE_ASSIGN_OR_RETURN(double loss, model.EvalLoss(static_cast<int32_t>(k)));
    out.emplace_back(static_cast<int32_t>(k), loss);
  }
  return out;
}

TrainableRegistry& TrainableRegistry::Global() {
  static TrainableRegistry* registry = [] {
    auto* r = new TrainableRegistry;
    r->Register("gpt", CreateGptTrainable);
    return r;
  }();
  return *registry;
}

void TrainableRegistry::Register(const std::string& name, TrainableFactory factory) {
  factories_[name] = std::move(factory);
}

absl::StatusOr<std::unique_ptr<Trainable>> TrainableRegistry::Create(const ModelSpec& spec) const {
  auto it = factories_.find(spec.type);
  if (it == factories_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, f] : factories_) names.push_back(n);
    return absl::InvalidArgumentError(absl::StrCat(
        "model.type: expected one of ", absl::StrJoin(names, ", "), ", got '", spec.type, "'"));
  }
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<Trainable> model, it->second(spec));
  int64_t at = 0;
  for (const model::ParamTensor& t : model->tensors()) {
    if (t.offset != at || t.size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", spec.type, "': tensor '", t.name, "' covers [", t.offset, ", ",
                       t.offset + t.size, "): expected it to start at ", at,
                       " (tensors() cover [0, num_params()) in order, with no gap)"));
    }
    at += t.size;
  }
  if (at != model->num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", spec.type, "': tensors() cover [0, ", at,
                     "), expected [0, num_params() = ", model->num_params(), ")"));
  }
  return model;
}

}  // namespace troupe::train
