//! onejob: one user intent, exactly one durable Job, however often it is
//! clicked, retried or failed over. See ARCHITECTURE.md for the layers and
//! docs/design.md for the rules and what enforces each.

pub mod app;
pub mod chat;
pub mod cli;
pub mod config;
pub mod contracts;
pub mod domain;
pub mod providers;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod web;
pub mod worker;
