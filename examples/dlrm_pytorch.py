#!/usr/bin/env python3
"""A DLRM written in plain torch.nn, trained through Bagpipe.

The model is the usual one (facebookresearch/dlrm): bottom MLP over the dense features, one
embedding bag per table, pairwise dot interaction, top MLP, BCEWithLogitsLoss. The only change
from a pure-PyTorch DLRM is its list of nn.EmbeddingBag tables, swapped for
bagpipe.EmbeddingBags(trainer): the tables live on the embedding servers and in each trainer's
cache, planned by the oracle. The flags are `bagpipe train`'s (same names, defaults and checks;
--help lists them), and so are the outputs (summary.json, metrics.jsonl, params.bin), so
`bagpipe compare` compares runs of either kind:

    export PYTHONPATH=build/python
    for mode in oracle off; do
      python3 examples/dlrm_pytorch.py --data "synthetic:samples=200000,tables=8" \\
        --batch-size 1024 --iterations 100 --cache $mode --deterministic \\
        --out runs/torch_$mode --dump-params runs/torch_$mode
    done
    build/bagpipe compare runs/torch_off runs/torch_oracle    # parameters bit-identical: yes

With --trainers T the job runs T trainers as threads of this process (one Python thread each).
Under mpirun every rank runs this script: rank 0 reads the data and plans, ranks 1..S serve the
tables, the others train (`mpirun -np 4 python3 examples/dlrm_pytorch.py --servers 1 ...`).
--model logreg swaps the DLRM for an embedding-only logistic regression (the runtime's own
cost, as `bagpipe train --model logreg`). --checkpoint-dir/--checkpoint-every/--resume work as
`bagpipe train`'s (the dense model and its optimizer are saved with torch.save); with them
Ctrl-C or SIGTERM (under mpirun: SIGUSR1 to mpirun, which forwards it to every rank) stops at an
iteration boundary, writes a checkpoint and exits 75 with the line saying how to resume.
"""

import os
import sys
import time

import torch

import bagpipe


def mlp(sizes, relu_last):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if relu_last or i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    """forward(dense [n, D], sparse) -> logits [n]. `embeddings(sparse)` returns the pooled
    embeddings [n, tables, dim]: bagpipe.EmbeddingBags(trainer) (sparse = the bagpipe Batch)
    or TorchEmbeddingBags (sparse = per-table ids and offsets)."""

    def __init__(self, num_tables, dim, bottom, top, embeddings, seed):
        super().__init__()
        self.bottom = mlp(bottom, relu_last=True)
        interactions = (num_tables + 1) * num_tables // 2
        self.top = mlp([dim + interactions] + top, relu_last=False)
        # DLRM's initialisation (normal, std sqrt(2 / (in + out)) for weights and sqrt(1 / out)
        # for biases), the very values `bagpipe train --model dlrm` starts from: every trainer's
        # replica and every run start alike, and the two implementations can be compared.
        linears = [m for m in (*self.bottom, *self.top) if isinstance(m, torch.nn.Linear)]
        initial = bagpipe.initial_dense_parameters(bottom[0], num_tables, dim, bottom, top, seed)
        with torch.no_grad():
            for layer, (weight, bias) in zip(linears, initial, strict=True):
                layer.weight.copy_(weight)
                layer.bias.copy_(bias)
        self.embeddings = embeddings
        rows, cols = torch.tril_indices(num_tables + 1, num_tables + 1, offset=-1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, dense, sparse):
        x = self.bottom(dense)                                   # [n, dim]
        pooled = self.embeddings(sparse)                         # [n, tables, dim]
        vectors = torch.cat([x.unsqueeze(1), pooled], dim=1)     # [n, tables + 1, dim]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        z = torch.cat([x, dots[:, self.rows, self.cols]], dim=1)  # pairs (i, j), i > j
        return self.top(z).squeeze(1)


class LogReg(torch.nn.Module):
    """Embedding-only logistic regression over the pooled embeddings (the dense features are
    ignored), as `bagpipe train --model logreg`: logit = b + sum_{t,c} w[t, c] pooled[t, c]."""

    def __init__(self, num_tables, dim, embeddings, seed):
        super().__init__()
        self.linear = torch.nn.Linear(num_tables * dim, 1)
        weight, bias = bagpipe.initial_logreg_parameters(num_tables, dim, seed)  # as the C++ one
        with torch.no_grad():
            self.linear.weight.copy_(weight)
            self.linear.bias.copy_(bias)
        self.embeddings = embeddings

    def forward(self, dense, sparse):
        pooled = self.embeddings(sparse)
        # self.linear's parameters as a matrix-vector product: its backward is one outer product
        # (d(loss)/d(pooled)) and one matrix-vector product, where nn.Linear's matrix product
        # with one output column costs BLAS sgemm's packing and zero-filling of [n, tables * dim]
        # (about 3 ms more per iteration at n = 4096, 26 tables, dim 16; bench/RESULTS.md).
        # A trainer's share of a last, partial batch may hold no sample: flatten(1), as -1 cannot
        # be inferred from 0 elements, and the bias expanded to n (addmv broadcasts a [1] bias
        # over 0 rows to 1 output).
        return torch.addmv(self.linear.bias.expand(pooled.shape[0]), pooled.flatten(1),
                           self.linear.weight[0])


class TorchEmbeddingBags(torch.nn.Module):
    """The pure-PyTorch tables the DLRM would have without Bagpipe: one nn.EmbeddingBag per
    table; forward((ids, offsets)) with per-table lists of ids and bag starts."""

    def __init__(self, weights):
        super().__init__()
        self.bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag.from_pretrained(w.clone(), freeze=False, mode="sum")
            for w in weights)

    def forward(self, sparse):
        ids, offsets = sparse
        return torch.stack([bag(i, o) for bag, i, o in zip(self.bags, ids, offsets)], dim=1)


def make_optimizer(parameters, settings):
    """The dense optimizer from Config.dense_optimizer_config()."""
    if settings["optimizer"] == "sgd":
        return torch.optim.SGD(parameters, lr=settings["lr"])
    return torch.optim.Adagrad(parameters, lr=settings["lr"], eps=settings["eps"],
                               initial_accumulator_value=settings["initial_accumulator"])


def layers(text):
    return [int(size) for size in text.split("-")]


def default_bottom(num_dense, dim):
    """--bottom's default: DENSE-64-DIM, as bagpipe train's."""
    return [num_dense, 64, dim]


def checkpoint_identity(flags, config, schema):
    """The loop's options a resumed job must match, as this data resolves them: --bottom as the
    layers it stands for (left out, its default for the data's dense features), so that a job
    that names the default and one that leaves it out match."""
    bottom, top = flags["bottom"], flags["top"]
    if flags["model"] == "dlrm":  # logreg has no MLPs: recorded as given
        bottom = "-".join(str(size) for size in (
            layers(bottom) if bottom else default_bottom(schema.num_dense, config.dim)))
    return {"model": flags["model"], "bottom": bottom, "top": top,
            "dense optimizer": dict(config.dense_optimizer_config())}


def checkpoint_defaults(flags, config, schema):
    """Checkpoints written before --bottom was recorded resolved hold "" where it was left out:
    compared as the default for this data."""
    if flags["model"] != "dlrm":
        return {}
    return {"bottom": "-".join(str(size) for size in default_bottom(schema.num_dense, config.dim))}


def build_model(flags, trainer_or_embeddings, num_tables, num_dense, dim, seed):
    embeddings = trainer_or_embeddings
    if isinstance(trainer_or_embeddings, bagpipe.Trainer):
        embeddings = bagpipe.EmbeddingBags(trainer_or_embeddings)
    if flags["model"] == "logreg":
        return LogReg(num_tables, dim, embeddings, seed)
    if flags["model"] != "dlrm":
        raise bagpipe.ConfigError(f"--model '{flags['model']}': expected dlrm or logreg")
    if num_dense == 0:  # as bagpipe train: a bottom MLP over no input would learn a constant
        raise bagpipe.ConfigError("--model dlrm: the data has no dense features, and the DLRM's "
                                  "bottom MLP needs at least one (name dense columns in "
                                  "--schema, or use --model logreg)")
    bottom = layers(flags["bottom"]) if flags["bottom"] else default_bottom(num_dense, dim)
    top = layers(flags["top"])
    if bottom[0] != num_dense or bottom[-1] != dim:
        raise bagpipe.ConfigError(f"--bottom {flags['bottom']}: the first size must be the "
                                  f"{num_dense} dense features and the last --dim {dim}")
    if top[-1] != 1:
        raise bagpipe.ConfigError(f"--top {flags['top']}: the last size must be 1")
    return DLRM(num_tables, dim, bottom, top, embeddings, seed)


# The runtime's phases in TrainerStats (seconds, cumulative) and the C++ loop's time_ms names.
PHASES = ("wait", "boundary", "lookup", "reduce", "sync", "apply", "allreduce")


def train(trainer, config, flags, metrics):
    """One trainer's whole loop: training, flush, held-out evaluation, outcome."""
    # Built on the CPU from the C++ model's initial parameters (the same start on every device and
    # every trainer), then moved to the trainer's device, where the batch's tensors are.
    model = build_model(flags, trainer, trainer.num_tables, trainer.num_dense, config.dim,
                        config.seed).to(trainer.device)
    optimizer = make_optimizer(model.parameters(), config.dense_optimizer_config())
    leader = trainer.id == 0
    interval = flags["metrics_interval"]
    start_stats = trainer.stats()
    interval_stats = start_stats
    forward_backward = optimizer_seconds = 0.0
    interval_fb = interval_opt = 0.0
    # The loss is summed on the trainer's device and read at each report: reading it every
    # iteration would make the host wait for the GPU once per iteration.
    loss_sum = torch.zeros((), dtype=torch.float64, device=trainer.device)
    samples, iterations, interval_samples, interval_iterations = 0, 0, 0, 0
    last_loss, global_samples = 0.0, 0
    # Checkpoints (--checkpoint-dir, --resume) hold the dense model, its optimizer and the
    # samples trained so far (all trainers'); a resumed job restores them here.
    counters = {"global_samples": 0}
    trainer.checkpoint_torch_state(model, optimizer, get=lambda: {"global_samples": global_samples},
                                   set=counters.update, metrics=metrics if leader else None)
    global_samples = counters["global_samples"]
    # Iterations are numbered from the job's start: a job resumed at K continues at K + 1, and
    # keeps the metrics lines of the iterations up to K, as bagpipe train does.
    first = trainer.first_iteration
    if leader and metrics is not None:
        metrics.start(first)
    start = interval_start = time.perf_counter()

    def runtime_seconds(stats_now, stats_then, phases):
        return sum(stats_now[f"{p}_seconds"] - stats_then[f"{p}_seconds"] for p in phases)

    def time_ms(stats_now, stats_then, fb, opt, count):
        # forward_backward: PyTorch's part (the lookup and end_iteration inside it are the
        # runtime's and are counted under their own names).
        inside = runtime_seconds(stats_now, stats_then, ("lookup", "reduce", "sync", "apply"))
        k = 1e3 / count if count else 0.0
        out = {p: k * (stats_now[f"{p}_seconds"] - stats_then[f"{p}_seconds"]) for p in PHASES}
        out["forward_backward"] = k * max(fb - inside, 0.0)
        out["optimizer"] = k * opt
        return out

    def report(final):
        nonlocal interval_stats, interval_fb, interval_opt, loss_sum, interval_samples
        nonlocal interval_iterations, interval_start, last_loss
        stats = trainer.stats()
        sums = torch.tensor([0.0, interval_samples,
                             stats["unique_rows"] - interval_stats["unique_rows"],
                             stats["hits"] - interval_stats["hits"]], dtype=torch.float32)
        sums[0] = loss_sum.to("cpu", torch.float32)
        # all_reduce_ takes a tensor on the trainer's device; .cpu() waits for the result.
        sums = trainer.all_reduce_(sums.to(trainer.device)).cpu()
        seconds = time.perf_counter() - interval_start
        last_loss = float(sums[0] / sums[1]) if sums[1] > 0 else 0.0
        if leader:
            hit_rate = float(sums[3] / sums[2]) if sums[2] > 0 else 0.0
            record = {"kind": "train", "iteration": first + iterations,
                      "iterations": interval_iterations, "samples": global_samples,
                      # No sample in the interval (a resume with no iteration left): no loss.
                      "loss": last_loss if sums[1] > 0 else None,
                      "samples_per_s": float(sums[1]) / seconds,
                      "hit_rate": hit_rate, "seconds": time.perf_counter() - start,
                      "time_ms": time_ms(stats, interval_stats, interval_fb, interval_opt,
                                         interval_iterations),
                      "final": final}
            if metrics is not None:
                metrics.write(record)
            if not flags["quiet"]:
                print(f"iteration {first + iterations}: loss {last_loss:.4f}, "
                      f"{record['samples_per_s']:.0f} samples/s, hit {100 * hit_rate:.1f}%",
                      file=sys.stderr)
        interval_stats = stats
        interval_fb = interval_opt = 0.0
        loss_sum = torch.zeros_like(loss_sum)
        interval_samples = interval_iterations = 0
        interval_start = time.perf_counter()

    for batch in trainer:
        t0 = time.perf_counter()
        if first > 0 and iterations == 0:  # resumed: the replay up to the checkpoint is no training
            start = interval_start = t0
        logits = model(batch.dense, batch)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, batch.labels, reduction="sum") / batch.global_batch_size
        optimizer.zero_grad()
        loss.backward()  # ends the iteration in the runtime (EmbeddingBags' backward)
        t1 = time.perf_counter()
        trainer.all_reduce_gradients(model.parameters())
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        forward_backward += t1 - t0
        interval_fb += t1 - t0
        optimizer_seconds += t3 - t2
        interval_opt += t3 - t2
        loss_sum += loss.detach().double() * batch.global_batch_size
        samples += batch.num_samples
        interval_samples += batch.num_samples
        global_samples += batch.global_batch_size  # what a checkpoint after this one records
        iterations += 1
        interval_iterations += 1
        if interval > 0 and (first + iterations) % interval == 0:
            report(False)
    # A resumed job with no iteration left reports nothing: the metrics it continues end with
    # the checkpoint's iteration already.
    if interval_iterations > 0 or (iterations == 0 and first == 0):
        report(True)
    seconds = time.perf_counter() - start
    stats = trainer.stats()
    trainer.flush()

    predictions, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in trainer.eval_batches():
            predictions.append(torch.sigmoid(model(batch.dense, batch)))
            labels.append(batch.labels)
    info = {"iterations": iterations, "samples": samples,
            "seconds": seconds,
            "time_ms": time_ms(stats, start_stats, forward_backward, optimizer_seconds,
                               iterations)}
    if iterations > 0:  # a job that trained no iteration (resumed at its last) has no loss
        info["train_loss"] = last_loss
    trainer.complete(dense=list(model.parameters()),
                     predictions=torch.cat(predictions) if predictions else None,
                     labels=torch.cat(labels) if labels else None, info=info)
    return info


def main(argv=None):
    config, flags = bagpipe.parse_train_args(
        argv, prog="dlrm_pytorch.py",
        description="Train a torch.nn DLRM through the Bagpipe runtime (bagpipe train's flags)")
    if config.deterministic:
        torch.set_num_threads(1)  # fixed reduction orders, as bagpipe train's single-thread BLAS
    with bagpipe.Job(config,
                     checkpoint_identity=lambda schema: checkpoint_identity(flags, config, schema),
                     checkpoint_defaults=lambda schema: checkpoint_defaults(flags, config,
                                                                            schema)) as job:
        # --out DIR is this job's until it ends (rank 0 holds it, as bagpipe train's rank 0).
        lock = bagpipe.RunDirectoryLock(flags["out"]) if flags["out"] and job.rank == 0 else None
        metrics = None
        if flags["metrics_out"] and any(t.id == 0 for t in job.trainers):
            # A run that fails leaves no earlier run's summary beside its metrics.
            params = flags["dump_params"] and os.path.join(flags["dump_params"], "params.bin")
            metrics = bagpipe.MetricsWriter(flags["metrics_out"],
                                            replaces=[flags["summary_json"], params])
        job.run_trainers(train, config, flags, metrics)
        model = {"model": f"pytorch-{flags['model']}", "framework": f"torch {torch.__version__}"}
        if flags["model"] == "dlrm":
            model["bottom"] = flags["bottom"] or f"{job.schema.num_dense}-64-{config.dim}"
            model["top"] = flags["top"]
        summary = job.finish(summary_json=flags["summary_json"] or None,
                             dump_params=flags["dump_params"] or None, model=model)
        if lock is not None:
            lock.release()
    if summary is not None:
        print(f"{summary['cache']}: {summary['iterations']} iterations in "
              f"{summary['train_seconds']:.2f} s, {summary['samples_per_s']:.0f} samples/s, "
              f"{summary['ms_per_iteration']:.2f} ms/iteration")
        loss = summary["train_loss"]
        print(f"  train loss {'-' if loss is None else f'{loss:.5f}'}, hit rate "
              f"{100 * summary['hit_rate']:.1f}%, fetched {summary['fetched_bytes'] / 1e6:.1f} MB")
        if "eval" in summary:
            print(f"  held-out ({summary['eval']['samples']} samples): log loss "
                  f"{summary['eval']['log_loss']:.5f}, AUC {summary['eval']['auc']:.4f}")
        print(f"  parameters sha256 {summary['params_sha256']}")
    return summary


if __name__ == "__main__":
    try:
        main()
    except bagpipe.Stopped as stopped:  # as bagpipe train: one line, exit 75 (EX_TEMPFAIL)
        print(f"dlrm_pytorch.py: {stopped}", file=sys.stderr)
        sys.exit(75)
    except bagpipe.Error as error:
        print(f"dlrm_pytorch.py: error: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("dlrm_pytorch.py: interrupted", file=sys.stderr)
        sys.exit(130)
