//! Support for the `session` fuzz target: a scripted PostgreSQL server, pgfresh proxies
//! in front of it, and a client that plays a fuzz input as a session.

pub mod backend;
pub mod checks;
pub mod client;
pub mod harness;
pub mod play;
pub mod script;
