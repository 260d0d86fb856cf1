//! Catching the signals a client forwards to its unit: SIGINT, SIGTERM, SIGHUP and SIGQUIT.
//!
//! Installing a [`Forwarder`] replaces the default action of those signals for the whole
//! process for the rest of its life (tokio never restores it): the client no longer dies from
//! them, it reports them so that they can be sent to the unit as `Request::Signal`.

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The signals a client forwards, in Linux numbering.
pub const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Catches the forwarded signals. Needs a tokio runtime with signal support.
#[derive(Debug)]
pub struct Forwarder {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl Forwarder {
    /// Start catching SIGINT, SIGTERM, SIGHUP and SIGQUIT.
    pub fn install() -> io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next caught signal's number. Cancel-safe. Pends forever if the runtime's signal
    /// driver is gone.
    pub async fn recv(&mut self) -> i32 {
        loop {
            let got = tokio::select! {
                r = self.int.recv() => r.map(|()| libc::SIGINT),
                r = self.term.recv() => r.map(|()| libc::SIGTERM),
                r = self.hup.recv() => r.map(|()| libc::SIGHUP),
                r = self.quit.recv() => r.map(|()| libc::SIGQUIT),
            };
            match got {
                Some(signal) => return signal,
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// The next signal from `forwarder`, or never when there is none.
pub async fn next(forwarder: &mut Option<Forwarder>) -> i32 {
    match forwarder {
        Some(f) => f.recv().await,
        None => std::future::pending().await,
    }
}
