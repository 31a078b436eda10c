//! Arbitrary bytes through every decoder of pgfresh-wire: the startup phase,
//! then client frames with their typed views, and the same bytes as a server
//! stream (CopyData bodies also as replication messages and `pgoutput`, as the WAL feed
//! reads them). Nothing may panic, and every frame must re-frame to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pgfresh_wire::auth::{parse_password_message, parse_sasl_initial_response};
use pgfresh_wire::bytes::BytesMut;
use pgfresh_wire::replication;
use pgfresh_wire::{
    decode_backend, decode_frontend, decode_startup, parse_backend, parse_frontend, BackendMessage,
    Decoded, ErrorResponse, Frame, FrontendMessage, Limits, StartupPacket,
};

fn check_frame(f: &Frame) {
    assert_eq!(Frame::from_raw(f.raw.clone()).as_ref(), Ok(f));
}

fn frontend(data: &[u8], limits: &Limits) {
    let mut buf = BytesMut::from(data);
    loop {
        match decode_startup(&mut buf, limits) {
            Ok(Decoded::Frame(StartupPacket::Startup(m))) => {
                let _ = (m.user(), m.database(), m.options());
                break;
            }
            Ok(Decoded::Frame(_)) => continue,
            Ok(Decoded::Incomplete { .. }) | Err(_) => return,
        }
    }
    while let Ok(Decoded::Frame(f)) = decode_frontend(&mut buf, limits) {
        check_frame(&f);
        if let Ok(FrontendMessage::Password(body)) = parse_frontend(&f) {
            let _ = parse_sasl_initial_response(body);
            let _ = parse_password_message(body);
        }
    }
}

fn backend(data: &[u8], limits: &Limits) {
    let mut buf = BytesMut::from(data);
    while let Ok(Decoded::Frame(f)) = decode_backend(&mut buf, limits) {
        check_frame(&f);
        if let Ok(BackendMessage::ErrorResponse(e) | BackendMessage::NoticeResponse(e)) =
            parse_backend(&f)
        {
            let n = e.fields().count();
            assert!(n >= [e.severity, e.code, e.message].iter().flatten().count());
            let _ = ErrorResponse::from_fields(&e).to_bytes();
        }
        if f.tag == b'd' {
            // A replication stream: what the WAL feed decodes.
            if let Ok(replication::StreamMessage::XLogData { data, .. }) =
                replication::parse_stream(&f.raw[5..])
            {
                let _ = replication::parse_pgoutput(data);
            }
        }
    }
    let _ = replication::parse_pgoutput(data);
}

fuzz_target!(|data: &[u8]| {
    let small = Limits {
        max_message: 1024,
        max_startup: 256,
    };
    frontend(data, &Limits::default());
    frontend(data, &small);
    backend(data, &Limits::default());
    // Tagged frames straight away, as a client that skipped the startup.
    let mut buf = BytesMut::from(data);
    while let Ok(Decoded::Frame(f)) = decode_frontend(&mut buf, &small) {
        let _ = parse_frontend(&f);
    }
});
