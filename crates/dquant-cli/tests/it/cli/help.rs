//! Every command's `--help` has an example.

use super::*;

#[test]
fn every_command_has_help_with_an_example() {
    let commands: &[&[&str]] = &[
        &[],
        &["convert"],
        &["inspect"],
        &["verify"],
        &["corpus"],
        &["corpus", "real"],
        &["corpus", "zipf"],
        &["bench"],
        &["bench", "codecs"],
        &["read"],
        &["serve"],
        &["ls"],
        &["stat"],
        &["demo"],
    ];
    for cmd in commands {
        let mut args = cmd.to_vec();
        args.push("--help");
        let out = ok(&args);
        assert!(
            out.contains("Example"),
            "dquant {args:?} has no example:\n{out}"
        );
        assert!(out.contains("Usage: dquant"), "{out}");
    }
}
