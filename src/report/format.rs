//! Human-readable sizes, binary units as nvidia-smi and PyTorch print them.

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn binary_units() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(20 * 1024 * 1024), "20.0 MiB");
        assert_eq!(super::bytes(3 * 1024 * 1024 * 1024 / 2), "1.5 GiB");
    }
}
