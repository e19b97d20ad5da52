//! A content checksum of a token stream that does not depend on how it is stored.

use xxhash_rust::xxh3::Xxh3;

/// Streaming XXH3-64 over the tokens as little-endian `u32`s.
///
/// Two datasets with the same token ids have the same checksum whatever their format, dtype
/// or codec: this is what `dquant inspect` prints and what tests compare across the offloaded
/// and local paths. XXH3 runs at memory speed, so hashing never dominates a scan.
#[derive(Clone, Default)]
pub struct TokenHasher {
    inner: Xxh3,
    tokens: u64,
}

impl TokenHasher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, tokens: &[u32]) {
        self.inner.update(bytemuck::cast_slice(tokens));
        self.tokens += tokens.len() as u64;
    }

    /// Tokens hashed so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn finish(&self) -> u64 {
        self.inner.digest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_points_do_not_matter() {
        let v: Vec<u32> = (0..1000).map(|i| i * 7919).collect();
        let mut a = TokenHasher::new();
        a.update(&v);
        let mut b = TokenHasher::new();
        b.update(&v[..3]);
        b.update(&v[3..999]);
        b.update(&v[999..]);
        assert_eq!(a.finish(), b.finish());
        assert_eq!(a.tokens(), 1000);
        let mut c = TokenHasher::new();
        c.update(&v[1..]);
        assert_ne!(a.finish(), c.finish());
    }
}
