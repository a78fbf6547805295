//! The drift check's comparisons (`drift.rs` runs them): a record as the
//! check holds it, the deployed objects of each kind read in name order
//! beside the records ([`Lists`]), and the second pass for the few
//! manifests whose object a list had already passed ([`late`]).

use serde_json::Value;

use crate::drift::in_order::{InOrder, Seek};
use crate::drift::{self, Mode};
use crate::inventory::Uid;
use crate::kube::listing::Listing;
use crate::ownership::Verifier;
use crate::resource::Kind;

/// One deployment's record as the check holds it, and what the check
/// found of its objects.
pub(super) struct Recorded {
    pub(super) kept: drift::Kept,
    /// The uid of the NexoProxy or Deployment that owns the record: the
    /// deployment it was written for (16 bytes, no allocation).
    pub(super) owner: Option<Uid>,
    /// The record's `resourceVersion`.
    pub(super) version: String,
    /// The manifests whose object was listed, a bit each (at most 64).
    pub(super) seen: u64,
    /// The manifests whose object its list had passed when the record
    /// came: compared in a second pass ([`late`]).
    pub(super) late: u64,
    /// The manifests whose object differs: index, fields, and the object
    /// (kept for `enforce` only).
    pub(super) found: Vec<(usize, Vec<String>, Option<Value>)>,
    /// A list it needs failed: not concluded this time.
    pub(super) skipped: bool,
}

impl Recorded {
    pub(super) fn new(kept: drift::Kept, owner: Option<Uid>, version: String) -> Recorded {
        Recorded {
            kept,
            owner,
            version,
            seen: 0,
            late: 0,
            found: Vec::new(),
            skipped: false,
        }
    }
}

/// The deployed objects of a namespace (never a record, nor any object
/// with a role: the Manager's own), one list per kind, each opened when a
/// record first names its kind and read forward as the records come.
/// Records come in name order, and a deployment's objects are named after
/// it, so each list is read once, beside the records, and a record is
/// concluded as soon as it is compared: the check holds a page of each
/// list, not every record.
pub(super) struct Lists<'a> {
    kube: &'a crate::kube::Client,
    namespace: &'a str,
    selector: &'a str,
    /// By kind; `None` once its list failed.
    open: Vec<(Kind, Option<InOrder<Listing<'a>>>)>,
    /// The lists that failed: (kind, why), told and recorded by the check.
    pub(super) failed: Vec<(Kind, String)>,
}

impl<'a> Lists<'a> {
    pub(super) fn new(
        kube: &'a crate::kube::Client,
        namespace: &'a str,
        selector: &'a str,
    ) -> Self {
        Lists {
            kube,
            namespace,
            selector,
            open: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Compares each of the record's manifests with its object, as far as
    /// the lists can tell: found (compared), absent, or already passed
    /// (marked `late`). A failed list marks the record skipped.
    pub(super) fn compare(&mut self, r: &mut Recorded, proofs: &Verifier<'_>) {
        for i in 0..r.kept.manifests.len() {
            let kind = r.kept.manifests[i].kind;
            let at = match self.open.iter().position(|(k, _)| *k == kind) {
                Some(at) => at,
                None => {
                    let listing = self.kube.listing(
                        &kind.resource().collection(Some(self.namespace)),
                        Some(self.selector),
                        crate::inventory::PAGE,
                    );
                    self.open.push((kind, Some(InOrder::new(listing))));
                    self.open.len() - 1
                }
            };
            let Some(list) = &mut self.open[at].1 else {
                r.skipped = true;
                continue;
            };
            let stop = match list.seek(&r.kept.manifests[i].name) {
                Ok(Seek::Found(o)) => {
                    r.seen |= 1 << i;
                    compare_one(proofs, r, i, o);
                    continue;
                }
                Ok(Seek::Absent) => continue,
                Ok(Seek::Passed) => {
                    r.late |= 1 << i;
                    continue;
                }
                Err(stop) => stop,
            };
            self.failed.push((kind, stop.to_string()));
            self.open[at].1 = None;
            r.skipped = true;
        }
    }
}

/// The second pass: the manifests whose object a list had passed when
/// their record came (objects not named after their deployment), each
/// kind listed once more and compared by name. Returns the lists that
/// failed: (kind, why); their records are marked skipped.
pub(super) fn late(
    kube: &crate::kube::Client,
    namespace: &str,
    selector: &str,
    records: &mut [Recorded],
    proofs: &Verifier<'_>,
) -> Vec<(Kind, String)> {
    let mut failed = Vec::new();
    let mut kinds: Vec<Kind> = Vec::new();
    for r in records.iter() {
        for (i, m) in r.kept.manifests.iter().enumerate() {
            if r.late & (1 << i) != 0 && !kinds.contains(&m.kind) {
                kinds.push(m.kind);
            }
        }
    }
    for kind in kinds {
        let names = by_name(records, kind);
        let listed = kube.list_each(
            &kind.resource().collection(Some(namespace)),
            Some(selector),
            crate::inventory::PAGE,
            |o| object(&names, proofs, records, kind, &o),
        );
        if let Err(e) = listed {
            failed.push((kind, e.to_string()));
            for r in records.iter_mut() {
                if r.kept.manifests.iter().any(|m| m.kind == kind) {
                    r.skipped = true;
                }
            }
        }
    }
    failed
}

/// Where each late manifest of `kind` is among the records: (a hash of
/// its name, record, manifest), sorted; 16 bytes each.
type ByName = Vec<(u64, u32, u32)>;

fn name_hash(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

fn by_name(records: &[Recorded], kind: Kind) -> ByName {
    let mut names: ByName = records
        .iter()
        .enumerate()
        .flat_map(|(r, rec)| {
            rec.kept
                .manifests
                .iter()
                .enumerate()
                .filter(move |(i, m)| rec.late & (1 << i) != 0 && m.kind == kind)
                .map(move |(i, m)| (name_hash(&m.name), r as u32, i as u32))
        })
        .collect();
    names.sort_unstable();
    names
}

/// A listed object of `kind` compared with the late manifests that name it.
fn object(names: &ByName, proofs: &Verifier<'_>, records: &mut [Recorded], kind: Kind, o: &Value) {
    let Some(name) = o["metadata"]["name"].as_str() else {
        return;
    };
    let h = name_hash(name);
    let from = names.partition_point(|(x, _, _)| *x < h);
    for &(_, r, i) in names[from..].iter().take_while(|(x, _, _)| *x == h) {
        let (r, i) = (&mut records[r as usize], i as usize);
        if r.kept.manifests[i].kind != kind || r.kept.manifests[i].name != name {
            continue;
        }
        r.seen |= 1 << i;
        compare_one(proofs, r, i, o);
    }
}

/// The difference an object without the Manager's valid proof for its
/// deployment shows (SECURITY.md, "Integrity the namespace cannot forge"):
/// enforcement gives it its proof through `NEXO_ADOPT_UNPROVEN`, or leaves
/// it, reported `failed`.
const UNPROVEN_FIELD: &str = "/metadata/annotations/nexo.io~1proof";

/// One object of a record, as listed, compared with what the record
/// applied (the manifest parsed from its text only then).
fn compare_one(proofs: &Verifier<'_>, r: &mut Recorded, i: usize, o: &Value) {
    let m = &r.kept.manifests[i];
    let Ok(applied) = serde_json::from_str::<Value>(&m.text) else {
        return;
    };
    let mut diff = drift::differences(&applied, o, &r.kept.settings.ignore);
    let meta = &o["metadata"];
    fn text(v: &Value) -> &str {
        v.as_str().unwrap_or_default()
    }
    let proven = proofs.verify(
        m.kind.name(),
        text(&meta["namespace"]),
        &m.name,
        text(&meta["uid"]),
        &r.kept.name,
        text(&meta["annotations"][crate::integrity::ANNOTATION]),
    );
    if !proven && !diff.iter().any(|d| d == UNPROVEN_FIELD) {
        diff.insert(0, UNPROVEN_FIELD.to_owned());
        diff.truncate(drift::MAX_FIELDS);
    }
    if !diff.is_empty() {
        let object = (r.kept.settings.mode == Mode::Enforce).then(|| o.clone());
        r.found.push((i, diff, object));
    }
}
