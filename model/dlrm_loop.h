// The reference DLRM training loop, written against the trainer hooks (trainer_hooks/trainer.h)
// the way a user's own loop would be: embedding bags come from Trainer::LookupPooled, the dense
// part (bottom MLP, dot interaction, top MLP, BCE) from DenseModel, dense gradients are
// all-reduced with Trainer::AllReduceDevice and sparse ones handed back to Trainer::EndIteration.
//
// Every `metrics_interval` iterations all trainers sum their interval figures (one small
// deterministic all-reduce) and trainer 0 writes one JSON line: the global mean training loss,
// samples/s, the cache hit rate and the per-iteration time breakdown (trainer 0's). After
// training the loop flushes every row home and, if the oracle sends evaluation shards, predicts
// them; the predictions go into the TrainerOutcome for rank 0 to score (model/eval_metrics.h).
#ifndef BAGPIPE_MODEL_DLRM_LOOP_H_
#define BAGPIPE_MODEL_DLRM_LOOP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/metrics.h"
#include "model/dense_model.h"
#include "trainer_hooks/job.h"
#include "trainer_hooks/trainer.h"

namespace bagpipe {

enum class DenseHeadKind {
  kDlrm,    // model/dense_model.h: bottom MLP, dot interaction, top MLP
  kLogReg,  // model/logreg_head.h: embedding-only logistic regression (CPU)
};

struct DlrmLoopOptions {
  DenseModelConfig model;  // num_tables and dim must match the trainer's batches and cache
  // kLogReg uses model.num_tables, dim, seed and optimizer only.
  DenseHeadKind head = DenseHeadKind::kDlrm;
  int metrics_interval = 50;
  // For the progress bars: iterations planned and held-out batches to evaluate (<= 0: unknown).
  int64_t total_iterations = 0;
  int64_t total_eval_batches = 0;
  // Trainer 0 only: where the interval metrics go (may be null) and whether to draw progress.
  JsonLinesWriter* metrics = nullptr;
  bool progress = false;
};

// Runs the whole loop on `trainer` (training, Flush, evaluation) and fills `outcome`:
// dense_parameters, eval predictions/labels, and info {"train_loss" (last interval's global
// mean), "iterations", "samples", "seconds", "time_ms" breakdown}.
absl::Status RunDlrmLoop(Trainer& trainer, const DlrmLoopOptions& options, TrainerOutcome* outcome);

// A TrainLoop for RunEmbeddedJob / RunDistributedRank: trainer 0 gets the metrics writer and the
// progress bar, the others run silently.
TrainLoop MakeDlrmLoop(DlrmLoopOptions options);

}  // namespace bagpipe

#endif  // BAGPIPE_MODEL_DLRM_LOOP_H_
