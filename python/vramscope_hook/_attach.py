"""`vramscope attach --pid`: run inside a job that was started without vramscope, on a thread
of its own that holds the GIL (see hook/src/attach.rs). Installs the hook as `vramscope py`
would have, with the settings vramscope passed, and says how it went in a status file that
vramscope waits for: `ok JOB` or `error WHY`, one line."""

import ctypes
import gc
import os
import sys
import weakref

from ._hooks import GRADIENT, OPTIMIZER_STATE, PARAMETER, _storage_ptr
from ._history import entries_of

CPU = 255


def _say(path, line):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(line + "\n")
    os.replace(tmp, path)


def attach(config):
    """`config`: the core's settings from vramscope (job, socket_dir, snapshot_dir, device),
    and `status`, where to say how it went."""
    status = config.pop("status")
    try:
        # The core vramscope loaded into the job, which the hook must use too.
        os.environ["VRAMSCOPE_HOOK_CORE"] = config.pop("hook_core")
        if "torch" not in sys.modules:
            _say(status, "error the job has not imported torch yet: attach once it has, or start it with `vramscope py`")
            return
        import vramscope_hook

        if vramscope_hook.active():
            _say(status, "error the job is already watched by vramscope: `vramscope attach` lists it")
            return
        config["unhook_when_alone"] = True
        if not vramscope_hook.install(config, before_hooks=_learn_what_is_there):
            _say(status, f"error the hook could not start in the job: {vramscope_hook._state['why']}")
            return
        _say(status, f"ok {config['job']}")
    except BaseException as e:  # the job must never die of an attach
        try:
            _say(status, f"error {type(e).__name__}: {e}")
        except OSError:
            pass


def instances_of(classes):
    """For each class, the objects the collector tracks of that class or a subclass. Found
    in the core, in one call that holds the GIL throughout: the list `gc.get_objects()`
    makes refers to what other threads of the job are halfway through building, and were
    the job's thread to run on while it lives, it could die of it (`SystemError` in
    `_PyTuple_Resize`, seen in CI). No collection runs meanwhile either."""
    find = ctypes.PyDLL(os.environ["VRAMSCOPE_HOOK_CORE"]).vsh_instances_of
    find.restype = ctypes.py_object
    find.argtypes = [ctypes.py_object, ctypes.py_object]
    enabled = gc.isenabled()
    gc.disable()
    try:
        return find(gc.get_objects, tuple(classes))
    finally:
        if enabled:
            gc.enable()


def _learn_what_is_there(hooks, core):
    """What the job held before the hook came, so totals and categories are right from the
    first step seen: on CUDA every segment and block in use, from PyTorch's snapshot, read
    here; the parameters, gradients and optimizer state of the models and optimizers the job
    holds, found from the objects themselves on the job's own thread (`_learn_tensors`)."""
    import torch

    # Whatever step is under way now began before the hook: it is not reported.
    hooks.began = False
    seeded = set()
    cuda_blocks = 0
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for device, action, addr, size, _stream, _t in entries_of(torch.cuda.memory._snapshot(), True):
            core.vsh_seed(action, addr, size, device)
            seeded.add(addr)
            cuda_blocks += action == 0
        if hooks.history is not None:
            hooks.history.first = False  # learned here already: its first read must not repeat it
    # Not from this thread: while it runs Python, the job's thread may be in backward or an
    # optimizer's kernels, which drop the GIL and set the gradients this would read (a job
    # died of a segfault in such a read, seen in tests). At the job's next forward,
    # optimizer step or step end, its thread is in the hook's code and nothing of it runs.
    hooks.on_job_thread = lambda: _learn_tensors(hooks, core, seeded, cuda_blocks)


def _learn_tensors(hooks, core, seeded, cuda_blocks):
    """The tensors of the job's models and optimizers, on the job's thread: a CPU tensor
    allocated before the hook came has no recorded allocation, so it is seeded, and its free
    is seen when its tensor dies; one allocated since is on record and only named. Says on
    screen what was learned."""
    torch = hooks.torch
    modules, optimizers = instances_of((torch.nn.Module, torch.optim.Optimizer))
    inside = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in inside and next(m.parameters(), None) is not None]
    learned = {PARAMETER: 0, GRADIENT: 0, OPTIMIZER_STATE: 0}
    recorded = hooks.shim.vs_storage_recorded

    def seed(t, category, name):
        ptr = _storage_ptr(t)
        if ptr == 0:
            return
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if t.device.type == "cpu" and ptr not in seeded and not recorded(storage._cdata):
            seeded.add(ptr)
            core.vsh_seed(0, ptr, nbytes, CPU)
            weakref.finalize(t, core.vsh_seed, 2, ptr, 0, CPU)
        learned[category] += nbytes
        if name is not None:
            core.vsh_tag(ptr, category, name.encode())

    for root in roots:
        for p in root.parameters():
            seed(p, PARAMETER, None)  # named by the hooks' adoption, as `vramscope py` names them
        hooks._adopt(root)
    if roots:
        # Its forwards count the samples: the largest model, not a loss module or a helper.
        hooks.model = id(max(roots, key=lambda m: sum(p.numel() for p in m.parameters())))
    names = {pid: name for pid, (_, name, _) in hooks.params.items()}
    for root in roots:
        for p in root.parameters():
            if p.grad is not None:
                seed(p.grad, GRADIENT, f"grad of {names.get(id(p), 'a parameter')}")
    for opt in optimizers:
        for p, state in opt.state.items():
            for key, v in state.items():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    seed(v, OPTIMIZER_STATE, f"{key} of {names.get(id(p), 'a parameter')}")
    mib = lambda n: f"{n / (1 << 20):.1f} MiB"  # noqa: E731
    found = f"{mib(learned[PARAMETER])} of parameters, {mib(learned[GRADIENT])} of gradients, {mib(learned[OPTIMIZER_STATE])} of optimizer state"
    before = (
        f"the {cuda_blocks} blocks in use PyTorch's snapshot holds"
        if cuda_blocks
        else "CPU memory allocated before and held elsewhere is not shown"
    )
    core.vsh_note(f"attached to a running job: {found} found in its {len(roots)} model(s) and {len(optimizers)} optimizer(s); {before}; everything from now on is streamed".encode())
