//! dlock's torture run: worker processes lock keys and write to a fenced store while a
//! seeded nemesis injects faults, and a checker counts what went wrong.
//!
//! The `torture` binary drives it (see `dlock::guide::reliability`):
//! `torture <url> --minutes M --workers N --seed S [--faults LIST]`, or
//! `torture --local redis|cluster|redlock|sentinel|etcd|zk|postgres|mysql|file …` to start
//! its own servers (or, for `file`, a directory of lock files).
//!
//! | module | holds |
//! |---|---|
//! | [`clock`] | the monotonic clock every process stamps its events with |
//! | [`faults`] | the fault kinds and which targets they need |
//! | [`schedule`] | the seeded, printable, replayable fault plan |
//! | [`store`] | the fenced store's state machine |
//! | [`store_server`], [`store_client`] | its line protocol over loopback TCP |
//! | [`events`] | the lines a worker reports on its stdout |
//! | [`worker`] | the worker's loop |
//! | [`options`] | command-line options and their errors |
//! | [`urls`] | backend URLs: their addresses, rewritten through proxies |
//! | [`targets`] | what the nemesis can act on: workers, proxies, servers |
//! | [`sessions`] | ending a worker's session on PostgreSQL or MySQL |
//! | [`lock_files`] | `--local file`'s directory, taking a held lock file away |
//! | [`nemesis`] | runs the plan against the targets |
//! | [`checker`] | turns the history into the report's figures |
//! | [`report`] | prints them |
//! | [`timeline`] | the SVG picture of who held what |
//! | [`run`] | one whole run |
//! | [`soak`] | `torture soak`: hours of mixed traffic, sampled, judged on slopes |

#![forbid(unsafe_code)]

pub mod checker;
pub mod clock;
pub mod events;
pub mod faults;
pub mod lock_files;
pub mod nemesis;
pub mod options;
pub mod report;
pub mod run;
pub mod schedule;
pub mod sessions;
pub mod soak;
pub mod store;
pub mod store_client;
pub mod store_server;
pub mod targets;
pub mod timeline;
pub mod urls;
pub mod worker;
