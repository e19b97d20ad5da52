//! Arrays sized by a request (a number of samples, epochs of documents), allocated only
//! when the allocator grants them: an absurd `num_samples` is an error for its caller, not
//! an abort of the process that serves it.

use crate::MegatronError;

/// An empty vector with room for `n` elements of the array named `what`.
pub fn vec_for<T>(n: u64, what: &'static str) -> Result<Vec<T>, MegatronError> {
    let too_large = || MegatronError::TooLarge { what, elements: n };
    let n = usize::try_from(n).map_err(|_| too_large())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| too_large())?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_no_allocator_grants_is_an_error() {
        let e = vec_for::<u64>(u64::MAX / 2, "the shuffle index").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the shuffle index would hold 9223372036854775807 entries: more than this process can allocate"
        );
        assert!(vec_for::<u64>(10, "x").unwrap().capacity() >= 10);
    }
}
