//! The server against a fake unit manager (admission logic only; the backends are tested
//! against the real thing in `tests/`).

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use warden_proto::{Request, Response, PROTOCOL_VERSION};

use super::*;
use crate::config::{Config, Flags};
use crate::units::{RunningUnit, UnitName, UnitSpec};

/// A manager whose origin lookup never answers, and which counts the lookups.
struct SlowLookups {
    lookups: Arc<AtomicUsize>,
    cleanups: crate::units::cleanup::Cleanups,
}

struct NoUnit(UnitName);

impl RunningUnit for NoUnit {
    fn name(&self) -> &UnitName {
        &self.0
    }
    async fn wait(&mut self) -> Result<warden_proto::ExitReport, UnitError> {
        Err(UnitError::Unreachable("fake".into()))
    }
    async fn signal(&self, _: i32) -> Result<(), UnitError> {
        Ok(())
    }
    async fn stop(&mut self) -> Result<(), UnitError> {
        Ok(())
    }
}

impl UnitManager for SlowLookups {
    type Unit = NoUnit;
    fn backend(&self) -> &'static str {
        "fake"
    }
    async fn start(&self, _: UnitSpec) -> Result<NoUnit, UnitError> {
        Err(UnitError::Unreachable("fake".into()))
    }
    async fn cleanup_orphans(&self) -> Result<Vec<String>, UnitError> {
        Ok(Vec::new())
    }
    async fn main_pid_of(&self, _: u32) -> Option<u32> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
    fn cleanups(&self) -> &crate::units::cleanup::Cleanups {
        &self.cleanups
    }
}

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "this test needs root, and CI runs it as root"
    );
    eprintln!("skipped: needs root");
    false
}

/// Children of one unit connect (each a process of its own) while the unit manager never
/// answers: every one is admitted at once, and the unit is looked up once, not once per
/// process — the lookup is off the accept loop and cached per unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_origin_lookup_delays_no_one_and_runs_once_per_unit(
) -> Result<(), Box<dyn std::error::Error>> {
    if !root_or_skip() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("s");
    let flags = Flags {
        client_user: Some("root".into()),
        socket: Some(socket.clone()),
        unit_prefix: Some("warden_fake".into()),
        ..Flags::default()
    };
    let config = Config::merge(Default::default(), flags, Default::default())?;
    let account = Account {
        name: "root".into(),
        uid: 0,
        gid: 0,
        groups: vec![0],
        home: "/root".into(),
    };
    let lookups = Arc::new(AtomicUsize::new(0));
    let manager = SlowLookups {
        lookups: Arc::clone(&lookups),
        cleanups: Default::default(),
    };
    let shutdown = CancellationToken::new();
    let server = Server::new(config, account, manager, shutdown.clone());
    let serving = tokio::spawn(server.serve());
    let mut tries = 0;
    while !socket.exists() && tries < 500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        tries += 1;
    }
    // Six processes, each connects and says hello; each prints what it read.
    let script = "import socket,struct,sys,json\n\
        s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
        body=json.dumps({'type':'hello','version':int(sys.argv[2]),'client':'t'}).encode()\n\
        s.sendall(struct.pack('>I',len(body))+body)\n\
        n=struct.unpack('>I',s.recv(4))[0]; print(s.recv(n).decode())\n";
    let children: Vec<_> = (0..6)
        .map(|_| {
            tokio::process::Command::new("python3")
                .args(["-c", script])
                .arg(&socket)
                .arg(PROTOCOL_VERSION.to_string())
                .kill_on_drop(true)
                .output()
        })
        .collect();
    for out in children {
        let out = tokio::time::timeout(Duration::from_secs(20), out).await??;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("welcome"), "a child was not welcomed: {text}");
    }
    // And this process too, while the lookup is still unanswered.
    let mut conn = Conn::new(UnixStream::connect(&socket).await?);
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client: "test".into(),
    };
    conn.send(&hello, &[]).await?;
    let welcome = tokio::time::timeout(Duration::from_secs(5), conn.recv::<Response>()).await??;
    assert!(matches!(welcome, Some((Response::Welcome { .. }, _))));
    assert_eq!(
        lookups.load(Ordering::SeqCst),
        1,
        "one unit, one lookup, whatever its number of processes"
    );
    shutdown.cancel();
    serving.await??;
    Ok(())
}
