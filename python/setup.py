"""Builds vramscope's native core (Rust, no torch needed) with cargo from the repository
this directory lives in, and ships it inside the package. The capture shim is compiled at
first import instead, against whichever torch the job uses."""

import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithCore(build_py):
    def run(self):
        super().run()
        built = Path(os.environ["VRAMSCOPE_HOOK_CORE"]) if os.environ.get("VRAMSCOPE_HOOK_CORE") else None
        if built is None or not built.exists():
            subprocess.run(
                ["cargo", "build", "--release", "-p", "vramscope-hook", "--manifest-path", str(HERE.parent / "Cargo.toml")],
                check=True,
            )
            meta = subprocess.run(
                ["cargo", "metadata", "--format-version", "1", "--no-deps", "--manifest-path", str(HERE.parent / "Cargo.toml")],
                check=True, capture_output=True, text=True,
            )
            built = Path(json.loads(meta.stdout)["target_directory"]) / "release/libvramscope_hook.so"
        shutil.copy2(built, Path(self.build_lib) / "vramscope_hook" / "libvramscope_hook.so")


setup(cmdclass={"build_py": BuildWithCore})
