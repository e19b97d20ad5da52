//! The floating-point arithmetic Megatron-Core does through numpy, to the last bit.
//!
//! Blend weights and split fractions go through `numpy.sum` before they decide anything, and
//! a last-bit difference in a weight moves a blended sample from one source to another. numpy
//! sums a contiguous float64 array pairwise (8 accumulators up to 128 elements, halves above),
//! not left to right, so a plain `iter().sum()` is not the same number.

/// `numpy.sum` of a contiguous float64 array.
pub fn numpy_sum(a: &[f64]) -> f64 {
    const BLOCK: usize = 128;
    let n = a.len();
    if n < 8 {
        let mut r = 0.0;
        for &x in a {
            r += x;
        }
        r
    } else if n <= BLOCK {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let whole = n - n % 8;
        let mut i = 8;
        while i < whole {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[whole..] {
            res += x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        numpy_sum(&a[..n2]) + numpy_sum(&a[n2..])
    }
}

/// `megatron.core.datasets.utils.normalize`: each weight over their `numpy.sum`.
pub fn normalize(weights: &[f64]) -> Vec<f64> {
    let total = numpy_sum(weights);
    weights.iter().map(|w| w / total).collect()
}

/// Python's `sum` of floats: left to right from 0.
pub fn python_sum(a: &[f64]) -> f64 {
    a.iter().fold(0.0, |acc, &x| acc + x)
}

/// `numpy.isclose(a, b)` with its defaults (rtol 1e-5, atol 1e-8).
pub fn numpy_isclose(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-8 + 1e-5 * b.abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sum_differs_from_left_to_right_where_numpy_does() {
        // Ten weights of 0.1: numpy.sum gives 1.0, Python's sum 0.9999999999999999.
        let a = [0.1f64; 10];
        assert_eq!(numpy_sum(&a), 1.0);
        assert_eq!(python_sum(&a), 0.999_999_999_999_999_9);
    }

    #[test]
    fn normalize_matches_numpy_on_weights_that_do_not_sum_to_one() {
        // numpy: normalize([0.3, 0.2, 0.7]) == [0.25, 0.16666666666666669, 0.5833333333333334]
        assert_eq!(
            normalize(&[0.3, 0.2, 0.7]),
            [0.25, 0.166_666_666_666_666_69, 0.583_333_333_333_333_4]
        );
    }
}
