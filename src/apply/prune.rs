//! After a rollback (docs/protocol.md, `rollback.v1`): the objects the failed
//! change wrote that the restored one does not list, deleted, each read and
//! judged as an uninstall judges it (only the deployment's own, by its
//! labels and proof) and deleted with the uid and resourceVersion it was
//! read at. One that is not the deployment's is left, and said.

use serde_json::Value;

use super::Context;
use super::outcome::StepError;
use super::plan::{self, ReadAt};
use crate::cp::wire::AckResource;
use crate::resource::ObjectRef;
use crate::words::ResourceAction;

/// Deletes `objects` of `deployment`; each one's ack line, or the failed
/// call that stopped it.
pub fn prune(
    ctx: &Context<'_>,
    deployment: &str,
    objects: &[ObjectRef],
) -> Result<Vec<AckResource>, StepError> {
    let Some(judge) = ctx.judge() else {
        return Ok(objects
            .iter()
            .map(|r| r.ack(ResourceAction::Refused))
            .collect());
    };
    let mut done = Vec::with_capacity(objects.len());
    for r in objects {
        let Some(read) = ctx
            .kube
            .get_opt::<Value>(&r.path())
            .map_err(|e| StepError::api("cannot read", r, e))?
        else {
            done.push(r.ack(ResourceAction::Absent));
            continue;
        };
        let ours = plan::judged(&judge, r, deployment, false, read)
            .ok()
            .filter(|j| plan::not_ours(&j.verdict).is_none());
        let Some(read_at) = ours.as_ref().and_then(|j| ReadAt::of(&j.object)) else {
            crate::warn!(
                object:% = r;
                "rollback: an object is not the deployment's own; left as it is"
            );
            done.push(r.ack(ResourceAction::Refused));
            continue;
        };
        let guard = Some((read_at.uid.as_str(), read_at.version.as_str()));
        match ctx.writer.delete_if(&r.path(), "Background", guard) {
            Ok(_) => done.push(r.ack(ResourceAction::Deleted)),
            Err(e) if e.is_not_found() => done.push(r.ack(ResourceAction::Absent)),
            Err(e) => return Err(StepError::api("cannot delete", r, e)),
        }
    }
    Ok(done)
}
