//! The PostgreSQL v3 wire protocol as pgfresh speaks it, over [`bytes`].
//!
//! This crate has no sockets, no configuration and no SQL analysis. It turns
//! byte streams into frames and frames into typed views, builds the frames
//! the proxy sends, and runs authentication exchanges:
//!
//! * [`framing`]: startup-phase packets and tagged frames, with every length
//!   checked against [`Limits`] before it is used. Frames keep their original
//!   bytes so they can be forwarded without copying.
//! * [`frontend`] / [`backend`]: borrowing views of the messages the proxy
//!   inspects, parsed on demand from a [`Frame`].
//! * [`build`]: complete frames for everything the proxy sends.
//! * [`sqlstate`] and [`ErrorResponse`]: errors in PostgreSQL's format.
//! * [`auth`]: SCRAM-SHA-256 (server and client side) and md5.
//! * [`replication`]: the streaming-replication messages inside CopyData and the
//!   `pgoutput` messages a reader of written relations needs.
//!
//! Decoding never panics on any input and never allocates from a length or
//! count that has not been checked against the bytes actually present.

/// The `bytes` crate this API is expressed in, re-exported so users need not
/// pin a matching version.
pub use bytes;

pub mod auth;
pub mod backend;
pub mod batch;
pub mod build;
mod cursor;
pub mod error;
pub mod framing;
pub mod frontend;
pub mod replication;
pub mod sqlstate;
mod startup;

pub use auth::{AuthError, ScramClient, ScramServer, ScramVerifier};
pub use backend::{parse_backend, Auth, BackendMessage, ErrorFields, TxStatus};
pub use batch::{lone_query, lone_statement, named_batch, unnamed_batch, NamedBatch, UnnamedBatch};
pub use error::{ErrorResponse, Severity};
pub use framing::{
    decode_backend, decode_frame, decode_frontend, decode_startup, frame_at, CancelKey, Decoded,
    Frame, FrameError, Limits, StartupMessage, StartupPacket,
};
pub use frontend::{non_utf8_text, parse_frontend, BindParams, FrontendMessage, NonUtf8Text};
pub use startup::{CANCEL_REQUEST_CODE, GSSENC_REQUEST_CODE, PROTOCOL_3_0, SSL_REQUEST_CODE};
