"""vramscope's hook: watch your own PyTorch job's memory live with vramscope.

Run a job under it with `vramscope py train.py` (or `vramscope py -- torchrun ... train.py`),
or start it with `python -m vramscope_hook train.py` and attach later with
`vramscope attach`. Nothing in the script needs to change. A script may declare knobs that
the screen's keys change between steps:

    import vramscope_hook
    for step in range(steps):
        ctx = vramscope_hook.knob("ctx", 512)   # `]` doubles it, `[` halves it
        ...

Everything is best effort: if vramscope cannot capture, it says why in one line and the
job runs exactly as it would without it.
"""

import atexit
import os
import sys

__all__ = ["install", "knob", "step", "active"]

_state = {"hooks": None, "core": None, "knobs": {}, "tried": False}


def _job_name():
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("vramscope_hook.__main__", "__main__"):
        return spec.name.rsplit(".", 1)[-1]
    arg0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    stem = os.path.splitext(os.path.basename(arg0))[0]
    return stem or "python"


def _config(shim_path, torch):
    env = os.environ
    rank = int(env.get("RANK", "0"))
    world = env.get("WORLD_SIZE")
    local_rank = int(env.get("LOCAL_RANK", "0"))
    name = _job_name()
    # Ranks of one torchrun share their launcher: one job name for all of them.
    default_job = f"{os.getppid() if 'RANK' in env else os.getpid()}-{name}"
    device = env.get("VRAMSCOPE_DEVICE")
    if not device:
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    return {
        "shim": str(shim_path),
        "job": env.get("VRAMSCOPE_JOB", default_job),
        "rank": rank,
        "world_size": int(world) if world else None,
        "socket_dir": env.get("VRAMSCOPE_SOCKET_DIR"),
        "listen": env.get("VRAMSCOPE_LISTEN") or None,
        "local_rank": local_rank,
        "wait_for_viewer": env.get("VRAMSCOPE_WAIT_FOR_VIEWER") == "1",
        "snapshot_dir": env.get("VRAMSCOPE_SNAPSHOT_DIR", "snapshots"),
        "name": name,
        "device": device,
        "alloc_conf": env.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "queue_batches": int(env.get("VRAMSCOPE_QUEUE", "256")),
    }


def install():
    """Starts capturing this process. Call right after `import torch`, before any model is
    built (`vramscope py` and `python -m vramscope_hook` do it for you). True if capture
    runs; otherwise says why once, on stderr, and the job runs on uncaptured."""
    if _state["hooks"] is not None or _state["tried"]:
        return _state["hooks"] is not None
    _state["tried"] = True
    import json

    import torch

    from . import _hooks, _native

    core = None
    try:
        shim_path, shim, core = _native.load(torch)
        if core.vsh_start(json.dumps(_config(shim_path, torch)).encode()) != 0:
            raise _native.HookError(core.vsh_last_error().decode())
        hooks = _hooks.Hooks(torch, shim, core)
        hooks.knob_values = lambda name, default: knob(name, default) if name in _state["knobs"] else default
        hooks.install()
    except Exception as e:  # never break the job: it runs on, uncaptured
        if core is not None:
            core.vsh_finish()
        print(f"vramscope_hook: not capturing: {e}", file=sys.stderr)
        return False
    _state.update(hooks=hooks, core=core)
    atexit.register(core.vsh_finish)
    return True


def active():
    """Whether this process is being captured."""
    return _state["hooks"] is not None


def knob(name, default):
    """A value the screen's keys may change between steps (`[` `]` ctx, `{` `}` batch, `p`
    precision, `m` mode, or any name the viewer sends). Declared with `default` the first
    time; returns the value in force now (of `default`'s type). Without capture, `default`."""
    core = _state["core"]
    if core is None:
        return default
    kind = {bool: "bool", int: "int", float: "float"}.get(type(default), "str")
    if name not in _state["knobs"]:
        _state["knobs"][name] = type(default)
        core.vsh_declare_knob(name.encode(), str(default).encode(), kind.encode())
    v = core.vsh_knob(name.encode())
    if v is None:
        return default
    v = v.decode()
    t = _state["knobs"][name]
    if t is bool:
        return v == "True"
    return t(v) if t in (int, float) else v


def step(loss=None):
    """Ends a step by hand, for loops without an optimizer (an optimizer's `step()` ends
    one by itself)."""
    hooks = _state["hooks"]
    if hooks is not None:
        hooks.end_step(loss)
