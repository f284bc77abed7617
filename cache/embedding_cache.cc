#include "cache/embedding_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/cache_backend.h"
#include "core/status.h"

namespace bagpipe {
namespace {

absl::Status NullPointer(const char* op, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " is null"));
}

absl::Status CheckLearningRate(float rate) {
  if (!std::isfinite(rate) || rate < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate must be finite and non-negative, got ", rate));
  }
  return absl::OkStatus();
}

}  // namespace

EmbeddingCache::EmbeddingCache(std::shared_ptr<DeviceContext> context, int64_t capacity, int dim,
                               const OptimizerConfig& optimizer, const CacheOptions& options)
    : context_(std::move(context)),
      capacity_(capacity),
      dim_(dim),
      state_floats_(StateFloatsPerRow(optimizer.kind, dim)),
      optimizer_(optimizer),
      validation_(options.validation) {}

EmbeddingCache::~EmbeddingCache() = default;

absl::StatusOr<std::unique_ptr<EmbeddingCache>> EmbeddingCache::Create(
    std::shared_ptr<DeviceContext> context, int64_t capacity, int dim,
    const OptimizerConfig& optimizer, const CacheOptions& options) {
  if (context == nullptr) return absl::InvalidArgumentError("EmbeddingCache: null context");
  if (capacity < 1 || capacity > std::numeric_limits<SlotId>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("EmbeddingCache: capacity must be in [1, ",
                                                   std::numeric_limits<SlotId>::max(),
                                                   "] slots, got ", capacity));
  }
  if (dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("EmbeddingCache: dim must be >= 1, got ", dim));
  }
  RETURN_IF_ERROR(Annotate(CheckLearningRate(optimizer.learning_rate), "EmbeddingCache"));
  const bool adagrad = optimizer.kind != OptimizerKind::kSgd;
  if (adagrad && !(optimizer.eps > 0.0f && std::isfinite(optimizer.eps))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EmbeddingCache: ", std::string(OptimizerName(optimizer.kind)),
        " needs a finite eps > 0 (a zero gradient on a zero accumulator would divide 0 by 0), "
        "got ",
        optimizer.eps));
  }
  std::unique_ptr<EmbeddingCache> cache(
      new EmbeddingCache(std::move(context), capacity, dim, optimizer, options));
  const std::shared_ptr<DeviceContext>& ctx = cache->context_;
  RETURN_IF_ERROR(ctx->MakeCurrent());
  const size_t value_floats = static_cast<size_t>(capacity) * dim;
  const size_t state_floats = static_cast<size_t>(capacity) * cache->state_floats_;
  ASSIGN_OR_RETURN(cache->values_, DeviceArray<float>::Create(ctx, value_floats));
  ASSIGN_OR_RETURN(cache->state_, DeviceArray<float>::Create(ctx, state_floats));
  RETURN_IF_ERROR(ctx->Zero(cache->values_.data(), cache->values_.bytes()));
  RETURN_IF_ERROR(ctx->Zero(cache->state_.data(), cache->state_.bytes()));
  RETURN_IF_ERROR(ctx->Synchronize());
  internal::CacheStorage storage;
  storage.values = cache->values_.data();
  storage.state = cache->state_.data();
  storage.capacity = capacity;
  storage.dim = dim;
  storage.state_floats = cache->state_floats_;
  storage.optimizer = optimizer.kind;
  if (ctx->is_cuda()) {
#if BAGPIPE_WITH_CUDA
    ASSIGN_OR_RETURN(cache->backend_, internal::CreateCudaCacheBackend(ctx, storage));
#else
    return absl::FailedPreconditionError("EmbeddingCache: built without the CUDA backend");
#endif
  } else {
    cache->backend_ = internal::CreateCpuCacheBackend(ctx, storage);
  }
  return cache;
}

absl::Status EmbeddingCache::set_learning_rate(float rate) {
  RETURN_IF_ERROR(CheckLearningRate(rate));
  optimizer_.learning_rate = rate;
  return absl::OkStatus();
}

bool EmbeddingCache::validating() const {
  switch (validation_) {
    case Validation::kOn:
      return true;
    case Validation::kOff:
      return false;
    case Validation::kAuto:
      return !context_->is_asynchronous();
  }
  return true;
}

size_t EmbeddingCache::bytes() const { return values_.bytes() + state_.bytes(); }

template <typename T>
absl::StatusOr<std::vector<T>> EmbeddingCache::ToHost(const T* pointer, int64_t count,
                                                      Stream stream) const {
  std::vector<T> host(static_cast<size_t>(count));
  if (count == 0) return host;
  if (!context_->is_asynchronous()) {
    std::copy(pointer, pointer + count, host.begin());
    return host;
  }
  RETURN_IF_ERROR(context_->CopyToHost(host.data(), pointer, host.size() * sizeof(T), stream));
  RETURN_IF_ERROR(context_->Synchronize(stream));
  return host;
}

absl::Status EmbeddingCache::CheckSlots(const char* op, const SlotId* slots, int64_t n,
                                        bool distinct) const {
  for (int64_t k = 0; k < n; ++k) {
    if (slots[k] < 0 || slots[k] >= capacity_) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": slots[", k, "] = ", slots[k],
                                                     " is outside the cache's ", capacity_,
                                                     " slots [0, ", capacity_, ")"));
    }
  }
  if (!distinct || n < 2) return absl::OkStatus();
  if (mark_.size() != static_cast<size_t>(capacity_)) mark_.assign(capacity_, 0);
  if (++mark_epoch_ == 0) {
    std::fill(mark_.begin(), mark_.end(), 0);
    mark_epoch_ = 1;
  }
  for (int64_t k = 0; k < n; ++k) {
    uint32_t& mark = mark_[slots[k]];
    if (mark == mark_epoch_) {
      int64_t first = 0;
      while (slots[first] != slots[k]) ++first;
      return absl::InvalidArgumentError(absl::StrCat(op, ": slot ", slots[k],
                                                     " appears at positions ", first, " and ", k,
                                                     "; the slots of one call must be distinct"));
    }
    mark = mark_epoch_;
  }
  return absl::OkStatus();
}

absl::Status EmbeddingCache::ValidateSlots(const char* op, const SlotId* slots, int64_t n,
                                           bool distinct, Stream stream) const {
  if (!validating() || n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<SlotId> host, ToHost(slots, n, stream));
  return CheckSlots(op, host.data(), n, distinct);
}

absl::Status EmbeddingCache::Gather(const SlotId* slots, const int64_t* offsets, int num_tables,
                                    int num_samples, float* pooled, const GatherOptions& options) {
  constexpr const char* kOp = "Gather";
  if (num_tables < 0 || num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": negative shape (", num_tables, " tables, ", num_samples, " samples)"));
  }
  const int64_t bags = static_cast<int64_t>(num_tables) * num_samples;
  stats_.Add(CacheCounter::kGatherCalls);
  if (bags == 0) return absl::OkStatus();
  if (offsets == nullptr) return NullPointer(kOp, "offsets");
  if (pooled == nullptr) return NullPointer(kOp, "pooled");
  if (validating()) {
    ASSIGN_OR_RETURN(std::vector<int64_t> host_offsets, ToHost(offsets, bags + 1, options.stream));
    if (host_offsets[0] != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": offsets[0] must be 0, got ", host_offsets[0]));
    }
    for (int64_t b = 0; b < bags; ++b) {
      if (host_offsets[b + 1] < host_offsets[b]) {
        return absl::InvalidArgumentError(absl::StrCat(
            kOp, ": offsets decrease at bag ", b, " (table ", b / num_samples, ", sample ",
            b % num_samples, "): ", host_offsets[b], " > ", host_offsets[b + 1]));
      }
    }
    const int64_t num_ids = host_offsets[bags];
    if (num_ids > 0 && slots == nullptr) return NullPointer(kOp, "slots");
    RETURN_IF_ERROR(ValidateSlots(kOp, slots, num_ids, /*distinct=*/false, options.stream));
  }
  internal::GatherArgs args;
  args.slots = slots;
  args.offsets = offsets;
  args.num_tables = num_tables;
  args.num_samples = num_samples;
  args.pooling = options.pooling;
  args.weights = options.weights;
  args.pooled = pooled;
  RETURN_IF_ERROR(backend_->Gather(args, options.stream));
  stats_.Add(CacheCounter::kPooledRows, bags);
  return absl::OkStatus();
}

absl::Status EmbeddingCache::ReduceGradients(const BackwardIndex& index, const float* pooled_grad,
                                             float* row_grads, Stream stream) {
  constexpr const char* kOp = "ReduceGradients";
  if (!index.built()) {
    return absl::FailedPreconditionError(absl::StrCat(kOp, ": the BackwardIndex was not built"));
  }
  if (index.backend() != context_->backend()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": the BackwardIndex was built for the ", std::string(BackendName(index.backend())),
        " backend, the cache runs on ", std::string(BackendName(context_->backend()))));
  }
  return ReduceGradients(index.view(), pooled_grad, row_grads, stream);
}

absl::Status EmbeddingCache::ReduceGradients(const BackwardIndexView& index,
                                             const float* pooled_grad, float* row_grads,
                                             Stream stream) {
  constexpr const char* kOp = "ReduceGradients";
  if (index.num_unique < 0 || index.num_ids < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative index size"));
  }
  if (index.num_unique == 0) return absl::OkStatus();
  if (row_grads == nullptr) return NullPointer(kOp, "row_grads");
  if (index.row_begin == nullptr || (index.num_ids > 0 && index.pooled_rows == nullptr)) {
    return NullPointer(kOp, "the index's arrays");
  }
  if (index.num_ids > 0 && pooled_grad == nullptr) return NullPointer(kOp, "pooled_grad");
  internal::ReduceArgs args;
  args.row_begin = index.row_begin;
  args.pooled_rows = index.pooled_rows;
  args.scales = index.scales;
  args.num_unique = index.num_unique;
  args.pooled_grad = pooled_grad;
  args.row_grads = row_grads;
  RETURN_IF_ERROR(backend_->Reduce(args, stream));
  stats_.Add(CacheCounter::kReducedRows, index.num_unique);
  return absl::OkStatus();
}

absl::Status EmbeddingCache::Apply(const SlotId* slots, const float* grads, int64_t n,
                                   Stream stream) {
  return ApplyIndexed(slots, nullptr, grads, n, stream);
}

absl::Status EmbeddingCache::ApplyIndexed(const SlotId* slots, const int32_t* grad_rows,
                                          const float* grads, int64_t n, Stream stream) {
  constexpr const char* kOp = "Apply";
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative count ", n));
  if (n == 0) return absl::OkStatus();
  if (slots == nullptr) return NullPointer(kOp, "slots");
  if (grads == nullptr) return NullPointer(kOp, "grads");
  if (validating()) {
    RETURN_IF_ERROR(ValidateSlots(kOp, slots, n, /*distinct=*/true, stream));
    if (grad_rows != nullptr) {
      ASSIGN_OR_RETURN(std::vector<int32_t> rows, ToHost(grad_rows, n, stream));
      for (int64_t k = 0; k < n; ++k) {
        if (rows[k] < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(kOp, ": grad_rows[", k, "] = ", rows[k], " is negative"));
        }
      }
    }
  }
  internal::ApplyArgs args;
  args.slots = slots;
  args.grad_rows = grad_rows;
  args.grads = grads;
  args.n = n;
  args.learning_rate = optimizer_.learning_rate;
  args.eps = optimizer_.eps;
  RETURN_IF_ERROR(backend_->Apply(args, stream));
  stats_.Add(CacheCounter::kAppliedRows, n);
  return absl::OkStatus();
}

absl::Status EmbeddingCache::Fill(const SlotId* slots, const float* records, int64_t n,
                                  Stream stream) {
  constexpr const char* kOp = "Fill";
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative count ", n));
  if (n == 0) return absl::OkStatus();
  if (slots == nullptr) return NullPointer(kOp, "slots");
  if (records == nullptr) return NullPointer(kOp, "records");
  RETURN_IF_ERROR(ValidateSlots(kOp, slots, n, /*distinct=*/true, stream));
  RETURN_IF_ERROR(backend_->Fill(slots, records, n, stream));
  stats_.Add(CacheCounter::kFilledRows, n);
  return absl::OkStatus();
}

absl::Status EmbeddingCache::Extract(const SlotId* slots, int64_t n, float* records,
                                     Stream stream) {
  constexpr const char* kOp = "Extract";
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kOp, ": negative count ", n));
  if (n == 0) return absl::OkStatus();
  if (slots == nullptr) return NullPointer(kOp, "slots");
  if (records == nullptr) return NullPointer(kOp, "records");
  RETURN_IF_ERROR(ValidateSlots(kOp, slots, n, /*distinct=*/false, stream));
  RETURN_IF_ERROR(backend_->Extract(slots, n, records, stream));
  stats_.Add(CacheCounter::kExtractedRows, n);
  return absl::OkStatus();
}

absl::Status EmbeddingCache::InitializeRows(const RowInitializer& initializer, int64_t first_slot,
                                            int64_t count, RowId first_row, Stream stream) {
  constexpr const char* kOp = "InitializeRows";
  if (initializer.dim() != dim_ || initializer.record_floats() != record_floats()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": the initializer makes records of ", initializer.dim(), " values + ",
                     initializer.record_floats() - initializer.dim(),
                     " state floats; the cache holds ", dim_, " + ", state_floats_));
  }
  if (first_slot < 0 || count < 0 || first_slot > capacity_ - count) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": slots [", first_slot, ", ",
                                                   first_slot + count, ") are outside the cache's ",
                                                   capacity_, " slots [0, ", capacity_, ")"));
  }
  if (count == 0) return absl::OkStatus();
  const RowId total_rows =
      initializer.table_offsets().empty() ? 0 : initializer.table_offsets().back();
  if (first_row >= total_rows || total_rows - first_row < static_cast<RowId>(count)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": rows [", first_row, ", ", first_row + count, ") are outside the ",
                     total_rows, " rows of the initializer's tables"));
  }
  // The initializer's state value, taken from a record it makes (it has no accessor).
  std::vector<float> record(record_floats());
  initializer.Init(first_row, record.data());
  const float accumulator = state_floats_ > 0 ? record[dim_] : 0.0f;
  RETURN_IF_ERROR(
      backend_->InitializeRows(initializer, first_slot, count, first_row, accumulator, stream));
  stats_.Add(CacheCounter::kInitializedRows, count);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> EmbeddingCache::ReadRecords(
    absl::Span<const SlotId> slots) const {
  const int64_t n = static_cast<int64_t>(slots.size());
  RETURN_IF_ERROR(CheckSlots("ReadRecords", slots.data(), n, /*distinct=*/false));
  std::vector<float> records(slots.size() * record_floats());
  if (n == 0) return records;
  if (!context_->is_asynchronous()) {
    RETURN_IF_ERROR(backend_->Extract(slots.data(), n, records.data(), Stream::kCompute));
  } else {
    ASSIGN_OR_RETURN(auto device_slots, DeviceArray<SlotId>::Create(context_, slots.size()));
    ASSIGN_OR_RETURN(auto device_records, DeviceArray<float>::Create(context_, records.size()));
    RETURN_IF_ERROR(
        context_->CopyToDevice(device_slots.data(), slots.data(), slots.size() * sizeof(SlotId)));
    RETURN_IF_ERROR(
        backend_->Extract(device_slots.data(), n, device_records.data(), Stream::kCompute));
    RETURN_IF_ERROR(context_->CopyToHost(records.data(), device_records.data(),
                                         records.size() * sizeof(float)));
    RETURN_IF_ERROR(context_->Synchronize());
  }
  stats_.Add(CacheCounter::kExtractedRows, n);
  return records;
}

absl::Status EmbeddingCache::WriteRecords(absl::Span<const SlotId> slots,
                                          absl::Span<const float> records) {
  const int64_t n = static_cast<int64_t>(slots.size());
  if (records.size() != slots.size() * record_floats()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteRecords: ", slots.size(), " slots need ",
                                                   slots.size() * record_floats(),
                                                   " record floats, got ", records.size()));
  }
  RETURN_IF_ERROR(CheckSlots("WriteRecords", slots.data(), n, /*distinct=*/true));
  if (n == 0) return absl::OkStatus();
  if (!context_->is_asynchronous()) {
    RETURN_IF_ERROR(backend_->Fill(slots.data(), records.data(), n, Stream::kCompute));
  } else {
    ASSIGN_OR_RETURN(auto device_slots, DeviceArray<SlotId>::Create(context_, slots.size()));
    ASSIGN_OR_RETURN(auto device_records, DeviceArray<float>::Create(context_, records.size()));
    RETURN_IF_ERROR(
        context_->CopyToDevice(device_slots.data(), slots.data(), slots.size() * sizeof(SlotId)));
    RETURN_IF_ERROR(context_->CopyToDevice(device_records.data(), records.data(),
                                           records.size() * sizeof(float)));
    RETURN_IF_ERROR(
        backend_->Fill(device_slots.data(), device_records.data(), n, Stream::kCompute));
    RETURN_IF_ERROR(context_->Synchronize());
  }
  stats_.Add(CacheCounter::kFilledRows, n);
  return absl::OkStatus();
}

}  // namespace bagpipe
