"""examples/dlrm_pytorch.py, a torch.nn DLRM trained through bagpipe: with the cache (oracle,
lru) and without it (off) the parameters end bit-identical (--deterministic), with one trainer
and with two, and the cache really worked: rows were served from it (hits) and, with two
trainers, gradients of shared rows were exchanged. `bagpipe compare` reads the runs. The
torch.nn DLRM (and the embedding-only head) is a twin of `bagpipe train`'s C++ model: started
from the same parameters, the two agree iteration by iteration within float rounding."""

import json
import os
import re
import shutil
import subprocess

import pytest

import bagpipe

from conftest import BAGPIPE_BINARY, SOURCE_DIR

DATA = "synthetic:samples=12000,tables=6,scale=0.0005,alpha=1.1,pooling=1-2,seed=9"
COMMON = ["--data", DATA, "--batch-size", "256", "--iterations", "14", "--cache-rows", "1500",
          "--lookahead", "6", "--dim", "8", "--top", "16-1", "--optimizer", "adagrad",
          "--lr", "0.05", "--eps", "1e-10", "--dense-lr", "0.1", "--deterministic", "--quiet",
          "--metrics-interval", "5", "--eval-fraction", "0.05"]


def check_cache_modes_end_bit_identical(example, tmp_path, trainers, device="cpu"):
    """Runs the example with each cache mode; returns the `off` run's summary."""
    summaries = {}
    for mode in ["off", "oracle", "lru"]:
        out = str(tmp_path / mode)
        summaries[mode] = example.main(COMMON + ["--cache", mode, "--trainers", str(trainers),
                                                 "--device", device, "--out", out,
                                                 "--dump-params", out])
    off = summaries["off"]
    assert off["device"] == device
    assert off["trainers"] == trainers and off["iterations"] == 14
    assert off["model"] == "pytorch-dlrm" and off["eps"] == pytest.approx(1e-10)
    assert off["dense_lr"] == pytest.approx(0.1)
    assert off["fills"] > 0 and "eval" in off
    for mode in ["oracle", "lru"]:
        run = summaries[mode]
        assert run["params_sha256"] == off["params_sha256"], f"{mode} T={trainers} differs"
        assert run["train_loss"] == off["train_loss"]
        assert run["hit_rate"] > 0.2, f"{mode}: the cache served no rows"
        assert run["fetched_bytes"] < off["fetched_bytes"]
        if trainers == 2:
            assert run["exchanged_rows"] > 0, f"{mode}: no shared-row gradient was exchanged"
    assert off["hit_rate"] == 0
    return off


@pytest.mark.parametrize("trainers", [1, 2])
def test_cache_modes_end_bit_identical(example, tmp_path, trainers):
    check_cache_modes_end_bit_identical(example, tmp_path, trainers)
    # The runs are bagpipe runs: compare reads them (summary, metrics, params.bin).
    result = subprocess.run([BAGPIPE_BINARY, "compare", str(tmp_path / "off"),
                             str(tmp_path / "oracle")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "parameters bit-identical: yes" in result.stdout
    assert os.path.exists(tmp_path / "oracle" / "metrics.jsonl")


def every_iteration(args):
    """`args` with a metrics line per iteration."""
    i = args.index("--metrics-interval")
    return args[:i] + args[i + 2:] + ["--metrics-interval", "1"]


def train_losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if r.get("kind") == "train"]


@pytest.mark.parametrize("model,cache,trainers", [("dlrm", "oracle", 1), ("dlrm", "lru", 2),
                                                  ("logreg", "oracle", 1)])
def test_the_torch_model_is_a_twin_of_bagpipe_trains_cpp_model(example, tmp_path, model, cache,
                                                                trainers):
    # The same flags through `bagpipe train` (the C++ DLRM or logistic regression) and through
    # the example (torch.nn, started from bagpipe.initial_dense_parameters): the same losses at
    # every iteration and the same parameters at the end, up to float rounding (the two sum
    # their matrix products in different orders).
    args = every_iteration(COMMON) + ["--bottom", "13-16-8", "--model", model, "--cache", cache,
                                      "--trainers", str(trainers)]
    cpp, torch_run = str(tmp_path / "cpp"), str(tmp_path / "torch")
    result = subprocess.run([BAGPIPE_BINARY, "train"] + args + ["--out", cpp, "--dump-params", cpp],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    summary = example.main(args + ["--out", torch_run, "--dump-params", torch_run])
    assert summary["hit_rate"] > 0 and summary["fills"] > 0
    if trainers > 1:
        assert summary["exchanged_rows"] > 0
    ours, theirs = train_losses(torch_run), train_losses(cpp)
    assert len(ours) == len(theirs) == 14
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    assert worst <= 1e-5, f"{model}: losses differ by {worst:.2e} (relative)\n{ours}\n{theirs}"
    compared = subprocess.run([BAGPIPE_BINARY, "compare", cpp, torch_run], capture_output=True,
                              text=True)
    assert compared.returncode == 0, compared.stderr
    found = re.search(r"max \|a - b\|: dense ([0-9.e+-]+), embedding rows ([0-9.e+-]+)",
                      compared.stdout)
    assert found, compared.stdout
    dense, rows = float(found.group(1)), float(found.group(2))
    assert dense <= 1e-5 and rows <= 1e-4, compared.stdout


def test_the_twin_comparison_can_fail(example, tmp_path):
    # Another seed for the torch model's start is visible in the losses.
    args = every_iteration(COMMON) + ["--bottom", "13-16-8", "--cache", "oracle"]
    cpp, torch_run = str(tmp_path / "cpp"), str(tmp_path / "torch")
    subprocess.run([BAGPIPE_BINARY, "train"] + args + ["--out", cpp], check=True,
                   capture_output=True)
    example.main(args + ["--out", torch_run, "--seed", "2"])
    ours, theirs = train_losses(torch_run), train_losses(cpp)
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) > 1e-3


def test_logreg_head_and_a_second_seed_change_the_result(example, tmp_path):
    base = COMMON + ["--cache", "oracle", "--model", "logreg"]
    a = example.main(base + ["--out", str(tmp_path / "a")])
    b = example.main(base + ["--out", str(tmp_path / "b"), "--seed", "2"])
    assert a["model"] == "pytorch-logreg" and a["hit_rate"] > 0
    assert a["params_sha256"] != b["params_sha256"]  # the fingerprint can fail


def test_data_without_dense_features_trains_logreg_and_refuses_dlrm(example, tmp_path):
    # As bagpipe train (cli_test): the embedding-only model trains on ids alone; the DLRM says
    # what it lacks.
    movielens = os.path.join(SOURCE_DIR, "tests", "fixtures", "movielens_small.csv")
    args = ["--data", f"csv:{movielens}", "--schema", "label=rating>3.5; sparse=userId,movieId",
            "--batch-size", "512", "--iterations", "6", "--dim", "8", "--cache-rows", "3000",
            "--lookahead", "4", "--quiet"]
    run = example.main(args + ["--model", "logreg", "--out", str(tmp_path / "logreg")])
    assert run["iterations"] == 6 and run["hit_rate"] > 0 and run["fills"] > 0
    with pytest.raises(bagpipe.ConfigError, match="no dense features.*--model logreg"):
        example.main(args + ["--model", "dlrm", "--out", str(tmp_path / "dlrm")])



def metrics_lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_a_resumed_run_continues_the_metrics_as_bagpipe_train_does(example, tmp_path):
    # Ended after iteration 7 (between two reports of --metrics-interval 5), resumed to 14 into
    # the same run directory: the metrics keep the lines up to 7 (the first run's final one
    # too), number on from there and count every sample; the report that straddles the resume
    # (iteration 10) covers only the iterations after it (docs/checkpoints.md), the others
    # equal the straight run's.
    base = COMMON + ["--cache", "oracle", "--trainers", "2"]
    straight = example.main(base + ["--out", str(tmp_path / "straight")])
    checkpoints = str(tmp_path / "ckpt")
    resumed_dir = str(tmp_path / "resumed")
    cut = [a if a != "14" else "7" for a in base]
    example.main(cut + ["--out", resumed_dir, "--checkpoint-dir", checkpoints])
    assert [m["iteration"] for m in metrics_lines(resumed_dir)] == [5, 7]
    resumed = example.main(base + ["--out", resumed_dir, "--resume", checkpoints])
    assert resumed["params_sha256"] == straight["params_sha256"]
    assert resumed["iterations"] == 7 and resumed["fills"] > 0
    a, b = metrics_lines(tmp_path / "straight"), metrics_lines(resumed_dir)
    assert [m["iteration"] for m in a] == [5, 10, 14]
    assert [m["iteration"] for m in b] == [5, 7, 10, 14]
    assert [m["samples"] for m in a] == [1280, 2560, 3584]
    assert [m["samples"] for m in b] == [1280, 1792, 2560, 3584]
    # Each line says how many iterations its loss covers: the one that straddles the resume 3.
    assert [m["iterations"] for m in a] == [5, 5, 4]
    assert [m["iterations"] for m in b] == [5, 2, 3, 4]
    assert b[0]["loss"] == a[0]["loss"] and b[3]["loss"] == a[2]["loss"]
    assert b[3]["final"] and resumed["train_loss"] == straight["train_loss"]
    # Resumed at its last iteration: nothing to train, no line added, no training loss.
    again = example.main(base + ["--out", resumed_dir, "--resume", checkpoints])
    assert again["iterations"] == 0 and again["train_loss"] is None
    assert metrics_lines(resumed_dir) == b


@pytest.mark.parametrize("first,then", [([], ["--bottom", "13-64-8"]),
                                        (["--bottom", "13-64-8"], [])])
def test_a_resume_naming_the_default_bottom_continues_one_that_left_it_out(example, tmp_path,
                                                                          first, then):
    # The checkpoints record the layers --bottom stands for (DENSE-64-DIM left out, for the
    # data's 13 dense features): both forms are one model. Other layers are another one.
    base = COMMON + ["--cache", "oracle"]
    checkpoints = str(tmp_path / "ckpt")
    cut = [a if a != "14" else "7" for a in base]
    example.main(cut + first + ["--checkpoint-dir", checkpoints])
    with pytest.raises(bagpipe.Error, match='option model: bottom is "13-64-8" in the checkpoint '
                                            'and "13-32-8" here'):
        example.main(base + ["--bottom", "13-32-8", "--resume", checkpoints])
    resumed = example.main(base + then + ["--resume", checkpoints])
    assert resumed["iterations"] == 7


def test_a_checkpoint_that_recorded_the_bottom_as_given_still_resumes(example, tmp_path,
                                                                      monkeypatch):
    # Checkpoints written before --bottom was recorded resolved hold it as given ("" left out):
    # "" is the default for this data, layers given are compared as they are.
    base = COMMON + ["--cache", "oracle"]
    cut = [a if a != "14" else "7" for a in base]
    resolved = example.checkpoint_identity

    def as_given(flags, config, schema):
        return {**resolved(flags, config, schema), "bottom": flags["bottom"]}

    for name, first in (("omitted", []), ("given", ["--bottom", "13-64-8"])):
        checkpoints = str(tmp_path / name)
        with monkeypatch.context() as patch:
            patch.setattr(example, "checkpoint_identity", as_given)
            example.main(cut + first + ["--checkpoint-dir", checkpoints])
        with pytest.raises(bagpipe.Error, match="option model: bottom is"):
            example.main(base + ["--bottom", "13-32-8", "--resume", checkpoints])
        for then in ([], ["--bottom", "13-64-8"]):
            resumed = example.main(base + then + ["--resume", checkpoints,
                                                  "--checkpoint-dir", str(tmp_path / "elsewhere")])
            assert resumed["iterations"] == 7
            shutil.rmtree(tmp_path / "elsewhere")
