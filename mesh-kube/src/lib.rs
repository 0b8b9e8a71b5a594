//! What the mesh's Kubernetes clients (the node agent, istiod-lite) share: the one
//! list-and-watch loop ([`watch`]) and the facts read off a Pod ([`pod`]), so each is
//! decided the same way everywhere.

pub mod pod;
pub mod watch;
