//! float8 e4m3 ("e4m3fn": 4 exponent bits, bias 7, 3 mantissa bits, no infinities, NaN
//! = S.1111.111, largest finite 448), the element type of the scaled GEMM's A and B.
//! Encoding rounds to nearest even and saturates to +-448 as the GPU's `satfinite`
//! conversion does (a quantizer scales into range first); NaN stays NaN; +-Inf
//! saturates like any out-of-range value.

/// One float8 e4m3 value, as its byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct E4m3(pub u8);

/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

impl E4m3 {
    pub const NAN: E4m3 = E4m3(0x7f);

    /// The value exactly (every e4m3 is an f32).
    pub fn to_f32(self) -> f32 {
        let b = self.0;
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let exp = (b >> 3) & 0xf;
        let man = (b & 0x7) as f32;
        if exp == 0xf && b & 0x7 == 0x7 {
            return f32::NAN;
        }
        if exp == 0 {
            // Subnormal: man / 8 * 2^-6.
            sign * man * (1.0 / 8.0) * (2.0f32).powi(-6)
        } else {
            sign * (1.0 + man / 8.0) * (2.0f32).powi(exp as i32 - 7)
        }
    }

    /// The nearest e4m3 (ties to even), saturating at +-448.
    pub fn from_f32(v: f32) -> E4m3 {
        if v.is_nan() {
            return E4m3::NAN;
        }
        let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
        let a = v.abs();
        if a >= E4M3_MAX {
            return E4m3(sign | 0x7e);
        }
        // The spacing of e4m3 values around `a`: 2^(e - 3) in the binade [2^e, 2^(e+1)),
        // 2^-9 for the subnormals (and the first normal binade, e = -6).
        let e = if a < 2.0f32.powi(-6) {
            -6
        } else {
            a.log2().floor() as i32
        };
        let step = 2.0f64.powi(e.max(-6) - 3);
        let q = (a as f64 / step).round_ties_even() * step;
        // Rounding can carry into the next binade; re-derive the fields from q.
        let q = q as f32;
        if q == 0.0 {
            return E4m3(sign);
        }
        let (exp, man) = if q < 2.0f32.powi(-6) {
            (0u8, (q / 2.0f32.powi(-9)).round() as u8)
        } else {
            let e = q.log2().floor() as i32;
            let m = ((q / 2.0f32.powi(e) - 1.0) * 8.0).round() as u8;
            ((e + 7) as u8, m)
        };
        E4m3(sign | (exp << 3) | man)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for b in 0u8..=255 {
            let v = E4m3(b).to_f32();
            if v.is_nan() {
                assert!(b & 0x7f == 0x7f, "{b:#x}");
                assert!(E4m3::from_f32(v).to_f32().is_nan());
                continue;
            }
            let back = E4m3::from_f32(v);
            // +0 and -0 are two codes of one value.
            assert!(
                back == E4m3(b) || (v == 0.0 && back.to_f32() == 0.0),
                "{b:#x} {v}"
            );
        }
    }

    #[test]
    fn known_values_ties_and_saturation() {
        assert_eq!(E4m3(0x7e).to_f32(), 448.0);
        assert_eq!(E4m3(0x01).to_f32(), 2.0f32.powi(-9));
        assert_eq!(E4m3(0x08).to_f32(), 2.0f32.powi(-6));
        assert_eq!(E4m3::from_f32(1.0).0, 0x38);
        // 1.0625 is halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): to even.
        assert_eq!(E4m3::from_f32(1.0625).to_f32(), 1.0);
        assert_eq!(E4m3::from_f32(1.1875).to_f32(), 1.25);
        // Carry into the next binade: 15.5 -> 16.
        assert_eq!(E4m3::from_f32(15.5).to_f32(), 16.0);
        assert_eq!(E4m3::from_f32(1e6).to_f32(), 448.0);
        assert_eq!(E4m3::from_f32(f32::NEG_INFINITY).to_f32(), -448.0);
        assert_eq!(E4m3::from_f32(-3.0).to_f32(), -3.0);
        assert_eq!(E4m3::from_f32(1e-9).to_f32(), 0.0);
    }

    /// Rounding to nearest: the error is at most half a step of the value's binade.
    #[test]
    fn encoding_is_nearest() {
        let mut rng = crate::tensor::SplitMix64::new(9);
        for _ in 0..20_000 {
            let v = (rng.next_u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) as f32 * 500.0;
            let q = E4m3::from_f32(v).to_f32();
            let nearest = (0u8..=255)
                .map(|b| E4m3(b).to_f32())
                .filter(|x| !x.is_nan())
                .map(|x| (x - v.clamp(-448.0, 448.0)).abs())
                .fold(f32::INFINITY, f32::min);
            assert!(
                (q - v.clamp(-448.0, 448.0)).abs() <= nearest * (1.0 + 1e-6),
                "{v} -> {q}"
            );
        }
    }
}
