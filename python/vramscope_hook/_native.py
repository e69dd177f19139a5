"""The native parts: the capture shim, compiled against the running torch at first use and
cached per torch version, and vramscope's Rust core, which hosts the producer session."""

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
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


def build_shim(torch):
    """(the shim library for this torch, why it has no CUDA capture or None), building it if
    needed (once per torch version and shim source; ranks of one job wait for each other's
    build instead of repeating it)."""
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
    digest = hashlib.sha256()
    for name in ("capture.h",) + _SOURCES:
        digest.update((src / name).read_bytes())
    digest.update(f"{torch.__version__} {with_cuda} {sys.version_info[:2]}".encode())
    out_dir = _cache_dir() / f"torch-{torch.__version__}-{digest.hexdigest()[:16]}"
    out = out_dir / "libvscapture.so"
    if out.exists():
        return out, no_cuda
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out, no_cuda
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        if not cxx:
            raise HookError("cannot build the capture shim: no C++ compiler (install g++)")
        include = torch_dir / "include"
        abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
        cmd = [
            cxx, "-O2", "-fPIC", "-shared", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-Wno-unused-parameter", "-Wno-deprecated-declarations",
            f"-I{include}", f"-I{include / 'torch/csrc/api/include'}",
            f"-I{sysconfig.get_paths()['include']}",
        ]
        libs = ["-lc10", "-ltorch_cpu"]
        if with_cuda:
            cmd += ["-DVS_WITH_CUDA"] + [f"-I{d}" for d in cuda_inc]
            libs += ["-lc10_cuda", "-ltorch_cuda"]
        tmp = out_dir / f"libvscapture.{os.getpid()}.so"
        cmd += [str(src / s) for s in _SOURCES] + [f"-L{lib}"] + libs + [f"-Wl,-rpath,{lib}", "-o", str(tmp)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise HookError(f"cannot build the capture shim: {cxx}: {e.strerror}") from None
        if r.returncode != 0:
            first = next((l for l in r.stderr.splitlines() if "error" in l), r.stderr.strip()[:300]) or f"{cxx} exited with status {r.returncode}"
            raise HookError(f"cannot build the capture shim against torch {torch.__version__}: {first}")
        os.replace(tmp, out)
    return out, no_cuda


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

    def vs_tag_slot(self):
        return None

    def vs_set_capture_enabled(self, on):
        return None

    def vs_cpu_allocator(self):
        return None

    def vs_storage_recorded(self, storage_impl):
        return False


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
        shim.vs_tag_slot.restype = ctypes.c_void_p
        shim.vs_cpu_allocator.restype = ctypes.c_void_p
        shim.vs_set_capture_enabled.argtypes = [ctypes.c_bool]
        shim.vs_storage_recorded.argtypes = [ctypes.c_void_p]
        shim.vs_storage_recorded.restype = ctypes.c_bool
    except (HookError, OSError) as e:
        shim_path, shim, note = None, _NoShim(), str(e)
    core = ctypes.CDLL(str(core_path()))
    core.vsh_start.argtypes = [ctypes.c_char_p]
    core.vsh_last_error.restype = ctypes.c_char_p
    core.vsh_intern.argtypes = [ctypes.c_char_p]
    core.vsh_intern.restype = ctypes.c_uint32
    core.vsh_phase.argtypes = [ctypes.c_uint8]
    core.vsh_tag.argtypes = [ctypes.c_uint64, ctypes.c_uint8, ctypes.c_char_p]
    core.vsh_tag_many.argtypes = [ctypes.c_uint8, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
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


def slots(shim):
    """The shim's scope, phase and tag as one-item memoryviews of its words, written in
    place by `slot[0] = value` (a bytearray's where there is no shim; the phase's 0xff says
    phases and tags go through the core's `vsh_phase` and `vsh_tag`)."""
    scope, phase, tag = shim.vs_scope_slot(), shim.vs_phase_slot(), shim.vs_tag_slot()
    if not scope or not phase or not tag:
        return memoryview(bytearray(4)).cast("I"), memoryview(bytearray(b"\xff")), memoryview(bytearray(8)).cast("Q")
    return (
        memoryview((ctypes.c_uint32 * 1).from_address(scope)).cast("B").cast("I"),
        memoryview((ctypes.c_uint8 * 1).from_address(phase)).cast("B"),
        memoryview((ctypes.c_uint64 * 1).from_address(tag)).cast("B").cast("Q"),
    )
