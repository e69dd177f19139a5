//! The interactive side: keys, view state, terminal handling, and the live app loop.

pub mod keys;
pub mod live;
pub mod terminal;
pub mod view;
