//! `vramscope sweep`, `estimate`, `export` and `run --check-growth` as a user runs them, and
//! the estimate checked against the engine's measured peaks.

mod common;

use common::vramscope;

use assert_cmd::Command;
use serde_json::Value;

use vramscope_core::report::estimate::{estimate_on, Target};
use vramscope_core::step_config::{Attention, AutocastPolicy, Mode, Precision};

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8(cmd.assert().success().get_output().stdout.clone()).unwrap()
}

/// The peak of the row with these knobs, and its activation bytes.
fn cell(rows: &[Value], ctx: i64, precision: &str, mode: &str, attention: &str) -> (u64, u64) {
    let r = rows
        .iter()
        .find(|r| {
            r["config"]["ctx"] == ctx
                && r["config"]["precision"] == precision
                && r["config"]["mode"] == mode
                && r["config"]["attention"] == attention
        })
        .unwrap_or_else(|| panic!("no row for ctx {ctx} {precision} {mode} {attention}"));
    assert_eq!(r["outcome"], "measured", "{r}");
    (r["peak_allocated_bytes"].as_u64().unwrap(), r["activation_bytes"].as_u64().unwrap())
}

#[test]
fn a_cpu_sweep_shows_the_relations_users_rely_on() {
    let sweep = |extra: &[&str]| -> Value {
        let base = ["sweep", "--device", "cpu", "--model", "tiny", "--ctx", "32,128", "--batch", "2", "--warmup", "1", "--steps", "1", "--format", "json", "--fit"];
        serde_json::from_str(&stdout(vramscope().args(base).args(extra))).unwrap()
    };
    let v = sweep(&["--precision", "fp32,bf16", "--mode", "forward,train"]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "the cross product of the lists");
    for ctx in [32, 128] {
        for p in ["fp32", "bf16"] {
            let (train, _) = cell(rows, ctx, p, "train", "naive");
            let (forward, _) = cell(rows, ctx, p, "forward", "naive");
            assert!(train > forward, "ctx {ctx} {p}: a training step ({train}) needs more than a forward pass ({forward})");
        }
    }
    // Naive attention materialises ctx² scores; fused does not.
    let fused = sweep(&["--attention", "fused"]);
    let fused_rows = fused["rows"].as_array().unwrap();
    let growth = |a| {
        let rows = if a == "naive" { rows } else { fused_rows };
        cell(rows, 128, "fp32", "train", a).1 - cell(rows, 32, "fp32", "train", a).1
    };
    assert!(growth("naive") > growth("fused"), "naive {} vs fused {}", growth("naive"), growth("fused"));
    // bf16 activations per token are smaller (the slope drops the constant weight copies).
    let per_token = |p: &str| {
        v["fits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["knob"] == "ctx" && f["group"] == format!("tiny {p} train naive batch 2"))
            .unwrap_or_else(|| panic!("no ctx fit for {p}: {}", v["fits"]))["bytes_per_token"]
            .as_f64()
            .unwrap()
    };
    assert!(per_token("bf16") < per_token("fp32"), "bf16 {} vs fp32 {}", per_token("bf16"), per_token("fp32"));
    // Beside the peak: the time-weighted mean, and samples per second (tokens per sequence).
    for r in rows {
        let (mean, peak) = (r["mean_active_bytes"].as_u64().unwrap(), r["peak_allocated_bytes"].as_u64().unwrap());
        assert!(mean > 0 && mean < peak, "a step holds less on average than at its peak: {r}");
        let ctx = r["config"]["ctx"].as_f64().unwrap();
        let (samples, tokens) = (r["samples_per_s"].as_f64().unwrap(), r["tokens_per_s"].as_f64().unwrap());
        assert!((samples * ctx - tokens).abs() <= 1e-6 * tokens, "{r}");
    }
    // Against ctx, the activations grow most and the parameters not at all.
    let fit = v["fits"].as_array().unwrap().iter().find(|f| f["knob"] == "ctx" && f["group"] == "tiny fp32 train naive batch 2").unwrap();
    let categories = fit["categories"].as_array().unwrap();
    assert_eq!(categories[0]["category"], "activation", "{fit}");
    let parameter = categories.iter().find(|c| c["category"] == "parameter").unwrap();
    assert_eq!((parameter["growth_bytes"].as_i64(), parameter["verdict"].as_str()), (Some(0), Some("flat")), "{fit}");
    let first = &rows[0];
    assert!(first["step_time_s"].as_f64().unwrap() > 0.0);
    assert!(first["peak_phase"] == "forward", "a forward-only run peaks in forward: {first}");
}

#[test]
fn the_markdown_table_and_snapshots_per_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let out = stdout(vramscope().args(["sweep", "--device", "cpu", "--ctx", "16", "--batch", "1,2", "--warmup", "0", "--steps", "1", "--snapshots"]).arg(dir.path()));
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("| model | ctx | batch | precision | mode | attention | checkpointing | peak allocated | peak phase |"), "{out}");
    assert!(lines[1].starts_with("| --- | ---: |"), "{out}");
    assert_eq!(lines[1].matches('|').count(), lines[0].matches('|').count(), "an alignment for every column: {out}");
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[2].starts_with("| tiny | 16 | 1 | fp32 | train | naive | none |") && lines[2].contains("MiB"), "{out}");
    let mut names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["tiny_ctx16_b1_fp32_train_naive_reference.pickle", "tiny_ctx16_b2_fp32_train_naive_reference.pickle"]);
    vramscope_core::snapshot::read_snapshot_file(&dir.path().join(&names[0])).expect("the snapshot reads back");
    // CSV: one header and a row per configuration, bytes as integers.
    let csv = stdout(vramscope().args(["sweep", "--device", "cpu", "--ctx", "16", "--batch", "1", "--warmup", "0", "--steps", "1", "--format", "csv"]));
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert!(row[7].parse::<u64>().unwrap() > 1 << 20, "{csv}");
}

/// Activation checkpointing as a sweep dimension: what forward keeps falls from none to
/// every 2nd block to every block, and so does the peak; each row says its checkpointing
/// and has its step time, and `--fit` keeps each checkpointing to its own group.
#[test]
fn a_checkpointing_sweep_trades_saved_activations_for_recompute() {
    let args = ["sweep", "--device", "cpu", "--model", "tiny", "--ctx", "128,256", "--batch", "4", "--warmup", "1", "--steps", "1", "--checkpointing", "none,every-2,all"];
    let v: Value = serde_json::from_str(&stdout(vramscope().args(args).args(["--format", "json", "--fit"]))).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{v}");
    let at = |ctx: i64, k: &str| {
        let r = rows.iter().find(|r| r["config"]["ctx"] == ctx && r["config"]["checkpointing"] == k).unwrap_or_else(|| panic!("no row ctx {ctx} {k}"));
        assert!(r["step_time_s"].as_f64().unwrap() > 0.0, "{r}");
        (r["activation_bytes"].as_u64().unwrap(), r["peak_allocated_bytes"].as_u64().unwrap())
    };
    for ctx in [128, 256] {
        let (none, every2, all) = (at(ctx, "none"), at(ctx, "every-2"), at(ctx, "all"));
        assert!(none.0 > every2.0 && every2.0 > all.0, "ctx {ctx}: activations none {none:?}, every-2 {every2:?}, all {all:?}");
        // At ctx 128 the optimizer's step, which checkpointing leaves alone, sets the peak.
        if ctx == 256 {
            assert!(none.1 > every2.1 && every2.1 > all.1, "ctx {ctx}: peaks none {none:?}, every-2 {every2:?}, all {all:?}");
        }
    }
    let groups: Vec<&str> = v["fits"].as_array().unwrap().iter().filter(|f| f["knob"] == "ctx").map(|f| f["group"].as_str().unwrap()).collect();
    assert_eq!(groups.len(), 3, "one ctx fit per checkpointing: {groups:?}");
    assert!(groups.contains(&"tiny fp32 train naive checkpointing every-2 batch 4"), "{groups:?}");
    let md = stdout(vramscope().args(args));
    assert!(md.lines().any(|l| l.starts_with("| tiny | 256 | 4 | fp32 | train | naive | every-2 |")), "{md}");
}

#[test]
fn a_sweep_of_a_custom_model_names_it_and_measures_it() {
    let sweep = |extra: &[&str]| -> Value {
        let out = stdout(vramscope().args(["sweep", "--device", "cpu", "--ctx", "16", "--batch", "1", "--warmup", "0", "--steps", "1", "--format", "json"]).args(extra));
        serde_json::from_str::<Value>(&out).unwrap()["rows"][0].clone()
    };
    let plain = sweep(&[]);
    let custom = sweep(&["--layers", "1", "--d-model", "128", "--heads", "4"]);
    assert_eq!(custom["config"]["model_name"], "tiny-dmodel128-layers1-heads4", "{custom}");
    assert_eq!((custom["config"]["dims"]["layers"].as_i64(), custom["config"]["dims"]["d_model"].as_i64()), (Some(1), Some(128)));
    // Fewer, narrower layers than tiny's: less memory at the same shape.
    assert!(custom["peak_allocated_bytes"].as_u64().unwrap() < plain["peak_allocated_bytes"].as_u64().unwrap(), "{custom} vs {plain}");
    let bad = vramscope().args(["sweep", "--device", "cpu", "--heads", "5"]).assert().failure().code(2);
    assert!(String::from_utf8_lossy(&bad.get_output().stderr).contains("--heads (5)"));
}

/// Tolerance of the estimate against the engine's measured phase peaks on CPU (modelled
/// allocator, block sizes): fp32 within 8%, bf16 (autocast casts modelled coarser) within 15%.
#[test]
fn the_estimate_matches_measured_cpu_peaks() {
    let cases = [
        (Mode::Train, Precision::Fp32, Attention::Naive, 0.08),
        (Mode::Train, Precision::Fp32, Attention::Fused, 0.08),
        (Mode::Forward, Precision::Fp32, Attention::Naive, 0.08),
        (Mode::Train, Precision::Bf16, Attention::Naive, 0.15),
        (Mode::Forward, Precision::Bf16, Attention::Naive, 0.15),
    ];
    for (mode, precision, attention, tol) in cases {
        let cfg = common::tiny(128, 2, mode, precision, attention);
        let e = estimate_on(&cfg, Target { cpu: true, autocast_policy: AutocastPolicy::Cuda });
        let run = common::run(common::options(cfg, 2));
        // Step 1 is the steady state (AdamW moments exist).
        let step = run.steps()[1].clone();
        let check = |what: &str, est: u64, measured: u64| {
            let err = (est as f64 - measured as f64).abs() / measured as f64;
            assert!(err <= tol, "{mode} {precision} {attention} {what}: estimate {est}, measured {measured} ({:.1}% off)", err * 100.0);
        };
        let phase = |p: &str| step.phase_peak_bytes[p];
        match mode {
            Mode::Forward => check("forward", e.forward_peak_bytes, phase("forward")),
            Mode::Train => {
                check("forward", e.train_forward_peak_bytes, phase("forward"));
                check("backward", e.backward_peak_bytes, phase("backward"));
                check("optimizer", e.optimizer_peak_bytes, phase("optimizer"));
                check("step", e.step_peak_bytes, step.peak_allocated_bytes);
            }
        }
    }
}

/// Each tensor's dtype under the policy in force: on a GPU (CUDA autocast) the softmax's exp
/// is fp32 and the attention weights go into their matmul as a bf16 copy; a CPU run under
/// CPU autocast keeps them bf16. A GPU has no CPU policy to pick.
#[test]
fn the_estimate_names_each_tensors_dtype_under_the_policy_in_force() {
    let args = ["estimate", "--model", "small", "--ctx", "512", "--batch", "4", "--precision", "bf16"];
    let gpu = stdout(vramscope().args(args));
    for want in [
        "## small — training step, ctx 512, batch 4, bf16 (CUDA autocast)",
        "| softmax: torch.exp(rescaled_input) | [4, 12, 512, 512] fp32 |",
        "| einsum(attention_weights, V, ...): autocast's bf16 copy of attention_weights | [4, 12, 512, 512] bf16 |",
        "| log_softmax: torch.exp(x) | [4, 512, 10000] fp32 |",
    ] {
        assert!(gpu.contains(want), "'{want}' missing:\n{gpu}");
    }
    let cpu = stdout(vramscope().args(args).args(["--cpu", "--autocast-policy", "cpu"]));
    for want in ["bf16 (CPU autocast), naive attention, reference AdamW (as a CPU run measures it)", "| softmax: torch.exp(rescaled_input) | [4, 12, 512, 512] bf16 |", "| log_softmax: torch.exp(x) | [4, 512, 10000] bf16 |"] {
        assert!(cpu.contains(want), "'{want}' missing:\n{cpu}");
    }
    assert!(!cpu.contains("copy of attention_weights"), "{cpu}");
    vramscope()
        .args(args)
        .args(["--autocast-policy", "cpu"])
        .assert()
        .failure()
        .stderr(predicates::str::contains("--autocast-policy cpu is what a CPU run measures: add --cpu"));
}

#[test]
fn estimate_2_7b_prints_the_hand_arithmetic_and_the_fit() {
    let out = stdout(vramscope().args(["estimate", "--model", "2.7B", "--ctx", "512", "--batch", "4", "--gpu-mem", "80GiB"]));
    for want in [
        "parameters (3406809600 × 4 B)",
        "(16 B per parameter)",
        "4 × 512 × 2560 × 4 B = 20971520 B = 20.0 MiB",
        "softmax: exponentiated_rescaled_input / torch.sum(…) | [4, 32, 512, 512] fp32 | 128 MiB",
        "| fp32 |",
        "| bf16 (CUDA autocast) |",
        "In 80.0 GiB (train mode, fp32): fits",
        "Largest ctx at batch 4:",
        "| fp16 (CUDA autocast) |",
        "| training step (backward is twice the forward) | 42.58 TFLOP |",
        "| arithmetic intensity |",
    ] {
        assert!(out.contains(want), "'{want}' missing:\n{out}");
    }
    let v: Value = serde_json::from_str(&stdout(vramscope().args(["estimate", "--model", "2.7B", "--ctx", "128", "--json", "--gpu-mem", "16GiB"]))).unwrap();
    assert_eq!(v["estimate"]["residual_bytes"], 4 * 128 * 2560 * 4);
    let compute = &v["estimate"]["compute"];
    assert_eq!(compute["step_flops"].as_f64().unwrap(), 3.0 * compute["forward_flops"].as_f64().unwrap());
    assert!(compute["flops_per_byte"].as_f64().unwrap() > 1.0, "{compute}");
    assert_eq!(v["fit"]["fits"], false, "16 bytes per parameter alone is 50.8 GiB");
    assert_eq!(v["fit"]["max_batch"], Value::Null);
}

fn png_size(data: &[u8]) -> (u32, u32) {
    assert_eq!(&data[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
    let be = |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn export_draws_a_fixture_snapshot_as_svg_and_png() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = common::fixture_path(common::KKAITLYN);
    let svg = dir.path().join("timeline.svg");
    let png = dir.path().join("timeline.png");
    vramscope().arg("export").arg(&snap).arg("-o").arg(&svg).assert().success();
    vramscope().arg("export").arg(&snap).args(["--width", "800", "--height", "400", "-o"]).arg(&png).assert().success();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains(r#"width="1200""#) && text.contains(r#"height="600""#));
    for want in ["active memory (GiB)", "allocator events", "Active memory timeline — active peak"] {
        assert!(text.contains(want), "'{want}' missing from the SVG");
    }
    assert!(text.matches("<polygon").count() + text.matches("<path").count() > 0, "an area is drawn");
    let data = std::fs::read(&png).unwrap();
    assert_eq!(png_size(&data), (800, 400));
    let img = image::load_from_memory(&data).unwrap().to_rgb8();
    let coloured = img.pixels().filter(|p| !(p[0] == p[1] && p[1] == p[2])).count();
    assert!(coloured > 800 * 400 / 20, "the area covers the plot: {coloured} coloured pixels");
    // Never overwrites.
    vramscope().arg("export").arg(&snap).arg("-o").arg(&png).assert().failure().stderr(predicates::str::contains("refusing to overwrite"));
    vramscope().arg("export").arg(&snap).arg("-o").arg(dir.path().join("t.gif")).assert().failure().stderr(predicates::str::contains(".svg or .png"));
}

#[test]
fn export_shades_the_phases_of_a_vramscope_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    stdout(vramscope().args(["sweep", "--device", "cpu", "--ctx", "32", "--batch", "2", "--warmup", "1", "--steps", "1", "--images"]).arg(dir.path()));
    let png = dir.path().join("tiny_ctx32_b2_fp32_train_naive_reference.png");
    let data = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    assert_eq!(png_size(&data), (1200, 600));
    let snap = dir.path().join("tiny_ctx32_b2_fp32_train_naive_reference.pickle");
    let svg = dir.path().join("t.svg");
    vramscope().arg("export").arg(&snap).arg("-o").arg(&svg).assert().success();
    let text = std::fs::read_to_string(&svg).unwrap();
    for want in ["forward", "backward", "optimizer", "parameter", "optimizer_state", "activation"] {
        // plotters writes each text's content on its own line.
        assert!(text.contains(&format!("\n{want}\n")) || text.contains(&format!("\n{want} (phase)\n")), "legend entry '{want}' missing");
    }
}

#[test]
fn the_growth_check_catches_a_planted_leak_and_passes_a_healthy_loop() {
    let base = ["run", "--headless", "--device", "cpu", "--ctx", "16", "--batch", "1", "--check-growth", "5"];
    let healthy = stdout(vramscope().args(base));
    assert!(healthy.contains("no growth"), "{healthy}");
    let out = vramscope().args(base).args(["--inject-leak-bytes", "262144"]).assert().code(1).get_output().stdout.clone();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("memory keeps growing: phase forward, scope fault_injection.leak") && text.contains("+256 KiB per step"),
        "{text}"
    );
}

/// A sweep row's figures, image and snapshot are its measured steps: building the model
/// (its initialisation's temporaries) is no step's, and not what a write-up shows.
#[test]
fn a_sweep_rows_peak_snapshot_and_image_leave_out_the_models_initialisation() {
    let dir = tempfile::tempdir().unwrap();
    let row = |warmup: &str, images: bool| -> Value {
        let mut cmd = vramscope();
        cmd.args(["sweep", "--device", "cpu", "--model", "tiny", "--ctx", "32", "--batch", "1", "--mode", "forward", "--steps", "1", "--format", "json", "--warmup", warmup]);
        if images {
            cmd.arg("--images").arg(dir.path()).arg("--snapshots").arg(dir.path());
        }
        let v: Value = serde_json::from_str(&stdout(&mut cmd)).unwrap();
        v["rows"][0].clone()
    };
    let measured = row("1", true);
    let peak = measured["peak_allocated_bytes"].as_u64().unwrap();
    // Without warm-up the first step is measured: its peak is a forward pass's, not init's.
    let cold = row("0", false)["peak_allocated_bytes"].as_u64().unwrap();
    assert!(cold as f64 <= peak as f64 * 1.05, "step 0 measured {cold} B against a warm step's {peak} B");
    let snap_path = std::path::PathBuf::from(measured["snapshot"].as_str().unwrap());
    let snap = vramscope_core::snapshot::read_snapshot_file(&snap_path).unwrap();
    let tl = vramscope_core::snapshot::timeline::Timeline::from_snapshot(&snap, 0);
    assert!(tl.peak_bytes <= peak, "the snapshot's active peak {} B is within the measured step's allocated peak {peak} B", tl.peak_bytes);
    assert!(std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| e.path().extension().is_some_and(|x| x == "png")));
}
