//! Number formatting shared by the screens.

const KIB: f64 = 1024.0;

/// Bytes in binary units with three significant figures at most: "512 B", "1.50 KiB",
/// "41.2 GiB".
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= KIB && unit + 1 < UNITS.len() {
        v /= KIB;
        unit += 1;
    }
    match (unit, v) {
        (0, _) => format!("{b} B"),
        (_, v) if v < 10.0 => format!("{v:.2} {}", UNITS[unit]),
        (_, v) if v < 100.0 => format!("{v:.1} {}", UNITS[unit]),
        (_, v) => format!("{v:.0} {}", UNITS[unit]),
    }
}

/// A bar of `width` cells, filled in proportion to `frac` (clamped to 0..=1), with
/// eighth-cell resolution at its edge.
/// A span of time in the unit that shows it: "2.345 s", "12.50 ms", "412 µs".
pub fn duration(secs: f64) -> String {
    let a = secs.abs();
    if a >= 1.0 {
        format!("{secs:.3} s")
    } else if a >= 1e-3 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{:.0} µs", secs * 1e6)
    }
}

pub fn bar(frac: f64, width: usize) -> (String, String) {
    const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    let eighths = (frac.clamp(0.0, 1.0) * (width * 8) as f64).round() as usize;
    let full = eighths / 8;
    let mut filled = "█".repeat(full);
    let mut rest = width - full;
    if full < width && !eighths.is_multiple_of(8) {
        filled.push(EIGHTHS[eighths % 8]);
        rest -= 1;
    }
    (filled, "░".repeat(rest))
}

/// `s` cut to `width` characters, with '…' marking the cut.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(200 << 20), "200 MiB");
        assert_eq!(bytes(80 * (1 << 30) - (400 << 20)), "79.6 GiB");
    }

    #[test]
    fn bars_fill_in_eighths() {
        assert_eq!(bar(0.0, 4), (String::new(), "░░░░".into()));
        assert_eq!(bar(1.5, 4), ("████".into(), String::new()));
        assert_eq!(bar(0.5, 4), ("██".into(), "░░".into()));
        assert_eq!(bar(0.5 + 1.0 / 32.0, 4), ("██▏".into(), "░".into()));
        let (f, e) = bar(0.37, 10);
        assert_eq!(f.chars().count() + e.chars().count(), 10);
    }

    #[test]
    fn fit_cuts_with_ellipsis() {
        assert_eq!(fit("NVIDIA H100", 20), "NVIDIA H100");
        assert_eq!(fit("NVIDIA H100 80GB HBM3", 8), "NVIDIA …");
    }
}

/// Parses a size such as "80GiB", "80 GB", "1.5TiB" or "4096" (bytes). Decimal (GB) and
/// binary (GiB) units are both accepted, as each means.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("expected a size like 80GiB, got '{s}'"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => KIB,
        "m" | "mib" => KIB.powi(2),
        "g" | "gib" => KIB.powi(3),
        "t" | "tib" => KIB.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => return Err(format!("unknown size unit '{u}' in '{s}' (allowed: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    Ok((n * mult).round() as u64)
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_bytes("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_bytes("80 GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("1.5MiB").unwrap(), 3 << 19);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").unwrap_err().contains("80GiB"));
        assert!(parse_bytes("3 parsecs").unwrap_err().contains("parsecs"));
    }
}

/// Local time as `YYYYMMDD-HHMMSS`, for file names a person reads.
pub fn local_timestamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as libc::time_t;
    // SAFETY: localtime_r writes into the tm we own.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!("{:04}{:02}{:02}-{:02}{:02}{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec)
}
