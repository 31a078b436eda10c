//! PgBouncer's `auth_file` format (userlist.txt): one user a line, `"name" "secret"`, each
//! field in double quotes (a quote inside written twice); the rest of a line is ignored,
//! as are empty lines and lines starting with `;` or `#`.

use crate::model::{is_md5_hash, AuthMethod, UserConfig};

/// One quoted field at the start of `s` (after blanks): its value and the rest.
fn quoted(s: &str) -> Option<(String, &str)> {
    let s = s.trim_start().strip_prefix('"')?;
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == '"' {
            if s[i + 1..].starts_with('"') {
                value.push('"');
                chars.next();
            } else {
                return Some((value, &s[i + 1..]));
            }
        } else {
            value.push(c);
        }
    }
    None
}

/// The users of a userlist, in file order. A line that is not two quoted fields is an
/// error naming the line.
pub fn parse(text: &str) -> Result<Vec<UserConfig>, String> {
    let mut users = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
            continue;
        }
        let parsed = quoted(trimmed).and_then(|(name, rest)| Some((name, quoted(rest)?.0)));
        let Some((name, secret)) = parsed else {
            return Err(format!(
                "line {}: expected \"user\" \"secret\" (each in double quotes)",
                n + 1
            ));
        };
        if name.is_empty() {
            return Err(format!("line {}: empty user name", n + 1));
        }
        users.push(user_with_secret(name, secret));
    }
    Ok(users)
}

/// A user known by `secret` (as PostgreSQL stores it, or a plain password): md5 hashes
/// check md5 logins; a verifier or a plain password, SCRAM logins.
pub fn user_with_secret(name: String, secret: String) -> UserConfig {
    let auth = if is_md5_hash(&secret) {
        AuthMethod::Md5
    } else {
        AuthMethod::ScramSha256
    };
    UserConfig {
        name,
        password: Some(secret),
        auth,
        server_user: None,
        server_password: None,
        admin: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_kinds_of_secret_and_pgbouncers_quoting() {
        let text = "; a comment\n\
                    \"alice\" \"SCRAM-SHA-256$4096:c2FsdA==$a:b\"\n\
                    \n\
                    \"bob\" \"md5d41d8cd98f00b204e9800998ecf8427e\" rest ignored\n\
                    \"car\"\"ol\" \"pa ss\"\"word\"\n";
        let users = parse(text).unwrap();
        let got: Vec<_> = users
            .iter()
            .map(|u| (u.name.as_str(), u.password.as_deref().unwrap(), u.auth))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "alice",
                    "SCRAM-SHA-256$4096:c2FsdA==$a:b",
                    AuthMethod::ScramSha256
                ),
                (
                    "bob",
                    "md5d41d8cd98f00b204e9800998ecf8427e",
                    AuthMethod::Md5
                ),
                ("car\"ol", "pa ss\"word", AuthMethod::ScramSha256),
            ]
        );
        assert!(users[0].password_is_verifier() && users[1].password_is_md5());
    }

    #[test]
    fn a_bad_line_is_named() {
        let err = parse("\"ok\" \"x\"\nnot quoted\n").unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(parse("\"unterminated \"x\"").is_err());
        assert!(parse("\"only one\"").is_err());
    }
}
