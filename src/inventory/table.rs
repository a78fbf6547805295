//! NexoProxies read as a Table of the CRD's printer columns: whether the
//! installed CRD allows it ([`proxy_listing`]), and a page's rows as
//! inventory entries ([`table_entries`]).

use super::projection::Interner;
use crate::cp::wire::DeploymentEntry;
use crate::kube::Table;
use crate::resource;

/// The NexoProxy version the inventory lists.
pub const PROXY_VERSION: &str = resource::NEXO_PROXIES.version;

/// How the owned NexoProxies are listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProxyListing {
    /// As a Table of the printer columns `Image` (`.spec.image`, a string)
    /// and `Replicas` (`.spec.replicas`, an integer), without the objects.
    Table,
    /// As the objects, each projected while it is parsed: the default, and
    /// whenever the installed CRD's columns are not known to be those.
    #[default]
    Objects,
}

/// The listing an installed NexoProxy CRD allows: [`ProxyListing::Table`]
/// when its [`PROXY_VERSION`] is served with exactly one `Image` column on
/// `.spec.image` (string) and one `Replicas` column on `.spec.replicas`
/// (integer); the Table's cells are then the fields the objects would give.
pub fn proxy_listing(crd: &serde_json::Value) -> ProxyListing {
    let Some(version) = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == PROXY_VERSION && v["served"] == true)
    else {
        return ProxyListing::Objects;
    };
    let columns = version["additionalPrinterColumns"].as_array();
    let column = |name: &str, path: &str, type_: &str| {
        let mut named = columns.into_iter().flatten().filter(|c| c["name"] == name);
        let first = named.next();
        named.next().is_none() && first.is_some_and(|c| c["jsonPath"] == path && c["type"] == type_)
    };
    // The Table's first column is always `Name`, the object's name: a
    // printer column of that name would make it ambiguous.
    let named_name = columns.into_iter().flatten().any(|c| c["name"] == NAME);
    if !named_name
        && column(IMAGE, ".spec.image", "string")
        && column(REPLICAS, ".spec.replicas", "integer")
    {
        ProxyListing::Table
    } else {
        ProxyListing::Objects
    }
}

const NAME: &str = "Name";
const IMAGE: &str = "Image";
const REPLICAS: &str = "Replicas";

/// Why a Table's page could not be read as the objects would have been.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableProblem {
    /// The column is missing, repeated, misplaced or of another type.
    Column(&'static str),
    /// A row has not one cell per column.
    Cells {
        /// The row's index in its page.
        row: usize,
    },
    /// A row's cell is not of its column's type.
    Cell {
        /// The row's index in its page.
        row: usize,
        /// The column.
        column: &'static str,
    },
}

impl std::fmt::Display for TableProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableProblem::Column(c) => {
                write!(f, "the table has no single {c} column of the expected type")
            }
            TableProblem::Cells { row } => {
                write!(f, "row {row} of the table has not one cell per column")
            }
            TableProblem::Cell { row, column } => {
                write!(f, "row {row} of the table has a bad {column} cell")
            }
        }
    }
}

/// The entries of one Table page of owned NexoProxies in `namespace`: the
/// first column `Name` (a string), `Image` (a string or null) and
/// `Replicas` (an integer, or null for the CRD's default of 1).
pub fn table_entries(
    table: Table,
    namespace: &str,
    shared: &mut Interner,
) -> Result<Vec<DeploymentEntry>, TableProblem> {
    let columns = &table.column_definitions;
    let index = |name: &'static str, type_: &str| {
        let mut found = columns.iter().enumerate().filter(|(_, c)| c.name == name);
        match (found.next(), found.next()) {
            (Some((i, c)), None) if c.type_ == type_ => Ok(i),
            _ => Err(TableProblem::Column(name)),
        }
    };
    let name = index(NAME, "string")?;
    if name != 0 {
        return Err(TableProblem::Column(NAME));
    }
    let image = index(IMAGE, "string")?;
    let replicas = index(REPLICAS, "integer")?;
    let namespace = shared.get(namespace);
    let mut entries = Vec::with_capacity(table.rows.len());
    for (row, r) in table.rows.into_iter().enumerate() {
        let bad = |column| TableProblem::Cell { row, column };
        if r.cells.len() != columns.len() {
            return Err(TableProblem::Cells { row });
        }
        let cell = |i: usize| r.cells.get(i).unwrap_or(&serde_json::Value::Null);
        let name = match cell(name).as_str() {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => return Err(bad(NAME)),
        };
        let image = match cell(image) {
            serde_json::Value::Null => None,
            v => Some(shared.get(v.as_str().ok_or_else(|| bad(IMAGE))?)),
        };
        let replicas = match cell(replicas) {
            serde_json::Value::Null => 1,
            v => v.as_i64().ok_or_else(|| bad(REPLICAS))?,
        };
        entries.push(DeploymentEntry {
            namespace: namespace.clone(),
            name,
            kind: "NexoProxy",
            replicas,
            image,
        });
    }
    Ok(entries)
}
