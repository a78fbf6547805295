//! The delta computation against a model of the Control Plane, over random
//! inventories and change sequences: whatever is lost, late, bogus or asked
//! again, the inventory the CP rebuilds from what it was sent equals the
//! Manager's at every revision.

use super::*;
use crate::backoff::Jitter;
use std::collections::BTreeMap;

/// An inventory and the release contract sent with it.
type Sent = (BTreeMap<u32, u64>, u64);

/// The CP's side: the forms it rebuilt, by epoch and revision.
#[derive(Default)]
struct Cp {
    forms: BTreeMap<(String, u64), Sent>,
}

impl Cp {
    /// Applies a heartbeat's inventory; `Err` when it must ask for a
    /// resync (a delta on a base it does not hold).
    fn take(&mut self, epoch: &str, form: &Form<u32>, sent: &Sent) -> Result<(), ()> {
        let rebuilt = match form {
            Form::Full { .. } => sent.clone(),
            Form::Delta {
                base,
                changed,
                removed,
                contract,
                ..
            } => {
                let (mut at, mut at_contract) = self
                    .forms
                    .get(&(epoch.to_owned(), *base))
                    .cloned()
                    .ok_or(())?;
                for k in changed {
                    // A delta carries each changed entry whole.
                    at.insert(*k, sent.0[k]);
                }
                for k in removed {
                    at.remove(k);
                }
                if *contract {
                    at_contract = sent.1;
                }
                (at, at_contract)
            }
        };
        assert_eq!(
            &rebuilt,
            sent,
            "revision {} of {epoch} rebuilt from {form:?}",
            form.revision()
        );
        self.forms
            .insert((epoch.to_owned(), form.revision()), rebuilt);
        Ok(())
    }
}

/// The hashes of `inventory`, as the index gives them.
fn sorted(inventory: &BTreeMap<u32, u64>) -> Hashes<u32> {
    inventory.iter().map(|(k, h)| (*k, *h)).collect()
}

fn pick(j: &mut Jitter, n: u64) -> u64 {
    (j.fraction() * n as f64) as u64
}

#[test]
fn the_cp_rebuilds_every_revision_whatever_is_lost_late_bogus_or_resynced() {
    for seed in 1..=200u64 {
        let mut j = Jitter::seeded(seed);
        let mut epochs = 0u32;
        let new_epoch = |epochs: &mut u32| {
            *epochs += 1;
            Deltas::new(format!("epoch-{seed}-{epochs:010}"))
        };
        let mut deltas: Deltas<u32> = new_epoch(&mut epochs);
        let mut inventory: BTreeMap<u32, u64> =
            (0..pick(&mut j, 30)).map(|k| (k as u32, 0)).collect();
        let mut cp = Cp::default();
        let mut sent_revisions = Vec::new();
        let mut deltas_sent = 0;
        // The index's generation: changed with the inventory, and
        // sometimes without (a watch event that changed nothing).
        let mut generation = 0u64;
        let mut contract = 0u64;
        for step in 0..300u64 {
            // The cluster changes, or not.
            match pick(&mut j, 12) {
                0..=1 => {
                    let k = pick(&mut j, 40) as u32;
                    inventory.insert(k, step);
                    generation += 1;
                }
                2 => {
                    let k = pick(&mut j, 40) as u32;
                    inventory.remove(&k);
                    generation += 1;
                }
                10 => generation += 1,
                11 => contract = step % 3,
                3 if pick(&mut j, 20) == 0 => {
                    // A restart or a new leader: a new epoch.
                    deltas = new_epoch(&mut epochs);
                    sent_revisions.clear();
                }
                _ => {}
            }
            let before = deltas.revision;
            let form = deltas.next(generation, || sorted(&inventory), contract);
            if let Some(&(_, last)) = sent_revisions.last() {
                assert!(form.revision() >= last);
                if form.revision() == last {
                    assert_eq!(before, last, "an unchanged inventory repeats its revision");
                }
            }
            if matches!(form, Form::Delta { .. }) {
                deltas_sent += 1;
            }
            let epoch = deltas.epoch().to_owned();
            sent_revisions.push((epoch.clone(), form.revision()));
            let took = cp.take(&epoch, &form, &(inventory.clone(), contract));
            // The CP answers, or its answer is lost.
            match (took, pick(&mut j, 10)) {
                (Err(()), _) => deltas.resync(),
                (Ok(()), 0..=5) => {
                    assert_eq!(deltas.confirmed(&epoch, form.revision()), Ok(()));
                }
                (Ok(()), 6) => {} // lost
                (Ok(()), 7) => {
                    // Late: an older revision of this epoch.
                    let older: Vec<u64> = sent_revisions
                        .iter()
                        .filter(|(e, _)| *e == epoch)
                        .map(|(_, r)| *r)
                        .collect();
                    let r = older[pick(&mut j, older.len() as u64) as usize];
                    let _ = deltas.confirmed(&epoch, r);
                }
                (Ok(()), 8) => {
                    // Bogus: another epoch, or a revision never sent.
                    assert_eq!(
                        deltas.confirmed("another-epoch-0000", form.revision()),
                        Err(Ignored::OtherEpoch)
                    );
                    assert_eq!(
                        deltas.confirmed(&epoch, form.revision() + 5),
                        Err(Ignored::NeverSent(form.revision() + 5))
                    );
                }
                (Ok(()), _) => deltas.resync(),
            }
        }
        assert!(deltas_sent > 0, "seed {seed}: deltas were sent");
    }
}

#[test]
fn at_rest_a_confirmed_inventory_sends_an_empty_delta_and_an_unconfirmed_one_the_full_form() {
    let inventory: BTreeMap<u32, u64> = (0..10_000).map(|k| (k, 1)).collect();
    let e = "e".repeat(16);
    let mut d: Deltas<u32> = Deltas::new(e.clone());
    assert_eq!(
        d.next(1, || sorted(&inventory), 0),
        Form::Full { revision: 1 }
    );
    // A CP that never confirms: the full form, the revision repeated.
    assert_eq!(
        d.next(2, || sorted(&inventory), 0),
        Form::Full { revision: 1 }
    );
    d.confirmed(&e, 1).unwrap();
    let at_rest = Form::Delta {
        revision: 1,
        base: 1,
        changed: vec![],
        removed: vec![],
        contract: false,
    };
    assert_eq!(d.next(2, || sorted(&inventory), 0), at_rest);
    // The same generation: the inventory is not read again.
    assert_eq!(d.next(2, || unreachable!("read at rest"), 0), at_rest);
    // One entry changed, one gone: just those.
    let mut changed = inventory.clone();
    changed.insert(7, 2);
    changed.remove(&9);
    assert_eq!(
        d.next(3, || sorted(&changed), 0),
        Form::Delta {
            revision: 2,
            base: 1,
            changed: vec![7],
            removed: vec![9],
            contract: false,
        }
    );
    // Asked again: the full form once, then deltas again.
    d.resync();
    assert_eq!(d.next(3, || unreachable!(), 0), Form::Full { revision: 2 });
    assert!(matches!(
        d.next(3, || unreachable!(), 0),
        Form::Delta { base: 1, .. }
    ));
    // The base never goes down.
    d.confirmed(&e, 2).unwrap();
    d.confirmed(&e, 1).unwrap();
    assert!(matches!(
        d.next(3, || unreachable!(), 0),
        Form::Delta { base: 2, .. }
    ));
}

#[test]
fn a_new_release_contract_is_a_new_revision_carried_until_its_base() {
    let e = "e".repeat(16);
    let inventory = || sorted(&BTreeMap::from([(1u32, 1u64), (2, 1), (3, 1)]));
    let mut d: Deltas<u32> = Deltas::new(e.clone());
    d.next(1, inventory, 10);
    d.confirmed(&e, 1).unwrap();
    let carried = |f: Form<u32>| match f {
        Form::Delta {
            revision, contract, ..
        } => (revision, contract),
        Form::Full { .. } => panic!("a delta"),
    };
    assert_eq!(carried(d.next(1, inventory, 10)), (1, false));
    // Changed at rest: a new revision that carries it, until confirmed.
    assert_eq!(carried(d.next(1, inventory, 11)), (2, true));
    assert_eq!(carried(d.next(1, inventory, 11)), (2, true));
    d.confirmed(&e, 2).unwrap();
    assert_eq!(carried(d.next(1, inventory, 11)), (2, false));
    // Back to the old one: it differs from the base's.
    assert_eq!(carried(d.next(1, inventory, 10)), (3, true));
}

#[test]
fn a_delta_no_smaller_than_the_inventory_is_sent_whole() {
    let mut d: Deltas<u32> = Deltas::new("e".repeat(16));
    d.next(1, || sorted(&BTreeMap::from([(1, 1), (2, 1)])), 0);
    d.confirmed(&"e".repeat(16), 1).unwrap();
    assert_eq!(
        d.next(2, || sorted(&BTreeMap::from([(1, 2), (2, 2)])), 0),
        Form::Full { revision: 2 }
    );
}

#[test]
fn the_difference_walks_both_in_key_order() {
    let base = BTreeMap::from([(1u32, 1u64), (2, 1), (4, 1), (6, 1)]);
    let now = BTreeMap::from([(0u32, 1u64), (2, 2), (4, 1), (5, 1)]);
    assert_eq!(
        difference(&sorted(&base), &sorted(&now)),
        (vec![0, 2, 5], vec![1, 6])
    );
    assert_eq!(difference(&sorted(&now), &sorted(&now)), (vec![], vec![]));
    assert_eq!(difference(&[], &sorted(&now)).0.len(), 4);
    assert_eq!(difference(&sorted(&now), &[]).1.len(), 4);
}

#[test]
fn an_epoch_id_is_22_characters_of_the_protocols_alphabet() {
    let id = epoch_id([0xa5; 16]);
    assert_eq!(id.len(), 22);
    assert!(
        id.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    );
    assert_ne!(epoch_id([1; 16]), epoch_id([2; 16]));
}
