"""A hostile user's inputs end in a Python exception that names what is wrong — never a crash, a
hang, a leaked thread or silent NaN training: options of the wrong type or out of range, NUL
characters in paths, non-finite or stale gradients, parameters that are no dense tensors,
run_trainers called twice, a Job dropped without close(), exceptions of every kind in the loop."""

import gc
import json
import math
import pathlib
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import bagpipe
from bagpipe import job as bagpipe_job
from conftest import child_env, zero_step

DATA = "synthetic:samples=2000,tables=4,scale=0.001"


def small_config(**options):
    settings = dict(data=DATA, batch_size=128, iterations=4, cache_rows=500, dim=4,
                    optimizer="sgd", lr=0.1, peer_timeout=30)
    settings.update(options)
    return bagpipe.Config(**settings)


def run_and_flush(trainer):
    for _ in trainer:
        zero_step(trainer)
    trainer.flush()


def finish_loop(trainer):
    run_and_flush(trainer)
    trainer.complete()


@pytest.mark.parametrize("option,value,expected", [
    ("batch_size", "10", "expected an int, got str"),
    ("batch_size", 10.0, "expected an int, got float"),
    ("batch_size", None, "expected an int, got NoneType"),
    ("batch_size", True, "expected an int, got bool"),
    ("seed", 1.5, "expected an int, got float"),
    ("deterministic", None, "expected a bool, got NoneType"),
    ("deterministic", 2, "expected a bool, got int"),
    ("lr", "0.1", "expected a number, got str"),
    ("lr", None, "expected a number, got NoneType"),
    ("lr", True, "expected a number, got bool"),
    ("dense_lr", "x", "expected a number, got str"),
    ("cache", None, "expected a str, got NoneType"),
    ("dense_optimizer", 5, "expected a str or None, got int"),
    ("checkpoint_dir", 7, "expected a str or a path, got int"),
])
def test_options_of_the_wrong_type_raise_type_error_naming_the_option(option, value, expected):
    with pytest.raises(TypeError, match=f"Config.{option}: {expected}"):
        bagpipe.Config(**{option: value})
    config = bagpipe.Config()
    with pytest.raises(TypeError, match=f"Config.{option}: {expected}"):
        setattr(config, option, value)


def test_out_of_range_values_nul_characters_and_unknown_names_are_refused():
    for option, value in [("batch_size", 2**63), ("batch_size", 2**64 + 1), ("seed", -1),
                          ("seed", 2**64), ("dim", 2**31), ("lookahead", -2**31 - 1)]:
        with pytest.raises(bagpipe.ConfigError, match=f"Config.{option}: {value} is out of "
                                                      "range"):
            bagpipe.Config(**{option: value})
    with pytest.raises(bagpipe.ConfigError, match="Config.lr: an int of 1329 bits is out of range"):
        bagpipe.Config(lr=10**400)  # float() would raise OverflowError
    for option in ("data", "checkpoint_dir", "resume", "schema"):
        with pytest.raises(bagpipe.ConfigError, match=f"Config.{option}: .* NUL"):
            bagpipe.Config(**{option: "runs/a\0b"})
    # absl::Seconds(NaN) is an infinite duration: NaN would have switched the timeouts off.
    with pytest.raises(bagpipe.ConfigError, match="--peer-timeout nan"):
        bagpipe.Config(peer_timeout=math.nan)
    with pytest.raises(bagpipe.ConfigError, match="--peer-timeout nan"):
        bagpipe._core.Config().peer_timeout = math.nan
    with pytest.raises(TypeError, match="dense_optimizer: expected a str or None"):
        bagpipe._core.Config().dense_optimizer = 5  # was pybind11's RuntimeError
    config = bagpipe.Config()
    with pytest.raises(TypeError, match="unknown option 'cache_size'"):
        config.cache_size = 10  # a typo must not become a new attribute
    with pytest.raises(bagpipe.ConfigError, match="--lr inf"):
        bagpipe.Job(small_config(lr=1e40))  # beyond float32: checked as a whole at the start
    # prefetch_depth + 2 plans are staged: INT_MAX overflowed into "needs at least two slots".
    with pytest.raises(bagpipe.ConfigError, match="--prefetch-depth 2147483647: must be in"):
        bagpipe.Job(small_config(prefetch_depth=2**31 - 1))
    # What a user may rightly pass: numpy scalars, paths, None for the dense_* options.
    config = bagpipe.Config(batch_size=np.int64(64), lr=np.float32(0.5), deterministic=np.True_,
                            checkpoint_dir=pathlib.Path("runs/x"), dense_lr=None)
    assert (config.batch_size, config.lr, config.deterministic, config.checkpoint_dir) == \
        (64, 0.5, True, "runs/x")


@pytest.mark.parametrize("call, argument", [
    (lambda: bagpipe.initial_logreg_parameters(4.7, 4, 1), "num_tables"),
    (lambda: bagpipe.initial_logreg_parameters(4, "4", 1), "dim"),
    (lambda: bagpipe.initial_logreg_parameters(4, 4, True), "seed"),
    (lambda: bagpipe.initial_dense_parameters(13, 4, 4, [8, 4.0], [8], 1), "bottom[1]"),
    (lambda: bagpipe.initial_dense_parameters(13, 4, 4, "84", [8], 1), "bottom"),
    (lambda: bagpipe.initial_dense_parameters(13, 4, 4, [8, 4], [8], np.float32(1)), "seed"),
])
def test_initial_parameters_refuse_arguments_that_are_not_ints(call, argument):
    with pytest.raises(TypeError, match=f"{argument.replace('[', '.').replace(']', '.')} must be"):
        call()
    with pytest.raises(bagpipe.ConfigError, match=r"seed = -1 is out of range \[0, "):
        bagpipe.initial_logreg_parameters(4, 4, -1)
    with pytest.raises(bagpipe.ConfigError, match="num_tables = 1099511627776 is out of range"):
        bagpipe.initial_logreg_parameters(2**40, 4, 1)
    # Each fits an int, their product does not (it wrapped to a (1, 0) weight).
    with pytest.raises(bagpipe.ConfigError, match="65536 tables of dim 65536 make 4294967296"):
        bagpipe.initial_logreg_parameters(65536, 65536, 1)
    # The same calls with ints work.
    weight, bias = bagpipe.initial_logreg_parameters(4, np.int64(4), 1)
    assert weight.shape == (1, 16) and bias.shape == (1,)


def test_every_option_of_the_runtime_is_type_checked():
    # Names with a leading underscore are the runtime's own state, not options (the Config
    # refuses them as unknown options).
    options = {name for name, value in vars(bagpipe._core.Config).items()
               if isinstance(value, property) and not name.startswith("_")}
    assert options == set(bagpipe_job._OPTION_KINDS)


def test_configs_handed_out_are_checked_copies():
    config, _ = bagpipe.parse_train_args(["--batch-size", "64"])
    assert isinstance(config, bagpipe.Config) and isinstance(config.copy(), bagpipe.Config)
    with pytest.raises(TypeError, match="Config.batch_size"):
        config.batch_size = "64"
    with bagpipe.Job(small_config(iterations=2)) as job:
        job.config.batch_size = 7  # a copy: the job's own options (summary.json's) stay
        assert job.config.batch_size == 128
        job.run_trainers(finish_loop)
        assert job.finish()["config"]["batch_size"] == 128


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_gradient_is_refused_before_it_reaches_the_rows(bad):
    with bagpipe.Job(small_config(iterations=3)) as job:
        (trainer,) = job.trainers
        tables = bagpipe.EmbeddingBags(trainer)
        trainer.begin_iteration()
        pooled = trainer.lookup_pooled()
        grad = torch.zeros_like(pooled)
        grad[5, 2, 1] = bad
        with pytest.raises(ValueError, match=r"pooled_grad: element \(5, 2, 1\) is "
                                             f"{bad}.*nothing was applied"):
            trainer.end_iteration(grad)
        trainer.end_iteration(torch.ones_like(pooled))  # the iteration was still open
        batch = trainer.begin_iteration()
        out = tables(batch)
        with pytest.raises(ValueError, match="non-finite gradient"):
            (out.sum() * bad).backward()  # through autograd: EmbeddingBags' backward
        out = tables(batch)
        out.sum().backward()
        batch = trainer.begin_iteration()
        assert torch.isfinite(trainer.lookup_pooled()).all()  # the rows were never poisoned
        zero_step(trainer)
        job.abort("test over")


@pytest.mark.parametrize("optimizer,value", [("sgd", 3e38), ("sgd", 3e36), ("adagrad", 1e18)])
def test_a_gradient_whose_row_sum_could_overflow_is_refused(optimizer, value):
    # Finite, but summed over the batch's 128 samples (and squared by Adagrad) it overflows.
    with bagpipe.Job(small_config(iterations=2, optimizer=optimizer)) as job:
        (trainer,) = job.trainers
        trainer.begin_iteration()
        pooled = trainer.lookup_pooled()
        grad = torch.zeros_like(pooled)
        grad[3, 1, 2] = -value
        with pytest.raises(ValueError, match=r"pooled_grad: element \(3, 1, 2\) is -.*over the "
                                             r"512 ids of this trainer's share of the batch.*"
                                             r"could overflow float32"):
            trainer.end_iteration(grad)
        grad[3, 1, 2] = 1e6  # large, but no overflow
        trainer.end_iteration(grad)
        trainer.begin_iteration()
        assert torch.isfinite(trainer.lookup_pooled()).all()
        zero_step(trainer)
        job.abort("test over")


def test_tensors_dlpack_cannot_share_raise_type_error():
    with bagpipe.Job(small_config(iterations=2)) as job:
        (trainer,) = job.trainers
        trainer.begin_iteration()
        pooled = trainer.lookup_pooled()
        # PyTorch 1.13 cannot export a bool tensor through DLPack; PyTorch 2 exports it as
        # DLPack's bool type, which is not float32.
        with pytest.raises(TypeError, match="pooled_grad: (cannot be shared through DLPack|"
                                            "expected float32, got bool$)") as refused:
            trainer.end_iteration(torch.zeros_like(pooled, dtype=torch.bool))
        assert "At:" not in str(refused.value)  # the producer's reason, not its traceback
        read_only = np.zeros(tuple(pooled.shape), np.float32)
        read_only.setflags(write=False)
        with pytest.raises(TypeError, match="all_reduce_ tensor: cannot be shared"):
            trainer.all_reduce_(read_only)  # it would be written in place
        with pytest.raises(ValueError, match="pooled_grad: a tensor on the meta device"):
            trainer.end_iteration(torch.zeros(tuple(pooled.shape), device="meta"))
        job.abort("test over")


def test_backward_through_an_earlier_iterations_output_is_a_usage_error():
    with bagpipe.Job(small_config(iterations=4)) as job:
        (trainer,) = job.trainers
        tables = bagpipe.EmbeddingBags(trainer)
        first = tables(trainer.begin_iteration())
        first.sum().backward(retain_graph=True)
        second = tables(trainer.begin_iteration())
        # The shapes agree: without the check iteration 0's gradient would train iteration 1.
        with pytest.raises(bagpipe.UsageError, match="output of an earlier iteration"):
            first.sum().backward()
        second.sum().backward()  # the iteration goes on
        for batch in trainer:
            tables(batch).sum().backward()
        trainer.flush()
        trainer.complete()
        assert job.finish()["iterations"] == 4


def test_replicas_that_start_apart_are_named_at_the_first_all_reduce():
    def loop(trainer, seeds):
        generator = torch.Generator().manual_seed(seeds[trainer.id])
        head = torch.nn.Parameter(torch.randn(4, generator=generator))
        for _ in trainer:
            zero_step(trainer)
            head.grad = torch.ones(4)
            trainer.all_reduce_gradients([head])

    with bagpipe.Job(small_config(trainers=2)) as job:
        job.run_trainers(loop, [1, 1])  # the same start: trains
        job.finish()
    with bagpipe.Job(small_config(trainers=2)) as job:
        with pytest.raises(bagpipe.UsageError, match="the trainers' dense parameters differ at "
                                                     "the first all-reduce"):
            job.run_trainers(loop, [1, 2])


def test_a_schema_with_too_many_tables_is_refused_at_once():
    with pytest.raises(bagpipe.ConfigError, match="Schema: the schema has 40000 tables: at most "
                                                  "32767"):
        bagpipe.Schema([3] * 40000, num_dense=0)


def test_all_reduce_gradients_checks_what_it_is_given():
    def loop(trainer):
        trainer.begin_iteration()
        zero_step(trainer)
        weight = torch.nn.Parameter(torch.zeros(3))
        weight.grad = torch.full((3,), float(trainer.id + 1))
        trainer.all_reduce_gradients(weight)  # one tensor, as clip_grad_norm_ takes it
        assert weight.grad.tolist() == [3.0, 3.0, 3.0]
        with pytest.raises(TypeError, match="parameter 1 is a int, not a tensor"):
            trainer.all_reduce_gradients([weight, 5])
        embedding = torch.nn.Embedding(5, 2, sparse=True)
        embedding(torch.tensor([1])).sum().backward()
        with pytest.raises(TypeError, match=r"parameter 0.grad is a torch.sparse_coo tensor"):
            trainer.all_reduce_gradients(embedding.parameters())
        with pytest.raises(ValueError, match="parameter 0 is on meta, not on the trainer's"):
            trainer.all_reduce_gradients([torch.nn.Parameter(torch.zeros(2, device="meta"))])
        trainer.all_reduce_gradients(p for p in [weight, torch.zeros(2)])  # a generator
        assert weight.grad.tolist() == [6.0, 6.0, 6.0]
        finish_loop(trainer)

    with bagpipe.Job(small_config(trainers=2)) as job:
        job.run_trainers(loop)
        job.finish()
    with bagpipe.Job(small_config()) as job:  # one trainer: the same checks
        (trainer,) = job.trainers
        with pytest.raises(TypeError, match="parameter 0 is a str"):
            trainer.all_reduce_gradients(["weight"])
        with pytest.raises(TypeError, match="parameters must be a tensor or an iterable of "
                                            "tensors, got NoneType"):
            trainer.all_reduce_gradients(None)
        # An expanded gradient cannot hold a sum per element: refused with one trainer as with
        # two (where the sum was computed, then torch refused to write it back).
        expanded = torch.nn.Parameter(torch.zeros(3))
        expanded.grad = torch.ones(1).expand(3)
        with pytest.raises(ValueError, match="parameter 0.grad is expanded"):
            trainer.all_reduce_gradients([expanded])
        job.abort("test over")


def test_run_trainers_twice_and_bad_paths_leave_the_job_usable():
    with bagpipe.Job(small_config()) as job:
        job.run_trainers(finish_loop)
        with pytest.raises(bagpipe.UsageError, match="run_trainers: called twice"):
            job.run_trainers(finish_loop)
        with pytest.raises(ValueError, match="finish: summary_json: .* NUL"):
            job.finish(summary_json="summary.json\0.txt")  # would write "summary.json"
        with pytest.raises(ValueError, match="finish: model: Out of range float"):
            job.finish(model={"loss": math.nan})
        assert job.finish()["iterations"] == 4
        with pytest.raises(bagpipe.UsageError, match="run_trainers: the job is finished"):
            job.run_trainers(finish_loop)


def test_complete_with_info_that_is_no_json_names_it():
    with bagpipe.Job(small_config(iterations=2)) as job:
        (trainer,) = job.trainers
        run_and_flush(trainer)
        with pytest.raises(ValueError, match="complete: info: Out of range float"):
            trainer.complete(info={"train_loss": math.nan})
        with pytest.raises(TypeError, match="complete: info: .*not JSON serializable"):
            trainer.complete(info={"model": object()})
        # dense: what would be lost in float32 is refused; an iterator of tensors is taken.
        with pytest.raises(TypeError, match="complete: dense: item 0 is torch.complex64"):
            trainer.complete(dense=[torch.zeros(2, dtype=torch.complex64)])
        with pytest.raises(ValueError, match=r"item 1 \(torch.float64\) holds a value beyond "
                                             "float32's range"):
            trainer.complete(dense=[torch.zeros(2), torch.tensor([1e300], dtype=torch.float64)])
        model = torch.nn.Linear(2, 1)
        trainer.complete(dense=model.parameters(), info={"train_loss": 0.5})
        assert job.finish()["train_loss"] == 0.5


def test_figures_the_loop_did_not_report_are_null_in_the_summary():
    # A loop that calls complete() without info (as the README's does) gets no made-up zeros:
    # `bagpipe compare` would show them as measured.
    with bagpipe.Job(small_config(iterations=2)) as job:
        (trainer,) = job.trainers
        run_and_flush(trainer)
        trainer.complete()
        summary = job.finish()
    assert summary["iterations"] == 2  # the runtime's own count
    for figure in ("train_loss", "samples", "samples_per_s", "train_seconds", "ms_per_iteration"):
        assert summary[figure] is None, figure
    assert summary["hit_rate"] > 0


def test_metrics_writer_removes_the_earlier_runs_outputs_it_replaces(tmp_path):
    summary, params, other = (tmp_path / name for name in ("summary.json", "params.bin", "x"))
    for path in (summary, params, other):
        path.write_text("earlier run")
    with pytest.raises(TypeError, match="replaces must be a list of paths"):
        bagpipe.MetricsWriter(tmp_path / "metrics.jsonl", replaces=str(summary))
    writer = bagpipe.MetricsWriter(tmp_path / "metrics.jsonl", replaces=[summary, params, ""])
    assert summary.exists()  # nothing changes before the first line
    writer.write({"iteration": 1, "loss": 0.5})
    assert not summary.exists() and not params.exists() and other.exists()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"iteration":1,"loss":0.5}\n'


def watch_threads():
    return [t for t in threading.enumerate() if t.name == "bagpipe-interrupt-watch"]


def test_a_job_dropped_without_close_is_collected_and_its_threads_end():
    before = len(watch_threads())
    job = bagpipe.Job(small_config())
    assert len(watch_threads()) == before + 1
    alive = weakref.ref(job)
    del job
    gc.collect()
    assert alive() is None, "the interrupt watch's thread kept the Job alive"
    assert len(watch_threads()) == before


def test_a_job_collected_mid_run_stops_its_trainers_with_job_error():
    job = bagpipe.Job(small_config(iterations=100000, trainers=2))
    trainers = job.trainers
    seen = {}
    started = threading.Barrier(3)

    def loop(trainer):
        try:
            for i, _ in enumerate(trainer):
                zero_step(trainer)
                trainer.all_reduce_(torch.ones(2))
                if i == 2:
                    started.wait()
        except bagpipe.Error as error:
            seen[trainer.id] = error

    threads = [threading.Thread(target=loop, args=(t,)) for t in trainers]
    for thread in threads:
        thread.start()
    started.wait()
    del job
    gc.collect()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a trainer thread hung"
    assert sorted(seen) == [0, 1]
    for error in seen.values():
        assert isinstance(error, (bagpipe.JobError, bagpipe.UsageError))
        assert "closed" in str(error), error


class CustomBase(BaseException):
    pass


@pytest.mark.parametrize("trainers", [1, 2])
@pytest.mark.parametrize("error", [KeyboardInterrupt("ctrl-c"), SystemExit(3),
                                   CustomBase("custom base"), GeneratorExit("gen"),
                                   MemoryError("oom")], ids=lambda e: type(e).__name__)
def test_any_exception_in_the_loop_ends_the_job_with_the_root_cause(trainers, error):
    def loop(trainer):
        for i, _ in enumerate(trainer):
            if i == 2 and trainer.id == trainers - 1:
                raise error
            zero_step(trainer)
            trainer.all_reduce_(torch.ones(2))
        trainer.flush()
        trainer.complete()

    with pytest.raises(type(error)) as raised:
        with bagpipe.Job(small_config(iterations=1000, trainers=trainers)) as job:
            job.run_trainers(loop)
    assert raised.value is error
    assert type(error).__name__ in job.aborted


def test_tensors_handed_out_outlive_the_job():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        batch = trainer.begin_iteration()
        pooled = trainer.lookup_pooled()
        capsule = trainer._core.lookup_pooled()  # a DLPack capsule nobody consumed yet
        snapshot = (batch.dense.clone(), pooled.clone())
        trainer.end_iteration(torch.zeros_like(pooled))
        job.abort("test over")
    del job, trainer
    gc.collect()
    churn = [torch.full((1 << 16,), 7.0) for _ in range(16)]
    assert torch.equal(batch.dense, snapshot[0]) and torch.equal(pooled, snapshot[1])
    assert torch.equal(torch.utils.dlpack.from_dlpack(capsule), snapshot[1])
    del churn


def test_metrics_writer_refuses_nul_paths_directories_and_non_json(tmp_path):
    with pytest.raises(ValueError, match="MetricsWriter: .* NUL"):
        bagpipe.MetricsWriter(str(tmp_path / "metrics.jsonl") + "\0.txt")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        bagpipe.MetricsWriter(tmp_path)
    writer = bagpipe.MetricsWriter(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match="MetricsWriter.write: Out of range float"):
        writer.write({"loss": math.nan})
    writer.write({"loss": 0.5})
    assert (tmp_path / "metrics.jsonl").read_text() == '{"loss":0.5}\n'


def test_float_ids_from_an_iterable_are_refused_not_truncated():
    schema = bagpipe.Schema(table_rows=[10], num_dense=0)
    items = [{"labels": np.ones(4, np.float32), "ids": [np.array([1.7, 0.0, 1.0, 2.0])]}]
    config = bagpipe.Config(batch_size=4, cache_rows=10, dim=4, optimizer="sgd",
                            peer_timeout=30)
    with bagpipe.Job(config, data=items, schema=schema) as job:
        (trainer,) = job.trainers
        with pytest.raises(bagpipe.JobError, match="ids of table 0: expected integers, got "
                                                   "an array of float64"):
            trainer.begin_iteration()


DROPPED_ON_THE_ORACLES_THREAD = """
import gc, threading, numpy as np, torch, bagpipe
holder = {}
held = threading.Event()  # the job is in `holder` alone
schema = bagpipe.Schema(table_rows=[10, 20], num_dense=2)
def batches():
    rng = np.random.default_rng(0)
    for i in range(100000):
        if i == 5:
            assert held.wait(60)
            holder.clear()  # the job's last reference goes on the oracle's thread
            gc.collect()
        yield {"dense": rng.standard_normal((32, 2)).astype(np.float32),
               "labels": np.ones(32, np.float32),
               "ids": [rng.integers(0, rows, 32) for rows in schema.table_rows]}
config = bagpipe.Config(batch_size=32, cache_rows=100, dim=4, optimizer="sgd", peer_timeout=30,
                        lookahead=2)
job = bagpipe.Job(config, data=batches(), schema=schema)
(trainer,) = job.trainers
holder["job"] = job
del job
held.set()
try:
    for batch in trainer:
        trainer.end_iteration(torch.zeros_like(trainer.lookup_pooled()))
except bagpipe.Error as error:
    print(type(error).__name__, error)
"""


def test_a_job_whose_last_reference_drops_on_the_oracles_thread_closes_cleanly():
    # Closing there would join the oracle's thread from itself (std::terminate).
    child = subprocess.run([sys.executable, "-c", DROPPED_ON_THE_ORACLES_THREAD], env=child_env(),
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert "closed" in child.stdout and "terminate" not in child.stderr, child.stdout + child.stderr


def test_jobs_close_in_any_order_and_ctrl_c_still_reaches_the_live_one():
    before = len(watch_threads())
    first, second = bagpipe.Job(small_config()), bagpipe.Job(small_config())
    assert len(watch_threads()) == before + 1  # one watch serves every job
    first.close()  # was OSError (EBADF), restoring the first job's closed wakeup socket
    assert first._core.closed and not second._core.closed
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    while second.aborted is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert second.aborted == "interrupted (SIGINT)"
    second.close()
    assert second._core.closed
    assert len(watch_threads()) == before
    third = bagpipe.Job(small_config())  # a fresh watch for the next job
    assert len(watch_threads()) == before + 1
    third.close()
    assert len(watch_threads()) == before


def test_an_exception_message_utf8_cannot_encode_still_aborts_the_job_at_once():
    error = FileNotFoundError("cannot open 'data_\udcff.csv'")  # a surrogateescape'd filename

    def loop(trainer):
        for i, _ in enumerate(trainer):
            if i == 1 and trainer.id == 1:
                raise error
            zero_step(trainer)
            trainer.all_reduce_(torch.ones(2))

    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as raised:
        with bagpipe.Job(small_config(iterations=1000, trainers=2, peer_timeout=60)) as job:
            job.run_trainers(loop)
    assert raised.value is error and time.monotonic() - start < 30  # not the peer timeout
    assert "data_\\udcff.csv" in job.aborted
    with pytest.raises(ValueError, match="a lone"):
        with bagpipe.Job(small_config()) as job:
            raise ValueError("a lone \ud800")  # through __exit__
    assert job.aborted == "ValueError: a lone \\ud800"


def test_abort_messages_arrive_whole():
    with bagpipe.Job(small_config()) as job:
        job.abort("")
        assert job.aborted == "aborted"  # was "": falsy, as if not aborted
    with bagpipe.Job(small_config()) as job:
        job.abort("bad\0data")
        assert job.aborted == "bad\\0data"
        with pytest.raises(bagpipe.JobError, match=r"^bad\\0data$"):
            job.trainers[0].begin_iteration()  # a NUL would have cut the message to "bad"


def test_strings_the_runtime_cannot_take_whole_name_the_option_or_argument(tmp_path):
    for option in ("data", "schema", "device", "cache", "checkpoint_dir", "resume",
                   "dense_optimizer"):
        with pytest.raises(bagpipe.ConfigError, match=f"Config.{option}: .* cannot be encoded "
                                                      "as UTF-8 .surrogates not allowed"):
            bagpipe.Config(**{option: "runs/\udcff"})
    with pytest.raises(bagpipe.ConfigError, match="Config.checkpoint_dir: .* NUL"):
        bagpipe.parse_train_args(["--checkpoint-dir", "runs/a\0b"])  # set bypassing the checks
    with pytest.raises(bagpipe.ConfigError, match="parse_train_args: argument 1: .* UTF-8"):
        bagpipe.parse_train_args(["--data", "csv:\udcff.csv"])
    with pytest.raises(ValueError, match="MetricsWriter: .* UTF-8"):
        bagpipe.MetricsWriter(str(tmp_path / "m\udcff.jsonl"))
    with pytest.raises(ValueError, match="MetricsWriter: the path is empty"):
        bagpipe.MetricsWriter("")
    with pytest.raises(TypeError, match="MetricsWriter: expected a str or a path, got int"):
        bagpipe.MetricsWriter(3)
    with bagpipe.Job(small_config(iterations=2)) as job:
        job.run_trainers(finish_loop)
        for argument in ("out", "summary_json", "dump_params"):
            with pytest.raises(ValueError, match=f"finish: {argument}: .* UTF-8"):
                job.finish(**{argument: str(tmp_path / "x\udcff")})
        with pytest.raises(ValueError, match="finish: model: a string cannot be encoded"):
            job.finish(model={"model": "\udcff"})
        assert job.finish()["iterations"] == 2  # nothing was lost


def test_complete_checks_the_figures_summary_json_reads():
    with bagpipe.Job(small_config(iterations=2)) as job:
        (trainer,) = job.trainers
        run_and_flush(trainer)
        for info, error, message in [
                ({"train_loss": "0.5"}, TypeError, r"info\['train_loss'\]: expected a number, "
                                                   "got str"),
                ({"iterations": 2.0}, TypeError, r"info\['iterations'\]: expected an int"),
                ({"samples": True}, TypeError, r"info\['samples'\]: expected an int, got bool"),
                ({"iterations": -1}, ValueError, r"info\['iterations'\]: -1 is out of range"),
                ({"samples": 2**63}, ValueError, r"info\['samples'\]: .* is out of range"),
                ({"seconds": -0.5}, ValueError, r"info\['seconds'\]: -0.5 is negative"),
                ({"train_loss": 10**400}, ValueError, r"info\['train_loss'\]: an int of"),
                ({"time_ms": [1]}, TypeError, r"info\['time_ms'\]: expected a dict, got list")]:
            with pytest.raises(error, match="complete: " + message):
                trainer.complete(info=info)
        with pytest.raises(TypeError, match="complete: dense: item 1 is a int, not a tensor"):
            trainer.complete(dense=[torch.zeros(2), 3])
        trainer.complete(info={"train_loss": 0.25, "iterations": 2, "seconds": 1,
                               "time_ms": {"step": 1.0}})
        summary = job.finish()
        assert (summary["train_loss"], summary["iterations"]) == (0.25, 2)


def test_output_paths_that_cannot_be_written_are_refused_before_the_job_ends(tmp_path):
    (tmp_path / "file").write_text("x")
    with bagpipe.Job(small_config(iterations=2)) as job:
        job.run_trainers(finish_loop)
        with pytest.raises(ValueError, match="finish: summary_json: .* is a directory"):
            job.finish(summary_json=tmp_path)
        with pytest.raises(ValueError, match="finish: summary_json: cannot create .* does not "
                                             "exist"):
            job.finish(summary_json=tmp_path / "missing" / "summary.json")
        with pytest.raises(ValueError, match="finish: out: cannot create the directory .*"
                                             "File exists"):
            job.finish(out=tmp_path / "file")
        with pytest.raises(ValueError, match="finish: out: the path is empty"):
            job.finish(out="")
        with pytest.raises(ValueError, match="finish: dump_params: cannot create"):
            job.finish(dump_params=tmp_path / "file")
        job.finish(summary_json=tmp_path / "summary.json")  # the job had not ended
    assert (tmp_path / "summary.json").is_file()


def test_arguments_of_the_wrong_kind_raise_type_or_value_error():
    config = small_config()
    with bagpipe.Job(config.copy()) as job:
        for signum in (2.7, True, "2"):
            with pytest.raises(TypeError, match="request_stop: signum must be a signal number"):
                job.request_stop(signum)
        for signum in (0, 2**31):
            with pytest.raises(ValueError, match=f"request_stop: signum {signum} is no signal"):
                job.request_stop(signum)
        with pytest.raises(TypeError, match="EmbeddingBags: expected a bagpipe.Batch"):
            bagpipe.EmbeddingBags(job.trainers[0])(None)
        job.abort("test over")
    with pytest.raises(TypeError, match="Job: schema must be a bagpipe.Schema, got dict"):
        bagpipe.Job(config.copy(), data=[], schema={"table_rows": [5]})
    with pytest.raises(TypeError, match="EmbeddingBags: trainer must be a bagpipe.Trainer"):
        bagpipe.EmbeddingBags(None)
    with pytest.raises(TypeError, match="initial_embedding_weights: schema must be a"):
        bagpipe.initial_embedding_weights(config, None)
    with pytest.raises(TypeError, match="initial_embedding_weights: config must be a"):
        bagpipe.initial_embedding_weights(None, bagpipe.Schema([5]))


def test_a_one_shot_iterator_read_twice_says_so():
    schema = bagpipe.Schema(table_rows=[10], num_dense=1)

    def batches(count):
        for _ in range(count):
            yield {"labels": np.ones(4, np.float32), "dense": np.zeros((4, 1), np.float32),
                   "ids": [np.arange(4)]}

    def config(**options):
        return bagpipe.Config(batch_size=4, cache_rows=100, dim=4, optimizer="sgd",
                              peer_timeout=30, **options)

    with pytest.raises(bagpipe.ConfigError, match=r"one-shot iterator \(generator\) and "
                                                  "config.epochs is 2: it cannot be read twice"):
        bagpipe.Job(config(epochs=2), data=batches(3), schema=schema)
    with bagpipe.Job(config(iterations=3), data=batches(3), schema=schema) as job:
        assert job.description == "python iterable (generator)"
        (trainer,) = job.trainers
        finish_loop(trainer)  # exactly one pass: fine
        assert job.finish()["iterations"] == 3
    with bagpipe.Job(config(iterations=5), data=batches(3), schema=schema) as job:
        with pytest.raises(bagpipe.JobError, match="one-shot iterator .* cannot be read twice"):
            finish_loop(job.trainers[0])  # was "python iterable (generator) yields no samples"
    with bagpipe.Job(config(epochs=2), data=list(batches(3)), schema=schema) as job:
        finish_loop(job.trainers[0])  # a list is read again
        assert job.finish()["iterations"] == 6


def test_a_refused_flush_loses_no_iteration():
    # flush() before the last iteration is a UsageError that changes nothing: the iteration it
    # found is still the next one, and with two trainers their exchanges stay paired.
    seen = {}

    def train(trainer):
        with pytest.raises(bagpipe.UsageError, match="iteration 0 was never run"):
            trainer.flush()
        iterations = []
        for batch in trainer:
            iterations.append(batch.iteration)
            zero_step(trainer)
        seen[trainer.id] = iterations
        trainer.flush()
        trainer.complete()

    with bagpipe.Job(small_config(trainers=2, peer_timeout=10)) as job:
        job.run_trainers(train)
        summary = job.finish()
    assert seen[0] == seen[1] == [0, 1, 2, 3]
    assert summary["iterations"] == 4


@pytest.mark.parametrize("arguments,error,expected", [
    (dict(table_rows=[2**62, 2**62]), bagpipe.ConfigError, "more than 2\\^62 rows"),
    (dict(table_rows=[10, 0]), bagpipe.ConfigError, "'table1' has 0 rows"),
    (dict(table_rows=[]), bagpipe.ConfigError, "no tables"),
    (dict(table_rows=[True]), TypeError, "table_rows\\[0\\] must be an int, got bool"),
    (dict(table_rows=[10, 2.5]), TypeError, "table_rows\\[1\\] must be an int, got float"),
    (dict(table_rows="10"), TypeError, "table_rows must be a list"),
    (dict(table_rows=[2**64]), bagpipe.ConfigError, "table_rows\\[0\\] is out of the int64"),
    (dict(table_rows=[10], num_dense=True), TypeError, "num_dense must be an int, got bool"),
    (dict(table_rows=[10], num_dense=-1), bagpipe.ConfigError, "num_dense < 0"),
])
def test_schema_refuses_counts_the_runtime_cannot_index(arguments, error, expected):
    with pytest.raises(error, match=f"Schema: .*{expected}"):
        bagpipe.Schema(**arguments)
    schema = bagpipe.Schema(table_rows=[np.int64(10), 2**40], num_dense=np.int32(2))
    assert schema.table_rows == [10, 2**40] and schema.num_dense == 2


def test_close_from_a_callback_of_the_job_aborts_it_instead_of_waiting_for_itself(tmp_path):
    # save() runs inside begin_iteration on the loop's thread: close() there would wait for
    # that very call to return.
    config = small_config(iterations=6, peer_timeout=20, checkpoint_dir=str(tmp_path),
                          checkpoint_every=2)
    job = bagpipe.Job(config)
    (trainer,) = job.trainers
    raised = []

    def save():
        try:
            job.close()
        except bagpipe.UsageError as error:
            raised.append(str(error))
            raise
        return b"state"

    trainer.set_loop_state(save, lambda data: None)
    start = time.monotonic()
    with pytest.raises(bagpipe.JobError, match="close was called inside one of the job's calls"):
        for _ in trainer:
            zero_step(trainer)
    assert time.monotonic() - start < 15  # at once, not at the peer timeout
    assert raised and "close it from the thread that created it" in raised[0]
    job.close()  # from the right thread
    assert job.aborted


def test_close_from_the_data_iterable_aborts_the_job_without_killing_the_process():
    code = """if True:
        import threading, numpy as np, torch, bagpipe
        schema = bagpipe.Schema(table_rows=[10, 20], num_dense=2)
        holder = {}
        handed_over = threading.Event()  # the oracle reads ahead while Job() returns
        def batches():
            rng = np.random.default_rng(0)
            for i in range(100):
                if i == 3:
                    handed_over.wait(30)
                    try:
                        holder["job"].close()
                    except bagpipe.UsageError as error:
                        holder["close"] = str(error)
                yield {"dense": rng.standard_normal((32, 2)).astype(np.float32),
                       "labels": np.ones(32, np.float32),
                       "ids": [rng.integers(0, r, 32) for r in schema.table_rows]}
        config = bagpipe.Config(batch_size=32, cache_rows=100, dim=4, optimizer="sgd",
                                peer_timeout=20, lookahead=2)
        job = bagpipe.Job(config, data=batches(), schema=schema)
        holder["job"] = job
        handed_over.set()
        (trainer,) = job.trainers
        try:
            for batch in trainer:
                trainer.end_iteration(torch.zeros_like(trainer.lookup_pooled()))
        except bagpipe.Error as error:
            print(type(error).__name__, error, flush=True)
        job.close()
        print("close:", holder.get("close"))
        print("survived", flush=True)
    """
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "close: close: called on the job's own thread" in result.stdout
    assert "JobError" in result.stdout and "survived" in result.stdout


@pytest.mark.parametrize("save,message", [
    (lambda: (_ for _ in ()).throw(KeyError("transient")), "the loop's save raised KeyError"),
    # A save() without its return: the same failure, named (it escaped as a TypeError, the job
    # going on, and a retry waited for the oracle until the peer timeout).
    (lambda: None, "the loop's save returned NoneType, not bytes"),
])
def test_a_failing_save_fails_the_job_at_once(tmp_path, save, message):
    config = small_config(iterations=6, peer_timeout=20, checkpoint_dir=str(tmp_path),
                          checkpoint_every=2)
    with bagpipe.Job(config) as job:
        (trainer,) = job.trainers
        trainer.set_loop_state(save, lambda data: None)
        start = time.monotonic()
        with pytest.raises(bagpipe.JobError, match=message):
            for _ in trainer:
                zero_step(trainer)
        assert time.monotonic() - start < 15
        assert job.aborted and message.split()[-1] in job.aborted


def test_finish_before_the_loops_end_is_a_usage_error_that_changes_nothing():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        # Before any iteration: planned iterations are left to run.
        with pytest.raises(bagpipe.UsageError, match="finish: trainer 0: Flush before the end of "
                           "training: iteration 0 was never run"):
            job.finish()
        trainer.begin_iteration()
        with pytest.raises(bagpipe.UsageError, match="finish: trainer 0 is inside iteration 0"):
            job.finish()
        assert not job.aborted
        zero_step(trainer)
        for _ in trainer:
            zero_step(trainer)
        # The loop ran to its end: finish flushes and completes the trainer itself.
        summary = job.finish()
        assert summary["iterations"] == 4 and not job.aborted


def test_complete_after_leaving_eval_batches_early():
    with bagpipe.Job(small_config(eval_fraction=0.2)) as job:
        (trainer,) = job.trainers
        run_and_flush(trainer)
        for _ in trainer.eval_batches():
            break  # a held-out batch needs no ending
        trainer.complete()
        assert job.finish()["iterations"] > 0 and not job.aborted
        job.abort("too late")  # the job is over: its outcome stays
        assert job.aborted is None


def test_complete_inside_an_iteration_is_a_usage_error_that_changes_nothing():
    with bagpipe.Job(small_config()) as job:
        (trainer,) = job.trainers
        trainer.begin_iteration()
        with pytest.raises(bagpipe.UsageError, match="complete: inside an iteration"):
            trainer.complete()
        assert not job.aborted
        zero_step(trainer)
        finish_loop(trainer)
        assert job.finish()["iterations"] == 4


@pytest.mark.parametrize("field,value,expected", [
    ("labels", float("nan"), "sample 5: label nan is not in \\[0, 1\\]"),
    ("labels", 7.0, "sample 5: label 7 is not in \\[0, 1\\]"),
    ("labels", -3.0, "sample 5: label -3 is not in \\[0, 1\\]"),
    ("dense", float("inf"), "sample 5: dense feature 1 is inf"),
    ("dense", 1e300, "sample 5: dense feature 1 is inf"),  # float64 overflowing float32
])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_non_finite_or_out_of_range_values_from_an_iterable_are_refused(field, value, expected):
    schema = bagpipe.Schema(table_rows=[10, 20], num_dense=2)
    rng = np.random.default_rng(0)
    item = {"dense": rng.standard_normal((32, 2)), "labels": np.ones(32),
            "ids": [rng.integers(0, r, 32) for r in schema.table_rows]}
    if field == "labels":
        item["labels"][5] = value
    else:
        item["dense"][5, 1] = value
    config = bagpipe.Config(batch_size=32, cache_rows=100, dim=4, optimizer="sgd",
                            peer_timeout=20, lookahead=2)
    with bagpipe.Job(config, data=[item], schema=schema) as job:
        (trainer,) = job.trainers
        with pytest.raises(bagpipe.JobError, match=f"batch 0 of data, the .*{expected}"):
            trainer.begin_iteration()


def test_a_job_collected_or_closed_on_another_jobs_data_thread_is_closed_there():
    # Job A's Trainer and Batch form a reference cycle: the cyclic GC frees them (and A's
    # runtime) wherever it runs, here inside job B's data iterable on B's oracle thread, which
    # is no thread of A's: A closes there (it was closed already: a no-op), as a finished job A
    # closed from there does; the process survives and B trains to its end.
    code = """if True:
        import gc, numpy as np, torch, bagpipe
        schema = bagpipe.Schema(table_rows=[10, 20], num_dense=2)
        rng = np.random.default_rng(0)
        def item():
            return {"dense": rng.standard_normal((32, 2)).astype(np.float32),
                    "labels": np.ones(32, np.float32),
                    "ids": [rng.integers(0, r, 32) for r in schema.table_rows]}
        config = bagpipe.Config(batch_size=32, cache_rows=30, dim=4, optimizer="sgd",
                                peer_timeout=15)
        gc.disable()  # no automatic collection on the main thread frees job A first
        with bagpipe.Job(config, data=[item() for _ in range(3)], schema=schema) as job:
            (trainer,) = job.trainers
            for batch in trainer:
                trainer.end_iteration(torch.zeros_like(trainer.lookup_pooled()))
                break  # an early stop leaves the Trainer <-> Batch cycle
        del job, trainer, batch
        finished = bagpipe.Job(config, data=[item()], schema=schema)
        (trainer,) = finished.trainers
        for batch in trainer:
            trainer.end_iteration(torch.zeros_like(trainer.lookup_pooled()))
        trainer.flush(); trainer.complete(); finished.finish()
        del trainer, batch
        collected = []
        def data_b():
            for i in range(4):
                collected.append(gc.collect())  # collects job A on B's oracle thread
                if i == 1:
                    finished.close()
                    print("closed the finished job from B's iterable", flush=True)
                yield item()
        with bagpipe.Job(config, data=data_b(), schema=schema) as job:
            (trainer,) = job.trainers
            iterations = 0
            for batch in trainer:
                trainer.end_iteration(torch.zeros_like(trainer.lookup_pooled()))
                iterations += 1
            trainer.flush(); trainer.complete(); job.finish()
        print("job B iterations", iterations, "collected", collected[0] > 0, flush=True)
        print("finished job aborted:", finished.aborted, flush=True)
    """
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "closed the finished job from B's iterable" in result.stdout
    assert "job B iterations 4 collected True" in result.stdout
    assert "finished job aborted: None" in result.stdout


@pytest.mark.parametrize("optimizer,lr,value,ids,expected", [
    # Finite, and 1 sample: but the bag holds row 1 twice, whose gradient sums both.
    ("sgd", 1.0, 2e38, [1, 1], r"over the 2 ids .* scaled by the learning rate 1,"),
    ("adagrad", 1.0, 1.5e19, [1, 1], r"over the 2 ids .* squared \(Adagrad\)"),
    # One id, but lr 10 times the gradient overflows in the SGD step.
    ("sgd", 10.0, 1e38, [1], r"over the 1 ids .* scaled by the learning rate 10,"),
])
def test_a_gradient_whose_row_sum_over_repeated_ids_or_step_could_overflow_is_refused(
        optimizer, lr, value, ids, expected):
    schema = bagpipe.Schema(table_rows=[4], num_dense=0)
    items = [{"labels": np.ones(1, np.float32), "ids": [np.array(ids)],
              "offsets": [np.array([0])]} for _ in range(3)]
    config = bagpipe.Config(batch_size=1, cache_rows=4, dim=2, optimizer=optimizer, lr=lr,
                            peer_timeout=15, lookahead=1)
    with bagpipe.Job(config, data=items, schema=schema) as job:
        (trainer,) = job.trainers
        trainer.begin_iteration()
        with pytest.raises(ValueError, match=r"pooled_grad: element \(0, 0, 0\) is .*" + expected
                           + ".*could overflow float32 .*nothing was applied"):
            trainer.end_iteration(torch.full((1, 1, 2), value))
        trainer.end_iteration(torch.full((1, 1, 2), value / 100))  # still open; this one fits
        trainer.begin_iteration()
        assert torch.isfinite(trainer.lookup_pooled()).all()
        zero_step(trainer)
        job.abort("test over")


def test_all_reduce_gradients_refuses_float64_rather_than_round_it():
    def loop(trainer):
        weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        weight.grad = torch.full((1,), 1.0 + 1e-12, dtype=torch.float64)
        half = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
        half.grad = torch.ones(2, dtype=torch.float16)
        for _ in trainer:
            zero_step(trainer)
            with pytest.raises(TypeError, match=r"parameter 1 is torch.float64: the sum runs in "
                                                r"float32 and would round it \(nothing was summed"):
                trainer.all_reduce_gradients([half, weight])
            trainer.all_reduce_gradients([half])  # narrower than float32: summed in float32
        assert weight.grad.item() == 1.0 + 1e-12
        finish_loop(trainer)
        return half.grad.tolist()

    for trainers in (1, 2):  # the same check whatever the trainer count
        with bagpipe.Job(small_config(trainers=trainers)) as job:
            results = job.run_trainers(loop)
            job.finish()
        assert results == [[float(trainers ** 4)] * 2] * trainers  # 4 iterations summed


def test_bad_items_of_eval_data_and_uint64_ids_beyond_int64_are_named():
    schema = bagpipe.Schema(table_rows=[10, 20], num_dense=2)
    rng = np.random.default_rng(0)

    def item():
        return {"dense": rng.standard_normal((32, 2)).astype(np.float32),
                "labels": np.ones(32, np.float32),
                "ids": [rng.integers(0, r, 32) for r in schema.table_rows]}

    config = bagpipe.Config(batch_size=32, cache_rows=30, dim=4, optimizer="sgd",
                            peer_timeout=15)
    bad = item()
    bad["dense"] = np.zeros((32, 3), np.float32)
    with bagpipe.Job(config, data=[item()], schema=schema, eval_data=[bad]) as job:
        (trainer,) = job.trainers
        with pytest.raises(bagpipe.JobError, match=r"batch 0 of eval_data, the python iterable "
                                                   r"\(list\): ValueError: dense: expected"):
            run_and_flush(trainer)
            list(trainer.eval_batches())
    bad = item()
    bad["ids"][0] = bad["ids"][0].astype(np.uint64)
    bad["ids"][0][3] = 2**64 - 1
    with bagpipe.Job(config, data=[bad], schema=schema) as job:
        with pytest.raises(bagpipe.JobError, match=r"batch 0 of data, the python iterable "
                                                   r"\(list\): ValueError: ids of table 0: "
                                                   r"18446744073709551615 \(position 3\)"):
            job.trainers[0].begin_iteration()


DUMP_ON_A_FULL_DISK = """
import json, resource, signal, sys
import torch
import bagpipe
out = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
config = bagpipe.Config(data="synthetic:samples=20000,tables=4,scale=0.001", batch_size=128,
                        iterations=4, dim=64)
with bagpipe.Job(config) as job:
    (trainer,) = job.trainers
    for _ in trainer:
        trainer.end_iteration(torch.zeros_like(trainer.lookup_pooled()))
    trainer.flush()
    # A file size limit stands in for a full disk: params.bin (megabytes) fails, not the summary.
    resource.setrlimit(resource.RLIMIT_FSIZE, (200000, resource.RLIM_INFINITY))
    try:
        job.finish(summary_json=out + "/summary.json", dump_params=out)
    except bagpipe.JobError as error:
        print(json.dumps({"message": str(error), "summary": error.summary}))
"""


# A parameter dump that cannot be written loses nothing else: Job.finish raises JobError with
# the run's summary attached (and written, with "params_error"), and no params.bin is left.
def test_a_failed_parameter_dump_keeps_the_summary(tmp_path):
    result = subprocess.run([sys.executable, "-c", DUMP_ON_A_FULL_DISK, str(tmp_path)],
                            env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)
    assert "params.bin" in reported["message"] and "File too large" in reported["message"]
    summary = reported["summary"]
    assert summary["iterations"] == 4 and len(summary["params_sha256"]) == 64
    assert summary["params_error"] == reported["message"] and "params" not in summary
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["params_sha256"] == summary["params_sha256"]
    assert not (tmp_path / "params.bin").exists()
