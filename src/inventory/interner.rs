//! One shared copy of equal strings and conditions, for the projections
//! and the status (a leaf of the inventory's files: both import it).

use std::rc::Rc;

/// The fields of a condition the status reads (shared through
/// [`Interner::condition`]: most objects say the same).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition {
    /// `True`, `False` or `Unknown`.
    pub status: Option<Rc<str>>,
    pub reason: Option<Rc<str>>,
    pub message: Option<Rc<str>>,
}

/// Hands out one shared copy of equal strings (namespaces, images), so
/// that entries that agree share them. Remembers at most [`Interner::MAX`]
/// distinct values; past that, new values are simply not shared.
#[derive(Debug, Default)]
pub struct Interner {
    seen: Vec<Rc<str>>,
    conditions: Vec<Rc<Condition>>,
}

impl Interner {
    /// Distinct values remembered.
    pub const MAX: usize = 64;

    /// The shared copy of `s`.
    pub fn get(&mut self, s: &str) -> Rc<str> {
        if let Some(r) = self.seen.iter().find(|r| ***r == *s) {
            return r.clone();
        }
        let r: Rc<str> = Rc::from(s);
        if self.seen.len() < Self::MAX {
            self.seen.push(r.clone());
        }
        r
    }

    /// The shared copy of condition `c` (at most [`Interner::MAX`]
    /// distinct ones remembered, as strings are).
    pub fn condition(&mut self, c: Condition) -> Rc<Condition> {
        if let Some(r) = self.conditions.iter().find(|r| ***r == c) {
            return r.clone();
        }
        let r = Rc::new(c);
        if self.conditions.len() < Self::MAX {
            self.conditions.push(r.clone());
        }
        r
    }
}
