//! The wire's fixed sizes that more than one part of it names: what a frame may carry and
//! what a hello may be. In a module of their own so that the formats and their errors (whose
//! messages state the limits) all depend on them and not on each other.

/// Largest payload of one frame: 1 MiB.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// The length of a `DQHELLO1` hello: magic, session id, ticket.
pub const HELLO_LEN: usize = 32;
/// The longest tenant token a hello carries (so a hello fits a ring hand-over message).
pub const MAX_TOKEN_LEN: usize = 200;
