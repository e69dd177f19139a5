//! View state of the live screen (zoom, pan, freeze, focus, overlays): everything the
//! keys change on the UI side. Pure data; the screen is a function of (store, view, theme).

use std::time::{Duration, Instant};

use vramscope_core::store::{LogLine, Store};

/// How long the footer keeps a marked line over the job's output.
const HOLD_MARKED_LINE: Duration = Duration::from_secs(4);

/// Narrowest window, in history entries.
const MIN_WINDOW: u64 = 64;
/// A pan moves this fraction of the window, so what was on screen stays in sight.
const PAN_DIVISOR: u64 = 8;
/// The window a screen opens with, in history entries.
const DEFAULT_WINDOW: u64 = 1 << 13;
/// Until the user zooms, a live window holds at least this many steps (the running one and
/// those before it), however many events a step makes.
pub const FIT_STEPS: usize = 3;

#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// Entries shown across the timeline.
    pub window: u64,
    /// Right edge when not following the live tail.
    pub right: Option<u64>,
    /// Frozen: the window stays put while the store keeps ingesting.
    pub frozen: bool,
    /// The window widens to hold the newest `FIT_STEPS` steps (until the user zooms).
    pub fit: bool,
    pub by_category: bool,
    /// The x axis is time (columns are equal time spans) rather than events.
    pub time_axis: bool,
    pub table_focus: bool,
    /// The selected allocation, by address: it stays selected while the rows re-sort.
    pub selected: Option<u64>,
    /// Its row when it was selected, where the selection falls back once it is freed.
    pub selected_row: usize,
    /// The inspector of the selected allocation is open.
    pub inspect: bool,
    /// The event log is open, scrolled this many lines up from the newest.
    pub log: Option<usize>,
    pub help: bool,
    pub theme: usize,
    /// A marked line (a snapshot saved, a knob changed, an out-of-memory) the footer keeps
    /// until the instant given, so a job's own output does not push it off at once.
    pub held_log: Option<(LogLine, Instant)>,
    /// The shown store's markers when last looked at.
    pub marks_seen: u64,
}

impl Default for View {
    fn default() -> Self {
        View {
            window: DEFAULT_WINDOW,
            right: None,
            frozen: false,
            fit: true,
            by_category: true,
            time_axis: false,
            table_focus: false,
            selected: None,
            selected_row: 0,
            inspect: false,
            log: None,
            help: false,
            theme: 0,
            held_log: None,
            marks_seen: 0,
        }
    }
}

impl View {
    /// After the store makes a marker, its line holds the footer for `HOLD_MARKED_LINE`;
    /// then the newest line shows again.
    pub fn hold_marked_line(&mut self, store: &Store, now: Instant) {
        if store.marks_made() != self.marks_seen {
            self.marks_seen = store.marks_made();
            self.held_log = store.log.iter().rev().find(|l| l.tag.is_some()).map(|l| (l.clone(), now + HOLD_MARKED_LINE));
        } else if self.held_log.as_ref().is_some_and(|(_, until)| now >= *until) {
            self.held_log = None;
        }
    }

    /// The [from, to) history range on screen, given what the store holds.
    pub fn range(&self, start: u64, end: u64) -> (u64, u64) {
        let to = self.right.unwrap_or(end).clamp(start, end);
        (to.saturating_sub(self.window).max(start), to)
    }

    pub fn zoom_in(&mut self) {
        self.fit = false;
        self.window = (self.window / 2).max(MIN_WINDOW);
    }

    pub fn zoom_out(&mut self, start: u64, end: u64) {
        self.fit = false;
        self.window = (self.window * 2).min((end - start).max(MIN_WINDOW).next_power_of_two());
    }

    /// Moves by an eighth of the window; panning back leaves follow mode, reaching the
    /// tail resumes it (unless frozen).
    pub fn pan(&mut self, back: bool, start: u64, end: u64) {
        let step = (self.window / PAN_DIVISOR).max(1);
        let right = self.right.unwrap_or(end);
        let right = if back {
            right.saturating_sub(step).max(start + self.window.min(end - start))
        } else {
            right + step
        };
        self.right = if right >= end && !self.frozen { None } else { Some(right.min(end)) };
    }

    pub fn toggle_freeze(&mut self, end: u64) {
        self.frozen = !self.frozen;
        self.right = if self.frozen { Some(self.right.unwrap_or(end)) } else { None };
    }

    /// Back to following the newest events, unfrozen, the window fitted to the newest steps.
    pub fn go_live(&mut self) {
        self.frozen = false;
        self.right = None;
        self.fit = true;
    }

    /// While following unzoomed, sizes the window to reach back to `from` (where the
    /// newest steps began) from `end`: never below the default, in powers of two so the
    /// scale changes seldom.
    pub fn fit_steps(&mut self, from: Option<u64>, end: u64) {
        if let Some(from) = from.filter(|_| self.fit && self.following()) {
            self.window = end.saturating_sub(from).next_power_of_two().max(DEFAULT_WINDOW);
        }
    }

    pub fn following(&self) -> bool {
        self.right.is_none()
    }

    /// Moves the selection `delta` rows through `order` (addresses, table order), from the
    /// selected allocation or, once it is gone, from the row it held.
    pub fn move_selection(&mut self, order: &[u64], delta: isize) {
        if order.is_empty() {
            self.selected = None;
            return;
        }
        let at = match self.selected.and_then(|a| order.iter().position(|x| *x == a)) {
            Some(i) => i as isize + delta,
            // Nothing selected yet: the first press selects the top row.
            None if self.selected.is_none() => 0,
            None => self.selected_row as isize,
        };
        let row = at.clamp(0, order.len() as isize - 1) as usize;
        self.selected = Some(order[row]);
        self.selected_row = row;
    }

    /// Closes whichever overlay is open; false when none was.
    pub fn close_overlay(&mut self) -> bool {
        let open = self.help || self.inspect || self.log.is_some();
        (self.help, self.inspect, self.log) = (false, false, None);
        open
    }

    /// Scrolls the open event log `delta` lines (up is positive), within `lines`.
    pub fn scroll_log(&mut self, delta: isize, lines: usize) {
        if let Some(up) = &mut self.log {
            *up = (*up as isize + delta).clamp(0, lines.saturating_sub(1) as isize) as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_core::stream::{Incoming, Report};

    /// Issue 34: `py`'s "snapshot saved" was pushed off the footer at once by the job's output.
    #[test]
    fn a_marked_line_holds_the_footer_for_a_while_over_the_jobs_output() {
        let mut store = Store::new(1 << 10);
        let mut v = View::default();
        let t0 = Instant::now();
        store.ingest(Incoming::Report(Report::SnapshotSaved { step: 3, path: "s.pickle".into() }));
        store.ingest(Incoming::Report(Report::Note("loss 2.31".into())));
        v.hold_marked_line(&store, t0);
        assert_eq!(v.held_log.as_ref().map(|(l, _)| l.text.as_str()), Some("snapshot of step 3 saved: s.pickle"));
        store.ingest(Incoming::Report(Report::Note("loss 2.30".into())));
        v.hold_marked_line(&store, t0 + Duration::from_secs(3));
        assert!(v.held_log.is_some(), "still held after 3 s");
        v.hold_marked_line(&store, t0 + HOLD_MARKED_LINE);
        assert!(v.held_log.is_none(), "the newest line shows again");
        v.hold_marked_line(&store, t0 + Duration::from_secs(9));
        assert!(v.held_log.is_none(), "held once per marker");
    }

    #[test]
    fn follow_pan_and_freeze() {
        let mut v = View { window: 80, ..View::default() };
        assert_eq!(v.range(0, 1000), (920, 1000));
        v.pan(true, 0, 1000);
        assert_eq!(v.range(0, 1000), (910, 990), "an eighth of the window, not a quarter");
        assert!(!v.following());
        v.pan(false, 0, 1000);
        assert!(v.following(), "back at the tail: follow again");
        v.toggle_freeze(1000);
        assert_eq!(v.range(0, 5000), (920, 1000), "frozen view stays while data arrives");
        v.pan(true, 0, 5000);
        v.go_live();
        assert!(v.following() && !v.frozen, "End: live again, unfrozen");
        assert_eq!(v.range(0, 5000), (4920, 5000));
        v.zoom_in();
        assert_eq!(v.window, 64, "zoom stops at the narrowest window");
        v.zoom_out(0, 5000);
        v.zoom_out(0, 5000);
        assert_eq!(v.window, 256);
    }

    #[test]
    fn the_live_window_fits_the_newest_steps_until_zoomed() {
        let mut v = View::default();
        v.fit_steps(None, 50_000);
        assert_eq!(v.window, DEFAULT_WINDOW, "no steps yet");
        v.fit_steps(Some(100), 1000);
        assert_eq!(v.window, DEFAULT_WINDOW, "short steps keep the default");
        v.fit_steps(Some(10_000), 50_000);
        assert_eq!(v.window, 1 << 16, "long steps widen it");
        v.pan(true, 0, 200_000);
        v.fit_steps(Some(40_000), 200_000);
        assert_eq!(v.window, 1 << 16, "panned back: the window stays");
        v.go_live();
        v.zoom_in();
        v.fit_steps(Some(10_000), 90_000);
        assert_eq!(v.window, 1 << 15, "zoomed: the user's window");
        v.go_live();
        v.fit_steps(Some(10_000), 90_000);
        assert_eq!(v.window, 1 << 17, "End fits again");
    }

    #[test]
    fn the_selection_follows_its_allocation_and_falls_back_to_its_row() {
        let mut v = View::default();
        v.move_selection(&[10, 20, 30], 1);
        assert_eq!(v.selected, Some(10), "the first press selects the top row");
        v.move_selection(&[10, 20, 30], 1);
        assert_eq!(v.selected, Some(20));
        // Rows re-sort: 20 is now first; moving down goes to what is below it now.
        v.move_selection(&[20, 30, 10], 1);
        assert_eq!((v.selected, v.selected_row), (Some(30), 1));
        // 30 is freed: the selection continues from its row.
        v.move_selection(&[20, 10], -1);
        assert_eq!(v.selected, Some(10));
        v.move_selection(&[], 1);
        assert_eq!(v.selected, None);
    }

    #[test]
    fn overlays_close_and_the_log_scrolls_within_its_lines() {
        let mut v = View { log: Some(0), ..View::default() };
        v.scroll_log(5, 3);
        assert_eq!(v.log, Some(2));
        v.scroll_log(-9, 3);
        assert_eq!(v.log, Some(0));
        assert!(v.close_overlay());
        assert!(!v.close_overlay());
    }
}
