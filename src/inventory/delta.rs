//! Inventory deltas (docs/protocol.md, `inventory.delta.v1`), decided from
//! plain values: which form the next heartbeat's inventory takes (full, or
//! what changed since the revision the Control Plane confirmed), from a
//! hash of each entry. What is kept is two hashes an entry at most (the
//! confirmed base's and the revision in flight's), never a copy of the
//! entries.

use std::collections::BTreeMap;

/// A confirmation this Manager does not act on, and why (logged once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    /// Of another epoch.
    OtherEpoch,
    /// Of a revision this epoch never sent.
    NeverSent(u64),
    /// Of a revision sent but not the last: its hashes are not kept (the
    /// base stays where it was, which the CP still holds).
    NotKept(u64),
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ignored::OtherEpoch => f.write_str("a confirmation of another epoch"),
            Ignored::NeverSent(r) => write!(f, "a confirmation of revision {r}, never sent"),
            Ignored::NotKept(r) => write!(
                f,
                "a confirmation of revision {r}, which is not the last sent"
            ),
        }
    }
}

/// The inventory's form in one heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form<K> {
    /// Every entry (`"full": true`).
    Full { revision: u64 },
    /// What changed since `base`: the entries `changed` (new or
    /// different), the keys `removed` (present at `base`, gone now).
    Delta {
        revision: u64,
        base: u64,
        changed: Vec<K>,
        removed: Vec<K>,
    },
}

impl<K> Form<K> {
    /// The revision it is of.
    #[cfg(test)]
    pub fn revision(&self) -> u64 {
        match self {
            Form::Full { revision } | Form::Delta { revision, .. } => *revision,
        }
    }
}

/// The deltas of one epoch (one leadership of this process).
#[derive(Debug, Clone)]
pub struct Deltas<K: Ord + Clone> {
    epoch: String,
    /// The last revision sent (0: none yet), and each entry's hash then.
    revision: u64,
    latest: BTreeMap<K, u64>,
    /// The last revision the CP confirmed, and each entry's hash then.
    base: Option<(u64, BTreeMap<K, u64>)>,
    /// The CP asked for the full form.
    resync: bool,
}

impl<K: Ord + Clone> Deltas<K> {
    /// A new epoch, named `epoch` (16 to 64 characters of
    /// `[A-Za-z0-9_-]`: [`epoch_id`]).
    pub fn new(epoch: String) -> Deltas<K> {
        Deltas {
            epoch,
            revision: 0,
            latest: BTreeMap::new(),
            base: None,
            resync: false,
        }
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The form of the next heartbeat, for the inventory `now` (each
    /// entry's key and the hash of its whole content). The revision grows
    /// when the inventory differs from the last one sent.
    pub fn next(&mut self, now: BTreeMap<K, u64>) -> Form<K> {
        if self.revision == 0 || now != self.latest {
            self.revision += 1;
            self.latest = now;
        }
        let revision = self.revision;
        let base = match &self.base {
            Some(base) if !self.resync => base,
            _ => {
                self.resync = false;
                return Form::Full { revision };
            }
        };
        let (base_revision, at_base) = (base.0, &base.1);
        let changed: Vec<K> = self
            .latest
            .iter()
            .filter(|(k, h)| at_base.get(*k) != Some(*h))
            .map(|(k, _)| k.clone())
            .collect();
        let removed: Vec<K> = at_base
            .keys()
            .filter(|k| !self.latest.contains_key(*k))
            .cloned()
            .collect();
        // A delta no smaller than the full form is sent as the full form.
        if changed.len() + removed.len() >= self.latest.len().max(1) {
            return Form::Full { revision };
        }
        Form::Delta {
            revision,
            base: base_revision,
            changed,
            removed,
        }
    }

    /// The CP holds `revision` of `epoch`. The base never goes down: an
    /// older confirmation changes nothing.
    pub fn confirmed(&mut self, epoch: &str, revision: u64) -> Result<(), Ignored> {
        if epoch != self.epoch {
            return Err(Ignored::OtherEpoch);
        }
        if revision == 0 || revision > self.revision {
            return Err(Ignored::NeverSent(revision));
        }
        if self.base.as_ref().is_some_and(|(b, _)| revision <= *b) {
            return Ok(());
        }
        if revision != self.revision {
            return Err(Ignored::NotKept(revision));
        }
        self.base = Some((revision, self.latest.clone()));
        Ok(())
    }

    /// The CP asked for the full form in the next heartbeat.
    pub fn resync(&mut self) {
        self.resync = true;
    }
}

pub use crate::cp::wire::EntryKey;

/// A hash of an entry's whole content, as it is reported.
pub fn entry_hash(entry: &crate::cp::wire::DeploymentEntry) -> u64 {
    use std::hash::Hasher as _;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    // Written as it is sent: any field that would change the JSON changes
    // the hash.
    let _ = serde_json::to_writer(HashWriter(&mut h), entry);
    h.finish()
}

struct HashWriter<'a>(&'a mut std::collections::hash_map::DefaultHasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::hash::Hasher as _;
        self.0.write(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An epoch id: 22 characters of `[A-Za-z0-9_-]` from 16 random bytes.
pub fn epoch_id(random: [u8; 16]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits = u128::from_be_bytes(random);
    (0..22)
        .map(|_| {
            let c = ALPHABET[(bits & 63) as usize] as char;
            bits >>= 6;
            c
        })
        .collect()
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
