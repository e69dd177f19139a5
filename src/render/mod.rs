//! Pure drawing functions, one per screen or panel, and the theme they share.

pub mod format;
pub mod live;
pub mod snapshot_viewer;
pub mod theme;
pub mod watch;
