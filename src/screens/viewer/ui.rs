//! What the viewer's keys change: tab, window, cursor, selection, panels; and what each
//! key does.

use crossterm::event::KeyCode;

use vramscope_core::report::breakdown::has_categories;

use super::data::{Analysis, ViewerData};
use super::keys::ViewerKey;
/// Lines the inspector scrolls per key press.
const INSPECTOR_SCROLL: usize = 5;
/// Narrowest zoom, in timeline actions.
const MIN_WINDOW: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    Timeline,
    Largest,
    Segments,
    Categories,
}

impl Tab {
    pub const ALL: [Tab; 4] = [Tab::Timeline, Tab::Largest, Tab::Segments, Tab::Categories];
    pub fn title(self) -> &'static str {
        match self {
            Tab::Timeline => "timeline",
            Tab::Largest => "largest",
            Tab::Segments => "segments",
            Tab::Categories => "categories",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    Size,
    Start,
    Lifetime,
}

impl SortBy {
    pub fn name(self) -> &'static str {
        match self {
            SortBy::Size => "size",
            SortBy::Start => "allocation order",
            SortBy::Lifetime => "lifetime",
        }
    }
}

/// A report drawn over the views.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    Oom,
    WhatIf,
}

/// What the keys change.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewerUi {
    pub tab: Tab,
    /// Visible timeline actions [from, to).
    pub from: usize,
    pub to: usize,
    /// Timeline action under the cursor.
    pub cursor: usize,
    /// Selected band at the cursor, counted from the top drawn band.
    pub band: usize,
    pub inspector: bool,
    /// Inspector lines scrolled past, and the most there are to scroll (as last drawn).
    pub inspector_scroll: usize,
    pub inspector_overflow: usize,
    /// Timeline bands in their category's colour (else each allocation its own); only
    /// when the file names categories.
    pub by_category: bool,
    pub all_frames: bool,
    pub sort: SortBy,
    /// Largest list: the applied filter, and the text being typed when searching.
    pub filter: String,
    pub typing: Option<String>,
    /// Largest list: the selected row and the list it indexes (filtered, sorted).
    pub row: usize,
    pub rows: Vec<u32>,
    pub help: bool,
    pub panel: Option<Panel>,
    pub theme: usize,
    /// Width of the timeline plot in columns, as last drawn.
    pub columns: usize,
}

impl ViewerUi {
    pub fn new(data: &ViewerData) -> ViewerUi {
        let mut ui = ViewerUi {
            tab: Tab::Timeline,
            from: 0,
            to: data.tl.total_events,
            cursor: data.tl.peak_index,
            band: 0,
            inspector: false,
            inspector_scroll: 0,
            inspector_overflow: 0,
            by_category: has_categories(&data.tl),
            all_frames: false,
            sort: SortBy::Size,
            filter: String::new(),
            typing: None,
            row: 0,
            rows: Vec::new(),
            help: false,
            panel: None,
            theme: 0,
            columns: 100,
        };
        if data.tl.total_events == 0 {
            ui.cursor = 0;
        }
        ui
    }

    /// The allocation the inspector shows: the selected band (timeline) or row (list).
    pub fn selected(&self, data: &ViewerData) -> Option<u32> {
        match self.tab {
            Tab::Largest => self.rows.get(self.row).copied(),
            _ => {
                let col = data.stack_at_cursor(self.cursor);
                let n = col.bands.len();
                (n > 0).then(|| col.bands[n - 1 - self.band.min(n - 1)].alloc)
            }
        }
    }

    /// Refills the largest list from the filter and sort order.
    pub fn refresh_rows(&mut self, data: &ViewerData) {
        let tl = &data.tl;
        let needle = self.filter.to_lowercase();
        let matches_stack: Vec<bool> = if needle.is_empty() {
            Vec::new()
        } else {
            data.snap
                .stacks
                .iter()
                .map(|s| {
                    s.iter().any(|f| {
                        let f = &data.snap.frames[*f as usize];
                        f.name.to_lowercase().contains(&needle) || f.filename.to_lowercase().contains(&needle)
                    })
                })
                .collect()
        };
        let hex = needle.trim_start_matches("0x");
        let keep = |id: &u32| {
            let a = &tl.allocations[*id as usize];
            needle.is_empty()
                || matches_stack.get(a.stack as usize).copied().unwrap_or(false)
                || (!hex.is_empty() && format!("{:x}", a.addr).contains(hex))
        };
        let largest = data.largest().ready().map_or(&[][..], Vec::as_slice);
        let mut rows: Vec<u32> = largest.iter().copied().filter(keep).collect();
        let life = |id: u32| {
            let a = &tl.allocations[id as usize];
            let start = if a.alive_at_start { 0 } else { a.start };
            a.end.unwrap_or(tl.total_events) - start
        };
        match self.sort {
            SortBy::Size => {}
            SortBy::Start => rows.sort_by_key(|&id| {
                let a = &tl.allocations[id as usize];
                (!a.alive_at_start, a.start, id)
            }),
            SortBy::Lifetime => rows.sort_by_key(|&id| (std::cmp::Reverse(life(id)), id)),
        }
        self.rows = rows;
        self.row = self.row.min(self.rows.len().saturating_sub(1));
    }

    fn step(&self) -> usize {
        ((self.to - self.from) / self.columns.max(1)).max(1)
    }

    fn zoom(&mut self, total: usize, width: usize) {
        let width = width.clamp(MIN_WINDOW.min(total), total.max(1));
        let from = self.cursor.saturating_sub(width / 2).min(total.saturating_sub(width));
        self.from = from;
        self.to = (from + width).min(total);
    }

    fn move_cursor(&mut self, back: bool, total: usize) {
        if total == 0 {
            return;
        }
        let step = self.step();
        self.cursor = if back { self.cursor.saturating_sub(step) } else { (self.cursor + step).min(total - 1) };
        // Past an edge, the window follows the cursor.
        let width = self.to - self.from;
        if self.cursor < self.from {
            self.from = self.cursor;
            self.to = self.from + width;
        } else if self.cursor >= self.to {
            self.to = (self.cursor + 1).min(total);
            self.from = self.to - width;
        }
    }
}

/// What a key does to the UI (and the detail level or device of the data).
pub fn handle(a: ViewerKey, data: &mut ViewerData, ui: &mut ViewerUi, theme_count: usize) {
    let total = data.tl.total_events;
    // Another allocation, or its frames shown another way, is read from its top.
    if !matches!(a, ViewerKey::InspectorUp | ViewerKey::InspectorDown | ViewerKey::Help | ViewerKey::NextTheme) {
        ui.inspector_scroll = 0;
    }
    match a {
        ViewerKey::NextTab => {
            let i = Tab::ALL.iter().position(|t| *t == ui.tab).unwrap_or(0);
            ui.tab = Tab::ALL[(i + 1) % Tab::ALL.len()];
            ask_for_tab(ui.tab, data);
        }
        ViewerKey::CursorLeft => ui.move_cursor(true, total),
        ViewerKey::CursorRight => ui.move_cursor(false, total),
        ViewerKey::SelectUp => match ui.tab {
            Tab::Largest => ui.row = ui.row.saturating_sub(1),
            _ => ui.band = ui.band.saturating_sub(1),
        },
        ViewerKey::SelectDown => match ui.tab {
            Tab::Largest => ui.row = (ui.row + 1).min(ui.rows.len().saturating_sub(1)),
            _ => ui.band = (ui.band + 1).min(data.stack_at_cursor(ui.cursor).bands.len().saturating_sub(1)),
        },
        ViewerKey::ZoomIn => ui.zoom(total, (ui.to - ui.from) / 2),
        ViewerKey::ZoomOut => ui.zoom(total, (ui.to - ui.from) * 2),
        ViewerKey::DetailLess => data.set_detail_step(data.detail_step.saturating_sub(1)),
        ViewerKey::DetailMore => data.set_detail_step(data.detail_step + 1),
        ViewerKey::JumpToPeak => {
            ui.cursor = data.tl.peak_index;
            if !(ui.from..ui.to).contains(&ui.cursor) {
                ui.zoom(total, ui.to - ui.from);
            }
            ui.band = 0;
        }
        ViewerKey::Inspect => ui.inspector = !ui.inspector,
        ViewerKey::InspectorUp => ui.inspector_scroll = ui.inspector_scroll.min(ui.inspector_overflow).saturating_sub(INSPECTOR_SCROLL),
        ViewerKey::InspectorDown => ui.inspector_scroll = (ui.inspector_scroll + INSPECTOR_SCROLL).min(ui.inspector_overflow),
        ViewerKey::ColourBy => ui.by_category = !ui.by_category && has_categories(&data.tl),
        ViewerKey::AllFrames => ui.all_frames = !ui.all_frames,
        ViewerKey::Sort => {
            ui.sort = match ui.sort {
                SortBy::Size => SortBy::Start,
                SortBy::Start => SortBy::Lifetime,
                SortBy::Lifetime => SortBy::Size,
            };
            ui.refresh_rows(data);
        }
        ViewerKey::Search => {
            ui.tab = Tab::Largest;
            ask_for_tab(ui.tab, data);
            ui.typing = Some(ui.filter.clone());
        }
        ViewerKey::NextDevice => {
            let devices = data.snap.device_count();
            let device = (data.device + 1) % devices;
            if device != data.device {
                *data = ViewerData::new(std::mem::take(&mut data.name), std::sync::Arc::clone(&data.snap), device);
                *ui = ViewerUi { theme: ui.theme, columns: ui.columns, ..ViewerUi::new(data) };
            }
        }
        ViewerKey::OomReport => {
            ui.panel = (ui.panel != Some(Panel::Oom)).then_some(Panel::Oom);
            data.ask(Analysis::OomReports);
            // The cursor goes to the (first) OOM, where the timeline marks it.
            if let (Some(_), Some(&(_, action))) = (ui.panel, data.ooms().first()) {
                ui.cursor = action.min(total.saturating_sub(1));
                if !(ui.from..ui.to).contains(&ui.cursor) {
                    ui.zoom(total, ui.to - ui.from);
                }
            }
        }
        ViewerKey::WhatIf => {
            ui.panel = (ui.panel != Some(Panel::WhatIf)).then_some(Panel::WhatIf);
            data.ask(Analysis::WhatIf);
        }
        ViewerKey::NextTheme => ui.theme = (ui.theme + 1) % theme_count.max(1),
        ViewerKey::Help => ui.help = !ui.help,
        // The viewer's loop acts on these: they leave this file for another.
        ViewerKey::Quit | ViewerKey::NextRank | ViewerKey::NextWindow => {}
    }
    if ui.tab != Tab::Largest {
        let bands = data.stack_at_cursor(ui.cursor).bands.len();
        ui.band = ui.band.min(bands.saturating_sub(1));
    }
}

/// The analysis a tab draws, started when the tab is first shown.
fn ask_for_tab(tab: Tab, data: &mut ViewerData) {
    match tab {
        Tab::Largest => data.ask(Analysis::Largest),
        Tab::Categories => data.ask(Analysis::Breakdown),
        Tab::Timeline | Tab::Segments => {}
    }
}

/// Takes the workers' finished analyses into the screen: the largest list fills once its
/// sort lands. True when anything landed (the screen redraws).
pub fn landed(data: &mut ViewerData, ui: &mut ViewerUi) -> bool {
    let any = data.poll();
    if any {
        ui.refresh_rows(data);
    }
    any
}

/// `landed`, after waiting for every analysis asked for (tests and benchmarks draw the
/// screen a user sees once the "computing…" is gone).
pub fn settle(data: &mut ViewerData, ui: &mut ViewerUi) {
    data.wait();
    ui.refresh_rows(data);
}

/// A key typed into the search line: enter applies the filter, esc drops the edit.
pub fn type_search(code: KeyCode, data: &ViewerData, ui: &mut ViewerUi) {
    let Some(text) = ui.typing.as_mut() else { return };
    match code {
        KeyCode::Char(c) => text.push(c),
        KeyCode::Backspace => {
            text.pop();
        }
        KeyCode::Enter => {
            ui.filter = ui.typing.take().unwrap_or_default();
            ui.row = 0;
            ui.refresh_rows(data);
        }
        KeyCode::Esc => ui.typing = None,
        _ => {}
    }
}
