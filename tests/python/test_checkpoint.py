"""Checkpoints of a PyTorch loop: a job stopped at an iteration boundary (Job.request_stop, or
Ctrl-C inside run_trainers) writes a checkpoint, and the job resumed from it ends with the
parameters of an uninterrupted run, bit for bit (deterministic), for oracle with 1 trainer and
lru with 2; each part really trained (iterations > 0, adding up to the whole run) and the
checkpoint's files exist. A resume whose loop registers no state, or whose loop options differ,
is refused with a clear error, and so are saving and restoring a diverged (non-finite) head."""

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest
import torch

import bagpipe
from conftest import BAGPIPE_BINARY

DATA = "synthetic:samples=40000,tables=4,scale=0.0005,seed=7"
ITERATIONS = 30


def make_config(cache, trainers, **options):
    settings = dict(data=DATA, batch_size=128, iterations=ITERATIONS, cache=cache,
                    cache_rows=1500, lookahead=4, plan_queue_depth=2, dim=4,
                    optimizer="adagrad", lr=0.05, trainers=trainers, deterministic=True,
                    seed=3, peer_timeout=60)
    settings.update(options)
    return bagpipe.Config(**settings)


def train(trainer, job, stop_at=None, signal_at=None, register=True, context=None,
          poison_at=None, signal_number=signal.SIGINT, metrics_path=None):
    """An embedding-bag + linear head loop with Adagrad; returns (iterations run here, the
    first iteration). Trainer 0 asks for the stop at iteration `stop_at` (or sends itself
    `signal_number` at `signal_at`). ``context()``: a context manager the loop runs in (e.g. a
    stream).
    After the step of iteration `poison_at` every trainer's head bias becomes NaN, as in a run
    that diverged (the next iteration's gradients would be refused). `metrics_path`: trainer 0
    writes a metrics line ({"iteration", "loss"}) there after each iteration."""
    tables = bagpipe.EmbeddingBags(trainer)
    inputs = trainer.num_tables * trainer.dim + trainer.num_dense
    head = torch.nn.Linear(inputs, 1)
    with torch.no_grad():  # the same start on every trainer, without the global RNG
        head.weight.copy_(torch.linspace(-0.1, 0.1, inputs).view(1, -1))
        head.bias.zero_()
    head.to(trainer.device)
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.05, eps=1e-10)
    counters = {"samples": 0}
    metrics = bagpipe.MetricsWriter(metrics_path) if metrics_path and trainer.id == 0 else None
    if register:
        trainer.checkpoint_torch_state(head, optimizer, get=lambda: dict(counters),
                                       set=counters.update, metrics=metrics)
    if metrics is not None:
        metrics.start(trainer.first_iteration)
    with context() if context is not None else contextlib.nullcontext():
        steps = 0
        for batch in trainer:
            if trainer.id == 0 and batch.iteration == stop_at:
                job.request_stop()
            if trainer.id == 0 and batch.iteration == signal_at:
                os.kill(os.getpid(), signal_number)
            x = torch.cat([tables(batch).flatten(1), batch.dense], dim=1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                head(x).squeeze(1), batch.labels, reduction="sum") / batch.global_batch_size
            optimizer.zero_grad()
            loss.backward()
            trainer.all_reduce_gradients(head.parameters())
            optimizer.step()
            if batch.iteration == poison_at:
                with torch.no_grad():
                    head.bias.fill_(float("nan"))
            counters["samples"] += batch.num_samples
            steps += 1
            if metrics is not None:
                metrics.write({"iteration": batch.iteration + 1, "loss": loss.item()})
        trainer.flush()
        trainer.complete(dense=list(head.parameters()))
    return steps, trainer.first_iteration


def run(config, tmp, name, identity=None, **loop):
    """Runs a job to its end: (summary, per-trainer (steps, first iteration))."""
    with bagpipe.Job(config, checkpoint_identity=identity or {"head": "linear"}) as job:
        results = job.run_trainers(train, job, **loop)
        summary = job.finish(out=str(tmp / name))
    return summary, results


def run_stopped(config, **loop):
    """Runs a job that stops early: (the Stopped error, per-trainer results)."""
    with bagpipe.Job(config, checkpoint_identity={"head": "linear"}) as job:
        results = job.run_trainers(train, job, **loop)
        with pytest.raises(bagpipe.Stopped) as stopped:
            job.finish()
    return stopped.value, results


@pytest.mark.parametrize("cache,trainers", [("oracle", 1), ("lru", 2)])
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, cache, trainers):
    torch.set_num_threads(1)
    whole, whole_results = run(make_config(cache, trainers), tmp_path, "whole")
    assert [steps for steps, _ in whole_results] == [ITERATIONS] * trainers
    assert whole["hit_rate"] > 0  # the cache served rows

    checkpoints = tmp_path / "ckpt"
    stopped, first_results = run_stopped(
        make_config(cache, trainers, checkpoint_dir=str(checkpoints)), stop_at=3)
    assert 3 <= stopped.iteration < ITERATIONS, stopped
    assert stopped.resume == str(checkpoints) and "--resume" in str(stopped)
    assert os.path.isdir(stopped.checkpoint) and os.listdir(stopped.checkpoint), stopped
    first_steps = [steps for steps, _ in first_results]
    assert first_steps == [stopped.iteration] * trainers  # every trainer ran up to the cut

    resumed, resumed_results = run(make_config(cache, trainers, resume=str(checkpoints)),
                                   tmp_path, "resumed")
    for steps, first in resumed_results:
        assert first == stopped.iteration
        assert steps == ITERATIONS - stopped.iteration > 0
    assert resumed["params_sha256"] == whole["params_sha256"]


def test_resuming_a_finished_job_keeps_its_summary(tmp_path):
    checkpoints = tmp_path / "ckpt"
    first, _ = run(make_config("oracle", 1, iterations=8, checkpoint_dir=str(checkpoints),
                               checkpoint_every=4), tmp_path, "run")
    assert first["iterations"] == 8 and first["hit_rate"] > 0
    summary = tmp_path / "run" / "summary.json"
    before = summary.read_bytes()
    # Its last checkpoint is at the job's end: nothing is left to train, and the summary of the
    # run that trained stays (this one has no training figures).
    again, results = run(make_config("oracle", 1, iterations=8, resume=str(checkpoints)),
                         tmp_path, "run")
    assert results == [(0, 8)]
    assert again["iterations"] == 0 and again["first_iteration"] == 8
    assert summary.read_bytes() == before
    # Elsewhere, the resumed job's own summary is written; over another run's summary too.
    run(make_config("oracle", 1, iterations=8, resume=str(checkpoints)), tmp_path, "elsewhere")
    assert (tmp_path / "elsewhere" / "summary.json").exists()
    foreign = tmp_path / "foreign" / "summary.json"
    foreign.parent.mkdir()
    foreign.write_text(before.decode().replace(first["params_sha256"], "0" * 64))
    run(make_config("oracle", 1, iterations=8, resume=str(checkpoints)), tmp_path, "foreign")
    assert json.loads(foreign.read_text())["iterations"] == 0


def test_a_resume_keeps_checkpoint_every_when_set_zero_included(tmp_path):
    assert not bagpipe.Config()._checkpoint_every_given
    assert bagpipe.Config(checkpoint_every=0)._checkpoint_every_given
    assert bagpipe.Config(checkpoint_every=0).copy()._checkpoint_every_given
    assert bagpipe.parse_train_args(["--checkpoint-every", "0"])[0]._checkpoint_every_given
    assert not bagpipe.parse_train_args([])[0]._checkpoint_every_given
    checkpoints = tmp_path / "ckpt"
    run(make_config("oracle", 1, iterations=8, checkpoint_dir=str(checkpoints),
                    checkpoint_every=2, keep_checkpoints=0), tmp_path, "first")
    run(make_config("oracle", 1, iterations=12, resume=str(checkpoints), keep_checkpoints=0),
        tmp_path, "inherited")
    run(make_config("oracle", 1, iterations=16, resume=str(checkpoints), keep_checkpoints=0,
                    checkpoint_every=0), tmp_path, "zero")
    names = sorted((n for n in os.listdir(checkpoints) if n.startswith("ckpt-")),
                   key=lambda n: int(n.split("-")[1]))
    assert names == [f"ckpt-{k}" for k in (2, 4, 6, 8, 10, 12, 16)], names


def test_a_resumed_loop_keeps_the_metrics_of_the_checkpointed_run_only(tmp_path):
    checkpoints = tmp_path / "ckpt"
    own, other = tmp_path / "own.jsonl", tmp_path / "other.jsonl"
    stopped, _ = run_stopped(make_config("oracle", 1, checkpoint_dir=str(checkpoints)),
                             stop_at=5, metrics_path=str(own))
    iterations = [int(line.split(",")[0].split(":")[1]) for line in own.read_text().splitlines()]
    assert iterations == list(range(1, stopped.iteration + 1))
    # Another run's metrics with the same iterations: keeping its lines up to the checkpoint
    # would splice the two runs; the file stays as it was.
    other.write_text("".join(f'{{"iteration":{k},"loss":9.0}}\n' for k in range(1, 9)))
    before = other.read_text()
    with pytest.raises(bagpipe.UsageError, match="holds another run's metrics"):
        run(make_config("oracle", 1, resume=str(checkpoints)), tmp_path, "refused",
            metrics_path=str(other))
    assert other.read_text() == before
    # The run's own file: its lines up to the checkpoint stay, the resumed ones follow.
    resumed, results = run(make_config("oracle", 1, resume=str(checkpoints)), tmp_path,
                           "resumed", metrics_path=str(own))
    assert results[0] == (ITERATIONS - stopped.iteration, stopped.iteration)
    iterations = [int(line.split(",")[0].split(":")[1]) for line in own.read_text().splitlines()]
    assert iterations == list(range(1, ITERATIONS + 1))


# Ctrl-C, SIGTERM and SIGUSR1 (the signal mpirun forwards to its ranks) stop as they stop
# `bagpipe train`; SIGUSR1's default action would end the process without a checkpoint.
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_in_run_trainers_stops_at_a_boundary_with_a_checkpoint(tmp_path, signum):
    checkpoints = tmp_path / "ckpt"
    bagpipe.job._StopHandlers.settle()  # after a job an earlier test closed on another thread
    before = signal.getsignal(signum)
    stopped, results = run_stopped(make_config("oracle", 1, checkpoint_dir=str(checkpoints)),
                                   signal_at=2, signal_number=signum)
    assert stopped.signal == signum and signal.Signals(signum).name in str(stopped)
    assert 2 <= stopped.iteration < ITERATIONS and results[0][0] == stopped.iteration
    assert os.path.isdir(stopped.checkpoint)
    assert signal.getsignal(signum) is before  # the caller's handler is back


def test_stop_handlers_come_back_whatever_order_or_thread_the_jobs_close_in(tmp_path):
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    bagpipe.job._StopHandlers.settle()  # after a job an earlier test closed on another thread
    before = {s: signal.getsignal(s) for s in signals}
    first = bagpipe.Job(make_config("oracle", 1, checkpoint_dir=str(tmp_path / "a")))
    second = bagpipe.Job(make_config("oracle", 1, checkpoint_dir=str(tmp_path / "b")))
    installed = signal.getsignal(signal.SIGINT)
    assert installed is not before[signal.SIGINT]
    first.close()  # out of creation order: the second job keeps its graceful stop
    assert signal.getsignal(signal.SIGINT) is installed
    second.close()
    assert {s: signal.getsignal(s) for s in signals} == before
    # Closed on another thread, where handlers cannot be set: the stop handler stays and acts
    # as the one it replaced, which it then puts back.
    third = bagpipe.Job(make_config("oracle", 1, checkpoint_dir=str(tmp_path / "c")))
    closer = threading.Thread(target=third.close)
    closer.start()
    closer.join()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert {s: signal.getsignal(s) for s in signals} == before


def test_a_signal_from_before_a_job_does_not_stop_it(tmp_path):
    # A job closed on another thread leaves the interrupt watch running; a Ctrl-C delivered then
    # and read by the watch only once the next job exists is not that job's (it stopped the
    # next job at its first boundaries, a test sending SIGTERM at iteration 3 never got there).
    # A signal after the job joined is its own.
    bagpipe.job._StopHandlers.settle()
    first = bagpipe.Job(make_config("oracle", 1, checkpoint_dir=str(tmp_path / "a")))
    closer = threading.Thread(target=first.close)
    closer.start()
    closer.join()
    watch = bagpipe.job._InterruptWatch._current
    assert watch is not None and len(watch._jobs) == 0
    with bagpipe.job._InterruptWatch._lock:  # the watch reads the byte, then waits for the lock
        watch._writer.send(bytes([signal.SIGINT]))  # what the handler's wakeup write does
        time.sleep(0.3)
        later = bagpipe.Job(make_config("oracle", 1, checkpoint_dir=str(tmp_path / "b")))
    assert bagpipe.job._InterruptWatch._current is watch
    watch._writer.send(bytes([signal.SIGTERM]))
    with later:
        later.run_trainers(train, later)
        with pytest.raises(bagpipe.Stopped, match="stopped by SIGTERM"):
            later.finish()
    bagpipe.job._StopHandlers.settle()


def test_two_stop_signals_at_once_abort(tmp_path):
    # Both bytes may reach the interrupt watch in one read: they still count as two.
    def loop(trainer):
        trainer.set_loop_state(lambda: b"x", lambda data: None)
        for batch in trainer:
            pooled = trainer.lookup_pooled()
            trainer.end_iteration(torch.zeros_like(pooled))
            if batch.iteration == 3:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)

    config = make_config("oracle", 1, checkpoint_dir=str(tmp_path / "ckpt"), iterations=100000,
                         batch_size=8)
    with bagpipe.Job(config) as job:
        with pytest.raises(bagpipe.JobError, match=r"interrupted \(SIGTERM\)"):
            job.run_trainers(loop)
            job.finish()


def test_ctrl_c_is_the_callers_when_it_handles_sigint_itself():
    # Without checkpoints Ctrl-C aborts the job, unless the caller installed its own handler
    # (e.g. to stop after the epoch): that handler's call then.
    seen = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with bagpipe.Job(make_config("oracle", 1)) as job:
            (trainer,) = job.trainers
            for batch in trainer:
                pooled = trainer.lookup_pooled()
                trainer.end_iteration(torch.zeros_like(pooled))
                if batch.iteration == 3:
                    os.kill(os.getpid(), signal.SIGINT)
            trainer.complete()
            assert job.finish()["iterations"] == ITERATIONS
            assert job.aborted is None
    finally:
        signal.signal(signal.SIGINT, before)
    assert seen == [signal.SIGINT]


def test_resume_refusals_are_clear(tmp_path):
    checkpoints = tmp_path / "ckpt"
    run_stopped(make_config("oracle", 1, checkpoint_dir=str(checkpoints)), stop_at=2)
    # The loop's options differ.
    with pytest.raises(bagpipe.Error, match="mlp"):
        run(make_config("oracle", 1, resume=str(checkpoints)), tmp_path, "other",
            identity={"head": "mlp"})
    # The loop registers no state to restore.
    with pytest.raises(bagpipe.Error, match="registered none \\(set_loop_state\\)"):
        run(make_config("oracle", 1, resume=str(checkpoints)), tmp_path, "none",
            register=False)


def test_diverged_parameters_are_neither_saved_nor_restored(tmp_path, monkeypatch):
    checkpoints = tmp_path / "ckpt"
    config = make_config("oracle", 1, checkpoint_dir=str(checkpoints), checkpoint_every=2)
    with pytest.raises(bagpipe.Error, match="checkpoint 4: .*training diverged: parameter 'bias' "
                                            "of Linear \\(object 0\\) is not finite"):
        run(config, tmp_path, "diverged", poison_at=3)
    # Iteration 3 diverged: the checkpoint before it is complete and stays the newest; the
    # refused one (after it) never got its manifest.
    assert os.path.exists(checkpoints / "ckpt-2" / "MANIFEST")
    assert not os.path.exists(checkpoints / "ckpt-4" / "MANIFEST")

    # A checkpoint written without the check (an older version, another loop) is refused on
    # resume.
    saved = tmp_path / "unchecked"
    monkeypatch.setattr(bagpipe.job, "_check_finite_parameters", lambda *args: None)
    run(make_config("oracle", 1, checkpoint_dir=str(saved), iterations=4), tmp_path, "unchecked_run",
        poison_at=3)
    monkeypatch.undo()
    with pytest.raises(bagpipe.Error, match="not finite \\(parameter 'bias' .*saved after the "
                                            "training diverged"):
        run(make_config("oracle", 1, resume=str(saved)), tmp_path, "resumed")


def test_a_max_samples_that_selects_every_sample_is_no_other_job(tmp_path):
    # DATA holds 40000 samples: --max-samples 40000 (or more) reads what none reads.
    for name, first, then in (("all", 40000, -1), ("none", -1, 40000), ("more", 50000, -1)):
        checkpoints = tmp_path / name
        run_stopped(make_config("oracle", 1, checkpoint_dir=str(checkpoints), max_samples=first),
                    stop_at=2)
        _, [(steps, first_iteration)] = run(
            make_config("oracle", 1, resume=str(checkpoints), max_samples=then), tmp_path,
            f"{name}-resumed")
        assert first_iteration > 0 and first_iteration + steps == ITERATIONS
    # Fewer samples are another stream.
    checkpoints = tmp_path / "fewer"
    run_stopped(make_config("oracle", 1, checkpoint_dir=str(checkpoints)), stop_at=2)
    with pytest.raises(bagpipe.Error, match="option --max-samples is -1 in the checkpoint and "
                                            "39999 here"):
        run(make_config("oracle", 1, resume=str(checkpoints), max_samples=39999), tmp_path,
            "fewer-resumed")


def test_a_binary_files_size_decides_what_its_max_samples_selects(tmp_path):
    # A bin: file's header gives its size (DATA's 40000 samples); the checkpoint records it. The
    # first 30000 of the same samples in a shorter file is not the same job.
    def convert(name, *options):
        path = tmp_path / name
        subprocess.run([BAGPIPE_BINARY, "convert", "--data", DATA, "--out", str(path), "--quiet",
                        *options], check=True, capture_output=True)
        return f"bin:{path}"

    whole, short = convert("whole.bin"), convert("short.bin", "--max-samples", "30000")
    checkpoints = tmp_path / "ckpt"
    run_stopped(make_config("oracle", 1, data=whole, checkpoint_dir=str(checkpoints),
                            max_samples=40000), stop_at=2)
    _, [(steps, first_iteration)] = run(
        make_config("oracle", 1, data=whole, resume=str(checkpoints)), tmp_path, "resumed")
    assert first_iteration > 0 and first_iteration + steps == ITERATIONS
    for max_samples in (-1, 40000):
        with pytest.raises(bagpipe.Error, match="its job trained on 40000 samples an epoch and "
                                                "this one would train on 30000"):
            run(make_config("oracle", 1, data=short, resume=str(checkpoints),
                            max_samples=max_samples), tmp_path, "short")


def test_a_loop_identity_resolved_against_the_data_and_its_older_defaults(tmp_path):
    # The loop records an option its default sets from the data as the value it resolves to;
    # an older checkpoint's "" is compared as that default (checkpoint_defaults).
    def resolved(bottom):
        return lambda schema: {"bottom": bottom or f"{schema.num_dense}-64-4"}

    def stopped(identity, checkpoints):
        with bagpipe.Job(make_config("oracle", 1, checkpoint_dir=str(checkpoints)),
                         checkpoint_identity=identity) as job:
            job.run_trainers(train, job, stop_at=2)
            with pytest.raises(bagpipe.Stopped):
                job.finish()

    def resumed(identity, checkpoints, defaults=None):
        with bagpipe.Job(make_config("oracle", 1, resume=str(checkpoints)),
                         checkpoint_identity=identity, checkpoint_defaults=defaults) as job:
            [(steps, first_iteration)] = job.run_trainers(train, job)
            job.finish()
            return first_iteration, steps

    stopped(resolved(""), tmp_path / "new")
    assert sum(resumed(resolved("13-64-4"), tmp_path / "new")) == ITERATIONS
    stopped({"bottom": ""}, tmp_path / "old")
    with pytest.raises(bagpipe.Error, match='option model: bottom is "" in the checkpoint and '
                                            '"13-64-4" here'):
        resumed(resolved(""), tmp_path / "old")
    with pytest.raises(bagpipe.Error, match='option model: bottom is "13-64-4" in the checkpoint '
                                            'and "13-32-4" here'):
        resumed(resolved("13-32-4"), tmp_path / "old", defaults=resolved(""))
    assert sum(resumed(resolved(""), tmp_path / "old", defaults=resolved(""))) == ITERATIONS
    with pytest.raises(ValueError, match="checkpoint_identity"):
        resumed(lambda schema: {"bottom": float("nan")}, tmp_path / "old")
