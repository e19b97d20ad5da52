//! A real S3 server for tests, and a proxy that makes it misbehave.
//!
//! [`S3Server`] runs s3s-fs (the S3 server the benchmark lab uses) in this process, on a
//! loopback port, over a temporary directory: a bucket is a directory, an object a file, so
//! a test puts objects by writing files and damages them the same way. Credentials are
//! [`ACCESS_KEY`] / [`SECRET_KEY`]; requests are signed and checked as by any S3 server.
//!
//! [`FaultProxy`] forwards TCP to it and, when told, cuts responses part-way through their
//! body (a server or network that drops connections mid-body) or answers nothing at all (a
//! stalled server), so the clients' retries and timeouts are tested against real sockets.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tempfile::TempDir;

pub const ACCESS_KEY: &str = "dquant-test-access";
pub const SECRET_KEY: &str = "dquant-test-secret-key";

/// s3s-fs serving a temporary directory on `127.0.0.1`.
pub struct S3Server {
    dir: TempDir,
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl S3Server {
    /// Starts the server; it stops when dropped.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for s3s-fs");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3s-fs")
            .enable_all()
            .build()
            .expect("tokio runtime for s3s-fs");
        let fs = s3s_fs::FileSystem::new(dir.path()).expect("s3s-fs over the temp dir");
        let mut b = S3ServiceBuilder::new(fs);
        b.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = b.build();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind s3s-fs on loopback");
        let addr = listener.local_addr().expect("s3s-fs address");
        rt.spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                let conn = ConnBuilder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(sock), service.clone())
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        S3Server {
            dir,
            addr,
            rt: Some(rt),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The directory the server serves: `DIR/BUCKET/KEY` is object `KEY` of `BUCKET`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Creates `bucket` (a directory) if it is not there.
    pub fn bucket(&self, bucket: &str) -> PathBuf {
        let p = self.dir.path().join(bucket);
        std::fs::create_dir_all(&p).expect("create bucket dir");
        p
    }

    /// Writes object `key` of `bucket` (creating both as needed).
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) -> PathBuf {
        let p = self.bucket(bucket).join(key);
        std::fs::create_dir_all(p.parent().expect("key has a parent")).expect("key dirs");
        std::fs::write(&p, bytes).expect("write object");
        p
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// What a [`FaultProxy`] does to the connections it accepts from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways.
    Pass,
    /// Close each of the next `times` connections once `after` bytes of response have gone
    /// through (headers and the start of a body); later connections pass.
    Cut { after: usize, times: usize },
    /// Read requests, answer nothing, keep the connection open.
    Stall,
}

/// A TCP proxy on `127.0.0.1` in front of `target`.
pub struct FaultProxy {
    addr: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    cuts: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    pub fn start(target: SocketAddr, fault: Fault) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let p = FaultProxy {
            addr,
            fault: Arc::new(Mutex::new(fault)),
            cuts: Arc::default(),
            stop: Arc::default(),
        };
        let (fault, cuts, stop) = (p.fault.clone(), p.cuts.clone(), p.stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let plan = {
                    let mut f = fault.lock().expect("fault lock");
                    let plan = *f;
                    if let Fault::Cut { after, times } = *f {
                        *f = if times > 1 {
                            Fault::Cut {
                                after,
                                times: times - 1,
                            }
                        } else {
                            Fault::Pass
                        };
                    }
                    plan
                };
                let cuts = cuts.clone();
                let stop = stop.clone();
                std::thread::spawn(move || serve(client, target, plan, &cuts, &stop));
            }
        });
        p
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock().expect("fault lock") = fault;
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(
    client: TcpStream,
    target: SocketAddr,
    plan: Fault,
    cuts: &AtomicUsize,
    stop: &AtomicBool,
) {
    if plan == Fault::Stall {
        let mut c = client;
        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 4096];
        while !stop.load(Ordering::SeqCst) {
            match c.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
        return;
    }
    let Ok(server) = TcpStream::connect(target) else {
        return;
    };
    let (mut c_in, mut s_out) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_in, &mut s_out);
        let _ = s_out.shutdown(Shutdown::Write);
    });
    let limit = match plan {
        Fault::Cut { after, .. } => Some(after),
        _ => None,
    };
    let (mut s_in, mut c_out) = (server, client);
    let mut sent = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match s_in.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let n = limit.map_or(n, |l| n.min(l - sent));
        if c_out.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n;
        if limit == Some(sent) {
            cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
    }
    let _ = c_out.shutdown(Shutdown::Both);
    let _ = s_in.shutdown(Shutdown::Both);
    let _ = up.join();
}
