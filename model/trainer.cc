#include "troupe/model/trainer.h"

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"
#include "troupe/kernels/norm.h"
#include "troupe/model/state_io.h"
#include "troupe/model/tree_sum.h"

namespace troupe::model {

absl::StatusOr<Trainer> Trainer::Create(const TrainerOptions& options, const DataSource* data) {
  TROUPE_ASSIGN_OR_RETURN(Gpt model, Gpt::Create(options.config));
  if (data->options().seq_len > options.config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len: expected at most context_length ",
                                                   options.config.context_length, ", got ",
                                                   data->options().seq_len));
  }
  model.InitParams(options.init_seed);
  return Trainer(options, std::move(model), data);
}

Trainer::Trainer(const TrainerOptions& options, Gpt model, const DataSource* data)
    : options_(options),
      model_(std::move(model)),
      data_(data),
      m_(model_.num_params(), 0.0f),
      v_(model_.num_params(), 0.0f),
      step_grad_(model_.num_params(), 0.0f) {}

absl::StatusOr<double> Trainer::Step(const std::function<void()>& before_update) {
  const DataSourceOptions& d = data_->options();
  const int64_t tokens_per_step = int64_t{d.microbatches_per_step} * d.microbatch_size * d.seq_len;
  const float loss_weight = 1.0f / static_cast<float>(tokens_per_step);
  TreeAccumulator grads(model_.num_params());
  std::vector<double> losses;
  Microbatch mb;
  for (int32_t k = 0; k < d.microbatches_per_step; ++k) {
    TROUPE_RETURN_IF_ERROR(data_->Get(step_, k, &mb));
    TROUPE_ASSIGN_OR_RETURN(
        double loss, model_.Forward(mb.inputs.data(), mb.targets.data(), mb.batch, mb.seq_len));
    losses.push_back(loss);
    model_.ZeroGrad();
    TROUPE_RETURN_IF_ERROR(model_.Backward(loss_weight));
    TROUPE_RETURN_IF_ERROR(grads.Add(model_.grads()));
  }
  TROUPE_RETURN_IF_ERROR(grads.Finish(step_grad_.data()));
  last_grad_norm_ = GradNorm(step_grad_.data(), model_.num_params());
  const kernels::AdamWScalars scalars =
      StepScalars(options_.adamw, options_.schedule, step_, last_grad_norm_);
  if (before_update) before_update();
  AdamWUpdateRange(model_.layout(), 0, model_.num_params(), model_.params(), step_grad_.data(),
                   m_.data(), v_.data(), options_.adamw, scalars);
  ++step_;
  return kernels::TreeSum(losses.data(), static_cast<int64_t>(losses.size())) /
         static_cast<double>(losses.size());
}

absl::Status Trainer::Save(const std::string& path) const {
  return SaveState(
      path, {options_.config, step_, options_.init_seed, model_.params(), m_.data(), v_.data()});
}

absl::Status Trainer::Restore(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(LoadedState s, LoadState(path));
  if (!(s.config == options_.config)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": config: expected ",
                                                   options_.config.DebugString(), ", got ",
                                                   s.config.DebugString()));
  }
  if (s.adam_m.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected optimizer state (AdamW moments), got parameters only"));
  }
  std::copy(s.params.begin(), s.params.end(), model_.params());
  m_ = std::move(s.adam_m);
  v_ = std::move(s.adam_v);
  step_ = s.step;
  return absl::OkStatus();
}

}  // namespace troupe::model
