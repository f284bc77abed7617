"""The autograd layer: the runtime's embedding tables as a torch.nn.Module."""

import torch

from bagpipe.job import Batch, Trainer


class _PooledLookup(torch.autograd.Function):
    """Forward: the batch's pooled embeddings. Backward: hands d(loss)/d(pooled) to the runtime
    (Trainer.end_iteration), which ends the iteration — row gradients, exchange with the other
    trainers, optimizer — and returns nothing for the inputs."""

    @staticmethod
    def forward(ctx, anchor, trainer):
        ctx.trainer = trainer
        ctx.generation = trainer._generation
        return trainer.lookup_pooled()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, pooled_grad):
        # Autograd may hand over an expanded or strided gradient: the runtime reads rows.
        ctx.trainer._end_iteration_from_backward(pooled_grad.detach().contiguous(),
                                                 ctx.generation)
        return None, None


class EmbeddingBags(torch.nn.Module):
    """Replaces a DLRM's list of ``nn.EmbeddingBag(rows, dim, mode="sum")`` tables.

    ``forward(batch)`` returns the batch's pooled embeddings, a float32 tensor [n, tables, dim]
    (``torch.stack([bag(ids_t, offsets_t) for each table], 1)`` in a pure-PyTorch model); its
    backward hands d(loss)/d(pooled) to the runtime, which applies the embedding optimizer
    (config.optimizer, lr, eps...) — so the tables are no parameters of the module and no
    torch optimizer sees them. Each training batch's output must be backpropagated exactly once,
    before the next ``begin_iteration`` (which raises UsageError otherwise; so does a backward
    through an earlier iteration's output, kept with retain_graph). Evaluation batches and calls
    under ``torch.no_grad()`` only look the rows up.
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
        if batch.is_eval or not torch.is_grad_enabled():
            return self.trainer.lookup_pooled()
        anchor = torch.empty(0, requires_grad=True)  # makes autograd record the lookup
        return _PooledLookup.apply(anchor, self.trainer)

    def extra_repr(self):
        t = self.trainer
        return f"{t.num_tables} tables, dim {t.dim}, trainer {t.id} of {t.num_trainers}"
