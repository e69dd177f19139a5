# Put on PYTHONPATH by `vramscope py`: arms vramscope's hook in every Python process of the
# job (torchrun's workers included), then runs the sitecustomize this one shadows, if any.
import os
import sys


def _chain():
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for p in sys.path:
        if os.path.abspath(p or ".") == here:
            continue
        f = os.path.join(p, "sitecustomize.py")
        if os.path.isfile(f):
            spec = importlib.util.spec_from_file_location("_vramscope_next_sitecustomize", f)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
if os.environ.get("VRAMSCOPE_HOOK") == "1":
    try:
        from vramscope_hook import _autoload

        _autoload.arm()
    except Exception as e:  # never break the user's interpreter
        print(f"vramscope_hook: not capturing: {e}", file=sys.stderr)
