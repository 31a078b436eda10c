//! The map key: (database, relation name), looked up from borrowed strings.
//!
//! Stored keys own their text behind an `Arc` so the sweep queue can refer to a slot
//! without copying the names. Lookups borrow: both the owned key and a pair of
//! `&str` are viewed through [`KeyView`], whose `Hash` and `Eq` are defined once, so
//! a lookup of a relation that is not in the map allocates nothing.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Read access to the two parts of a key.
pub(crate) trait KeyView {
    fn db(&self) -> &str;
    fn name(&self) -> &str;
}

impl Hash for dyn KeyView + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.db().hash(state);
        self.name().hash(state);
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.db() == other.db() && self.name() == other.name()
    }
}

impl Eq for dyn KeyView + '_ {}

/// An owned key, cheap to clone: database and name share one allocation, so a
/// key comparison follows a single pointer.
#[derive(Clone, Debug)]
pub(crate) struct SlotKey {
    text: Arc<str>,
    split: usize,
}

impl SlotKey {
    pub(crate) fn new(db: &str, name: &str) -> Self {
        let mut text = String::with_capacity(db.len() + name.len());
        text.push_str(db);
        text.push_str(name);
        SlotKey {
            text: text.into(),
            split: db.len(),
        }
    }

    pub(crate) fn db_str(&self) -> &str {
        &self.text[..self.split]
    }

    pub(crate) fn name_str(&self) -> &str {
        &self.text[self.split..]
    }
}

impl KeyView for SlotKey {
    fn db(&self) -> &str {
        self.db_str()
    }
    fn name(&self) -> &str {
        self.name_str()
    }
}

impl Hash for SlotKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn KeyView).hash(state);
    }
}

impl PartialEq for SlotKey {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn KeyView) == (other as &dyn KeyView)
    }
}

impl Eq for SlotKey {}

impl<'a> Borrow<dyn KeyView + 'a> for SlotKey {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

/// A key made of borrowed strings, for lookups.
pub(crate) struct BorrowedKey<'a> {
    pub(crate) db: &'a str,
    pub(crate) name: &'a str,
}

impl KeyView for BorrowedKey<'_> {
    fn db(&self) -> &str {
        self.db
    }
    fn name(&self) -> &str {
        self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn borrowed_and_owned_keys_agree() {
        let mut m: HashMap<SlotKey, u32> = HashMap::new();
        m.insert(SlotKey::new("db1", "orders"), 1);
        m.insert(SlotKey::new("db1o", "rders"), 2);
        let k = BorrowedKey {
            db: "db1",
            name: "orders",
        };
        assert_eq!(m.get(&k as &dyn KeyView), Some(&1));
        let k = BorrowedKey {
            db: "db1o",
            name: "rders",
        };
        assert_eq!(m.get(&k as &dyn KeyView), Some(&2));
        let k = BorrowedKey {
            db: "db1",
            name: "order",
        };
        assert_eq!(m.get(&k as &dyn KeyView), None);
    }
}
