//! `vramscope view FILE`: the command, the loading screen's loop and the viewer's loop that
//! own the terminal, and `--summary`.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossterm::event::{Event, KeyCode, KeyEventKind};

use vramscope_core::snapshot::timeline::Timeline;

use super::data::ViewerData;
use super::keys::ViewerKey;
use super::loading::{spawn_loader, LoadUpdate, Loading};
use super::set_peaks::SetPeaks;
use super::render::{inspector_overflow, plot_columns, render_loading, render_viewer};
use super::ui::{handle, landed, type_search, ViewerUi};
use vramscope_core::profiler::Picked;
use vramscope_core::report::frame_rules::FrameRules;
use vramscope_core::report::snapshot_set::{self, SetRow};
use crate::keys::KeyMap;
use crate::terminal::TerminalSession;
use crate::theme::Theme;
#[derive(clap::Args, Clone, Debug)]
pub struct ViewArgs {
    /// A snapshot pickle (vramscope's or torch.cuda.memory._dump_snapshot's), a
    /// torch.profiler trace (a .json or .json.gz file, or tensorboard_trace_handler's
    /// directory), or export_memory_timeline's JSON. Several snapshots, or a directory of
    /// them (rank0…N_memory_snapshot.pickle): --summary tables them, R steps through them.
    #[arg(required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Print a report instead of opening the viewer.
    #[arg(long)]
    pub summary: bool,
    /// With --summary: the report as JSON.
    #[arg(long, requires = "summary")]
    pub json: bool,
    /// Device whose trace to show (default: the first one with trace entries).
    #[arg(long)]
    pub device: Option<usize>,
    /// With --summary: say on stderr where the time went (opening and mapping the file,
    /// the pre-scan, the decode, categories, timeline, summary, output).
    #[arg(long, requires = "summary")]
    pub profile: bool,
    /// With --summary: how many of the largest allocations to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Colour theme: dark, light, ansi16, or a theme file's path.
    #[arg(long, default_value = "dark")]
    pub theme: String,
    /// A TOML file whose [keys] table overrides the viewer's key bindings.
    #[arg(long)]
    pub keys: Option<PathBuf>,
    #[command(flatten)]
    pub rules: RulesArg,
    /// In a directory of torch.profiler traces: the worker (its stated rank, else its
    /// place by name), from 0.
    #[arg(long)]
    pub rank: Option<usize>,
    /// In a directory of torch.profiler traces: the worker's profiled window, from 0.
    #[arg(long)]
    pub window: Option<usize>,
    /// Milliseconds a file may take to load before the loading screen is drawn (tests
    /// set 0 to see it on small files).
    #[arg(long, default_value_t = 150, hide = true)]
    pub loading_screen_after: u64,
}


/// `--categories`, on every command that shows a snapshot's categories.
#[derive(clap::Args, Clone, Debug)]
pub struct RulesArg {
    /// A TOML file of rules that name categories from stack frames, before the built-in
    /// ones (attention, mlp, optimizer_state, communication...); `off` for none (a
    /// snapshot without recorded categories is then broken down by top frame).
    #[arg(long, value_name = "FILE")]
    pub categories: Option<PathBuf>,
}

impl RulesArg {
    pub fn load(&self) -> anyhow::Result<FrameRules> {
        Ok(FrameRules::load(self.categories.as_deref())?)
    }
}

impl ViewArgs {
    /// The one path given (a set of snapshots is `snapshot_files`'s).
    fn file(&self) -> &Path {
        &self.files[0]
    }
}

/// The file to open: `args.file()`, or the trace `--rank` and `--window` pick in a directory
/// of torch.profiler traces (with what was picked).
fn chosen_file(args: &ViewArgs) -> anyhow::Result<(PathBuf, Option<Picked>)> {
    if args.rank.is_none() && args.window.is_none() {
        return Ok((args.file().to_path_buf(), None));
    }
    anyhow::ensure!(args.file().is_dir(), "--rank and --window pick a trace in a directory tensorboard_trace_handler wrote; {} is not one", args.file().display());
    let picked = vramscope_core::profiler::pick(args.file(), args.rank, args.window).map_err(|e| anyhow::anyhow!("{}: {e}", args.file().display()))?;
    Ok((picked.file.clone(), Some(picked)))
}

/// How the screen names what it shows: the file, or for a directory's trace the directory
/// and which worker's which window.
fn screen_name(args: &ViewArgs, picked: Option<&Picked>) -> String {
    match picked {
        Some(p) => format!("{} · {}", vramscope_core::input::title(args.file()), p.place),
        None => vramscope_core::input::title(args.file()),
    }
}

/// `view --summary` over a set of snapshots: a row each (read one at a time), then the skew.
fn print_set_summary(args: &ViewArgs, files: &[PathBuf]) -> anyhow::Result<()> {
    let rules = args.rules.load()?;
    let mut rows = Vec::new();
    for path in files {
        let (snap, device) = vramscope_core::snapshot::read_device(path, args.device, &rules)?;
        let tl = Timeline::from_snapshot(&snap, device);
        let s = vramscope_core::report::snapshot_summary::summarize(&snap, &tl, device, 0);
        rows.push(SetRow::of(vramscope_core::input::title(path), &s));
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &serde_json::json!({ "files": rows, "skew": snapshot_set::skew(&rows) }))?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        snapshot_set::write_text(&mut out, &rows)?;
    }
    Ok(())
}

/// `view --summary`: the report of `args.file()`'s device on stdout.
fn print_summary(args: &ViewArgs) -> anyhow::Result<()> {
    if let Some(files) = snapshot_set::snapshot_files(&args.files)? {
        anyhow::ensure!(!args.profile, "--profile times one snapshot's summary: give one file");
        return print_set_summary(args, &files);
    }
    let (path, picked) = chosen_file(args)?;
    let path = &path;
    let rules = args.rules.load()?;
    let mut stages = Stages::new();
    let (mut snap, device) = vramscope_core::snapshot::read_device_observed(path, args.device, &rules, &mut |p| stages.saw(p))?;
    stages.read_returned();
    if let (Some(p), Some(d)) = (snap.profiled.as_mut(), picked) {
        p.picked = Some(d.description);
    }
    let tl = Timeline::from_snapshot(&snap, device);
    stages.end("timeline");
    let summary = vramscope_core::report::snapshot_summary::summarize(&snap, &tl, device, args.top);
    stages.end("summary");
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &summary)?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        vramscope_core::report::snapshot_summary::write_text(&mut out, &vramscope_core::input::title(path), &summary)?;
    }
    std::io::Write::flush(&mut out)?;
    stages.end(if args.json { "JSON" } else { "text" });
    if args.profile {
        eprintln!("vramscope: profile: {}", stages.line());
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
    // Several snapshots: R steps through them.
    let set = snapshot_set::snapshot_files(&args.files)?;
    let (file, mut picked) = match &set {
        Some(files) => (files[0].clone(), None),
        None => chosen_file(&args)?,
    };
    // In a directory of traces, where the screen is (the keys step through it).
    if set.is_none() && picked.is_none() && args.file().is_dir() {
        picked = vramscope_core::profiler::pick(args.file(), None, None).ok();
    }
    // The picked file itself: the directory is listed once.
    let file = picked.as_ref().map_or(file, |p| p.file.clone());
    let rules = Arc::new(args.rules.load()?);
    let rx = spawn_loader(file.clone(), args.device, rules.clone());
    let mut at = 0;
    let name = match &set {
        Some(files) => set_name(files, at),
        None => screen_name(&args, picked.as_ref()),
    };
    let mut loading = Loading::new(name);
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
    let steps = StepKeys { rank: picked.is_some() || set.is_some(), window: picked.is_some() };
    let mut peaks = set.as_deref().map(|files| SetPeaks::start(files, args.device));
    loop {
        let mut ui = ViewerUi { theme, ..ViewerUi::new(&data) };
        let step = screen_loop(&mut session, &mut data, &mut ui, &keys, &themes, steps, peaks.as_mut())?;
        theme = ui.theme;
        let Some(step) = step else { return Ok(()) };
        let (rx, mut loading) = match (&set, &picked) {
            (Some(files), _) => {
                at = (at + 1) % files.len();
                (spawn_loader(files[at].clone(), args.device, rules.clone()), Loading::new(set_name(files, at)))
            }
            (None, Some(now)) => {
                let (worker, window) = match step {
                    Step::NextWorker => (now.worker + 1, 0),
                    Step::NextWindow => (now.worker, now.window + 1),
                };
                let next = vramscope_core::profiler::pick_at(args.file(), worker, window).map_err(|e| anyhow::anyhow!("{}: {e}", args.file().display()))?;
                let loaded = (spawn_loader(next.file.clone(), args.device, rules.clone()), Loading::new(screen_name(&args, Some(&next))));
                picked = Some(next);
                loaded
            }
            (None, None) => return Ok(()),
        };
        data = match loading_loop(&mut session, &mut loading, &rx, &keys, &themes, &mut theme)? {
            Some(data) => data,
            None => return Ok(()),
        };
    }
}

/// Where the viewer goes from a directory's trace, or a set's snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    NextWorker,
    NextWindow,
}

/// Which of R (the next rank's trace, or the set's next file) and W (the worker's next
/// window) step anywhere.
#[derive(Clone, Copy, Debug)]
struct StepKeys {
    rank: bool,
    window: bool,
}

/// The header line of a set's peaks begins so.
const PEAKS_NOTE: &str = "files: ";

/// How the screen names a set's file: "rank2_memory_snapshot.pickle (3 of 8)".
fn set_name(files: &[PathBuf], at: usize) -> String {
    format!("{} ({} of {})", vramscope_core::input::title(&files[at]), at + 1, files.len())
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
        while let Some(event) = session.next_event(Duration::ZERO)? {
            match event {
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

/// The viewer until the user quits (None), or asks for another worker, window or file
/// (`steps` says which keys may).
fn screen_loop(
    session: &mut TerminalSession,
    data: &mut ViewerData,
    ui: &mut ViewerUi,
    keys: &KeyMap<ViewerKey>,
    themes: &[Theme],
    steps: StepKeys,
    mut peaks: Option<&mut SetPeaks>,
) -> anyhow::Result<Option<Step>> {
    let mut dirty = true;
    let mut first = true;
    while !session.stop_requested() {
        // An analysis a worker finished shows within one poll interval.
        dirty |= landed(data, ui);
        if let Some(p) = peaks.as_deref_mut() {
            if p.poll() || first {
                data.set_note(PEAKS_NOTE, format!("{PEAKS_NOTE}{}", p.line()));
                dirty = true;
            }
        }
        first = false;
        if dirty {
            let width = session.terminal.size()?.width;
            ui.columns = plot_columns(width, ui.inspector);
            ui.inspector_overflow = inspector_overflow(data, ui, keys, &themes[ui.theme % themes.len()], session.terminal.size()?);
            session.terminal.draw(|f| render_viewer(f, data, ui, keys, &themes[ui.theme % themes.len()]))?;
            dirty = false;
        }
        let Some(event) = session.next_event(Duration::from_millis(100))? else { continue };
        match event {
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                if ui.typing.is_some() {
                    type_search(k.code, data, ui);
                } else if let Some(a) = keys.action(&k) {
                    match a {
                        ViewerKey::Quit => return Ok(None),
                        ViewerKey::NextRank if steps.rank => return Ok(Some(Step::NextWorker)),
                        ViewerKey::NextWindow if steps.window => return Ok(Some(Step::NextWindow)),
                        _ => handle(a, data, ui, themes.len()),
                    }
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
    Ok(None)
}

/// Where `view --summary`'s time goes (`--profile`): the read's passes from its progress
/// (each pass is shown as it begins, and the decode once more at its end), then each step
/// after it.
struct Stages {
    start: Instant,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
    check_began: Option<Instant>,
    decode_began: Option<Instant>,
    decoded: Option<Instant>,
}

impl Stages {
    fn new() -> Stages {
        let now = Instant::now();
        Stages { start: now, last: now, done: Vec::new(), check_began: None, decode_began: None, decoded: None }
    }

    fn saw(&mut self, p: &vramscope_core::snapshot::ReadProgress<'_>) {
        let now = Instant::now();
        match p.pass {
            vramscope_core::snapshot::ReadPass::Check => {
                self.check_began.get_or_insert(now);
            }
            vramscope_core::snapshot::ReadPass::Decode => {
                self.decode_began.get_or_insert(now);
                if p.done == p.total {
                    self.decoded = Some(now);
                }
            }
        }
    }

    /// The read returned, its categories named: a pickle's passes are told apart, any other
    /// file's read is one stage.
    fn read_returned(&mut self) {
        match (self.check_began, self.decode_began, self.decoded) {
            (Some(check), Some(decode), Some(decoded)) => {
                self.done.push(("open and map", check - self.start));
                self.done.push(("pre-scan", decode - check));
                self.done.push(("decode", decoded - decode));
                self.last = decoded;
                self.end("categories");
            }
            _ => self.end("read"),
        }
    }

    fn end(&mut self, stage: &'static str) {
        let now = Instant::now();
        self.done.push((stage, now - self.last));
        self.last = now;
    }

    fn line(&self) -> String {
        let stages: Vec<String> = self.done.iter().map(|(s, d)| format!("{s} {:.3} s", d.as_secs_f64())).collect();
        format!("{} · total {:.3} s", stages.join(" · "), (self.last - self.start).as_secs_f64())
    }
}
