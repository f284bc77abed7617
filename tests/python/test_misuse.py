"""Misuse of the Python API raises the documented exception with a clear message — never a
crash or a hang: calls out of order (UsageError), a gradient of the wrong shape, dtype, device
or layout (ValueError/TypeError), options that contradict each other (ConfigError), a job failed
on another thread or by its data (JobError with the root cause), Ctrl-C in the loop
(KeyboardInterrupt; every thread stops and the process exits)."""

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import bagpipe
from conftest import child_env, zero_step

DATA = "synthetic:samples=20000,tables=4,scale=0.0005,seed=4"


def small_config(**options):
    settings = dict(data=DATA, batch_size=64, iterations=6, cache="oracle", cache_rows=2000,
                    lookahead=4, dim=4, optimizer="sgd", lr=0.1, peer_timeout=60)
    settings.update(options)
    return bagpipe.Config(**settings)


def cuda_capsule(shape):
    """A DLPack capsule of a float32 tensor on cuda:0 (nothing is allocated there: the device
    check must reject it before anything reads it)."""

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                    ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

    class DLManagedTensor(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                    ("deleter", ctypes.c_void_p)]

    dims = (ctypes.c_int64 * len(shape))(*shape)
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(ctypes.c_void_p(0x1000), DLDevice(2, 0), len(shape),
                                 DLDataType(2, 32, 1), dims, None, 0)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(managed), b"dltensor", None), (managed, dims)


def test_calls_out_of_order_raise_usage_error_and_change_nothing():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        with pytest.raises(bagpipe.UsageError, match="no iteration to end"):
            trainer.end_iteration(torch.zeros(1, 4, 4))
        with pytest.raises(bagpipe.UsageError, match="^lookup_pooled: outside an iteration"):
            trainer.lookup_pooled()
        batch = trainer.begin_iteration()
        assert batch.dense.shape == (64, job.schema.num_dense) and batch.labels.shape == (64,)
        # The messages name the Python methods, not the runtime's C++ calls.
        with pytest.raises(bagpipe.UsageError,
                           match="^begin_iteration called twice without end_iteration"):
            trainer.begin_iteration()
        with pytest.raises(bagpipe.UsageError, match=r"^flush\(\) inside an iteration"):
            trainer.flush()
        zero_step(trainer)  # the trainer goes on as if nothing happened
        iterations = 1 + sum(1 for batch in trainer if zero_step(trainer) is None)
        assert iterations == 6
        with pytest.raises(bagpipe.UsageError, match="no iteration to end"):
            trainer.end_iteration(torch.zeros(64, 4, 4))
        trainer.flush()
        trainer.complete()
        with pytest.raises(bagpipe.UsageError, match="completed twice"):
            trainer.complete()
        summary = job.finish()
        # The loop reported no figures (complete() had no info): the runtime's own count.
        assert summary["iterations"] == iterations
        with pytest.raises(bagpipe.UsageError, match="finished"):
            trainer.begin_iteration()
        with pytest.raises(bagpipe.UsageError, match="twice"):
            job.finish()
    with pytest.raises(bagpipe.UsageError, match="closed"):
        trainer.begin_iteration()


# A trainer whose job another thread closes mid-run gets JobError (the job ended under it), not
# UsageError (which says nothing changed and the trainer can go on).
def test_a_trainer_running_when_another_thread_closes_the_job_gets_job_error():
    job = bagpipe.Job(small_config(iterations=1000000))
    (trainer,) = job.trainers
    errors, started, closed = [], threading.Event(), threading.Event()

    def run():
        try:
            for _ in trainer:
                started.set()
                closed.wait(60)  # the close lands between two calls of the loop
                zero_step(trainer)
        except Exception as error:  # noqa: BLE001 (the test looks at its type)
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(60)
    job.close()
    closed.set()
    thread.join(60)
    assert not thread.is_alive()
    assert len(errors) == 1 and type(errors[0]) is bagpipe.JobError, errors
    # A call after this thread's own close() is a call out of order: UsageError.
    job = bagpipe.Job(small_config())
    (trainer,) = job.trainers
    job.close()
    with pytest.raises(bagpipe.UsageError, match="the job is closed"):
        trainer.begin_iteration()


def test_tensors_of_the_wrong_shape_dtype_device_or_layout_raise():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        batch = trainer.begin_iteration()
        pooled = trainer.lookup_pooled()
        n, tables, dim = pooled.shape
        with pytest.raises(ValueError, match=r"expected shape \(64, 4, 4\), got \(64, 16\)"):
            trainer.end_iteration(torch.zeros(n, tables * dim))
        with pytest.raises(TypeError, match="expected float32, got float64"):
            trainer.end_iteration(torch.zeros(n, tables, dim, dtype=torch.float64))
        with pytest.raises(ValueError, match="contiguous"):
            trainer.end_iteration(torch.zeros(n, dim, tables).transpose(1, 2))
        capsule, keep = cuda_capsule([n, tables, dim])
        with pytest.raises(ValueError, match="expected a CPU tensor.*got cuda:0"):
            trainer.end_iteration(capsule)
        with pytest.raises(TypeError, match="expected a tensor"):
            trainer.end_iteration([[0.0]])
        with pytest.raises(TypeError, match="float32"):
            trainer.all_reduce_(torch.zeros(3, dtype=torch.int32))
        # A numpy array is a tensor too (DLPack), and a gradient that requires grad is fine.
        trainer.end_iteration(torch.zeros(n, tables, dim, requires_grad=True))
        assert batch.iteration == 0
        job.abort("test over")


def test_tensors_handed_out_stay_valid_and_their_buffers_are_recycled():
    # The pooled embeddings and the batch tensors live in the trainer's buffer pool: a tensor the
    # loop keeps is never written again, and a buffer nobody views serves a later iteration.
    with bagpipe.Job(small_config(iterations=5)) as job:
        (trainer,) = job.trainers
        kept = trainer.begin_iteration()
        kept_pooled = trainer.lookup_pooled()
        snapshot = (kept.dense.clone(), kept.labels.clone(), kept_pooled.clone())
        trainer.end_iteration(torch.zeros_like(kept_pooled))
        pointers = set()
        for batch in trainer:
            pooled = trainer.lookup_pooled()
            pointers.add(pooled.data_ptr())
            assert pooled.data_ptr() != kept_pooled.data_ptr()
            trainer.end_iteration(torch.ones_like(pooled))
            del pooled, batch
        assert torch.equal(kept.dense, snapshot[0]) and torch.equal(kept.labels, snapshot[1])
        assert torch.equal(kept_pooled, snapshot[2])
        assert len(pointers) == 1  # one buffer served iterations 1-4
        trainer.flush()
        trainer.complete()
        job.finish()


def test_options_that_contradict_each_other_are_config_errors():
    with pytest.raises(TypeError, match="unknown option 'cache_size'"):
        bagpipe.Config(cache_size=10)
    with pytest.raises(bagpipe.ConfigError, match="unknown cache policy"):
        bagpipe.Config(cache="bellady")
    with pytest.raises(bagpipe.ConfigError, match="--oracle-split-parts 2.*--trainers 2"):
        bagpipe.Job(small_config(trainers=2, oracle_split_parts=2))
    with pytest.raises(bagpipe.ConfigError, match="--eps 0"):
        bagpipe.Job(small_config(optimizer="adagrad", eps=0.0))
    with pytest.raises(bagpipe.ConfigError, match="--dense-lr -1"):
        bagpipe.Job(small_config(dense_lr=-1.0))
    with pytest.raises(bagpipe.ConfigError, match="needs a schema"):
        bagpipe.Job(small_config(), data=[])
    with pytest.raises(bagpipe.ConfigError, match="data given twice"):
        bagpipe.Job(small_config(), data=[], schema=bagpipe.Schema([5]))
    with pytest.raises(bagpipe.ConfigError, match="goes with data from an iterable"):
        bagpipe.Job(small_config(), schema=bagpipe.Schema([5]))
    config, flags = bagpipe.parse_train_args(["--cache", "lru", "--dense-lr", "0", "--trainers",
                                              "3", "--model", "logreg"])
    assert (config.cache, config.dense_lr, config.trainers, flags["model"]) == ("lru", 0, 3,
                                                                                "logreg")
    assert bagpipe.parse_train_args([])[0].dense_lr is None
    with pytest.raises(SystemExit) as exit_info:
        bagpipe.parse_train_args(["--no-such-flag"])
    assert exit_info.value.code == 2


def test_bad_flag_values_and_data_specs_name_what_is_wrong(capsys):
    for args, message in [(["--batch-size", "0"], "--batch-size: 0 must be > 0"),
                          (["--iterations", "-1"], "--iterations: -1 must be >= 0"),
                          (["--dim", "abc"], "--dim: 'abc' is not an integer")]:
        with pytest.raises(SystemExit) as exit_info:
            bagpipe.parse_train_args(args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, args
    with pytest.raises(bagpipe.ConfigError, match="synthetic: 'samples' is given twice"):
        bagpipe.Job(small_config(data="synthetic:samples=10,samples=20"))
    with pytest.raises(bagpipe.ConfigError, match="tables=4 but rows= lists 2 tables"):
        bagpipe.Job(small_config(data="synthetic:tables=4,rows=10/20"))
    # Data that is no iterable is named at once (eval_data=5 failed later, as a JobError).
    with pytest.raises(TypeError, match="Job: eval_data must be an iterable of batches "
                                        r"\(dicts\), got int"):
        bagpipe.Job(small_config(), eval_data=5)
    with pytest.raises(TypeError, match=r"Job: data must be .* got str \(a data source's name "
                                        r"goes in config.data\)"):
        bagpipe.Job(small_config(), data="synthetic:samples=10")


def test_a_trainer_thread_that_raises_stops_the_others_with_the_root_cause():
    seen = {}

    def loop(trainer):
        try:
            for i, batch in enumerate(trainer):
                if trainer.id == 1 and i == 3:
                    raise ValueError("trainer 1 broke")
                zero_step(trainer)
                trainer.all_reduce_(torch.ones(4))
        except bagpipe.JobError as error:
            seen[trainer.id] = error
            raise

    start = time.monotonic()
    with pytest.raises(ValueError, match="trainer 1 broke"):
        with bagpipe.Job(small_config(trainers=2, iterations=40)) as job:
            job.run_trainers(loop)
    assert "trainer 1 broke" in str(seen[0])  # trainer 0's blocked call raised JobError
    assert "trainer 1 broke" in job.aborted
    assert time.monotonic() - start < 30, "the job waited for a peer timeout (60 s)"


def test_an_all_reduce_only_some_trainers_call_is_named_not_blamed_on_a_server():
    def loop(trainer):
        for batch in trainer:
            zero_step(trainer)
            if trainer.id == 0 and batch.iteration == 2:
                trainer.all_reduce_(torch.ones(3))  # trainer 1 does not join it
        trainer.flush()

    # Whichever rank times out first names it: trainer 1 (trainer 0's part waits in its
    # mailbox), trainer 0 (inside the all-reduce) or the server (trainer 0's write-backs).
    with pytest.raises(bagpipe.JobError, match="all-reduce") as error:
        with bagpipe.Job(small_config(trainers=2, peer_timeout=2)) as job:
            job.run_trainers(loop)
    message = str(error.value)
    assert ("the same all-reduces" in message
            or "an all-reduce not every trainer calls" in message), message


def batches_for(schema, count, bad=None):
    rng = np.random.default_rng(0)
    for i in range(count):
        item = {"dense": rng.standard_normal((32, schema.num_dense)).astype(np.float32),
                "labels": (rng.random(32) < 0.5).astype(np.float32),
                "ids": [rng.integers(0, rows, 32) for rows in schema.table_rows]}
        if i == 2 and bad is not None:
            item = bad(item)
        yield item


@pytest.mark.parametrize("bad,message", [
    (lambda item: {**item, "ids": [np.full(32, 99), item["ids"][1]]}, "table0"),
    (lambda item: {k: v for k, v in item.items() if k != "labels"}, "needs 'labels'"),
    (lambda item: {**item, "offsets": [np.arange(31), np.arange(32)]}, "31 offsets for 32"),
    (lambda item: 1 / 0, "ZeroDivisionError"),
    # [16, 2] labels are not 32 samples: named as the labels' shape, not a dense mismatch.
    (lambda item: {**item, "labels": item["labels"].reshape(16, 2)},
     r"labels: expected shape \(n,\) or \(n, 1\), got \(16, 2\)"),
    (lambda item: {**item, "labels": item["labels"][:0]}, r"dense: expected shape \(0, 2\)"),
    (lambda item: {**item, "labels": 1.0},
     r"labels: expected shape \(n,\) or \(n, 1\), got \(\) \(a scalar\)"),
])
def test_bad_data_from_an_iterable_fails_the_job_with_its_message(bad, message):
    schema = bagpipe.Schema(table_rows=[10, 20], num_dense=2)
    config = bagpipe.Config(batch_size=32, cache_rows=100, dim=4, optimizer="sgd",
                            peer_timeout=60)
    with bagpipe.Job(config, data=batches_for(schema, 6, bad), schema=schema) as job:
        (trainer,) = job.trainers
        with pytest.raises(bagpipe.JobError, match=message):
            for batch in trainer:
                zero_step(trainer)


def test_an_item_without_samples_is_skipped_and_labels_may_be_a_column():
    # A loader's empty last batch (or an empty shard) among full ones: skipped, the samples
    # around it train as if it were not there. Labels shaped [n, 1] are n labels.
    schema = bagpipe.Schema(table_rows=[10, 20], num_dense=2)
    config = bagpipe.Config(batch_size=32, cache_rows=100, dim=4, optimizer="sgd",
                            peer_timeout=60)

    def empty(item):
        return {"dense": np.zeros((0, 2), np.float32), "labels": np.zeros(0, np.float32),
                "ids": [np.zeros(0, np.int64), np.zeros(0, np.int64)]}

    def column(item):
        return {**item, "labels": item["labels"].reshape(32, 1)}

    results = []
    for bad in (None, empty, column):
        with bagpipe.Job(config, data=list(batches_for(schema, 6, bad)), schema=schema) as job:
            (trainer,) = job.trainers
            for batch in trainer:
                zero_step(trainer)
            trainer.flush()
            trainer.complete()
            results.append(job.finish())
    full, skipped, columns = results
    assert full["iterations"] == 6 and skipped["iterations"] == 5
    assert columns["iterations"] == 6


INTERRUPTED = """
import sys, time, torch, bagpipe
trainers, mode = int(sys.argv[1]), sys.argv[2]
config = bagpipe.Config(data="synthetic:samples=100000000,tables=4,scale=0.0005,seed=1",
                        batch_size=64, iterations=10000000, trainers=trainers, cache_rows=4000,
                        dim=4, optimizer="sgd", peer_timeout=60)
def loop(trainer):
    for i, batch in enumerate(trainer):
        if i == 2 and trainer.id == 0:
            print("training", flush=True)
        if mode == "stall" and trainer.id == 1 and i == 3:
            # Trainer 0 goes on and blocks in the runtime, waiting for this one.
            while job.aborted is None:
                time.sleep(0.05)
            raise bagpipe.JobError(job.aborted)
        pooled = trainer.lookup_pooled()
        trainer.end_iteration(torch.zeros_like(pooled))
        trainer.all_reduce_(torch.ones(2))
with bagpipe.Job(config) as job:
    job.run_trainers(loop)
"""


@pytest.mark.parametrize("trainers,mode", [(1, "run"), (2, "run"), (2, "stall")])
def test_ctrl_c_stops_the_job_and_every_thread(trainers, mode):
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(trainers), mode],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
                             text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 120)
        assert ready and child.stdout.readline().strip() == "training", child.stderr.read()
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
            pytest.fail("the process did not end within 60 s of SIGINT: a thread hung")
    assert child.returncode != 0
    assert "KeyboardInterrupt" in stderr, stderr
    assert "Segmentation" not in stderr and "Abort" not in stderr.replace("aborted", "")
    assert time.monotonic() - sent < 30, "stopping waited for a peer timeout (60 s)"


def test_embedding_bags_refuse_a_batch_that_is_not_the_trainers_current_one():
    config = small_config(trainers=2)
    with bagpipe.Job(config) as job:
        t0, t1 = job.trainers
        tables0 = bagpipe.EmbeddingBags(t0)
        got = {}
        ready, go = threading.Event(), threading.Event()

        def other():  # trainer 1 ends its iterations alongside (they exchange shared rows)
            got["batch"] = t1.begin_iteration()
            ready.set()
            go.wait(30)
            zero_step(t1)
            t1.begin_iteration()
            zero_step(t1)

        thread = threading.Thread(target=other)
        thread.start()
        b0 = t0.begin_iteration()
        ready.wait(30)
        with pytest.raises(bagpipe.UsageError, match=r"EmbeddingBags: bagpipe.Batch\(iteration "
                                                     r"0, .* trainer 1\) belongs to another "
                                                     r"trainer, not to trainer 0"):
            tables0(got["batch"])
        go.set()
        with pytest.raises(bagpipe.UsageError, match="Batch.pooled: .* is not trainer 0's "
                                                     "current batch"):
            bagpipe.Batch(t0, 0, 1, 1, None, None, False).pooled  # noqa: B018  (a made-up one)
        kept = tables0(b0)
        kept.sum().backward()
        b1 = t0.begin_iteration()
        assert b1.iteration == 1
        with pytest.raises(bagpipe.UsageError, match=r"EmbeddingBags: bagpipe.Batch\(iteration "
                                                     r"0, .*\) is not trainer 0's current batch"):
            tables0(b0)  # a stale batch: the runtime holds iteration 1's rows
        with pytest.raises(bagpipe.UsageError, match="Batch.pooled: .* is not trainer 0's "
                                                     "current batch"):
            b0.pooled  # noqa: B018  (its first access: nothing was looked up while current)
        assert torch.equal(tables0(b1).detach(), b1.pooled)  # the current batch works
        zero_step(t0)
        thread.join()
        job.abort("test over")


def test_two_lookups_of_one_iteration_sum_their_gradients_as_nn_embedding_bag():
    schema = bagpipe.Schema(table_rows=[6], num_dense=0)
    ids = [np.array([1, 2, 1]), np.array([3, 1, 4]), np.array([1, 5, 2])]
    items = [{"labels": np.ones(3, np.float32), "ids": [i]} for i in ids]
    config = bagpipe.Config(batch_size=3, cache_rows=6, dim=2, optimizer="sgd", lr=0.5,
                            peer_timeout=15, lookahead=1)
    weights = bagpipe.initial_embedding_weights(config, schema)[0]

    def loss_of(a, c):  # the tables used twice, by two branches of the model
        return 2 * a.sum() + (3 * c * c).sum()

    bag = torch.nn.EmbeddingBag.from_pretrained(weights.clone(), freeze=False, mode="sum")
    optimizer = torch.optim.SGD(bag.parameters(), lr=0.5)
    expected = []
    for i in ids:
        index = torch.from_numpy(i)
        offsets = torch.arange(len(i))
        expected.append(bag(index, offsets).detach().clone())
        optimizer.zero_grad()
        loss_of(bag(index, offsets), bag(index, offsets)).backward()
        optimizer.step()

    with bagpipe.Job(config, data=items, schema=schema) as job:
        (trainer,) = job.trainers
        tables = bagpipe.EmbeddingBags(trainer)
        got = []
        for batch in trainer:
            a, c = tables(batch), tables(batch)
            assert a.data_ptr() != c.data_ptr()  # independent tensors, as two bag calls return
            got.append(a.detach().clone())
            loss_of(a, c).backward()
        trainer.flush()
        trainer.complete()
        job.finish()
    assert len(got) == 3
    assert not torch.equal(got[1], expected[0][[1, 0, 1]])  # the rows moved
    for iteration, (mine, theirs) in enumerate(zip(got, expected)):
        assert torch.allclose(mine[:, 0], theirs, rtol=1e-6, atol=1e-6), iteration


def test_a_second_backward_in_one_iteration_is_a_usage_error_naming_it():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        tables = bagpipe.EmbeddingBags(trainer)
        batch = trainer.begin_iteration()
        a = tables(batch)
        a.sum().backward(retain_graph=True)
        with pytest.raises(bagpipe.UsageError, match="backpropagated twice in one iteration .*"
                                                     "nothing more was applied"):
            a.sum().backward()
        with pytest.raises(bagpipe.UsageError, match="iteration 0 already ended"):
            tables(batch)
        assert trainer.begin_iteration().iteration == 1
        zero_step(trainer)
        job.abort("test over")


def test_a_refused_gradient_from_a_backward_on_another_thread_leaves_the_iteration_open():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        tables = bagpipe.EmbeddingBags(trainer)
        batch = trainer.begin_iteration()
        out = tables(batch)
        # Autograd's device threads run a CUDA backward: the loop's next call ends the iteration.
        worker = threading.Thread(target=lambda: (out * float("nan")).sum().backward())
        worker.start()
        worker.join()
        with pytest.raises(ValueError, match="pooled_grad: .* is nan"):
            trainer.stats()
        # Still open, as the message says: the tables look up anew and the iteration ends.
        tables(batch).sum().backward()
        assert trainer.begin_iteration().iteration == 1
        assert job.aborted is None
        job.abort("test over")


def test_complete_before_the_last_iteration_is_a_usage_error_that_changes_nothing():
    with bagpipe.Job(small_config(iterations=3)) as job:
        (trainer,) = job.trainers
        trainer.begin_iteration()
        zero_step(trainer)
        for _ in range(2):  # as flush's, and again
            with pytest.raises(bagpipe.UsageError, match="complete: Flush before the end of "
                                                         "training: iteration 1 was never run.*"
                                                         "nothing was done"):
                trainer.complete()
        assert job.aborted is None
        iterations = 1
        for _ in trainer:
            zero_step(trainer)
            iterations += 1
        trainer.complete()  # flushes
        assert iterations == 3 and job.finish()["iterations"] == 3


@pytest.mark.parametrize("predictions,labels,expected", [
    ([0.9, 2.5, 0.1], [1, 0, 1], r"predictions: element 1 is 2.5, not in \[0, 1\] "
                                  r"\(probabilities: pass torch.sigmoid"),
    ([0.9, 0.2, float("nan")], [1, 0, 1], r"predictions: element 2 is nan, not in \[0, 1\]"),
    (torch.tensor([0.5, 0.5, 0.5]), [1, 3, -1], r"labels: element 1 is 3.0, not in \[0, 1\]"),
])
def test_complete_refuses_predictions_or_labels_that_are_no_probabilities(predictions, labels,
                                                                          expected):
    with bagpipe.Job(small_config(iterations=2)) as job:
        (trainer,) = job.trainers
        for _ in trainer:
            zero_step(trainer)
        trainer.flush()
        with pytest.raises(ValueError, match="complete: " + expected + ".*nothing was done"):
            trainer.complete(predictions=predictions, labels=labels)
        trainer.complete(predictions=[0.9, 0.2, 0.6], labels=[1, 0, 1])  # nothing changed
        summary = job.finish()
    assert summary["eval"]["samples"] == 3


def test_a_trainer_function_returning_before_its_training_ended_fails_at_once():
    # The other trainer would wait for its exchanges until the peer timeout (60 s here).
    def train(trainer):
        for batch in trainer:
            if trainer.id == 1 and batch.iteration == 2:
                return "early"
            zero_step(trainer)
        trainer.flush()
        trainer.complete()

    start = time.monotonic()
    with bagpipe.Job(small_config(trainers=2)) as job:
        with pytest.raises(bagpipe.UsageError,
                           match=r"trainer 1's function returned before its training ended "
                                 r"\(flush\(\) inside an iteration: end the iteration first"):
            job.run_trainers(train)
        assert "trainer 1's function returned before" in job.aborted
    assert time.monotonic() - start < 30


def test_a_loop_that_counts_its_iterations_and_returns_without_flushing_is_fine():
    # Every iteration run, then the function returns: run_trainers flushes (as finish() would).
    def train(trainer):
        for _ in range(6):
            trainer.begin_iteration()
            zero_step(trainer)
        return trainer.id

    with bagpipe.Job(small_config(trainers=2)) as job:
        assert job.run_trainers(train) == [0, 1]
        assert job.finish()["iterations"] == 6

    def short(trainer):
        for _ in range(6 if trainer.id == 0 else 4):
            trainer.begin_iteration()
            zero_step(trainer)

    with bagpipe.Job(small_config(trainers=2)) as job:
        with pytest.raises(bagpipe.UsageError, match=r"trainer 1's function returned before its "
                           r"training ended \(flush\(\) before the end of training: iteration "
                           r"4 was never run"):
            job.run_trainers(short)


BLOCKED_ITERABLE = """
import queue, threading, time, numpy as np, torch, bagpipe
feed = queue.Queue()  # a loader that stalls after 8 batches, until the end of the test
rng = np.random.default_rng(0)
for _ in range(8):
    feed.put({"dense": rng.random((64, 3), dtype=np.float32),
              "labels": (rng.random(64) > 0.5).astype(np.float32),
              "ids": [rng.integers(0, 100, 64), rng.integers(0, 200, 64)]})
def batches():
    while True:
        yield feed.get()
def train(trainer):
    for batch in trainer:
        if batch.iteration == 1:
            # Fail once the oracle waits in the stalled loader (on a loaded machine the loop can
            # get here before the oracle has read the 8 batches).
            deadline = time.monotonic() + 20
            while not feed.empty() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)
            raise RuntimeError("the loop failed")
        trainer.end_iteration(torch.zeros(batch.num_samples, trainer.num_tables, trainer.dim))
start = time.monotonic()
try:
    with bagpipe.Job(bagpipe.Config(batch_size=64, dim=4, iterations=100, lookahead=2,
                                    peer_timeout=60),
                     data=batches(), schema=bagpipe.Schema(table_rows=[100, 200],
                                                           num_dense=3)) as job:
        job.run_trainers(train)
except RuntimeError as error:
    print("raised", error, "after", round(time.monotonic() - start), "s", flush=True)
"""


def test_closing_an_aborted_job_does_not_wait_for_a_blocked_data_iterable():
    # The oracle's thread waits in the iterable (a stalled loader) when the loop fails: leaving
    # the `with` block returns (the thread is left to end when the iterable returns) and the
    # process exits.
    result = subprocess.run([sys.executable, "-c", BLOCKED_ITERABLE], env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "raised the loop failed after" in result.stdout
    assert "its reading thread is left to end when it does" in result.stderr


def test_a_gradient_with_the_negative_bit_is_refused_not_read_negated():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        trainer.begin_iteration()
        pooled = trainer.lookup_pooled()
        lazy = (-torch.ones_like(pooled))._neg_view()
        with pytest.raises(ValueError, match=r"negative bit set .*resolve_neg"):
            trainer.end_iteration(lazy)
        trainer.end_iteration(lazy.resolve_neg())


SIGINT_WHILE_COUNTING = """
import os, signal, threading, time, bagpipe
# Counting 20 million synthetic samples for eval_fraction takes minutes; Ctrl-C ends it at once.
config = bagpipe.Config(data="synthetic:samples=20000000,tables=4", eval_fraction=0.1,
                        batch_size=1024)
start = time.monotonic()
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    bagpipe.Job(config).close()
    print("opened")
except KeyboardInterrupt:
    print("KeyboardInterrupt after", time.monotonic() - start)
"""


def test_ctrl_c_while_the_data_are_scanned_raises_keyboard_interrupt_at_once():
    result = subprocess.run([sys.executable, "-c", SIGINT_WHILE_COUNTING], env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[0] == "KeyboardInterrupt", result.stdout
    assert float(words[-1]) < 20


def test_a_run_directory_is_held_by_one_job(tmp_path):
    run = tmp_path / "run"
    with bagpipe.RunDirectoryLock(str(run)) as held:  # creates the directory
        assert held.path == str(run / ".bagpipe-run.lock")
        with pytest.raises(bagpipe.ConfigError, match=f"run directory {run} is in use by another "
                                                      f"job \\(pid {os.getpid()} holds the lock"):
            bagpipe.RunDirectoryLock(str(run))
    bagpipe.RunDirectoryLock(str(run)).release()  # free again


def test_finish_does_not_write_into_a_run_directory_another_process_holds(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, b'%d\\n' % os.getpid())\n"
         "print('held', flush=True)\n"
         "time.sleep(120)\n", str(run / ".bagpipe-run.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with bagpipe.Job(small_config()) as job:
            job.run_trainers(lambda trainer: (
                [zero_step(trainer) for _ in trainer], trainer.flush(), trainer.complete()))
            with pytest.raises(bagpipe.ConfigError,
                               match=f"run directory {run} is in use by another job "
                                     f"\\(pid {holder.pid} holds"):
                job.finish(out=str(run))
            assert not (run / "summary.json").exists()
            # Refused before the job ended: another directory still takes the summary.
            assert job.finish(out=str(tmp_path / "other"))["iterations"] == 6
        # The caller's own lock on the directory is this job's.
        holder.kill()
        holder.wait()
        with bagpipe.RunDirectoryLock(str(run)), bagpipe.Job(small_config()) as job:
            job.run_trainers(lambda trainer: (
                [zero_step(trainer) for _ in trainer], trainer.flush(), trainer.complete()))
            assert job.finish(out=str(run))["iterations"] == 6
        assert (run / "summary.json").exists()
    finally:
        holder.kill()
        holder.wait()


FORKED_WITH_AN_OPEN_JOB = """
import os, sys
import bagpipe
job = bagpipe.Job(bagpipe.Config(data="synthetic:samples=2000,tables=2,scale=0.0005",
                                 batch_size=64, iterations=4, cache="oracle", cache_rows=500,
                                 trainers=2, dim=4))
pid = os.fork()
if pid == 0:
    job.close()  # the parent's job: nothing to close here
    sys.exit(0)  # the child's exit must not join the parent's runtime threads
_, status = os.waitpid(pid, 0)
print("signal" if os.WIFSIGNALED(status) else "exit", os.WTERMSIG(status) if os.WIFSIGNALED(status)
      else os.WEXITSTATUS(status))
job.close()
"""


# GCC 12's AddressSanitizer runtime (preloaded by scripts/sanitize.sh asan) does not take its
# allocator's locks around fork(): a child forked while a runtime thread allocates inherits a held
# lock and blocks in its first malloc (seen: Py_FinalizeEx -> realloc ->
# SizeClassAllocator64::GetFromAllocator). glibc's malloc resets its locks in the child.
forks_with_threads = pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="the preloaded AddressSanitizer runtime is not fork-safe with threads")


@forks_with_threads
def test_a_forked_child_of_a_process_with_an_open_job_exits_cleanly():
    result = subprocess.run([sys.executable, "-c", FORKED_WITH_AN_OPEN_JOB], env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["exit", "0"], result.stdout + result.stderr


FORK_LOADER = """
import os, signal, sys
import torch
import bagpipe
mode, checkpoints = sys.argv[1], sys.argv[2]

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"labels": torch.randint(0, 2, (128,), generator=g).float(),
                "dense": torch.rand(128, 3, generator=g),
                "ids": [torch.randint(0, 500, (128,), generator=g) for _ in range(4)]}

loader = torch.utils.data.DataLoader(Rows(), batch_size=None, num_workers=2,
                                     multiprocessing_context="fork")
options = dict(batch_size=256, dim=4, iterations=10)
if mode == "ctrl-c":
    options.update(iterations=100000, checkpoint_dir=checkpoints, checkpoint_every=1000)

def loop(trainer):
    for batch in trainer:
        if mode == "ctrl-c" and batch.iteration == 20:
            os.killpg(os.getpgid(0), signal.SIGINT)  # a terminal's Ctrl-C: the workers get it too
        pooled = trainer.lookup_pooled()
        trainer.end_iteration(torch.zeros_like(pooled))
    trainer.flush()

with bagpipe.Job(bagpipe.Config(**options), data=loader,
                 schema=bagpipe.Schema(table_rows=[500] * 4, num_dense=3)) as job:
    job.run_trainers(loop)
    try:
        print("finished", job.finish()["iterations"])
    except bagpipe.Stopped as stopped:
        print("stopped", stopped.signal, os.path.isdir(stopped.checkpoint))
print("closed", flush=True)
"""


# A DataLoader's forked workers inherit the socket Ctrl-C reaches the job through: they must not
# keep the job from closing (it waited for that socket's end forever), nor pass their own
# signals on to it (one Ctrl-C to the process group counted as three, the "second" one aborting
# the job instead of stopping it with a checkpoint). The workers die of that Ctrl-C; the batch
# the job was reading then fails, but the stop needs no more batches.
@forks_with_threads
@pytest.mark.parametrize("mode", ["finish", "ctrl-c"])
def test_a_job_fed_by_forked_dataloader_workers_closes_and_stops(tmp_path, mode):
    result = subprocess.run([sys.executable, "-c", FORK_LOADER, mode, str(tmp_path / "ckpt")],
                            env=child_env(), capture_output=True, text=True, timeout=120,
                            start_new_session=True)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = ["finished 10"] if mode == "finish" else [f"stopped {int(signal.SIGINT)} True"]
    assert result.stdout.splitlines() == expected + ["closed"], result.stdout + result.stderr


PLAIN_JOB_BESIDE_A_CHECKPOINTING_ONE = """
import os, signal, sys, threading, time
import torch
import bagpipe
plain = bagpipe.Job(bagpipe.Config(data="synthetic:samples=5000000,tables=4,scale=0.001",
                                   batch_size=64, dim=4, iterations=1000000))
beside = bagpipe.Job(bagpipe.Config(data="synthetic:samples=2000,tables=2,scale=0.0005",
                                    batch_size=64, dim=4, iterations=4,
                                    checkpoint_dir=sys.argv[1]))
started, outcome = threading.Event(), []

def loop(trainer):
    for batch in trainer:
        started.set()
        trainer.end_iteration(torch.zeros_like(trainer.lookup_pooled()))
    trainer.flush()

def run():
    try:
        plain.run_trainers(loop)
        outcome.append("ran to the end")
    except bagpipe.JobError as error:
        outcome.append(str(error))

thread = threading.Thread(target=run)
thread.start()
started.wait(60)
os.kill(os.getpid(), signal.SIGINT)
thread.join(30)
print(outcome, thread.is_alive(), plain.aborted)
plain.abort()
thread.join()
plain.close()
beside.close()
"""


# The stop handlers the job with checkpoints installed were taken for the caller's own SIGINT
# handler: the plain job trained on through Ctrl-C.
def test_ctrl_c_aborts_a_plain_job_while_a_job_with_checkpoints_is_open(tmp_path):
    result = subprocess.run([sys.executable, "-c", PLAIN_JOB_BESIDE_A_CHECKPOINTING_ONE,
                             str(tmp_path / "ckpt")], env=child_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "interrupted (SIGINT)" in result.stdout and "False" in result.stdout, result.stdout


CLOSED_WHILE_ITS_LOADER_BLOCKS = """
import threading, time
import numpy as np
import bagpipe
gate = threading.Event()

class Blocking:
    def __iter__(self):
        for i in range(1000):
            if i == 3:
                gate.wait(30)  # a loader blocked on a queue
            yield {"labels": np.zeros(64, np.float32), "dense": np.zeros((64, 2), np.float32),
                   "ids": [np.arange(64), np.arange(64)]}

job = bagpipe.Job(bagpipe.Config(batch_size=64, dim=4, iterations=50), data=Blocking(),
                  schema=bagpipe.Schema(table_rows=[100, 100], num_dense=2))
time.sleep(0.5)
job.close()  # its reading thread is left to end when the iterable returns
gate.set()   # which it does as the interpreter exits
print("exiting", flush=True)
"""


# The reading thread came back from the iterable during the interpreter's finalisation and
# crashed the process (a segmentation fault, or an abort); the exit now waits for it.
def test_the_exit_waits_for_a_closed_jobs_reading_thread():
    result = subprocess.run([sys.executable, "-c", CLOSED_WHILE_ITS_LOADER_BLOCKS],
                            env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["exiting"]
    assert "left to end when it does" in result.stderr
