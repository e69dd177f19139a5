//! A line of " · "-separated fields that fits its width the way a reader wants: the least
//! important field gives way first, first to a shorter wording if it has one, then whole.
//! A number is never cut in half, and what matters most (an out-of-memory) is the last to go.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

/// How much a field matters: `Least` goes first, `Must` last (and is only ever cut with '…'
/// when it alone is wider than the line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Keep {
    Least,
    Low,
    Mid,
    High,
    Must,
}

/// One field: its wordings, longest first, each with how much the words it drops matter.
#[derive(Clone, Debug)]
pub struct Field {
    keep: Keep,
    wordings: Vec<(Keep, Vec<Span<'static>>)>,
}

impl Field {
    pub fn new(keep: Keep, spans: Vec<Span<'static>>) -> Field {
        Field { keep, wordings: vec![(keep, spans)] }
    }

    /// A field of one span.
    pub fn text(keep: Keep, text: impl Into<String>, style: Style) -> Field {
        Field::new(keep, vec![Span::styled(text.into(), style)])
    }

    /// A shorter wording, taken when what it leaves out matters as much as `lost` does
    /// (a field's "vramscope " prefix matters less than the name after it).
    pub fn or_losing(mut self, lost: Keep, spans: Vec<Span<'static>>) -> Field {
        self.wordings.push((lost, spans));
        self
    }

    /// A shorter wording to take before the field is dropped.
    pub fn or(self, spans: Vec<Span<'static>>) -> Field {
        let keep = self.keep;
        self.or_losing(keep, spans)
    }

    /// A shorter wording of one span, in the first wording's first style.
    pub fn or_text(self, text: impl Into<String>) -> Field {
        let keep = self.keep;
        self.or_text_losing(keep, text)
    }

    /// `or_text`, losing words that matter as much as `lost` does.
    pub fn or_text_losing(self, lost: Keep, text: impl Into<String>) -> Field {
        let style = self.wordings[0].1.first().map_or_else(Style::default, |s| s.style);
        self.or_losing(lost, vec![Span::styled(text.into(), style)])
    }

    /// What the field loses next: its next wording's words, or itself.
    fn next_loss(&self, at: usize) -> Keep {
        self.wordings.get(at + 1).map_or(self.keep, |w| w.0)
    }
}

fn width(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.content.chars().count()).sum()
}

/// The fields, in their order, joined by `sep`, within `max` cells.
pub fn fit_line(fields: Vec<Field>, max: usize, sep: Span<'static>) -> Line<'static> {
    let sep_w = sep.content.chars().count();
    // (field, wording in use); dropped fields leave the list.
    let mut shown: Vec<(Field, usize)> = fields.into_iter().filter(|f| width(&f.wordings[0].1) > 0).map(|f| (f, 0)).collect();
    let total = |shown: &[(Field, usize)]| shown.iter().map(|(f, w)| width(&f.wordings[*w].1)).sum::<usize>() + sep_w * shown.len().saturating_sub(1);
    while total(&shown) > max && shown.len() > 1 {
        // What matters least gives way; among equals, the field furthest right.
        let (i, _) = shown.iter().enumerate().min_by_key(|(i, (f, w))| (f.next_loss(*w), std::cmp::Reverse(*i))).expect("more than one field");
        let (f, w) = &mut shown[i];
        if *w + 1 < f.wordings.len() {
            *w += 1;
        } else {
            shown.remove(i);
        }
    }
    let mut spans = Vec::new();
    for (n, (f, w)) in shown.into_iter().enumerate() {
        if n > 0 {
            spans.push(sep.clone());
        }
        spans.extend(f.wordings.into_iter().nth(w).expect("a wording in range").1);
    }
    // One field alone wider than the line: its shortest wording, cut.
    if width(&spans) > max {
        let mut left = max;
        for s in &mut spans {
            let n = s.content.chars().count();
            if n > left {
                s.content = crate::draw::text::fit(&s.content, left).into();
                left = 0;
            } else {
                left -= n;
            }
        }
        spans.retain(|s| !s.content.is_empty());
    }
    Line::from(spans)
}

/// A table's column: its heading, the cells it needs, and how much it matters.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub heading: &'static str,
    pub width: u16,
    pub keep: Keep,
}

impl Column {
    pub fn new(heading: &'static str, width: u16, keep: Keep) -> Column {
        Column { heading, width, keep }
    }

    /// Its width: the cells asked for, and never less than its heading.
    pub fn cells(&self) -> u16 {
        self.width.max(self.heading.chars().count() as u16)
    }
}

/// Which of `columns` fit in `available` cells with one between each: the least important
/// go first (among equals, the rightmost), and `Must` columns stay.
pub fn keep_columns(columns: &[Column], available: u16) -> Vec<bool> {
    let mut kept = vec![true; columns.len()];
    let used = |kept: &[bool]| columns.iter().zip(kept).filter(|(_, k)| **k).map(|(c, _)| c.cells() + 1).sum::<u16>().saturating_sub(1);
    while used(&kept) > available {
        let drop = columns.iter().enumerate().filter(|(i, c)| kept[*i] && c.keep < Keep::Must).min_by_key(|(i, c)| (c.keep, std::cmp::Reverse(*i)));
        match drop {
            Some((i, _)) => kept[i] = false,
            None => break,
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(l: &Line) -> String {
        l.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    fn line(max: usize) -> String {
        let s = Style::default();
        let fields = vec![
            Field::new(Keep::High, vec![Span::raw("vramscope view "), Span::raw("model.pickle")]).or_losing(Keep::Least, vec![Span::raw("model.pickle")]),
            Field::text(Keep::Low, "400 segments, 9000 blocks", s).or_text("400 segments"),
            Field::text(Keep::Mid, "device 0 of 4", s),
            Field::text(Keep::Must, "OUT OF MEMORY at action 287", s),
        ];
        plain(&fit_line(fields, max, Span::raw(" · ")))
    }

    #[test]
    fn narrow_tables_lose_their_least_important_columns() {
        let cols = [Column::new("address", 14, Keep::Mid), Column::new("reserved", 9, Keep::Must), Column::new("largest free", 9, Keep::Low), Column::new("pool", 6, Keep::Low)];
        assert_eq!(cols[2].cells(), 12, "a column is at least its heading");
        assert_eq!(keep_columns(&cols, 80), [true, true, true, true]);
        assert_eq!(keep_columns(&cols, 37), [true, true, true, false]);
        assert_eq!(keep_columns(&cols, 24), [true, true, false, false]);
        assert_eq!(keep_columns(&cols, 5), [false, true, false, false], "a Must column stays");
    }

    #[test]
    fn the_least_important_shortens_then_goes_and_the_oom_stays() {
        assert_eq!(line(200), "vramscope view model.pickle · 400 segments, 9000 blocks · device 0 of 4 · OUT OF MEMORY at action 287");
        assert_eq!(line(80), "model.pickle · 400 segments · device 0 of 4 · OUT OF MEMORY at action 287");
        assert_eq!(line(60), "model.pickle · device 0 of 4 · OUT OF MEMORY at action 287");
        assert_eq!(line(45), "model.pickle · OUT OF MEMORY at action 287");
        assert_eq!(line(30), "OUT OF MEMORY at action 287");
        assert_eq!(line(10), "OUT OF ME…");
    }
}
