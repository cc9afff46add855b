//! Fault controls shared by every server kind: kill, stop, start again, pause, resume.
//!
//! Each server type owns one [`ServerProcess`] and knows its own readiness probe; this trait
//! adds, on top of those two, the operations fault tests use. They panic (at the caller's
//! line) with the harness error's message, because in a test a failed restart is a failed
//! test; the fallible versions are on [`ServerProcess`] via [`ServerControl::process_mut`].

use crate::error::HarnessResult;
use crate::servers::process::ServerProcess;

/// Kill / restart / pause operations on one server process.
pub trait ServerControl {
    /// The underlying process.
    fn process(&self) -> &ServerProcess;

    /// The underlying process, for the fallible operations.
    fn process_mut(&mut self) -> &mut ServerProcess;

    /// Blocks until the server answers its readiness probe (bounded; the error quotes its log).
    fn wait_ready(&mut self) -> HarnessResult<()>;

    /// The OS process id, `None` while stopped.
    fn pid(&self) -> Option<u32> {
        self.process().pid()
    }

    /// Whether the process is alive (paused counts as alive).
    fn is_running(&mut self) -> bool {
        self.process_mut().is_running()
    }

    /// Crashes the server with SIGKILL (no shutdown work, e.g. no Redis `SHUTDOWN` save).
    #[track_caller]
    fn kill9(&mut self) {
        if let Err(e) = self.process_mut().kill9() {
            panic!("{e}");
        }
    }

    /// Stops the server gracefully (SIGTERM, SIGKILL after 5 s). Its port and data stay
    /// reserved for [`ServerControl::start_again`].
    #[track_caller]
    fn stop(&mut self) {
        if let Err(e) = self.process_mut().stop() {
            panic!("{e}");
        }
    }

    /// Starts a stopped or killed server again, same port, same data dir, and waits until it
    /// is ready.
    #[track_caller]
    fn start_again(&mut self) {
        if let Err(e) = self.process_mut().start().and_then(|()| self.wait_ready()) {
            panic!("{e}");
        }
    }

    /// [`ServerControl::stop`], then [`ServerControl::start_again`].
    #[track_caller]
    fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing is answered.
    #[track_caller]
    fn pause(&mut self) {
        if let Err(e) = self.process_mut().pause() {
            panic!("{e}");
        }
    }

    /// Lets a paused server go on (SIGCONT).
    #[track_caller]
    fn resume(&mut self) {
        if let Err(e) = self.process_mut().resume() {
            panic!("{e}");
        }
    }
}
