// Held-out evaluation figures of a binary classifier: log loss and ROC AUC.
#ifndef BAGPIPE_MODEL_EVAL_METRICS_H_
#define BAGPIPE_MODEL_EVAL_METRICS_H_

#include <cstdint>
#include <vector>

#include "nlohmann/json.hpp"

namespace bagpipe {

// Labels lie in [0, 1]. The log loss takes them as they are (the training loss); the positives,
// the AUC and the accuracy count a label above 0.5 as positive.
struct EvalFigures {
  int64_t samples = 0;
  int64_t positives = 0;  // labels above 0.5
  double log_loss = 0;    // mean binary cross entropy (probabilities clamped to [1e-7, 1 - 1e-7])
  double auc = 0;         // exact ROC AUC, ties counted half; 0.5 when one class is absent
  double accuracy = 0;    // at threshold 0.5
  nlohmann::json ToJson() const;
};

// REQUIRES: probabilities.size() == labels.size(); labels in [0, 1].
EvalFigures Evaluate(const std::vector<float>& probabilities, const std::vector<float>& labels);

}  // namespace bagpipe

#endif  // BAGPIPE_MODEL_EVAL_METRICS_H_
