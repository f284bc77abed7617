#include "cache/backward_index.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/cache_math.h"
#include "core/status.h"

namespace bagpipe {
namespace {

// Grows `array` to hold at least `size` elements (capacity doubles; contents are dropped).
template <typename T>
absl::Status Reserve(const std::shared_ptr<DeviceContext>& context, size_t size,
                     DeviceArray<T>* array) {
  if (array->size() >= size) return absl::OkStatus();
  size_t capacity = std::max<size_t>(1024, array->size());
  while (capacity < size) capacity *= 2;
  array->Reset();
  ASSIGN_OR_RETURN(*array, DeviceArray<T>::Create(context, capacity));
  return absl::OkStatus();
}

}  // namespace

void BackwardIndex::Clear() {
  context_ = nullptr;
  num_tables_ = num_samples_ = num_unique_ = 0;
  num_ids_ = 0;
  has_scales_ = false;
  host_row_begin_.clear();
  host_pooled_rows_.clear();
  host_scales_.clear();
}

absl::StatusOr<bool> BuildBackwardIndexInto(const int64_t* offsets, int num_tables, int num_samples,
                                            const uint32_t* unique_index, int64_t num_ids,
                                            int num_unique, PoolingMode pooling,
                                            const float* weights, int64_t* row_begin,
                                            int32_t* pooled_rows, float* scales,
                                            std::vector<int64_t>* cursor) {
  if (num_tables < 0 || num_samples < 0 || num_ids < 0 || num_unique < 0) {
    return absl::InvalidArgumentError(absl::StrCat("BackwardIndex: negative size (tables ",
                                                   num_tables, ", samples ", num_samples, ", ids ",
                                                   num_ids, ", unique ", num_unique, ")"));
  }
  const int64_t num_bags = static_cast<int64_t>(num_tables) * num_samples;
  if (num_bags > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("BackwardIndex: ", num_bags, " bags exceed the int32 pooled-row range"));
  }
  if (offsets == nullptr || (num_ids > 0 && unique_index == nullptr)) {
    return absl::InvalidArgumentError("BackwardIndex: null offsets or unique_index");
  }
  if (offsets[0] != 0 || offsets[num_bags] != num_ids) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BackwardIndex: offsets must run from 0 to num_ids = ", num_ids,
        ", got offsets[0] = ", offsets[0], " and offsets[", num_bags, "] = ", offsets[num_bags]));
  }
  // Count the occurrences of each unique row.
  std::fill(row_begin, row_begin + num_unique + 1, 0);
  for (int64_t j = 0; j < num_ids; ++j) {
    const uint32_t u = unique_index[j];
    if (u >= static_cast<uint32_t>(num_unique)) {
      return absl::InvalidArgumentError(absl::StrCat("BackwardIndex: unique_index[", j, "] = ", u,
                                                     " is not below num_unique = ", num_unique));
    }
    ++row_begin[u + 1];
  }
  for (int u = 0; u < num_unique; ++u) row_begin[u + 1] += row_begin[u];

  // Scatter occurrences in increasing j, so each row's list is in occurrence order.
  const bool mean = pooling == PoolingMode::kMean;
  const bool scaled = mean || weights != nullptr;
  if (scaled && num_ids > 0 && scales == nullptr) {
    return absl::InvalidArgumentError("BackwardIndex: scaled pooling needs a scales array");
  }
  cursor->assign(row_begin, row_begin + num_unique);
  int64_t* next = cursor->data();
  for (int t = 0; t < num_tables; ++t) {
    for (int s = 0; s < num_samples; ++s) {
      const int64_t bag = static_cast<int64_t>(t) * num_samples + s;
      const int64_t begin = offsets[bag];
      const int64_t end = offsets[bag + 1];
      if (end < begin) {
        return absl::InvalidArgumentError(absl::StrCat("BackwardIndex: offsets decrease at bag ",
                                                       bag, " (table ", t, ", sample ", s,
                                                       "): ", begin, " > ", end));
      }
      const int32_t pooled_row = s * num_tables + t;
      const float multiplier = cache_math::BagMultiplier(mean, end - begin);
      for (int64_t j = begin; j < end; ++j) {
        const int64_t position = next[unique_index[j]]++;
        pooled_rows[position] = pooled_row;
        if (scaled) {
          scales[position] = cache_math::Mul(weights != nullptr ? weights[j] : 1.0f, multiplier);
        }
      }
    }
  }
  return scaled;
}

absl::Status BackwardIndex::Build(const std::shared_ptr<DeviceContext>& context,
                                  const int64_t* offsets, int num_tables, int num_samples,
                                  const uint32_t* unique_index, int64_t num_ids, int num_unique,
                                  PoolingMode pooling, const float* weights) {
  if (context_ != nullptr && !context_->is_cuda() && context_->is_asynchronous()) {
    // Queued reduces read the host arrays about to be replaced.
    RETURN_IF_ERROR(context_->Synchronize());
  }
  Clear();
  if (context == nullptr) return absl::InvalidArgumentError("BackwardIndex: null context");
  if (num_unique < 0 || num_ids < 0) {
    return absl::InvalidArgumentError(absl::StrCat("BackwardIndex: negative size (tables ",
                                                   num_tables, ", samples ", num_samples, ", ids ",
                                                   num_ids, ", unique ", num_unique, ")"));
  }
  std::vector<int64_t> row_begin(static_cast<size_t>(num_unique) + 1, 0);
  std::vector<int32_t> pooled_rows(static_cast<size_t>(num_ids));
  const bool scaled_input = pooling == PoolingMode::kMean || weights != nullptr;
  std::vector<float> scales(scaled_input ? static_cast<size_t>(num_ids) : 0);
  std::vector<int64_t> cursor;
  ASSIGN_OR_RETURN(const bool scaled,
                   BuildBackwardIndexInto(offsets, num_tables, num_samples, unique_index, num_ids,
                                          num_unique, pooling, weights, row_begin.data(),
                                          pooled_rows.data(), scales.data(), &cursor));
  context_ = context;
  num_tables_ = num_tables;
  num_samples_ = num_samples;
  num_unique_ = num_unique;
  num_ids_ = num_ids;
  has_scales_ = scaled;
  host_row_begin_ = std::move(row_begin);
  host_pooled_rows_ = std::move(pooled_rows);
  host_scales_ = std::move(scales);
  absl::Status status = Upload();
  if (!status.ok()) Clear();
  return status;
}

absl::Status BackwardIndex::Upload() {
  if (!context_->is_cuda()) return absl::OkStatus();
  if (device_context_ != context_) {
    // Buffers of another context (or none yet) cannot be reused.
    device_row_begin_.Reset();
    device_pooled_rows_.Reset();
    device_scales_.Reset();
    device_context_ = context_;
  }
  RETURN_IF_ERROR(Reserve(context_, host_row_begin_.size(), &device_row_begin_));
  RETURN_IF_ERROR(Reserve(context_, host_pooled_rows_.size(), &device_pooled_rows_));
  RETURN_IF_ERROR(context_->CopyToDevice(device_row_begin_.data(), host_row_begin_.data(),
                                         host_row_begin_.size() * sizeof(int64_t)));
  RETURN_IF_ERROR(context_->CopyToDevice(device_pooled_rows_.data(), host_pooled_rows_.data(),
                                         host_pooled_rows_.size() * sizeof(int32_t)));
  if (has_scales_) {
    RETURN_IF_ERROR(Reserve(context_, host_scales_.size(), &device_scales_));
    RETURN_IF_ERROR(context_->CopyToDevice(device_scales_.data(), host_scales_.data(),
                                           host_scales_.size() * sizeof(float)));
  }
  return absl::OkStatus();
}

const int64_t* BackwardIndex::row_begin() const {
  return context_ && context_->is_cuda() ? device_row_begin_.data() : host_row_begin_.data();
}

const int32_t* BackwardIndex::pooled_rows() const {
  return context_ && context_->is_cuda() ? device_pooled_rows_.data() : host_pooled_rows_.data();
}

BackwardIndexView BackwardIndex::view() const {
  BackwardIndexView view;
  view.row_begin = row_begin();
  view.pooled_rows = pooled_rows();
  view.scales = scales();
  view.num_tables = num_tables_;
  view.num_samples = num_samples_;
  view.num_unique = num_unique_;
  view.num_ids = num_ids_;
  return view;
}

const float* BackwardIndex::scales() const {
  if (!has_scales_) return nullptr;
  return context_ && context_->is_cuda() ? device_scales_.data() : host_scales_.data();
}

}  // namespace bagpipe
