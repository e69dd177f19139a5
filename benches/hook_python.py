"""What the hook's Python costs the dense job of issue 35, apart from the core: the MLP of
tests/py/dense_mlp.py in one process, its steps run in turn

- plainly,
- with torch's own global module hooks doing nothing (any global hook sends every module
  call down torch's slower call path, whoever registered it),
- under vramscope_hook's `Hooks` with a core and a shim that do nothing,

interleaved round by round so machine noise hits all three alike. With torch on one thread
every step's work is the main thread's, so steps are timed in its CPU time: another
tenant taking the core does not count. Run by
`cargo bench --bench hook_overhead -- --python [rounds] [steps]`."""

import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "py")]

from dense_mlp import build, step  # noqa: E402
from vramscope_hook._hooks import Hooks  # noqa: E402


class Nothing:
    """A core or shim whose every function does nothing and returns 0."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


def empty_hooks():
    mm = torch.nn.modules.module
    handles = [
        mm.register_module_forward_pre_hook(lambda module, args: None),
        mm.register_module_forward_hook(lambda module, args, *rest: None, with_kwargs=True, always_call=True),
    ]
    return lambda: [h.remove() for h in handles]


def our_hooks():
    hooks = Hooks(torch, Nothing(), Nothing())
    hooks.install()
    return hooks.uninstall


def cpu_step(model, opt):
    t = time.thread_time()
    step(model, opt)
    return time.thread_time() - t


WAYS = {"plain": lambda: (lambda: None), "torch's hook path": empty_hooks, "the hook's Python": our_hooks}


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    torch.set_num_threads(1)  # one thread: no OpenMP stragglers, only the main thread's work
    model, opt = build()
    for _ in range(50):
        step(model, opt)
    medians = {way: [] for way in WAYS}
    order = list(WAYS)
    for r in range(rounds):
        for way in order if r % 2 == 0 else order[::-1]:
            remove = WAYS[way]()
            medians[way].append(statistics.median(cpu_step(model, opt) for _ in range(steps)))
            remove()
    plain = statistics.median(medians["plain"])
    print(f"dense MLP, one torch thread, {rounds} rounds of {steps} steps each way, interleaved")
    for way, m in medians.items():
        s = statistics.median(m)
        print(f"  {way + ':':<20} {s * 1e3:.3f} ms CPU a step  {s / plain:.3f}×  (+{(s - plain) * 1e6:.0f} µs)")


if __name__ == "__main__":
    main()
