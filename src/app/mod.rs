//! Terminal apps: the loops that own a terminal, read keys and redraw, and the key table
//! and view state they share.

pub mod headless;
pub mod keys;
pub mod live;
pub mod py;
pub mod replay;
pub mod snapshot_loading;
pub mod snapshot_viewer;
pub mod terminal;
pub mod view;
pub mod watch;
