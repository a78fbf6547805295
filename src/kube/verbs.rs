//! The verbs of the Kubernetes client: typed get, create, server-side
//! apply, patch, guarded delete, and paged lists (with the paging loop
//! itself, [`page_through`], testable without a server).

use std::ops::ControlFlow;

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;

use super::client::{
    APPLY_PATCH, Body, Client, FIELD_MANAGER, MERGE_PATCH, Method, Query, to_json,
};
use super::error::Error;

/// The parameters of a server-side apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyParams {
    /// Take over fields owned by other field managers (`force=true`).
    pub force: bool,
    /// Validate and admit, write nothing (`dryRun=All`).
    pub dry_run: bool,
}

impl ApplyParams {
    /// A plain apply.
    pub const WRITE: ApplyParams = ApplyParams {
        force: false,
        dry_run: false,
    };
    /// A dry run.
    pub const DRY_RUN: ApplyParams = ApplyParams {
        force: false,
        dry_run: true,
    };

    /// The same, with `force` set.
    pub fn forced(self, force: bool) -> ApplyParams {
        ApplyParams { force, ..self }
    }
}

impl Client {
    /// GET, decoded into `T`.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        self.request_as::<T>(Method::GET, path, None)?
            .ok_or_else(|| Error::Decode {
                what: "object",
                source: serde::de::Error::custom("the body is empty"),
            })
    }

    /// GET that maps 404 to `None`.
    pub fn get_opt<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, Error> {
        match self.get(path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// POST a new object to a collection path.
    pub fn create(&self, collection: &str, object: &Value) -> Result<Value, Error> {
        let bytes = to_json("request body", object)?;
        self.request(
            Method::POST,
            collection,
            Some(Body {
                content_type: "application/json",
                bytes: &bytes,
            }),
        )
    }

    /// PUT a whole object (an update guarded by its `metadata.resourceVersion`).
    pub fn replace(&self, path: &str, object: &Value) -> Result<Value, Error> {
        let bytes = to_json("request body", object)?;
        self.request(
            Method::PUT,
            path,
            Some(Body {
                content_type: "application/json",
                bytes: &bytes,
            }),
        )
    }

    /// Server-side apply of `object` at its object path, as [`FIELD_MANAGER`].
    /// `dry_run` asks the server to validate and admit without persisting.
    pub fn apply(&self, path: &str, object: &Value, params: ApplyParams) -> Result<Value, Error> {
        let mut query = Query::new().param("fieldManager", FIELD_MANAGER);
        if params.force {
            query = query.param("force", "true");
        }
        if params.dry_run {
            query = query.param("dryRun", "All");
        }
        let bytes = to_json("request body", object)?;
        self.request(
            Method::PATCH,
            &format!("{path}{}", query.finish()),
            Some(Body {
                content_type: APPLY_PATCH,
                bytes: &bytes,
            }),
        )
    }

    /// Creates an absent object so that it is exactly as a server-side
    /// apply would have made it, but fails (409 `AlreadyExists`) if the
    /// object appeared since it was found absent: a POST, then the
    /// `managedFields` of the apply's dry run (`apply_fields`) put in
    /// place of the POST's own entry, guarded by the new resourceVersion.
    /// Later applies then own, change and remove its fields as if it had
    /// been applied. Both later steps complete the create: sent whatever
    /// the lease fence says; the first
    /// guarded by the uid the create answered, the second by the version
    /// the first answered.
    /// `annotations` gives, from the created object (its uid),
    /// annotations set in a step between the two (a proof, whose value
    /// needs the uid: the dry run's fields own it, with a placeholder),
    /// which must succeed. Should the last step fail, the object stays
    /// created (with an update entry of this field manager) and a warning
    /// is logged.
    pub fn create_as_applied(
        &self,
        collection: &str,
        name: &str,
        object: &Value,
        apply_fields: Option<&Value>,
        annotations: impl FnOnce(&Value) -> Option<Value>,
    ) -> Result<Value, Error> {
        let bytes = to_json("object", object)?;
        let query = Query::new().param("fieldManager", FIELD_MANAGER).finish();
        let created = self.request(
            Method::POST,
            &format!("{collection}{query}"),
            Some(Body {
                content_type: "application/json",
                bytes: &bytes,
            }),
        )?;
        let path = format!("{collection}/{name}");
        let mut created = created;
        if let Some(annotations) = annotations(&created) {
            // Its own step: a change in the request that sets the fields
            // would be recorded as an update, which takes the field from
            // the apply's entry. Guarded by the uid, not the version: a
            // controller may have written the new object already (a
            // Deployment's status), and the proof must still be written.
            let patch = serde_json::json!({"metadata": {
                "uid": created["metadata"]["uid"],
                "annotations": annotations,
            }});
            created = self.patch_completing(&path, &patch)?;
        }
        let Some(fields) = apply_fields.filter(|f| f.as_array().is_some_and(|a| !a.is_empty()))
        else {
            return Ok(created);
        };
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": created["metadata"]["resourceVersion"],
            "managedFields": fields,
        }});
        match self.patch_completing(&path, &patch) {
            Ok(updated) => Ok(updated),
            Err(e) => {
                crate::warn!(
                    collection:% = collection, name:% = name, err:% = e;
                    "created; its fields stay recorded as an update, not an apply"
                );
                Ok(created)
            }
        }
    }

    /// A merge patch that completes a create: sent whatever the lease fence
    /// says (`Client::request_fenced`).
    fn patch_completing(&self, path: &str, patch: &Value) -> Result<Value, Error> {
        let bytes = to_json("request body", patch)?;
        let query = Query::new().param("fieldManager", FIELD_MANAGER).finish();
        let body = Body {
            content_type: MERGE_PATCH,
            bytes: &bytes,
        };
        Ok(self
            .request_fenced::<Value>(Method::PATCH, &format!("{path}{query}"), Some(body), false)?
            .unwrap_or(Value::Null))
    }

    /// PATCH with `content_type` (merge or strategic merge), as [`FIELD_MANAGER`].
    pub fn patch(
        &self,
        path: &str,
        content_type: &'static str,
        patch: &Value,
    ) -> Result<Value, Error> {
        self.patch_as(path, content_type, patch, false)
    }

    /// [`Client::patch`] validated and admitted, nothing written
    /// (`dryRun=All`): the object as the patch would leave it.
    pub fn patch_dry_run(
        &self,
        path: &str,
        content_type: &'static str,
        patch: &Value,
    ) -> Result<Value, Error> {
        self.patch_as(path, content_type, patch, true)
    }

    fn patch_as(
        &self,
        path: &str,
        content_type: &'static str,
        patch: &Value,
        dry_run: bool,
    ) -> Result<Value, Error> {
        let bytes = to_json("request body", patch)?;
        let mut query = Query::new().param("fieldManager", FIELD_MANAGER);
        if dry_run {
            query = query.param("dryRun", "All");
        }
        let query = query.finish();
        self.request(
            Method::PATCH,
            &format!("{path}{query}"),
            Some(Body {
                content_type,
                bytes: &bytes,
            }),
        )
    }

    /// DELETE with a propagation policy (`Background`, `Foreground`, `Orphan`).
    pub fn delete(&self, path: &str, propagation: &str) -> Result<Value, Error> {
        self.delete_if(path, propagation, None)
    }

    /// DELETE of the object read before: `preconditions` holds its uid and
    /// resourceVersion, so that a 409 (not a deletion) answers if it was
    /// replaced or changed since.
    pub fn delete_if(
        &self,
        path: &str,
        propagation: &str,
        preconditions: Option<(&str, &str)>,
    ) -> Result<Value, Error> {
        self.delete_as(path, propagation, preconditions, false)
    }

    /// [`Client::delete_if`] validated and admitted, nothing deleted
    /// (`dryRun=All`).
    pub fn delete_dry_run(
        &self,
        path: &str,
        propagation: &str,
        preconditions: Option<(&str, &str)>,
    ) -> Result<Value, Error> {
        self.delete_as(path, propagation, preconditions, true)
    }

    fn delete_as(
        &self,
        path: &str,
        propagation: &str,
        preconditions: Option<(&str, &str)>,
        dry_run: bool,
    ) -> Result<Value, Error> {
        let mut body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation});
        if let Some((uid, version)) = preconditions {
            body["preconditions"] = serde_json::json!({"uid": uid, "resourceVersion": version});
        }
        // In the query as well as the options, so that the audit log says so.
        let query = if dry_run {
            body["dryRun"] = serde_json::json!(["All"]);
            Query::new().param("dryRun", "All").finish()
        } else {
            String::new()
        };
        let bytes = to_json("delete options", &body)?;
        self.request(
            Method::DELETE,
            &format!("{path}{query}"),
            Some(Body {
                content_type: "application/json",
                bytes: &bytes,
            }),
        )
    }

    /// One page of a list: the items and the `continue` token of the next page.
    pub fn list_page(
        &self,
        collection: &str,
        label_selector: Option<&str>,
        limit: u32,
        continue_token: Option<&str>,
    ) -> Result<(Vec<Value>, Option<String>), Error> {
        self.list_page_as(collection, label_selector, limit, continue_token)
    }

    /// [`Client::list_page`] with each item decoded into `T`: a projection
    /// of the few fields the caller reads keeps a page small.
    pub fn list_page_as<T: DeserializeOwned>(
        &self,
        collection: &str,
        label_selector: Option<&str>,
        limit: u32,
        continue_token: Option<&str>,
    ) -> Result<(Vec<T>, Option<String>), Error> {
        let query = list_query(label_selector, limit, continue_token);
        let page: ListPage<T> = self.get(&format!("{collection}{}", query.finish()))?;
        Ok((page.items, page.metadata.next()))
    }

    /// Visits every item of a collection, a page of `limit` at a time, so
    /// memory stays bounded by one page. A 410 Gone (the continue token
    /// expired) restarts the list from the beginning once; `visit` must then
    /// tolerate seeing items again.
    pub fn list_each(
        &self,
        collection: &str,
        label_selector: Option<&str>,
        limit: u32,
        visit: impl FnMut(Value),
    ) -> Result<(), Error> {
        self.list_each_as(collection, label_selector, limit, visit)
    }

    /// Every item of a collection decoded into `T`, a page at a time, and
    /// the list's `resourceVersion` (to watch from). A page that expired
    /// (410) fails the whole list: its caller lists again. A page over the
    /// read limit is asked again smaller ([`smaller`]).
    pub fn list_versioned<T: DeserializeOwned>(
        &self,
        collection: &str,
        label_selector: Option<&str>,
        limit: u32,
        visit: impl FnMut(T),
    ) -> Result<String, Error> {
        let selector = label_selector.map(|s| ("labelSelector", s));
        self.list_versioned_where(collection, selector, limit, visit)
    }

    /// [`Client::list_versioned`] with any selector: (`labelSelector` or
    /// `fieldSelector`, its value).
    pub fn list_versioned_where<T: DeserializeOwned>(
        &self,
        collection: &str,
        selector: Option<(&str, &str)>,
        limit: u32,
        mut visit: impl FnMut(T),
    ) -> Result<String, Error> {
        let mut token: Option<String> = None;
        let mut limit = limit;
        loop {
            let page: ListPage<T> = page_within(&mut limit, |limit| {
                let mut query = list_query(None, limit, token.as_deref());
                if let Some((key, value)) = selector {
                    query = query.param(key, value);
                }
                self.get(&format!("{collection}{}", query.finish()))
            })?;
            page.items.into_iter().for_each(&mut visit);
            let version = page.metadata.resource_version.clone();
            match page.metadata.next() {
                Some(next) => token = Some(next),
                None => {
                    return version.ok_or(Error::Config(format!(
                        "the list of {collection} has no resourceVersion"
                    )));
                }
            }
        }
    }

    /// [`Client::list_each`] with each item decoded into `T`. A page's
    /// items are decoded one at a time as they are visited (each kept as
    /// its text until then), never a page of decoded objects at once: a
    /// page of 500 objects as `Value`s, `managedFields` and all, is
    /// several times its text (BENCHMARKS.md, "The compact status", on the
    /// drift check's peak). An item that is not a `T` ends the list with
    /// its error.
    pub fn list_each_as<T: DeserializeOwned>(
        &self,
        collection: &str,
        label_selector: Option<&str>,
        limit: u32,
        mut visit: impl FnMut(T),
    ) -> Result<(), Error> {
        let mut undecodable = None;
        page_through(
            limit,
            |token, limit| {
                self.list_page_as::<Box<RawValue>>(collection, label_selector, limit, token)
            },
            |raw| match decode_item(&raw) {
                Ok(item) => {
                    visit(item);
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    undecodable = Some(e);
                    ControlFlow::Break(())
                }
            },
        )
        .inspect_err(|e| warn_if_gone(collection, e))?;
        undecodable.map_or(Ok(()), Err)
    }
}

/// The page size to ask again with when a page of `limit` failed with `e`:
/// half of it when the page was over the read limit (items are counted,
/// not bytes: a namespace of big Secrets fills 8 MiB in a few dozen), down
/// to one item, which always fits (the API server stores objects of a
/// little over 1 MiB at most). `None`: `e` is not that, or one item is.
pub fn smaller(e: &Error, limit: u32) -> Option<u32> {
    (matches!(e, Error::TooLarge(_)) && limit > 1).then_some(limit / 2)
}

/// One item of a page kept as text, decoded: with the same decoder as a
/// whole body's (`from_slice`), so the binary holds no second one.
pub(super) fn decode_item<T: DeserializeOwned>(raw: &RawValue) -> Result<T, Error> {
    serde_json::from_slice(raw.get().as_bytes()).map_err(|source| Error::Decode {
        what: "list item",
        source,
    })
}

/// One page from `fetch`, asked for `limit` items and again with fewer
/// while it is over the read limit ([`smaller`]); `limit` keeps the size
/// that fitted, for the rest of the list.
pub(super) fn page_within<P>(
    limit: &mut u32,
    mut fetch: impl FnMut(u32) -> Result<P, Error>,
) -> Result<P, Error> {
    loop {
        match fetch(*limit) {
            Err(e) => match smaller(&e, *limit) {
                Some(less) => {
                    crate::debug!(
                        limit = *limit, less;
                        "a page is over the read limit; asking fewer"
                    );
                    *limit = less;
                }
                None => return Err(e),
            },
            page => return page,
        }
    }
}

/// The warning of a list given up on because its pages expired twice.
fn warn_if_gone(collection: &str, e: &Error) {
    if e.is_gone() {
        crate::warn!(collection:% = collection; "a list expired twice; giving up on this pass");
    }
}

/// The query of one page of a list.
fn list_query(label_selector: Option<&str>, limit: u32, continue_token: Option<&str>) -> Query {
    let mut query = Query::new().param("limit", &limit.to_string());
    if let Some(selector) = label_selector {
        query = query.param("labelSelector", selector);
    }
    if let Some(token) = continue_token {
        query = query.param("continue", token);
    }
    query
}

/// The paging loop of [`Client::list_each`], over any page source, from
/// pages of `limit`: follows `continue` tokens, asks a page over the read
/// limit again smaller ([`smaller`], and the rest of the list in pages
/// that size), and restarts once from the beginning on 410 Gone; when
/// `visit` breaks, it visits and fetches nothing more.
pub fn page_through<T>(
    limit: u32,
    mut fetch: impl FnMut(Option<&str>, u32) -> Result<(Vec<T>, Option<String>), Error>,
    mut visit: impl FnMut(T) -> ControlFlow<()>,
) -> Result<(), Error> {
    let mut restarted = false;
    let mut token: Option<String> = None;
    let mut limit = limit.max(1);
    loop {
        match page_within(&mut limit, |limit| fetch(token.as_deref(), limit)) {
            Ok((items, next)) => {
                if items.into_iter().try_for_each(&mut visit).is_break() {
                    return Ok(());
                }
                match next {
                    Some(next) => token = Some(next),
                    None => return Ok(()),
                }
            }
            Err(e) if e.is_gone() && token.is_some() && !restarted => {
                crate::warn!("a list's continue token expired mid-way; restarting it once");
                restarted = true;
                token = None;
            }
            Err(e) => return Err(e),
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(bound(deserialize = "T: DeserializeOwned"))]
struct ListPage<T> {
    /// Absent or `null` (an empty `PartialObjectMetadataList` says
    /// `"items": null`): none.
    #[serde(default = "Vec::new", deserialize_with = "items_or_null")]
    items: Vec<T>,
    #[serde(default)]
    metadata: ListMeta,
}

#[derive(Debug, serde::Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

fn items_or_null<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    use serde::Deserialize as _;
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

impl ListMeta {
    /// The next page's token: none when absent or empty (the last page).
    fn next(self) -> Option<String> {
        self.continue_token.filter(|t| !t.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_whose_items_are_null_or_absent_has_none() {
        // An empty `PartialObjectMetadataList`, as the API server sends it.
        let empty = r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"42"},"items":null}"#;
        let page: ListPage<serde_json::Value> = serde_json::from_str(empty).unwrap();
        assert!(page.items.is_empty());
        assert_eq!(page.metadata.resource_version.as_deref(), Some("42"));
        let page: ListPage<serde_json::Value> = serde_json::from_str(r#"{"metadata":{}}"#).unwrap();
        assert!(page.items.is_empty());
        let page: ListPage<u8> = serde_json::from_str(r#"{"items":[1,2]}"#).unwrap();
        assert_eq!(page.items, [1, 2]);
    }
}
