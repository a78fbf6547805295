//! A set's owned objects ([`Stores`]): each one's record, shared with the
//! reports ([`Owned`]), and what this Manager remembers of it beside
//! ([`Stored`]), kept in one list sorted by name: no map's nodes, no box
//! an object (BENCHMARKS.md, "One record an object").

use std::rc::Rc;
use std::time::Instant;

use super::owned::Owned;
use super::status::Track;
use super::uid::Uid;

/// One owned object: its record (shared with the reports that show it,
/// never copied but when it changes), what this Manager remembers of its
/// phase, and the report's bookkeeping.
#[derive(Debug)]
pub struct Stored {
    pub owned: Rc<Owned>,
    pub track: Track,
    pub uid: Option<Uid>,
    /// Observed anew (or explained) since it was last judged.
    pub fresh: bool,
    /// Its status shows a command's progress (judged again each report
    /// while it does): kept here so that a report at rest reads no record.
    pub shows_command: bool,
    /// When the clock alone may change its phase (a deadline).
    pub recheck_at: Option<Instant>,
    /// A hash of its entry as last reported (`inventory.delta.v1`):
    /// computed again only when it changes.
    pub hash: u64,
}

/// A set's owned objects, sorted by name.
#[derive(Debug, Default)]
pub struct Stores(Vec<Stored>);

impl Stores {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|s| (*s.owned.name).cmp(name))
    }

    /// The object named `name`.
    pub fn get(&self, name: &str) -> Option<&Stored> {
        self.find(name).ok().map(|i| &self.0[i])
    }

    /// The object named `name`, to change.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Stored> {
        self.find(name).ok().map(|i| &mut self.0[i])
    }

    /// Takes out the object named `name`.
    pub fn remove(&mut self, name: &str) -> Option<Stored> {
        self.find(name).ok().map(|i| self.0.remove(i))
    }

    /// Puts `stored` in its place (in place of one of the same name).
    /// Items listed in name order go at the end, without a search.
    pub fn insert(&mut self, stored: Stored) {
        if self
            .0
            .last()
            .is_none_or(|l| l.owned.name < stored.owned.name)
        {
            self.0.push(stored);
            return;
        }
        match self.find(&stored.owned.name) {
            Ok(i) => self.0[i] = stored,
            Err(i) => self.0.insert(i, stored),
        }
    }

    /// Each object, in name order.
    pub fn iter(&self) -> std::slice::Iter<'_, Stored> {
        self.0.iter()
    }

    /// Each object, to change, in name order.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Stored> {
        self.0.iter_mut()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Gives back the room a list grew beyond its objects.
    pub fn shrink(&mut self) {
        self.0.shrink_to_fit();
    }

    /// Both lists in one, in name order; of two objects of the same name,
    /// `newer`'s.
    pub fn merge(self, newer: Stores) -> Stores {
        let mut out = Vec::with_capacity(self.0.len() + newer.0.len());
        let mut old = self.0.into_iter().peekable();
        for n in newer.0 {
            while let Some(o) = old.next_if(|o| o.owned.name <= n.owned.name) {
                if o.owned.name < n.owned.name {
                    out.push(o);
                }
            }
            out.push(n);
        }
        out.extend(old);
        Stores(out)
    }

    /// The objects, to be taken out one by one by name as a list comes
    /// ([`Taking::take`]): no object is moved as others are taken.
    pub fn taking(self) -> Taking {
        Taking(
            self.0
                .into_iter()
                .map(|s| (s.owned.name.clone(), Some(s)))
                .collect(),
        )
    }
}

/// A set's objects while a list of them comes: each taken out in a
/// search, without shifting the rest (a list of 10,000 taken from a
/// sorted list by `remove` would move it 10,000 times).
#[derive(Debug)]
pub struct Taking(Vec<(Rc<str>, Option<Stored>)>);

impl Taking {
    /// Takes out the object named `name`, if it is still there.
    pub fn take(&mut self, name: &str) -> Option<Stored> {
        let i = self.0.binary_search_by(|(n, _)| (**n).cmp(name)).ok()?;
        self.0[i].1.take()
    }

    /// The objects not taken.
    pub fn rest(self) -> Stores {
        Stores(self.0.into_iter().filter_map(|(_, s)| s).collect())
    }
}

/// Keeps owned object `owned` in `stores`; what was remembered of its
/// phase in `before` stays when it is the same object (by uid).
pub fn keep(
    stores: &mut Stores,
    before: Option<Stored>,
    mut owned: Owned,
    uid: Option<String>,
    now: Instant,
) {
    let uid = uid.as_deref().map(Uid::new);
    let track = match before {
        Some(old) if old.uid == uid => {
            // What was last reported of its phase goes on with it.
            owned.judged = old.owned.judged.clone();
            old.track
        }
        _ => Track::new(owned.observed.generation, now),
    };
    stores.insert(Stored {
        owned: Rc::new(owned),
        track,
        uid,
        fresh: true,
        shows_command: false,
        recheck_at: None,
        hash: 0,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(name: &str, generation: i64) -> Stored {
        let owned = Owned {
            namespace: "shop".into(),
            name: name.into(),
            kind: crate::cp::wire::EntryKind::NexoProxy,
            image: None,
            observed: super::super::status::Observed {
                generation,
                ..Default::default()
            },
            judged: None,
        };
        Stored {
            owned: Rc::new(owned),
            track: Track::new(generation, Instant::now()),
            uid: None,
            fresh: true,
            shows_command: false,
            recheck_at: None,
            hash: 0,
        }
    }

    fn names(s: &Stores) -> Vec<(String, i64)> {
        s.iter()
            .map(|s| (s.owned.name.to_string(), s.owned.observed.generation))
            .collect()
    }

    #[test]
    fn objects_stay_in_name_order_whatever_order_they_come_in() {
        let mut s = Stores::default();
        for (n, g) in [("c", 1), ("a", 1), ("d", 1), ("b", 1), ("a", 2)] {
            s.insert(stored(n, g));
        }
        assert_eq!(
            names(&s),
            [("a", 2), ("b", 1), ("c", 1), ("d", 1)].map(|(n, g)| (n.to_owned(), g))
        );
        assert_eq!(s.get("c").unwrap().owned.observed.generation, 1);
        assert!(s.get("e").is_none());
        assert_eq!(s.remove("b").unwrap().owned.name.as_ref(), "b");
        assert!(s.remove("b").is_none());
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn a_merge_keeps_the_newer_of_two_and_the_order() {
        let mut old = Stores::default();
        for n in ["a", "c", "e", "g"] {
            old.insert(stored(n, 1));
        }
        let mut newer = Stores::default();
        for n in ["b", "c", "f", "g", "h"] {
            newer.insert(stored(n, 2));
        }
        assert_eq!(
            names(&old.merge(newer)),
            [
                ("a", 1),
                ("b", 2),
                ("c", 2),
                ("e", 1),
                ("f", 2),
                ("g", 2),
                ("h", 2)
            ]
            .map(|(n, g)| (n.to_owned(), g))
        );
    }

    #[test]
    fn objects_are_taken_once_by_name_and_the_rest_stays() {
        let mut s = Stores::default();
        for n in ["a", "b", "c"] {
            s.insert(stored(n, 1));
        }
        let mut taking = s.taking();
        assert_eq!(taking.take("b").unwrap().owned.name.as_ref(), "b");
        assert!(taking.take("b").is_none(), "taken once");
        assert!(taking.take("x").is_none());
        assert_eq!(
            names(&taking.rest()),
            [("a", 1), ("c", 1)].map(|(n, g)| (n.to_owned(), g))
        );
    }

    /// What each owned object costs, beside its name: a change that grows
    /// these grows the 10,000-proxy figure by 10,000 times as much
    /// (BENCHMARKS.md, "One record an object").
    #[test]
    fn a_record_and_what_is_kept_beside_it_stay_small() {
        assert!(size_of::<Owned>() <= 184, "{}", size_of::<Owned>());
        assert!(size_of::<Stored>() <= 120, "{}", size_of::<Stored>());
    }
}
