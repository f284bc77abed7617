"""Bagpipe for PyTorch: train a DLRM written in ``torch.nn`` through the Bagpipe runtime.

The embedding tables live on embedding servers; a lookahead oracle plans which rows each
trainer's cache holds; the results are those of plain synchronous training (bit for bit with
``deterministic=True``, given what the loop owns: every trainer's dense replica starts equal —
``all_reduce_gradients`` refuses replicas that differ at its first call — and
``torch.set_num_threads(1)`` keeps PyTorch's own reductions in one order, as the example does).
A PyTorch model swaps its list of ``nn.EmbeddingBag`` tables for
:class:`EmbeddingBags` and drives its loop itself (pull style: nothing runs on threads the library
owns except the oracle, the servers and the prefetchers)::

    import bagpipe, torch
    config = bagpipe.Config(data="synthetic:samples=100000,tables=8,scale=0.01", batch_size=1024,
                            cache="oracle", dim=16, optimizer="adagrad", lr=0.01, eps=1e-10)
    with bagpipe.Job(config) as job:                  # starts the oracle and the servers
        def train(trainer):                           # one thread per local trainer
            model = MyDLRM(embeddings=bagpipe.EmbeddingBags(trainer))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for batch in trainer:                     # begin_iteration() until the end
                logits = model(batch.dense, batch)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, batch.labels, reduction="sum") / batch.global_batch_size
                opt.zero_grad()
                loss.backward()                       # d(loss)/d(pooled) goes to the runtime
                trainer.all_reduce_gradients(model.parameters())
                opt.step()
            trainer.flush()
            trainer.complete(dense=list(model.parameters()))
        job.run_trainers(train)
        summary = job.finish(out="runs/torch")

Loss scaling: gradients handed back must be those of (the sum of this trainer's per-sample
losses) / ``batch.global_batch_size`` — the global mean once summed over trainers.

Device contract (the same as the C++ hooks', trainer_hooks/trainer.h):
  * A trainer queues its device work on its own compute stream. The batch's tensors and the
    pooled embeddings are ready in stream order; with CUDA the trainer makes PyTorch's current
    stream (registered at every ``begin_iteration``) wait for them with an event, so ordinary
    PyTorch code after the call sees them ready.
  * The runtime reads ``pooled_grad`` (``end_iteration``) and reads and writes the
    ``all_reduce_`` tensor asynchronously, in stream order. This package holds a reference to
    each until the next ``begin_iteration`` or ``flush`` returns, so a tensor the caller drops is
    not freed early; the caller keeps them unmodified until then. With CUDA the compute stream
    first waits for the work queued on PyTorch's stream, and PyTorch's stream then waits for the
    runtime's accesses, so the caching allocator cannot hand the memory out again before the
    runtime is done with it (no host synchronisation).
  * With CUDA, PyTorch runs the backward of CUDA operations on its own thread for the device,
    shared by every trainer on that GPU. EmbeddingBags' backward therefore hands d(loss)/d(pooled)
    over, and the loop's thread ends the iteration at its next call (all_reduce_gradients,
    all_reduce_, begin_iteration, flush, stats, complete): a trainer waiting there for the
    others' shared-row gradients does not hold up their backward passes. Give each trainer's
    dense model to ``trainer.device`` (``model.to(trainer.device)``).
  * On the CPU every call has finished its work when it returns (with the asynchronous CPU
    streams of ``BAGPIPE_CPU_STREAMS``, this package waits for them before it returns).

Errors: :class:`ConfigError` (options), :class:`UsageError` (calls out of order), :class:`JobError`
(the job failed here, on another thread or on another rank, or was aborted), TypeError/ValueError
(a tensor of the wrong dtype, shape, device or layout), KeyboardInterrupt (Ctrl-C: the job is
aborted, every thread and rank stops), :class:`Stopped` (from ``Job.finish``: the job stopped at
an iteration boundary — ``Job.request_stop``, or with checkpoints configured the first Ctrl-C,
SIGTERM or SIGUSR1 while the job is open — and says where to resume).

Checkpoints: ``Config(checkpoint_dir=..., checkpoint_every=..., resume=...)`` as ``bagpipe
train``'s flags, with the loop's own state registered by ``Trainer.checkpoint_torch_state(model,
optimizer)``; a resumed run ends with the parameters of an uninterrupted one.

Tested with Debian's python3-torch 1.13 (CPU), and with PyTorch 2.11 on an H100 (one trainer;
see bench/RESULTS.md for what is open there). Tensors cross through DLPack; libtorch is not
linked, so one build serves any PyTorch with DLPack support.
"""

try:
    from bagpipe import _core
except ImportError as error:
    # Without this, Python names a "circular import" when the sources' python/ is on the path.
    raise ImportError(
        f"bagpipe's compiled extension (_core) cannot be imported beside {__file__} ({error}): "
        "import the built package (PYTHONPATH=build/python) or an installed one (cmake "
        "--install), not the sources' python/ folder") from error

from bagpipe.errors import ConfigError, Error, JobError, Stopped, UsageError
from bagpipe.job import (Batch, Config, Job, MetricsWriter, RunDirectoryLock, Schema,
                         Trainer, initial_dense_parameters, initial_embedding_weights,
                         initial_logreg_parameters, parse_train_args)
from bagpipe.nn import EmbeddingBags

__version__ = _core.__version__

__all__ = [
    "Batch", "Config", "ConfigError", "EmbeddingBags", "Error", "Job", "JobError",
    "MetricsWriter", "RunDirectoryLock", "Schema", "Stopped", "Trainer", "UsageError",
    "initial_dense_parameters",
    "initial_embedding_weights", "initial_logreg_parameters", "parse_train_args",
]
