"""The autograd layer: the runtime's embedding tables as a torch.nn.Module."""

import torch

from bagpipe.errors import UsageError
from bagpipe.job import Batch, Trainer


class _EndIteration(torch.autograd.Function):
    """The iteration's one node that ends it. Forward: a placeholder [n, tables, dim] (no
    memory: an expanded zero) that every lookup of the iteration hangs from, private to the
    trainer. Backward: autograd has summed d(loss)/d(pooled) over every lookup of the iteration
    (as over every use of one tensor); it is handed to the runtime (Trainer.end_iteration),
    which ends the iteration — row gradients, exchange with the other trainers, optimizer."""

    @staticmethod
    def forward(ctx, anchor, trainer, shape):
        ctx.trainer = trainer
        ctx.generation = trainer._generation
        return torch.zeros((), device=trainer.device).expand(shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, pooled_grad):
        # Autograd may hand over an expanded or strided gradient: the runtime reads rows.
        ctx.trainer._end_iteration_from_backward(pooled_grad.detach().contiguous(),
                                                 ctx.generation)
        return None, None, None


class _PooledLookup(torch.autograd.Function):
    """Forward: the batch's pooled embeddings (a tensor of the caller's). Backward: its gradient
    goes to the iteration's _EndIteration node, unchanged."""

    @staticmethod
    def forward(ctx, node, trainer):
        return trainer.lookup_pooled()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, pooled_grad):
        return pooled_grad, None


class EmbeddingBags(torch.nn.Module):
    """Replaces a DLRM's list of ``nn.EmbeddingBag(rows, dim, mode="sum")`` tables.

    ``forward(batch)`` returns the batch's pooled embeddings, a float32 tensor [n, tables, dim]
    (``torch.stack([bag(ids_t, offsets_t) for each table], 1)`` in a pure-PyTorch model); its
    backward hands d(loss)/d(pooled) to the runtime, which applies the embedding optimizer
    (config.optimizer, lr, eps...) — so the tables are no parameters of the module and no
    torch optimizer sees them. ``batch`` must be the trainer's current batch (its latest
    begin_iteration's or eval batch; UsageError otherwise). Several lookups of one iteration
    (a model that uses the tables twice) sum their gradients, as nn.EmbeddingBag's would: the
    iteration ends at the backward pass that reaches them, and each iteration is backpropagated
    exactly once, before the next ``begin_iteration`` (which raises UsageError otherwise; so do a
    second backward in one iteration and a backward through an earlier iteration's output, kept
    with retain_graph). Evaluation batches and calls under ``torch.no_grad()`` only look the rows
    up.
    """

    def __init__(self, trainer):
        if not isinstance(trainer, Trainer):
            raise TypeError(f"EmbeddingBags: trainer must be a bagpipe.Trainer (one of "
                            f"job.trainers), got {type(trainer).__name__}")
        super().__init__()
        self.trainer = trainer

    def forward(self, batch):
        if not isinstance(batch, Batch):
            raise TypeError(f"EmbeddingBags: expected a bagpipe.Batch (from begin_iteration or "
                            f"eval_batches), got {type(batch).__name__}")
        trainer = self.trainer
        trainer._check_current(batch, "EmbeddingBags")
        if batch.is_eval or not torch.is_grad_enabled():
            return trainer.lookup_pooled()
        if trainer._ended == trainer._generation:
            raise UsageError(f"EmbeddingBags: trainer {trainer.id}'s iteration "
                             f"{batch.iteration} already ended (its lookups were "
                             "backpropagated): look up before the backward pass")
        node = trainer._end_node
        if node is None or node[0] != trainer._generation:
            anchor = torch.empty(0, requires_grad=True)  # makes autograd record the node
            shape = (batch.num_samples, trainer.num_tables, trainer.dim)
            node = (trainer._generation, _EndIteration.apply(anchor, trainer, shape))
            trainer._end_node = node
        return _PooledLookup.apply(node[1], trainer)

    def extra_repr(self):
        t = self.trainer
        return f"{t.num_tables} tables, dim {t.dim}, trainer {t.id} of {t.num_trainers}"
