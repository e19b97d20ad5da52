//! `GPTDataset.__getitem__`'s fields from a sample's tokens: `tokens`, `labels`, `loss_mask`
//! and `position_ids`, as Megatron-Core computes them (`_get_ltor_masks_and_position_ids`
//! and the pad handling around it), in one pass.
//!
//! Megatron builds them with a dozen torch ops a sample; made here they cost a copy. The
//! attention mask (an `s x s` matrix) stays with torch, where Megatron's own ops make it.
//! The loss mask is only ever 0.0 or 1.0 and the rest are integers, so the values are
//! exactly Megatron's.

/// The config fields that decide the values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldRules {
    pub eod: i64,
    /// The pad id (-1 when the tokenizer has none): padding is masked out of the loss and
    /// sent as token 0.
    pub pad: i64,
    pub reset_position_ids: bool,
    pub eod_mask_loss: bool,
    pub add_extra_token_to_sequence: bool,
}

/// One sample's fields, each `sequence_length` long.
pub struct Fields<'a> {
    pub tokens: &'a mut [i64],
    pub labels: &'a mut [i64],
    pub loss_mask: &'a mut [f32],
    pub position_ids: &'a mut [i64],
}

impl FieldRules {
    /// Tokens of the fields of a sample row of `row` tokens.
    pub fn sequence_length(&self, row: usize) -> usize {
        row - usize::from(self.add_extra_token_to_sequence && row > 0)
    }

    /// Fills `out` from `row` (a sample's tokens, pads as `self.pad`). `out`'s fields are
    /// [`sequence_length`](Self::sequence_length)`(row.len())` long.
    pub fn fill(&self, row: &[i64], out: Fields<'_>) {
        let Fields {
            tokens,
            labels,
            loss_mask,
            position_ids,
        } = out;
        let s = tokens.len();
        if s == 0 {
            return;
        }
        if self.add_extra_token_to_sequence {
            tokens.copy_from_slice(&row[..s]);
            labels.copy_from_slice(&row[1..=s]);
        } else {
            // torch.roll(text, -1) with the wrapped-around last label set to pad.
            tokens.copy_from_slice(&row[..s]);
            labels[..s - 1].copy_from_slice(&row[1..s]);
            labels[s - 1] = self.pad;
        }
        // One pass: position ids and the mask see the tokens as read; pads become 0 after.
        let mut start = 0usize;
        let mut prev = None;
        let each = tokens.iter_mut().zip(labels.iter_mut());
        let out = each.zip(loss_mask.iter_mut().zip(position_ids.iter_mut()));
        for (i, ((token, label), (mask, position))) in out.enumerate() {
            // A document starts after each EOD (position ids count from there).
            if self.reset_position_ids && prev == Some(self.eod) {
                start = i;
            }
            let t = *token;
            prev = Some(t);
            *position = (i - start) as i64;
            let masked = (self.eod_mask_loss && t == self.eod) || *label == self.pad;
            *mask = if masked { 0.0 } else { 1.0 };
            if t == self.pad {
                *token = 0;
            }
            if *label == self.pad {
                *label = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(rules: FieldRules, row: &[i64]) -> (Vec<i64>, Vec<i64>, Vec<f32>, Vec<i64>) {
        let s = rules.sequence_length(row.len());
        let (mut t, mut l, mut m, mut p) = (vec![9; s], vec![9; s], vec![9.0; s], vec![9; s]);
        rules.fill(
            row,
            Fields {
                tokens: &mut t,
                labels: &mut l,
                loss_mask: &mut m,
                position_ids: &mut p,
            },
        );
        (t, l, m, p)
    }

    const RULES: FieldRules = FieldRules {
        eod: 0,
        pad: -1,
        reset_position_ids: false,
        eod_mask_loss: false,
        add_extra_token_to_sequence: true,
    };

    #[test]
    fn plain_sample_shifts_labels_and_counts_positions() {
        let (t, l, m, p) = fill(RULES, &[5, 6, 0, 7, 8]);
        assert_eq!(t, [5, 6, 0, 7]);
        assert_eq!(l, [6, 0, 7, 8]);
        assert_eq!(m, [1.0; 4]);
        assert_eq!(p, [0, 1, 2, 3]);
    }

    #[test]
    fn resets_and_eod_masks_follow_the_eods_of_the_tokens() {
        let rules = FieldRules {
            reset_position_ids: true,
            eod_mask_loss: true,
            ..RULES
        };
        let (t, _, m, p) = fill(rules, &[5, 0, 6, 7, 0, 0, 8]);
        assert_eq!(t, [5, 0, 6, 7, 0, 0]);
        assert_eq!(m, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!(p, [0, 1, 0, 1, 2, 0]);
    }

    #[test]
    fn pads_are_masked_and_sent_as_zero() {
        let (t, l, m, _) = fill(RULES, &[5, 6, -1, -1]);
        assert_eq!((t, l), (vec![5, 6, 0], vec![6, 0, 0]));
        assert_eq!(m, [1.0, 0.0, 0.0]);
        let no_extra = FieldRules {
            add_extra_token_to_sequence: false,
            ..RULES
        };
        let (t, l, m, _) = fill(no_extra, &[5, 6, 7]);
        assert_eq!((t, l), (vec![5, 6, 7], vec![6, 7, 0]));
        assert_eq!(m, [1.0, 1.0, 0.0], "the wrapped-around label is a pad");
    }
}
