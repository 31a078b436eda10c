//! A map from prepared-statement names to `V` that keeps the unnamed statement (`""`)
//! out of the hash table.
//!
//! Drivers on the extended protocol parse, bind and run the unnamed statement for nearly
//! every statement (pgbench `-M extended`, JDBC before its prepare threshold, psycopg 3,
//! node-postgres without names): a session looks it up several times a statement (the
//! client's statement on Parse and Bind, what the connection holds when the unit is sent).
//! A slot of its own answers those without hashing a key.

/// Named values and the unnamed one.
#[derive(Debug)]
pub struct NameMap<V> {
    unnamed: Option<V>,
    named: foldhash::HashMap<String, V>,
}

impl<V> Default for NameMap<V> {
    fn default() -> Self {
        NameMap {
            unnamed: None,
            named: Default::default(),
        }
    }
}

impl<V> NameMap<V> {
    pub fn get(&self, name: &str) -> Option<&V> {
        if name.is_empty() {
            self.unnamed.as_ref()
        } else {
            self.named.get(name)
        }
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut V> {
        if name.is_empty() {
            self.unnamed.as_mut()
        } else {
            self.named.get_mut(name)
        }
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Sets `name` to `value`; returns what it held before.
    pub fn insert(&mut self, name: String, value: V) -> Option<V> {
        if name.is_empty() {
            self.unnamed.replace(value)
        } else {
            self.named.insert(name, value)
        }
    }

    /// Sets `name` to `value` without allocating a key when it is already there.
    pub fn set(&mut self, name: &str, value: V) {
        if name.is_empty() {
            self.unnamed = Some(value);
            return;
        }
        match self.named.get_mut(name) {
            Some(v) => *v = value,
            None => {
                self.named.insert(name.to_string(), value);
            }
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<V> {
        if name.is_empty() {
            self.unnamed.take()
        } else {
            self.named.remove(name)
        }
    }

    pub fn clear(&mut self) {
        self.unnamed = None;
        self.named.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.unnamed.is_none() && self.named.is_empty()
    }

    pub fn len(&self) -> usize {
        usize::from(self.unnamed.is_some()) + self.named.len()
    }

    /// The names held, the unnamed one (`""`) first.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.unnamed
            .as_ref()
            .map(|_| "")
            .into_iter()
            .chain(self.named.keys().map(String::as_str))
    }

    /// Keeps the entries for which `keep(name, value)` holds.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut V) -> bool) {
        if let Some(v) = self.unnamed.as_mut() {
            if !keep("", v) {
                self.unnamed = None;
            }
        }
        self.named.retain(|k, v| keep(k, v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unnamed_statement_behaves_like_any_name() {
        let mut m: NameMap<u32> = NameMap::default();
        assert!(m.is_empty());
        assert_eq!(m.insert(String::new(), 1), None);
        assert_eq!(m.insert("s1".into(), 2), None);
        assert_eq!(m.insert(String::new(), 3), Some(1));
        assert_eq!(m.get(""), Some(&3));
        assert_eq!(m.get("s1"), Some(&2));
        assert!(m.contains_key("") && m.contains_key("s1") && !m.contains_key("s2"));
        assert_eq!(m.len(), 2);
        assert_eq!(m.keys().collect::<Vec<_>>(), vec!["", "s1"]);
        m.set("s2", 4);
        m.set("", 5);
        *m.get_mut("s2").unwrap() += 1;
        assert_eq!((m.get(""), m.get("s2")), (Some(&5), Some(&5)));
        m.retain(|k, _| !k.is_empty());
        assert_eq!(m.get(""), None);
        assert_eq!(m.remove("s1"), Some(2));
        assert_eq!(m.len(), 1);
        m.clear();
        assert!(m.is_empty());
    }
}
