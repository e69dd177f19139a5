"""A training loop started with plain `python`, nothing of vramscope in it: an MLP with
AdamW, one step every --sleep seconds. Writes its own figures to --out (JSON: parameter
bytes) and, per step, the time it ended and how long it took to --times. With --watch,
the model's parameters note every use of them from a thread other than the job's own,
written to that file at the end."""

import argparse
import json
import threading
import time

import torch


class Watched(torch.nn.Parameter):
    """A parameter that notes each use of it (an op, `.grad`, its storage) made off the
    main thread."""

    elsewhere = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if threading.current_thread() is not threading.main_thread():
            cls.elsewhere.append(f"{getattr(func, '__name__', func)} on {threading.current_thread().name}")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--sleep", type=float, default=0.02)
    p.add_argument("--out")
    p.add_argument("--times")
    p.add_argument("--idle", type=float, default=0.0, help="seconds asleep before training (no thread allocates meanwhile)")
    p.add_argument("--watch", help="where to write the uses of the parameters made off the main thread")
    p.add_argument("--fake-cuda", action="store_true", help="look like a GPU machine that holds CUDA memory already (tests/py/fake_cuda.py)")
    a = p.parse_args()
    if a.fake_cuda:
        import fake_cuda

        fake_cuda.install()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    if a.watch:
        for layer in (model[0], model[2]):
            layer.weight, layer.bias = Watched(layer.weight.data), Watched(layer.bias.data)
    # Adam's step asks the (fake) CUDA device about graph capture; SGD's does not.
    opt = torch.optim.SGD(model.parameters(), lr=1e-3) if a.fake_cuda else torch.optim.AdamW(model.parameters(), lr=1e-3)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}, f)
    times = open(a.times, "w") if a.times else None
    time.sleep(a.idle)
    for _ in range(a.steps):
        t = time.perf_counter()
        model(torch.randn(64, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
        if times:
            times.write(f"{time.time():.6f} {time.perf_counter() - t:.6f}\n")
            times.flush()
        time.sleep(a.sleep)
    if a.watch:
        with open(a.watch, "w") as f:
            json.dump(Watched.elsewhere, f)
    print("trained", a.steps, "steps", flush=True)


if __name__ == "__main__":
    main()
