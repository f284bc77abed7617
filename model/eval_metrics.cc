#include "model/eval_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace bagpipe {

nlohmann::json EvalFigures::ToJson() const {
  return {{"samples", samples},
          {"positives", positives},
          {"log_loss", log_loss},
          {"auc", auc},
          {"accuracy", accuracy}};
}

EvalFigures Evaluate(const std::vector<float>& probabilities, const std::vector<float>& labels) {
  EvalFigures figures;
  const size_t n = std::min(probabilities.size(), labels.size());
  figures.samples = static_cast<int64_t>(n);
  if (n == 0) return figures;
  double loss = 0;
  int64_t correct = 0;
  for (size_t k = 0; k < n; ++k) {
    const double p = std::clamp(static_cast<double>(probabilities[k]), 1e-7, 1 - 1e-7);
    // The loss the model trains on, with the label as it is (labels in [0, 1] need not be 0
    // or 1); the counts, the accuracy and the AUC take a label above 0.5 as positive.
    const double y = labels[k];
    const bool positive = labels[k] > 0.5f;
    figures.positives += positive ? 1 : 0;
    loss -= y * std::log(p) + (1 - y) * std::log(1 - p);
    correct += (p >= 0.5) == positive ? 1 : 0;
  }
  figures.log_loss = loss / static_cast<double>(n);
  figures.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  const int64_t negatives = figures.samples - figures.positives;
  if (figures.positives == 0 || negatives == 0) {
    figures.auc = 0.5;
    return figures;
  }
  // Mann-Whitney U: rank the scores (average ranks for ties), sum the positives' ranks.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return probabilities[a] < probabilities[b]; });
  double positive_rank_sum = 0;
  for (size_t begin = 0; begin < n;) {
    size_t end = begin + 1;
    while (end < n && probabilities[order[end]] == probabilities[order[begin]]) ++end;
    const double rank = 0.5 * static_cast<double>(begin + 1 + end);  // mean of begin+1..end
    for (size_t k = begin; k < end; ++k) {
      if (labels[order[k]] > 0.5f) positive_rank_sum += rank;
    }
    begin = end;
  }
  const double p = static_cast<double>(figures.positives);
  figures.auc = (positive_rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
  return figures;
}

}  // namespace bagpipe
