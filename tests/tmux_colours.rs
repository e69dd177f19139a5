//! What an SSH session usually is: a 256-colour terminal without COLORTERM. The phase
//! shades stay apart there (they once all rounded to one grey), and after 25 s of training
//! the timeline carries a peak label and step numbers.

mod common;

use std::time::Duration;

use common::tmux::Session;

/// Each line of a capture as its characters with the background each is drawn on ("" =
/// default), from the SGR codes `capture-pane -e` writes. tmux writes a code only where the
/// colours change, across line ends too, so the state carries from line to line.
fn cells(capture: &str) -> Vec<Vec<(char, String)>> {
    let mut lines = vec![Vec::new()];
    let mut bg = String::new();
    let mut chars = capture.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            lines.push(Vec::new());
            continue;
        }
        if c != '\x1b' {
            lines.last_mut().unwrap().push((c, bg.clone()));
            continue;
        }
        if chars.next() != Some('[') {
            continue;
        }
        let mut params = String::new();
        let end = loop {
            match chars.next() {
                Some(ch) if ch.is_ascii_digit() || ch == ';' => params.push(ch),
                other => break other,
            }
        };
        if end != Some('m') {
            continue;
        }
        let p: Vec<&str> = if params.is_empty() { vec!["0"] } else { params.split(';').collect() };
        let mut i = 0;
        while i < p.len() {
            match p[i] {
                "0" | "49" => bg.clear(),
                "38" | "48" => {
                    let n = if p.get(i + 1) == Some(&"5") { 3 } else { 5 };
                    if p[i] == "48" {
                        bg = p[i..(i + n).min(p.len())].join(";");
                    }
                    i += n - 1;
                }
                code if (code.len() == 2 && code.starts_with('4')) || (code.len() == 3 && code.starts_with("10")) => bg = code.to_string(),
                _ => {}
            }
            i += 1;
        }
    }
    lines
}

#[test]
fn phases_differ_at_256_colours_and_the_timeline_has_a_peak_and_step_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cmd = format!(
        "env -u COLORTERM -u {} TERM=xterm-256color {bin} --model tiny --ctx 64 --batch 2 --snapshot-dir {}",
        vramscope::theme::COLORS_ENV,
        dir.path().display()
    );
    let s = Session::start("vramscope-256", &cmd);
    s.wait_for("the live screen", 120, |sc| sc.contains("active memory"));
    std::thread::sleep(Duration::from_secs(25));
    let captured = s.screen_with_colours();
    let lines = cells(&captured);
    let text: Vec<String> = lines.iter().map(|l| l.iter().map(|(c, _)| *c).collect()).collect();
    let screen = text.join("\n");
    // The step axis, and the phase row just above it.
    let axis = text.iter().position(|l| l.contains("    step ")).unwrap_or_else(|| panic!("no step axis:\n{screen}"));
    let numbers: Vec<u64> = text[axis].split("    step ").nth(1).unwrap().split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
    assert!(numbers.len() >= 2 && numbers.windows(2).all(|w| w[0] < w[1]), "step numbers on the axis: {}\n{screen}", text[axis]);
    assert!(screen.contains("peak "), "a peak label on the timeline:\n{screen}");
    let ribbon = &lines[axis - 1];
    let shade = |letter: char| {
        ribbon.iter().find(|(c, _)| *c == letter).map(|(_, bg)| bg.clone()).unwrap_or_else(|| panic!("no {letter} in the phase row: {}\n{screen}", text[axis - 1]))
    };
    let (f, b, o) = (shade('F'), shade('B'), shade('O'));
    for bg in [&f, &b, &o] {
        assert!(bg.starts_with("48;5;"), "256-colour shades, no RGB ({bg})");
    }
    assert!(f != b && b != o && f != o, "forward {f}, backward {b}, optimizer {o}");
    s.keys("q");
}

#[test]
fn sgr_backgrounds_are_tracked() {
    let got = cells("a\x1b[38;5;253;48;5;17mF\x1b[48;2;1;2;3mB\x1b[0mO\x1b[44mZ\nY");
    let bg: Vec<Vec<&str>> = got.iter().map(|l| l.iter().map(|(_, b)| b.as_str()).collect()).collect();
    assert_eq!(bg, [vec!["", "48;5;17", "48;2;1;2;3", "", "44"], vec!["44"]], "the colour carries to the next line");
}
