"""Under mpirun every rank runs the same PyTorch script (rank 0 the oracle, rank 1 the server,
ranks 2-3 trainers): the result is bit-identical to the single-process run with --cache off, and
a rank that fails ends every rank (no hung ranks)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import EXAMPLE, child_env

MPIEXEC = os.environ.get("MPIEXEC") or shutil.which("mpirun")
pytestmark = pytest.mark.skipif(not MPIEXEC, reason="mpirun is not installed")

DATA = "synthetic:samples=12000,tables=6,scale=0.0005,alpha=1.1,pooling=1-2,seed=9"
COMMON = ["--data", DATA, "--batch-size", "256", "--iterations", "12", "--cache-rows", "1500",
          "--dim", "8", "--top", "16-1", "--optimizer", "adagrad", "--lr", "0.05",
          "--deterministic", "--quiet", "--metrics-interval", "4"]


def mpirun(np_ranks, args, timeout=300):
    return subprocess.run([MPIEXEC, "-np", str(np_ranks), "--oversubscribe", sys.executable]
                          + args, capture_output=True, text=True, env=child_env(),
                          timeout=timeout)


def test_mpirun_equals_the_single_process_off_run(example, tmp_path):
    reference = example.main(COMMON + ["--cache", "off", "--trainers", "2",
                                       "--out", str(tmp_path / "off")])
    result = mpirun(4, [EXAMPLE] + COMMON + ["--cache", "oracle", "--servers", "1",
                                             "--out", str(tmp_path / "mpi")])
    assert result.returncode == 0, result.stdout + result.stderr
    with open(tmp_path / "mpi" / "summary.json") as f:
        summary = json.load(f)
    assert summary["mode"] == "mpirun" and summary["trainers"] == 2
    assert summary["params_sha256"] == reference["params_sha256"]
    assert summary["hit_rate"] > 0 and summary["exchanged_rows"] > 0
    assert os.path.exists(tmp_path / "mpi" / "metrics.jsonl")  # written by trainer 0's rank


PROBE = """
import signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: (print("forwarded", flush=True), sys.exit(0)))
print("ready", flush=True)
time.sleep(30)
"""


def _mpirun_forwards_sigusr1():
    process = subprocess.Popen([MPIEXEC, "-np", "1", sys.executable, "-c", PROBE],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=child_env())
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGUSR1)
        output, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        output = ""
    finally:
        if process.poll() is None:
            # The rank first: killed mpirun may leave it holding the output pipe.
            for pid in _children(process.pid):
                os.kill(pid, signal.SIGKILL)
            process.kill()
            process.communicate()
    return "forwarded" in output


def _children(pid):
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            children += [int(child) for child in f.read().split()]
    return children


def test_sigusr1_to_mpirun_stops_every_rank_with_a_checkpoint(tmp_path):
    # mpirun forwards SIGUSR1 to every rank. Rank 0 and the server host no trainer: the signal
    # reaches them outside run_trainers (in finish), where it must stop the job too, not kill
    # the rank (SIGUSR1's default action).
    checkpoints = tmp_path / "ckpt"
    args = [arg if arg != "12" else "1000000" for arg in COMMON]  # runs until stopped
    process = subprocess.Popen([MPIEXEC, "-np", "4", "--oversubscribe", sys.executable, EXAMPLE]
                               + args + ["--cache", "oracle", "--servers", "1",
                                         "--checkpoint-dir", str(checkpoints),
                                         "--checkpoint-every", "20"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=child_env())
    try:
        deadline = time.monotonic() + 120
        while not (checkpoints.is_dir() and any(checkpoints.glob("ckpt-*/MANIFEST*"))):
            assert process.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.2)
        if not _mpirun_forwards_sigusr1():
            # Ubuntu 24.04's Open MPI 4.1.6 in a container (the GPU machine) forwards no signal
            # to the ranks: signalling them is then the scheduler's part, the stop the same.
            ranks = _children(process.pid)
            assert len(ranks) == 4, ranks
            for pid in ranks:
                os.kill(pid, signal.SIGUSR1)
        else:
            process.send_signal(signal.SIGUSR1)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 75, output
    assert "--resume" in output, output
    assert "exited on signal" not in output, output


FAILING = """
import sys, torch, bagpipe
config = bagpipe.Config(data="synthetic:samples=100000000,tables=4,seed=1", batch_size=64,
                        iterations=1000000, cache_rows=4000, dim=4, optimizer="sgd",
                        peer_timeout=60)
def loop(trainer):
    for i, batch in enumerate(trainer):
        if trainer.id == 1 and i == 5:
            raise RuntimeError("trainer 1's loop failed on purpose")
        pooled = trainer.lookup_pooled()
        trainer.end_iteration(torch.zeros_like(pooled))
        trainer.all_reduce_(torch.ones(2))
with bagpipe.Job(config) as job:
    job.run_trainers(loop)
    job.finish()
"""


def test_a_failing_rank_ends_every_rank():
    result = mpirun(4, ["-c", FAILING], timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "failed on purpose" in output
    # The abort ends the failing rank at once: its line says where, and the traceback came first.
    assert "trainer 1 raised RuntimeError: trainer 1's loop failed on purpose (at <string>:" \
        in output, output
    assert "Traceback (most recent call last)" in output, output


STOPPED_ORACLE = """
import bagpipe
config = bagpipe.Config(data="synthetic:samples=100000,tables=4,seed=1", batch_size=64,
                        iterations=50, cache_rows=4000, dim=4, optimizer="sgd", peer_timeout=6)
with bagpipe.Job(config) as job:
    job.run_trainers(lambda trainer: None)
"""


def test_a_stopped_oracle_is_named_by_the_other_ranks():
    # Rank 0 stops itself (SIGSTOP, a test hook) once the transport is up: the job's start is
    # bounded by peer_timeout and the other ranks watch rank 0's heartbeats, so the job ends
    # naming rank 0 instead of waiting for its options for an hour.
    env = child_env()
    env["BAGPIPE_TEST_STOP_IN_SETUP"] = "started:0"
    result = subprocess.run([MPIEXEC, "-np", "4", "--oversubscribe", sys.executable, "-c",
                             STOPPED_ORACLE], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode != 0
    assert "rank 0 (oracle) has sent nothing" in result.stdout + result.stderr, \
        result.stdout + result.stderr
