//! `vramscope view FILE`: a snapshot in the terminal. The loaded data (snapshot, timeline,
//! lazily computed analyses), the UI state the keys change, and the loop that owns the
//! terminal.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind};

use crate::app::snapshot_loading::{spawn_loader, LoadUpdate, Loading};
use crate::app::terminal::TerminalSession;
use crate::app::keys::{KeyMap, ViewerKey};
use crate::render::snapshot_viewer::{inspector_overflow, plot_columns, render_loading, render_viewer};
use crate::render::theme::Theme;
use vramscope_core::report::oom::{oom_marks, oom_reports, OomReport};
use vramscope_core::report::whatif::{default_configs, recorded_config, whatif, Whatif};
use vramscope_core::report::snapshot_summary::{
    annotation_marks, breakdown_at_peak, has_categories, largest_ids, reserved_figures, segment_stats,
    AnnotationMark, Breakdown, SegmentStats, SegmentTotals,
};
use vramscope_core::snapshot::model::Snapshot;
use vramscope_core::snapshot::timeline::{DetailView, StackColumn, Timeline};

#[derive(clap::Args, Clone, Debug)]
pub struct ViewArgs {
    /// A snapshot pickle (vramscope's or torch.cuda.memory._dump_snapshot's).
    pub file: PathBuf,
    /// Print a report instead of opening the viewer.
    #[arg(long)]
    pub summary: bool,
    /// With --summary: the report as JSON.
    #[arg(long, requires = "summary")]
    pub json: bool,
    /// Device whose trace to show (default: the first one with trace entries).
    #[arg(long)]
    pub device: Option<usize>,
    /// With --summary: how many of the largest allocations to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Colour theme: dark, light, ansi16, or a theme file's path.
    #[arg(long, default_value = "dark")]
    pub theme: String,
    /// A TOML file whose [keys] table overrides the viewer's key bindings.
    #[arg(long)]
    pub keys: Option<PathBuf>,
    /// Milliseconds a file may take to load before the loading screen is drawn (tests
    /// set 0 to see it on small files).
    #[arg(long, default_value_t = 150, hide = true)]
    pub loading_screen_after: u64,
}

/// Share of allocations drawn one by one, in percent, for the detail control.
pub const DETAIL_STEPS: [f64; 9] = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0];
/// memory_viz draws this many allocations one by one by default.
const DEFAULT_DRAWN: usize = 15_000;
/// Lines the inspector scrolls per key press.
const INSPECTOR_SCROLL: usize = 5;
/// Narrowest zoom, in timeline actions.
const MIN_WINDOW: usize = 16;

/// The snapshot, one device's timeline, and what the panels compute from them on demand.
pub struct ViewerData {
    pub name: String,
    pub snap: Snapshot,
    pub device: usize,
    pub tl: Timeline,
    pub detail: DetailView,
    pub detail_step: usize,
    largest: OnceCell<Vec<u32>>,
    segments: OnceCell<(Vec<SegmentStats>, SegmentTotals)>,
    breakdown: OnceCell<Breakdown>,
    marks: OnceCell<Vec<AnnotationMark>>,
    /// (peak, final) reserved bytes.
    reserved: (u64, u64),
    /// Warnings and notes about the file the header shows: figures that contradict each
    /// other, what the reader left out.
    notes: Vec<String>,
    ooms: OnceCell<Vec<(usize, usize)>>,
    oom_reports: OnceCell<Vec<OomReport>>,
    whatif: OnceCell<Whatif>,
}

pub fn drawn_count(step: usize, allocations: usize) -> usize {
    ((allocations as f64 * DETAIL_STEPS[step] / 100.0).ceil() as usize).min(allocations)
}

/// The finest detail step drawing at most as many allocations as memory_viz does.
pub fn default_detail_step(allocations: usize) -> usize {
    (0..DETAIL_STEPS.len()).rev().find(|&s| drawn_count(s, allocations) <= DEFAULT_DRAWN).unwrap_or(0)
}

impl ViewerData {
    /// Everything the first frame needs: the timeline of `device` and its detail view.
    pub fn new(name: String, snap: Snapshot, device: usize) -> ViewerData {
        let tl = Timeline::from_snapshot(&snap, device);
        ViewerData::with_timeline(name, snap, device, tl)
    }

    /// `new` with the timeline already built (`Timeline::from_snapshot` or its equal).
    pub fn with_timeline(name: String, snap: Snapshot, device: usize, tl: Timeline) -> ViewerData {
        let n = tl.allocations.len();
        let detail_step = default_detail_step(n);
        let detail = tl.detail(drawn_count(detail_step, n));
        let reserved = reserved_figures(&snap, &tl, device);
        let conflict = reserved.conflict.map(|c| format!("warning: {}", c.describe()));
        let notes = conflict.into_iter().chain(snap.skipped.describe().map(|s| format!("not read: {s}"))).collect();
        ViewerData {
            name,
            snap,
            device,
            tl,
            detail,
            detail_step,
            largest: OnceCell::new(),
            segments: OnceCell::new(),
            breakdown: OnceCell::new(),
            marks: OnceCell::new(),
            reserved: (reserved.peak, reserved.last),
            notes,
            ooms: OnceCell::new(),
            oom_reports: OnceCell::new(),
            whatif: OnceCell::new(),
        }
    }

    /// Warnings first, then notes; each one line for the header.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Reads `path` and shows `device`, or by default the first with trace entries.
    pub fn open(path: &Path, device: Option<usize>) -> anyhow::Result<ViewerData> {
        let (snap, device) = vramscope_core::snapshot::read_device(path, device)?;
        Ok(ViewerData::new(vramscope_core::input::title(path), snap, device))
    }

    pub fn drawn(&self) -> usize {
        self.detail.drawn.len()
    }

    pub fn set_detail_step(&mut self, step: usize) {
        self.detail_step = step.min(DETAIL_STEPS.len() - 1);
        self.detail = self.tl.detail(drawn_count(self.detail_step, self.tl.allocations.len()));
    }

    pub fn largest(&self) -> &[u32] {
        self.largest.get_or_init(|| largest_ids(&self.tl))
    }

    pub fn segments(&self) -> &(Vec<SegmentStats>, SegmentTotals) {
        self.segments.get_or_init(|| segment_stats(self.snap.device_segments(self.device)))
    }

    pub fn breakdown(&self) -> &Breakdown {
        self.breakdown.get_or_init(|| breakdown_at_peak(&self.snap, &self.tl, has_categories(&self.tl)))
    }

    pub fn marks(&self) -> &[AnnotationMark] {
        self.marks.get_or_init(|| annotation_marks(&self.snap, &self.tl, self.device))
    }

    /// (peak, final) reserved bytes.
    pub fn reserved(&self) -> (u64, u64) {
        self.reserved
    }

    /// (trace position, timeline action after it) of each `oom` entry on the device.
    pub fn ooms(&self) -> &[(usize, usize)] {
        self.ooms.get_or_init(|| oom_marks(&self.snap, &self.tl, self.device))
    }

    /// The OOM reports (a replay of the trace up to the last OOM: computed when asked).
    pub fn oom_reports(&self) -> &[OomReport] {
        self.oom_reports.get_or_init(|| oom_reports(&self.snap, &self.tl, self.device))
    }

    /// The default what-if rows for this device (a replay per row: computed when asked).
    pub fn whatif(&self) -> &Whatif {
        self.whatif.get_or_init(|| whatif(&self.snap, self.device, &default_configs(&recorded_config(&self.snap))))
    }

    pub fn stack_at_cursor(&self, ui: &ViewerUi) -> StackColumn {
        self.tl.stack_at(&self.detail, ui.cursor.min(self.tl.total_events.saturating_sub(1)))
    }
}

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
                let col = data.stack_at_cursor(self);
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
        let mut rows: Vec<u32> = data.largest().iter().copied().filter(keep).collect();
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
            if ui.tab == Tab::Largest && ui.rows.is_empty() {
                ui.refresh_rows(data);
            }
        }
        ViewerKey::CursorLeft => ui.move_cursor(true, total),
        ViewerKey::CursorRight => ui.move_cursor(false, total),
        ViewerKey::SelectUp => match ui.tab {
            Tab::Largest => ui.row = ui.row.saturating_sub(1),
            _ => ui.band = ui.band.saturating_sub(1),
        },
        ViewerKey::SelectDown => match ui.tab {
            Tab::Largest => ui.row = (ui.row + 1).min(ui.rows.len().saturating_sub(1)),
            _ => ui.band = (ui.band + 1).min(data.stack_at_cursor(ui).bands.len().saturating_sub(1)),
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
            ui.typing = Some(ui.filter.clone());
        }
        ViewerKey::NextDevice => {
            let devices = data.snap.device_count();
            let device = (data.device + 1) % devices;
            if device != data.device {
                let snap = std::mem::take(&mut data.snap);
                *data = ViewerData::new(std::mem::take(&mut data.name), snap, device);
                *ui = ViewerUi { theme: ui.theme, columns: ui.columns, ..ViewerUi::new(data) };
            }
        }
        ViewerKey::OomReport => {
            ui.panel = (ui.panel != Some(Panel::Oom)).then_some(Panel::Oom);
            // The cursor goes to the (first) OOM, where the timeline marks it.
            if let (Some(_), Some(&(_, action))) = (ui.panel, data.ooms().first()) {
                ui.cursor = action.min(total.saturating_sub(1));
                if !(ui.from..ui.to).contains(&ui.cursor) {
                    ui.zoom(total, ui.to - ui.from);
                }
            }
        }
        ViewerKey::WhatIf => ui.panel = (ui.panel != Some(Panel::WhatIf)).then_some(Panel::WhatIf),
        ViewerKey::NextTheme => ui.theme = (ui.theme + 1) % theme_count.max(1),
        ViewerKey::Help => ui.help = !ui.help,
        ViewerKey::Quit => {}
    }
    if ui.tab != Tab::Largest {
        let bands = data.stack_at_cursor(ui).bands.len();
        ui.band = ui.band.min(bands.saturating_sub(1));
    }
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

/// `view --summary`: the report of `args.file`'s device on stdout.
fn print_summary(args: &ViewArgs) -> anyhow::Result<()> {
    let path = &args.file;
    let (snap, device) = vramscope_core::snapshot::read_device(path, args.device)?;
    let tl = Timeline::from_snapshot(&snap, device);
    let summary = vramscope_core::report::snapshot_summary::summarize(&snap, &tl, device, args.top);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &summary)?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        vramscope_core::report::snapshot_summary::write_text(&mut out, &vramscope_core::input::title(path), &summary)?;
    }
    // The process ends next: freeing millions of records one by one first only costs time.
    std::mem::forget((snap, tl));
    Ok(())
}

pub fn run_view(args: ViewArgs) -> anyhow::Result<()> {
    if args.summary {
        return print_summary(&args);
    }
    let keys = KeyMap::<ViewerKey>::load(args.keys.as_deref())?;
    let themes = Theme::cycle(&args.theme)?;
    let rx = spawn_loader(args.file.clone(), args.device);
    let mut loading = Loading::new(vramscope_core::input::title(&args.file));
    // A file read within a moment opens straight into the viewer (or fails before the
    // screen is entered); a larger one gets the loading screen meanwhile.
    let early = loading.receive(&rx, Duration::from_millis(args.loading_screen_after));
    if let Some(Err(e)) = early {
        return Err(e);
    }
    let mut session = TerminalSession::enter()?;
    let mut theme = 0;
    let mut data = match early {
        Some(done) => done?,
        None => match loading_loop(&mut session, &mut loading, &rx, &keys, &themes, &mut theme)? {
            Some(data) => data,
            None => return Ok(()),
        },
    };
    let mut ui = ViewerUi { theme, ..ViewerUi::new(&data) };
    screen_loop(&mut session, &mut data, &mut ui, &keys, &themes)
}

/// How often the loading screen redraws.
pub const LOADING_REDRAW: Duration = Duration::from_millis(200);

/// The loading screen until the file is loaded (the viewer's data) or the user quits
/// (`None`). Only quitting and the theme respond meanwhile.
fn loading_loop(
    session: &mut TerminalSession,
    loading: &mut Loading,
    rx: &Receiver<LoadUpdate>,
    keys: &KeyMap<ViewerKey>,
    themes: &[Theme],
    theme: &mut usize,
) -> anyhow::Result<Option<ViewerData>> {
    let mut drawn: Option<(Instant, usize)> = None;
    while !session.stop_requested() {
        // Redraw on a cadence, and at once when the first events arrive.
        let events = loading.timeline().map_or(0, |tl| tl.total_events);
        if drawn.is_none_or(|(at, seen)| at.elapsed() >= LOADING_REDRAW || (seen == 0 && events > 0)) {
            loading.refresh_detail();
            session.terminal.draw(|f| render_loading(f, loading, keys, &themes[*theme % themes.len()]))?;
            drawn = Some((Instant::now(), events));
        }
        if let Some(done) = loading.receive(rx, Duration::from_millis(50)) {
            return done.map(Some);
        }
        while event::poll(Duration::ZERO)? {
            match event::read()? {
                Event::Key(k) if k.kind != KeyEventKind::Release => match keys.action(&k) {
                    Some(ViewerKey::Quit) => return Ok(None),
                    Some(ViewerKey::NextTheme) => *theme = (*theme + 1) % themes.len().max(1),
                    _ => continue,
                },
                Event::Resize(..) => {}
                _ => continue,
            }
            drawn = None;
        }
    }
    Ok(None)
}

fn screen_loop(session: &mut TerminalSession, data: &mut ViewerData, ui: &mut ViewerUi, keys: &KeyMap<ViewerKey>, themes: &[Theme]) -> anyhow::Result<()> {
    let mut dirty = true;
    while !session.stop_requested() {
        if dirty {
            let width = session.terminal.size()?.width;
            ui.columns = plot_columns(width, ui.inspector);
            ui.inspector_overflow = inspector_overflow(data, ui, keys, &themes[ui.theme % themes.len()], session.terminal.size()?);
            session.terminal.draw(|f| render_viewer(f, data, ui, keys, &themes[ui.theme % themes.len()]))?;
            dirty = false;
        }
        if !event::poll(Duration::from_millis(100))? {
            continue;
        }
        match event::read()? {
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                if ui.typing.is_some() {
                    type_search(k.code, data, ui);
                } else if let Some(a) = keys.action(&k) {
                    if a == ViewerKey::Quit {
                        return Ok(());
                    }
                    handle(a, data, ui, themes.len());
                } else if ui.help {
                    ui.help = false;
                } else if ui.panel.is_some() && k.code == KeyCode::Esc {
                    ui.panel = None;
                } else {
                    continue;
                }
            }
            Event::Resize(..) => {}
            _ => continue,
        }
        dirty = true;
    }
    Ok(())
}
