//! An agent's Prometheus page, as a scraper reads it: the tests that check what the agent
//! counts (sessions, refusals, block-cache hits) read the same page an operator would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// A free loopback port (bound and released: the agent binds it right after), drawn below
/// the kernel's ephemeral range (32768 and up): a port the kernel picks for another test's
/// connection or `:0` listener in the meantime can never be this one.
pub fn free_addr() -> SocketAddr {
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..1000 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let port = 20_000 + (h.finish() % 12_000) as u16;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port in 20000..32000")
}

/// The metrics page, over plain HTTP/1.0.
pub fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    assert!(
        page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"),
        "{page}"
    );
    page
}

/// The value of the series `name{labels}` (labels exactly as rendered), or 0.
pub fn value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}
