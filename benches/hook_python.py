"""What the hook's Python costs the dense job of issue 35, apart from the core: the MLP of
tests/py/dense_mlp.py in one process, its steps run in turn

- plainly,
- with torch's own global module hooks doing nothing (any global hook sends every module
  call down torch's slower call path, whoever registered it),
- with `nn.Module.__call__` wrapped by a function doing nothing (how the hook follows
  modules instead),
- under vramscope_hook's `Hooks` with a core and a shim that do nothing,

interleaved ten steps at a time so machine noise hits all alike. With torch on one thread
every step's work is the main thread's, so steps are timed in its CPU time: another
tenant taking the core does not count. Beside each way's median over all its steps, it
prints the ratio turn by turn: each turn's median against the first way's turn beside it,
the median of those and their middle half (the machine's speed drifts over seconds, and
neighbouring turns share the drift). Run by
`cargo bench --bench hook_overhead -- --python [rounds] [steps]`.

Run under `vramscope py --headless` (`--python --real`), it times the real hook instead, in
one process: nothing followed (the shim's recording off and the hook's Python out for its
turns: the job as it runs plainly, its allocator passing through a shim that reads a flag),
the capture alone, and the capture with the hook's Python, with the real core and shim and
the viewer reading. Process to process, this machine's step time moves by a fifth, and
within one it moves for seconds at a time: each way runs ten steps in turn. (Not one:
patching a class, as the hook and the call wrapper do, makes Python look up every module's
methods afresh, which cost the step after each switch 0.2 ms; the step after a switch is
not timed.)

`--parts` times the hook's own work inside the step instead: each function it puts into
torch (module calls, backward, zero_grad, the optimizer's hooks) timed around, less the
time of what it wraps, as µs a step; with everything in the cache the same calls cost a
tenth of that (BENCHMARKS.md, issue 35). With `--real` too, the job's own hook is timed so,
its calls into the real core and shim counted in.

`--gc` also prints Python's collector: its runs and time inside each way's timed steps.

`--threads N` runs torch on N threads and times the wall clock instead of the main
thread's CPU time: a job on both of this machine's cores, where vramscope's own threads
take their share of them.

`--transformer [--device cuda]` times tests/py/train_transformer.py's model instead (d 512,
4 layers, ctx 256, batch 8, AdamW): on a GPU that size is launch-bound, and the hook made
its step 1.3-1.4× (BENCHMARKS.md, "The first runs on a GPU"). On CUDA a step is timed on the
wall clock between synchronizes, as the GPU's work is not the thread's."""

import ctypes
import gc
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "py")]

import dense_mlp  # noqa: E402
from vramscope_hook._hooks import Hooks  # noqa: E402

DEVICE = torch.device(sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu")
TRANSFORMER = "--transformer" in sys.argv


def build():
    if not TRANSFORMER:
        return dense_mlp.build()
    from train_transformer import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(d=512, heads=4, d_ff=2048, layers=4).to(DEVICE)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, opt):
    if not TRANSFORMER:
        return dense_mlp.step(model, opt)
    tokens = torch.randint(1000, (8, 256), device=DEVICE)
    targets = torch.randint(1000, (8, 256), device=DEVICE)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(tokens).view(-1, 1000), targets.view(-1)).backward()
    opt.step()


class Nothing:
    """A core whose every function does nothing and returns 0."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


class Shim(Nothing):
    """A shim that does nothing but has the real one's scope word, phase byte and tag word,
    which the hook writes in place (without them it would take a CUDA job's path, calling
    the core at every phase). Nothing reads its tag word: after the first input the hook
    finds it taken and calls the core, as it does where a tag still waits."""

    def __init__(self):
        self.words = (ctypes.c_uint64 * 2)()

    def vs_scope_slot(self):
        return ctypes.addressof(self.words)

    def vs_phase_slot(self):
        return ctypes.addressof(self.words) + 4

    def vs_tag_slot(self):
        return ctypes.addressof(self.words) + 8


def empty_hooks():
    mm = torch.nn.modules.module
    handles = [
        mm.register_module_forward_pre_hook(lambda module, args: None),
        mm.register_module_forward_hook(lambda module, args, *rest: None, with_kwargs=True, always_call=True),
    ]
    return lambda: [h.remove() for h in handles]


def wrapped_call():
    module, original = torch.nn.Module, torch.nn.Module.__call__

    def call(self, *args, **kwargs):
        return original(self, *args, **kwargs)

    module.__call__ = call
    return lambda: setattr(module, "__call__", original)


_OURS = []  # one `Hooks`, put in and taken out turn by turn: its model named once


def our_hooks():
    if not _OURS:
        _OURS.append(Hooks(torch, Shim(), Nothing()))
    _OURS[0].install()
    return _OURS[0].uninstall


def the_real_hook():
    """The job's own hook (this process runs under `vramscope py`), put back in."""
    import vramscope_hook

    hooks = vramscope_hook._state["hooks"]
    hooks.install()
    return hooks.uninstall


def nothing_followed():
    """The shim records nothing, and the hook's Python is out (as for the capture alone)."""
    import vramscope_hook

    shim = vramscope_hook._state["hooks"].shim
    shim.vs_set_capture_enabled(False)
    return lambda: shim.vs_set_capture_enabled(True)


def timed_step(model, opt):
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
        t = time.perf_counter()
        step(model, opt)
        torch.cuda.synchronize(DEVICE)
        return time.perf_counter() - t
    if THREADS > 1:  # torch's other threads' work is not the main thread's CPU time
        t = time.perf_counter()
        step(model, opt)
        return time.perf_counter() - t
    t = time.thread_time()
    step(model, opt)
    return time.thread_time() - t


REAL = "--real" in sys.argv
# One torch thread by default: no OpenMP stragglers, every step's work the main thread's, timed
# in its CPU time. `--threads N` times the wall clock instead, as a job on all its cores runs.
THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
BLOCK = 10  # steps each way in turn
OUT = sys.stderr if REAL else sys.stdout  # under vramscope py, stdout carries the step lines
if REAL:
    WAYS = {"nothing followed": nothing_followed, "the capture alone": lambda: (lambda: None), "with the hook's Python": the_real_hook}
else:
    WAYS = {"plain": lambda: (lambda: None), "torch's hook path": empty_hooks, "a call wrapper": wrapped_call, "the hook's Python": our_hooks}


class TimedHooks(Hooks):
    """The hook, each function it puts into torch timed less what that function wraps."""

    def __init__(self, *args):
        super().__init__(*args)
        self.spent = {}
        self._inside = []  # time in what the functions under way wrapped, innermost last

    def _patch(self, owner, attr, wrap):
        spent, inside = self.spent, self._inside

        def timing(original):
            def timed_original(*args, **kwargs):
                t = time.perf_counter_ns()
                try:
                    return original(*args, **kwargs)
                finally:
                    inside[-1] += time.perf_counter_ns() - t

            wrapped = wrap(timed_original)

            def timed(*args, **kwargs):
                inside.append(0)
                t = time.perf_counter_ns()
                try:
                    return wrapped(*args, **kwargs)
                finally:
                    spent[attr] = spent.get(attr, 0) + time.perf_counter_ns() - t - inside.pop()

            return timed

        super()._patch(owner, attr, timing)

    def _timed(self, name, f, *args):
        t = time.perf_counter_ns()
        try:
            return f(*args)
        finally:
            self.spent[name] = self.spent.get(name, 0) + time.perf_counter_ns() - t

    def _opt_pre(self, *args):
        return self._timed("optimizer pre-hook", super()._opt_pre, *args)

    def _opt_post(self, *args):
        return self._timed("optimizer post-hook", super()._opt_post, *args)


def parts(rounds, steps):
    model, opt = build()
    if REAL:
        # The job's own hook, timed: the real core's and shim's calls counted in.
        import vramscope_hook

        hooks = vramscope_hook._state["hooks"]
        hooks.uninstall()
        hooks.__class__ = TimedHooks
        hooks.spent, hooks._inside = {}, []
    else:
        hooks = TimedHooks(torch, Shim(), Nothing())
    hooks.install()
    for _ in range(50):
        step(model, opt)
    per_round = []
    for _ in range(rounds):
        hooks.spent.clear()
        for _ in range(steps):
            step(model, opt)
        per_round.append({k: v / steps / 1e3 for k, v in hooks.spent.items()})
    core = "the real core and shim" if REAL else "a core that does nothing"
    print(f"the hook's own work in the {'transformer' if TRANSFORMER else 'dense MLP'}'s step, with {core}, {rounds} rounds of {steps} steps (µs a step, median of rounds)", file=OUT)
    for name in sorted(per_round[0], key=lambda k: -per_round[0][k]):
        print(f"  {name + ':':<22} {statistics.median(r[name] for r in per_round):7.1f}", file=OUT)
    print(f"  {'all:':<22} {statistics.median(sum(r.values()) for r in per_round):7.1f}", file=OUT)


def main():
    numbers = [a for i, a in enumerate(sys.argv[1:], 1) if a.isdigit() and sys.argv[i - 1] != "--threads"]
    rounds = int(numbers[0]) if numbers else 12
    steps = int(numbers[1]) if len(numbers) > 1 else 100
    torch.set_num_threads(THREADS)
    if "--parts" in sys.argv:
        return parts(rounds, steps)
    if REAL:
        import vramscope_hook

        if not vramscope_hook.active():
            sys.exit("--real runs under `vramscope py --headless`: cargo bench --bench hook_overhead -- --python --real")
        vramscope_hook._state["hooks"].uninstall()
    model, opt = build()
    for _ in range(5 if TRANSFORMER else 50):  # the transformer's steps are long on a CPU
        step(model, opt)
    times = {way: [] for way in WAYS}
    turns = {way: [] for way in WAYS}  # each turn's median, for the ratios turn by turn
    order = list(WAYS)
    collector = Collector(WAYS) if "--gc" in sys.argv else None
    for n in range(max(1, rounds * steps // BLOCK)):
        for way in order if n % 2 == 0 else order[::-1]:
            remove = WAYS[way]()
            step(model, opt)
            if collector:
                collector.way = way
            block = [timed_step(model, opt) for _ in range(BLOCK)]
            if collector:
                collector.way = None
            times[way].extend(block)
            turns[way].append(statistics.median(block))
            remove()
    if REAL:
        the_real_hook()  # the job ends as it ran
    plain = statistics.median(times[order[0]])
    what = "transformer (d 512, 4 layers, ctx 256, batch 8)" if TRANSFORMER else "dense MLP"
    clock = "wall clock between synchronizes" if DEVICE.type == "cuda" else f"wall clock, {THREADS} torch threads" if THREADS > 1 else "CPU time, one torch thread"
    print(f"{what} on {DEVICE}, {len(times[order[0]])} steps each way, interleaved {BLOCK} at a time ({clock}, median)", file=OUT)
    for way, t in times.items():
        s = statistics.median(t)
        line = f"  {way + ':':<24} {s * 1e3:.3f} ms a step  {s / plain:.3f}×  (+{(s - plain) * 1e6:.0f} µs)"
        if way != order[0]:
            # Each turn against the first way's turn beside it: the machine's speed drifts
            # over seconds, and a pair of neighbouring turns shares it.
            q = statistics.quantiles((a / b for a, b in zip(turns[way], turns[order[0]])), n=4)
            line += f"  turn by turn {q[1]:.3f}× (middle half {q[0]:.3f}-{q[2]:.3f})"
        print(line, file=OUT)
    if collector:
        collector.report(len(times[order[0]]))


class Collector:
    """Python's collector inside each way's timed steps: whether the hook's objects make it
    run more (`--gc`)."""

    def __init__(self, ways):
        self.way = None
        self.spent = {way: [0.0, 0, 0, 0] for way in ways}  # seconds, runs of generation 0, 1, 2
        self.began = 0.0
        gc.callbacks.append(self.saw)

    def saw(self, phase, info):
        if self.way is None:
            return
        if phase == "start":
            self.began = time.perf_counter()
            return
        spent = self.spent[self.way]
        spent[0] += time.perf_counter() - self.began
        spent[1 + min(info["generation"], 2)] += 1

    def report(self, steps):
        for way, (seconds, *runs) in self.spent.items():
            print(f"  collector, {way + ':':<24} {seconds / steps * 1e6:.1f} µs a step; runs of generation 0, 1, 2: {', '.join(str(r) for r in runs)}", file=OUT)


if __name__ == "__main__":
    main()
