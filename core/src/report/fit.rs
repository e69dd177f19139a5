//! `vramscope sweep --fit`: how peak memory scales with batch size and sequence length —
//! least-squares lines and parabolas with R², and memory per token.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::sweep_row::SweepRow;
use crate::format::bytes;

/// y ≈ Σ coeffs[k]·x^k.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Poly {
    pub coeffs: Vec<f64>,
    pub r2: f64,
}

impl Poly {
    pub fn at(&self, x: f64) -> f64 {
        self.coeffs.iter().rev().fold(0.0, |acc, c| acc * x + c)
    }
}

/// Least-squares polynomial of `degree` through the points (normal equations, solved by
/// Gaussian elimination; x is scaled to its maximum so ctx² stays well conditioned).
/// None when there are not more points than coefficients' worth of distinct x values.
pub fn fit_poly(xs: &[f64], ys: &[f64], degree: usize) -> Option<Poly> {
    let mut distinct = xs.to_vec();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let n = degree + 1;
    if distinct.len() < n || xs.len() != ys.len() {
        return None;
    }
    let scale = distinct.last().copied().filter(|m| *m != 0.0).unwrap_or(1.0);
    let mut a = vec![vec![0.0; n + 1]; n];
    for (&x, &y) in xs.iter().zip(ys) {
        let x = x / scale;
        let pow: Vec<f64> = (0..n).map(|k| x.powi(k as i32)).collect();
        for i in 0..n {
            for j in 0..n {
                a[i][j] += pow[i] * pow[j];
            }
            a[i][n] += pow[i] * y;
        }
    }
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        for row in 0..n {
            if row != col {
                let f = a[row][col] / a[col][col];
                let pivot_row = a[col].clone();
                for (x, p) in a[row].iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let coeffs: Vec<f64> = (0..n).map(|k| a[k][n] / a[k][k] / scale.powi(k as i32)).collect();
    let mean = ys.iter().sum::<f64>() / ys.len() as f64;
    let total: f64 = ys.iter().map(|y| (y - mean).powi(2)).sum();
    let mut p = Poly { coeffs, r2: 1.0 };
    let resid: f64 = xs.iter().zip(ys).map(|(x, y)| (y - p.at(*x)).powi(2)).sum();
    p.r2 = if total > 0.0 { 1.0 - resid / total } else { 1.0 };
    Some(p)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Knob {
    Batch,
    Ctx,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scaling {
    /// The configuration held fixed, e.g. "tiny fp32 train naive ctx 128".
    pub group: String,
    pub knob: Knob,
    pub points: Vec<(i64, u64)>,
    pub linear: Poly,
    pub quadratic: Option<Poly>,
    /// "quadratic" when the x² term carries more than 5% of the peak at the largest x.
    pub verdict: &'static str,
    /// Activation memory per token: the slope of the rows' activation bytes (forward's
    /// addition over the step's starting memory), per token. Constant terms such as bf16
    /// weight copies drop out of a slope. None when a row lacks the measure.
    pub bytes_per_token: Option<f64>,
    /// Each category's most bytes in a step against the knob, steepest growth first.
    pub categories: Vec<CategoryGrowth>,
}

/// How the most bytes one category holds in a step grow with a knob.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CategoryGrowth {
    pub category: String,
    pub points: Vec<(i64, u64)>,
    /// From the smallest knob value to the largest.
    pub growth_bytes: i64,
    /// "quadratic", "linear", or "flat" (it does not grow).
    pub verdict: &'static str,
}

/// Share of the peak at the largest x that makes the x² term count as real growth.
const QUADRATIC_SHARE: f64 = 0.05;

/// A measured configuration as a point of a fit.
struct Point {
    x: i64,
    peak: u64,
    activations: Option<u64>,
    /// The most bytes each category held in a step.
    categories: BTreeMap<String, u64>,
}

/// What two points say of a curve: nothing (a line fits any two exactly).
const TOO_FEW: &str = "too few points to tell (3 values needed)";

/// "quadratic" when the x² term of a parabola through the points carries more than
/// `QUADRATIC_SHARE` of the value at the largest x, else "linear"; `TOO_FEW` when no
/// parabola can be told from a line.
fn verdict(xs: &[f64], quadratic: Option<&Poly>) -> &'static str {
    let (Some(&xmax), Some(q)) = (xs.last(), quadratic) else { return TOO_FEW };
    let share = q.coeffs[2] * xmax * xmax / q.at(xmax).max(1.0);
    if share > QUADRATIC_SHARE {
        "quadratic"
    } else {
        "linear"
    }
}

fn category_growth(pts: &[Point]) -> Vec<CategoryGrowth> {
    let names: std::collections::BTreeSet<&String> = pts.iter().flat_map(|p| p.categories.keys()).collect();
    let xs: Vec<f64> = pts.iter().map(|p| p.x as f64).collect();
    let mut out: Vec<CategoryGrowth> = names
        .into_iter()
        .map(|name| {
            let points: Vec<(i64, u64)> = pts.iter().map(|p| (p.x, p.categories.get(name).copied().unwrap_or(0))).collect();
            let ys: Vec<f64> = points.iter().map(|p| p.1 as f64).collect();
            let growth_bytes = points.last().map_or(0, |l| l.1 as i64) - points.first().map_or(0, |f| f.1 as i64);
            let verdict = if growth_bytes <= 0 { "flat" } else { verdict(&xs, fit_poly(&xs, &ys, 2).as_ref()) };
            CategoryGrowth { category: name.clone(), points, growth_bytes, verdict }
        })
        .collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.growth_bytes));
    out
}

fn scaling(group: String, knob: Knob, mut pts: Vec<Point>, other: i64) -> Option<Scaling> {
    pts.sort_by_key(|p| p.x);
    let xs: Vec<f64> = pts.iter().map(|p| p.x as f64).collect();
    let ys: Vec<f64> = pts.iter().map(|p| p.peak as f64).collect();
    let acts: Option<Vec<f64>> = pts.iter().map(|p| p.activations.map(|a| a as f64)).collect();
    let points: Vec<(i64, u64)> = pts.iter().map(|p| (p.x, p.peak)).collect();
    let linear = fit_poly(&xs, &ys, 1)?;
    let quadratic = fit_poly(&xs, &ys, 2);
    Some(Scaling {
        group,
        knob,
        verdict: verdict(&xs, quadratic.as_ref()),
        // Tokens per unit of x: a sequence of `other` tokens per batch row, or `other`
        // sequences per extra position.
        bytes_per_token: acts.and_then(|a| fit_poly(&xs, &a, 1)).map(|l| l.coeffs[1] / other as f64),
        categories: category_growth(&pts),
        points,
        linear,
        quadratic,
    })
}

/// Fits every group of measured rows that differ only in batch, and only in ctx.
pub fn fits(rows: &[SweepRow]) -> Vec<Scaling> {
    let mut by_batch: BTreeMap<(String, i64), Vec<Point>> = BTreeMap::new();
    let mut by_ctx: BTreeMap<(String, i64), Vec<Point>> = BTreeMap::new();
    for r in rows {
        let Some(peak) = r.peak_bytes() else { continue };
        let c = &r.config;
        let base = format!("{} {} {} {}", c.model_name, c.precision, c.mode, c.attention)
            + &if c.checkpointing == crate::step_config::Checkpointing::None { String::new() } else { format!(" checkpointing {}", c.checkpointing) };
        let point = |x| Point { x, peak, activations: r.activation_bytes(), categories: r.category_peak_bytes().cloned().unwrap_or_default() };
        by_batch.entry((format!("{base} ctx {}", c.ctx), c.ctx)).or_default().push(point(c.batch));
        by_ctx.entry((format!("{base} batch {}", c.batch), c.batch)).or_default().push(point(c.ctx));
    }
    let batch = by_batch.into_iter().filter_map(|((g, ctx), p)| scaling(g, Knob::Batch, p, ctx));
    let ctx = by_ctx.into_iter().filter_map(|((g, b), p)| scaling(g, Knob::Ctx, p, b));
    batch.chain(ctx).collect()
}

pub fn render(fits: &[Scaling]) -> String {
    let mut s = String::from("| against | held fixed | points | linear R² | quadratic R² | growth | activations per token |\n|---|---|---:|---:|---:|---|---:|\n");
    for f in fits {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            match f.knob {
                Knob::Batch => "batch",
                Knob::Ctx => "ctx",
            },
            f.group,
            f.points.len(),
            // Any two points lie on a line: an R² of 1 there would claim a fit.
            if f.quadratic.is_some() { format!("{:.4}", f.linear.r2) } else { "–".to_string() },
            f.quadratic.as_ref().map_or("–".to_string(), |q| format!("{:.4}", q.r2)),
            f.verdict,
            f.bytes_per_token.map_or("–".to_string(), |b| bytes(b.max(0.0).round() as u64))
        );
    }
    if fits.is_empty() {
        s += "| – | no two measured configurations differ in batch or ctx alone | | | | | |\n";
    }
    let with_categories: Vec<&Scaling> = fits.iter().filter(|f| !f.categories.is_empty()).collect();
    if !with_categories.is_empty() {
        s += "\nThe most each category holds in a step, steepest growth first:\n\n| against | held fixed | category | at each value | growth | |\n|---|---|---|---|---:|---|\n";
        for f in with_categories {
            let knob = match f.knob {
                Knob::Batch => "batch",
                Knob::Ctx => "ctx",
            };
            for c in &f.categories {
                let each = c.points.iter().map(|(x, b)| format!("{x}: {}", bytes(*b))).collect::<Vec<_>>().join(", ");
                let growth = if c.growth_bytes < 0 { format!("-{}", bytes(c.growth_bytes.unsigned_abs())) } else { bytes(c.growth_bytes as u64) };
                let _ = writeln!(s, "| {knob} | {} | {} | {each} | {growth} | {} |", f.group, c.category, c.verdict);
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_lines_and_parabolas_are_recovered() {
        let xs = [128.0, 256.0, 512.0, 1024.0];
        let line: Vec<f64> = xs.iter().map(|x| 1e9 + 3e5 * x).collect();
        let p = fit_poly(&xs, &line, 1).unwrap();
        assert!((p.coeffs[1] - 3e5).abs() < 1e-3 && (p.r2 - 1.0).abs() < 1e-9, "{p:?}");
        let parabola: Vec<f64> = xs.iter().map(|x| 1e9 + 3e5 * x + 2e3 * x * x).collect();
        let lin = fit_poly(&xs, &parabola, 1).unwrap();
        let quad = fit_poly(&xs, &parabola, 2).unwrap();
        assert!(lin.r2 < 0.999 && (quad.r2 - 1.0).abs() < 1e-9);
        assert!((quad.coeffs[2] - 2e3).abs() < 1e-3, "{quad:?}");
        assert!(fit_poly(&[1.0, 1.0], &[2.0, 3.0], 1).is_none(), "one distinct x has no slope");
    }

    #[test]
    fn verdicts_tell_quadratic_from_linear_growth() {
        let point = |x, peak, activations, categories: &[(&str, u64)]| Point { x, peak, activations, categories: categories.iter().map(|(c, b)| (c.to_string(), *b)).collect() };
        let pts = vec![
            point(128, 1_000, Some(500), &[("parameter", 400), ("activation", 600)]),
            point(256, 2_000, Some(1_500), &[("parameter", 400), ("activation", 1_600)]),
            point(512, 4_000, Some(3_500), &[("parameter", 400), ("activation", 3_600)]),
        ];
        let lin = scaling("g".into(), Knob::Ctx, pts, 2).unwrap();
        let cats: Vec<(&str, i64, &str)> = lin.categories.iter().map(|c| (c.category.as_str(), c.growth_bytes, c.verdict)).collect();
        assert_eq!(cats, [("activation", 3_000, "linear"), ("parameter", 0, "flat")], "steepest first");
        assert_eq!(lin.verdict, "linear");
        let per_token = lin.bytes_per_token.unwrap();
        assert!((per_token - 3.90625).abs() < 1e-9, "activations grow 7.8125 B per position over a batch of 2: {per_token}");
        let quad_pts = [128i64, 256, 512].map(|x| point(x, (1_000 + 8 * x + x * x) as u64, None, &[("activation", (8 * x + x * x) as u64)])).into_iter().collect();
        let quad = scaling("g".into(), Knob::Ctx, quad_pts, 2).unwrap();
        assert_eq!(quad.verdict, "quadratic");
        assert_eq!(quad.categories[0].verdict, "quadratic", "the category that holds the x² term");
        assert_eq!(quad.bytes_per_token, None);
        // Two points (issue 34: "linear, R² 1.0"): any line fits them, so nothing is claimed.
        let two = scaling("g".into(), Knob::Batch, vec![point(1, 1_000, None, &[("activation", 100)]), point(2, 2_000, None, &[("activation", 200)])], 32).unwrap();
        assert_eq!((two.verdict, two.categories[0].verdict), (TOO_FEW, TOO_FEW));
        let table = render(&[two]);
        assert!(table.contains("| batch | g | 2 | – | – | too few points to tell (3 values needed) |"), "{table}");
    }
}
