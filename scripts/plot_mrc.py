#!/usr/bin/env python3
"""Plots the miss-ratio curves that `bagpipe sim --mrc FILE.csv` writes.

Usage: scripts/plot_mrc.py FILE.csv --out PLOT.png [--log-x] [--title TEXT]

The CSV has a header and the columns policy,capacity,misses,accesses,miss_ratio; the plot has
one line per policy, miss ratio (%) against cache capacity in rows. A policy with a single point
(ttl, whose capacity is its peak resident rows) is drawn as a marker. Needs matplotlib (Debian:
python3-matplotlib, which `scripts/setup.sh --with-plots` installs); exits 2 without it.
"""
import argparse
import csv
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plotting import import_pyplot  # noqa: E402


def read_curves(path):
    """Returns {policy: [(capacity, miss_ratio), ...]} in file order of first appearance."""
    curves = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        required = {"policy", "capacity", "miss_ratio"}
        if reader.fieldnames is None or not required <= set(reader.fieldnames):
            raise ValueError(f"expected the columns {','.join(sorted(required))} in the header, "
                             f"got {reader.fieldnames}")
        for number, row in enumerate(reader, 2):
            try:
                point = (float(row["capacity"]), float(row["miss_ratio"]))
            except (TypeError, ValueError):
                raise ValueError(f"line {number}: bad capacity or miss_ratio: {row}") from None
            if not (math.isfinite(point[0]) and point[0] >= 0 and 0 <= point[1] <= 1):
                raise ValueError(f"line {number}: capacity must be a finite count and miss_ratio "
                                 f"in [0, 1]: {row}")
            curves.setdefault(row["policy"], []).append(point)
    if not curves:
        raise ValueError("no data rows")
    return curves


def main():
    parser = argparse.ArgumentParser(
        description="Plot miss ratio vs cache capacity per policy from bagpipe sim --mrc.")
    parser.add_argument("csv", metavar="FILE.csv", help="bagpipe sim --mrc output")
    parser.add_argument("--out", required=True, metavar="PLOT.png", help="image to write")
    parser.add_argument("--log-x", action="store_true", help="logarithmic capacity axis")
    parser.add_argument("--title", default="miss-ratio curve", help="plot title")
    args = parser.parse_args()

    try:
        curves = read_curves(args.csv)
    except (OSError, ValueError) as e:
        print(f"plot_mrc.py: {args.csv}: {e}", file=sys.stderr)
        return 1

    plt = import_pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for policy, points in curves.items():
        points.sort()
        xs = [p[0] for p in points]
        ys = [100.0 * p[1] for p in points]
        if len(points) == 1:
            ax.plot(xs, ys, marker="*", markersize=12, linestyle="none",
                    label=f"{policy} (peak rows)" if policy == "ttl" else policy)
        else:
            ax.plot(xs, ys, marker="o", markersize=4, label=policy)
    ax.set_xlabel("cache capacity (rows, all tables)")
    ax.set_ylabel("miss ratio (%)")
    ax.set_title(args.title)
    if args.log_x:
        ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        fig.savefig(args.out, dpi=120)
    except OSError as e:
        print(f"plot_mrc.py: cannot write {args.out}: {e}", file=sys.stderr)
        return 1
    plt.close(fig)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
