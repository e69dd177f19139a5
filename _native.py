"""The native parts: the capture shim, compiled against the running torch at first use and
cached per torch version, and vramscope's Rust core, which hosts the producer session."""

import ctypes
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

from ._history import SNAPSHOT_FN

_HERE = Path(__file__).resolve().parent
_SOURCES = ("capture_cpu.cpp", "capture_cuda.cpp", "autocast_policy.cpp")


class HookError(RuntimeError):
    """Why vramscope cannot capture this job (said in one line)."""


def _cache_dir() -> Path:
    base = os.environ.get("VRAMSCOPE_HOOK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vramscope", "hook"
    )
    return Path(base)


def _cuda_include(torch_dir: Path):
    """The include directories holding the CUDA runtime's headers and its `crt/` ones: the
    pip wheels' beside torch (CUDA 13's nvidia/cu13; CUDA 12's nvidia-cuda-runtime-cu12 and
    nvidia-cuda-nvcc-cu12), else CUDA_HOME's, else /usr/local/cuda's. None if either is
    missing."""
    site = torch_dir.parent / "nvidia"
    candidates = [site / "cu13/include", site / "cu12/include", site / "cuda_runtime/include", site / "cuda_nvcc/include"]
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    runtime = next((d for d in candidates if (d / "cuda_runtime_api.h").exists()), None)
    crt = next((d for d in candidates if (d / "crt/host_config.h").exists()), None)
    if runtime is None or crt is None:
        return None
    return [runtime] if runtime == crt else [runtime, crt]


def _build(out, sources, flags, libs, what):
    """Compiles `sources` into the library `out` unless it is there (ranks of one job wait
    for each other's build instead of repeating it); `what` names it in errors."""
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        if not cxx:
            raise HookError(f"cannot build {what}: no C++ compiler (install g++)")
        tmp = out.with_name(f"{out.stem}.{os.getpid()}{out.suffix}")
        cmd = [cxx, "-O2", "-fPIC", "-shared", "-std=c++20", "-Wno-unused-parameter", "-Wno-deprecated-declarations"]
        cmd += flags + [str(s) for s in sources] + libs + ["-o", str(tmp)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise HookError(f"cannot build {what}: {cxx}: {e.strerror}") from None
        if r.returncode != 0:
            first = next((l for l in r.stderr.splitlines() if "error" in l), r.stderr.strip()[:300]) or f"{cxx} exited with status {r.returncode}"
            raise HookError(f"cannot build {what}: {first}")
        os.replace(tmp, out)
    return out


def _digest(names, extra):
    digest = hashlib.sha256()
    for name in names:
        digest.update((_HERE / "csrc" / name).read_bytes())
    digest.update(extra.encode())
    return digest.hexdigest()[:16]


def build_shim(torch):
    """(the shim library for this torch, why it has no CUDA capture or None), building it if
    needed (once per torch version and shim source)."""
    torch_dir = Path(torch.__file__).resolve().parent
    lib = torch_dir / "lib"
    src = _HERE / "csrc"
    has_torch_cuda = (lib / "libtorch_cuda.so").exists()
    cuda_inc = _cuda_include(torch_dir) if has_torch_cuda else None
    with_cuda = cuda_inc is not None
    no_cuda = None
    if has_torch_cuda and not with_cuda:
        no_cuda = (
            "the capture shim has no CUDA: its headers are not beside torch "
            "(pip install 'vramscope[cuda13]' for a CUDA 13 torch, 'vramscope[cuda12]' for CUDA 12, "
            "or set CUDA_HOME)"
        )
    digest = _digest(("capture.h",) + _SOURCES, f"{torch.__version__} {with_cuda} {sys.version_info[:2]}")
    out = _cache_dir() / f"torch-{torch.__version__}-{digest}" / "libvscapture.so"
    include = torch_dir / "include"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}", f"-I{include / 'torch/csrc/api/include'}"]
    libs = [f"-L{lib}", "-lc10", "-ltorch_cpu"]
    if with_cuda:
        flags += ["-DVS_WITH_CUDA"] + [f"-I{d}" for d in cuda_inc]
        libs += ["-lc10_cuda", "-ltorch_cuda"]
    libs.append(f"-Wl,-rpath,{lib}")
    _build(out, [src / s for s in _SOURCES], flags, libs, f"the capture shim against torch {torch.__version__}")
    return out, no_cuda


class _PyScopes:
    """The module scopes followed in Python, where the native follower (`csrc/scopes.cpp`)
    cannot be built (no Python headers): the same calls, each call taking the slow path."""

    def __init__(self):
        self.local = threading.local()
        self.slot = memoryview(bytearray(4)).cast("I")
        self.call = None

    def bind(self, address, original, slow):
        if address:
            self.slot = memoryview((ctypes.c_uint32 * 1).from_address(address)).cast("B").cast("I")
        self.call = slow

    def _stack(self):
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def know(self, module, scope):
        pass

    def enter(self, scope):
        stack = self._stack()
        stack.append(scope)
        self.slot[0] = scope

    def leave(self):
        stack = self._stack()
        if stack:
            stack.pop()
        self.slot[0] = stack[-1] if stack else 0

    def clear(self):
        self._stack().clear()
        self.slot[0] = 0

    def top(self):
        stack = self._stack()
        return stack[-1] if stack else None


def scopes():
    """The module scope follower: the native one, built at first use beside the shim, else
    (no Python headers, or VRAMSCOPE_HOOK_SCOPES=python) the Python one."""
    include = Path(sysconfig.get_paths()["include"])
    if os.environ.get("VRAMSCOPE_HOOK_SCOPES") == "python" or not (include / "Python.h").exists():
        return _PyScopes()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    out = _cache_dir() / f"scopes-{_digest(('scopes.cpp',), suffix)}" / f"_vsscopes{suffix}"
    try:
        _build(out, [_HERE / "csrc/scopes.cpp"], [f"-I{include}"], [], "the native scope follower")
        loader = importlib.machinery.ExtensionFileLoader("_vsscopes", str(out))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader("_vsscopes", loader))
        loader.exec_module(module)
        return module
    except (HookError, ImportError, OSError):
        return _PyScopes()


def core_path() -> Path:
    """vramscope's Rust core: VRAMSCOPE_HOOK_CORE (set by `vramscope py`), else the one this
    package was installed with, else a build in the repository this package lives in."""
    candidates = []
    if os.environ.get("VRAMSCOPE_HOOK_CORE"):
        candidates.append(Path(os.environ["VRAMSCOPE_HOOK_CORE"]))
    candidates += [_HERE / "libvramscope_hook.so", _HERE.parent.parent / "target/release/libvramscope_hook.so"]
    for c in candidates:
        if c.exists():
            return c
    raise HookError(
        "vramscope's native core (libvramscope_hook.so) is not installed: "
        "pip install <vramscope repo>/python, or run the job with `vramscope py`"
    )


class _NoShim:
    """Stands in for the shim where it could not be built: scopes and switches go nowhere."""

    def vs_scope_slot(self):
        return None

    def vs_phase_slot(self):
        return None

    def vs_set_capture_enabled(self, on):
        return None


def load(torch):
    """(shim path, shim, core, note): the shim and the core as ctypes libraries, the shim
    loaded first (the core opens it by its path). Where the shim cannot be built, its path is
    None and the note says why; where it was built without CUDA, the note says that."""
    try:
        shim_path, note = build_shim(torch)
        # Local: loaded globally, the shim would also put libtorch's CUDA libraries in the
        # process's global scope, where libraries loaded later (Triton's) bind to them.
        shim = ctypes.CDLL(str(shim_path), mode=ctypes.RTLD_LOCAL)
        shim.vs_scope_slot.restype = ctypes.c_void_p
        shim.vs_phase_slot.restype = ctypes.c_void_p
        shim.vs_set_capture_enabled.argtypes = [ctypes.c_bool]
    except (HookError, OSError) as e:
        shim_path, shim, note = None, _NoShim(), str(e)
    core = ctypes.CDLL(str(core_path()))
    core.vsh_start.argtypes = [ctypes.c_char_p]
    core.vsh_last_error.restype = ctypes.c_char_p
    core.vsh_intern.argtypes = [ctypes.c_char_p]
    core.vsh_intern.restype = ctypes.c_uint32
    core.vsh_phase.argtypes = [ctypes.c_uint8]
    core.vsh_tag.argtypes = [ctypes.c_uint64, ctypes.c_uint8, ctypes.c_char_p]
    core.vsh_set_parameters.argtypes = [ctypes.c_int64]
    core.vsh_declare_knob.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    core.vsh_knob.argtypes = [ctypes.c_char_p]
    core.vsh_knob.restype = ctypes.c_char_p
    core.vsh_cuda_initialised.argtypes = []
    core.vsh_foreign_oom.argtypes = [ctypes.c_char_p]
    core.vsh_step_end.argtypes = [ctypes.c_double, ctypes.c_uint8, ctypes.c_double, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint8, ctypes.c_uint8]
    core.vsh_history_start.argtypes = [SNAPSHOT_FN, ctypes.c_char_p]
    core.vsh_history_push.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    core.vsh_history_stats.argtypes = [ctypes.c_uint8, ctypes.c_void_p, ctypes.c_uint64]
    core.vsh_history_bus_id.argtypes = [ctypes.c_uint8, ctypes.c_char_p]
    core.vsh_seed.argtypes = [ctypes.c_uint8, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint8]
    core.vsh_note.argtypes = [ctypes.c_char_p]
    return shim_path, shim, core, note


def phase_slot(shim):
    """The shim's phase as a one-item memoryview of its byte, written in place by
    `slot[0] = value` (a bytearray's holding 0xff where there is no shim: 0xff says phases
    go through the core's `vsh_phase`)."""
    phase = shim.vs_phase_slot()
    if not phase or not shim.vs_scope_slot():
        return memoryview(bytearray(b"\xff"))
    return memoryview((ctypes.c_uint8 * 1).from_address(phase)).cast("B")
