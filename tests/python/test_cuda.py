"""The PyTorch path on a GPU (device="cuda", --device cuda): the checks the CPU suites make, on
CUDA tensors. The batch's tensors and the pooled embeddings are CUDA tensors of the trainer's
device; the torch.nn DLRM trained through bagpipe equals the pure-PyTorch model with
nn.EmbeddingBag tables on the same GPU (losses within 1e-6, relative), with 1-3 trainers; the
example's cache modes end bit-identical (--deterministic); trainers each on a side stream of
PyTorch's end with the parameters of the loop on the default stream (the device contract's
stream order); a stopped and resumed job equals an uninterrupted one; a CPU tensor handed to a
CUDA trainer is refused. Skipped (ctest: Not Run) where the package was built without CUDA or
PyTorch sees no GPU (run_pytest.sh)."""

import pytest
import torch

import bagpipe
from bagpipe import _core

if not (_core.cuda_compiled_in() and torch.cuda.is_available()):
    pytest.skip("needs a CUDA build of bagpipe and a GPU PyTorch can use",
                allow_module_level=True)

import test_checkpoint as checkpoint  # noqa: E402  (after the skip)
import test_pytorch_equivalence as equivalence  # noqa: E402
import test_example as example_checks  # noqa: E402


@pytest.fixture(autouse=True)
def exact_float32_matmul():
    # Both sides of every comparison run PyTorch's CUDA kernels; TF32 would round the dense
    # model's products to 10 bits and hide differences of the embeddings.
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def equivalence_config(optimizer, lr, cache, trainers):
    return bagpipe.Config(batch_size=equivalence.BATCH, cache=cache, cache_rows=700, lookahead=5,
                          dim=equivalence.DIM, optimizer=optimizer, lr=lr, eps=1e-10, seed=3,
                          deterministic=True, trainers=trainers, device="cuda")


@pytest.mark.parametrize("optimizer,lr,cache,trainers", [
    ("sgd", 0.1, "oracle", 1), ("adagrad", 0.01, "lru", 1), ("rowwise-adagrad", 0.01, "oracle", 1),
    ("adagrad", 0.01, "oracle", 2), ("sgd", 0.1, "oracle", 3)])
def test_bagpipe_equals_pure_pytorch_on_the_gpu(example, optimizer, lr, cache, trainers):
    config = equivalence_config(optimizer, lr, cache, trainers)
    schema = bagpipe.Schema(table_rows=equivalence.TABLE_ROWS, num_dense=equivalence.NUM_DENSE)
    batches = equivalence.make_batches(seed=11)
    ours, stats = equivalence.bagpipe_losses(example, config, schema, batches)
    theirs = equivalence.torch_losses(example, config, schema, batches, device="cuda")
    assert len(ours) == len(theirs) == equivalence.ITERATIONS
    for s in stats:
        assert s["hits"] > 0 and s["fills"] > 0
        if trainers > 1:
            assert s["exchanged_rows"] > 0
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print(f"cuda {optimizer} {cache} {trainers} trainer(s): worst relative loss difference "
          f"{worst:.2e}")
    assert worst <= 1e-6, (f"{optimizer}, {trainers} trainer(s) on the GPU: losses differ by "
                           f"{worst:.2e} (relative)\n{ours}\n{theirs}")
    assert ours[-1] < ours[0]


@pytest.mark.parametrize("trainers", [1, 2])
def test_example_cache_modes_end_bit_identical_on_the_gpu(example, tmp_path, trainers):
    example_checks.check_cache_modes_end_bit_identical(example, tmp_path, trainers, "cuda")


def test_a_side_stream_per_trainer_gets_the_default_streams_result(tmp_path):
    # The device contract: the runtime waits for the work the loop queued on PyTorch's current
    # stream, and that stream waits for the runtime's. Each trainer on a stream of its own must
    # end with the parameters of the loop on the default stream.
    config = checkpoint.make_config("oracle", 2, iterations=12, device="cuda")
    default, _ = checkpoint.run(config, tmp_path, "default")
    side, _ = checkpoint.run(config, tmp_path, "side",
                             context=lambda: torch.cuda.stream(torch.cuda.Stream()))
    assert default["hit_rate"] > 0 and default["exchanged_rows"] > 0
    assert side["params_sha256"] == default["params_sha256"]


def test_stopped_and_resumed_on_the_gpu_equals_uninterrupted(tmp_path):
    whole, _ = checkpoint.run(checkpoint.make_config("lru", 2, device="cuda"), tmp_path, "whole")
    assert whole["hit_rate"] > 0
    checkpoints = tmp_path / "ckpt"
    stopped, _ = checkpoint.run_stopped(
        checkpoint.make_config("lru", 2, device="cuda", checkpoint_dir=str(checkpoints)),
        stop_at=3)
    assert 3 <= stopped.iteration < checkpoint.ITERATIONS
    resumed, results = checkpoint.run(
        checkpoint.make_config("lru", 2, device="cuda", resume=str(checkpoints)), tmp_path,
        "resumed")
    assert all(steps == checkpoint.ITERATIONS - stopped.iteration for steps, _ in results)
    assert resumed["params_sha256"] == whole["params_sha256"]


def test_tensors_on_the_wrong_device_are_refused():
    config = checkpoint.make_config("oracle", 1, iterations=4, device="cuda", deterministic=False)
    with bagpipe.Job(config) as job:
        (trainer,) = job.trainers
        assert trainer.device == torch.device("cuda", 0)
        batch = trainer.begin_iteration()
        assert batch.dense.device == trainer.device and batch.labels.device == trainer.device
        pooled = trainer.lookup_pooled()
        assert pooled.device == trainer.device
        with pytest.raises(ValueError, match="expected a tensor on cuda:0.*got cpu"):
            trainer.end_iteration(torch.zeros(pooled.shape))
        with pytest.raises(ValueError, match="expected a tensor on cuda:0.*got cpu"):
            trainer.all_reduce_(torch.zeros(3))
        trainer.end_iteration(torch.zeros_like(pooled))  # the right one is taken
        assert trainer.begin_iteration().iteration == 1
        job.abort("test over")
