//! The live screen: a job's allocator timeline as it trains (`vramscope`, `vramscope py`,
//! `attach`), also the replay's screen. `view` is what the keys change, `run` the loop that
//! feeds the store and owns the terminal, `render` the drawing.

pub mod keys;
pub mod render;
pub mod run;
pub mod view;
