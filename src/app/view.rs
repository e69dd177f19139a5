//! View state of the live screen (zoom, pan, freeze, focus, overlays): everything the
//! keys change on the UI side. Pure data; the screen is a function of (store, view, theme).

/// Narrowest window, in history entries.
const MIN_WINDOW: u64 = 64;

#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// Entries shown across the timeline.
    pub window: u64,
    /// Right edge when not following the live tail.
    pub right: Option<u64>,
    /// Frozen: the window stays put while the store keeps ingesting.
    pub frozen: bool,
    pub by_category: bool,
    pub table_focus: bool,
    pub table_selected: usize,
    pub help: bool,
    pub theme: usize,
}

impl Default for View {
    fn default() -> Self {
        View {
            window: 1 << 13,
            right: None,
            frozen: false,
            by_category: true,
            table_focus: false,
            table_selected: 0,
            help: false,
            theme: 0,
        }
    }
}

impl View {
    /// The [from, to) history range on screen, given what the store holds.
    pub fn range(&self, start: u64, end: u64) -> (u64, u64) {
        let to = self.right.unwrap_or(end).clamp(start, end);
        (to.saturating_sub(self.window).max(start), to)
    }

    pub fn zoom_in(&mut self) {
        self.window = (self.window / 2).max(MIN_WINDOW);
    }

    pub fn zoom_out(&mut self, start: u64, end: u64) {
        self.window = (self.window * 2).min((end - start).max(MIN_WINDOW).next_power_of_two());
    }

    /// Moves by a quarter window; panning back leaves follow mode, reaching the tail
    /// resumes it (unless frozen).
    pub fn pan(&mut self, back: bool, start: u64, end: u64) {
        let step = (self.window / 4).max(1);
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

    pub fn following(&self) -> bool {
        self.right.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_pan_and_freeze() {
        let mut v = View { window: 100, ..View::default() };
        assert_eq!(v.range(0, 1000), (900, 1000));
        v.pan(true, 0, 1000);
        assert_eq!(v.range(0, 1000), (875, 975));
        assert!(!v.following());
        v.pan(false, 0, 1000);
        assert!(v.following(), "back at the tail: follow again");
        v.toggle_freeze(1000);
        assert_eq!(v.range(0, 5000), (900, 1000), "frozen view stays while data arrives");
        v.toggle_freeze(5000);
        assert_eq!(v.range(0, 5000), (4900, 5000));
        v.zoom_in();
        assert_eq!(v.window, 64, "zoom stops at the narrowest window");
        v.zoom_out(0, 5000);
        v.zoom_out(0, 5000);
        assert_eq!(v.window, 256);
    }
}
