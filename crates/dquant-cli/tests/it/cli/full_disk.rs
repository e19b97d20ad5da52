//! A full disk: `convert` fails naming the output and leaves nothing.

use super::*;

/// A tmpfs of `size` mounted at a new directory under `dir` (tests run as root), unmounted
/// when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> Self {
        let at = dir.join("small-disk");
        std::fs::create_dir(&at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .expect("running mount");
        assert!(
            st.success(),
            "mounting a tmpfs needs root (tests run as root)"
        );
        SmallDisk(at)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A real ENOSPC: `convert` onto a 1 MiB tmpfs fails with the disk's error naming the
/// output, and leaves the disk empty (no partial output, no temporary file).
#[test]
fn convert_onto_a_full_disk_fails_naming_the_output_and_leaves_nothing() {
    let dir = TempDir::new().unwrap();
    let src = dir.path().join("z").display().to_string();
    ok(&[
        "corpus", "zipf", &src, "--tokens", "1000000", "--vocab", "50257",
    ]);
    let disk = SmallDisk::mount(dir.path(), "1m");
    let out = disk.0.join("out").display().to_string();
    let e = fails(&["convert", &src, &out, "--codec", "u16"]);
    assert_eq!(
        e,
        format!("{out}.bin: No space left on device (os error 28)")
    );
    let left: Vec<_> = std::fs::read_dir(&disk.0).unwrap().collect();
    assert!(left.is_empty(), "left on the disk: {left:?}");
}
