//! A byte axis with round ticks (50 MiB, 100 MiB, 150 MiB; 0.25 GiB, 0.5 GiB…) that fall
//! exactly on row boundaries of a character-cell chart.

const KIB: u64 = 1024;
const UNITS: [(u64, &str); 4] = [(KIB, "KiB"), (KIB * KIB, "MiB"), (KIB * KIB * KIB, "GiB"), (KIB * KIB * KIB * KIB, "TiB")];
/// Tick steps per unit, as (numerator, denominator): a quarter, a half, 1-2-5 after.
const STEPS: [(u64, u64); 11] = [(1, 4), (1, 2), (1, 1), (2, 1), (5, 1), (10, 1), (20, 1), (50, 1), (100, 1), (200, 1), (500, 1)];
/// The smallest top a chart shows, so an empty chart still has a scale.
const MIN_TOP: u64 = 1 << 20;

/// How bytes map to the rows of a chart: `rows_per_tick` rows per `step` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteAxis {
    /// Bytes between ticks.
    pub step: u64,
    pub rows_per_tick: u64,
    /// The unit tick labels are written in.
    unit: (u64, &'static str),
}

impl ByteAxis {
    /// The round step that reaches `top` in the fewest bytes per row (the tallest chart),
    /// with two ticks or more (not many more than six), at least two rows apart; of equals,
    /// the coarser.
    pub fn fit(top: u64, rows: u64) -> ByteAxis {
        let top = top.max(MIN_TOP);
        let rows = rows.max(1);
        // Steps of 200 and 500 only in the largest unit: below it, a quarter of the next
        // unit reads rounder ("0.25 GiB, 0.5 GiB" rather than "500 MiB, 1000 MiB").
        let largest = UNITS[UNITS.len() - 1].0;
        let mut candidates: Vec<(u64, (u64, &'static str))> = UNITS
            .iter()
            .flat_map(|u| STEPS.iter().filter(move |(n, _)| *n < 200 || u.0 == largest).map(move |(n, d)| (u.0 * n / d, *u)))
            .filter(|(step, _)| *step >= KIB)
            .collect();
        candidates.sort_by_key(|c| c.0);
        let ticks = |step: u64| top.div_ceil(step);
        let most = 6.max(rows / 6);
        let axis = |(step, unit): (u64, (u64, &'static str))| ByteAxis { step, rows_per_tick: (rows / ticks(step)).max(1), unit };
        candidates
            .iter()
            .copied()
            .filter(|(step, _)| (2..=most).contains(&ticks(*step)) && ticks(*step) * 2 <= rows)
            .map(axis)
            // Bytes per row is step / rows_per_tick: compare without dividing.
            .min_by(|a, b| (u128::from(a.step) * u128::from(b.rows_per_tick)).cmp(&(u128::from(b.step) * u128::from(a.rows_per_tick))).then(b.step.cmp(&a.step)))
            .or_else(|| candidates.iter().copied().find(|(step, _)| ticks(*step) <= rows).map(axis))
            .unwrap_or_else(|| axis(*candidates.last().expect("steps")))
    }

    /// `b` bytes in eighths of a row.
    pub fn eighths(&self, b: u64) -> u64 {
        (u128::from(b) * 8 * u128::from(self.rows_per_tick) / u128::from(self.step)) as u64
    }

    /// Bytes at the top of `rows` rows.
    pub fn top(&self, rows: u64) -> u64 {
        (u128::from(self.step) * u128::from(rows) / u128::from(self.rows_per_tick)) as u64
    }

    /// (row counted from the bottom, label) of each tick within `rows` rows: a tick's label
    /// sits in the row just below the boundary it marks; "0" in the bottom row.
    pub fn ticks(&self, rows: u64) -> Vec<(u64, String)> {
        let mut out = vec![(0, "0".to_string())];
        let mut k = 1;
        while k * self.rows_per_tick <= rows {
            out.push((k * self.rows_per_tick - 1, self.label(k * self.step)));
            k += 1;
        }
        out
    }

    /// "150 MiB", "0.75 GiB", "1 GiB".
    pub fn label(&self, b: u64) -> String {
        let v = b as f64 / self.unit.0 as f64;
        let text = format!("{v:.2}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        format!("{text} {}", self.unit.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn ticks_are_round_and_fall_on_rows() {
        let a = ByteAxis::fit(132 * MIB, 10);
        assert_eq!((a.step, a.rows_per_tick), (50 * MIB, 3));
        assert_eq!(a.ticks(10), vec![(0, "0".into()), (2, "50 MiB".into()), (5, "100 MiB".into()), (8, "150 MiB".into())]);
        assert!(a.top(10) >= 132 * MIB);
        // A tick boundary is exactly a whole number of rows.
        assert_eq!(a.eighths(50 * MIB), 8 * 3);
        let g = ByteAxis::fit(1100 * MIB, 10);
        assert_eq!(g.step, 256 * MIB);
        assert_eq!(g.label(3 * g.step), "0.75 GiB");
        assert_eq!(g.label(4 * g.step), "1 GiB");
        let big = ByteAxis::fit(70 << 30, 20);
        assert_eq!(big.step, 20 << 30, "no more than six ticks");
        assert_eq!(ByteAxis::fit(0, 10).label(MIB / 2), "0.5 MiB");
    }

    #[test]
    fn labels_fit_the_axis_and_few_rows_still_get_a_scale() {
        for top in [1, 3 * MIB, 99 * MIB, 900 * MIB, 5 << 30, 123 << 30, 3 << 40] {
            for rows in [1, 2, 4, 7, 10, 30, 60] {
                let a = ByteAxis::fit(top, rows);
                assert!(a.top(rows) >= top, "top {top} rows {rows}: {a:?}");
                for (row, label) in a.ticks(rows) {
                    assert!(row < rows);
                    assert!(label.chars().count() <= 8, "{label}");
                }
            }
        }
    }
}
