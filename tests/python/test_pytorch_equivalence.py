"""The same torch.nn DLRM trained through bagpipe equals the pure-PyTorch model with
nn.EmbeddingBag tables started from the same parameters: the loss of every one of 20 iterations
agrees within 1e-6 (relative), with SGD, with Adagrad (same eps on both sides; lr 0.01, where
float rounding does not dominate Adagrad's first steps) and with row-wise Adagrad (written out
below from its textbook rule, as PyTorch has none), with one trainer and with several (threads
of one job, each on its shard of the global batch, whose losses add up to the full batch's);
so does the embedding-only head (--model logreg) against nn.Linear. The batches come from a
Python iterable (per-table ids with nn.EmbeddingBag-style offsets), which the oracle reads
ahead on its thread."""

import concurrent.futures

import numpy as np
import pytest
import torch

import bagpipe

TABLE_ROWS = [50, 200, 1000, 30, 400]
NUM_DENSE = 3
DIM = 8
BATCH = 128
ITERATIONS = 20


def make_batches(seed):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(ITERATIONS):
        ids, offsets = [], []
        for rows in TABLE_ROWS:
            counts = rng.integers(1, 4, size=BATCH)  # multi-hot bags of 1-3 ids
            # Skewed ids, so that rows repeat within and across batches.
            table_ids = np.minimum((rng.zipf(1.3, size=counts.sum()) - 1), rows - 1)
            ids.append(table_ids.astype(np.int64))
            offsets.append(np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64))
        batches.append({"dense": rng.standard_normal((BATCH, NUM_DENSE)).astype(np.float32),
                        "labels": (rng.random(BATCH) < 0.3).astype(np.float32),
                        "ids": ids, "offsets": offsets})
    return batches


def loss_of(logits, labels, global_batch):
    return torch.nn.functional.binary_cross_entropy_with_logits(
        logits, labels, reduction="sum") / global_batch


class RowwiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad on whole tables (FBGEMM's ROWWISE_ADAGRAD): per row r,
    s_r += mean(g_r ** 2), then w_r -= lr * g_r / (sqrt(s_r) + eps). A row the batch does not
    touch has g_r = 0 and stays as it is."""

    def __init__(self, params, lr, eps):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], device=p.device)
                state["sum"] += (p.grad * p.grad).mean(dim=1)
                p -= group["lr"] * p.grad / (state["sum"].sqrt() + group["eps"]).unsqueeze(1)


def torch_optimizer(params, kind, lr, eps):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "rowwise-adagrad":
        return RowwiseAdagrad(params, lr=lr, eps=eps)
    return torch.optim.Adagrad(params, lr=lr, eps=eps)


def bagpipe_losses(example, config, schema, batches, model_name="dlrm", backward=None,
                   per_trainer=False):
    """The global batch's loss at every iteration (the sum of the trainers' shard losses, each
    already divided by the global batch size) and every trainer's stats; with per_trainer, each
    trainer's (losses, stats). ``backward(loss)`` runs the backward pass (default
    ``loss.backward()``)."""
    flags = {"model": model_name, "bottom": f"{NUM_DENSE}-16-{DIM}", "top": "16-1"}

    def train(trainer):
        model = example.build_model(flags, trainer, len(TABLE_ROWS), NUM_DENSE, DIM,
                                    config.seed).to(trainer.device)
        dense = config.dense_optimizer_config()
        optimizer = torch_optimizer(model.parameters(), dense["optimizer"], dense["lr"],
                                    dense["eps"])
        losses = []
        for batch in trainer:
            loss = loss_of(model(batch.dense, batch), batch.labels, batch.global_batch_size)
            optimizer.zero_grad()
            if backward is None:
                loss.backward()
            else:
                backward(loss)
            trainer.all_reduce_gradients(model.parameters())
            optimizer.step()
            losses.append(loss.item())
        trainer.flush()
        stats = trainer.stats()
        trainer.complete(dense=list(model.parameters()))
        return losses, stats

    with bagpipe.Job(config, data=batches, schema=schema) as job:
        results = job.run_trainers(train)
        job.finish()
    assert len(results) == (config.trainers or 1)  # 0: the default, one trainer
    if per_trainer:
        return results
    losses = [sum(shard) for shard in zip(*(losses for losses, _ in results))]
    return losses, [stats for _, stats in results]


class LinearLogReg(torch.nn.Module):
    """The textbook embedding-only head: nn.Linear over the flattened pooled embeddings (the
    example's LogReg computes the same with torch.addmv, which is cheaper)."""

    def __init__(self, linear, embeddings):
        super().__init__()
        self.linear = linear
        self.embeddings = embeddings

    def forward(self, dense, sparse):
        return self.linear(self.embeddings(sparse).reshape(len(dense), -1)).squeeze(1)


def torch_losses(example, config, schema, batches, model_name="dlrm", device="cpu"):
    flags = {"model": model_name, "bottom": f"{NUM_DENSE}-16-{DIM}", "top": "16-1"}
    tables = example.TorchEmbeddingBags(bagpipe.initial_embedding_weights(config, schema))
    model = example.build_model(flags, tables, len(TABLE_ROWS), NUM_DENSE, DIM, config.seed)
    if model_name == "logreg":
        model = LinearLogReg(model.linear, tables)
    model.to(device)
    dense = [p for name, p in model.named_parameters() if not name.startswith("embeddings.")]
    # The MLPs of a row-wise Adagrad job use plain Adagrad (docs/defaults.md).
    dense_kind = "adagrad" if config.optimizer == "rowwise-adagrad" else config.optimizer
    optimizer = torch_optimizer(dense, dense_kind, config.lr, config.eps)
    sparse = torch_optimizer(tables.parameters(), config.optimizer, config.lr, config.eps)
    losses = []
    for b in batches:
        ids = [torch.from_numpy(i).to(device) for i in b["ids"]]
        offsets = [torch.from_numpy(o).to(device) for o in b["offsets"]]
        logits = model(torch.from_numpy(b["dense"]).to(device), (ids, offsets))
        loss = loss_of(logits, torch.from_numpy(b["labels"]).to(device), BATCH)
        optimizer.zero_grad()
        sparse.zero_grad()
        loss.backward()
        optimizer.step()
        sparse.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer,lr,cache,trainers", [
    ("sgd", 0.1, "oracle", 1), ("adagrad", 0.01, "lru", 1), ("adagrad", 0.01, "oracle", 1),
    ("rowwise-adagrad", 0.01, "oracle", 1), ("sgd", 0.1, "oracle", 3),
    ("adagrad", 0.01, "oracle", 2), ("rowwise-adagrad", 0.01, "lru", 2)])
def test_bagpipe_equals_pure_pytorch(example, optimizer, lr, cache, trainers):
    torch.set_num_threads(1)
    config = bagpipe.Config(batch_size=BATCH, cache=cache, cache_rows=700, lookahead=5, dim=DIM,
                            optimizer=optimizer, lr=lr, eps=1e-10, seed=3, deterministic=True,
                            trainers=trainers)
    schema = bagpipe.Schema(table_rows=TABLE_ROWS, num_dense=NUM_DENSE)
    batches = make_batches(seed=11)
    ours, stats = bagpipe_losses(example, config, schema, batches)
    theirs = torch_losses(example, config, schema, batches)
    assert len(ours) == len(theirs) == ITERATIONS
    for s in stats:
        assert s["hits"] > 0 and s["fills"] > 0  # the cache held rows between iterations
        if trainers > 1:
            assert s["exchanged_rows"] > 0  # and the trainers exchanged shared rows' gradients
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    assert worst <= 1e-6, (f"{optimizer}, {trainers} trainer(s): losses differ by {worst:.2e} "
                           f"(relative)\n{ours}\n{theirs}")
    assert ours[-1] < ours[0]  # and it learns


def test_logreg_head_equals_nn_linear(example):
    # The example's embedding-only head (--model logreg, addmv) against nn.Linear on
    # nn.EmbeddingBag tables: the same model, within float rounding.
    torch.set_num_threads(1)
    config = bagpipe.Config(batch_size=BATCH, cache="oracle", cache_rows=700, lookahead=5,
                            dim=DIM, optimizer="adagrad", lr=0.01, eps=1e-10, seed=3,
                            deterministic=True)
    schema = bagpipe.Schema(table_rows=TABLE_ROWS, num_dense=NUM_DENSE)
    batches = make_batches(seed=11)
    ours, (stats,) = bagpipe_losses(example, config, schema, batches, "logreg")
    theirs = torch_losses(example, config, schema, batches, "logreg")
    assert len(ours) == len(theirs) == ITERATIONS
    assert stats["hits"] > 0 and stats["fills"] > 0
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    assert worst <= 1e-6, f"logreg: losses differ by {worst:.2e} (relative)\n{ours}\n{theirs}"
    assert ours[-1] < ours[0]


def test_the_comparison_can_fail(example):
    # A different eps on one side is visible: the test above would catch a mismatch.
    config = bagpipe.Config(batch_size=BATCH, cache="oracle", cache_rows=700, dim=DIM,
                            optimizer="adagrad", lr=0.01, eps=1e-10, seed=3, deterministic=True)
    schema = bagpipe.Schema(table_rows=TABLE_ROWS, num_dense=NUM_DENSE)
    batches = make_batches(seed=11)
    ours, _ = bagpipe_losses(example, config, schema, batches)
    config.eps = 1e-3
    theirs = torch_losses(example, config, schema, batches)
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) > 1e-6


def test_trainers_sharing_one_backward_thread_do_not_wait_for_each_other(example):
    # On a GPU every trainer's backward pass runs on autograd's one thread for that device. A
    # trainer that ended its iteration there would wait for the others' shared-row gradients
    # while their backward passes wait behind it: the job would stop at the peer timeout.
    torch.set_num_threads(1)
    config = bagpipe.Config(batch_size=BATCH, cache="oracle", cache_rows=700, lookahead=5,
                            dim=DIM, optimizer="adagrad", lr=0.01, eps=1e-10, seed=3,
                            deterministic=True, trainers=2, peer_timeout=20)
    schema = bagpipe.Schema(table_rows=TABLE_ROWS, num_dense=NUM_DENSE)
    batches = make_batches(seed=11)
    own = bagpipe_losses(example, config, schema, batches, per_trainer=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as backward_thread:
        shared = bagpipe_losses(example, config, schema, batches, per_trainer=True,
                                backward=lambda loss: backward_thread.submit(loss.backward).result())
    for (losses, stats), (own_losses, _) in zip(shared, own):
        assert len(losses) == ITERATIONS and stats["hits"] > 0 and stats["exchanged_rows"] > 0
        assert losses == own_losses  # bit for bit: the same iterations, ended in the same order


@pytest.mark.parametrize("model_name", ["logreg", "dlrm"])
def test_a_trainer_with_an_empty_share_of_the_last_batch_trains_as_one_trainer(example,
                                                                              model_name):
    # 65 samples in batches of 64: the last batch has 1 sample, and one of 2 trainers none.
    # Its backward (a 0-element gradient) and the example's models must take that.
    rng = np.random.default_rng(5)
    n = 65
    items = [{"dense": rng.standard_normal((n, NUM_DENSE)).astype(np.float32),
              "labels": (rng.random(n) < 0.3).astype(np.float32),
              "ids": [rng.integers(0, rows, n) for rows in TABLE_ROWS]}]
    schema = bagpipe.Schema(table_rows=TABLE_ROWS, num_dense=NUM_DENSE)
    flags = {"model": model_name, "bottom": f"{NUM_DENSE}-16-{DIM}", "top": "16-1"}

    def train(trainer, config):
        model = example.build_model(flags, trainer, len(TABLE_ROWS), NUM_DENSE, DIM,
                                    config.seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
        losses, shares = [], []
        for batch in trainer:
            loss = loss_of(model(batch.dense, batch), batch.labels, batch.global_batch_size)
            optimizer.zero_grad()
            loss.backward()
            trainer.all_reduce_gradients(model.parameters())
            optimizer.step()
            losses.append(loss.item())
            shares.append(batch.num_samples)
        trainer.flush()
        trainer.complete(dense=list(model.parameters()))
        return losses, shares, [p.detach().clone() for p in model.parameters()]

    results = {}
    for trainers in (1, 2):
        config = bagpipe.Config(batch_size=64, trainers=trainers, dim=DIM, optimizer="sgd",
                                lr=0.1, cache_rows=600, epochs=3, peer_timeout=30)
        with bagpipe.Job(config, data=items, schema=schema) as job:
            results[trainers] = job.run_trainers(train, config)
            summary = job.finish()
        assert summary["iterations"] == 6
    (one,) = results[1]
    assert one[1] == [64, 1] * 3
    shares = [shares for _, shares, _ in results[2]]
    assert [a + b for a, b in zip(*shares)] == [64, 1] * 3  # both trainers ran every iteration
    assert 0 in shares[0] + shares[1]  # and one of them had no sample of the last batch
    losses = [a + b for a, b in zip(*(losses for losses, _, _ in results[2]))]
    np.testing.assert_allclose(losses, one[0], rtol=1e-5)
    assert losses[2] != losses[0]  # it trained
    for mine, theirs in zip(results[2][0][2], one[2]):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
