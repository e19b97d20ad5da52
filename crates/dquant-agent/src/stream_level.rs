//! The transport stream's zstd level, fitted to what holds a session back.
//!
//! Why: the plan's default wire codec (`transport`, one zstd stream a session at level 5)
//! stores the fewest bytes a token of the wire codecs, but compresses at about 100 MB a
//! core-second, on the session's own thread. Over a 1 Gbit/s link that thread, not the link,
//! was the bound: the lab's agent delivered 3–4× its baseline at 25–27% link use, where
//! `auto+zstd:1` delivered 9× at 94% (`bench/RESULTS.md`, lab). Which level is fastest
//! depends on the link's rate against the cores', which the agent cannot know ahead.
//!
//! So, as `zstd --adapt` does, the level follows the transport's backlog
//! ([`dquant_transport::BatchSink::backlog`]): while records wait to be sent (the link or
//! the consumer holds the session back) compression is cheap, and the level steps up towards
//! the plan's; while the sender waits for records (compression holds it back) the level
//! steps down towards 1. Each decision looks at the mean backlog over a window of records
//! ([`WINDOW`] batches; a range session's answers, each several batches' worth, in windows
//! of [`RANGE_WINDOW`]), and a change starts a fresh zstd frame (the stream's history starts
//! again), so levels do not change more often than that. The bytes decoded are the same at every level; each
//! record names the level of its chunk.
//!
//! A plain function of the backlogs it is given: tests drive it without a link.

/// Batches between two decisions.
pub(crate) const WINDOW: u32 = 16;
/// A range session's answers between two decisions (each is up to a range of 512 Ki tokens,
/// eight batches of 16 × 4,096).
pub(crate) const RANGE_WINDOW: u32 = 4;
/// A mean backlog at or above this (half the prefetch budget waiting to be sent): the link
/// or the consumer is the bound, and compression can afford a higher level.
const HIGH: f64 = 0.5;
/// Below this (at most one frame of eight waiting, on average): the sender waits for the
/// compressor, which must go faster.
const LOW: f64 = 0.125;
/// The lowest level stepped down to: zstd's fastest positive level. (Its negative levels
/// compress faster still, for far fewer bytes saved; not tried.)
pub(crate) const FLOOR: i32 = 1;

/// A session's stream level and what it has seen since its last decision.
#[derive(Debug, Clone)]
pub(crate) struct StreamLevel {
    /// The plan's level: the highest this session compresses at.
    top: i32,
    level: i32,
    /// Records a decision looks at.
    window: u32,
    seen: u32,
    sum: f64,
}

impl StreamLevel {
    /// A session whose plan compresses its stream at `top`: it starts there, and decides
    /// every [`WINDOW`] batches.
    pub fn new(top: i32) -> Self {
        Self::deciding_every(top, WINDOW)
    }

    /// [`StreamLevel::new`] deciding every `window` records (at least 1).
    pub fn deciding_every(top: i32, window: u32) -> Self {
        StreamLevel {
            top,
            level: top,
            window: window.max(1),
            seen: 0,
            sum: 0.0,
        }
    }

    /// The level batches are compressed at now.
    #[cfg(test)]
    pub fn level(&self) -> i32 {
        self.level
    }

    /// A batch is about to be made while the transport's backlog is `backlog` (0 to 1): the
    /// new level when this is the end of a window that changes it.
    pub fn observe(&mut self, backlog: f64) -> Option<i32> {
        self.seen += 1;
        self.sum += backlog.clamp(0.0, 1.0);
        if self.seen < self.window {
            return None;
        }
        let mean = self.sum / f64::from(self.seen);
        (self.seen, self.sum) = (0, 0.0);
        let floor = FLOOR.min(self.top);
        let next = if mean >= HIGH {
            (self.level + 1).min(self.top)
        } else if mean < LOW {
            (self.level - 1).max(floor)
        } else {
            self.level
        };
        (next != self.level).then(|| {
            self.level = next;
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The levels after `windows` windows of a constant `backlog`.
    fn levels(s: &mut StreamLevel, backlog: f64, windows: u32) -> Vec<i32> {
        let mut out = Vec::new();
        for _ in 0..windows * WINDOW {
            if let Some(l) = s.observe(backlog) {
                out.push(l);
            }
        }
        out
    }

    #[test]
    fn a_sender_waiting_for_records_steps_the_level_down_to_the_floor_a_window_at_a_time() {
        let mut s = StreamLevel::new(5);
        assert_eq!(s.level(), 5);
        // Nothing changes within a window.
        for _ in 1..WINDOW {
            assert_eq!(s.observe(0.0), None);
        }
        assert_eq!(s.observe(0.0), Some(4));
        assert_eq!(levels(&mut s, 0.0, 10), [3, 2, 1]);
        assert_eq!(s.level(), FLOOR);
    }

    #[test]
    fn records_waiting_to_be_sent_step_it_back_up_to_the_plans_level_and_no_further() {
        let mut s = StreamLevel::new(5);
        levels(&mut s, 0.0, 10);
        assert_eq!(levels(&mut s, 0.9, 10), [2, 3, 4, 5]);
        assert_eq!(s.level(), 5);
    }

    #[test]
    fn a_backlog_between_the_thresholds_keeps_the_level() {
        let mut s = StreamLevel::new(5);
        levels(&mut s, 0.0, 2);
        assert_eq!(s.level(), 3);
        assert_eq!(levels(&mut s, 0.3, 10), Vec::<i32>::new());
        // The window's mean decides: half its batches full, half empty, is 0.5.
        for i in 0..WINDOW {
            let r = s.observe(if i % 2 == 0 { 1.0 } else { 0.0 });
            assert_eq!(r, (i == WINDOW - 1).then_some(4));
        }
    }

    #[test]
    fn a_plan_below_the_floor_stays_at_its_level() {
        let mut s = StreamLevel::new(-3);
        assert_eq!(levels(&mut s, 0.0, 4), Vec::<i32>::new());
        assert_eq!(levels(&mut s, 1.0, 4), Vec::<i32>::new());
        assert_eq!(s.level(), -3);
    }
}
