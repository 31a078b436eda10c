//! Property tests: decoding never panics, and what decodes re-encodes to the
//! same bytes.

use bytes::{Bytes, BytesMut};
use pgfresh_wire::{
    build, decode_backend, decode_frontend, decode_startup, parse_backend, parse_frontend,
    BackendMessage, Decoded, ErrorResponse, Frame, FrontendMessage, Limits, StartupPacket,
    TxStatus,
};
use proptest::prelude::*;

fn small_limits() -> Limits {
    Limits {
        max_message: 256,
        max_startup: 128,
    }
}

/// Runs the whole client-side pipeline over `input`; returns the frames.
fn drive_frontend(input: &[u8], limits: &Limits) -> Vec<Frame> {
    let mut buf = BytesMut::from(input);
    let mut frames = Vec::new();
    loop {
        match decode_startup(&mut buf, limits) {
            Ok(Decoded::Frame(StartupPacket::Startup(_))) => break,
            Ok(Decoded::Frame(_)) => continue,
            Ok(Decoded::Incomplete { .. }) | Err(_) => return frames,
        }
    }
    while let Ok(Decoded::Frame(f)) = decode_frontend(&mut buf, limits) {
        let _ = parse_frontend(&f);
        frames.push(f);
    }
    frames
}

fn drive_backend(input: &[u8], limits: &Limits) -> Vec<Frame> {
    let mut buf = BytesMut::from(input);
    let mut frames = Vec::new();
    while let Ok(Decoded::Frame(f)) = decode_backend(&mut buf, limits) {
        if let Ok(BackendMessage::ErrorResponse(e) | BackendMessage::NoticeResponse(e)) =
            parse_backend(&f)
        {
            let _ = e.fields().count();
            let _ = ErrorResponse::from_fields(&e);
        }
        frames.push(f);
    }
    frames
}

/// A well-framed message with any tag and a random body.
fn random_frame() -> impl Strategy<Value = Vec<u8>> {
    (any::<u8>(), prop::collection::vec(any::<u8>(), 0..48)).prop_map(|(tag, body)| {
        let mut out = vec![tag];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(&body);
        out
    })
}

/// A string without NUL bytes, as the protocol can carry.
fn cstring() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,24}"
}

fn frontend_message() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        cstring().prop_map(|s| build::query(&s)),
        (
            cstring(),
            cstring(),
            prop::collection::vec(any::<u32>(), 0..6)
        )
            .prop_map(|(n, s, t)| build::parse(&n, &s, &t)),
        (
            cstring(),
            cstring(),
            prop::collection::vec(any::<i16>(), 0..4),
            prop::collection::vec(
                prop::option::of(prop::collection::vec(any::<u8>(), 0..12)),
                0..5
            ),
            prop::collection::vec(any::<i16>(), 0..4),
        )
            .prop_map(|(p, s, pf, params, rf)| {
                let params: Vec<Option<&[u8]>> = params.iter().map(|p| p.as_deref()).collect();
                build::bind(&p, &s, &pf, &params, &rf)
            }),
        (prop::sample::select(vec![b'S', b'P']), cstring())
            .prop_map(|(k, n)| build::describe(k, &n)),
        (prop::sample::select(vec![b'S', b'P']), cstring()).prop_map(|(k, n)| build::close(k, &n)),
        (cstring(), any::<i32>()).prop_map(|(p, m)| build::execute(&p, m)),
        Just(build::sync()),
        Just(build::flush()),
        Just(build::copy_done()),
        prop::collection::vec(any::<u8>(), 0..32).prop_map(|d| build::copy_data(&d)),
        cstring().prop_map(|s| build::copy_fail(&s)),
        prop::collection::vec(any::<u8>(), 0..32).prop_map(|d| build::sasl_response(&d)),
    ]
}

/// Rebuilds a parsed client message with the builders.
fn rebuild(msg: &FrontendMessage<'_>) -> Bytes {
    match msg {
        FrontendMessage::Query { sql } => build::query(sql),
        FrontendMessage::Parse {
            name,
            sql,
            param_types,
        } => build::parse(name, sql, param_types),
        FrontendMessage::Bind {
            portal,
            statement,
            params,
        } => build::bind(
            portal,
            statement,
            &params.param_formats().collect::<Vec<_>>(),
            &params.values().collect::<Vec<_>>(),
            &params.result_formats().collect::<Vec<_>>(),
        ),
        FrontendMessage::Describe { kind, name } => build::describe(*kind, name),
        FrontendMessage::Execute { portal, max_rows } => build::execute(portal, *max_rows),
        FrontendMessage::Close { kind, name } => build::close(*kind, name),
        FrontendMessage::Sync => build::sync(),
        FrontendMessage::Flush => build::flush(),
        FrontendMessage::CopyData(d) => build::copy_data(d),
        FrontendMessage::CopyDone => build::copy_done(),
        FrontendMessage::CopyFail { message } => build::copy_fail(message),
        FrontendMessage::Terminate => build::terminate(),
        FrontendMessage::Password(d) => build::sasl_response(d),
        FrontendMessage::FunctionCall => unreachable!("not generated"),
    }
}

fn backend_message() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        (cstring(), cstring()).prop_map(|(n, v)| build::parameter_status(&n, &v)),
        prop::sample::select(vec![
            TxStatus::Idle,
            TxStatus::InTransaction,
            TxStatus::Failed
        ])
        .prop_map(build::ready_for_query),
        cstring().prop_map(|t| build::command_complete(&t)),
        (any::<i32>(), cstring(), cstring())
            .prop_map(|(p, c, v)| build::notification_response(p, &c, &v)),
        (
            cstring(),
            cstring(),
            prop::option::of(cstring()),
            prop::option::of(cstring())
        )
            .prop_map(|(code, msg, detail, hint)| {
                let mut e = ErrorResponse::error(code, msg);
                e.detail = detail;
                e.hint = hint;
                e.to_bytes()
            }),
        any::<[u8; 4]>().prop_map(build::auth_md5),
        prop::collection::vec(any::<u8>(), 0..32).prop_map(|d| build::auth_sasl_continue(&d)),
    ]
}

fn rebuild_backend(msg: &BackendMessage<'_>) -> Bytes {
    use pgfresh_wire::Auth;
    match msg {
        BackendMessage::ParameterStatus { name, value } => build::parameter_status(name, value),
        BackendMessage::ReadyForQuery(s) => build::ready_for_query(*s),
        BackendMessage::CommandComplete { tag } => build::command_complete(tag),
        BackendMessage::NotificationResponse {
            pid,
            channel,
            payload,
        } => build::notification_response(*pid, channel, payload),
        BackendMessage::ErrorResponse(f) => ErrorResponse::from_fields(f).to_bytes(),
        BackendMessage::Authentication(Auth::Md5Password { salt }) => build::auth_md5(*salt),
        BackendMessage::Authentication(Auth::SaslContinue(d)) => build::auth_sasl_continue(d),
        other => unreachable!("not generated: {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = drive_frontend(&input, &Limits::default());
        let _ = drive_frontend(&input, &small_limits());
        let _ = drive_backend(&input, &Limits::default());
        let _ = drive_backend(&input, &small_limits());
    }

    #[test]
    fn frames_reencode_to_the_same_bytes(
        frames in prop::collection::vec(random_frame(), 0..8),
        tail in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        let mut input: Vec<u8> = frames.concat();
        input.extend_from_slice(&tail);
        let mut buf = BytesMut::from(&input[..]);
        let mut consumed = Vec::new();
        let mut count = 0;
        while let Ok(Decoded::Frame(f)) = decode_backend(&mut buf, &Limits::default()) {
            let again = Frame::from_raw(f.raw.clone());
            prop_assert_eq!(again.as_ref(), Ok(&f));
            // Parsing a frame with a random body fails or succeeds, never panics.
            let _ = parse_backend(&f);
            let _ = parse_frontend(&f);
            consumed.extend_from_slice(&f.raw);
            count += 1;
        }
        prop_assert!(count >= frames.len());
        consumed.extend_from_slice(&buf);
        prop_assert_eq!(consumed, input);
    }

    #[test]
    fn valid_streams_survive_any_chunking(
        msgs in prop::collection::vec(frontend_message(), 1..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let mut stream = build::startup(&[("user", "u")]).to_vec();
        for m in &msgs {
            stream.extend_from_slice(m);
        }
        let whole = drive_frontend(&stream, &Limits::default());
        prop_assert_eq!(whole.len(), msgs.len());

        // Feed the same bytes in pieces.
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len())).collect();
        points.push(stream.len());
        points.sort_unstable();
        let mut buf = BytesMut::new();
        let mut started = false;
        let mut frames = Vec::new();
        let mut from = 0;
        for to in points {
            buf.extend_from_slice(&stream[from..to]);
            from = to;
            if !started {
                match decode_startup(&mut buf, &Limits::default()).unwrap() {
                    Decoded::Frame(_) => started = true,
                    Decoded::Incomplete { .. } => continue,
                }
            }
            while let Decoded::Frame(f) = decode_frontend(&mut buf, &Limits::default()).unwrap() {
                frames.push(f);
            }
        }
        prop_assert_eq!(frames, whole);
    }

    #[test]
    fn frontend_messages_round_trip(bytes in frontend_message()) {
        let mut buf = BytesMut::from(&bytes[..]);
        let Decoded::Frame(f) = decode_frontend(&mut buf, &Limits::default()).unwrap() else {
            panic!("incomplete")
        };
        prop_assert!(buf.is_empty());
        let parsed = parse_frontend(&f).unwrap();
        prop_assert_eq!(rebuild(&parsed), bytes);
    }

    #[test]
    fn backend_messages_round_trip(bytes in backend_message()) {
        let mut buf = BytesMut::from(&bytes[..]);
        let Decoded::Frame(f) = decode_backend(&mut buf, &Limits::default()).unwrap() else {
            panic!("incomplete")
        };
        let parsed = parse_backend(&f).unwrap();
        prop_assert_eq!(rebuild_backend(&parsed), bytes);
    }

    #[test]
    fn startup_params_round_trip(
        params in prop::collection::vec((cstring().prop_filter("non-empty", |s| !s.is_empty()), cstring()), 0..8)
    ) {
        let refs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let bytes = build::startup(&refs);
        let mut buf = BytesMut::from(&bytes[..]);
        let limits = Limits { max_startup: 1 << 20, ..Limits::default() };
        let Decoded::Frame(StartupPacket::Startup(m)) = decode_startup(&mut buf, &limits).unwrap() else {
            panic!("not a startup message")
        };
        prop_assert_eq!(&m.params, &params);
        prop_assert_eq!(m.to_bytes(), bytes);
    }
}
