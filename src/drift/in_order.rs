//! Objects listed in name order, sought by name in name order: how a
//! drift check compares records and objects as both lists come, holding
//! a page of each rather than every record (BENCHMARKS.md, "A drift check
//! in name order"). Plain values: the list is any iterator of objects.

use serde_json::Value;

/// Where a sought name stands in the list.
#[derive(Debug, PartialEq)]
pub enum Seek<'a> {
    /// The object of that name.
    Found(&'a Value),
    /// No object of that name: the list went from below it to above it.
    Absent,
    /// The list is already past the name (an earlier search asked for a
    /// greater one): the object cannot be told from here.
    Passed,
}

/// Why a list can no longer be sought.
#[derive(Debug)]
pub enum Stop<E> {
    /// The list failed (its error).
    List(E),
    /// An object came after a greater name: the list is not in name order,
    /// so what it skipped cannot be told absent.
    Unsorted { before: String, after: String },
}

impl<E: std::fmt::Display> std::fmt::Display for Stop<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::List(e) => e.fmt(f),
            Stop::Unsorted { before, after } => write!(
                f,
                "the list is not in name order ({after:?} came after {before:?})"
            ),
        }
    }
}

/// A list of objects read forward as names are sought. Holds the object
/// at which it stands and the name of the last one it left behind.
pub struct InOrder<I> {
    items: I,
    /// The object it stands at (its name, the object).
    current: Option<(String, Value)>,
    /// The greatest name left behind: a name at or below it was passed.
    behind: Option<String>,
    ended: bool,
}

impl<I, E> InOrder<I>
where
    I: Iterator<Item = Result<Value, E>>,
{
    pub fn new(items: I) -> InOrder<I> {
        InOrder {
            items,
            current: None,
            behind: None,
            ended: false,
        }
    }

    /// Reads forward to `name`. After a `Stop`, the list is not to be
    /// sought again (its caller drops it).
    pub fn seek(&mut self, name: &str) -> Result<Seek<'_>, Stop<E>> {
        if self.behind.as_deref().is_some_and(|b| name <= b) {
            return Ok(Seek::Passed);
        }
        loop {
            match &self.current {
                Some((at, _)) if at.as_str() >= name => break,
                Some(_) => self.behind = self.current.take().map(|(at, _)| at),
                None if self.ended => return Ok(Seek::Absent),
                None => self.read()?,
            }
        }
        Ok(match &self.current {
            Some((at, object)) if at == name => Seek::Found(object),
            _ => Seek::Absent,
        })
    }

    /// The next object, checked to come after the last one (an object
    /// without a name is no one's, and skipped).
    fn read(&mut self) -> Result<(), Stop<E>> {
        let object = match self.items.next() {
            None => {
                self.ended = true;
                return Ok(());
            }
            Some(item) => item.map_err(Stop::List)?,
        };
        let Some(at) = object["metadata"]["name"].as_str() else {
            return Ok(());
        };
        if let Some(before) = self.behind.as_deref().filter(|b| at <= *b) {
            return Err(Stop::Unsorted {
                before: before.to_owned(),
                after: at.to_owned(),
            });
        }
        self.current = Some((at.to_owned(), object));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(names: &[&str]) -> InOrder<std::vec::IntoIter<Result<Value, String>>> {
        let items: Vec<Result<Value, String>> = names
            .iter()
            .map(|n| Ok(json!({"metadata": {"name": n}, "n": n})))
            .collect();
        InOrder::new(items.into_iter())
    }

    fn found(s: Result<Seek<'_>, Stop<String>>) -> String {
        match s {
            Ok(Seek::Found(o)) => o["n"].as_str().unwrap().to_owned(),
            other => panic!("not found: {other:?}"),
        }
    }

    #[test]
    fn names_sought_in_order_are_found_absent_or_passed() {
        let mut l = list(&["b", "d", "f"]);
        assert_eq!(l.seek("a").unwrap(), Seek::Absent);
        assert_eq!(found(l.seek("b")), "b");
        // Two records naming the same object both find it.
        assert_eq!(found(l.seek("b")), "b");
        assert_eq!(l.seek("c").unwrap(), Seek::Absent);
        assert_eq!(found(l.seek("f")), "f");
        // "d" was left behind for "f": it cannot be told from here, nor
        // can "c", nor "b".
        assert_eq!(l.seek("d").unwrap(), Seek::Passed);
        assert_eq!(l.seek("c").unwrap(), Seek::Passed);
        assert_eq!(l.seek("b").unwrap(), Seek::Passed);
        assert_eq!(found(l.seek("f")), "f");
        assert_eq!(l.seek("g").unwrap(), Seek::Absent);
        // Past the end: above the last name, absent; at or below, passed.
        assert_eq!(l.seek("z").unwrap(), Seek::Absent);
        assert_eq!(l.seek("f").unwrap(), Seek::Passed);
        let mut empty = list(&[]);
        assert_eq!(empty.seek("a").unwrap(), Seek::Absent);
    }

    #[test]
    fn a_list_out_of_name_order_stops_and_says_where() {
        let mut l = list(&["a", "c", "b"]);
        assert_eq!(found(l.seek("a")), "a");
        match l.seek("d") {
            Err(Stop::Unsorted { before, after }) => {
                assert_eq!((before.as_str(), after.as_str()), ("c", "b"));
            }
            other => panic!("{other:?}"),
        }
        let e: Stop<String> = Stop::Unsorted {
            before: "c".into(),
            after: "b".into(),
        };
        assert_eq!(
            e.to_string(),
            r#"the list is not in name order ("b" came after "c")"#
        );
    }

    #[test]
    fn a_failed_list_stops_with_its_error_and_what_came_before_stands() {
        let items: Vec<Result<Value, String>> = vec![
            Ok(json!({"metadata": {"name": "a"}, "n": "a"})),
            Ok(json!({"metadata": {}})),
            Err("kubernetes api: 500".into()),
        ];
        let mut l = InOrder::new(items.into_iter());
        assert_eq!(found(l.seek("a")), "a");
        match l.seek("b") {
            Err(Stop::List(e)) => assert_eq!(e, "kubernetes api: 500"),
            other => panic!("{other:?}"),
        }
    }
}
