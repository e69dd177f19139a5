"""How the hook lives inside a job, checked on a machine without a GPU. Prints one JSON line.

  cuda-order  The hook, on what looks to it like a GPU machine, must attach to CUDA's
              allocator only when the job initialises CUDA (torch's lazy-init callbacks,
              observed here through a fake `_lazy_call`), never initialise CUDA itself,
              and stop recording CPU tensors from then on.
  fork        A forked child (a DataLoader worker) records nothing, never calls into the
              parent's session, exits cleanly; the parent goes on capturing.
  children    A process the job starts does not load the hook (run under `vramscope py`).
  bound       The shim's buffer, never drained, stops at its bound and counts the rest.
  cublas-oom  The job dies of an out-of-memory error the caching allocator never saw.
  mlp         An MLP on [32, 256] inputs with 4 micro-batches a step (no sequence length),
              its loss a top-level module.
  own-autocast  A loop under its own CPU bf16 autocast.
  policy      The shim's CUDA autocast policy for CPU tensors: the dtype each op the CS336
              model runs gives under CPU autocast, with the policy off and on.
  kwargs      A Hugging Face-style model called with keyword arguments (input_ids, labels),
              4 micro-batches of [8, 16] a step, each loss divided by 4 before backward;
              prints each step's mean loss, as the Trainer logs it, to stderr.
  compiled    A model trained through torch.compile (AOTAutograd, no code generation), 3
              steps; prints dynamo's graph and graph-break counts to stderr, and whether
              the shim's symbols are in the process's global scope.
  reload      An AdamW run of 32 steps whose state is replaced by a copy at step 4 (a
              checkpoint loaded), one moment by a copy at step 8, and one moment's storage
              (`.data`) at step 12.
  inputs      A model called with two inputs, [16, 64] and [16, 32] fp32, 2 steps (the
              second is named while the first's name still waits in the shim's word).
  kept        A model whose first forward makes a 4 MiB buffer it keeps for good (as
              cuBLAS makes its workspace at the first matmul), 3 steps.
  copies      A 4 MiB tensor deep-copied and kept at step 1 (as an EMA model keeps a copy of
              the weights), the copy dropped at step 3, 4 steps.
  scopes      A model whose module nests another, whose forward raises once in step 1 (the
              script catches it and runs the step again), 3 steps; each module's
              allocation has a size of its own (see `scopes`).
  history     The shim has no CUDA (no headers): on what looks like a GPU machine, CUDA
              memory comes from PyTorch's memory history, faked here with a scripted
              allocator. Run under `vramscope py --headless --json`: two training steps,
              each phase's CUDA allocations known (see `history`).
"""

import ctypes
import json
import os
import subprocess
import sys

import torch

import fake_cuda
from fake_cuda import MIB


def cuda_order():
    queued, inits = [], []
    torch.cuda.is_available = lambda: True  # a GPU machine, as far as the hook can tell
    torch.cuda._lazy_call = lambda fn, **kw: queued.append(fn)
    torch.cuda.init = lambda: inits.append("init")
    torch.cuda._lazy_init = lambda: inits.append("_lazy_init")

    import vramscope_hook
    from vramscope_hook import _state

    assert vramscope_hook.install()
    shim = _state["hooks"].shim
    shim.vs_cpu_allocator_installed.restype = ctypes.c_bool
    out = {"queued": len(queued), "recording_before": shim.vs_cpu_allocator_installed()}
    x = torch.ones(4096)  # the job's CPU work before it uses CUDA
    # The job initialises CUDA: torch runs what was queued.
    for fn in queued:
        fn()
    out["recording_after"] = shim.vs_cpu_allocator_installed()
    out["inits"] = inits
    del x
    print(json.dumps(out))


def fork():
    import vramscope_hook
    from vramscope_hook import _state

    assert vramscope_hook.install()
    shim = _state["hooks"].shim
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        # As a DataLoader worker would: tensors, a model's forward, then a normal exit
        # (atexit runs).
        ys = [model(torch.randn(8, 64)) for _ in range(20)]
        os.write(w, json.dumps({"pending": shim.vs_pending(), "active": vramscope_hook.active()}).encode())
        os.close(w)
        del ys
        sys.exit(0)
    os.close(w)
    child = json.loads(os.read(r, 4096).decode())
    _, status = os.waitpid(pid, 0)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
    print(json.dumps({"child": child, "child_status": status, "parent_active": vramscope_hook.active()}))


def children():
    probe = "import json, os, torch, vramscope_hook; print(json.dumps({'hook_env': os.environ.get('VRAMSCOPE_HOOK'), 'active': vramscope_hook.active()}))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    import vramscope_hook

    print(json.dumps({"self_active": vramscope_hook.active(), "child": json.loads(r.stdout.strip().splitlines()[-1])}))


def bound():
    from vramscope_hook import _native

    shim = ctypes.CDLL(str(_native.build_shim(torch)[0]), mode=ctypes.RTLD_GLOBAL)
    shim.vs_pending.restype = ctypes.c_size_t
    shim.vs_dropped.restype = ctypes.c_uint64
    assert shim.vs_install_cpu_allocator() == 0
    n = 0
    while shim.vs_pending() < (1 << 20):
        # 256 allocations and frees a round, nothing draining them.
        [torch.empty(16) for _ in range(128)]
        n += 1
    for _ in range(64):
        [torch.empty(16) for _ in range(128)]
    print(json.dumps({"pending": shim.vs_pending(), "dropped": shim.vs_dropped()}))


def cublas_oom():
    model = torch.nn.Linear(16, 16)
    model(torch.randn(4, 16))
    # What cuBLAS raises when its workspace does not fit (a RuntimeError, not the caching
    # allocator's OutOfMemoryError).
    raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")


def mlp():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        for _ in range(4):
            x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
            (loss_fn(model(x), y) / 4).backward()
        opt.step()
        opt.zero_grad()


def diverged():
    # A training run whose loss goes NaN, then infinite: the viewer must show it, not choke.
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for scale in (1.0, float("nan"), float("inf")):
        (model(torch.randn(4, 8)).pow(2).mean() * scale).backward()
        opt.zero_grad()  # before the step, so the weights stay finite for the next loss
        opt.step()


def compiled():
    from torch._dynamo.utils import counters

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    model = torch.compile(Net(), backend="aot_eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(torch.randn(16, 64)), torch.randint(0, 10, (16,)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    breaks = sum(counters["graph_break"].values())
    # What a library loaded later (Triton's) would bind to: the process's global scope.
    shim_global = hasattr(ctypes.CDLL(None), "vs_install_cpu_allocator")
    print(json.dumps({"graph_breaks": breaks, "graphs": counters["stats"]["unique_graphs"], "shim_global": shim_global}), file=sys.stderr)


def kept():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 10)
            self.workspace = None

        def forward(self, x):
            if self.workspace is None:
                self.workspace = torch.empty(1 << 20)  # 4 MiB, never freed
            return self.fc(x)

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(16, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def copies():
    import copy

    model = torch.nn.Linear(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = torch.randn(1 << 20)  # 4 MiB
    kept = None
    for step in range(4):
        model(torch.randn(16, 64)).pow(2).mean().backward()
        if step == 1:
            kept = copy.deepcopy(weights)
        if step == 3:
            del kept
        opt.step()
        opt.zero_grad()


def reload():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first = model[0].weight
    for n in range(32):
        if n == 4:
            # (Cloned, not copy.deepcopy'd: a storage's deep copy is made by torch's default
            # CPU allocator, which the CPU capture does not see.)
            saved = opt.state_dict()
            saved["state"] = {k: {n: v.clone() for n, v in s.items()} for k, s in saved["state"].items()}
            opt.load_state_dict(saved)
            del saved
        if n == 8:
            opt.state[first]["exp_avg"] = opt.state[first]["exp_avg"].clone()
        if n == 12:
            opt.state[first]["exp_avg_sq"].data = opt.state[first]["exp_avg_sq"].clone()
        model(torch.randn(16, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def inputs():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 8), torch.nn.Linear(32, 8)

        def forward(self, a, b):
            return self.a(a) + self.b(b)

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(16, 64), torch.randn(16, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def given_loss():
    # A script that reads its loss (to log it) hands it over; a step that does not keeps
    # the hook's own reading.
    import vramscope_hook

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for n in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        if n != 1:
            vramscope_hook.loss(40.0 + n)
        print(json.dumps({"own_loss": loss.item()}), file=sys.stderr, flush=True)
        opt.step()
        opt.zero_grad()


def refused_backward():
    # A backward torch refuses (a complex loss), caught by the script, which goes on: the
    # hook has read that loss already, and must not break the job's step for it.
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in range(3):
        out = model(torch.randn(2, 4))
        if n == 1:
            try:
                (out.sum() * 1j).backward()
            except RuntimeError:
                pass
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def meta():
    # A model on a device that autocast does not know: the hook's checks must not raise
    # into the job, and `p` there says once that it cannot cast.
    model = torch.nn.Linear(8, 8, device="meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(4, 8, device="meta")).sum().backward()
        opt.step()
        opt.zero_grad()


def history():
    """Per step on device 0 (besides the 512 KiB held from before): forward makes a 20 MiB
    segment (step 0 only), keeps A (1 MiB) and frees a temporary B (3 MiB) once both are
    live: peak A + B; backward makes the gradient G (1 MiB) while A is live, then frees A;
    the optimizer makes its state S (2 MiB, step 0 only) with G live. Step 0 peaks at 4.5
    MiB in forward, 2.5 MiB in backward and 3.5 MiB in the optimizer; step 1, with G and S
    kept, at 7.5 MiB in forward. Reserved: 22 MiB."""
    import vramscope_hook

    fake = fake_cuda.install()
    state = vramscope_hook._state
    assert vramscope_hook.active()
    vramscope_hook._follow_cuda(torch, state["core"], state["hooks"], False, "the capture shim has no CUDA (test)")

    step = {"n": 0}

    class Grad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            fake.emit("alloc", 4 * MIB, MIB)  # G, kept
            fake.free(0, MIB)  # A
            return g

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            if step["n"] == 0:
                fake.emit("segment_alloc", 0, 20 * MIB)
            fake.emit("alloc", 0, MIB)  # A
            fake.emit("alloc", MIB, 3 * MIB)  # B
            fake.free(MIB, 3 * MIB)
            return Grad.apply(self.lin(x))

    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def make_state(optimizer, args, kwargs):
        if step["n"] == 0:
            fake.emit("alloc", 5 * MIB, 2 * MIB)  # S

    opt.register_step_pre_hook(make_state)
    for n in range(2):
        step["n"] = n
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    print(json.dumps({"calls": fake.calls}), file=sys.stderr)


def own_autocast():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.MSELoss()
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(16, 64))
        # The loss module outside the region, as many scripts call it: the step is bf16.
        loss = criterion(out.float(), torch.zeros(16, 8))
        loss.backward()
        opt.step()
        opt.zero_grad()


def kwargs():
    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(100, 32)
            self.head = torch.nn.Linear(32, 100)

        def forward(self, input_ids=None, labels=None):
            logits = self.head(self.embed(input_ids))
            return torch.nn.functional.cross_entropy(logits.view(-1, 100), labels.view(-1))

    model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        total = 0.0
        for _ in range(4):
            ids = torch.randint(0, 100, (8, 16))
            loss = model(input_ids=ids, labels=ids) / 4
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        print(json.dumps({"step_loss": total}), file=sys.stderr)


def scopes():
    # Sizes that say where an allocation was made: 64 rows of 48 floats in `outer.inner`,
    # of 40 in `outer.lin` and in `outer` itself, and 5 floats outside every module.
    class Inner(torch.nn.Module):
        fail = False

        def forward(self, x):
            y = x * 2
            if self.fail:
                raise RuntimeError("out of memory (made up)")
            return y

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.lin = Inner(), torch.nn.Linear(48, 40)

        def forward(self, x):
            return self.lin(self.inner(x)) + 1

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.outer = Outer()

        def forward(self, x):
            return self.outer(x).sum()

    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        x = torch.randn(64, 48)
        if step == 1:
            model.outer.inner.fail = True
            try:
                model(x)
            except RuntimeError:
                pass
            model.outer.inner.fail = False
        loss = model(x)
        # Made in forward's phase outside every module: no module's scope.
        scale = torch.full((5,), 2.0)
        (loss * scale[0]).backward()
        opt.step()
        opt.zero_grad()


def policy():
    from vramscope_hook import _native

    shim = ctypes.CDLL(str(_native.build_shim(torch)[0]), mode=ctypes.RTLD_GLOBAL)
    shim.vs_set_cuda_autocast_policy.argtypes = [ctypes.c_bool]
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 8, requires_grad=True)

    def dtypes():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ops = {
                "exp": torch.exp(x), "log": torch.log(x.abs() + 1), "pow": x.pow(2), "rsqrt": torch.rsqrt(x.abs() + 1),
                "sum": x.sum(-1, keepdim=True), "sum_all": x.sum(), "softmax": torch.softmax(x, -1),
                "log_softmax": torch.log_softmax(x, -1), "mean": x.mean(-1), "max": torch.max(x, -1, keepdim=True)[0],
                "sub": x - x, "einsum": torch.einsum("ab,cb->ac", x.float(), w), "sigmoid": torch.sigmoid(x),
            }
            return {k: str(v.dtype).removeprefix("torch.") for k, v in ops.items()}

    off = dtypes()
    shim.vs_set_cuda_autocast_policy(True)
    on = dtypes()
    shim.vs_set_cuda_autocast_policy(False)
    print(json.dumps({"cpu": off, "cuda": on, "off_again": dtypes()}))


{"policy": policy, "kwargs": kwargs, "own-autocast": own_autocast, "history": history, "mlp": mlp, "scopes": scopes, "diverged": diverged, "meta": meta, "given-loss": given_loss, "refused-backward": refused_backward, "compiled": compiled, "kept": kept, "copies": copies, "reload": reload, "inputs": inputs, "cuda-order": cuda_order, "fork": fork, "children": children, "bound": bound, "cublas-oom": cublas_oom}[sys.argv[1]]()
