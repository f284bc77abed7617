#!/usr/bin/env python3
"""Plots `bagpipe train` runs side by side: training loss and samples/s against iteration.

Usage: scripts/plot_runs.py RUN_DIR [RUN_DIR ...] --out PREFIX

Each RUN_DIR is a `bagpipe train --out` directory: its metrics.jsonl (lines of kind "train")
gives the curves and its summary.json the label (the "cache" mode; the directory name when
two runs share a mode or the summary is missing). Writes PREFIX_loss.png and
PREFIX_throughput.png. Needs matplotlib (Debian: python3-matplotlib, which
`scripts/setup.sh --with-plots` installs); exits 2 without it.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plotting import import_pyplot  # noqa: E402


def read_run(run_dir):
    """Returns (label, iterations, losses, samples_per_s) of one run directory."""
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        what = "is not a file" if os.path.exists(metrics) else "does not exist"
        raise FileNotFoundError(f"{metrics} {what}")
    iterations, losses, rates = [], [], []
    with open(metrics) as f:
        for number, line in enumerate(f, 1):
            complete = line.endswith("\n")
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                if not complete:
                    break  # the line a killed job was writing (core/metrics.h)
                raise ValueError(f"{metrics}:{number}: not JSON ({e})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{metrics}:{number}: not a JSON object")
            if record.get("kind") != "train":
                continue
            if not isinstance(record.get("iteration"), int):
                raise ValueError(f"{metrics}:{number}: no integer \"iteration\"")
            iterations.append(record["iteration"])
            losses.append(record.get("loss"))
            rates.append(record.get("samples_per_s"))
    label = None
    summary = os.path.join(run_dir, "summary.json")
    if os.path.isfile(summary):
        with open(summary) as f:
            try:
                record = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{summary}: not JSON ({e})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{summary}: not a JSON object")
        label = record.get("cache")
    return label, iterations, losses, rates


def main():
    parser = argparse.ArgumentParser(
        description="Plot training loss and samples/s vs iteration of bagpipe train runs.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="bagpipe train --out directory (metrics.jsonl, summary.json)")
    parser.add_argument("--out", required=True, metavar="PREFIX",
                        help="write PREFIX_loss.png and PREFIX_throughput.png")
    parser.add_argument("--title", default="", help="title prefix of both plots")
    args = parser.parse_args()

    runs = []
    for run_dir in args.runs:
        try:
            label, iterations, losses, rates = read_run(run_dir)
        except (OSError, ValueError, KeyError) as e:
            print(f"plot_runs.py: {run_dir}: {e}", file=sys.stderr)
            return 1
        if not iterations:
            print(f"plot_runs.py: {run_dir}: no \"train\" lines in metrics.jsonl", file=sys.stderr)
            return 1
        runs.append([label, run_dir, iterations, losses, rates])

    # Label by cache mode; fall back to (or add) the directory name when it would be ambiguous.
    labels = [r[0] for r in runs]
    for r in runs:
        name = os.path.basename(os.path.normpath(r[1]))
        if r[0] is None:
            r[0] = name
        elif labels.count(r[0]) > 1:
            r[0] = f"{r[0]} ({name})"

    plt = import_pyplot()
    outputs = []
    for suffix, column, ylabel in (("loss", 3, "training loss (interval mean)"),
                                   ("throughput", 4, "samples/s")):
        fig, ax = plt.subplots(figsize=(8, 5))
        for r in runs:
            points = [(i, y) for i, y in zip(r[2], r[column]) if y is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=r[0])
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        title = ("training loss" if suffix == "loss" else "throughput")
        ax.set_title(f"{args.title}: {title}" if args.title else title)
        if suffix == "throughput":
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = f"{args.out}_{suffix}.png"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            fig.savefig(path, dpi=120)
        except OSError as e:
            print(f"plot_runs.py: cannot write {path}: {e}", file=sys.stderr)
            return 1
        plt.close(fig)
        outputs.append(path)
    print("wrote " + " and ".join(outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
