//! How `mrcache bench` writes sizes and times.

/// `4 KiB`, `64 MiB`, `1 GiB`, `100 B`, `1.5 MiB`.
pub fn size_text(b: usize) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        let u = 1usize << shift;
        if b >= u {
            return if b % u == 0 {
                format!("{} {unit}", b / u)
            } else {
                format!("{:.1} {unit}", b as f64 / u as f64)
            };
        }
    }
    format!("{b} B")
}

/// Microseconds from ns, three significant figures.
pub fn us(ns: f64) -> String {
    let u = ns / 1000.0;
    if !u.is_finite() {
        "-".into()
    } else if u < 1.0 {
        format!("{u:.3}")
    } else if u < 10.0 {
        format!("{u:.2}")
    } else if u < 100.0 {
        format!("{u:.1}")
    } else {
        format!("{u:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_microseconds_read_well() {
        assert_eq!(size_text(4096), "4 KiB");
        assert_eq!(size_text(64 << 20), "64 MiB");
        assert_eq!(size_text(1 << 30), "1 GiB");
        assert_eq!(size_text(100), "100 B");
        assert_eq!(size_text(1536 << 10), "1.5 MiB");
        assert_eq!(us(72.0), "0.072");
        assert_eq!(us(9810.0), "9.81");
        assert_eq!(us(123_456.0), "123");
        assert_eq!(us(f64::NAN), "-");
    }
}
