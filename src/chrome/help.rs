//! The help overlay every screen opens with `?`: its key table's rows, generated from the
//! table so a rebinding shows.

use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::overlay::overlay;
use crate::keys::{Bindable, KeyMap};
use crate::theme::Theme;

pub fn render_help<A: Bindable>(f: &mut Frame, area: Rect, keys: &KeyMap<A>, theme: &Theme) {
    render_help_rows(f, area, keys.help_rows(), theme);
}

/// Width of the help's key column and the gap after it.
const HELP_KEY: usize = 10;

/// The help overlay of (key, what it does) rows: one column as wide as its longest row;
/// on a screen too narrow or short for that, descriptions wrap at word boundaries and
/// the rows go into two columns when one does not fit the height.
pub fn render_help_rows(f: &mut Frame, area: Rect, rows: Vec<(String, &'static str)>, theme: &Theme) {
    let widest = rows.iter().map(|(_, d)| d.chars().count()).max().unwrap_or(0);
    let room = (area.width as usize).saturating_sub(4);
    let one = help_lines(&rows, widest.min(room.saturating_sub(HELP_KEY + 2)).max(8), theme);
    let (w, lines) = if one.len() + 2 <= area.height as usize {
        ((widest + HELP_KEY + 2 + 4).max(40), one.into_iter().map(|(_, l)| l).collect::<Vec<_>>())
    } else {
        let col = room.saturating_sub(2) / 2;
        let all = help_lines(&rows, col.saturating_sub(HELP_KEY + 2).max(8), theme);
        // Split between rows, not inside a wrapped one.
        let half = all.len().div_ceil(2);
        let split = (half..all.len()).find(|&i| all[i].0).unwrap_or(all.len());
        let (left, right) = all.split_at(split);
        let lines = (0..left.len().max(right.len()))
            .map(|i| {
                let mut l = left.get(i).map(|p| p.1.clone()).unwrap_or_default();
                let pad = (col + 2).saturating_sub(l.width());
                l.spans.push(Span::raw(" ".repeat(pad)));
                l.spans.extend(right.get(i).map(|p| p.1.spans.clone()).unwrap_or_default());
                l
            })
            .collect();
        (room + 4, lines)
    };
    let (r, block) = overlay(f, area, w as u16, lines.len() as u16 + 2, " keys (? closes) ".into(), theme);
    f.render_widget(Paragraph::new(lines).block(block), r);
}

/// The help rows as lines with descriptions wrapped at `width` columns, each flagged
/// whether it begins a row.
fn help_lines(rows: &[(String, &'static str)], width: usize, theme: &Theme) -> Vec<(bool, Line<'static>)> {
    let key = Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD);
    let text = Style::default().fg(theme.ui.text);
    let mut out = Vec::new();
    for (k, d) in rows {
        for (i, part) in wrap_words(d, width).into_iter().enumerate() {
            let k = if i == 0 { k.as_str() } else { "" };
            out.push((i == 0, Line::from(vec![Span::styled(format!("{k:>HELP_KEY$}  "), key), Span::styled(part, text)])));
        }
    }
    out
}

/// `text` in lines of at most `width` characters, broken between words (a word longer
/// than a line is broken inside).
pub fn wrap_words(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines: Vec<String> = vec![String::new()];
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        let cur = lines.last().unwrap().chars().count();
        if cur > 0 && cur + 1 + word.len() > width {
            lines.push(String::new());
        } else if cur > 0 {
            lines.last_mut().unwrap().push(' ');
        }
        while word.len() > width {
            let rest = word.split_off(width);
            lines.last_mut().unwrap().extend(word);
            lines.push(String::new());
            word = rest;
        }
        lines.last_mut().unwrap().extend(word);
    }
    lines
}
