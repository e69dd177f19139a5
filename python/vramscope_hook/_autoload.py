"""Installs the hook the moment the job imports torch (before it can build a model), for
`vramscope py`, which cannot add an import to the user's script or to torchrun's workers.
torchrun's own launcher process is left alone: only its workers train."""

import importlib.abc
import importlib.util
import os
import sys

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _is_launcher():
    arg0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if arg0 in _LAUNCHERS:
        return True
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name in _LAUNCHERS


def _after_torch():
    if _is_launcher():
        return
    # This process is the job (or one of a launcher's ranks): what it starts itself
    # (DataLoader workers, compile workers, subprocesses) is not, and must not load the hook.
    os.environ.pop("VRAMSCOPE_HOOK", None)
    import vramscope_hook

    vramscope_hook.install()


class _TorchWatcher(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            _after_torch()

        spec.loader.exec_module = exec_then_install
        return spec


def arm():
    if "torch" in sys.modules:
        _after_torch()
    else:
        sys.meta_path.insert(0, _TorchWatcher())
