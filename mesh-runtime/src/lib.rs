//! What every long-running binary of the mesh needs besides its own job, in one place
//! each: the hardened HTTP server of its operational endpoints ([`http_server`]),
//! readiness ([`readiness`]), dual-stack listeners ([`listen`]), network namespaces
//! checked and entered safely ([`netns`]), files written atomically ([`fs`]), and
//! logging: Istio's formats and a filter that changes live ([`logging`]).

pub mod fs;
pub mod http_server;
pub mod listen;
pub mod logging;
pub mod netns;
pub mod readiness;
