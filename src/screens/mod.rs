//! One folder per screen, each with its state, its keys and its drawing.

pub mod live;
pub mod replay;
pub mod viewer;
pub mod watch;
