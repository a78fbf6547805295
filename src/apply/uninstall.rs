//! An uninstall: the owned NexoProxy, or the legacy Deployment and its
//! labelled objects, each deleted with the uid and resourceVersion it was
//! read at.

use serde_json::Value;

use super::Context;
use super::execute::Raced;
use super::outcome::{Outcome, StepError, summary};
use super::plan::{self, Delete, Removal};
use crate::commands::Target;
use crate::ownership;
use crate::resource::{Kind, ObjectRef};
use crate::words::ResourceAction;

/// Reads what an uninstall of `t` may delete: its NexoProxy, else its
/// legacy Deployment and the objects labelled with its name.
fn uninstall_reads(ctx: &Context<'_>, t: &Target) -> Result<Removal, Box<Outcome>> {
    let Some(judge) = ctx.judge() else {
        return Err(Box::new(Outcome::failed(super::NO_KEY, vec![])));
    };
    let proxy_ref = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
    let deployment_ref = ObjectRef::new(Kind::Deployment, &t.namespace, &t.name);
    let read = |r: &ObjectRef| {
        let o = ctx.kube.get_opt::<Value>(&r.path()).map_err(|e| {
            Box::new(Outcome::failed(
                StepError::api("cannot read", r, e).to_string(),
                vec![],
            ))
        })?;
        o.map(|o| plan::judged(&judge, r, &t.name, false, o))
            .transpose()
            .map_err(|r| Box::new(Outcome::from(r)))
    };
    let proxy = read(&proxy_ref)?;
    let deployment = match proxy {
        Some(_) => None,
        None => read(&deployment_ref)?,
    };
    let mut labelled = Vec::new();
    if deployment.is_some() {
        let selector = format!(
            "{},{}={}",
            ownership::owned_selector(ctx.environment_id),
            ownership::DEPLOYMENT,
            t.name
        );
        for kind in [Kind::Service, Kind::ConfigMap, Kind::Secret] {
            let collection = ObjectRef::new(kind, &t.namespace, "").collection();
            let mut batch = Vec::new();
            let listed = ctx.kube.list_each(&collection, Some(&selector), 500, |o| {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                batch.push((ObjectRef::new(kind, &t.namespace, name), o));
            });
            // Judged with the label rule; one of the Manager's own refuses
            // the uninstall whole.
            for (r, o) in batch {
                let judged = plan::judged(&judge, &r, &t.name, true, o)
                    .map_err(|r| Box::new(Outcome::from(r)))?;
                labelled.push((r, judged));
            }
            if let Err(e) = listed {
                let message = format!("cannot list {kind}s of {}/{}: {e}", t.namespace, t.name);
                return Err(Box::new(Outcome::failed(message, vec![])));
            }
        }
    }
    let plan = plan::uninstall(t, proxy.as_ref(), deployment.as_ref(), &labelled);
    plan.map_err(|r| Box::new(Outcome::from(r)))
}

pub(super) fn uninstall(ctx: &Context<'_>, t: &Target) -> Result<Outcome, Raced> {
    let deletes = match uninstall_reads(ctx, t) {
        Err(outcome) => return Ok(*outcome),
        Ok(Removal::Absent) => {
            let r = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
            return Ok(Outcome::applied(
                format!("{}/{} is not installed", t.namespace, t.name),
                vec![r.ack(ResourceAction::Absent)],
            ));
        }
        Ok(Removal::Proxy(delete)) => vec![delete],
        Ok(Removal::Legacy(deletes)) => deletes,
    };
    if ctx.planning {
        return Ok(planned(ctx, &deletes));
    }
    let mut resources = Vec::new();
    for Delete { reference, read_at } in deletes {
        // Deleted only if it is still the object read and checked.
        let guard = Some((read_at.uid.as_str(), read_at.version.as_str()));
        match ctx.writer.delete_if(&reference.path(), "Background", guard) {
            Ok(_) => resources.push(reference.ack(ResourceAction::Deleted)),
            Err(e) if e.is_not_found() => resources.push(reference.ack(ResourceAction::Absent)),
            Err(e) => {
                let raced = e.is_precondition_failure();
                if !raced {
                    resources.push(reference.ack(ResourceAction::Refused));
                }
                let message = StepError::api("cannot delete", &reference, e).to_string();
                let outcome = Outcome::failed(message, resources);
                return if raced {
                    Err(Raced(Box::new(outcome)))
                } else {
                    Ok(outcome)
                };
            }
        }
    }
    let message = format!(
        "uninstalled {}/{} ({})",
        t.namespace,
        t.name,
        summary(&resources)
    );
    Ok(Outcome::applied(message, resources))
}

/// An uninstall planned (docs/protocol.md, `command.plan.v1`): each delete
/// as a dry run.
fn planned(ctx: &Context<'_>, deletes: &[Delete]) -> Outcome {
    let mut out = super::planned::Planned::default();
    for Delete { reference, read_at } in deletes {
        let guard = Some((read_at.uid.as_str(), read_at.version.as_str()));
        let object = match ctx
            .writer
            .delete_dry_run(&reference.path(), "Background", guard)
        {
            Ok(_) => super::planned::plain(reference, ResourceAction::Deleted),
            Err(e) if e.is_not_found() => super::planned::plain(reference, ResourceAction::Absent),
            Err(e) => {
                let e = StepError::api("cannot delete", reference, e);
                super::planned::refused(reference, e.to_string())
            }
        };
        out.push(reference, object);
    }
    out.outcome("delete")
}
