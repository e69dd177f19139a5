//! How bytes, sizes and times are written for people: the screens, reports and
//! recordings all use these, so one figure reads the same everywhere.

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

/// A time, as precise as a chart label needs: "45 µs", "3.5 ms", "0.35 s", "12.4 s", "734 s".
pub fn seconds(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    match s {
        s if s < 1e-3 => format!("{:.0} µs", s * 1e6),
        s if s < 1e-2 => format!("{:.1} ms", s * 1e3),
        s if s < 0.1 => format!("{:.0} ms", s * 1e3),
        s if s < 10.0 => format!("{s:.2} s"),
        s if s < 100.0 => format!("{s:.1} s"),
        s => format!("{s:.0} s"),
    }
}

/// Local time as `YYYYMMDD-HHMMSS`, for file names a person reads.
/// 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st.
pub fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

pub fn local_timestamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as libc::time_t;
    // SAFETY: localtime_r writes into the tm we own.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!("{:04}{:02}{:02}-{:02}{:02}{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ordinals_take_english_suffixes() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111].into_iter().map(super::ordinal).collect();
        assert_eq!(got, ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]);
    }

    use super::*;

    #[test]
    fn byte_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(200 << 20), "200 MiB");
        assert_eq!(bytes(80 * (1 << 30) - (400 << 20)), "79.6 GiB");
    }

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_bytes("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_bytes("80 GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("1.5MiB").unwrap(), 3 << 19);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").unwrap_err().contains("80GiB"));
        assert!(parse_bytes("3 parsecs").unwrap_err().contains("parsecs"));
    }

    #[test]
    fn seconds_keep_three_figures() {
        assert_eq!(seconds(45_000), "45 µs");
        assert_eq!(seconds(3_500_000), "3.5 ms");
        assert_eq!(seconds(42_000_000), "42 ms");
        assert_eq!(seconds(350_000_000), "0.35 s");
        assert_eq!(seconds(12_440_000_000), "12.4 s");
        assert_eq!(seconds(734_000_000_000), "734 s");
    }
}
