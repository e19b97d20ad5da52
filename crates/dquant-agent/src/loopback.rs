//! The loopback plane: sessions of consumers in this agent's own process
//! (`?transport=loopback`, [`dquant_transport::loopback`]), served with no socket.
//!
//! The listener is found by the agent's data port; each offer counts against
//! `limits.max_handshakes` until its hello is checked and gets a thread, as a connection on
//! the other planes does. A plan's batches go into the session's queue in the output dtype,
//! as into a ring; a source session (ranges for a chained agent) is refused, since a chained
//! agent is another process.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use dquant_transport::loopback::{Listener, LoopbackSink, Offer};
use dquant_transport::Hello;

use crate::accept::serve_each;
use crate::carrier::{self, Carrier, Claimed, Notice, Refusal};
use crate::produce::Stats;
use crate::serve_plan::stream_in_memory;
use crate::sessions::Work;
use crate::stream_error::StreamError;
use crate::Shared;

/// How often the accept loop looks whether the agent is stopping.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Listens for this process's consumers of the agent whose data port is `port`, on a thread
/// of its own, until the agent stops. Another agent of the process on the same port number
/// (the other address family) keeps the listener; this one is then logged and serves no
/// loopback sessions.
pub(crate) fn listen(port: u16, shared: &Arc<Shared>) -> std::io::Result<()> {
    let Some(listener) = Listener::bind(port) else {
        tracing::warn!(port, "another agent in this process serves loopback sessions on this data port; this one does not");
        return Ok(());
    };
    let shared = shared.clone();
    std::thread::Builder::new()
        .name("dquant-accept-loopback".into())
        .spawn(move || accept_loop(listener, shared))
        .map(drop)
}

fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    let stopping = shared.clone();
    let offers = std::iter::from_fn(|| loop {
        if stopping.stopping.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(offer) = listener.accept(STOP_CHECK) {
            return Some(Ok(offer));
        }
    });
    let refuse_busy = |offer: Offer, msg: &str| offer.refuse(msg);
    serve_each(
        offers,
        &stopping,
        "loopback",
        "dquant-loopback",
        refuse_busy,
        move |offer, hs| {
            let conn = LoopbackConn { offer };
            carrier::serve(conn, &shared, hs)
        },
    );
}

/// A consumer's offer of a queue for its session's records.
struct LoopbackConn {
    offer: Offer,
}

impl Carrier for LoopbackConn {
    const TRANSPORT: &'static str = "loopback";
    const PLANE: &'static str = "loopback";
    const WHAT: &'static str = "data stream";
    /// The producer's end of the session's queue.
    type Ready = LoopbackSink;

    fn hello(&self) -> &Hello {
        &self.offer.hello
    }

    fn peer(&self) -> &str {
        "this process"
    }

    /// None: the queue's waits watch the cancel flag.
    fn hangup(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn refuse(&self, message: &str) {
        self.offer.refuse(message)
    }

    fn ready(&mut self, session: &Claimed<'_>) -> Result<Self::Ready, Refusal> {
        Ok(self.offer.accept(session.cancel.clone()))
    }

    /// A panic is told through the queue, whose sink the panic dropped.
    fn panic_notice(&self) -> Option<Notice> {
        let offer = self.offer.clone();
        Some(Box::new(move |m: &str| offer.refuse(m)))
    }

    fn carry(
        self,
        mut sink: Self::Ready,
        work: Work,
        session: Claimed<'_>,
    ) -> Result<Stats, StreamError> {
        let Claimed {
            shared,
            owner,
            cancel,
        } = session;
        let meter = work
            .meter(&shared.metrics, owner)
            .with_tally(shared.events.tally(owner));
        let not_ranges = "loopback sessions carry plan batches; a chained agent opens sources over the data port";
        stream_in_memory(work, &mut sink, &cancel, shared, meter, not_ranges)
    }
}
