//! `vramscope view`'s key table.

crate::actions! {
    /// `vramscope view`'s actions.
    ViewerKey, quit = Quit;
    NextTab, "next_tab", "tab", "next view: timeline, largest, segments, categories";
    CursorLeft, "cursor_left", "left", "timeline: cursor back (pans at the edge)";
    CursorRight, "cursor_right", "right", "timeline: cursor forward (pans at the edge)";
    SelectUp, "select_up", "up", "select the band above / the previous row";
    SelectDown, "select_down", "down", "select the band below / the next row";
    ZoomIn, "zoom_in", "+", "zoom in around the cursor";
    ZoomOut, "zoom_out", "-", "zoom out";
    DetailLess, "detail_less", "[", "detail: fewer allocations drawn one by one";
    DetailMore, "detail_more", "]", "detail: more allocations drawn one by one";
    JumpToPeak, "jump_to_peak", "p", "move the cursor to the peak";
    Inspect, "inspect", "enter", "open / close the allocation inspector";
    ColourBy, "colour_by", "c", "timeline: colour by category / by allocation";
    AllFrames, "all_frames", "f", "inspector: all frames / Python frames first";
    InspectorUp, "inspector_up", "pageup", "inspector: scroll up";
    InspectorDown, "inspector_down", "pagedown", "inspector: scroll down";
    Sort, "sort", "s", "largest list: next sort order";
    Search, "search", "/", "largest list: search frames or address";
    NextDevice, "next_device", "d", "next device";
    NextRank, "next_rank", "R", "next rank or file";
    NextWindow, "next_window", "W", "traces: next window";
    OomReport, "oom_report", "o", "out of memory: what was asked, free and alive then";
    WhatIf, "what_if", "w", "what if: the trace under other allocator settings";
    NextTheme, "next_theme", "t", "next theme";
    Help, "help", "?", "this help";
    Quit, "quit", "q", "quit";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{press, KeyError, KeyMap};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    #[test]
    fn the_viewer_table_is_complete_and_unique() {
        let k: KeyMap<ViewerKey> = KeyMap::default();
        assert_eq!(k.help_rows().len(), ViewerKey::ALL.len());
        assert_eq!(k.action(&press(KeyCode::Char(']'))), Some(ViewerKey::DetailMore));
        assert_eq!(k.action(&press(KeyCode::Enter)), Some(ViewerKey::Inspect));
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Some(ViewerKey::Quit));
        let k = KeyMap::<ViewerKey>::from_toml("[keys]\nsort = \"q\"\n").unwrap();
        assert_eq!(k.action(&press(KeyCode::Char('q'))), Some(ViewerKey::Sort));
        let e = KeyMap::<ViewerKey>::from_toml("[keys]\nsort = \"z\"\nquit = \"z\"\n").unwrap_err();
        assert!(matches!(e, KeyError::Duplicate { .. }), "{e}");
    }
}
