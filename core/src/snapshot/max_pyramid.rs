//! The timeline's stacked totals: the highest of any range of them found in a few reads
//! while they are still being appended.

const FANOUT: usize = 16;

/// Range-max over an append-only array: each level holds the maxima of FANOUT-wide groups
/// of the level below, so a range costs at most 2·FANOUT reads per level.
#[derive(Clone, Debug, Default)]
pub(crate) struct MaxPyramid {
    levels: Vec<Vec<i64>>,
}

impl MaxPyramid {
    pub(crate) fn len(&self) -> usize {
        self.levels.first().map_or(0, Vec::len)
    }

    pub(crate) fn get(&self, i: usize) -> i64 {
        self.levels[0][i]
    }

    /// The stacked totals' list, for faulting in ahead of its writer.
    pub(crate) fn span(&self) -> super::pages::Span {
        self.levels.first().map_or(super::pages::Span { room: 0..0, filled: 0 }, super::pages::Span::of)
    }

    pub(crate) fn reserve(&mut self, n: usize) {
        if self.levels.is_empty() {
            self.levels.push(Vec::new());
        }
        self.levels[0].reserve(n);
    }

    #[inline]
    pub(crate) fn push(&mut self, v: i64) {
        if self.levels.is_empty() {
            self.levels.push(Vec::new());
        }
        let mut idx = self.levels[0].len();
        self.levels[0].push(v);
        let mut lvl = 0;
        while self.levels[lvl].len() > 1 {
            if lvl + 1 == self.levels.len() {
                let first = self.levels[lvl][..FANOUT.min(self.levels[lvl].len())]
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(0);
                self.levels.push(vec![first]);
                break;
            }
            idx /= FANOUT;
            let up = &mut self.levels[lvl + 1];
            if idx == up.len() {
                up.push(v);
            } else if up[idx] < v {
                up[idx] = v;
            } else {
                break;
            }
            lvl += 1;
        }
    }

    /// (max, the first index holding it) over `a..b`; None when empty.
    pub(crate) fn range_max(&self, mut a: usize, mut b: usize) -> Option<(i64, usize)> {
        // (value, level, index, first leaf): ties go to the leftmost.
        let mut best: Option<(i64, usize, usize, usize)> = None;
        let mut consider = |v: i64, lvl: usize, i: usize| {
            let leaf = i * FANOUT.pow(lvl as u32);
            if best.is_none_or(|(bv, _, _, bl)| v > bv || (v == bv && leaf < bl)) {
                best = Some((v, lvl, i, leaf));
            }
        };
        let mut lvl = 0;
        while a < b {
            let level = &self.levels[lvl];
            while a < b && !a.is_multiple_of(FANOUT) {
                consider(level[a], lvl, a);
                a += 1;
            }
            while a < b && !b.is_multiple_of(FANOUT) {
                b -= 1;
                consider(level[b], lvl, b);
            }
            if a < b {
                a /= FANOUT;
                b /= FANOUT;
                lvl += 1;
            }
        }
        let (v, mut lvl, mut i, _) = best?;
        while lvl > 0 {
            lvl -= 1;
            let level = &self.levels[lvl];
            let lo = i * FANOUT;
            i = (lo..(lo + FANOUT).min(level.len()))
                .find(|&c| level[c] == v)
                .unwrap_or(lo);
        }
        Some((v, i))
    }
}
