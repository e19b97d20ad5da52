//! Megatron-order samples served by an agent (`OpenMegatron`) against the same build made in
//! this process: every sample of every split equal, token for token, with its dataset id and
//! padding; restarts at any index; predicted batches right whatever the reader asks next;
//! ranks that open at once sharing one build; exact refusals.

use std::path::Path;
use std::sync::Arc;

use dquant_client::{AgentMegatron, ClientError, Control, Over};
use dquant_megatron::{build, Blend, BuildConfig, Built, Sources};
use dquant_storage::{Dataset, OpenOptions};
use dquant_testkit::{agent, fixture};

const NAMES: [&str; 3] = ["r50k_int32", "r50k_uint16", "r50k_int32_multiseq"];

/// A directory holding the fixtures `names` (each's `.bin` and `.idx`).
fn fixtures(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in names {
        for ext in ["bin", "idx"] {
            let f = format!("{name}.{ext}");
            std::fs::copy(fixture(&f), dir.path().join(&f)).unwrap();
        }
    }
    dir
}

fn served() -> (tempfile::TempDir, dquant_agent::AgentHandle) {
    let dir = fixtures(&NAMES);
    let mut c = agent::config(&[("c", dir.path().to_path_buf())]);
    c.socket = Some(dir.path().join("agent.sock"));
    (dir, dquant_agent::start(c).unwrap())
}

fn control(a: &dquant_agent::AgentHandle) -> Control {
    Control::connect(&a.control_addr().to_string()).unwrap()
}

/// Both ways samples travel: TCP frames, and a shared-memory ring handed over on the
/// agent's Unix socket (a ring of few slots, so that the agent waits on this reader).
const OVER: [Over; 3] = [
    Over::Tcp,
    Over::Shm { slots: None },
    Over::Shm { slots: Some(4) },
];

fn open_over(
    a: &dquant_agent::AgentHandle,
    config: &BuildConfig,
    codec: &str,
    over: Over,
) -> AgentMegatron {
    let control = match over {
        Over::Tcp => control(a),
        _ => Control::connect(&a.socket().unwrap().display().to_string()).unwrap(),
    };
    AgentMegatron::open_over(control, config, codec, over).unwrap()
}

/// The config with its prefixes under root `c` (the agent's names) or local paths.
fn configs(dir: &Path) -> Vec<(BuildConfig, BuildConfig)> {
    let blend = |names: &[&str], w: Option<Vec<f64>>, at: &dyn Fn(&str) -> String| Blend {
        prefixes: names.iter().map(|n| at(n)).collect(),
        weights: w,
    };
    let make = |at: &dyn Fn(&str) -> String| {
        let mut blended = BuildConfig::new(1234, 64);
        blended.blend = Some(blend(&NAMES, Some(vec![0.5, 0.3, 0.2]), at));
        blended.split = Some("80,15,5".into());
        blended.num_samples = [Some(300), Some(40), Some(10)];
        let mut lone = BuildConfig::new(7, 100);
        lone.blend = Some(blend(&NAMES[..1], None, at));
        lone.split = Some("90,10,0".into());
        lone.num_samples = [Some(500), None, None];
        lone.drop_last_partial_validation_sequence = false;
        lone.add_extra_token_to_sequence = false;
        vec![blended, lone]
    };
    let remote = make(&|n| format!("c/{n}"));
    let local = make(&|n| dir.join(n).display().to_string());
    remote.into_iter().zip(local).collect()
}

fn local_build(config: &BuildConfig) -> (Built, Sources) {
    let open = |p: &str| Dataset::open(Path::new(p), &OpenOptions::default()).map(Arc::new);
    let sources = Sources::open(&config.prefixes(), open).unwrap();
    let built = build(config, &mut |p| sources.lengths_of(p)).unwrap();
    (built, sources)
}

/// Sample `idx` of `split` read locally: tokens (pads 0), dataset id, pad count.
fn local_sample(b: &Built, s: &Sources, split: usize, idx: u64) -> (Vec<u32>, u32, u64) {
    let top = b.splits[split].as_ref().unwrap();
    let sample = top.sample(idx).unwrap();
    let mut row = vec![0u32; top.sample_tokens() as usize];
    let (mut tokens, mut bufs) = (Vec::new(), Default::default());
    s.read_into(&sample, &mut row, 0, &mut tokens, &mut bufs)
        .unwrap();
    (row, sample.dataset_id.map_or(0, |d| d as u32), sample.pad)
}

fn assert_batch_equals_local(
    m: &mut AgentMegatron,
    (b, s): &(Built, Sources),
    split: usize,
    indices: &[u64],
) {
    let got = m.batch(split, indices).unwrap();
    for (k, &i) in indices.iter().enumerate() {
        let (row, id, pad) = local_sample(b, s, split, i);
        assert_eq!(got.tokens(k), &row[..], "split {split} sample {i}");
        assert_eq!(
            (got.dataset_ids[k], got.pads[k]),
            (id, pad),
            "split {split} sample {i}"
        );
    }
}

#[test]
fn every_sample_of_every_split_equals_the_local_build() {
    let (dir, a) = served();
    for ((remote, local), over) in configs(dir.path())
        .into_iter()
        .flat_map(|c| OVER.map(|o| (c.clone(), o)))
    {
        let l = local_build(&local);
        let mut m = open_over(&a, &remote, "", over);
        for split in 0..3 {
            let want = l.0.splits[split].as_ref().map(|t| t.len());
            let got = m.layout().splits[split].map(|s| s.samples);
            assert_eq!(got, want, "split {split}");
            let Some(n) = want else { continue };
            let all: Vec<u64> = (0..n).collect();
            for chunk in all.chunks(7) {
                assert_batch_equals_local(&mut m, &l, split, chunk);
            }
        }
        // A partial last validation sample's padding travels as its count.
        if !local.drop_last_partial_validation_sequence {
            let valid = l.0.splits[1].as_ref().unwrap();
            let padded = (0..valid.len()).find(|&i| valid.sample(i).unwrap().pad > 0);
            assert_batch_equals_local(&mut m, &l, 1, &[padded.expect("a padded sample")]);
        }
    }
}

#[test]
fn a_restart_at_any_index_needs_nothing_but_the_index() {
    let (dir, a) = served();
    let (remote, local) = configs(dir.path()).swap_remove(0);
    let l = local_build(&local);
    for (k, consumed) in [0u64, 1, 37, 150, 299].into_iter().enumerate() {
        let mut m = open_over(&a, &remote, "auto+zstd", OVER[k % OVER.len()]);
        // The first open builds; a restart finds the build.
        assert_eq!(m.was_cached(), consumed != 0);
        let idx: Vec<u64> = (consumed..(consumed + 8).min(300)).collect();
        assert_batch_equals_local(&mut m, &l, 0, &idx);
    }
}

#[test]
fn predicted_batches_are_right_whatever_is_asked_next() {
    let (dir, a) = served();
    let (remote, local) = configs(dir.path()).swap_remove(0);
    let l = local_build(&local);
    for over in OVER {
        predicted_batches_are_right_over(&a, &remote, &l, over);
    }
}

fn predicted_batches_are_right_over(
    a: &dquant_agent::AgentHandle,
    remote: &BuildConfig,
    l: &(Built, Sources),
    over: Over,
) {
    let mut m = open_over(a, remote, "", over);
    // A data-parallel rank's sequential sampler: micro-batches of 4, stride 12.
    for step in 0..10u64 {
        let idx: Vec<u64> = (0..4).map(|k| 8 + step * 12 + k).collect();
        assert_batch_equals_local(&mut m, l, 0, &idx);
    }
    // A jump after a stride was learnt, another split, a repeat, then the end of the split.
    assert_batch_equals_local(&mut m, l, 0, &[3, 2, 1]);
    assert_batch_equals_local(&mut m, l, 1, &[0, 1]);
    assert_batch_equals_local(&mut m, l, 1, &[2, 3]);
    assert_batch_equals_local(&mut m, l, 1, &[2, 3]);
    assert_batch_equals_local(&mut m, l, 1, &[36, 37]);
    assert_batch_equals_local(&mut m, l, 1, &[38, 39]);
}

#[test]
fn ranks_opening_at_once_share_one_build() {
    let (dir, a) = served();
    let (remote, _) = configs(dir.path()).swap_remove(0);
    let cached: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                let c = control(&a);
                let r = remote.clone();
                s.spawn(move || AgentMegatron::open(c, &r, "").unwrap().was_cached())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(cached.iter().filter(|c| !**c).count(), 1, "{cached:?}");
}

#[test]
fn bad_requests_get_exact_refusals() {
    let (dir, a) = served();
    let (remote, _) = configs(dir.path()).swap_remove(0);
    let mut m = AgentMegatron::open(control(&a), &remote, "").unwrap();
    let e = m.batch(0, &[1, 300]).unwrap_err();
    assert!(matches!(e, ClientError::IndexOutOfRange(_)));
    assert_eq!(
        e.to_string(),
        "index 300 is out of range for the train dataset of 300 samples"
    );
    assert_eq!(
        m.batch(2, &[0]).unwrap().tokens(0).len(),
        65,
        "the test split has samples of 64 + 1 tokens"
    );

    let mut missing = remote.clone();
    missing.blend.as_mut().unwrap().prefixes[1] = "c/nope".into();
    let e = AgentMegatron::open(control(&a), &missing, "")
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "dataset \"c/nope\": no such dataset under root \"c\""
    );

    let mut bad = remote.clone();
    bad.split = Some("0,0,0".into());
    let e = AgentMegatron::open(control(&a), &bad, "").err().unwrap();
    assert_eq!(e.to_string(), "split \"0,0,0\": the parts sum to zero");

    let mut huge = remote.clone();
    huge.num_samples = [Some(u64::MAX), Some(1), None];
    let e = AgentMegatron::open(control(&a), &huge, "").err().unwrap();
    assert_eq!(
        e.to_string(),
        "num_samples: 18446744073709551615 samples in all, above this agent's limit of \
         2147483648 for one Megatron-order build (limits.max_megatron_samples)"
    );

    let e = AgentMegatron::open(control(&a), &remote, "nonsense")
        .err()
        .unwrap();
    assert!(e.to_string().starts_with("wire_codec: "), "{e}");
    // The agent serves on.
    assert_batch_equals_local(
        &mut AgentMegatron::open(control(&a), &remote, "").unwrap(),
        &local_build(&configs(dir.path()).swap_remove(0).1),
        0,
        &[0],
    );
}

#[test]
fn an_agent_that_restarts_reads_the_indices_it_kept_on_disk() {
    let (dir, first) = served();
    drop(first);
    let cache = tempfile::tempdir().unwrap();
    let start = || {
        let mut c = agent::config(&[("c", dir.path().to_path_buf())]);
        c.megatron_cache = Some(cache.path().join("megatron"));
        dquant_agent::start(c).unwrap()
    };
    let (remote, local) = configs(dir.path()).swap_remove(0);
    let l = local_build(&local);
    let all: Vec<u64> = (0..300).collect();
    {
        let a = start();
        let mut m = AgentMegatron::open(control(&a), &remote, "").unwrap();
        assert_batch_equals_local(&mut m, &l, 0, &all[..50]);
    }
    let kept: Vec<_> = std::fs::read_dir(cache.path().join("megatron"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(kept.len(), 9, "three sources x three splits: {kept:?}");
    assert!(
        kept.iter().all(|f| f.ends_with("-gpt-index.dqmi")),
        "{kept:?}"
    );
    // A restarted agent has nothing in memory: its build reads the files, and gives the
    // same samples.
    let a = start();
    let mut m = AgentMegatron::open(control(&a), &remote, "").unwrap();
    assert!(!m.was_cached());
    for chunk in all.chunks(64) {
        assert_batch_equals_local(&mut m, &l, 0, chunk);
    }
}

#[test]
fn shared_memory_needs_the_agents_unix_socket() {
    let dir = fixtures(&NAMES[..1]);
    let a = agent::start(&[("c", dir.path().to_path_buf())]);
    let (remote, _) = configs(dir.path()).swap_remove(1);
    let addr = a.control_addr().to_string();
    let e = AgentMegatron::open_over(control(&a), &remote, "", Over::Shm { slots: None })
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "transport=shm: the agent at {addr} has no Unix socket; start it on this host \
             with `dquant serve --socket PATH` and use that path as its address"
        )
    );
}

#[test]
fn a_document_index_over_the_agents_limit_is_refused_and_the_agent_serves_on() {
    let dir = fixtures(&NAMES[..1]);
    let mut c = agent::config(&[("c", dir.path().to_path_buf())]);
    c.limits.max_megatron_index_entries = 1000;
    let a = dquant_agent::start(c).unwrap();
    let (mut remote, _) = configs(dir.path()).swap_remove(1);
    // Many epochs of the train split's 25 documents: samples far under max_megatron_samples.
    remote.num_samples = [Some(200_000), None, None];
    let e = AgentMegatron::open(control(&a), &remote, "").err().unwrap();
    let m = e.to_string();
    assert!(
        m.starts_with("c/r50k_int32 (train split): the document index would hold ")
            && m.ends_with(" epochs), above the limit of 1000 (limits.max_megatron_index_entries)"),
        "{m}"
    );
    let (small, local) = configs(dir.path()).swap_remove(1);
    let mut m = AgentMegatron::open(control(&a), &small, "").unwrap();
    assert_batch_equals_local(&mut m, &local_build(&local), 0, &[0, 1]);
}

/// A source truncated under a session (the agent maps Megatron `.bin` files) fails the reads
/// that meet its missing bytes with an error naming the file, where an unguarded map would
/// end the agent with SIGBUS; the agent serves on, and another source's build reads whole.
#[test]
fn a_source_truncated_under_a_session_fails_its_reads_and_the_agent_serves_on() {
    let (dir, a) = served();
    let (remote, local) = configs(dir.path()).swap_remove(1);
    let l = local_build(&local);
    for over in [Over::Tcp, Over::Shm { slots: None }] {
        let mut m = open_over(&a, &remote, "", over);
        assert_batch_equals_local(&mut m, &l, 0, &[0, 1]);
    }
    let mut m = open_over(&a, &remote, "", Over::Tcp);
    let bin = dir.path().join("r50k_int32.bin");
    let len = std::fs::metadata(&bin).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let all: Vec<u64> = (0..500).collect();
    let e = all
        .chunks(50)
        .find_map(|c| m.batch(0, c).err())
        .expect("a read past the file's new end failed")
        .to_string();
    // The file as the agent names it: under its root, never the host's path.
    let want = format!(
        "megatron:c/r50k_int32: r50k_int32.bin: the file is shorter than when it was opened \
         ({len} bytes; a read needed "
    );
    assert!(
        e.starts_with(&want) && e.ends_with("it was truncated or rewritten while being read"),
        "{e}"
    );
    let (mut other, mut other_local) = configs(dir.path()).swap_remove(1);
    for (c, at) in [
        (&mut other, "c/r50k_uint16".to_string()),
        (
            &mut other_local,
            dir.path().join("r50k_uint16").display().to_string(),
        ),
    ] {
        c.blend.as_mut().unwrap().prefixes = vec![at];
    }
    let mut m = open_over(&a, &other, "", Over::Shm { slots: None });
    assert_batch_equals_local(&mut m, &local_build(&other_local), 0, &[0, 1, 499]);
}
