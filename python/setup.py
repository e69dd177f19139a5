"""Builds vramscope's native core (Rust, no torch needed) with cargo from the repository
this directory lives in, and ships it inside the package. The capture shim is compiled at
first import instead, against whichever torch the job uses.

`scripts/wheel` also sets VRAMSCOPE_BIN (the light `vramscope` binary, put on the venv's
PATH) and VRAMSCOPE_README: the release wheel. Without them this is the hook alone, as
`scripts/setup` installs it into the project's venv."""

import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.bdist_wheel import bdist_wheel
from distutils.command.build_scripts import build_scripts

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


class BinaryDistribution(Distribution):
    """With the binary in it the release is for one platform: its files go where native
    code goes (platlib), as auditwheel requires."""

    def has_ext_modules(self):
        return bool(os.environ.get("VRAMSCOPE_BIN"))


class Wheel(bdist_wheel):
    def get_tag(self):
        python, abi, plat = super().get_tag()
        # One binary serves every Python 3: the hook's core is a plain C library, not an
        # extension module.
        return ("py3", "none", plat) if os.environ.get("VRAMSCOPE_BIN") else (python, abi, plat)


class BinaryScripts(build_scripts):
    """The `vramscope` binary is copied as it is: setuptools would read it as a Python
    script to rewrite its shebang."""

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        outfiles = []
        for script in self.scripts:
            dest = Path(self.build_dir) / Path(script).name
            shutil.copy2(script, dest)
            dest.chmod(0o755)
            outfiles.append(str(dest))
        return outfiles, outfiles


readme = os.environ.get("VRAMSCOPE_README")
setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildWithCore, "bdist_wheel": Wheel, "build_scripts": BinaryScripts},
    scripts=[os.environ["VRAMSCOPE_BIN"]] if os.environ.get("VRAMSCOPE_BIN") else [],
    long_description=Path(readme).read_text() if readme else "",
    long_description_content_type="text/markdown",
)
