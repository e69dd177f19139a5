//! Every shipped theme, at every colour depth: text reads at 4.5:1 or more on what it is
//! drawn on, bands and lines at 3:1 (WCAG contrast, the basic colours as xterm's default
//! palette draws them), and the phase shades and category colours stay apart.

use vramscope_core::event::{Category, Phase};
use vramscope::theme::colour::{distance, rgb};
use vramscope::theme::{ColorSupport, Theme, BUILTIN};

fn every_theme() -> Vec<Theme> {
    BUILTIN.iter().flat_map(|(name, _)| ColorSupport::ALL.map(|d| Theme::load_at(name, d).unwrap())).collect()
}

#[test]
fn every_pair_has_the_contrast_it_needs() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for t in every_theme() {
        for p in t.contrast_pairs() {
            let ratio = p.ratio().unwrap_or_else(|| panic!("{}: {} uses the terminal's own colour", t.label(), p.what));
            checked += 1;
            if ratio < p.min {
                failures.push(format!("{}: {} is {ratio:.2}:1, needs {}:1 ({:?} on {:?})", t.label(), p.what, p.min, p.fg, p.bg));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {checked} pairs too faint:\n{}", failures.len(), failures.join("\n"));
    // Bands on each of the four shades, lines, texts: a few hundred pairs, not a handful.
    assert!(checked > 300, "{checked}");
}

#[test]
fn phases_and_categories_stay_distinct_at_every_depth() {
    for t in every_theme() {
        let shades: Vec<(&str, (u8, u8, u8))> = [Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::ZeroGrad]
            .iter()
            .map(|p| (p.as_str(), rgb(t.phase(*p).unwrap()).unwrap()))
            .chain([("background", rgb(t.ui.background).unwrap())])
            .collect();
        for (i, (a, x)) in shades.iter().enumerate() {
            for (b, y) in &shades[i + 1..] {
                assert!(distance(*x, *y) >= 30.0, "{}: {a} and {b} shades look alike ({x:?} vs {y:?})", t.label());
            }
        }
        let cats: Vec<(Category, (u8, u8, u8))> = Category::ALL.iter().map(|c| (*c, rgb(t.category(*c)).unwrap())).collect();
        for (i, (a, x)) in cats.iter().enumerate() {
            for (b, y) in &cats[i + 1..] {
                assert!(distance(*x, *y) >= 60.0, "{}: {a:?} and {b:?} look alike ({x:?} vs {y:?})", t.label());
            }
        }
    }
}

#[test]
fn the_issues_failures_would_be_caught() {
    // The palette the issue measured: #0000cd gradient on the dark background, and the
    // four phase shades that 256 colours rounded to one grey.
    let mut t = Theme::load_at("dark", ColorSupport::TrueColor).unwrap();
    t.categories[Category::Gradient as usize] = ratatui::style::Color::Rgb(0, 0, 0xcd);
    let bad: Vec<String> = t.contrast_pairs().into_iter().filter(|p| p.ratio().unwrap() < p.min).map(|p| p.what).collect();
    assert!(bad.iter().any(|w| w.starts_with("category.gradient band on phase.forward")), "{bad:?}");
}
