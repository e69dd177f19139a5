//! What watching a user's job costs it: the step time of one PyTorch script (a transformer
//! trained with AdamW, tests/py/train_transformer.py; with `--dense`, the issue 35 MLP with
//! gradient accumulation, tests/py/dense_mlp.py) run plainly and under `vramscope py`,
//! interleaved in one run so machine noise hits both alike (targets: 1.05× dense, 1.02× the
//! transformer), and the bytes per allocator event on the job's socket.
//!
//!   cargo bench --bench hook_overhead -- [rounds] [steps] [d_model] [layers] [ctx]
//!   cargo bench --bench hook_overhead -- --dense [rounds] [steps] [torch threads]
//!
//! With `--python`, the dense job's step in one process plainly, with torch's global
//! module hooks doing nothing, with a wrapper of `nn.Module.__call__` doing nothing, and
//! under the hook's Python with a core that does nothing (benches/hook_python.py): what the
//! hook's Python and torch's hook path cost, apart from the core and the machine's noise
//! between processes. With `--python --real`, under `vramscope py --headless` in one
//! process: nothing followed (the shim's recording off, the hook's Python out), the capture
//! alone, and the capture with the hook's Python, each way ten steps in turn. With
//! `--python --parts`, the hook's own time in each function it puts into torch, a step
//! (with `--real` too: the job's own hook, its calls into the real core counted in).
//!
//!   cargo bench --bench hook_overhead -- --python [--real] [--parts] [--gc] [--threads N] [rounds] [steps]
//!
//! `--python` runs torch on one thread and times each step in that thread's CPU time;
//! `--threads N` runs it on N and times the wall clock, as a job using all its cores runs.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use vramscope_core::stream::chunk::ChunkReader;
use vramscope_core::stream::codec::Record;
use vramscope_core::stream::Incoming;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn dense() -> bool {
    std::env::args().any(|a| a == "--dense")
}

fn script() -> std::path::PathBuf {
    common::root().join(if dense() { "tests/py/dense_mlp.py" } else { "tests/py/train_transformer.py" })
}

/// The script's own step times (the first, warm-up step left out).
fn step_times(hooked: bool, args: &[String], dir: &Path, n: usize) -> Vec<f64> {
    let timings = dir.join(format!("t{n}{}.txt", if hooked { "h" } else { "p" }));
    let mut cmd = if hooked {
        let mut c = Command::new(common::built("vramscope"));
        c.args(["py", "--headless"]).arg(script());
        c
    } else {
        let mut c = Command::new(common::python());
        c.arg(script());
        c
    };
    cmd.args(args).arg("--timings").arg(&timings).env("VRAMSCOPE_SOCKET_DIR", dir.join("sockets"));
    let st = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().expect("run the script");
    assert!(st.success(), "the script failed (hooked: {hooked})");
    std::fs::read_to_string(&timings).expect("timings").lines().skip(1).map(|l| l.parse().expect("seconds")).collect()
}

/// Counts the bytes read through it.
struct Counting<R>(R, std::rc::Rc<std::cell::Cell<u64>>);

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        self.1.set(self.1.get() + n as u64);
        Ok(n)
    }
}

/// (bytes, events) a viewer receives from one run of the script.
fn wire(args: &[String], dir: &Path) -> (u64, u64) {
    let sockets = dir.join("wire");
    vramscope_core::channel::dir::ensure_private_dir(&sockets).expect("socket dir");
    let mut job = Command::new(common::python())
        .args(["-m", "vramscope_hook"])
        .arg(script())
        .args(args)
        .env("PYTHONPATH", common::root().join("python"))
        .env("VRAMSCOPE_HOOK_CORE", common::built("libvramscope_hook.so"))
        .env("VRAMSCOPE_SOCKET_DIR", &sockets)
        .env("VRAMSCOPE_WAIT_FOR_VIEWER", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the job");
    let sock = loop {
        let found = std::fs::read_dir(&sockets).ok().and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|e| e == "sock")));
        if let Some(s) = found {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (r, _w) = vramscope_core::source::job::connect(&vramscope_core::channel::Endpoint::Unix(sock), None).expect("attach");
    let bytes = std::rc::Rc::new(std::cell::Cell::new(0));
    let mut reader = ChunkReader::new(Counting(r, bytes.clone())).expect("a stream");
    let mut events = 0u64;
    while let Ok(Some(records)) = reader.next_chunk() {
        for r in records {
            if let Record::Item { item: Incoming::Batch(b), .. } = r {
                events += b.events.len() as u64;
            }
        }
    }
    job.wait().expect("the job ends");
    (bytes.get(), events)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if std::env::args().any(|a| a == "--python") {
        let bench = common::root().join("benches/hook_python.py");
        // The script's own arguments, in order (cargo's `--bench` is not one of them).
        let own: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench" && a != "--python").collect();
        let status = if own.iter().any(|a| a == "--real") {
            Command::new(common::built("vramscope")).args(["py", "--headless"]).arg(bench).args(&own).stdout(Stdio::null()).status()
        } else {
            Command::new(common::python()).arg(bench).args(&own).status()
        };
        assert!(status.expect("python runs").success(), "benches/hook_python.py failed");
        return;
    }
    let arg = |i: usize, d: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (rounds, steps, d_model, layers, ctx) = (arg(0, 4), arg(1, 12), arg(2, 256), arg(3, 4), arg(4, 128));
    let script_args: Vec<String> = if dense() {
        // A few hundred steps of ~2 ms: the second argument, the third torch's threads.
        vec!["--steps".into(), arg(1, 300).to_string(), "--threads".into(), arg(2, 0).to_string()]
    } else {
        ["--steps", &steps.to_string(), "--d-model", &d_model.to_string(), "--layers", &layers.to_string(), "--ctx", &ctx.to_string(), "--batch", "4"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    vramscope_core::channel::dir::ensure_private_dir(&dir.path().join("sockets")).expect("socket dir");
    let (mut plain, mut hooked, mut paired) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds as usize {
        // Alternate which goes first, so a trend in machine load favours neither.
        let mut round = [0.0; 2];
        for with in if r % 2 == 0 { [false, true] } else { [true, false] } {
            let t = step_times(with, &script_args, dir.path(), r);
            round[with as usize] = median(t.clone());
            eprintln!("round {r} {}: {:.4} s/step", if with { "with the hook" } else { "plain" }, round[with as usize]);
            if with { hooked.extend(t) } else { plain.extend(t) }
        }
        paired.push(round[1] / round[0]);
    }
    let (p, h) = (median(plain), median(hooked));
    match dense() {
        true => println!("dense MLP, 4 micro-batches of [32, 256] per AdamW step, CPU, {}: {rounds} rounds, interleaved", script_args.join(" ")),
        false => println!("transformer d_model {d_model}, {layers} layers, ctx {ctx}, batch 4, AdamW, CPU: {rounds} rounds × {steps} steps, interleaved"),
    }
    println!("  median step plain:            {p:.4} s");
    // Issue 35's bars: the dense job's many small tensors 1.05×, the transformer's 1.02×.
    let target = if dense() { 1.05 } else { 1.02 };
    println!("  median step under vramscope:  {h:.4} s  ({:.3}×, target ≤ {target}×)", h / p);
    // This machine's step time moves by a fifth from process to process: each round's two
    // runs, one after the other, against each other.
    let (lo, hi) = paired.iter().fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    println!("  round by round:               {:.3}× median, {lo:.3}-{hi:.3}× ({} rounds)", median(paired.clone()), paired.len());
    let (bytes, events) = wire(&script_args, dir.path());
    println!("  on the wire: {events} events in {bytes} bytes = {:.2} bytes/event (zstd level 1, everything included)", bytes as f64 / events as f64);
}
