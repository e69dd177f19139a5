//! Terminal apps: the loops that own a terminal, read keys and redraw.

pub mod watch;
