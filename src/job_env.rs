//! The environment a Python job runs in under vramscope: which Python, where the hook's
//! package and native core are (a source checkout's, or the pip-installed environment's),
//! and the variables that make every Python process of the job load the hook.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use vramscope_core::step_config::AutocastPolicy;

/// What the hook is told about the job, from the command's flags.
pub struct HookSettings<'a> {
    /// Where the job's snapshots go.
    pub snapshot_dir: &'a Path,
    /// auto, cpu or cuda:N (None: the hook's default, auto).
    pub device: Option<&'a str>,
    /// PYTORCH_CUDA_ALLOC_CONF for the job (None or empty: the user's own, if any).
    pub alloc_conf: Option<&'a str>,
    /// Whose bf16 autocast the job's CPU autocast regions follow while the GPU is modelled.
    pub autocast_policy: AutocastPolicy,
}

/// The Python to run a script with.
pub fn python(given: Option<&Path>) -> PathBuf {
    if let Some(p) = given {
        return p.to_path_buf();
    }
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        return PathBuf::from(v).join("bin/python");
    }
    // Installed by pip, the binary sits in the environment's bin/ beside its Python.
    let beside = exe_dir().join("python");
    if beside.exists() {
        return beside;
    }
    if let Some(project) = checkout().map(|c| c.join(".venv/bin/python")).filter(|p| p.exists()) {
        return project;
    }
    PathBuf::from("python3")
}

/// The source checkout this binary was built from, when it runs from one (wherever
/// CARGO_TARGET_DIR put it). Installed by pip, it sits beside its environment's Python and
/// uses that environment's hook, never a source tree.
fn checkout() -> Option<PathBuf> {
    if exe_dir().join("python").exists() {
        return None;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    dir.join("python/vramscope_hook").is_dir().then_some(dir)
}

pub fn exe_dir() -> PathBuf {
    std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)).unwrap_or_else(|| PathBuf::from("."))
}

/// The hook's Python package directory, where `python` can import it from: this
/// repository's `python/` (the checkout the binary was built from), or wherever `python` has it.
fn hook_package(python: &Path, repo_python: Option<&Path>) -> anyhow::Result<PathBuf> {
    let mut cmd = Command::new(python);
    cmd.args(["-c", "import vramscope_hook, os; print(os.path.dirname(vramscope_hook.__file__))"]);
    if let Some(d) = repo_python {
        cmd.env("PYTHONPATH", d);
    }
    let out = cmd.output().with_context(|| format!("running {}", python.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} cannot import vramscope_hook: pip install <vramscope repo>/python into it, or pass --python",
        python.display()
    );
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Where vramscope's own hook is: its Python package, the directory to put on a job's
/// import path for it (a source checkout's `python/`; None when `python` has it installed),
/// and its native core (beside this binary, one directory up for cargo's test binaries in
/// deps/, or in the package, as pip installs it).
pub struct HookFiles {
    pub package: PathBuf,
    pub import_dir: Option<PathBuf>,
    pub core: Option<PathBuf>,
}

pub fn hook_files(python: &Path) -> anyhow::Result<HookFiles> {
    let import_dir = std::env::var_os("VRAMSCOPE_PYTHON_DIR").map(PathBuf::from).or_else(|| checkout().map(|c| c.join("python")));
    let package = hook_package(python, import_dir.as_deref())?;
    let dir = exe_dir();
    let core = [dir.join("libvramscope_hook.so"), dir.join("../libvramscope_hook.so"), package.join("libvramscope_hook.so")].into_iter().find(|p| p.exists());
    Ok(HookFiles { package, import_dir, core })
}

/// The environment that makes every Python process of the job load the hook when it
/// imports torch (torchrun's workers included).
pub fn hook_env(cmd: &mut Command, python: &Path, a: &HookSettings) -> anyhow::Result<()> {
    let files = hook_files(python)?;
    let mut path = vec![files.package.join("_inject")];
    path.extend(files.import_dir);
    path.extend(std::env::var_os("PYTHONPATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default());
    cmd.env("PYTHONPATH", std::env::join_paths(path)?);
    cmd.env("VRAMSCOPE_HOOK", "1");
    if let Some(core) = files.core {
        cmd.env("VRAMSCOPE_HOOK_CORE", core);
    }
    // Commands the job's Python installed (torchrun) come first on its PATH.
    if let Some(bin) = python.parent().filter(|b| !b.as_os_str().is_empty()) {
        let mut path = vec![bin.to_path_buf()];
        path.extend(std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default());
        cmd.env("PATH", std::env::join_paths(path)?);
    }
    check_snapshot_dir(a.snapshot_dir)?;
    let dir = std::path::absolute(a.snapshot_dir)?;
    cmd.env("VRAMSCOPE_SNAPSHOT_DIR", dir);
    if let Some(d) = a.device {
        cmd.env("VRAMSCOPE_DEVICE", d);
    }
    cmd.env("VRAMSCOPE_AUTOCAST_POLICY", a.autocast_policy.as_str());
    if let Some(c) = a.alloc_conf.filter(|c| !c.is_empty()) {
        vramscope_core::allocator::AllocatorConfig::parse_conf(c).map_err(|e| anyhow::anyhow!("--alloc-conf: {e}"))?;
        cmd.env("PYTORCH_CUDA_ALLOC_CONF", c);
    }
    Ok(())
}

/// `--snapshot-dir` checked before a job starts: a run that trained for hours and then
/// could not save its snapshot would lose what `s` was pressed for.
pub fn check_snapshot_dir(dir: &Path) -> anyhow::Result<()> {
    vramscope_core::snapshot::writer::check_writable_dir(dir).map_err(|e| anyhow::anyhow!("--snapshot-dir {}: {e}", dir.display()))
}
