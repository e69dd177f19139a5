//! `vramscope view FILE`: a snapshot in the terminal. `data` is the file and what the
//! panels show of it, `ui` what the keys change, `loading` the file read on a thread with
//! its screen, `run` the loops, `render` the drawing, `set_peaks` every file's peak when several are open.

pub mod data;
pub mod keys;
pub mod loading;
pub mod render;
pub mod run;
pub mod set_peaks;
pub mod ui;
