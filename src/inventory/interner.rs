//! One shared copy of equal strings, for the projections and the status
//! (a leaf of the inventory's files: both import it).

use std::rc::Rc;

/// Hands out one shared copy of equal strings (namespaces, images), so
/// that entries that agree share them. Remembers at most [`Interner::MAX`]
/// distinct values; past that, new values are simply not shared.
#[derive(Debug, Default)]
pub struct Interner {
    seen: Vec<Rc<str>>,
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
}
