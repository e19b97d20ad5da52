//! The last word of an agent that shuts down gracefully: each consumer's stream ends with an
//! error frame saying where to resume, after every batch the agent finished for it.
//!
//! The wire carries it as an ordinary error message (no new frame kind, so an older client
//! still shows the text), and this module is the one place that writes and reads it: the
//! agent with [`shutdown_message`], the clients with [`resume_point`], which turns it back
//! into the cursor a trainer resumes from on another agent.

const PREFIX: &str = "agent shutting down; resume from consumed_samples ";

/// What an agent tells a consumer whose stream it ends at shutdown: the plan's
/// `consumed_samples` once the consumer has taken every batch before this message.
pub fn shutdown_message(consumed_samples: u64) -> String {
    format!("{PREFIX}{consumed_samples}")
}

/// The `consumed_samples` to resume from, when `message` is an agent's shutdown message.
pub fn resume_point(message: &str) -> Option<u64> {
    message.strip_prefix(PREFIX)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_round_trips_and_nothing_else_parses() {
        assert_eq!(
            shutdown_message(4096),
            "agent shutting down; resume from consumed_samples 4096"
        );
        for n in [0, 1, 4096, u64::MAX] {
            assert_eq!(resume_point(&shutdown_message(n)), Some(n));
        }
        for other in [
            "",
            "agent shutting down; resume from consumed_samples ",
            "agent shutting down; resume from consumed_samples -1",
            "agent shutting down; resume from consumed_samples 12 (epoch 0)",
            "sources[0] (x): agent shutting down; resume from consumed_samples 1",
        ] {
            assert_eq!(resume_point(other), None, "{other:?}");
        }
    }
}
