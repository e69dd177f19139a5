//! Text that fits character cells: bars with eighth-cell edges, strings cut with '…'.

/// A bar of `width` cells, filled in proportion to `frac` (clamped to 0..=1), with
/// eighth-cell resolution at its edge.
pub fn bar(frac: f64, width: usize) -> (String, String) {
    const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    let eighths = (frac.clamp(0.0, 1.0) * (width * 8) as f64).round() as usize;
    let full = eighths / 8;
    let mut filled = "█".repeat(full);
    let mut rest = width - full;
    if full < width && !eighths.is_multiple_of(8) {
        filled.push(EIGHTHS[eighths % 8]);
        rest -= 1;
    }
    (filled, "░".repeat(rest))
}

/// `s` cut to `width` characters, with '…' marking the cut.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_fill_in_eighths() {
        assert_eq!(bar(0.0, 4), (String::new(), "░░░░".into()));
        assert_eq!(bar(1.5, 4), ("████".into(), String::new()));
        assert_eq!(bar(0.5, 4), ("██".into(), "░░".into()));
        assert_eq!(bar(0.5 + 1.0 / 32.0, 4), ("██▏".into(), "░".into()));
        let (f, e) = bar(0.37, 10);
        assert_eq!(f.chars().count() + e.chars().count(), 10);
    }

    #[test]
    fn fit_cuts_with_ellipsis() {
        assert_eq!(fit("NVIDIA H100", 20), "NVIDIA H100");
        assert_eq!(fit("NVIDIA H100 80GB HBM3", 8), "NVIDIA …");
    }
}
