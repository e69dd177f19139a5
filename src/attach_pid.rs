//! `vramscope attach --pid PID`: getting vramscope's hook into a Python job that was started
//! without it, as `memray attach` does. First everything that can be checked from outside
//! (the process, its owner, its interpreter, torch, ptrace's policy), each failure one line
//! with what to do. Then the way in: `sys.remote_exec` where the job's Python has it (3.14
//! on), else gdb in batch mode, which stops the job at the entry of malloc or free (a point
//! where no lock that dlopen needs is held by the stopped thread), loads the hook's core and
//! calls `vsh_attach_spawn`, which only starts a thread, and leaves. That thread runs the
//! attach script once it holds the GIL; the script says how it went in a status file.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vramscope_core::channel::dir;
use vramscope_core::source::launch::job_name;

use crate::job_env;

/// How long gdb may wait for the job to call malloc or free (a job that calls neither is
/// blocked in C with no Python running).
const SAFE_POINT_WAIT: Duration = Duration::from_secs(10);
/// How long gdb may take to leave once interrupted before it is ended (a cuda-gdb that
/// hung on a GPU box kept the job stopped).
const GDB_LEAVE_WAIT: Duration = Duration::from_secs(5);
/// How long the attach script may take to say how it went: it waits for the GIL, then may
/// compile the capture shim against the job's torch (seconds, once per torch version).
const STATUS_WAIT: Duration = Duration::from_secs(90);

/// What the checks learned about the process.
#[derive(Debug)]
pub struct Target {
    /// The job's Python version, where its executable or libpython names it.
    pub python: Option<(u32, u32)>,
}

/// The job's status line, read from `/proc/PID/status`.
fn status_field(pid: u32, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
}

/// "3.11" in "python3.11", "libpython3.11.so.1.0".
fn python_version_in(name: &str) -> Option<(u32, u32)> {
    let i = name.find("python3.")? + "python3.".len();
    let minor: String = name[i..].chars().take_while(char::is_ascii_digit).collect();
    Some((3, minor.parse().ok()?))
}

/// Everything checkable from outside, each failure one line saying the cause and what to do.
pub fn check(pid: u32) -> anyhow::Result<Target> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    anyhow::ensure!(pid > 0 && proc_dir.exists(), "no process with PID {pid}");
    let uid = status_field(pid, "Uid:").and_then(|v| v.split_whitespace().next().and_then(|u| u.parse::<u32>().ok()));
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    if let Some(uid) = uid.filter(|&u| u != me && me != 0) {
        anyhow::bail!("process {pid} belongs to another user (uid {uid}): vramscope attaches only to your own processes (or run it as root)");
    }
    let exe = std::fs::read_link(proc_dir.join("exe")).map_err(|e| anyhow::anyhow!("cannot read process {pid}'s program: {e}"))?;
    let maps = std::fs::read_to_string(proc_dir.join("maps")).map_err(|e| anyhow::anyhow!("cannot read process {pid}'s memory map: {e}"))?;
    let exe_name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let libpython = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("libpython3."));
    anyhow::ensure!(
        exe_name.starts_with("python") || libpython.is_some(),
        "process {pid} is not a CPython process (its program is {})",
        exe.display()
    );
    anyhow::ensure!(
        maps.contains("libtorch_cpu.so") || maps.contains("libtorch_python.so"),
        "process {pid} has not imported torch yet: attach once it has, or start it with `vramscope py`"
    );
    let python = python_version_in(&exe_name).or_else(|| libpython.and_then(python_version_in));
    Ok(Target { python })
}

/// Why ptrace will refuse, from Yama's setting, before gdb tries (None: it may work).
fn ptrace_refusal(pid: u32) -> Option<String> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?;
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    match scope.trim() {
        "1" if !root => Some(format!(
            "ptrace is limited to a process's parent (kernel.yama.ptrace_scope = 1), so vramscope cannot reach process {pid}: \
             `sudo sysctl kernel.yama.ptrace_scope=0` lifts it until reboot, or run vramscope attach as root"
        )),
        "2" if !root => Some("ptrace is limited to root (kernel.yama.ptrace_scope = 2): run vramscope attach as root".into()),
        "3" => Some("ptrace is disabled on this machine until it reboots (kernel.yama.ptrace_scope = 3): start the job with `vramscope py` instead".into()),
        _ => None,
    }
}

/// The gdb commands: wait for a safe point, load the core, start the attach thread. The
/// work is in the breakpoints' commands, so it runs only where one was hit: a wait that is
/// interrupted (the job never allocates) changes nothing.
fn gdb_script(core: &Path, script: &Path) -> String {
    let q = |p: &Path| serde_json::to_string(&p.to_string_lossy()).expect("a string serialises");
    format!(
        "set pagination off\nset confirm off\n\
         # A signal during a call unwinds it rather than leaving the job stopped in it.\n\
         set unwindonsignal on\n\
         sharedlibrary libc.so\n\
         break malloc\nbreak free\n\
         commands 1-2\n\
         \x20 silent\n  delete\n\
         \x20 set $h = (void*)dlopen({core}, 2)\n\
         \x20 if $h == 0\n    printf \"VS_DLOPEN_FAILED %s\\n\", (char*)dlerror()\n  else\n\
         \x20   set $f = (int(*)(const char*))dlsym($h, \"vsh_attach_spawn\")\n\
         \x20   if $f == 0\n      printf \"VS_NO_ENTRY\\n\"\n    else\n      printf \"VS_SPAWNED %d\\n\", $f({script})\n    end\n  end\n\
         end\n\
         continue\ndetach\nquit\n",
        core = q(core),
        script = q(script)
    )
}

/// What gdb's output says, as one line for the user (Ok: the thread started).
fn gdb_outcome(pid: u32, out: &str) -> anyhow::Result<()> {
    if let Some(rc) = out.lines().find_map(|l| l.strip_prefix("VS_SPAWNED ")) {
        return match rc.trim() {
            "0" => Ok(()),
            "-2" => anyhow::bail!("process {pid} has no Python API to call (not a CPython process?)"),
            "-3" => anyhow::bail!("process {pid}'s Python is not initialised yet (or is shutting down)"),
            other => anyhow::bail!("the hook could not start a thread in process {pid} (code {other})"),
        };
    }
    if let Some(e) = out.lines().find_map(|l| l.strip_prefix("VS_DLOPEN_FAILED ")) {
        anyhow::bail!("the job could not load vramscope's hook library: {e}");
    }
    if out.contains("VS_NO_ENTRY") {
        anyhow::bail!("vramscope's hook library has no attach entry point (an older build?)");
    }
    if out.contains("ptrace: Operation not permitted") {
        anyhow::bail!(
            "ptrace is not permitted here (a container without the SYS_PTRACE capability? run it with --cap-add=SYS_PTRACE), \
             so vramscope cannot reach process {pid}"
        );
    }
    let last = out.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no output");
    anyhow::bail!("gdb could not get into process {pid}: {last}")
}

/// Whether `child` exits within `wait` (one that cannot be waited on counts as gone).
fn exits_within(child: &mut std::process::Child, wait: Duration) -> bool {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Whether process `pid` is stopped, by a signal ("T (stopped)") or a tracer ("t").
fn stopped(pid: u32) -> bool {
    status_field(pid, "State:").is_some_and(|s| s.starts_with(['T', 't']))
}

/// gdb's way in; returns once gdb has left the job.
fn inject_with_gdb(gdb: &Path, pid: u32, core: &Path, script: &Path, work: &Path) -> anyhow::Result<()> {
    let commands = work.with_extension("gdb");
    std::fs::write(&commands, gdb_script(core, script))?;
    // Read before gdb starts: once it runs, it may already have stopped the job.
    let was_stopped = stopped(pid);
    let mut child = Command::new(gdb)
        // Symbols of libc only (not torch's hundreds of MB): the job stays stopped for
        // a fraction of a second.
        .args(["-q", "-nx", "-batch", "-iex", "set auto-solib-add off", "-p", &pid.to_string(), "-x"])
        .arg(&commands)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let reached = exits_within(&mut child, SAFE_POINT_WAIT);
    if !reached {
        // gdb interrupts the job, removes its breakpoints and detaches on SIGINT in batch
        // mode: the job goes on as it was.
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        if !exits_within(&mut child, GDB_LEAVE_WAIT) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&commands);
            // A tracer that dies detaches the job, but a job it left stopped stays so.
            if !was_stopped {
                // SAFETY: waking a process this user may trace.
                unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            }
            anyhow::bail!(
                "{} did not answer within {} s and was ended; process {pid} runs on as it was",
                gdb.display(),
                (SAFE_POINT_WAIT + GDB_LEAVE_WAIT).as_secs()
            );
        }
    }
    let mut out = String::new();
    child.stdout.take().map(|mut o| o.read_to_string(&mut out));
    child.stderr.take().map(|mut e| e.read_to_string(&mut out));
    let _ = std::fs::remove_file(&commands);
    if !reached {
        anyhow::bail!(
            "process {pid} called neither malloc nor free for {} s (blocked in C code, or stopped): nothing was changed; try again when it runs",
            SAFE_POINT_WAIT.as_secs()
        );
    }
    gdb_outcome(pid, &out)
}

/// PEP 768's way in (Python 3.14 on): the job runs the script in its main thread at its
/// next eval-breaker check.
fn inject_with_remote_exec(pid: u32, script: &Path) -> anyhow::Result<()> {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let out = Command::new(exe)
        .args(["-c", "import sys; sys.remote_exec(int(sys.argv[1]), sys.argv[2])"])
        .arg(pid.to_string())
        .arg(script)
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no output");
    anyhow::bail!("sys.remote_exec could not reach process {pid}: {last} (remote debugging disabled in it? PYTHON_DISABLE_REMOTE_DEBUG, -X disable_remote_debug)")
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(program)).find(|f| f.is_file()))
}

/// The processes of `pid` that train: itself, or where it is torchrun's launcher, its
/// worker ranks (its children that have a RANK and torch), not the launcher itself, nor
/// DataLoader workers or other helpers, which are the ranks' children.
pub fn trainers(pid: u32) -> Vec<u32> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let launcher = cmdline.split(|&b| b == 0).any(|arg| {
        let arg = String::from_utf8_lossy(arg);
        arg.ends_with("torchrun") || arg == "torch.distributed.run" || arg == "torch.distributed.launch"
    });
    if !launcher {
        return vec![pid];
    }
    let mut ranks: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // The parent pid is the field after the command's closing parenthesis and state.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            let environ = std::fs::read(format!("/proc/{child}/environ")).unwrap_or_default();
            ppid == Some(pid) && environ.split(|&b| b == 0).any(|v| v.starts_with(b"RANK="))
        })
        .collect();
    ranks.sort_unstable();
    ranks
}

/// Gets the hook into process `pid` (each worker rank where it is torchrun's launcher)
/// and returns the name its sessions serve viewers under.
pub fn attach(pid: u32, snapshot_dir: &Path) -> anyhow::Result<String> {
    crate::job_env::check_snapshot_dir(snapshot_dir)?;
    // Each process attached to is checked there (a PID that is no process gives itself).
    let ranks = trainers(pid);
    anyhow::ensure!(!ranks.is_empty(), "process {pid} is torchrun's launcher, and none of its workers has started yet");
    let job = job_name(&format!("pid{pid}"));
    for &rank in &ranks {
        attach_one(rank, &job, snapshot_dir).map_err(|e| if rank == pid { e } else { e.context(format!("worker {rank} of torchrun {pid}")) })?;
    }
    Ok(job)
}

/// Gets the hook into one process, serving under `job`.
fn attach_one(pid: u32, job: &str, snapshot_dir: &Path) -> anyhow::Result<()> {
    let target = check(pid)?;
    // gdb, where the job's Python has no sys.remote_exec.
    let gdb = if target.python.is_some_and(|v| v >= (3, 14)) {
        None
    } else {
        if let Some(why) = ptrace_refusal(pid) {
            anyhow::bail!(why);
        }
        let v = target.python.map_or("its Python".into(), |(a, b)| format!("its Python {a}.{b}"));
        // CUDA's toolkit brings a gdb of its own, often on GPU boxes that have no other.
        Some(which("gdb").or_else(|| which("cuda-gdb")).ok_or_else(|| {
            anyhow::anyhow!("gdb is not installed (apt install gdb), and {v} has no sys.remote_exec (3.14 on): vramscope needs one of them to get into process {pid}")
        })?)
    };
    let python = job_env::python(None);
    let files = job_env::hook_files(&python)?;
    let core = files.core.ok_or_else(|| anyhow::anyhow!("vramscope's hook core (libvramscope_hook.so) is not installed beside vramscope"))?;
    let sockets = dir::socket_dir()?;
    let work = sockets.join(format!("{job}-{pid}.attach"));
    let (script, status) = (work.with_extension("py"), work.with_extension("status"));
    let config = serde_json::json!({
        "status": status,
        "job": job,
        "socket_dir": sockets,
        "snapshot_dir": std::path::absolute(snapshot_dir)?,
        "wait_for_viewer": false,
        "hook_core": core,
    });
    // vramscope's own hook first on the job's import path, so a job in another venv works.
    let import_dir = files.package.parent().map(Path::to_path_buf).unwrap_or_default();
    let q = |v: &serde_json::Value| serde_json::to_string(v).expect("json");
    let text = format!(
        "import json, sys\nsys.path.insert(0, {dir})\nimport vramscope_hook._attach\nvramscope_hook._attach.attach(json.loads({config}))\n",
        dir = q(&serde_json::Value::String(import_dir.to_string_lossy().into_owned())),
        config = q(&serde_json::Value::String(config.to_string())),
    );
    write_private(&script, &text)?;
    let injected = match &gdb {
        Some(gdb) => inject_with_gdb(gdb, pid, &core, &script, &work),
        None => inject_with_remote_exec(pid, &script),
    };
    let outcome = injected.and_then(|()| wait_status(pid, &status));
    let _ = std::fs::remove_file(&script);
    let _ = std::fs::remove_file(&status);
    outcome
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Waits for the attach script's status line.
fn wait_status(pid: u32, status: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Ok(line) = std::fs::read_to_string(status) {
            let line = line.trim();
            return match line.split_once(' ') {
                Some(("ok", _)) => Ok(()),
                Some(("error", why)) => anyhow::bail!("{why}"),
                _ => anyhow::bail!("the attach script said: {line}"),
            };
        }
        anyhow::ensure!(Path::new(&format!("/proc/{pid}")).exists(), "process {pid} ended before the hook started");
        if started.elapsed() > STATUS_WAIT {
            anyhow::bail!(
                "process {pid}'s Python did not run the hook within {} s: its main thread holds the GIL in C code (a long kernel, a wait); the hook starts when it lets go",
                STATUS_WAIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_versions_are_read_from_the_program_or_libpython() {
        assert_eq!(python_version_in("python3.11"), Some((3, 11)));
        assert_eq!(python_version_in("/usr/lib/libpython3.14.so.1.0"), Some((3, 14)));
        assert_eq!(python_version_in("python3"), None);
    }

    #[test]
    fn gdbs_output_becomes_one_line() {
        assert!(gdb_outcome(7, "Breakpoint 1\nVS_SPAWNED 0\n").is_ok());
        let e = gdb_outcome(7, "VS_DLOPEN_FAILED /x.so: cannot open shared object file\n").unwrap_err().to_string();
        assert!(e.contains("could not load vramscope's hook library: /x.so"), "{e}");
        let e = gdb_outcome(7, "ptrace: Operation not permitted.\n").unwrap_err().to_string();
        assert!(e.contains("SYS_PTRACE") && e.contains("process 7"), "{e}");
        let e = gdb_outcome(7, "VS_SPAWNED -3\n").unwrap_err().to_string();
        assert!(e.contains("not initialised"), "{e}");
    }
}
