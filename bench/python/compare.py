#!/usr/bin/env python3
"""A PyTorch loop through `import bagpipe` against `bagpipe train`, side by side in one run.

  (a) the binding's own cost: examples/dlrm_pytorch.py --model logreg (an embedding-only
      logistic regression in torch) against `bagpipe train --model logreg` (the same head in
      C++): same data, cache and runtime, so the difference is the Python loop, torch's
      autograd and the binding's crossings;
  (b) the whole picture: the example's torch.nn DLRM against bagpipe train's native DLRM, with
      each iteration split into the dense model (forward/backward + optimizer step) and the
      runtime (waiting for plans and rows, the boundary, lookup, gradient reduction, exchange,
      sparse optimizer, dense all-reduce).

Runs alternate (C++, Python, C++, Python, ...) so that both see the same machine load, each a
separate process on the same binary data file. Two figures per run:
  - wall ms/iteration in the steady state: from the metrics line at --warmup iterations to the
    last (the oracle's first plan waits for its window);
  - CPU ms/iteration: the process's user + system time of a long run minus that of a short run
    of the same kind, over the iterations between them — start-up (importing torch) cancels
    out, and time the process spends descheduled on a busy machine does not count.

With --callgrind N1,N2 (a) is also counted in instructions (valgrind --tool=callgrind, the
robust figure on a shared machine): each variant runs N1 and N2 iterations and the difference
over N2 - N1 is its instructions per iteration (all threads: the runtime's are the same in both).

Usage: /usr/bin/python3 bench/python/compare.py [--batch-size 4096] [--tables 26] [--dim 16]
           [--logreg-iterations 250] [--dlrm-iterations 40] [--short-fraction 0.25]
           [--warmup 10] [--repeats 3]
           [--threads 1] [--callgrind 10,30] [--skip-timing] [--out DIR]
Environment: BAGPIPE (default build/bagpipe); the package is taken from build/python.
Prints Markdown tables (and writes DIR/compare.md and DIR/compare.json with --out).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BAGPIPE = os.environ.get("BAGPIPE", os.path.join(REPO, "build", "bagpipe"))
EXAMPLE = os.path.join(REPO, "examples", "dlrm_pytorch.py")
RUNTIME = ("wait", "boundary", "lookup", "reduce", "sync", "apply", "allreduce")
DENSE = ("forward_backward", "optimizer")


def steady(run_dir, warmup):
    """(ms/iteration after `warmup`, time_ms averaged over those intervals) from metrics.jsonl."""
    lines = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    lines = [line for line in lines if line.get("kind") == "train"]
    start = next((line for line in lines if line["iteration"] >= warmup), lines[0])
    if start is lines[-1]:
        start = {"iteration": 0, "seconds": 0.0}
    after = [line for line in lines if line["iteration"] > start["iteration"]]
    iterations = lines[-1]["iteration"] - start["iteration"]
    ms = 1e3 * (lines[-1]["seconds"] - start["seconds"]) / iterations
    phases = {}
    previous = start["iteration"]
    for line in after:
        count = line["iteration"] - previous
        previous = line["iteration"]
        for key, value in line["time_ms"].items():
            phases[key] = phases.get(key, 0.0) + value * count / iterations
    return ms, phases


def run_process(command, env):
    """Runs `command`; returns (exit status, stderr, user + system CPU seconds)."""
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=env, text=True)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, stderr, usage.ru_utime + usage.ru_stime


def run(kind, model, args, work, index, env, iterations):
    out = os.path.join(work, f"{kind}_{model}_{index}_{iterations}")
    common = ["--data", f"bin:{args.data}", "--batch-size", str(args.batch_size),
              "--iterations", str(iterations),
              "--cache", "oracle", "--cache-rows", str(args.cache_rows), "--lookahead", "20",
              "--dim", str(args.dim), "--optimizer", "adagrad", "--lr", "0.01",
              "--model", model, "--quiet", "--metrics-interval", str(args.interval),
              "--out", out]
    command = ([BAGPIPE, "train"] if kind == "cpp" else [sys.executable, EXAMPLE]) + common
    started = time.monotonic()
    code, stderr, cpu = run_process(command, env)
    if code != 0:
        sys.exit(f"compare.py: {' '.join(command)} failed:\n{stderr[-3000:]}")
    ms, phases = steady(out, args.warmup)
    summary = json.load(open(os.path.join(out, "summary.json")))
    return {"ms": ms, "phases": phases, "wall": time.monotonic() - started, "cpu": cpu,
            "iterations": iterations, "hit_rate": summary["hit_rate"],
            "sha": summary["params_sha256"]}


def instructions(kind, args, work, env, iterations):
    """Instructions (callgrind's Ir, all threads) of a logreg run of `iterations`."""
    out = os.path.join(work, f"callgrind_{kind}_{iterations}")
    common = ["--data", f"bin:{args.data}", "--batch-size", str(args.batch_size),
              "--iterations", str(iterations), "--cache", "oracle", "--cache-rows",
              str(args.cache_rows), "--lookahead", "20", "--dim", str(args.dim), "--optimizer",
              "adagrad", "--lr", "0.01", "--model", "logreg", "--quiet", "--metrics-interval",
              str(args.interval), "--out", out]
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.callgrind"] + (
        [BAGPIPE, "train"] if kind == "cpp" else [sys.executable, EXAMPLE]) + common
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in result.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split(":")[-1])
    sys.exit(f"compare.py: no instruction count from {' '.join(command)}:\n"
             f"{result.stderr[-3000:]}")


def measure(kind, model, args, work, index, env):
    """A long run (its steady wall time and phases) and the CPU per iteration against a short
    run of the same kind."""
    total = args.logreg_iterations if model == "logreg" else args.dlrm_iterations
    short = run(kind, model, args, work, index, env, max(args.warmup + 5,
                                                          int(total * args.short_fraction)))
    long = run(kind, model, args, work, index, env, total)
    long["cpu_ms"] = 1e3 * (long["cpu"] - short["cpu"]) / (total - short["iterations"])
    return long


def split(phases):
    dense = sum(phases.get(key, 0.0) for key in DENSE)
    runtime = sum(phases.get(key, 0.0) for key in RUNTIME)
    return dense, runtime


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--logreg-iterations", type=int, default=250)
    parser.add_argument("--dlrm-iterations", type=int, default=40)
    parser.add_argument("--short-fraction", type=float, default=0.25,
                        help="the short run's iterations, as a fraction of the long run's")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS for both (PyTorch's default: the physical cores; "
                             "OpenMP threads spin, which distorts timings on a busy machine)")
    parser.add_argument("--cache-rows", type=int, default=60000)
    parser.add_argument("--callgrind", help="N1,N2: also count (a)'s instructions per iteration")
    parser.add_argument("--skip-timing", action="store_true", help="only the callgrind counts")
    parser.add_argument("--out", help="keep the runs here and write compare.md/compare.json")
    args = parser.parse_args()
    args.interval = 5
    work = args.out or tempfile.mkdtemp(prefix="bagpipe_compare_")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "build", "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = str(args.threads)

    iterations = max(args.logreg_iterations, args.dlrm_iterations)
    args.data = os.path.join(work, "data.bin")
    if not os.path.exists(args.data):
        spec = (f"synthetic:samples={args.batch_size * (iterations + 1)},tables={args.tables},"
                f"scale=0.01,alpha=1.05,seed=7")
        subprocess.run([BAGPIPE, "convert", "--data", spec, "--out", args.data, "--quiet"],
                       check=True, capture_output=True)

    load = os.getloadavg()
    results = {"logreg": {"cpp": [], "py": []}, "dlrm": {"cpp": [], "py": []}}
    counts = {}
    if args.callgrind:
        n1, n2 = (int(n) for n in args.callgrind.split(","))
        for kind in ("cpp", "py"):
            low, high = instructions(kind, args, work, env, n1), instructions(kind, args, work,
                                                                               env, n2)
            counts[kind] = (high - low) / (n2 - n1)
            print(f"logreg {kind}: {counts[kind] / 1e6:.1f}M instructions/it", file=sys.stderr)
    for model in ("logreg", "dlrm"):
        for index in range(0 if args.skip_timing else args.repeats):
            for kind in ("cpp", "py"):
                results[model][kind].append(measure(kind, model, args, work, index, env))
                r = results[model][kind][-1]
                print(f"{model} {kind} #{index}: {r['ms']:.2f} ms/it wall, {r['cpu_ms']:.2f} "
                      f"ms/it CPU", file=sys.stderr)
    load_after = os.getloadavg()

    lines = []
    lines.append(f"{args.tables} tables, dim {args.dim}, global batch {args.batch_size}, "
                 f"oracle cache of {args.cache_rows} rows, L = 20, 1 trainer, 1 server, "
                 f"{args.threads} threads; steady ms/iteration after {args.warmup} "
                 f"iterations; {args.repeats} alternating pairs; load average "
                 f"{load[0]:.1f} before, {load_after[0]:.1f} after.")
    lines.append("")
    lines.append("(a) embedding-only head (`--model logreg`): the binding's own cost")
    lines.append("")
    if counts:
        lines.append(f"Instructions per iteration (callgrind, {args.callgrind} iterations): "
                     f"bagpipe train {counts['cpp'] / 1e6:.1f}M, PyTorch loop "
                     f"{counts['py'] / 1e6:.1f}M, ratio {counts['py'] / counts['cpp']:.3f}.")
        lines.append("")
    lines.append("| run | C++ wall ms/it | PyTorch wall ms/it | ratio | C++ CPU ms/it | "
                 "PyTorch CPU ms/it | ratio |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    wall_ratios, cpu_ratios = [], []
    for index in range(len(results["logreg"]["cpp"])):
        cpp = results["logreg"]["cpp"][index]
        py = results["logreg"]["py"][index]
        wall_ratios.append(py["ms"] / cpp["ms"])
        cpu_ratios.append(py["cpu_ms"] / cpp["cpu_ms"])
        lines.append(f"| {index + 1} | {cpp['ms']:.2f} | {py['ms']:.2f} | {wall_ratios[-1]:.3f} |"
                     f" {cpp['cpu_ms']:.2f} | {py['cpu_ms']:.2f} | {cpu_ratios[-1]:.3f} |")
    if args.repeats and not args.skip_timing:
        median = lambda kind, key: statistics.median(r[key] for r in results["logreg"][kind])
        lines.append(f"| median | {median('cpp', 'ms'):.2f} | {median('py', 'ms'):.2f} | "
                     f"{statistics.median(wall_ratios):.3f} | {median('cpp', 'cpu_ms'):.2f} | "
                     f"{median('py', 'cpu_ms'):.2f} | {statistics.median(cpu_ratios):.3f} |")
    lines.append("")
    lines.append("(b) DLRM (bottom 13-64-16, top 64-32-1): dense model against runtime, ms/it")
    lines.append("")
    lines.append("| run | model | wall ms/it | dense (fwd/bwd + step) | runtime | other | "
                 "CPU ms/it | hit rate |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for index in range(len(results["dlrm"]["cpp"])):
        for kind, name in (("cpp", "bagpipe train (C++ DLRM)"), ("py", "torch.nn DLRM")):
            r = results["dlrm"][kind][index]
            dense, runtime = split(r["phases"])
            lines.append(f"| {index + 1} | {name} | {r['ms']:.1f} | {dense:.1f} | {runtime:.1f} |"
                         f" {r['ms'] - dense - runtime:.1f} | {r['cpu_ms']:.1f} | "
                         f"{100 * r['hit_rate']:.1f}% |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(os.path.join(work, "compare.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(work, "compare.json"), "w") as f:
            json.dump({"args": vars(args), "load": [load, load_after], "results": results,
                       "instructions_per_iteration": counts}, f, indent=1)


if __name__ == "__main__":
    main()
