// DiLoCo's outer loop for tests, written from its formulas alone (Douillard et al. 2023: Nesterov
// on the mean of the groups' pseudo-gradients), over parameters the tests' own model::Trainers
// hold. It shares no code with the low-communication mode (lowcomm.h), so the mode's bits can be
// checked against it. `stale`: the one-round-late variant (stale_outer): a group's Δ is the change
// since its round began; a round's mean is applied where the next one ends (over the groups there
// then), and a group goes on from θ_global − its newest Δ; after the last step the newest are
// applied too.
//
//   DiLoCoReference ref(0.7f, 0.9f, /*stale=*/false);
//   ref.Start("zone:a", trainer_a.model().params(), n);   // each group where it first trains
//   ... each group's trainer steps ...
//   ref.RoundEnd({{"zone:a", pa}, {"zone:b", pb}}, last);  // where a round ends
//   Crc32c(ref.global())
#ifndef TROUPE_TRAIN_DILOCO_REFERENCE_H_
#define TROUPE_TRAIN_DILOCO_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace troupe::train {

class DiLoCoReference {
 public:
  DiLoCoReference(float lr, float momentum, bool stale) : lr_(lr), mu_(momentum), stale_(stale) {}

  // Group `group` starts from `params` (n floats); the first call sets θ_global.
  void Start(const std::string& group, const float* params, int64_t n);
  // Where a round ends: each group (in order) with its parameters, continued in place. `applies`
  // (null: every group): whether a group's newest Δ counts in this round's mean. `last`: after
  // the job's last step.
  void RoundEnd(const std::vector<std::pair<std::string, float*>>& groups, bool last,
                const std::function<bool(const std::string&)>& applies = nullptr);
  const std::vector<float>& global() const { return global_; }

 private:
  // Nesterov on the mean of `deltas` (summed in the order given); none: nothing changes.
  void Outer(const std::vector<const std::vector<float>*>& deltas);

  float lr_, mu_;
  bool stale_;
  std::vector<float> global_, momentum_;
  std::map<std::string, std::vector<float>> base_, pending_;
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_DILOCO_REFERENCE_H_
