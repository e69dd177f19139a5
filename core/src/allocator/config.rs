//! Allocator settings (`PYTORCH_CUDA_ALLOC_CONF`) and the size rules that depend on them.

use crate::snapshot::model::{AllocatorSettings, SettingValue};

/// Requests are rounded up to a multiple of this; smaller ones take a whole 512 B block.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded requests up to this size live in the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for small-pool requests.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for large requests under `MIN_LARGE_ALLOC`; also the default
/// `max_non_split_rounding_size`.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Large requests from this size get a segment of their own size rounded to `ROUND_LARGE`.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
pub const ROUND_LARGE: u64 = 2 << 20;

const MIB: u64 = 1 << 20;
/// roundup_power2_divisions has one setting per power-of-two interval from 1 MiB to 32 GiB.
pub const ROUNDUP_INTERVALS: usize = 16;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfError {
    #[error("unknown option `{0}`")]
    UnknownOption(String),
    #[error("expected `{expected}` after `{after}`, found `{found}`")]
    Syntax {
        after: String,
        expected: &'static str,
        found: String,
    },
    #[error("bad value `{value}` for {key}: {why}")]
    BadValue {
        key: &'static str,
        value: String,
        why: &'static str,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks at least this large are never split, and smaller requests never use them.
    pub max_split_size: Option<u64>,
    /// A request ≥ `max_split_size` rejects cached blocks more than this much larger.
    pub max_non_split_rounding_size: u64,
    /// (interval start in bytes, a power of two ≥ 1 MiB; divisions), ascending, nonzero only.
    /// Sizes in [start, 2·start) round up to one of `divisions` steps between powers of two.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// Kept for the settings round trip; the model does not collect garbage.
    pub garbage_collection_threshold: f64,
    /// One address range per stream and pool, grown page by page, instead of a
    /// cudaMalloc per segment.
    pub expandable_segments: bool,
    /// Kept for the settings round trip (CUDA graph capture is not modelled).
    pub graph_capture_record_stream_reuse: bool,
    /// The configuration string as given.
    pub conf: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding_size: LARGE_BUFFER,
            roundup_power2_divisions: Vec::new(),
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            graph_capture_record_stream_reuse: false,
            conf: String::new(),
        }
    }
}

fn interval_index(size: u64) -> usize {
    let log = 63 - size.max(1).leading_zeros() as usize;
    log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1)
}

impl AllocatorConfig {
    /// Divisions per interval, indexed like PyTorch's table (interval i starts at 2^i MiB).
    pub fn division_table(&self) -> [u64; ROUNDUP_INTERVALS] {
        let mut t = [0; ROUNDUP_INTERVALS];
        for &(start, d) in &self.roundup_power2_divisions {
            t[interval_index(start)] = d;
        }
        t
    }

    fn set_division_table(&mut self, t: &[u64; ROUNDUP_INTERVALS]) {
        self.roundup_power2_divisions = (0..ROUNDUP_INTERVALS)
            .filter(|&i| t[i] != 0)
            .map(|i| (MIB << i, t[i]))
            .collect();
    }

    /// Reads what a snapshot recorded; keys it does not carry keep their defaults.
    pub fn from_settings(s: &AllocatorSettings) -> Self {
        let mut cfg = AllocatorConfig::default();
        let int = |k: &str| match s.get(k) {
            Some(SettingValue::Int(v)) => Some(*v),
            _ => None,
        };
        cfg.max_split_size = int("max_split_size").filter(|v| *v > 0).map(|v| v as u64);
        if let Some(v) = int("max_non_split_rounding_size").filter(|v| *v > 0) {
            cfg.max_non_split_rounding_size = v as u64;
        }
        match s.get("garbage_collection_threshold") {
            Some(SettingValue::Float(v)) => cfg.garbage_collection_threshold = *v,
            Some(SettingValue::Int(v)) => cfg.garbage_collection_threshold = *v as f64,
            _ => {}
        }
        if let Some(SettingValue::Bool(b)) = s.get("expandable_segments") {
            cfg.expandable_segments = *b;
        }
        if let Some(SettingValue::Bool(b)) = s.get("graph_capture_record_stream_reuse") {
            cfg.graph_capture_record_stream_reuse = *b;
        }
        if let Some(SettingValue::Str(c)) = s.get("PYTORCH_CUDA_ALLOC_CONF") {
            cfg.conf = c.clone();
        }
        if let Some(SettingValue::Dict(d)) = s.get("roundup_power2_divisions") {
            let mut t = [0; ROUNDUP_INTERVALS];
            for (k, v) in d {
                if let (Ok(mb), SettingValue::Int(div)) = (k.parse::<u64>(), v) {
                    if mb.is_power_of_two() && *div > 0 {
                        t[interval_index(mb * MIB)] = *div as u64;
                    }
                }
            }
            cfg.set_division_table(&t);
        }
        cfg
    }

    /// The `allocator_settings` dict as PyTorch writes it in a snapshot.
    pub fn to_settings(&self) -> AllocatorSettings {
        let t = self.division_table();
        let divisions = (0..ROUNDUP_INTERVALS)
            .map(|i| ((1u64 << i).to_string(), SettingValue::Int(t[i] as i64)))
            .collect();
        let split = self.max_split_size.map_or(-1, |v| v as i64);
        AllocatorSettings {
            entries: vec![
                (
                    "PYTORCH_CUDA_ALLOC_CONF".into(),
                    SettingValue::Str(self.conf.clone()),
                ),
                ("max_split_size".into(), SettingValue::Int(split)),
                (
                    "garbage_collection_threshold".into(),
                    SettingValue::Float(self.garbage_collection_threshold),
                ),
                (
                    "expandable_segments".into(),
                    SettingValue::Bool(self.expandable_segments),
                ),
                ("pinned_num_register_threads".into(), SettingValue::Int(1)),
                (
                    "release_lock_on_cudamalloc".into(),
                    SettingValue::Bool(false),
                ),
                (
                    "pinned_use_cuda_host_register".into(),
                    SettingValue::Bool(false),
                ),
                (
                    "graph_capture_record_stream_reuse".into(),
                    SettingValue::Bool(self.graph_capture_record_stream_reuse),
                ),
                (
                    "roundup_power2_divisions".into(),
                    SettingValue::Dict(divisions),
                ),
            ],
        }
    }

    /// The settings PyTorch would use in this process: `PYTORCH_CUDA_ALLOC_CONF`, else
    /// `PYTORCH_ALLOC_CONF` (PyTorch's order), else the defaults.
    /// Errors name the variable the settings came from.
    pub fn from_env() -> Result<Self, String> {
        let conf = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
            .iter()
            .find_map(|k| Some((k, std::env::var(k).ok()?)));
        conf.map_or_else(|| Ok(Self::default()), |(k, c)| Self::parse_conf(&c).map_err(|e| format!("{k}: {e}")))
    }

    /// These settings written as a configuration string that parses back to them.
    pub fn render_conf(&self) -> String {
        let mut parts = Vec::new();
        if let Some(b) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", b / MIB));
        }
        if self.max_non_split_rounding_size != LARGE_BUFFER {
            parts.push(format!("max_non_split_rounding_mb:{}", self.max_non_split_rounding_size / MIB));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!("garbage_collection_threshold:{}", self.garbage_collection_threshold));
        }
        if !self.roundup_power2_divisions.is_empty() {
            let t = self.division_table();
            let each: Vec<String> = (0..ROUNDUP_INTERVALS).map(|i| format!("{}:{}", 1u64 << i, t[i])).collect();
            parts.push(format!("roundup_power2_divisions:[{}]", each.join(",")));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.graph_capture_record_stream_reuse {
            parts.push("graph_capture_record_stream_reuse:True".into());
        }
        parts.join(",")
    }

    /// Parses `PYTORCH_CUDA_ALLOC_CONF` syntax, e.g.
    /// `max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4]`. Options PyTorch
    /// knows that do not change where device memory goes (pinned host memory, CUDA graph
    /// capture, `per_process_memory_fraction`, `throw_on_cudamalloc_oom`) are checked and
    /// accepted; unknown options and bad values are errors naming the option.
    pub fn parse_conf(s: &str) -> Result<Self, ConfError> {
        let toks = lex(s);
        let mut cfg = AllocatorConfig {
            conf: s.to_string(),
            ..Default::default()
        };
        let mut p = Tokens { toks: &toks, i: 0 };
        while let Some(key) = p.next() {
            p.expect(key, ":")?;
            match key {
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let name = if key == "max_split_size_mb" {
                        "max_split_size_mb"
                    } else {
                        "max_non_split_rounding_mb"
                    };
                    let v = p.value(key)?;
                    let mb: u64 = parse_num(name, v)?;
                    if mb <= LARGE_BUFFER / MIB {
                        return Err(ConfError::BadValue {
                            key: name,
                            value: v.into(),
                            why: "must be > 20",
                        });
                    }
                    let bytes = mb.saturating_mul(MIB);
                    if key == "max_split_size_mb" {
                        cfg.max_split_size = Some(bytes);
                    } else {
                        cfg.max_non_split_rounding_size = bytes;
                    }
                }
                "garbage_collection_threshold" => {
                    let v = p.value(key)?;
                    let t: f64 = parse_num("garbage_collection_threshold", v)?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(ConfError::BadValue {
                            key: "garbage_collection_threshold",
                            value: v.into(),
                            why: "must be between 0.0 and 1.0",
                        });
                    }
                    cfg.garbage_collection_threshold = t;
                }
                "roundup_power2_divisions" => cfg.parse_divisions(&mut p)?,
                "expandable_segments" => cfg.expandable_segments = p.flag(key)?,
                "graph_capture_record_stream_reuse" => {
                    cfg.graph_capture_record_stream_reuse = p.flag(key)?
                }
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "pinned_free_catch_all"
                | "throw_on_cudamalloc_oom" => {
                    p.flag(key)?;
                }
                "per_process_memory_fraction" => {
                    let v = p.value(key)?;
                    let f: f64 = parse_num("per_process_memory_fraction", v)?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(ConfError::BadValue {
                            key: "per_process_memory_fraction",
                            value: v.into(),
                            why: "must be between 0.0 and 1.0",
                        });
                    }
                }
                "pinned_num_register_threads" | "pinned_reserve_segment_size_mb" => {
                    parse_num::<u64>("pinned option", p.value(key)?)?;
                }
                "backend" => match p.value(key)? {
                    "native" => {}
                    other => {
                        return Err(ConfError::BadValue {
                            key: "backend",
                            value: other.into(),
                            why: "only the native caching allocator is modelled",
                        })
                    }
                },
                other => return Err(ConfError::UnknownOption(other.into())),
            }
            if let Some(t) = p.next() {
                if t != "," {
                    return Err(ConfError::Syntax {
                        after: key.into(),
                        expected: ",",
                        found: t.into(),
                    });
                }
            }
        }
        Ok(cfg)
    }

    fn parse_divisions(&mut self, p: &mut Tokens) -> Result<(), ConfError> {
        const KEY: &str = "roundup_power2_divisions";
        let mut t = [0u64; ROUNDUP_INTERVALS];
        let first = p.value(KEY)?;
        if first != "[" {
            // One value for every interval (the older syntax).
            let d: u64 = parse_num(KEY, first)?;
            if !d.is_power_of_two() {
                return Err(ConfError::BadValue {
                    key: KEY,
                    value: first.into(),
                    why: "divisions must be a power of two",
                });
            }
            t = [d; ROUNDUP_INTERVALS];
            self.set_division_table(&t);
            return Ok(());
        }
        let mut last = 0usize;
        let mut seen_first = false;
        loop {
            let k = p.value(KEY)?;
            if k == "]" {
                break;
            }
            p.expect(k, ":")?;
            let dv = p.value(KEY)?;
            let d: u64 = parse_num(KEY, dv)?;
            if d != 0 && !d.is_power_of_two() {
                return Err(ConfError::BadValue {
                    key: KEY,
                    value: dv.into(),
                    why: "divisions must be 0 or a power of two",
                });
            }
            if k == ">" {
                // Everything from the last named interval up takes this value.
                t[last..].fill(d);
            } else {
                let mb: u64 = parse_num(KEY, k)?;
                if !mb.is_power_of_two() {
                    return Err(ConfError::BadValue {
                        key: KEY,
                        value: k.into(),
                        why: "interval must be a power of two (MiB)",
                    });
                }
                let idx = (63 - mb.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                if !seen_first {
                    // Intervals below the first named one take its value.
                    t[..idx].fill(d);
                    seen_first = true;
                }
                t[idx] = d;
                last = idx;
            }
            match p.value(KEY)? {
                "," => {}
                "]" => break,
                other => {
                    return Err(ConfError::Syntax {
                        after: dv.into(),
                        expected: ", or ]",
                        found: other.into(),
                    })
                }
            }
        }
        self.set_division_table(&t);
        Ok(())
    }
}

/// Splits on `,` `:` `[` `]` (kept as tokens) and drops spaces, like PyTorch's lexer.
fn lex(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                out.push(c.to_string());
            }
            ' ' => {}
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

struct Tokens<'a> {
    toks: &'a [String],
    i: usize,
}

impl<'a> Tokens<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let t = self.toks.get(self.i)?;
        self.i += 1;
        Some(t.as_str())
    }
    fn expect(&mut self, after: &str, want: &'static str) -> Result<(), ConfError> {
        match self.next() {
            Some(t) if t == want => Ok(()),
            other => Err(ConfError::Syntax {
                after: after.into(),
                expected: want,
                found: other.unwrap_or("end of string").into(),
            }),
        }
    }
    fn value(&mut self, key: &str) -> Result<&'a str, ConfError> {
        self.next().ok_or_else(|| ConfError::Syntax {
            after: key.into(),
            expected: "a value",
            found: "end of string".into(),
        })
    }
    fn flag(&mut self, key: &str) -> Result<bool, ConfError> {
        match self.value(key)? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(ConfError::Syntax {
                after: key.into(),
                expected: "True or False",
                found: other.into(),
            }),
        }
    }
}

fn parse_num<T: std::str::FromStr>(key: &'static str, v: &str) -> Result<T, ConfError> {
    v.parse().map_err(|_| ConfError::BadValue {
        key,
        value: v.into(),
        why: "not a number",
    })
}

/// Block size PyTorch hands out for a request of `size` bytes.
pub fn round_size(size: u64, divisions: &[u64; ROUNDUP_INTERVALS]) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = divisions[interval_index(size)];
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        next_power2_division(size, d)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// Rounds up to the next of `divisions` equal steps between the surrounding powers of two.
fn next_power2_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    size.div_ceil(step) * step
}

/// Bytes cudaMalloc'd for a new segment serving a block of `rounded` bytes.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: [u64; ROUNDUP_INTERVALS] = [0; ROUNDUP_INTERVALS];

    #[test]
    fn requests_round_to_512_byte_multiples() {
        assert_eq!(round_size(1, &NONE), 512);
        assert_eq!(round_size(512, &NONE), 512);
        assert_eq!(round_size(513, &NONE), 1024);
        assert_eq!(round_size(1000, &NONE), 1024);
        assert_eq!(round_size(MIB + 1, &NONE), MIB + 512);
    }

    #[test]
    fn power2_divisions_round_to_the_next_step() {
        let four = [4; ROUNDUP_INTERVALS];
        assert_eq!(round_size(1200 * MIB, &four), 1280 * MIB);
        assert_eq!(round_size(1024 * MIB, &four), 1024 * MIB);
        assert_eq!(round_size(1281 * MIB, &four), 1536 * MIB);
        // At most 512·divisions bytes the plain 512 rounding applies.
        assert_eq!(round_size(1000, &four), 1024);
        let cfg = AllocatorConfig::parse_conf("roundup_power2_divisions:[1024:4]").unwrap();
        let t = cfg.division_table();
        assert_eq!(round_size(1200 * MIB, &t), 1280 * MIB);
    }

    #[test]
    fn segment_sizes_follow_the_request_class() {
        assert_eq!(segment_size(1024), 2 * MIB);
        assert_eq!(segment_size(MIB), 2 * MIB);
        assert_eq!(segment_size(MIB + 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(11 * MIB + 512), 12 * MIB);
    }

    #[test]
    fn parses_pytorch_conf_strings() {
        let c = AllocatorConfig::parse_conf("max_split_size_mb:128,roundup_power2_divisions:4")
            .unwrap();
        assert_eq!(c.max_split_size, Some(128 * MIB));
        assert_eq!(c.division_table(), [4; ROUNDUP_INTERVALS]);
        assert_eq!(c.roundup_power2_divisions.first(), Some(&(MIB, 4)));

        let c = AllocatorConfig::parse_conf(
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8], expandable_segments:True",
        )
        .unwrap();
        let t = c.division_table();
        // The first interval's value also covers the ones below it; `>` starts at the
        // last named interval (PyTorch overwrites 1024:4 with 8 there too).
        assert_eq!(&t[..9], &[1; 9]);
        assert_eq!(t[9], 2);
        assert_eq!(&t[10..], &[8; 6]);
        assert!(c.expandable_segments);
    }

    #[test]
    fn rejects_bad_conf_strings() {
        assert!(matches!(
            AllocatorConfig::parse_conf("max_split_size_mb:20"),
            Err(ConfError::BadValue { .. })
        ));
        assert_eq!(
            AllocatorConfig::parse_conf("frobnicate:1"),
            Err(ConfError::UnknownOption("frobnicate".into()))
        );
        assert!(matches!(
            AllocatorConfig::parse_conf("roundup_power2_divisions:3"),
            Err(ConfError::BadValue { .. })
        ));
        assert!(matches!(
            AllocatorConfig::parse_conf("max_split_size_mb"),
            Err(ConfError::Syntax { .. })
        ));
        assert!(matches!(
            AllocatorConfig::parse_conf("roundup_power2_divisions:[256:2"),
            Err(ConfError::Syntax { .. })
        ));
    }

    #[test]
    fn settings_round_trip() {
        let c = AllocatorConfig::parse_conf(
            "max_split_size_mb:256,roundup_power2_divisions:[512:2,>:4]",
        )
        .unwrap();
        let s = c.to_settings();
        assert_eq!(s.get("max_split_size"), Some(&SettingValue::Int(256 << 20)));
        let SettingValue::Dict(d) = s.get("roundup_power2_divisions").unwrap() else {
            panic!()
        };
        assert_eq!(d.len(), 16);
        assert_eq!(d[9], ("512".to_string(), SettingValue::Int(4)));
        assert_eq!(AllocatorConfig::from_settings(&s), c);
        let unset = AllocatorConfig::default().to_settings();
        assert_eq!(unset.get("max_split_size"), Some(&SettingValue::Int(-1)));
        assert_eq!(AllocatorConfig::from_settings(&unset).max_split_size, None);
    }

    #[test]
    fn rendered_conf_parses_back_to_the_same_settings() {
        for conf in [
            "",
            "expandable_segments:True",
            "max_split_size_mb:256,garbage_collection_threshold:0.6",
            "roundup_power2_divisions:[256:1,512:2,>:4],max_non_split_rounding_mb:64,graph_capture_record_stream_reuse:True",
        ] {
            let c = AllocatorConfig::parse_conf(conf).unwrap();
            let again = AllocatorConfig::parse_conf(&c.render_conf()).unwrap();
            assert_eq!(AllocatorConfig { conf: c.conf.clone(), ..again }, c, "{conf}");
        }
        assert_eq!(
            AllocatorConfig::parse_conf("expandable_segments:True,max_split_size_mb:128").unwrap().render_conf(),
            "max_split_size_mb:128,expandable_segments:True"
        );
    }

    #[test]
    fn newer_pytorch_options_are_checked_and_accepted() {
        assert!(AllocatorConfig::parse_conf("per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True").is_ok());
        let e = AllocatorConfig::parse_conf("per_process_memory_fraction:1.5").unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad value `1.5` for per_process_memory_fraction: must be between 0.0 and 1.0"
        );
        let e = AllocatorConfig::parse_conf("expandable_segments:yes").unwrap_err();
        assert_eq!(
            e.to_string(),
            "expected `True or False` after `expandable_segments`, found `yes`"
        );
    }
}
