//! A parsed command applied to the cluster: permitted by the rules of the
//! configuration ([`permit`]), planned from what the cluster holds
//! ([`plan`]), carried out by a thin executor ([`execute`]) into an
//! [`Outcome`].

pub mod execute;
pub mod outcome;
pub mod permit;
pub mod plan;

pub use outcome::Outcome;
pub use permit::{Permitted, Rules, permit};
