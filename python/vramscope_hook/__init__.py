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

__all__ = ["install", "knob", "step", "loss", "active", "stop_requested"]

_state = {"hooks": None, "core": None, "knobs": {}, "tried": False, "why": None}


def _job_name():
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("vramscope_hook.__main__", "__main__"):
        return spec.name.rsplit(".", 1)[-1]
    arg0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    stem = os.path.splitext(os.path.basename(arg0))[0]
    return stem or "python"


def _config(shim_path, torch, overrides):
    env = os.environ
    rank = int(env.get("RANK", "0"))
    world = env.get("WORLD_SIZE")
    local_rank = int(env.get("LOCAL_RANK", "0"))
    # VRAMSCOPE_NAME: what vramscope calls the job (the built-in model's preset).
    name = env.get("VRAMSCOPE_NAME") or _job_name()
    # Ranks of one torchrun share their launcher: one job name for all of them.
    default_job = f"{os.getppid() if 'RANK' in env else os.getpid()}-{name}"
    # Not the rank's GPU: the device the job allocates on (its LOCAL_RANK says nothing
    # under per-rank CUDA_VISIBLE_DEVICES, or for a model on cuda:1).
    device = env.get("VRAMSCOPE_DEVICE") or "auto"
    return {
        "shim": str(shim_path) if shim_path else None,
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
        "cuda_available": bool(torch.cuda.is_available()),
        # Whose bf16 autocast lists the modelled GPU's CPU autocast regions follow.
        "autocast_policy": env.get("VRAMSCOPE_AUTOCAST_POLICY", "cuda"),
        **overrides,
    }


def install(overrides=None, before_hooks=None):
    """Starts capturing this process. Call right after `import torch`, before any model is
    built (`vramscope py` and `python -m vramscope_hook` do it for you). True if capture
    runs; otherwise says why once, on stderr, and the job runs on uncaptured. `overrides`:
    settings of the core's config that the environment would give (`vramscope attach --pid`
    cannot set the job's environment). `before_hooks(hooks, core)` runs once the session is
    up and before PyTorch's hooks are, so no step ends meanwhile."""
    if _state["hooks"] is not None or _state["tried"]:
        return _state["hooks"] is not None
    _state["tried"] = True
    import json

    import torch

    from . import _hooks, _native

    core = None
    try:
        shim_path, shim, core, note = _native.load(torch)
        cuda = torch.cuda.is_available()
        if shim_path is None:
            # Said in one line, and on the screen: what is watched instead.
            instead = "CUDA memory comes from PyTorch's memory history" if cuda else "no allocator events on CPU, steps and phases only"
            note = f"{note}: {instead}"
            print(f"vramscope_hook: {note}", file=sys.stderr)
        elif note and cuda:
            print(f"vramscope_hook: {note}: CUDA memory comes from PyTorch's memory history, read at every phase boundary", file=sys.stderr)
        config = _config(shim_path, torch, overrides or {})
        config["shim_note"] = note if shim_path is None else None
        if core.vsh_start(json.dumps(config).encode()) != 0:
            raise _native.HookError(core.vsh_last_error().decode())
        atexit.register(core.vsh_finish)
        shim.vs_set_capture_enabled(True)  # again, after an earlier attach's unhook
        hooks = _hooks.Hooks(torch, shim, core)
        hooks.knob_values = lambda name, default: knob(name, default) if name in _state["knobs"] else default
        hooks.on_unhook = _unhook
        # Through `hooks.core`, which a forked child swaps for an inert one (`_forked`).
        hooks.note = lambda text: hooks.core.vsh_note(text.encode())
        # `p` works on any job: a precision knob of the hook's own, until the script
        # declares one (then the script chooses).
        core.vsh_declare_knob(b"precision", os.environ.get("VRAMSCOPE_PRECISION", "fp32").encode(), b"str")
        hooks.precision_knob = lambda: None if "precision" in _state["knobs"] else (hooks.core.vsh_knob(b"precision") or b"fp32").decode()
        _state.update(hooks=hooks, core=core)
        # CUDA first (at once where the job initialised it), so what `before_hooks` learns
        # of the device's memory lands on the device followed.
        _follow_cuda(torch, core, hooks, shim_path is not None and note is None, note)
        if before_hooks is not None:
            before_hooks(hooks, core)
        hooks.install()
    except Exception as e:  # never break the job: it runs on, uncaptured
        if core is not None:
            atexit.unregister(core.vsh_finish)
            core.vsh_finish()
        _state.update(hooks=None, core=None)
        print(f"vramscope_hook: not capturing: {e}", file=sys.stderr)
        _state["why"] = str(e)
        return False
    os.register_at_fork(after_in_child=_forked)
    _say_foreign_ooms()
    return True


def _unhook():
    """Takes the hook out of the job (`vramscope attach --pid`, once its viewers are gone):
    every PyTorch hook and patch, the CPU allocator wrapper, the session; the CUDA trace
    tracker, which PyTorch cannot remove, records nothing from now on. Attaching again
    installs it afresh."""
    hooks, core = _state["hooks"], _state["core"]
    if hooks is None:
        return
    hooks.uninstall()
    hooks.shim.vs_set_capture_enabled(False)
    if hooks.history is not None:
        hooks.history.stop()
        hooks.history = None
    atexit.unregister(core.vsh_finish)
    atexit.unregister(hooks.read_history)
    sys.excepthook = _state.pop("excepthook", sys.excepthook)
    core.vsh_finish()
    _state.update(hooks=None, core=None, tried=False, knobs={})


def foreign_oom(error):
    """The first line of an out-of-memory error that the caching allocator did not raise
    (cuBLAS, cuDNN, NCCL running out of workspace), else None: the allocator's own
    ("CUDA out of memory") was already said, with its snapshot, by its observer."""
    text = str(error).strip()
    if not text or text.startswith("CUDA out of memory"):
        return None
    low = text.lower()
    marks = ("out of memory", "alloc_failed", "not_enough_memory", "cudaerrormemoryallocation", "cuda_error_out_of_memory")
    return text.splitlines()[0][:400] if any(m in low for m in marks) else None


def _say_foreign_ooms():
    """A job dying of such an error: the screen says so before the traceback."""
    previous = _state["excepthook"] = sys.excepthook

    def excepthook(kind, error, tb):
        core = _state["core"]
        try:
            line = foreign_oom(error) if core is not None else None
            if line:
                core.vsh_foreign_oom(line.encode(errors="replace"))
        except Exception:
            pass
        previous(kind, error, tb)

    sys.excepthook = excepthook


def _follow_cuda(torch, core, hooks, shim_has_cuda, why):
    """Attaches to CUDA's caching allocator when the job initialises CUDA (at once if it
    has): its per-device allocators exist only from then on, and a tracker attached earlier
    would see nothing. Where the shim cannot (built without CUDA, or not at all), PyTorch's
    own memory history is read instead. Nothing here initialises CUDA or makes a context."""
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is None or not torch.cuda.is_available():
        return

    def on_cuda_init():
        # Runs inside the job's CUDA init: it must never raise into it.
        if _state["core"] is not core:
            return  # the hook left the job before it initialised CUDA
        reason = why
        try:
            if shim_has_cuda:
                if core.vsh_cuda_initialised() == 0:
                    return
                reason = f"the capture shim cannot follow CUDA's allocator ({core.vsh_last_error().decode()})"
                print(f"vramscope_hook: {reason}: reading PyTorch's memory history instead", file=sys.stderr)
            from ._history import History

            history = History(torch, core)
            history.start(reason or "the capture shim has no CUDA")
            hooks.history = history
            # Before the core finishes (atexit runs last-registered first): what the job did
            # after its last phase boundary, an OOM that ended it included.
            atexit.register(hooks.read_history)
        except Exception as e:
            print(f"vramscope_hook: not following CUDA memory: {e}", file=sys.stderr)

    lazy_call(on_cuda_init)


class _Inert:
    """Stands in for the core and the shim in a forked child: every call does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


def _forked():
    """In a forked child (a DataLoader worker): the parent's session is not this process's,
    and its threads did not come along, so nothing here may call into it (its locks may be
    held for ever) or end it at exit. The shim stops recording by itself."""
    core = _state["core"]
    if core is None:
        return
    atexit.unregister(core.vsh_finish)
    hooks = _state["hooks"]
    hooks.core = hooks.shim = _Inert()
    _state.update(core=None, hooks=None)


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
        if name == "precision" and _state["hooks"] is not None:
            _state["hooks"]._cast_checked = None  # the script chooses its precision from now on
    v = core.vsh_knob(name.encode())
    if v is None:
        return default
    v = v.decode()
    t = _state["knobs"][name]
    if t is bool:
        return v == "True"
    return t(v) if t in (int, float) else v


def stop_requested():
    """Whether the vramscope that started this job asked it to end (its `q` on the built-in
    model): a loop may finish cleanly at the next step. A user's job started by `vramscope
    py` is stopped as ctrl-c would stop it instead, so plain scripts need not ask."""
    hooks = _state["hooks"]
    return hooks is not None and hooks.stop_requested


def loss(value):
    """Gives this step's loss as the script read it. The hook reads a CPU loss itself, but
    not a CUDA one (that would wait for the GPU): a script that calls `.item()` anyway, to
    log it, can hand the value over, and the step's report carries it."""
    hooks = _state["hooks"]
    if hooks is not None:
        hooks.given_loss = float(value)


def step(loss=None):
    """Ends a step by hand, for loops without an optimizer (an optimizer's `step()` ends
    one by itself)."""
    hooks = _state["hooks"]
    if hooks is not None:
        hooks.end_step(loss)
