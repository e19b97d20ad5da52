//! The data plane's TLS connection: both halves at once in both directions, byte-exact;
//! and the handshake's refusals, each with the message that says what to fix.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;

use dquant_testkit::tls::{make_pki, TestPki};
use dquant_transport::{ClientTls, DataStream, ServerTls, TlsError};

fn pki(names: &[&str]) -> (tempfile::TempDir, TestPki) {
    pki_of("agent", names)
}

fn pki_of(prefix: &str, names: &[&str]) -> (tempfile::TempDir, TestPki) {
    let dir = tempfile::tempdir().unwrap();
    let p = make_pki(dir.path(), prefix, names);
    (dir, p)
}

/// A pattern of `len` bytes, different per `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 2_654_435_761) >> 7) as u8 ^ seed)
        .collect()
}

/// Writes `data` on `w` in uneven pieces while the caller reads.
fn send(mut w: DataStream, data: Vec<u8>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut at = 0;
        let mut step = 1;
        while at < data.len() {
            let k = step.min(data.len() - at);
            w.write_all(&data[at..at + k]).unwrap();
            at += k;
            step = step * 3 % 200_003 + 1;
        }
        let _ = w.socket().shutdown(std::net::Shutdown::Write);
    })
}

/// Sends `out` on one handle of `conn` while reading the other to its end: what arrived.
fn exchange(conn: DataStream, out: Vec<u8>) -> Vec<u8> {
    let writer = send(conn.try_clone().unwrap(), out);
    let mut got = Vec::new();
    let mut r = conn;
    r.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    got
}

/// Each end writes on one handle and reads on another, at the same time: what arrives is
/// what was sent, byte for byte, in both directions.
#[test]
fn both_halves_carry_bytes_exactly_in_both_directions() {
    let (_dir, p) = pki(&["localhost", "127.0.0.1"]);
    let server = ServerTls::from_files(&p.cert, &p.key).unwrap();
    let client = ClientTls::from_ca_file(&p.ca).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let up = pattern(1, 3 << 20);
    let down = pattern(2, 24 << 20);
    let (up2, down2) = (up.clone(), down.clone());
    let agent = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let conn = server.accept(s).unwrap();
        assert!(conn.is_tls());
        let got = exchange(conn, down2);
        assert!(
            got == up2,
            "client to agent: {} bytes of {}",
            got.len(),
            up2.len()
        );
    });
    let conn = client
        .connect(TcpStream::connect(addr).unwrap(), &addr.to_string())
        .unwrap();
    let got = exchange(conn, up);
    agent.join().unwrap();
    assert!(
        got == down,
        "agent to client: {} bytes of {}",
        got.len(),
        down.len()
    );
}

/// Runs a handshake against an agent with `p`'s certificate, as `client` dialing it at
/// 127.0.0.1; the client's error, with the agent's port replaced by PORT.
fn refused(p: &TestPki, client: &ClientTls) -> String {
    let server = ServerTls::from_files(&p.cert, &p.key).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let agent = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        server.accept(s).map(|_| ()).unwrap_err()
    });
    let e = client
        .connect(TcpStream::connect(addr).unwrap(), &addr.to_string())
        .map(|_| ())
        .unwrap_err();
    let _ = agent.join().unwrap();
    e.to_string().replace(&addr.port().to_string(), "PORT")
}

#[test]
fn a_certificate_from_another_ca_or_for_another_name_is_refused_saying_why() {
    let (_dir, p) = pki(&["localhost", "127.0.0.1"]);
    let (_other_dir, other) = pki_of("other", &["localhost", "127.0.0.1"]);
    let stranger = ClientTls::from_ca_file(&other.ca).unwrap();
    assert_eq!(
        refused(&p, &stranger),
        "TLS handshake with 127.0.0.1:PORT failed: invalid peer certificate: UnknownIssuer \
         (the agent's certificate is not signed by a CA this client trusts: check \
         DQUANT_TLS_CA)"
    );
    let trusting = ClientTls::from_ca_file(&p.ca).unwrap();
    let named = trusting.clone().with_name("storage-7.example").unwrap();
    assert_eq!(
        refused(&p, &named),
        "TLS handshake with 127.0.0.1:PORT failed: invalid peer certificate: certificate not \
         valid for name \"storage-7.example\"; certificate is only valid for \
         DnsName(\"localhost\") or IpAddress(127.0.0.1) (the agent's certificate does not \
         name the host dialed: dial a name it carries, or set DQUANT_TLS_NAME)"
    );
}

#[test]
fn bad_files_are_named_in_the_error() {
    let (dir, p) = pki(&["localhost"]);
    let missing = dir.path().join("nope.pem");
    let e = ClientTls::from_ca_file(&missing).unwrap_err();
    assert!(matches!(e, TlsError::Read { .. }));
    assert_eq!(
        e.to_string(),
        format!(
            "TLS CA {}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    assert_eq!(
        ClientTls::from_ca_file(&p.key).unwrap_err().to_string(),
        format!(
            "TLS CA {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            p.key.display()
        )
    );
    assert_eq!(
        ServerTls::from_files(&p.cert, &p.cert)
            .unwrap_err()
            .to_string(),
        format!(
            "TLS key {}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)",
            p.cert.display()
        )
    );
    assert_eq!(
        ClientTls::from_ca_file(&p.ca)
            .unwrap()
            .with_name("not a name")
            .unwrap_err()
            .to_string(),
        "\"not a name\" cannot be checked against a certificate: it is neither a DNS name \
         nor an IP address"
    );
}
