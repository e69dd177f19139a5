"""`python -m vramscope_hook [--listen ADDR] [--snapshot-dir DIR] script.py ARGS...` (or
`-m module ARGS...`): runs a script with vramscope's hook, so `vramscope attach` can watch
it live, now or later."""

import argparse
import os
import runpy
import sys


def main():
    p = argparse.ArgumentParser(prog="python -m vramscope_hook", description=__doc__)
    p.add_argument("--listen", metavar="ADDR", help="serve viewers over TCP on PORT or HOST:PORT (loopback unless a host is given), with a token")
    p.add_argument("--snapshot-dir", metavar="DIR", help="where snapshots go (default: snapshots)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    p.add_argument("script", nargs="?", help="the script to run")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if not a.module and not a.script:
        p.error("give a script or -m MODULE")
    if a.listen:
        os.environ["VRAMSCOPE_LISTEN"] = a.listen
    if a.snapshot_dir:
        os.environ["VRAMSCOPE_SNAPSHOT_DIR"] = a.snapshot_dir
    target = a.module or a.script
    sys.argv = [target] + ([a.script] if a.module and a.script else []) + a.args
    import torch  # noqa: F401  (the hook needs torch, and installs before the script builds a model)

    import vramscope_hook

    vramscope_hook.install()
    if a.module:
        runpy.run_module(a.module, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
        runpy.run_path(a.script, run_name="__main__")


if __name__ == "__main__":
    main()
