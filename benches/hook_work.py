"""What watching costs issue 35's dense job, counted rather than timed: the instructions and
the simulated I1 and D1 misses of each step, plainly and under `vramscope py --headless`,
split by where they run. Timing cannot settle a few percent on a shared machine; this count
is the same from run to run.

Valgrind's cachegrind runs the job four times: 5 and 25 steps (the difference is 20 steps,
start-up cancelled), plainly and hooked, two at a time. That takes about ten minutes on two
cores; it runs by hand, not in CI.

    cargo build --release -p vramscope --bin vramscope
    python3 benches/hook_work.py [--steps 5 25] [--keep DIR]

Under cachegrind a step takes about half a second, against ~9 ms at full speed. Work done on
a timer runs many times more often per step than at full speed: the flusher's round every
100 ms, and the zstd chunk the send thread packs after each round. Those rows are an upper
bound; the job's own thread (the Python interpreter, the capture shim) counts true.
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "py", "dense_mlp.py")
EVENTS = ("Ir", "I1mr", "D1mr")  # cachegrind's names: instructions, I1 misses, D1 read misses

# Where a function runs, by its name or source file: the job's thread (Python, the shim),
# vramscope's own threads (the Rust core, zstd), or shared (libc, torch).
GROUPS = (
    ("zstd, on the send thread", lambda fl, fn: re.match(r"(ZSTD_|HUF_|FSE_|HIST_)", fn)),
    ("the Rust core, on the flusher and send threads", lambda fl, fn: "vramscope_core" in fn or "vramscope_hook" in fn
     or fn.startswith(("alloc::", "hashbrown", "core::", "std::sys", "<", "crc32", "serde"))),
    ("the capture shim, on the job's thread", lambda fl, fn: fn.startswith(("vs::", "(anonymous namespace)", "std::vector<VsRaw", "std::chrono"))),
    ("libc: malloc, memset, memcpy, locks, clock", lambda fl, fn: re.search(r"malloc|memset|memmove|memcpy|memcmp|pthread|clock_gettime|tls_get|futex|\.S$", fl + " " + fn)),
    ("the Python interpreter, on the job's thread", lambda fl, fn: fl != "???"),
    ("torch, MKL and the rest", lambda fl, fn: True),
)


def group(fl, fn):
    return next(name for name, test in GROUPS if test(fl, fn))


def run(kind, steps, out, vramscope):
    """One cachegrind run of the dense job; the path of the job's own output file."""
    wrapper = os.path.join(out, "python")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file="{out}/%q{{VS_RUN}}.%p.out" "{sys.executable}" "$@"\n')
    os.chmod(wrapper, 0o755)
    job = [JOB, "--steps", str(steps), "--threads", "1"]
    cmd = [wrapper, *job] if kind == "plain" else [vramscope, "py", "--headless", "--python", wrapper, *job]
    # The same layout every run: string hashes and addresses move dict and pybind11 cache
    # lookups by some 100,000 instructions a step between runs otherwise.
    if shutil.which("setarch"):
        cmd = ["setarch", os.uname().machine, "-R", *cmd]
    env = dict(os.environ, VS_RUN=f"{kind}{steps}", PYTHONHASHSEED="0")
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"hook_work: the {kind} run of {steps} steps failed: {done.stderr.strip().splitlines()[-1:]}")
    # The hooked run's launcher asks the same Python a question first: the job is the file
    # whose command line names the job's script.
    for name in os.listdir(out):
        if name.startswith(f"{kind}{steps}.") and name.endswith(".out"):
            path = os.path.join(out, name)
            with open(path) as f:
                if any(line.startswith("cmd:") and JOB in line for line in f):
                    return path
    sys.exit(f"hook_work: no cachegrind output for the {kind} run of {steps} steps in {out}")


def load(path):
    """Each function's counts, by (source file, function name)."""
    totals = collections.defaultdict(lambda: [0] * len(EVENTS))
    with open(path) as f:
        lines = iter(f)
        names = next(line.split()[1:] for line in lines if line.startswith("events:"))
        pick = [names.index(e) for e in EVENTS]
        fl = fn = "???"
        for line in lines:
            if line.startswith("fl="):
                fl = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif line[:1].isdigit():
                counts = line.split()[1:]
                row = totals[(fl, fn)]
                for i, j in enumerate(pick):
                    row[i] += int(counts[j]) if j < len(counts) else 0
    return totals


def per_step(short, long, steps):
    """Counts per step, by group: the longer run less the shorter, over the steps between."""
    out = collections.defaultdict(lambda: [0.0] * len(EVENTS))
    for key in set(short) | set(long):
        row = out[group(*key)]
        for i in range(len(EVENTS)):
            row[i] += (long.get(key, [0] * len(EVENTS))[i] - short.get(key, [0] * len(EVENTS))[i]) / steps
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, nargs=2, default=(5, 25), metavar=("SHORT", "LONG"))
    p.add_argument("--keep", help="keep cachegrind's files here (default: a temporary folder, removed)")
    a = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("hook_work: valgrind is not installed (Debian: apt-get install valgrind)")
    vramscope = os.path.join(ROOT, "target", "release", "vramscope")
    if not os.access(vramscope, os.X_OK):
        sys.exit(f"hook_work: {vramscope} is missing: cargo build --release -p vramscope --bin vramscope")
    out = a.keep or tempfile.mkdtemp(prefix="hook_work.")
    os.makedirs(out, exist_ok=True)
    # A kept folder used before holds an earlier run's files under the same names.
    for name in os.listdir(out):
        if re.fullmatch(r"(plain|hooked)\d+\.\d+\.out", name):
            os.remove(os.path.join(out, name))
    short, long = a.steps
    with ThreadPoolExecutor(2) as pool:
        paths = {(k, s): pool.submit(run, k, s, out, vramscope) for s in (short, long) for k in ("plain", "hooked")}
        paths = {k: f.result() for k, f in paths.items()}
    plain = per_step(load(paths[("plain", short)]), load(paths[("plain", long)]), long - short)
    hooked = per_step(load(paths[("hooked", short)]), load(paths[("hooked", long)]), long - short)
    if not a.keep:
        shutil.rmtree(out)
    print(f"issue 35's dense job (tests/py/dense_mlp.py, one torch thread), per step, from {short} and {long}-step runs under cachegrind")
    for i, event in enumerate(("instructions", "I1 misses", "D1 read misses")):
        total_p = sum(r[i] for r in plain.values())
        total_h = sum(r[i] for r in hooked.values())
        print(f"  {event}: plain {total_p:,.0f}, hooked {total_h:,.0f}, {total_h / total_p:.3f}× (+{total_h - total_p:,.0f})")
        for name, _ in GROUPS:
            added = hooked[name][i] - plain[name][i]
            print(f"    {added:>+12,.0f}  {name}")


if __name__ == "__main__":
    main()
