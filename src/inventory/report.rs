//! What the index reports: each entry judged at the heartbeat's time
//! ([`Index::report`]), the owned objects a command names, and the
//! progress of the commands applied.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::index::Index;
use super::owned::{Owned, Reported, Sorted};
use super::status::{self, CommandTrack, RollbackDue, RollbackEnd, Turned};
use crate::cp::wire::{CommandPhase, CommandProgress, EntryKey};
use crate::resource::Kind;

impl Index {
    /// The heartbeat's entries, sorted by namespace then name, each with
    /// its status judged at `now` (`wall`: the same instant, RFC 3339), and
    /// what may be stale; the phases that turned `failed` or `degraded`
    /// go to `turned`. The entries are shared, not copied, and sorted
    /// once, when something moved: at 10,000 proxies this costs 80 KB,
    /// where copies cost 1.9 MB (BENCHMARKS.md).
    pub fn report(
        &mut self,
        now: Instant,
        wall: &str,
        deadline: Duration,
        turned: &mut Vec<Turn>,
    ) -> (crate::cp::wire::Entries, Vec<String>) {
        let commands = &mut self.commands;
        let shared = &mut self.shared;
        let rollbacks = &mut self.rollbacks;
        // One copy of the time for every entry whose phase changes now.
        let wall: Rc<str> = Rc::from(wall);
        // Whether an entry may differ from the last report's: one judged
        // again and changed, or new (fresh), or one gone (fewer entries).
        let mut moved = false;
        let mut count = 0;
        for set in &mut self.sets {
            let set_kind = set.kind.kind();
            for stored in set.entries.iter_mut() {
                count += 1;
                let command = if commands.is_empty() {
                    None
                } else {
                    commands.get_mut(&stored.owned.key()).filter(|c| !c.ended)
                };
                // Judged again only when something it depends on moved:
                // the object (a watch event), a command, the clock past a
                // deadline, a command's end still shown.
                let due = stored.fresh
                    || command.is_some()
                    || stored.shows_command
                    || stored.recheck_at.is_some_and(|t| now >= t);
                if !due {
                    continue;
                }
                let was_fresh = std::mem::replace(&mut stored.fresh, false);
                let (verdict, turn) = stored.track.advance(
                    &stored.owned.observed,
                    command.as_deref(),
                    now,
                    deadline,
                    shared,
                );
                // When the phase last changed: now, or as last reported.
                let since = match &stored.owned.judged {
                    Some(last) if !verdict.changed => last.since.clone(),
                    _ => wall.clone(),
                };
                stored.recheck_at = verdict.recheck_in.map(|d| now + d);
                let progress = command.map(|c| {
                    let (phase, end) =
                        status::command_progress(c, &stored.owned.observed, verdict.phase);
                    c.ending = end;
                    if phase == CommandPhase::Failed && c.rollback && !c.rollback_due {
                        // Its failure is rolled back, once (docs/protocol.md,
                        // `rollback.v1`): by the agent, after this report.
                        c.rollback_due = true;
                        rollbacks.push(RollbackDue {
                            kind: set_kind,
                            namespace: stored.owned.namespace.clone(),
                            name: stored.owned.name.clone(),
                            command: c.id.clone(),
                        });
                    }
                    let (rolled_back_to, reason) = match &c.rolled_back {
                        Some(RollbackEnd::RolledBack { to }) => (to.clone(), None),
                        Some(RollbackEnd::Failed { reason }) => (None, Some(reason.clone())),
                        None => (None, None),
                    };
                    Box::new(CommandProgress {
                        id: c.id.clone(),
                        class: c.class,
                        phase,
                        rolled_back_to,
                        reason,
                    })
                });
                let status = Reported {
                    phase: verdict.phase,
                    reason: verdict.reason,
                    message: match &stored.track.detail {
                        Some(d) => Rc::from(crate::text::clip_bytes(
                            &format!("{}; {d}", verdict.message),
                            256,
                        )),
                        None => verdict.message,
                    },
                    since,
                    command: progress,
                };
                stored.shows_command = status.command.is_some();
                let changed = stored.owned.judged.as_ref() != Some(&status);
                if changed {
                    // In place unless a report still holds it.
                    Rc::make_mut(&mut stored.owned).judged = Some(status);
                }
                if changed || was_fresh {
                    moved = true;
                    stored.hash = super::delta::content_hash(&stored.owned.entry());
                }
                if let Some(turn) = turn {
                    turned.push(Turn {
                        kind: set_kind,
                        namespace: stored.owned.namespace.clone(),
                        name: stored.owned.name.clone(),
                        uid: stored.uid.as_ref().map(|u| u.to_string().into()),
                        turned: turn,
                    });
                }
            }
        }
        if moved || count != self.sorted.0.len() {
            // Sorted again only when something moved: at rest, at 10,000
            // proxies, the sort was most of a heartbeat's CPU (BENCHMARKS.md,
            // "Inventory deltas"). Each set is a sorted run, which the
            // stable sort merges.
            self.generation += 1;
            let mut sorted: Vec<_> = self
                .sets
                .iter()
                .flat_map(|s| s.entries.iter().map(|stored| stored.owned.clone()))
                .collect();
            sorted.sort();
            self.sorted = Rc::new(Sorted(sorted));
        }
        let entries = crate::cp::wire::Entries::new(self.sorted.clone());
        let mut errors: Vec<String> = self
            .sets
            .iter()
            .filter_map(|s| {
                let problem = s.problem.as_ref()?;
                Some(format!(
                    "{}: {problem} (not watched now; what is reported may be stale)",
                    s.describe()
                ))
            })
            .collect();
        errors.extend(
            self.sets
                .iter()
                .filter_map(|s| s.unproven_error(&self.trust)),
        );
        (entries, errors)
    }

    /// The owned NexoProxy and Deployment named `name` in `namespace`, as
    /// the watches last saw them: what a command's Events are about.
    pub fn owned(&self, namespace: &str, name: &str) -> Vec<crate::events::Regarding> {
        self.sets
            .iter()
            .filter(|s| &*s.namespace == namespace)
            .filter_map(|s| {
                let stored = s.entries.get(name)?;
                Some(crate::events::Regarding {
                    kind: s.kind.kind(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    uid: stored.uid.as_ref()?.to_string(),
                })
            })
            .collect()
    }

    /// Why a deployment is in its phase, as the kubelet says: added to
    /// its status message until the phase changes.
    pub fn explain(&mut self, kind: Kind, namespace: &str, name: &str, detail: String) {
        let stored = self
            .sets
            .iter_mut()
            .filter(|s| s.kind.kind() == kind && &*s.namespace == namespace)
            .find_map(|s| s.entries.get_mut(name));
        if let Some(stored) = stored {
            stored.track.detail = Some(Rc::from(detail));
            stored.fresh = true;
        }
    }

    /// The failures to roll back that the reports found since the last
    /// call, each once (docs/protocol.md, `rollback.v1`).
    pub fn take_rollbacks(&mut self) -> Vec<RollbackDue> {
        std::mem::take(&mut self.rollbacks)
    }

    /// Changes whenever a report's entries may differ from the last
    /// one's: what [`Index::hashes`] returns is the same while it does not.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Each owned entry's key and the hash of its content as last
    /// reported (`inventory.delta.v1`): what the next inventory's form is
    /// decided from.
    /// Each entry is its own key (ordered by namespace, name and kind):
    /// 16 bytes an entry, shared with the report.
    pub fn hashes(&self) -> super::delta::Hashes<Rc<Owned>> {
        let mut hashes = Vec::with_capacity(self.sets.iter().map(|s| s.entries.len()).sum());
        hashes.extend(self.sets.iter().flat_map(|s| {
            s.entries
                .iter()
                .map(|stored| (Rc::clone(&stored.owned), stored.hash))
        }));
        // Each set is a sorted run, which the stable sort merges.
        hashes.sort_by(|a, b| a.0.cmp(&b.0));
        hashes.into()
    }

    /// Rollbacks the agent could not make now (the lease lost), kept for
    /// when it leads again.
    pub fn requeue_rollbacks(&mut self, due: impl Iterator<Item = RollbackDue>) {
        self.rollbacks.extend(due);
    }

    /// How the rollback of `due` ended: shown in the next heartbeat as the
    /// command's end.
    pub fn rolled_back(&mut self, due: &RollbackDue, end: RollbackEnd) {
        let key = EntryKey {
            namespace: due.namespace.clone(),
            name: due.name.clone(),
            kind: entry_kind(due.kind),
        };
        if let Some(c) = self.commands.get_mut(&key).filter(|c| c.id == due.command) {
            // Its entry is judged again for the next heartbeat: it has a
            // command not ended.
            c.rolled_back = Some(end);
        }
    }

    /// A deploy or rollout applied at `now` wrote `generation` of an owned
    /// NexoProxy or Deployment: its progress is reported from the next
    /// heartbeat until its end was in one the CP accepted; `rollback`:
    /// its failure is rolled back (`onFailure: rollback`).
    pub fn command_applied(
        &mut self,
        workload: &Workload,
        id: &str,
        class: &'static str,
        rollback: bool,
        now: Instant,
    ) {
        let key = EntryKey {
            namespace: Rc::from(workload.namespace.as_str()),
            name: Rc::from(workload.name.as_str()),
            kind: entry_kind(workload.kind),
        };
        self.commands.insert(
            key,
            CommandTrack {
                id: id.to_owned(),
                class,
                generation: workload.generation,
                applied_at: now,
                ended: false,
                ending: false,
                rollback,
                rollback_due: false,
                rolled_back: None,
            },
        );
        // Bounded: the oldest ended ones go first, then the oldest.
        while self.commands.len() > MAX_COMMANDS {
            let oldest = self
                .commands
                .iter()
                .min_by_key(|(_, c)| (!c.ended, c.applied_at))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.commands.remove(&k),
                None => break,
            };
        }
    }

    /// The heartbeat that showed the ends of commands was accepted: they
    /// are not shown again.
    pub fn heartbeat_accepted(&mut self) {
        self.commands.retain(|_, c| {
            if c.ending {
                c.ended = true;
            }
            !c.ended
        });
    }
}

/// The heartbeat kind of a workload's kind (a NexoProxy or a Deployment).
pub(super) fn entry_kind(kind: Kind) -> crate::cp::wire::EntryKind {
    match kind {
        Kind::Deployment => crate::cp::wire::EntryKind::Deployment,
        _ => crate::cp::wire::EntryKind::NexoProxy,
    }
}

/// At most this many commands' progress is remembered.
const MAX_COMMANDS: usize = 1024;

/// An owned NexoProxy or legacy Deployment a command wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// `NexoProxy` or `Deployment`.
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// `metadata.generation` after the write.
    pub generation: i64,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// A NexoProxy's `spec.image` as written (a rollout's is kept in the
    /// drift record).
    pub image: Option<String>,
}

/// A deployment whose phase turned `failed` or `degraded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// `NexoProxy` or `Deployment`.
    pub kind: Kind,
    pub namespace: Rc<str>,
    pub name: Rc<str>,
    pub uid: Option<Box<str>>,
    pub turned: Turned,
}
