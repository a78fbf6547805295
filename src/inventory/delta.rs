//! Inventory deltas (docs/protocol.md, `inventory.delta.v1`), decided from
//! plain values: which form the next heartbeat's inventory takes (full, or
//! what changed since the revision the Control Plane confirmed), from a
//! hash of each entry. What is kept is each entry's key and hash, sorted,
//! in at most two lists (the confirmed base's and the last revision's, one
//! list shared while they agree), never a copy of the entries.

use std::rc::Rc;

/// Each entry's key and the hash of its content, sorted by key (each key
/// once); shared, never copied.
pub type Hashes<K> = Rc<[(K, u64)]>;

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
    /// Every entry (`"full": true`), and the release contract.
    Full { revision: u64 },
    /// What changed since `base`: the entries `changed` (new or
    /// different), the keys `removed` (present at `base`, gone now);
    /// `contract`: the release contract is carried (it changed since the
    /// base).
    Delta {
        revision: u64,
        base: u64,
        changed: Vec<K>,
        removed: Vec<K>,
        contract: bool,
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

/// What the CP confirmed holding: a revision, each entry's hash then, and
/// the release contract's hash.
#[derive(Debug, Clone)]
struct Base<K> {
    revision: u64,
    hashes: Hashes<K>,
    contract: u64,
}

/// A delta computed: of (revision, base), its changed and removed keys.
type LastDelta<K> = ((u64, u64), Vec<K>, Vec<K>);

/// The deltas of one epoch (one leadership of this process).
#[derive(Debug, Clone)]
pub struct Deltas<K: Ord + Clone> {
    epoch: String,
    /// The last revision sent (0: none yet), and each entry's hash then.
    revision: u64,
    latest: Hashes<K>,
    /// The inventory's generation `latest` was taken at: an unchanged
    /// generation is not read again (a heartbeat at rest reads nothing).
    generation: Option<u64>,
    /// The release contract's hash in the last revision sent.
    contract: u64,
    /// The last revision the CP confirmed.
    base: Option<Base<K>>,
    /// The last delta computed, of (revision, base): at rest the same
    /// delta again, not computed again.
    last_delta: Option<LastDelta<K>>,
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
            latest: Rc::new([]),
            generation: None,
            contract: 0,
            base: None,
            last_delta: None,
            resync: false,
        }
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The form of the next heartbeat. `generation` changes whenever the
    /// inventory may have (the index's count of its changes); only then is
    /// `hashes` called for each entry's key and the hash of its whole
    /// content. The revision grows when they differ from the last ones
    /// sent. `contract`: the hash of the release contract sent with it.
    pub fn next(
        &mut self,
        generation: u64,
        hashes: impl FnOnce() -> Hashes<K>,
        contract: u64,
    ) -> Form<K> {
        let moved = match self.generation {
            Some(g) if g == generation => None,
            _ => Some(hashes()).filter(|now| *now != self.latest),
        };
        // A revision names one inventory and one release contract: a new
        // contract is a new revision, so what the CP holds of a revision
        // never changes under it (docs/protocol.md, as implemented).
        if self.revision == 0 || moved.is_some() || contract != self.contract {
            self.revision += 1;
        }
        if let Some(now) = moved {
            self.latest = now;
        }
        self.generation = Some(generation);
        self.contract = contract;
        let revision = self.revision;
        let base = match &self.base {
            Some(base) if !self.resync => base,
            _ => {
                self.resync = false;
                return Form::Full { revision };
            }
        };
        let at = (revision, base.revision);
        let (changed, removed) = match &self.last_delta {
            Some((of, changed, removed)) if *of == at => (changed.clone(), removed.clone()),
            _ => {
                let (changed, removed) = difference(&base.hashes, &self.latest);
                self.last_delta = Some((at, changed.clone(), removed.clone()));
                (changed, removed)
            }
        };
        // A delta no smaller than the full form is sent as the full form.
        if changed.len() + removed.len() >= self.latest.len().max(1) {
            return Form::Full { revision };
        }
        Form::Delta {
            revision,
            base: base.revision,
            changed,
            removed,
            contract: contract != base.contract,
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
        if self.base.as_ref().is_some_and(|b| revision <= b.revision) {
            return Ok(());
        }
        if revision != self.revision {
            return Err(Ignored::NotKept(revision));
        }
        self.base = Some(Base {
            revision,
            hashes: Rc::clone(&self.latest),
            contract: self.contract,
        });
        Ok(())
    }

    /// The CP asked for the full form in the next heartbeat.
    pub fn resync(&mut self) {
        self.resync = true;
    }
}

/// The keys of `now` that are new or differ from `base`, and the keys of
/// `base` gone from `now`: one walk of both in key order.
fn difference<K: Ord + Clone>(base: &[(K, u64)], now: &[(K, u64)]) -> (Vec<K>, Vec<K>) {
    let (mut changed, mut removed) = (Vec::new(), Vec::new());
    let (mut b, mut n) = (base.iter().peekable(), now.iter().peekable());
    loop {
        match (b.peek(), n.peek()) {
            (None, None) => break,
            (Some((bk, _)), None) => {
                removed.push((*bk).clone());
                b.next();
            }
            (None, Some((nk, _))) => {
                changed.push((*nk).clone());
                n.next();
            }
            (Some((bk, bh)), Some((nk, nh))) => match bk.cmp(nk) {
                std::cmp::Ordering::Less => {
                    removed.push((*bk).clone());
                    b.next();
                }
                std::cmp::Ordering::Greater => {
                    changed.push((*nk).clone());
                    n.next();
                }
                std::cmp::Ordering::Equal => {
                    if bh != nh {
                        changed.push((*nk).clone());
                    }
                    b.next();
                    n.next();
                }
            },
        }
    }
    (changed, removed)
}

/// A hash of what is sent as `value` (an entry, the release contract):
/// any field that would change the JSON changes the hash.
pub fn content_hash<T: serde::Serialize + ?Sized>(value: &T) -> u64 {
    use std::hash::Hasher as _;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let _ = serde_json::to_writer(HashWriter(&mut h), value);
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
