//! A list read forward, one item at a time: what lets a caller walk two
//! lists side by side (the drift check's records and objects, both in
//! name order) holding a page of each, never a whole list.

use serde_json::Value;
use serde_json::value::RawValue;

use super::{Client, Error};

/// The items of a collection in the API server's order (by name within a
/// namespace: etcd's key order, and kine's), a page of their text held at
/// a time, each decoded only when taken. A page over the read limit is
/// asked again smaller, as every list is. A page that expired (410 Gone)
/// ends the listing with its error rather than restarting it: a caller
/// walking it beside another list relies on seeing each item once, in
/// order, and tries again at its next pass. After an error, it ends.
pub struct Listing<'a> {
    client: &'a Client,
    collection: String,
    label_selector: Option<String>,
    limit: u32,
    token: Option<String>,
    page: std::vec::IntoIter<Box<RawValue>>,
    ended: bool,
}

impl Client {
    /// The items of `collection` (matching `label_selector`), read in
    /// pages of `limit` as they are taken.
    pub fn listing(
        &self,
        collection: &str,
        label_selector: Option<&str>,
        limit: u32,
    ) -> Listing<'_> {
        Listing {
            client: self,
            collection: collection.to_owned(),
            label_selector: label_selector.map(str::to_owned),
            limit: limit.max(1),
            token: None,
            page: Vec::new().into_iter(),
            ended: false,
        }
    }
}

impl Iterator for Listing<'_> {
    type Item = Result<Value, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(raw) = self.page.next() {
                return Some(super::verbs::decode_item(&raw).inspect_err(|_| self.end()));
            }
            if self.ended {
                return None;
            }
            let (client, collection) = (self.client, self.collection.as_str());
            let (selector, token) = (self.label_selector.as_deref(), self.token.as_deref());
            let page = super::verbs::page_within(&mut self.limit, |limit| {
                client.list_page_as::<Box<RawValue>>(collection, selector, limit, token)
            });
            match page {
                Ok((items, next)) => {
                    self.page = items.into_iter();
                    self.ended = next.is_none();
                    self.token = next;
                }
                Err(e) => {
                    self.end();
                    return Some(Err(e));
                }
            }
        }
    }
}

impl Listing<'_> {
    /// Nothing more: after an error, the listing stops.
    fn end(&mut self) {
        self.ended = true;
        self.page = Vec::new().into_iter();
    }
}
