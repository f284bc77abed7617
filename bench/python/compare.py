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
separate process on the same binary data file. Two figures per run, both over the same steady
state: from the metrics line at --warmup iterations to the last (the oracle's first plan waits
for its window; start-up, importing torch, the final flush and the parameters' fingerprint are
left out):
  - wall ms/iteration, from the metrics lines' clock;
  - CPU ms/iteration: the process's user + system time (all threads, /proc/PID/stat) read when
    each metrics line appears (the file is polled every 2 ms); time the process spends
    descheduled on a busy machine does not count. Minor page faults per iteration come from the
    same readings.

With --callgrind N1,N2 (a) is also counted in instructions (valgrind --tool=callgrind, the
robust figure on a shared machine): each variant runs N1 and N2 iterations and the difference
over N2 - N1 is its instructions per iteration (all threads: the runtime's are the same in both).

Usage: /usr/bin/python3 bench/python/compare.py [--batch-size 4096] [--tables 26] [--dim 16]
           [--logreg-iterations 250] [--dlrm-iterations 40] [--warmup 10] [--repeats 3]
           [--threads 1] [--callgrind 10,30] [--skip-timing] [--models logreg,dlrm]
           [--out DIR]
Environment: BAGPIPE (default build/bagpipe); the package is taken from build/python.
Prints Markdown tables (and writes DIR/compare.md and DIR/compare.json with --out).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BAGPIPE = os.environ.get("BAGPIPE", os.path.join(REPO, "build", "bagpipe"))
EXAMPLE = os.path.join(REPO, "examples", "dlrm_pytorch.py")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RUNTIME = ("wait", "boundary", "lookup", "reduce", "sync", "apply", "allreduce")
DENSE = ("forward_backward", "optimizer")


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.endswith("\n")]
    return [line for line in lines if line.get("kind") == "train"]


def proc_usage(pid):
    """(user + system CPU seconds of all the process's threads, minor page faults) or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Fields after the command: state is 3, minflt 10, utime 14, stime 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[7])


def steady(lines, usage, warmup):
    """Steady-state figures after `warmup` iterations: (wall ms/it, CPU ms/it, minor faults/it,
    time_ms averaged over those intervals). `usage` maps an iteration to the process's
    (CPU seconds, minor faults) when its metrics line appeared."""
    start = next((line for line in lines if line["iteration"] >= warmup), lines[0])
    if start is lines[-1]:
        sys.exit(f"compare.py: no steady state after {warmup} iterations: run more iterations")
    end = lines[-1]
    after = [line for line in lines if line["iteration"] > start["iteration"]]
    iterations = end["iteration"] - start["iteration"]
    ms = 1e3 * (end["seconds"] - start["seconds"]) / iterations
    (cpu0, faults0), (cpu1, faults1) = usage[start["iteration"]], usage[end["iteration"]]
    phases = {}
    previous = start["iteration"]
    for line in after:
        count = line["iteration"] - previous
        previous = line["iteration"]
        for key, value in line["time_ms"].items():
            phases[key] = phases.get(key, 0.0) + value * count / iterations
    return ms, 1e3 * (cpu1 - cpu0) / iterations, (faults1 - faults0) / iterations, phases


def run_process(command, env, run_dir):
    """Runs `command`; returns (exit status, stderr, {iteration: (CPU seconds, minor faults)} read
    as each metrics line of `run_dir` appeared)."""
    usage = {}
    with tempfile.TemporaryFile(mode="w+") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                 text=True)
        path = os.path.join(run_dir, "metrics.jsonl")
        seen, size = 0, -1
        while child.poll() is None:
            try:
                grown = os.stat(path).st_size != size
            except OSError:
                grown = False
            if grown:
                # The usage first: a line written after it is read at the next poll.
                now = proc_usage(child.pid)
                size = os.stat(path).st_size
                lines = read_metrics(run_dir)
                if now is not None:
                    for line in lines[seen:]:
                        usage[line["iteration"]] = now
                    seen = len(lines)
            time.sleep(0.002)
        stderr.seek(0)
        return child.returncode, stderr.read(), usage


def run(kind, model, args, work, index, env, iterations):
    out = os.path.join(work, f"{kind}_{model}_{index}_{iterations}")
    common = ["--data", f"bin:{args.data}", "--batch-size", str(args.batch_size),
              "--iterations", str(iterations),
              "--cache", "oracle", "--cache-rows", str(args.cache_rows), "--lookahead", "20",
              "--dim", str(args.dim), "--optimizer", "adagrad", "--lr", "0.01",
              "--model", model, "--quiet", "--metrics-interval", str(args.interval),
              "--out", out]
    command = ([BAGPIPE, "train"] if kind == "cpp" else [sys.executable, EXAMPLE]) + common
    shutil.rmtree(out, ignore_errors=True)  # a metrics.jsonl of an earlier run would be read
    started = time.monotonic()
    code, stderr, usage = run_process(command, env, out)
    if code != 0:
        sys.exit(f"compare.py: {' '.join(command)} failed:\n{stderr[-3000:]}")
    # A line written as the process ended may have no reading: the steady state ends before it.
    lines = [line for line in read_metrics(out) if line["iteration"] in usage]
    if not lines:
        sys.exit(f"compare.py: {' '.join(command)}: no metrics line was seen while it ran")
    ms, cpu_ms, faults, phases = steady(lines, usage, args.warmup)
    summary = json.load(open(os.path.join(out, "summary.json")))
    return {"ms": ms, "cpu_ms": cpu_ms, "faults": faults, "phases": phases,
            "wall": time.monotonic() - started, "iterations": iterations,
            "hit_rate": summary["hit_rate"], "sha": summary["params_sha256"]}


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
    total = args.logreg_iterations if model == "logreg" else args.dlrm_iterations
    return run(kind, model, args, work, index, env, total)


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
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS for both (PyTorch's default: the physical cores; "
                             "OpenMP threads spin, which distorts timings on a busy machine)")
    parser.add_argument("--cache-rows", type=int, default=60000)
    parser.add_argument("--callgrind", help="N1,N2: also count (a)'s instructions per iteration")
    parser.add_argument("--skip-timing", action="store_true", help="only the callgrind counts")
    parser.add_argument("--models", default="logreg,dlrm",
                        help="which comparisons to time: logreg (a), dlrm (b) or both")
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
    models = [m for m in ("logreg", "dlrm") if m in args.models.split(",")]
    for model in models:
        for index in range(0 if args.skip_timing else args.repeats):
            for kind in ("cpp", "py"):
                results[model][kind].append(measure(kind, model, args, work, index, env))
                r = results[model][kind][-1]
                print(f"{model} {kind} #{index}: {r['ms']:.2f} ms/it wall, {r['cpu_ms']:.2f} "
                      f"ms/it CPU, {r['faults']:.0f} minor faults/it, load "
                      f"{os.getloadavg()[0]:.1f}", file=sys.stderr)
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
                 "PyTorch CPU ms/it | ratio | minor faults/it C++, PyTorch |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    wall_ratios, cpu_ratios = [], []
    for index in range(len(results["logreg"]["cpp"])):
        cpp = results["logreg"]["cpp"][index]
        py = results["logreg"]["py"][index]
        wall_ratios.append(py["ms"] / cpp["ms"])
        cpu_ratios.append(py["cpu_ms"] / cpp["cpu_ms"])
        lines.append(f"| {index + 1} | {cpp['ms']:.2f} | {py['ms']:.2f} | {wall_ratios[-1]:.3f} |"
                     f" {cpp['cpu_ms']:.2f} | {py['cpu_ms']:.2f} | {cpu_ratios[-1]:.3f} |"
                     f" {cpp['faults']:.0f}, {py['faults']:.0f} |")
    if results["logreg"]["cpp"]:
        median = lambda kind, key: statistics.median(r[key] for r in results["logreg"][kind])
        lines.append(f"| median | {median('cpp', 'ms'):.2f} | {median('py', 'ms'):.2f} | "
                     f"{statistics.median(wall_ratios):.3f} | {median('cpp', 'cpu_ms'):.2f} | "
                     f"{median('py', 'cpu_ms'):.2f} | {statistics.median(cpu_ratios):.3f} | |")
    if "dlrm" in models:
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
                lines.append(f"| {index + 1} | {name} | {r['ms']:.1f} | {dense:.1f} | "
                             f"{runtime:.1f} | {r['ms'] - dense - runtime:.1f} | "
                             f"{r['cpu_ms']:.1f} | {100 * r['hit_rate']:.1f}% |")
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
