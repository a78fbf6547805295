//! A parsed command applied to the cluster: planned from what the cluster
//! holds ([`plan`]), carried out by a thin executor ([`execute`]) into an
//! [`Outcome`].

pub mod execute;
pub mod outcome;
pub mod plan;

pub use outcome::Outcome;
