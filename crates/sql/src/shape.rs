//! Literal-free shapes of SQL text, used as a second cache key.
//!
//! Applications that inline values (`... WHERE id = 42`, `... = 'abc'`) send a new text
//! for every call, so a cache keyed by text alone misses every time and each statement
//! pays a full parse. A statement's classification does not depend on the values of its
//! literals, only on everything else, so texts that differ only in literals can share one
//! analysis. [`literal_shape`] replaces each string and number literal with `?` and keeps
//! every other character (keywords, identifiers, quoted identifiers, operators, comments
//! with their routing hints) exactly as written.
//!
//! The lexing follows PostgreSQL's rules with `standard_conforming_strings = on`, as the
//! parser pgfresh uses does. Anything unusual (an unterminated literal or comment, a number
//! followed directly by letters) gives no shape, and the text is cached as it is.

/// The first character of every shape, so a shape never equals a real statement text.
pub const SHAPE_MARK: char = '\u{1}';

/// The text with its literals replaced by `?`, or `None` when the text has no literal
/// or cannot be lexed with confidence.
pub fn literal_shape(sql: &str) -> Option<String> {
    let mut out = String::new();
    literal_shape_into(sql, &mut out).then_some(out)
}

/// [`literal_shape`] written into `out` (cleared first, its capacity reused): says
/// whether `sql` has a shape. `out` is left empty or partly written when it has none.
pub fn literal_shape_into(sql: &str, out: &mut String) -> bool {
    out.clear();
    shape(sql, out).is_some()
}

fn shape(sql: &str, out: &mut String) -> Option<()> {
    let b = sql.as_bytes();
    let mut i = 0;
    let mut copied = 0; // start of the run not yet copied to `out`
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
    loop {
        i = next_candidate(b, i);
        let Some(&c) = b.get(i) else { break };
        if !STARTS_TOKEN[usize::from(c)] {
            i += 1;
            continue;
        }
        let prev_ident = i > 0 && ident(b[i - 1]);
        match c {
            b'-' if b.get(i + 1) == Some(&b'-') => {
                i = sql[i..].find('\n').map_or(b.len(), |n| i + n + 1);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                // Block comments nest in PostgreSQL.
                let mut depth = 0usize;
                loop {
                    if i + 1 >= b.len() {
                        return None;
                    }
                    if b[i] == b'/' && b[i + 1] == b'*' {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b[i + 1] == b'/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'"' => {
                i = end_of_quoted(b, i, b'"', false)?;
            }
            b'\'' => {
                // E'...' strings take backslash escapes; B'', X'', U&'' and N'' are
                // prefixes that stay in the shape as identifier characters.
                let escapes =
                    i > 0 && matches!(b[i - 1], b'e' | b'E') && !(i > 1 && ident(b[i - 2]));
                let end = end_of_quoted(b, i, b'\'', escapes)?;
                placeholder(out, sql, copied, i);
                i = end;
                copied = i;
            }
            b'$' if !prev_ident => {
                // $1 parameters stay; $tag$ ... $tag$ strings are literals.
                let rest = &b[i + 1..];
                let n = rest
                    .iter()
                    .position(|&x| !(x.is_ascii_alphanumeric() || x == b'_' || x >= 0x80))
                    .unwrap_or(rest.len());
                let tag_end = i + 1 + n;
                if b.get(tag_end) != Some(&b'$') || rest.first().is_some_and(u8::is_ascii_digit) {
                    i = tag_end.max(i + 1);
                    continue;
                }
                let tag = &sql[i..=tag_end];
                let body = tag_end + 1;
                let close = sql[body..].find(tag)? + body;
                placeholder(out, sql, copied, i);
                i = close + tag.len();
                copied = i;
            }
            b'0'..=b'9' | b'.'
                if !prev_ident && (c != b'.' || b.get(i + 1).is_some_and(u8::is_ascii_digit)) =>
            {
                let end = end_of_number(b, i)?;
                placeholder(out, sql, copied, i);
                i = end;
                copied = i;
            }
            _ => i += 1,
        }
    }
    if out.is_empty() {
        // No literal.
        return None;
    }
    out.push_str(&sql[copied..]);
    Some(())
}

/// Bytes that may start a comment, a quoted token, a literal or a parameter; the scan
/// skips every other byte without looking further.
const STARTS_TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let specials = b"-/\"'$.0123456789";
    let mut k = 0;
    while k < specials.len() {
        t[specials[k] as usize] = true;
        k += 1;
    }
    t
};

/// Index of the first byte at or after `i` that may start a token (see [`STARTS_TOKEN`]):
/// every such byte lies in `"`..=`9` (0x22 to 0x39), so eight bytes are ruled out at a
/// time while none is in that range (a word-at-a-time test that is exact for each byte;
/// what it finds is checked against the table by the caller).
fn next_candidate(b: &[u8], mut i: usize) -> usize {
    const LOW7: u64 = u64::from_ne_bytes([0x7f; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    // Bytes x with 0x21 < x < 0x3a: (127 + 0x3a - x7) and (x7 + 127 - 0x21) both carry
    // into the high bit, where x7 is the byte's low seven bits and its own high bit is
    // clear (no byte of 0x80 or more starts a token).
    const ABOVE: u64 = ONES * (127 + 0x3a);
    const BELOW: u64 = ONES * (127 - 0x21);
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let x7 = w & LOW7;
        let found = (ABOVE - x7) & !w & (x7 + BELOW) & HIGH;
        if found != 0 {
            return i + (found.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < b.len() && !(0x22..=0x39).contains(&b[i]) {
        i += 1;
    }
    i
}

/// Appends `sql[copied..literal]` and a `?` for the literal at `literal`, starting the
/// shape at the first literal.
fn placeholder(out: &mut String, sql: &str, copied: usize, literal: usize) {
    if out.is_empty() {
        out.reserve(sql.len() + SHAPE_MARK.len_utf8());
        out.push(SHAPE_MARK);
    }
    out.push_str(&sql[copied..literal]);
    out.push('?');
}

/// Index just past the closing quote of a quoted token starting at `start`.
fn end_of_quoted(b: &[u8], start: usize, quote: u8, backslash: bool) -> Option<usize> {
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' if backslash => i += 2,
            q if q == quote => {
                if b.get(i + 1) == Some(&quote) {
                    i += 2; // doubled quote inside
                } else {
                    return Some(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// Index just past a plain decimal number (`12`, `1.5`, `.5`, `1e-3`); `None` for any
/// other form (hex, underscores, trailing letters), which is left to the parser.
fn end_of_number(b: &[u8], start: usize) -> Option<usize> {
    let digits = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut i = digits(start);
    if b.get(i) == Some(&b'.') && b.get(i + 1) != Some(&b'.') {
        i = digits(i + 1);
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if b.get(j).is_some_and(u8::is_ascii_digit) {
            i = digits(j);
        } else {
            return None;
        }
    }
    match b.get(i) {
        Some(&c) if c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 => None,
        _ => Some(i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(s: &str) -> Option<String> {
        literal_shape(s).map(|s| s.trim_start_matches(SHAPE_MARK).to_string())
    }

    #[test]
    fn literals_become_placeholders() {
        let cases = [
            (
                "SELECT abalance FROM pgbench_accounts WHERE aid = 4217",
                "SELECT abalance FROM pgbench_accounts WHERE aid = ?",
            ),
            (
                "SELECT * FROM t WHERE a = 'x''y' AND b = 1.5e-3",
                "SELECT * FROM t WHERE a = ? AND b = ?",
            ),
            ("SELECT E'a\\'b', $q$it's$q$, .5", "SELECT E?, ?, ?"),
            ("SELECT x'1F', b'01', U&'d\\0061t'", "SELECT x?, b?, U&?"),
            (
                "/* pgfresh:primary */ SELECT 1",
                "/* pgfresh:primary */ SELECT ?",
            ),
            (
                "SELECT t1.c2 FROM t1 WHERE c3 = $1 AND c4 = 7",
                "SELECT t1.c2 FROM t1 WHERE c3 = $1 AND c4 = ?",
            ),
            (
                "SELECT \"it's 5\" FROM t -- it's 5\nWHERE a = 5",
                "SELECT \"it's 5\" FROM t -- it's 5\nWHERE a = ?",
            ),
            (
                "SELECT 1 /* nested /* 2 */ 3 */ + 4",
                "SELECT ? /* nested /* 2 */ 3 */ + ?",
            ),
            ("SELECT a[1:2] FROM t", "SELECT a[?:?] FROM t"),
            (
                "UPDATE t SET a = 3 WHERE b = $1",
                "UPDATE t SET a = ? WHERE b = $1",
            ),
            ("SELECT $$x$$ || $1", "SELECT ? || $1"),
        ];
        for (sql, want) in cases {
            assert_eq!(shape(sql).as_deref(), Some(want), "{sql}");
        }
    }

    #[test]
    fn the_word_scan_finds_the_byte_the_table_would() {
        // Every byte value at every offset of a word, before and after the others.
        for c in 0..=255u8 {
            for at in 0..20 {
                let mut b = vec![b'a'; 20];
                b[at] = c;
                let naive = (0..b.len())
                    .find(|&k| STARTS_TOKEN[usize::from(b[k])])
                    .unwrap_or(b.len());
                let i = next_candidate(&b, 0);
                // It may stop early at a byte the table rejects, never late.
                assert!(i <= naive, "{c:#x} at {at}");
                assert!(
                    i == b.len() || (0x22..=0x39).contains(&b[i]),
                    "{c:#x} at {at}"
                );
                if (0x22..=0x39).contains(&c) {
                    assert_eq!(i, at, "{c:#x} at {at}");
                }
            }
        }
    }

    #[test]
    fn no_shape_without_literals_or_when_unsure() {
        for sql in [
            "SELECT a FROM t",
            "SELECT 'unterminated",
            "SELECT 1 /* open comment",
            "SELECT 1e",
            "SELECT 12abc",
            "SELECT 0x1F",
            "SELECT 1_000",
            "SELECT $a$ unterminated",
            "SELECT \"open identifier",
        ] {
            assert_eq!(shape(sql), None, "{sql}");
        }
    }

    #[test]
    fn identifiers_with_digits_are_kept() {
        assert_eq!(
            shape("SELECT c1, t2.x3 FROM t4 WHERE v = 9").as_deref(),
            Some("SELECT c1, t2.x3 FROM t4 WHERE v = ?")
        );
    }
}
